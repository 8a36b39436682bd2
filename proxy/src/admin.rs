//! The admin API (loopback by default) and the control thread that hosts it alongside the
//! config reloader and periodic metric upkeep.
//!
//! GET /ready (503 while draining), GET /live, GET /metrics (Prometheus text),
//! GET /config_dump (snapshot + version), GET /clusters (endpoints, health, ejection, breaker),
//! POST /drain (stop accepting, finish in-flight; a training sidecar calls the trainer's
//! checkpoint hook first and answers when it is done), /training/* (a training sidecar's
//! trainer API, `training::api`).
//!
//! `admin.metrics_address`, when set, is a second listener with only GET /metrics, /ready and
//! /live, so a scraper off the host never needs the admin API opened to the network.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;

use crate::server::Options;
use crate::Shared;

pub fn run_control(
    sh: Arc<Shared>,
    admin: std::net::TcpListener,
    metrics: Option<std::net::TcpListener>,
    opts: Options,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(admin).expect("admin listener registers");
        if let Some(mesh) = sh.tls.mesh.clone() {
            tokio::spawn(crate::mtls::watch_files(mesh, sh.tls.clone(), opts.watch_interval));
        }
        tokio::spawn(crate::reload::run(sh.clone(), opts));
        let upkeep = sh.clone();
        tokio::spawn(async move {
            // Often enough that unscraped histogram samples never pile up under load.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                upkeep.telemetry.upkeep();
            }
        });
        if let Some(m) = metrics {
            let m = tokio::net::TcpListener::from_std(m).expect("metrics listener registers");
            tokio::spawn(serve(sh.clone(), m, Api::ReadOnly));
        }
        tokio::select! {
            _ = serve(sh, listener, Api::Admin) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    });
}

/// Which API a listener serves.
#[derive(Clone, Copy)]
enum Api {
    /// Everything: `admin.address`.
    Admin,
    /// GET /metrics, /ready, /live only: `admin.metrics_address`, which may face the network.
    ReadOnly,
}

async fn serve(sh: Arc<Shared>, listener: tokio::net::TcpListener, api: Api) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let sh = sh.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let sh = sh.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(match api {
                        Api::Admin => route_async(&sh, req).await,
                        Api::ReadOnly => route_read_only(&sh, &req),
                    })
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// The read-only listener: probes and the scrape, nothing that changes or reveals config.
fn route_read_only(sh: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/live" | "/ready" | "/metrics") => probe_or_scrape(sh, req.uri().path()),
        (_, "/live" | "/ready" | "/metrics") => not_allowed(req),
        (_, path) => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "not_found", "message": format!("no endpoint {path:?} on the read-only metrics listener (admin.metrics_address): it serves GET /metrics /ready /live; the admin API is on admin.address")}),
        ),
    }
}

/// GET /live, /ready (503 while draining) and /metrics, served by both listeners.
fn probe_or_scrape(sh: &Shared, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/ready" if *sh.draining.borrow() => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/ready" => text(StatusCode::OK, "ready\n"),
        "/metrics" => {
            let mut r = text(StatusCode::OK, sh.telemetry.render());
            r.headers_mut().insert(header::CONTENT_TYPE, "text/plain; version=0.0.4".parse().unwrap());
            r
        }
        _ => text(StatusCode::OK, "live\n"),
    }
}

fn not_allowed<B>(req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let allow = match path {
        "/drain" => "POST",
        "/live" | "/ready" | "/metrics" => "GET, HEAD",
        _ => "GET",
    };
    let mut r = json(
        StatusCode::METHOD_NOT_ALLOWED,
        serde_json::json!({"error": "method_not_allowed", "message": format!("{} is not allowed on {path} (allowed: {allow})", req.method())}),
    );
    r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static(allow));
    r
}

/// The routes that wait (a training sidecar's long polls and its drain, which calls the
/// trainer's checkpoint hook first); the rest answer at once.
async fn route_async(sh: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if let Some(t) = &sh.training {
        if crate::training::api::serves(req.uri().path()) {
            return crate::training::api::handle(t, req).await;
        }
        if req.method() == Method::POST && req.uri().path() == "/drain" {
            sh.draining.send_replace(true);
            tracing::info!("draining: listeners closed, finishing in-flight requests; calling the trainer's checkpoint hook");
            let training = t.drain("drain").await;
            return json(StatusCode::OK, serde_json::json!({"draining": true, "training": training}));
        }
    }
    route(sh, req)
}

fn route(sh: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/live" | "/ready" | "/metrics") => probe_or_scrape(sh, req.uri().path()),
        (&Method::GET, "/config_dump") => json(StatusCode::OK, sh.snapshot.load().dump()),
        (&Method::GET, "/clusters") => {
            let snap = sh.snapshot.load();
            json(StatusCode::OK, serde_json::json!({
                "version": snap.version,
                "clusters": snap.clusters.iter().map(|c| c.describe()).collect::<Vec<_>>(),
            }))
        }
        (&Method::POST, "/drain") => {
            sh.draining.send_replace(true);
            tracing::info!("draining: listeners closed, finishing in-flight requests");
            json(StatusCode::OK, serde_json::json!({"draining": true}))
        }
        (_, "/live" | "/ready" | "/metrics" | "/config_dump" | "/clusters" | "/drain") => not_allowed(&req),
        (_, path) => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "not_found", "message": format!("no admin endpoint {path:?}; try /ready /live /metrics /config_dump /clusters /drain")}),
        ),
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

pub(crate) fn json(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    let mut body = serde_json::to_vec_pretty(&v).unwrap_or_default();
    body.push(b'\n');
    let mut r = text(status, body);
    r.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    r
}

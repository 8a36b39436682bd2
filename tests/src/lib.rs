//! Test fixtures: real upstream HTTP servers on loopback whose behaviour a test can switch at
//! run time, a weft-proxy started in-process from YAML, and small HTTP client helpers.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

pub mod procs;
pub mod toy;

pub type Body = BoxBody<Bytes, Infallible>;

/// A model-server stand-in. Paths:
/// - `/sse?n=N&gap_ms=G`: N server-sent events, G ms apart;
/// - `/echo`: streams the request body back (and its length in `x-body-len` trailer-free);
/// - `/headers`: the request headers as JSON;
/// - anything else: `name` as the body, after `delay_ms`, with status `status` (0 = 200),
///   except every `fail_every`-th request (0 = none), which gets a 500.
pub struct Upstream {
    pub addr: SocketAddr,
    pub name: String,
    pub status: AtomicU16,
    pub delay_ms: AtomicU64,
    pub hits: AtomicU64,
    pub fail_every: AtomicU64,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Upstream {
    pub async fn start(name: &str) -> Arc<Upstream> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stop, _) = tokio::sync::watch::channel(false);
        let up = Arc::new(Upstream {
            addr: listener.local_addr().unwrap(),
            name: name.to_string(),
            status: AtomicU16::new(0),
            delay_ms: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            fail_every: AtomicU64::new(0),
            stop,
        });
        let u = up.clone();
        let mut stopped = up.stop.subscribe();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                let Ok((stream, _)) = accepted else { continue };
                let u = u.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let u = u.clone();
                        async move { Ok::<_, Infallible>(u.respond(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        up
    }

    /// Stop accepting new connections (existing keep-alive connections also end).
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(SeqCst)
    }

    async fn respond(&self, req: Request<Incoming>) -> Response<Body> {
        let hit = self.hits.fetch_add(1, SeqCst) + 1;
        let every = self.fail_every.load(SeqCst);
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let param = |k: &str| -> u64 {
            query.split('&').filter_map(|kv| kv.split_once('=')).find(|(a, _)| *a == k).and_then(|(_, v)| v.parse().ok()).unwrap_or(0)
        };
        let delay = self.delay_ms.load(SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let status = match self.status.load(SeqCst) {
            _ if every > 0 && hit.is_multiple_of(every) => StatusCode::INTERNAL_SERVER_ERROR,
            0 => StatusCode::OK,
            s => StatusCode::from_u16(s).unwrap(),
        };
        match path.as_str() {
            "/sse" => {
                let (n, gap) = (param("n"), param("gap_ms"));
                let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
                tokio::spawn(async move {
                    for i in 0..n {
                        if tx.send(Ok(Frame::data(Bytes::from(format!("data: token-{i}\n\n"))))).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(gap)).await;
                    }
                });
                let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
                Response::builder().header("content-type", "text/event-stream").body(BoxBody::new(body)).unwrap()
            }
            "/echo" => {
                let mut len = 0usize;
                let mut body = req.into_body();
                let mut out = Vec::new();
                while let Some(Ok(f)) = body.frame().await {
                    if let Some(d) = f.data_ref() {
                        len += d.len();
                        if out.len() < 1 << 20 {
                            out.extend_from_slice(d);
                        }
                    }
                }
                Response::builder().status(status).header("x-body-len", len.to_string()).header("x-upstream", &self.name).body(full(out)).unwrap()
            }
            "/headers" => {
                let h: serde_json::Map<String, serde_json::Value> = req
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").into()))
                    .collect();
                Response::builder().status(status).header("x-upstream", &self.name).body(full(serde_json::to_vec(&h).unwrap())).unwrap()
            }
            _ => {
                // Drain the request body so keep-alive works.
                let _ = req.into_body().collect().await;
                Response::builder().status(status).header("x-upstream", &self.name).body(full(self.name.clone())).unwrap()
            }
        }
    }
}

pub fn full(b: impl Into<Bytes>) -> Body {
    BoxBody::new(Full::new(b.into()))
}

/// A weft-proxy in this process, from YAML.
pub fn start_proxy(yaml: &str) -> weft_proxy::Proxy {
    let cfg = weft_proxy::Config::from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    weft_proxy::Proxy::start(cfg, weft_proxy::Options::default()).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

pub type HttpClient = Client<HttpConnector, Body>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(64).build_http()
}

pub fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

/// A simple GET to `addr` with `Host: host` and extra headers; returns status, headers, body.
pub async fn get(c: &HttpClient, addr: SocketAddr, host: &str, path: &str, headers: &[(&str, &str)]) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut b = Request::get(format!("http://{addr}{path}")).header("host", host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c.request(b.body(full(Bytes::new())).unwrap()).await.expect("request reaches the proxy");
    let (parts, body) = resp.into_parts();
    (parts.status, parts.headers, body.collect().await.map(|c| c.to_bytes()).unwrap_or_default())
}

/// The body of a GET to `addr{path}` with `Host: host`; "" when it is not a 200 or nothing
/// answers within 5 s (a proxy restarting, a route not pushed yet), so callers can poll.
pub async fn body_if_ok(c: &HttpClient, addr: SocketAddr, host: &str, path: &str) -> String {
    let req = Request::get(format!("http://{addr}{path}")).header("host", host).body(full("")).unwrap();
    let Ok(Ok(resp)) = tokio::time::timeout(std::time::Duration::from_secs(5), c.request(req)).await else {
        return String::new();
    };
    if resp.status() != StatusCode::OK {
        return String::new();
    }
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    String::from_utf8_lossy(&body).into_owned()
}

/// Fetch an admin path as text.
pub async fn admin_get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let c = client();
    let (s, _, b) = get(&c, addr, "admin", path, &[]).await;
    (s, String::from_utf8_lossy(&b).into_owned())
}

/// Sum of a Prometheus counter's samples whose label set contains every `want` pair.
pub fn metric_sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| want.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Write raw bytes to `addr` and read whatever comes back until close or 2 s.
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Path of a binary built in this workspace's target directory (next to the test binary).
pub fn workspace_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join(name);
    assert!(p.exists(), "{} not built; run `cargo build -p weft-proxy` (nextest --workspace builds it)", p.display());
    p
}

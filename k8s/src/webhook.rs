//! The injector's HTTPS server: `POST /inject` takes an AdmissionReview and answers it
//! ([`crate::inject::review`]); `GET /healthz` for the Deployment's probes. TLS through
//! weft-control's accept loop (handshakes off the accept path, refused ones logged) with a
//! certificate reread when its files change, so cert-manager can rotate it under a running pod.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tokio::net::TcpListener;

use crate::inject::{self, Decision, Settings};

/// The path the MutatingWebhookConfiguration calls.
pub const PATH: &str = "/inject";

/// The webhook's routes.
pub fn router(settings: Arc<Settings>) -> Router {
    Router::new().route(PATH, post(review)).route("/healthz", get(|| async { "ok\n" })).with_state(settings)
}

async fn review(State(settings): State<Arc<Settings>>, body: Bytes) -> impl IntoResponse {
    let (decision, out) = inject::review(&settings, &body);
    match &decision {
        Decision::Patched(p) => tracing::info!(ops = p.0.len(), "sidecar injected"),
        Decision::Unchanged(why) => tracing::debug!(why, "admitted unchanged"),
        Decision::Denied(msg) => tracing::warn!(%msg, "pod denied"),
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], out)
}

/// Serve on `listener` with `tls` until `stop`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    settings: Arc<Settings>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let accepted = weft_control::tls::listen::accept(listener, tls, "webhook")?;
    axum::serve(accepted, router(settings))
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

//! `weft-model-server`: weft's reference model server. It loads a base (from its safetensors
//! file, or mapped from the node's weight holder) and optionally a variant's delta, and
//! answers every request with a real forward step, so an answer proves which delta computed
//! it. `GET /healthz` says when it is ready.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::weights::forward::{argmax, forward};
use crate::weights::model::{self, Base, Delta, Packed};
use crate::weights::share::{self, Weights};

/// Where the base comes from.
#[derive(Debug, Clone)]
pub enum BaseSource {
    /// Read the file into this process (no sharing).
    File(PathBuf),
    /// Map the shared copy of the holder listening on this socket.
    Holder(PathBuf),
}

/// A loaded model: the base, the variant's delta, and what it is called.
pub struct Model {
    pub variant: String,
    pub base: Base<Weights>,
    pub delta: Option<Delta>,
    /// Kept open while the model runs (see [`share::attach`]).
    pub holder: Option<std::os::unix::net::UnixStream>,
    pub load_ms: f64,
}

/// Loads the base and the delta, checking the delta's shapes against the base.
pub fn load(variant: &str, base: &BaseSource, delta: Option<&Path>) -> Result<Model, String> {
    let started = Instant::now();
    let (packed, holder) = match base {
        BaseSource::File(p) => {
            let packed = model::read_packed(p)?;
            (Packed { manifest: packed.manifest, storage: Weights::Heap(packed.storage) }, None)
        }
        BaseSource::Holder(socket) => {
            let (packed, conn) = share::attach(socket)?;
            (Packed { manifest: packed.manifest, storage: Weights::Shared(packed.storage) }, Some(conn))
        }
    };
    let base = Base::new(packed)?;
    let delta = match delta {
        Some(p) => Some(Delta::new(model::read_packed(p)?, base.dims).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    Ok(Model { variant: variant.to_string(), base, delta, holder, load_ms: started.elapsed().as_secs_f64() * 1e3 })
}

/// The input when a request brings none: fixed, so equal variants give equal answers.
fn default_input(d: usize) -> Vec<f32> {
    (0..d).map(|i| ((i * 7919) % 13) as f32 / 13.0).collect()
}

/// The answer to one request body: `{"input": [..]}` or anything else (the default input).
pub fn answer(model: &Model, body: &[u8]) -> Result<Value, String> {
    let input = match serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("input").cloned()) {
        Some(v) => serde_json::from_value::<Vec<f32>>(v).map_err(|e| format!("input: {e} (expected a list of numbers)"))?,
        None => default_input(model.base.dims.d),
    };
    let logits = forward(&model.base, model.delta.as_ref(), &input);
    Ok(json!({
        "variant": model.variant,
        "class": argmax(&logits),
        "logits": logits.iter().take(8).collect::<Vec<_>>(),
    }))
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

async fn handle(model: Arc<Model>, req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/healthz" {
        return Ok(reply(StatusCode::OK, json!({"status": "ready", "variant": model.variant, "load_ms": model.load_ms})));
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(reply(StatusCode::BAD_REQUEST, json!({"error": format!("reading the body: {e}")}))),
    };
    let m = model.clone();
    Ok(match tokio::task::spawn_blocking(move || answer(&m, &body)).await {
        Ok(Ok(v)) => reply(StatusCode::OK, v),
        Ok(Err(e)) => reply(StatusCode::BAD_REQUEST, json!({"error": e})),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, json!({"error": e.to_string()})),
    })
}

/// Serves `model` on `listener` until the process is stopped.
pub async fn serve(listener: tokio::net::TcpListener, model: Arc<Model>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let model = model.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(model.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await;
        });
    }
}

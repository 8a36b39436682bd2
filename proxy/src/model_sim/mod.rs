//! `weft-model-sim`: a model server stand-in that behaves like a real one, for demos and tests.
//!
//! - KServe v2 REST: `GET /v2/health/live|ready`, `GET /v2/models/{name}[/ready]`,
//!   `POST /v2/models/{name}/infer` (answers a KServe v2 inference response).
//! - OpenAI-style `POST /v1/completions`: `"stream": true` sends Server-Sent Events, one
//!   `data: {...}` chunk per token at `tokens_per_s`, then (with `"stream_options":
//!   {"include_usage": true}`, as vLLM and OpenAI) a chunk with the `usage`, then
//!   `data: [DONE]`; a plain response carries `usage` too.
//! - `GET /metrics`: Prometheus text with the queue gauges routers read from vLLM
//!   (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`)
//!   and request counters.
//!
//! Each request waits for one of `max_concurrency` slots (the queue beyond it is
//! `vllm:num_requests_waiting`), then sleeps a latency drawn from the configured distribution
//! (time to first token for a stream), then fails with a 500 with probability `error_rate`.

pub mod engine;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Shape of the latency distribution around `latency_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LatencyDist {
    /// Right-skewed like real serving latency: mean `latency_ms`, standard deviation `jitter_ms`.
    #[default]
    Lognormal,
    /// Uniform in `latency_ms ± jitter_ms`.
    Uniform,
}

impl std::str::FromStr for LatencyDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lognormal" => Ok(LatencyDist::Lognormal),
            "uniform" => Ok(LatencyDist::Uniform),
            _ => Err(format!("{s:?}: expected lognormal or uniform")),
        }
    }
}

/// How the simulated model behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Model name served (`/v2/models/{model}/...`, the `model` of completions).
    pub model: String,
    pub version: String,
    pub latency_ms: f64,
    pub jitter_ms: f64,
    pub dist: LatencyDist,
    /// Probability in `[0, 1]` that a request fails with a 500.
    pub error_rate: f64,
    /// Streaming speed of completions after the first token.
    pub tokens_per_s: f64,
    /// Requests served at once; the rest wait (`vllm:num_requests_waiting`). 0 = unlimited.
    pub max_concurrency: usize,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            model: "model".into(),
            version: "1".into(),
            latency_ms: 20.0,
            jitter_ms: 5.0,
            dist: LatencyDist::Lognormal,
            error_rate: 0.0,
            tokens_per_s: 50.0,
            max_concurrency: 64,
        }
    }
}

impl SimOptions {
    /// Checks the ranges; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.is_empty() || self.model.contains('/') {
            return Err(format!("--model: {:?} must be a non-empty name without '/'", self.model));
        }
        if !(self.latency_ms.is_finite() && self.latency_ms >= 0.0) {
            return Err(format!("--latency-ms: {} must be ≥ 0", self.latency_ms));
        }
        if !(self.jitter_ms.is_finite() && self.jitter_ms >= 0.0) {
            return Err(format!("--jitter-ms: {} must be ≥ 0", self.jitter_ms));
        }
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!("--error-rate: {} is not in [0, 1]", self.error_rate));
        }
        if !(self.tokens_per_s.is_finite() && self.tokens_per_s > 0.0) {
            return Err(format!("--tokens-per-s: {} must be > 0", self.tokens_per_s));
        }
        Ok(())
    }
}

/// One latency in milliseconds from two independent uniforms in `(0, 1]` (pure, so the
/// distribution is tested without sleeping).
pub fn sample_latency_ms(mean: f64, jitter: f64, dist: LatencyDist, u1: f64, u2: f64) -> f64 {
    if jitter <= 0.0 || mean <= 0.0 {
        return mean.max(0.0);
    }
    match dist {
        LatencyDist::Uniform => (mean + jitter * (2.0 * u1 - 1.0)).max(0.0),
        LatencyDist::Lognormal => {
            // Lognormal with the given mean and standard deviation (moment matching).
            let sigma2 = (1.0 + (jitter / mean).powi(2)).ln();
            let mu = mean.ln() - sigma2 / 2.0;
            // Box-Muller.
            let z = (-2.0 * u1.max(f64::MIN_POSITIVE).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (mu + sigma2.sqrt() * z).exp()
        }
    }
}

/// Gauges and counters shown on `/metrics`.
#[derive(Default)]
struct Stats {
    running: AtomicUsize,
    waiting: AtomicUsize,
    ok: AtomicU64,
    failed: AtomicU64,
    tokens: AtomicU64,
}

struct Sim {
    opts: SimOptions,
    slots: Option<Semaphore>,
    stats: Stats,
}

/// A running simulator; [`ModelSim::stop`] or dropping it stops accepting.
pub struct ModelSim {
    pub addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
}

impl ModelSim {
    /// Serves on `listener` until stopped (spawned on the current runtime).
    pub fn start(listener: TcpListener, opts: SimOptions) -> std::io::Result<ModelSim> {
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let slots = (opts.max_concurrency > 0).then(|| Semaphore::new(opts.max_concurrency));
        let sim = Arc::new(Sim { opts, slots, stats: Stats::default() });
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    r = listener.accept() => r,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let sim = sim.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(sim.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Ok(ModelSim { addr, stop })
    }

    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for ModelSim {
    fn drop(&mut self) {
        self.stop();
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(v.to_string()))
        .expect("valid response")
}

fn error(status: StatusCode, msg: &str) -> Response<Body> {
    json_response(status, &json!({ "error": msg }))
}

/// Holds a serving slot and counts the request as running until dropped.
struct Running<'a> {
    _permit: Option<tokio::sync::SemaphorePermit<'a>>,
    stats: &'a Stats,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.stats.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Sim {
    /// Waits for a slot (counted as waiting meanwhile).
    async fn admit(&self) -> Running<'_> {
        let permit = match &self.slots {
            None => None,
            Some(s) => {
                self.stats.waiting.fetch_add(1, Ordering::Relaxed);
                let p = s.acquire().await.expect("semaphore never closed");
                self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                Some(p)
            }
        };
        self.stats.running.fetch_add(1, Ordering::Relaxed);
        Running { _permit: permit, stats: &self.stats }
    }

    fn latency(&self) -> Duration {
        let o = &self.opts;
        let ms = sample_latency_ms(o.latency_ms, o.jitter_ms, o.dist, 1.0 - rand::random::<f64>(), rand::random());
        Duration::from_secs_f64(ms / 1000.0)
    }

    fn fails(&self) -> bool {
        self.opts.error_rate > 0.0 && rand::random::<f64>() < self.opts.error_rate
    }

    fn count(&self, ok: bool) {
        let c = if ok { &self.stats.ok } else { &self.stats.failed };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn metrics(&self) -> String {
        let s = &self.stats;
        let m = &self.opts.model;
        let running = s.running.load(Ordering::Relaxed);
        let kv = match self.opts.max_concurrency {
            0 => 0.0,
            n => running as f64 / n as f64,
        };
        format!(
            "# HELP vllm:num_requests_running Number of requests being served.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"{m}\"}} {running}\n\
             # HELP vllm:num_requests_waiting Number of requests waiting for a serving slot.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"{m}\"}} {}\n\
             # HELP vllm:kv_cache_usage_perc KV-cache usage, 0 to 1 (simulated: running / max concurrency).\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{model_name=\"{m}\"}} {kv}\n\
             # HELP vllm:generation_tokens_total Tokens generated.\n\
             # TYPE vllm:generation_tokens_total counter\n\
             vllm:generation_tokens_total{{model_name=\"{m}\"}} {}\n\
             # HELP model_sim_requests_total Requests answered, by outcome.\n\
             # TYPE model_sim_requests_total counter\n\
             model_sim_requests_total{{model_name=\"{m}\",outcome=\"ok\"}} {}\n\
             model_sim_requests_total{{model_name=\"{m}\",outcome=\"error\"}} {}\n",
            s.waiting.load(Ordering::Relaxed),
            s.tokens.load(Ordering::Relaxed),
            s.ok.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
        )
    }
}

async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let m = &sim.opts.model;
    let resp = match (&parts.method, segs.as_slice()) {
        (&Method::GET, ["v2", "health", "live" | "ready"]) => json_response(StatusCode::OK, &json!({})),
        (&Method::GET, ["metrics"]) => Response::builder()
            .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(full(sim.metrics()))
            .expect("valid response"),
        (&Method::GET, ["v2", "models", name]) if name == m => json_response(
            StatusCode::OK,
            &json!({"name": m, "versions": [sim.opts.version], "platform": "weft-model-sim",
                    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1]}],
                    "outputs": [{"name": "score", "datatype": "FP32", "shape": [1]}]}),
        ),
        (&Method::GET, ["v2", "models", name, "ready"]) if name == m => json_response(StatusCode::OK, &json!({})),
        (&Method::POST, ["v2", "models", name, "infer"]) if name == m => infer(&sim, &body).await,
        (_, ["v2", "models", name, ..]) => error(StatusCode::NOT_FOUND, &format!("model {name:?} is not served here (this is {m:?})")),
        (&Method::POST, ["v1", "completions"]) => completions(sim.clone(), &body).await,
        _ => error(StatusCode::NOT_FOUND, &format!("no such endpoint: {} {path}", parts.method)),
    };
    Ok(resp)
}

async fn infer(sim: &Sim, body: &[u8]) -> Response<Body> {
    let req: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("request body is not JSON: {e}")),
        }
    };
    let _slot = sim.admit().await;
    tokio::time::sleep(sim.latency()).await;
    if sim.fails() {
        sim.count(false);
        return error(StatusCode::INTERNAL_SERVER_ERROR, "simulated model failure");
    }
    sim.count(true);
    let mut out = json!({
        "model_name": sim.opts.model,
        "model_version": sim.opts.version,
        "outputs": [{"name": "score", "datatype": "FP32", "shape": [1], "data": [rand::random::<f32>()]}],
    });
    if let Some(id) = req.get("id") {
        out["id"] = id.clone();
    }
    json_response(StatusCode::OK, &out)
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// One OpenAI completion chunk (or the whole completion when `finish` is set and not streaming).
fn completion_chunk(id: &str, model: &str, text: &str, finish: Option<&str>) -> Value {
    json!({
        "id": id, "object": "text_completion", "created": now_s(), "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
    })
}

const WORDS: [&str; 8] = [" the", " model", " says", " hello", " from", " weft", " and", " more"];

async fn completions(sim: Arc<Sim>, body: &[u8]) -> Response<Body> {
    let req: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error(StatusCode::BAD_REQUEST, "request body must be a JSON object"),
    };
    let model = req["model"].as_str().unwrap_or(&sim.opts.model).to_string();
    if model != sim.opts.model {
        return error(StatusCode::NOT_FOUND, &format!("model {model:?} is not served here (this is {:?})", sim.opts.model));
    }
    let max_tokens = req["max_tokens"].as_u64().unwrap_or(16).clamp(1, 4096);
    let stream = req["stream"].as_bool().unwrap_or(false);
    let include_usage = req["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let prompt_tokens = req["prompt"].as_str().map(|p| p.split_whitespace().count()).unwrap_or(0) as u64;
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens});
    let per_token = Duration::from_secs_f64(1.0 / sim.opts.tokens_per_s);
    let id = format!("cmpl-{:016x}", rand::random::<u64>());

    if !stream {
        let _slot = sim.admit().await;
        tokio::time::sleep(sim.latency() + per_token * (max_tokens as u32 - 1)).await;
        if sim.fails() {
            sim.count(false);
            return error(StatusCode::INTERNAL_SERVER_ERROR, "simulated model failure");
        }
        sim.count(true);
        sim.stats.tokens.fetch_add(max_tokens, Ordering::Relaxed);
        let text: String = (0..max_tokens).map(|i| WORDS[i as usize % WORDS.len()]).collect();
        let mut v = completion_chunk(&id, &model, &text, Some("length"));
        v["usage"] = usage;
        return json_response(StatusCode::OK, &v);
    }

    // Streaming: wait for a slot and the first token before answering, so a failure is a
    // plain 500 (as vLLM fails before the stream starts); then one SSE event per token.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let (admitted_tx, admitted_rx) = tokio::sync::oneshot::channel::<bool>();
    let s = sim.clone();
    tokio::spawn(async move {
        let _slot = s.admit().await;
        tokio::time::sleep(s.latency()).await;
        let fail = s.fails();
        s.count(!fail);
        if admitted_tx.send(!fail).is_err() || fail {
            return;
        }
        for i in 0..max_tokens {
            if i > 0 {
                tokio::time::sleep(per_token).await;
            }
            let finish = (i + 1 == max_tokens).then_some("length");
            let chunk = completion_chunk(&id, &model, WORDS[i as usize % WORDS.len()], finish);
            if tx.send(Bytes::from(format!("data: {chunk}\n\n"))).await.is_err() {
                return; // the client went away
            }
            s.stats.tokens.fetch_add(1, Ordering::Relaxed);
        }
        if include_usage {
            let last = json!({"id": id, "object": "text_completion", "model": model, "choices": [], "usage": usage});
            let _ = tx.send(Bytes::from(format!("data: {last}\n\n"))).await;
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    if admitted_rx.await != Ok(true) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "simulated model failure");
    }
    let frames = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = StreamBody::new(tokio_stream::StreamExt::map(frames, |b| Ok::<_, Infallible>(Frame::data(b))));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(BodyExt::boxed(body))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lognormal_samples_have_the_configured_mean_and_spread() {
        // A deterministic grid of uniforms approximates the distribution.
        let n = 400;
        let mut xs = Vec::new();
        for i in 0..n {
            for j in 0..n {
                let (u1, u2) = ((i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64);
                xs.push(sample_latency_ms(20.0, 8.0, LatencyDist::Lognormal, u1, u2));
            }
        }
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64).sqrt();
        assert!((mean - 20.0).abs() < 0.3, "mean {mean}");
        assert!((sd - 8.0).abs() < 0.5, "sd {sd}");
        assert!(xs.iter().all(|x| *x > 0.0));
    }

    #[test]
    fn uniform_and_fixed_latencies() {
        assert_eq!(sample_latency_ms(20.0, 5.0, LatencyDist::Uniform, 0.0, 0.3), 15.0);
        assert_eq!(sample_latency_ms(20.0, 5.0, LatencyDist::Uniform, 1.0, 0.3), 25.0);
        assert_eq!(sample_latency_ms(20.0, 0.0, LatencyDist::Lognormal, 0.1, 0.3), 20.0);
    }

    #[test]
    fn options_are_range_checked() {
        assert!(SimOptions::default().validate().is_ok());
        let bad = SimOptions { error_rate: 1.5, ..Default::default() };
        assert!(bad.validate().unwrap_err().starts_with("--error-rate"));
        let bad = SimOptions { tokens_per_s: 0.0, ..Default::default() };
        assert!(bad.validate().unwrap_err().starts_with("--tokens-per-s"));
        assert_eq!("uniform".parse::<LatencyDist>(), Ok(LatencyDist::Uniform));
        assert!("normal".parse::<LatencyDist>().is_err());
    }
}

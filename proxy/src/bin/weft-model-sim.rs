//! `weft-model-sim --listen 127.0.0.1:8000 --model ranker`: a model server stand-in (KServe v2
//! REST, OpenAI-style completions with SSE streaming, vLLM-style queue gauges on `/metrics`)
//! with a configurable latency distribution, error rate and token speed. See
//! `weft_proxy::model_sim`.

use clap::Parser;
use std::net::SocketAddr;
use weft_proxy::model_sim::{LatencyDist, ModelSim, SimOptions};

#[derive(Parser)]
#[command(version, about = "weft's model server simulator: KServe v2 + OpenAI completions (SSE) + vLLM queue metrics")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Model name served (`/v2/models/NAME/infer`, completions' `model`).
    #[arg(long, default_value = "model")]
    model: String,
    /// Model version reported in responses.
    #[arg(long, default_value = "1")]
    model_version: String,
    /// Mean latency (time to first token for a stream), milliseconds.
    #[arg(long, default_value_t = 20.0)]
    latency_ms: f64,
    /// Spread of the latency: standard deviation (lognormal) or half-width (uniform), ms.
    #[arg(long, default_value_t = 5.0)]
    jitter_ms: f64,
    /// Latency distribution: lognormal (right-skewed, like real serving) or uniform.
    #[arg(long, default_value = "lognormal")]
    latency_dist: LatencyDist,
    /// Probability in [0, 1] that a request fails with a 500.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Completion tokens per second after the first token.
    #[arg(long, default_value_t = 50.0)]
    tokens_per_s: f64,
    /// Requests served at once; more wait in a queue (vllm:num_requests_waiting). 0 = unlimited.
    #[arg(long, default_value_t = 64)]
    max_concurrency: usize,
}

fn main() {
    let a = Args::parse();
    let opts = SimOptions {
        model: a.model,
        version: a.model_version,
        latency_ms: a.latency_ms,
        jitter_ms: a.jitter_ms,
        dist: a.latency_dist,
        error_rate: a.error_rate,
        tokens_per_s: a.tokens_per_s,
        max_concurrency: a.max_concurrency,
    };
    if let Err(e) = opts.validate() {
        eprintln!("weft-model-sim: {e}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let code = rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(a.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("weft-model-sim: --listen {}: {e}", a.listen);
                return 1;
            }
        };
        let model = opts.model.clone();
        let sim = match ModelSim::start(listener, opts) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("weft-model-sim: {e}");
                return 1;
            }
        };
        eprintln!("weft-model-sim: serving model {model:?} on http://{}", sim.addr);
        weft_proxy::signals::stop_requested().await;
        0
    });
    std::process::exit(code);
}

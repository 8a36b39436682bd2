//! The demo mesh on one machine: two model-server stand-ins (variant B a bit slower and more
//! error-prone), a weft sidecar splitting traffic 50/50 sticky by user id, a client driving
//! traffic through it, and an A/B report at the end.
//!
//!     cargo run --release -p weft-proxy --example demo [-- --seconds 15 --concurrency 16]
//!
//! Everything listens on 127.0.0.1 with ports picked by the OS. Until `weft demo` (with the
//! control plane) lands, this is the one-command tour of the data plane.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A model server stand-in: KServe v2 infer with a latency distribution and an error rate.
#[derive(Clone, Copy)]
struct Model {
    mean_ms: f64,
    jitter_ms: f64,
    error_rate: f64,
}

async fn serve_model(m: Model) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind model server");
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { continue };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let ms = (m.mean_ms + m.jitter_ms * (rand::random::<f64>() * 2.0 - 1.0)).max(0.5);
                    tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
                    let fail = rand::random::<f64>() < m.error_rate;
                    let (status, body) = if fail {
                        (500, r#"{"error":"model failed"}"#)
                    } else {
                        (200, r#"{"model_name":"ranker","outputs":[{"name":"score","datatype":"FP32","shape":[1],"data":[0.93]}]}"#)
                    };
                    Ok::<_, Infallible>(Response::builder().status(status).body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap())
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
    addr
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) => v,
            None => {
                eprintln!("demo: {name} needs a whole number (usage: --seconds N --concurrency N)");
                std::process::exit(2);
            }
        },
    }
}

#[derive(Default)]
struct Arm {
    latencies_ms: Vec<f64>,
    errors: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = arg("--seconds", 15);
    let concurrency = arg("--concurrency", 16).max(1);
    let warmup = Duration::from_secs(seconds.min(15) / 5);
    let a = serve_model(Model { mean_ms: 20.0, jitter_ms: 8.0, error_rate: 0.01 }).await;
    let b = serve_model(Model { mean_ms: 26.0, jitter_ms: 10.0, error_rate: 0.03 }).await;
    let yaml = format!(
        r#"
node: {{id: demo-client, team: ml-platform, project: ranking, job_type: inference}}
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: outbound, address: "127.0.0.1:0"}}]
services:
  - name: ranker
    hosts: [ranker]
    routes: [{{name: infer, match: {{path_prefix: /v2/models/}}, experiment: ranker-ab}}]
experiments:
  - name: ranker-ab
    salt: demo
    unit_header: x-user-id
    variants:
      - {{name: a, cluster: ranker-a, weight: 50, model_version: "1"}}
      - {{name: b, cluster: ranker-b, weight: 50, model_version: "2"}}
clusters:
  - {{name: ranker-a, endpoints: ["{a}"]}}
  - {{name: ranker-b, endpoints: ["{b}"]}}
"#
    );
    let cfg = weft_proxy::Config::from_yaml(&yaml).expect("demo config parses");
    let proxy = weft_proxy::Proxy::start(cfg, weft_proxy::Options::default()).unwrap_or_else(|e| {
        eprintln!("demo: cannot start the sidecar: {e}");
        std::process::exit(1);
    });
    let sidecar = proxy.listener_addrs[0];
    println!("weft demo: variant a at {a}, variant b at {b}, sidecar at {sidecar}, admin at http://{}", proxy.admin_addr);
    println!("driving {seconds} s of traffic, {concurrency} clients, 50/50 split sticky by x-user-id (first {} s = warm-up, excluded)\n", warmup.as_secs());

    let arms: Arc<Mutex<[Arm; 2]>> = Arc::default();
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, arms) = (client.clone(), arms.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let user = format!("user-{}", rand::random_range(0..5000));
                let req = Request::post(format!("http://{sidecar}/v2/models/ranker/infer"))
                    .header("host", "ranker")
                    .header("x-user-id", &user)
                    .body(Empty::new())
                    .unwrap();
                let t = Instant::now();
                let Ok(resp) = client.request(req).await else { continue };
                let variant = resp.headers().get("x-weft-variant").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let ok = resp.status().is_success();
                let _ = resp.into_body().collect().await;
                if t < start + warmup {
                    continue;
                }
                let i = match variant.as_str() {
                    "a" => 0,
                    "b" => 1,
                    _ => continue,
                };
                let mut arms = arms.lock().unwrap();
                arms[i].latencies_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                arms[i].errors += u64::from(!ok);
            }
        }));
    }
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let done = start.elapsed().as_secs_f64() / seconds as f64;
        let n: usize = arms.lock().unwrap().iter().map(|a| a.latencies_ms.len()).sum();
        let bar = "#".repeat((done * 40.0) as usize);
        eprint!("\r[{bar:<40}] {:>3.0}%  {n} requests measured", done.min(1.0) * 100.0);
    }
    for t in tasks {
        let _ = t.await;
    }
    eprintln!();
    let metrics = http_get(proxy.admin_addr, "/metrics").await;
    proxy.shutdown(Duration::from_secs(2));

    let mut arms = std::mem::take(&mut *arms.lock().unwrap());
    report(&mut arms);
    println!("\nweft's own per-variant counters (admin /metrics):");
    for line in metrics.lines().filter(|l| l.starts_with("weft_requests_total{")) {
        println!("  {line}");
    }
}

fn report(arms: &mut [Arm; 2]) {
    println!("\n== A/B report: experiment ranker-ab (warm-up excluded) ==");
    println!("{:<8} {:>8} {:>18} {:>22} {:>8} {:>8}", "variant", "requests", "error rate (95% CI)", "p50 ms (95% CI)", "p95 ms", "p99 ms");
    let mut p50s = [0.0; 2];
    for (name, arm) in ["a", "b"].iter().zip(arms.iter_mut()) {
        arm.latencies_ms.sort_by(f64::total_cmp);
        let n = arm.latencies_ms.len();
        if n == 0 {
            println!("{name:<8} {:>8}", 0);
            continue;
        }
        let (lo, hi) = wilson(arm.errors, n as u64);
        let (qlo, qhi) = quantile_ci(n, 0.5);
        let q = |p: f64| arm.latencies_ms[((n as f64 - 1.0) * p) as usize];
        p50s[name.as_bytes()[0] as usize - b'a' as usize] = q(0.5);
        println!(
            "{name:<8} {n:>8} {:>7.2}% [{:.2}, {:.2}] {:>8.1} [{:.1}, {:.1}] {:>8.1} {:>8.1}",
            100.0 * arm.errors as f64 / n as f64, 100.0 * lo, 100.0 * hi,
            q(0.5), arm.latencies_ms[qlo], arm.latencies_ms[qhi], q(0.95), q(0.99)
        );
    }
    let (na, nb) = (arms[0].latencies_ms.len() as f64, arms[1].latencies_ms.len() as f64);
    let e = (na + nb) / 2.0;
    let chi2 = if e > 0.0 { ((na - e).powi(2) + (nb - e).powi(2)) / e } else { 0.0 };
    let p = erfc((chi2 / 2.0).sqrt());
    println!(
        "\nsample-ratio check (expected 50/50): chi2 = {chi2:.2}, p = {p:.3} → {}",
        if p < 0.001 { "MISMATCH: the split is broken, do not trust the comparison" } else { "ok" }
    );
    let ((ea, na_), (eb, nb_)) = ((arms[0].errors as f64, na), (arms[1].errors as f64, nb));
    if na_ > 0.0 && nb_ > 0.0 {
        // Two-proportion z-test on error rate.
        let pool = (ea + eb) / (na_ + nb_);
        let se = (pool * (1.0 - pool) * (1.0 / na_ + 1.0 / nb_)).sqrt();
        let z = if se > 0.0 { (eb / nb_ - ea / na_) / se } else { 0.0 };
        let p_err = erfc(z.abs() / std::f64::consts::SQRT_2);
        let better = if ea / na_ <= eb / nb_ { "a" } else { "b" };
        println!(
            "error rate: variant {better} is better (z = {z:.2}, two-sided p = {p_err:.4}, confidence {:.1}%)",
            100.0 * (1.0 - p_err)
        );
        println!("latency: p50 a = {:.1} ms, p50 b = {:.1} ms (see the 95% CIs above)", p50s[0], p50s[1]);
    }
}

/// Wilson score interval for a proportion (95%).
fn wilson(k: u64, n: u64) -> (f64, f64) {
    let (k, n, z) = (k as f64, n as f64, 1.96);
    let p = k / n;
    let d = 1.0 + z * z / n;
    let c = (p + z * z / (2.0 * n)) / d;
    let h = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / d;
    ((c - h).max(0.0), (c + h).min(1.0))
}

/// Distribution-free 95% CI for a quantile: order-statistic ranks from the binomial's normal
/// approximation.
fn quantile_ci(n: usize, q: f64) -> (usize, usize) {
    let (nf, z) = (n as f64, 1.96);
    let half = z * (nf * q * (1.0 - q)).sqrt();
    let lo = (nf * q - half).floor().max(0.0) as usize;
    let hi = ((nf * q + half).ceil() as usize).min(n - 1);
    (lo.min(n - 1), hi)
}

/// Complementary error function (Numerical Recipes' erfcc, |error| < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * (-z * z - 1.26551223
        + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))).exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let Ok(resp) = client.get(format!("http://{addr}{path}").parse().unwrap()).await else { return String::new() };
    String::from_utf8_lossy(&resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default()).into_owned()
}

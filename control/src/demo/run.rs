//! `weft demo`: the orchestration. An in-process control node, two `weft-model-sim` variants
//! each behind an inbound `weft-proxy` that registers it over xDS, an outbound `weft-proxy` for
//! the client, the experiment applied through the REST API, traffic, and the report.
//!
//! Every child process is killed (and reaped) when [`Procs`] drops: on success, on any error,
//! and on Ctrl-C/SIGTERM (the signal wins a `select!` against the demo, whose future, holding
//! the children, is dropped). Ports are checked before anything starts, so a busy port or a
//! bad flag leaves nothing behind.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::html;
use super::report::{Sample, analyze, render_text};

/// What `weft demo` was asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub seconds: u64,
    pub warmup_s: u64,
    pub concurrency: usize,
    /// First of the ten consecutive loopback ports the demo uses.
    pub listen_base: u16,
    pub report: PathBuf,
    /// Where `weft-proxy` and `weft-model-sim` are (default: next to this executable).
    pub bin_dir: Option<PathBuf>,
    /// Distinct user ids the clients draw from.
    pub users: u64,
    /// Sidecars speak plaintext to each other (default: mutual TLS, strict, with identities
    /// from the control plane's CA).
    pub plaintext: bool,
}

/// The two simulated variants: B a bit slower, with more errors.
pub const VARIANTS: [(&str, f64, f64, f64); 2] = [("a", 20.0, 6.0, 0.005), ("b", 24.0, 9.0, 0.02)];

/// The ports, as offsets from `--listen-base`, and what listens there.
const PORTS: [(u16, &str); 10] = [
    (0, "control API"),
    (1, "control xDS"),
    (2, "model server a"),
    (3, "model server b"),
    (4, "inbound sidecar a"),
    (5, "inbound sidecar a admin"),
    (6, "inbound sidecar b"),
    (7, "inbound sidecar b admin"),
    (8, "outbound sidecar"),
    (9, "outbound sidecar admin"),
];

fn addr(base: u16, offset: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], base + offset))
}

/// Checks the flags that can be checked before anything starts.
pub fn validate(o: &DemoOptions) -> Result<(), String> {
    if o.listen_base < 1024 || o.listen_base > 65535 - PORTS.len() as u16 {
        return Err(format!("--listen-base: {} is not in 1024..={} (the demo uses it and the next 9 ports)", o.listen_base, 65535 - PORTS.len()));
    }
    if o.seconds == 0 || o.seconds > 3600 {
        return Err(format!("--seconds: {} is not in 1..=3600", o.seconds));
    }
    if o.warmup_s >= o.seconds {
        return Err(format!("--warmup: {} s leaves nothing to measure in a {} s run", o.warmup_s, o.seconds));
    }
    if o.concurrency == 0 || o.concurrency > 1024 {
        return Err(format!("--concurrency: {} is not in 1..=1024", o.concurrency));
    }
    if o.users == 0 {
        return Err("--users: must be at least 1".into());
    }
    Ok(())
}

/// Fails with a clear message if any demo port is taken (bound like the real listeners, with
/// SO_REUSEADDR, so a previous run's TIME_WAIT connections do not count). Needs no runtime.
pub fn check_ports(base: u16) -> Result<(), String> {
    for (off, what) in PORTS {
        let a = addr(base, off);
        let free = tokio::net::TcpSocket::new_v4().and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(a) // a listener on it, even one with SO_REUSEPORT, makes this fail
        });
        if let Err(e) = free {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse { "is already in use" } else { "cannot be bound" };
            return Err(format!(
                "port {} (for the {what}) {hint}: {e}. The demo uses ports {}..={}; pick others with --listen-base N, \
                 or stop what holds it (e.g. a previous weft demo or weft-control)",
                a.port(),
                base,
                base + PORTS.len() as u16 - 1
            ));
        }
    }
    Ok(())
}

/// `weft-proxy` and `weft-model-sim`, from `dir` or next to the running executable.
pub fn locate_binaries(dir: Option<&Path>) -> Result<(PathBuf, PathBuf), String> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot locate this executable: {e}"))?
            .parent()
            .map(Path::to_path_buf)
            .ok_or("cannot locate this executable's directory")?,
    };
    let (proxy, sim) = (dir.join("weft-proxy"), dir.join("weft-model-sim"));
    let missing: Vec<&str> =
        [(&proxy, "weft-proxy"), (&sim, "weft-model-sim")].into_iter().filter(|(p, _)| !p.is_file()).map(|(_, n)| n).collect();
    if !missing.is_empty() {
        let release = if dir.ends_with("debug") { "" } else { " --release" };
        return Err(format!(
            "{} not found in {} (weft demo runs the binaries next to itself); build them with: cargo build{release} -p weft-proxy -p weft-control",
            missing.join(" and "),
            dir.display()
        ));
    }
    Ok((proxy, sim))
}

/// The demo's child processes; dropping it kills and reaps every one.
#[derive(Default)]
struct Procs {
    children: Vec<(String, std::process::Child, PathBuf)>,
}

impl Procs {
    fn spawn(&mut self, name: &str, bin: &Path, args: &[String], logs: &Path) -> anyhow::Result<()> {
        let log = logs.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} ({name})", bin.display()))?;
        self.children.push((name.to_string(), child, log));
        Ok(())
    }

    /// An error naming the first child that exited, with the end of its log.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, child, log) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(8).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!("{name} exited ({status}); its last output:\n  {}", tail.join("\n  "));
            }
        }
        Ok(())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.children {
            let _ = child.kill();
        }
        for (_, child, _) in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// The demo's scratch directory (control data, sidecar configs, child logs); removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One HTTP/1.1 request on a fresh connection.
async fn http(
    to: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(to).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut req = Request::builder().method(method).uri(path);
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req = req.header("host", to.to_string());
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let resp = send.send_request(req.header("content-type", "application/json").body(Full::new(Bytes::from(body)))?).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        anyhow::Ok((parts.status, parts.headers, bytes))
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.map_err(|_| anyhow!("{to}{path}: no answer in 10 s"))?
}

/// Polls `check` every 100 ms (also checking the children) until it is true.
async fn wait_until<F, Fut>(what: &str, limit: Duration, procs: &mut Procs, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return Ok(());
        }
        procs.check_alive()?;
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put(api: SocketAddr, path: &str, spec: Value) -> anyhow::Result<()> {
    let (status, _, body) = http(api, Method::PUT, path, &[], Some(&spec)).await?;
    if status != StatusCode::OK {
        bail!("PUT {path}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(())
}

/// The trust domain of the demo mesh (weft-control's default).
const DEMO_TRUST_DOMAIN: &str = crate::server::DEFAULT_TRUST_DOMAIN;

/// The `identity:` section of a sidecar that gets `id`'s certificate from the control plane
/// (a join token made through the API, kept in the scratch dir); empty with `--plaintext`.
async fn identity(api: SocketAddr, dir: &Path, id: &str, plaintext: bool) -> anyhow::Result<String> {
    if plaintext {
        return Ok(String::new());
    }
    let (status, _, body) = http(api, Method::POST, "/v1/identity/tokens", &[], Some(&json!({"identity": id, "ttl": "24h"}))).await?;
    if status != StatusCode::CREATED {
        bail!("POST /v1/identity/tokens: {status}: {}", String::from_utf8_lossy(&body));
    }
    let v: Value = serde_json::from_slice(&body)?;
    let name = id.replace('/', "-");
    let token = dir.join(format!("{name}.token"));
    std::fs::write(&token, v["token"].as_str().unwrap_or_default())?;
    Ok(format!(
        "identity: {{spiffe_id: \"{}\", token_file: \"{}\", dir: \"{}\"}}\n",
        v["identity"].as_str().unwrap_or_default(),
        token.display(),
        dir.join(format!("{name}-identity")).display()
    ))
}

fn inbound_yaml(name: &str, listen: SocketAddr, admin: SocketAddr, model: SocketAddr) -> String {
    format!(
        "node: {{id: ranker-{name}, team: ml-platform, project: ranking, job_type: inference}}\n\
         admin: {{address: \"{admin}\"}}\n\
         listeners: [{{name: in, address: \"{listen}\", direction: inbound}}]\n\
         services: [{{name: local, hosts: [\"*\"], listeners: [in], routes: [{{name: model, cluster: local}}]}}]\n\
         clusters: [{{name: local, endpoints: [\"{model}\"]}}]\n"
    )
}

/// splitmix64: the clients' user-id stream (no RNG crate needed for a demo).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Live counters for the progress line.
#[derive(Default)]
struct Progress {
    requests: [AtomicU64; 2],
    errors: [AtomicU64; 2],
    unrouted: AtomicU64,
}

/// One client: a keep-alive connection to the outbound sidecar, requests back to back.
async fn client(
    outbound: SocketAddr,
    start: Instant,
    end: Instant,
    users: u64,
    seed: u64,
    progress: Arc<Progress>,
) -> [Vec<Sample>; 2] {
    let mut out: [Vec<Sample>; 2] = Default::default();
    let mut rng = seed;
    let body = Bytes::from(json!({"inputs": [{"name": "input", "datatype": "FP32", "shape": [4], "data": [0.1, 0.2, 0.3, 0.4]}]}).to_string());
    let mut conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> = None;
    while Instant::now() < end {
        if let Some(s) = &mut conn
            && s.ready().await.is_err()
        {
            conn = None;
        }
        let sender = match &mut conn {
            Some(s) => s,
            None => {
                let Ok(Ok(tcp)) = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(outbound)).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let Ok((s, c)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await else { continue };
                tokio::spawn(c);
                conn.insert(s)
            }
        };
        let unit = splitmix(&mut rng) % users;
        let req = Request::post("/v2/models/ranker/infer")
            .header("host", "ranker")
            .header("x-user-id", format!("user-{unit}"))
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .expect("valid request");
        let t = Instant::now();
        let Ok(resp) = sender.send_request(req).await else {
            conn = None;
            progress.unrouted.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let variant = resp.headers().get("x-weft-variant").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let ok = resp.status().is_success();
        if resp.into_body().collect().await.is_err() {
            conn = None;
        }
        let latency_ms = t.elapsed().as_secs_f64() * 1000.0;
        let Some(i) = VARIANTS.iter().position(|v| Some(v.0) == variant.as_deref()) else {
            progress.unrouted.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        progress.requests[i].fetch_add(1, Ordering::Relaxed);
        if !ok {
            progress.errors[i].fetch_add(1, Ordering::Relaxed);
        }
        out[i].push(Sample { at_s: t.duration_since(start).as_secs_f64(), unit, latency_ms, ok });
    }
    out
}

fn progress_line(p: &Progress, elapsed: f64, total: f64, warmup: f64) -> String {
    let frac = (elapsed / total).clamp(0.0, 1.0);
    let width = 30;
    let done = (frac * width as f64) as usize;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let rate = |i: usize| {
        let r = n(&p.requests[i]);
        if r == 0 { 0.0 } else { 100.0 * n(&p.errors[i]) as f64 / r as f64 }
    };
    let mut s = format!(
        "\r[{}{}] {:>3.0}% {:>4.1}/{total:.0} s{}  a {} req {:.1}% err | b {} req {:.1}% err",
        "#".repeat(done),
        " ".repeat(width - done),
        100.0 * frac,
        elapsed.min(total),
        if elapsed < warmup { " (warm-up)" } else { "          " },
        n(&p.requests[0]),
        rate(0),
        n(&p.requests[1]),
        rate(1)
    );
    if n(&p.unrouted) > 0 {
        let _ = write!(s, " | {} unrouted", n(&p.unrouted));
    }
    s
}

/// Runs the whole demo; returns when the report is written. Dropping the future stops it.
pub async fn run(o: DemoOptions, proxy_bin: PathBuf, sim_bin: PathBuf) -> anyhow::Result<()> {
    let base = o.listen_base;
    let scratch = Scratch(std::env::temp_dir().join(format!("weft-demo-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0).with_context(|| format!("creating {}", scratch.0.display()))?;
    let dir = scratch.0.clone();

    // 1. The control plane, in-process, a single node.
    let mut copts = crate::server::Options::new(1, addr(base, 0), addr(base, 1), dir.join("control"));
    copts.init = true;
    let control = crate::server::start(copts).await.context("starting the control plane")?;
    let (api, xds) = (control.api_addr, control.xds_addr);
    let mut procs = Procs::default();
    wait_until("the control node leads", Duration::from_secs(20), &mut procs, || async {
        match http(api, Method::GET, "/v1/status", &[], None).await {
            Ok((StatusCode::OK, _, b)) => serde_json::from_slice::<Value>(&b).is_ok_and(|v| v["leader"] == 1),
            _ => false,
        }
    })
    .await?;

    // 2. The mesh config: two clusters (endpoints come from the inbound sidecars'
    // registrations; mTLS to them, each expecting its variant's identity), the experiment,
    // and the service the client calls.
    for (v, ..) in VARIANTS {
        let tls = if o.plaintext { Value::Null } else { json!({"identities": [format!("spiffe://{DEMO_TRUST_DOMAIN}/service/ranker-{v}")]}) };
        put(api, &format!("/v1/clusters/ranker-{v}"), json!({"endpoints": [], "tls": tls})).await?;
    }
    let variants: Vec<Value> = VARIANTS
        .iter()
        .enumerate()
        .map(|(i, (v, ..))| json!({"name": v, "cluster": format!("ranker-{v}"), "weight": 50, "model_version": (i + 1).to_string()}))
        .collect();
    put(api, "/v1/experiments/ranker-ab", json!({"salt": "weft-demo", "unit_header": "x-user-id", "variants": variants})).await?;
    put(
        api,
        "/v1/services/ranker",
        json!({"hosts": ["ranker"], "listeners": ["out"], "routes": [{"name": "all", "experiment": "ranker-ab", "timeout": "10s"}]}),
    )
    .await?;

    // 3. The children: a model server and an inbound sidecar per variant, one outbound sidecar.
    let common = |cfg: &Path| -> Vec<String> {
        vec!["--config".into(), cfg.display().to_string(), "--xds".into(), xds.to_string(), "--log".into(), "warn".into()]
            .into_iter()
            .chain(["--drain-timeout", "1s", "--report-interval", "500ms"].map(String::from))
            .collect()
    };
    for (i, (v, mean, jitter, err)) in VARIANTS.into_iter().enumerate() {
        let i = i as u16;
        let model = addr(base, 2 + i);
        let args = [
            "--listen", &model.to_string(), "--model", "ranker", "--model-version", &(i + 1).to_string(),
            "--latency-ms", &mean.to_string(), "--jitter-ms", &jitter.to_string(), "--error-rate", &err.to_string(),
            "--max-concurrency", "64",
        ]
        .map(String::from);
        procs.spawn(&format!("model-{v}"), &sim_bin, &args, &dir)?;
        let cfg = dir.join(format!("inbound-{v}.yaml"));
        let id = identity(api, &dir, &format!("service/ranker-{v}"), o.plaintext).await?;
        std::fs::write(&cfg, inbound_yaml(v, addr(base, 4 + 2 * i), addr(base, 5 + 2 * i), model) + &id)?;
        let mut args = common(&cfg);
        args.extend(["--register-cluster".into(), format!("ranker-{v}"), "--register-variant".into(), v.into()]);
        procs.spawn(&format!("inbound-{v}"), &proxy_bin, &args, &dir)?;
    }
    let (outbound, out_admin) = (addr(base, 8), addr(base, 9));
    let cfg = dir.join("outbound.yaml");
    std::fs::write(
        &cfg,
        format!(
            "node: {{id: demo-client, team: ml-platform, project: ranking, job_type: inference}}\n\
             admin: {{address: \"{out_admin}\"}}\nlisteners: [{{name: out, address: \"{outbound}\"}}]\n{}",
            identity(api, &dir, "ns/demo/sa/client", o.plaintext).await?
        ),
    )?;
    procs.spawn("outbound", &proxy_bin, &common(&cfg), &dir)?;

    // 4. Ready when the outbound sidecar routes to both variants (forced with the override
    // header; a model error still proves the path).
    for v in ["a", "b"] {
        wait_until(&format!("the outbound sidecar routes to variant {v}"), Duration::from_secs(30), &mut procs, || async move {
            let r = http(outbound, Method::POST, "/v2/models/ranker/infer", &[("host", "ranker"), ("x-weft-variant", v)], None).await;
            matches!(r, Ok((_, h, _)) if h.get("x-weft-error").is_none() && h.get("x-weft-variant").is_some_and(|x| x == v))
        })
        .await?;
    }

    let mut out = std::io::stdout();
    let mut setup = String::new();
    let _ = writeln!(setup, "weft demo: an A/B experiment across a real mesh on 127.0.0.1 (ports {base}..={})", base + 9);
    let _ = writeln!(setup, "  control plane  weft-control, in-process: REST http://{api}, xDS {xds}");
    for (i, (v, mean, jitter, err)) in VARIANTS.into_iter().enumerate() {
        let i = i as u16;
        let _ = writeln!(
            setup,
            "  variant {v}      weft-model-sim {} (latency mean {mean} ms, sd {jitter} ms; {:.1}% errors) behind inbound weft-proxy {}",
            addr(base, 2 + i),
            100.0 * err,
            addr(base, 4 + 2 * i)
        );
    }
    let _ = writeln!(setup, "  client         outbound weft-proxy {outbound} (admin http://{out_admin}), Host: ranker");
    let _ = writeln!(setup, "  experiment     ranker-ab: a 50 / b 50, sticky by x-user-id ({} users)", o.users);
    let _ = writeln!(setup, "  security       {}", if o.plaintext {
        "sidecar to sidecar in plaintext (--plaintext)".to_string()
    } else {
        format!("sidecar to sidecar over mutual TLS, strict: each sidecar's SPIFFE ID (spiffe://{DEMO_TRUST_DOMAIN}/...) issued by weft-control's CA")
    });
    let _ = writeln!(
        setup,
        "driving {} s of traffic with {} concurrent clients; the first {} s are warm-up (excluded). Ctrl-C stops everything.",
        o.seconds, o.concurrency, o.warmup_s
    );
    let _ = writeln!(out, "{setup}");

    // 5. Traffic.
    let progress = Arc::new(Progress::default());
    let start = Instant::now();
    let end = start + Duration::from_secs(o.seconds);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7);
    let tasks: Vec<_> = (0..o.concurrency as u64)
        .map(|k| tokio::spawn(client(outbound, start, end, o.users, seed ^ (k.wrapping_mul(0x9E37_79B9)), progress.clone())))
        .collect();
    let mut err = std::io::stderr();
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        procs.check_alive()?;
        let _ = write!(err, "{}", progress_line(&progress, start.elapsed().as_secs_f64(), o.seconds as f64, o.warmup_s as f64));
        let _ = err.flush();
    }
    let mut samples: [Vec<Sample>; 2] = Default::default();
    for t in tasks {
        let [a, b] = t.await.context("a client task failed")?;
        samples[0].extend(a);
        samples[1].extend(b);
    }
    let _ = writeln!(err, "{}", progress_line(&progress, o.seconds as f64, o.seconds as f64, 0.0));
    let unrouted = progress.unrouted.load(Ordering::Relaxed);

    // 6. The report.
    let report = analyze("ranker-ab", ["a", "b"], &samples[0], &samples[1], o.warmup_s as f64);
    let _ = writeln!(out, "\n{}", render_text(&report));
    if unrouted > 0 {
        let _ = writeln!(out, "({unrouted} requests got no variant: connection errors or sidecar-local errors, not counted above)");
    }
    std::fs::write(&o.report, html::render(&report, setup.trim_end()))
        .with_context(|| format!("--report: writing {}", o.report.display()))?;
    // Absolute, so it can be opened from wherever the line is read (a relative path is
    // relative to where `weft demo` ran).
    let shown = std::path::absolute(&o.report).unwrap_or_else(|_| o.report.clone());
    let _ = writeln!(out, "HTML report with the latency chart: {}", shown.display());

    drop(procs);
    let _ = tokio::time::timeout(Duration::from_secs(10), control.shutdown()).await;
    drop(scratch);
    Ok(())
}

/// The whole command: checks, then the demo on a runtime, racing Ctrl-C and SIGTERM. Returns
/// the process exit code (0 ok, 1 failed, 2 bad flags, 130 interrupted).
pub fn main(o: DemoOptions) -> i32 {
    if let Err(e) = validate(&o) {
        eprintln!("weft demo: {e}");
        return 2;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft demo: cannot start a runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(async {
        if let Err(e) = check_ports(o.listen_base) {
            eprintln!("weft demo: {e}");
            return 1;
        }
        let (proxy, sim) = match locate_binaries(o.bin_dir.as_deref()) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("weft demo: {e}");
                return 1;
            }
        };
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("weft demo: cannot handle SIGTERM: {e}");
                return 1;
            }
        };
        tokio::select! {
            r = run(o, proxy, sim) => match r {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("\nweft demo: {e:#}");
                    1
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\nweft demo: interrupted; stopped every process it started");
                130
            }
            _ = term.recv() => {
                eprintln!("\nweft demo: terminated; stopped every process it started");
                143
            }
        }
    });
    // Stop the control plane's tasks before exiting.
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> DemoOptions {
        DemoOptions { seconds: 30, warmup_s: 5, concurrency: 16, listen_base: 17700, report: "r.html".into(), bin_dir: None, users: 100, plaintext: false }
    }

    #[test]
    fn demo_flags_are_range_checked() {
        assert!(validate(&opts()).is_ok());
        let e = validate(&DemoOptions { warmup_s: 30, ..opts() }).unwrap_err();
        assert!(e.starts_with("--warmup"), "{e}");
        let e = validate(&DemoOptions { listen_base: 65530, ..opts() }).unwrap_err();
        assert!(e.starts_with("--listen-base"), "{e}");
        let e = validate(&DemoOptions { concurrency: 0, ..opts() }).unwrap_err();
        assert!(e.starts_with("--concurrency"), "{e}");
    }

    #[tokio::test]
    async fn demo_names_a_busy_port() {
        // A free range below the ephemeral ports (whose ports outgoing connections hold).
        let base = (20_000..30_000).step_by(10).find(|b| check_ports(*b).is_ok()).expect("a free range of 10 ports");
        let port = base + 3;
        let _held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let e = check_ports(base).unwrap_err();
        assert!(e.contains(&format!("port {port} (for the model server b) is already in use")), "{e}");
        assert!(e.contains("--listen-base"), "{e}");
    }

    #[test]
    fn demo_says_how_to_build_missing_binaries() {
        let dir = std::env::temp_dir().join(format!("weft-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("release")).unwrap();
        let e = locate_binaries(Some(&dir.join("release"))).unwrap_err();
        assert!(e.contains("weft-proxy and weft-model-sim not found"), "{e}");
        assert!(e.contains("cargo build --release -p weft-proxy -p weft-control"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn user_ids_spread_evenly() {
        let mut s = 1;
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[(splitmix(&mut s) % 4) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (9_500..10_500).contains(c)), "{counts:?}");
    }
}

//! `weft-agent run --node NAME ...`: the node agent (see `weft_agent::node`);
//! `weft-agent stop --state-dir DIR`: stop every replica it left running;
//! `weft-agent hold --base FILE --socket PATH`: the node's weight holder for one base model;
//! `weft-agent make-base` / `make-delta`: write model files of a given shape.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use weft_agent::node::{self, inventory};
use weft_agent::weights::{make, model, share};

#[derive(Parser)]
#[command(version, about = "weft node agent: shares one copy of a base model's weights with every variant replica on the node")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

/// A base's shape (a delta is made for the base it adapts).
#[derive(clap::Args)]
struct Shape {
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 256)]
    d: usize,
    #[arg(long, default_value_t = 16)]
    classes: usize,
}

impl Shape {
    fn dims(&self) -> model::Dims {
        model::Dims { layers: self.layers, d: self.d, classes: self.classes }
    }
}

/// `weft-agent run`'s flags.
#[derive(clap::Args)]
struct Run {
    /// This node's name, as in the control plane's inventory (`nodes/<name>`) and placements.
    #[arg(long)]
    node: String,
    /// Control API URLs, comma-separated (inventory registration, node status reports).
    #[arg(long, value_delimiter = ',', required = true)]
    control: Vec<String>,
    /// Control nodes' xDS addresses `host:port`, comma-separated (placements; the replicas'
    /// sidecars get them too).
    #[arg(long, value_delimiter = ',', required = true)]
    xds: Vec<String>,
    /// Roots (PEM) the control nodes' xDS certificates are checked against (TLS xDS).
    #[arg(long)]
    xds_ca: Option<PathBuf>,
    /// Bearer token for the control API (an operator's, when it runs with --tokens); default:
    /// the WEFT_TOKEN environment variable.
    #[arg(long)]
    token: Option<String>,
    /// Where the agent keeps its records (adopted after a restart), logs and sockets.
    #[arg(long, default_value = "/var/lib/weft-agent")]
    state_dir: PathBuf,
    /// Declared inventory (YAML: cpu_milli, memory_mib, gpu_model, gpu_count,
    /// gpu_memory_bytes, ...), used when NVML finds no GPU or with --gpu-source declared.
    #[arg(long)]
    inventory: Option<PathBuf>,
    /// Where the GPU list comes from.
    #[arg(long, value_enum, default_value = "auto")]
    gpu_source: inventory::Source,
    /// Address replicas' sidecars listen on and register (how other nodes reach them).
    #[arg(long, default_value = "127.0.0.1")]
    advertise_ip: String,
    /// Ports for replicas' servers and sidecars, `LOW-HIGH` (half-open).
    #[arg(long, default_value = "20000-32000")]
    ports: String,
    /// How long a replica may take from start to healthy through its sidecar.
    #[arg(long, default_value = "120s")]
    start_timeout: String,
    /// How long a sidecar drains in-flight requests when its placement goes.
    #[arg(long, default_value = "10s")]
    drain_timeout: String,
    /// How often the node's status is reported even when nothing changed.
    #[arg(long, default_value = "10s")]
    report_interval: String,
    /// The sidecars' heartbeat and load-report period.
    #[arg(long, default_value = "1s")]
    sidecar_report_interval: String,
    /// weft-model-server binary (default: beside this one, else on PATH).
    #[arg(long)]
    model_server_bin: Option<String>,
    /// weft-proxy binary (default: beside this one, else on PATH).
    #[arg(long)]
    proxy_bin: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent: register the node, start what is placed on it, report.
    Run(Box<Run>),
    /// Stop every replica, sidecar and weight holder an agent left running (stop the agent
    /// first).
    Stop {
        #[arg(long, default_value = "/var/lib/weft-agent")]
        state_dir: PathBuf,
        /// How long each stage (sidecars, servers, holders) may drain before SIGKILL.
        #[arg(long, default_value = "10s")]
        grace: String,
    },
    /// Load a base once into a sealed memfd and hand it to replicas on a unix socket.
    Hold {
        /// The base's safetensors file.
        #[arg(long)]
        base: PathBuf,
        /// Unix socket replicas connect to (`weft-model-server --holder`).
        #[arg(long)]
        socket: PathBuf,
        /// Exit once no replica has used the base for this many seconds, after the first one
        /// came (0: hold until stopped).
        #[arg(long, default_value_t = 0)]
        exit_when_unused_s: u64,
    },
    /// Write a base of `layers` layers of `d`×`d` and a `classes`×`d` head.
    MakeBase {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        shape: Shape,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Write a delta for a base of the given shape: LoRA pairs of `rank` and/or a head.
    MakeDelta {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        shape: Shape,
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// Give the variant its own head too.
        #[arg(long)]
        head: bool,
        #[arg(long, default_value_t = 2)]
        seed: u64,
    },
}

fn main() {
    let result = match Args::parse().command {
        Command::Run(r) => run(*r),
        Command::Stop { state_dir, grace } => weft_proxy::duration::parse(&grace)
            .map_err(|e| format!("--grace: {e}"))
            .and_then(|g| node::stop_all(&state_dir, g))
            .map(|n| eprintln!("weft-agent: stopped {n} replica(s)")),
        Command::Hold { base, socket, exit_when_unused_s } => hold(&base, &socket, exit_when_unused_s),
        Command::MakeBase { out, shape, seed } => make::base(&out, shape.dims(), seed),
        Command::MakeDelta { out, shape, rank, head, seed } => make::delta(&out, shape.dims(), rank, head, seed),
    };
    if let Err(e) = result {
        eprintln!("weft-agent: {e}");
        std::process::exit(1);
    }
}

/// A binary beside this one, else the name (looked up on PATH).
fn sibling(name: &str) -> String {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join(name)))
        .filter(|p| p.is_file())
        .map_or(name.to_string(), |p| p.display().to_string())
}

fn run(r: Run) -> Result<(), String> {
    let dur = |flag: &str, v: &str| weft_proxy::duration::parse(v).map_err(|e| format!("--{flag}: {e}"));
    let ports = r
        .ports
        .split_once('-')
        .and_then(|(a, b)| Some(a.trim().parse::<u16>().ok()?..b.trim().parse::<u16>().ok()?))
        .filter(|p| p.len() >= 3)
        .ok_or_else(|| format!("--ports: {:?} is not LOW-HIGH with room for 3 ports", r.ports))?;
    if r.node.trim().is_empty() {
        return Err("--node: empty".into());
    }
    dur("sidecar-report-interval", &r.sidecar_report_interval)?;
    let opts = node::Options {
        node: r.node,
        control: r.control,
        xds: r.xds,
        xds_ca: r.xds_ca,
        token: r.token.or_else(|| std::env::var("WEFT_TOKEN").ok().filter(|t| !t.is_empty())),
        state_dir: r.state_dir,
        inventory: r.inventory,
        gpu_source: r.gpu_source,
        advertise_ip: r.advertise_ip,
        ports,
        start_timeout: dur("start-timeout", &r.start_timeout)?,
        drain_timeout: dur("drain-timeout", &r.drain_timeout)?,
        drain_timeout_text: r.drain_timeout,
        report_interval: dur("report-interval", &r.report_interval)?,
        sidecar_report_interval: r.sidecar_report_interval,
        agent_bin: std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?.display().to_string(),
        model_server_bin: r.model_server_bin.unwrap_or_else(|| sibling("weft-model-server")),
        proxy_bin: r.proxy_bin.unwrap_or_else(|| sibling("weft-proxy")),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(node::run(opts))
}

fn hold(base: &std::path::Path, socket: &std::path::Path, exit_when_unused_s: u64) -> Result<(), String> {
    let started = Instant::now();
    // Refuse a file that is not a base before anyone maps it.
    let checked = model::Base::new(model::read_packed(base)?)?;
    let (dims, packed) = (checked.dims, checked.packed);
    let name = base.file_stem().map_or("weft-base".into(), |s| s.to_string_lossy().into_owned());
    let published = share::publish(packed, &name)?;
    // A socket left by a holder that died is in the way; a live holder's is not ours to take.
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(format!("{}: another weight holder is serving there", socket.display()));
    }
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    eprintln!(
        "weft-agent hold: {} ({} layers of {}x{}, {:.1} MiB) shared on {} after {:.0} ms",
        base.display(),
        dims.layers,
        dims.d,
        dims.d,
        published.packed.manifest.floats as f64 * 4.0 / (1 << 20) as f64,
        socket.display(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let users = Arc::new(AtomicUsize::new(0));
    if exit_when_unused_s > 0 {
        let users = users.clone();
        std::thread::spawn(move || {
            let (mut seen, mut idle_since) = (false, None);
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let n = users.load(Ordering::SeqCst);
                seen |= n > 0;
                idle_since = if n == 0 { idle_since.or(Some(Instant::now())) } else { None };
                if seen && idle_since.is_some_and(|t| t.elapsed() >= Duration::from_secs(exit_when_unused_s)) {
                    eprintln!("weft-agent hold: no replica has used the base for {exit_when_unused_s} s; exiting");
                    std::process::exit(0);
                }
            }
        });
    }
    share::serve(listener, &published, users);
    Ok(())
}

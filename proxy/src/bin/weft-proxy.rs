//! `weft-proxy --config proxy.yaml [--xds host:port,...]`: run the sidecar.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(version, about = "weft sidecar proxy: A/B routing, shadowing, retries, circuit breaking, telemetry")]
#[command(group(clap::ArgGroup::new("bootstrap").required(true)))]
struct Args {
    /// YAML bootstrap (see examples/proxy.yaml). Reloaded on SIGHUP and when it changes.
    #[arg(long, short, group = "bootstrap")]
    config: Option<PathBuf>,
    /// Read the YAML bootstrap from this environment variable instead of a file (how the
    /// Kubernetes injector hands it over: no ConfigMap per pod). Not reloaded.
    #[arg(long, value_name = "VAR", group = "bootstrap")]
    config_env: Option<String>,
    /// Worker threads, each with its own runtime and sockets (SO_REUSEPORT).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// How often to check the config file for changes, e.g. "1s"; "0" turns polling off.
    #[arg(long, default_value = "1s")]
    watch_interval: String,
    /// On SIGTERM/SIGINT, how long to wait for in-flight requests before exiting.
    #[arg(long, default_value = "30s")]
    drain_timeout: String,
    /// xDS control nodes, comma-separated (`host:port`); the first reachable one is used. With
    /// it, services, experiments, clusters and endpoints come from the control plane, merged
    /// over the file's own (a pushed resource replaces a static one of the same name); the
    /// file also gives node identity, admin, listeners and telemetry (it is not hot-reloaded).
    #[arg(long, value_delimiter = ',')]
    xds: Vec<String>,
    /// Roots (PEM) to check the control nodes' TLS certificates against when they run
    /// --tls-from-ca or --tls-cert (the mesh root, or the CA of those certificates); with it,
    /// --xds addresses are TLS. An https:// address without it is checked against the system's.
    #[arg(long)]
    xds_ca: Option<PathBuf>,
    /// Node id sent to the control plane (default: the file's `node.id`).
    #[arg(long, default_value = "")]
    node_id: String,
    /// File keeping the last good config pushed over xDS, served after a restart while the
    /// control plane is unreachable.
    #[arg(long)]
    xds_cache: Option<PathBuf>,
    /// Register the model server this sidecar fronts as an endpoint of this cluster (needs
    /// --xds), so other sidecars route to it; heartbeats decide whether it is healthy.
    #[arg(long)]
    register_cluster: Option<String>,
    /// Address other sidecars reach it at (default: the first inbound listener's address).
    #[arg(long)]
    register_address: Option<String>,
    /// The experiment variant it serves.
    #[arg(long, default_value = "")]
    register_variant: String,
    /// A label on the registered endpoint, `key=value` (repeatable), e.g. `model=ranker-v3`;
    /// beside the node's team/project/run_id/job_type.
    #[arg(long, value_name = "KEY=VALUE")]
    register_label: Vec<String>,
    /// Heartbeat and load-report period, e.g. "1s".
    #[arg(long, default_value = "1s")]
    report_interval: String,
    /// Log filter (RUST_LOG syntax), e.g. "info" or "weft_proxy=debug".
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() {
    let args = Args::parse();
    weft_proxy::logging::init(tracing_subscriber::EnvFilter::try_new(&args.log).unwrap_or_else(|_| "info".into()));
    if let Err(e) = run(args) {
        eprintln!("weft-proxy: {e}");
        std::process::exit(1);
    }
}

/// What to register: the given address or the first inbound listener's, labelled with the
/// node's workload identity.
fn registration(
    cfg: &weft_proxy::Config,
    cluster: &str,
    address: Option<&str>,
    variant: &str,
    extra: &[String],
) -> Result<weft_xds::resources::v1::Registration, String> {
    let address = match address {
        Some(a) => a.to_owned(),
        None => cfg
            .listeners
            .iter()
            .find(|l| l.direction == weft_proxy::config::Direction::Inbound)
            .map(|l| l.address.clone())
            .ok_or("--register-cluster: no --register-address and no inbound listener to take it from")?,
    };
    if address.ends_with(":0") {
        return Err(format!("--register-address: {address:?} has no fixed port; other sidecars could not reach it"));
    }
    let n = &cfg.node;
    let mut labels: std::collections::BTreeMap<String, String> =
        [("team", &n.team), ("project", &n.project), ("run_id", &n.run_id), ("job_type", &n.job_type)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
    for kv in extra {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => labels.insert(k.to_string(), v.to_string()),
            _ => return Err(format!("--register-label: {kv:?} is not KEY=VALUE")),
        };
    }
    Ok(weft_xds::resources::v1::Registration { cluster: cluster.to_owned(), address, variant: variant.to_owned(), labels })
}

fn run(args: Args) -> Result<(), String> {
    let dur = |flag: &str, v: &str| weft_proxy::duration::parse(v).map_err(|e| format!("--{flag}: {e}"));
    let watch = dur("watch-interval", &args.watch_interval)?;
    let grace = dur("drain-timeout", &args.drain_timeout)?;
    if args.workers == 0 || args.workers > 256 {
        return Err(format!("--workers: {} is not in 1..=256", args.workers));
    }
    // The bootstrap, and what it is called in errors: the file, or the environment variable.
    let (source, text) = match (&args.config, &args.config_env) {
        (Some(p), _) => {
            let source = p.display().to_string();
            let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read {source}: {e}"))?;
            (source, text)
        }
        (None, Some(var)) => {
            let source = format!("--config-env {var}");
            let text = std::env::var(var).map_err(|e| format!("{source}: {e}"))?;
            (source, text)
        }
        (None, None) => return Err("--config FILE or --config-env VAR is required".into()),
    };
    let cfg = weft_proxy::Config::from_yaml(&text).map_err(|e| format!("{source}: {e}"))?;
    let report_interval = dur("report-interval", &args.report_interval)?;
    if report_interval.is_zero() {
        return Err("--report-interval: must be above zero".into());
    }
    let registration = match &args.register_cluster {
        None => None,
        Some(_) if args.xds.is_empty() => return Err("--register-cluster: only meaningful with --xds".into()),
        Some(cluster) => Some(registration(&cfg, cluster, args.register_address.as_deref(), &args.register_variant, &args.register_label)?),
    };
    let tls = match &args.xds_ca {
        Some(_) if args.xds.is_empty() => return Err("--xds-ca: only meaningful with --xds".into()),
        Some(p) => weft_proxy::xds::dial::ControlTls::from_ca_file(p)?,
        None => weft_proxy::xds::dial::ControlTls::default(),
    };
    let xds = (!args.xds.is_empty()).then(|| weft_proxy::xds::XdsOptions {
        node_id: args.node_id.clone(),
        cache_path: args.xds_cache.clone(),
        registration,
        report_interval,
        tls: tls.clone(),
        ..weft_proxy::xds::XdsOptions::new(args.xds.clone())
    });
    if xds.is_none() && args.xds_cache.is_some() {
        return Err("--xds-cache: only meaningful with --xds".into());
    }
    let opts = weft_proxy::Options {
        workers: args.workers,
        // With xDS the control plane owns the dynamic config; reloading the bootstrap would
        // swap the pushed services and clusters out.
        config_path: if xds.is_some() { None } else { args.config.clone() },
        // A zero interval would spin; "0" means SIGHUP only.
        watch_interval: if watch.is_zero() { Duration::from_secs(86400 * 365) } else { watch },
        signals: true,
        xds,
    };
    let proxy = weft_proxy::Proxy::start(cfg, opts).map_err(|e| format!("{source}: {e}"))?;
    for (l, a) in proxy.shared.snapshot.load().config.listeners.iter().zip(&proxy.listener_addrs) {
        tracing::info!(listener = %l.name, address = %a, direction = ?l.direction, "listening");
    }
    tracing::info!(address = %proxy.admin_addr, "admin API");
    wait_for_stop();
    if let Some(t) = proxy.shared.training.clone() {
        // A training worker's trainer checkpoints before its node goes (preemption notice).
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(t.drain("SIGTERM"));
    }
    tracing::info!("stopping: draining in-flight requests");
    let shared = proxy.shared.clone();
    proxy.shutdown(grace);
    // The drained requests' spans, still queued for OTLP export, go out before the exit.
    shared.telemetry.shutdown_otlp();
    Ok(())
}

/// Block until SIGTERM or SIGINT.
fn wait_for_stop() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(weft_proxy::signals::stop_requested());
}

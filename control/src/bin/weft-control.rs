//! `weft-control`: one node of weft's control plane. See `docs/control-api.md` and the README
//! for the flags; `--help` lists them with their defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use weft_control::api::auth::Tokens;
use weft_control::server::{self, Options};

#[derive(Debug, Parser)]
#[command(name = "weft-control", version, about = "weft control-plane node: Raft config store, REST API, xDS server")]
struct Args {
    /// Node id (≥ 1), unique in the cluster and stable across restarts.
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// REST API and Raft RPC listener.
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// xDS (gRPC) listener for sidecars.
    #[arg(long, default_value = "127.0.0.1:7701")]
    xds_listen: SocketAddr,
    /// API address peers use to reach this node (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// xDS address sidecars are told about (default: --xds-listen).
    #[arg(long)]
    xds_advertise: Option<String>,
    /// Directory of the node's data files (weft-control.log.redb: Raft log and vote;
    /// weft-control.redb: state machine and snapshots).
    #[arg(long, default_value = "weft-data")]
    data_dir: PathBuf,
    /// Bootstrap a new single-member cluster (ignored when the data dir already holds one).
    #[arg(long)]
    init: bool,
    /// Join the cluster of this member (host:port of its API), as a voter.
    #[arg(long, conflicts_with = "init")]
    join: Option<String>,
    /// On Kubernetes: this StatefulSet pod's index (the downward API's
    /// `apps.kubernetes.io/pod-index` label). The node id becomes index + 1; pod 0 bootstraps
    /// the cluster (as --init) and ignores --join, the others --join (pod 0's API address).
    #[arg(long, conflicts_with_all = ["init", "id"])]
    pod_index: Option<u64>,
    /// YAML file of bearer tokens with roles; absent = no authentication (loopback demos only).
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Take a snapshot and compact the log every this many applied entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// How many revisions back resource history (`weftctl history`, `rollback`) reaches; older
    /// rows are compacted, except each resource's current revision. 0 keeps everything. Every
    /// member needs the same value: `--join` is refused when it differs from the leader's, and a
    /// restart with another value logs a warning naming both.
    #[arg(long, default_value_t = weft_control::store::DEFAULT_HISTORY_REVISIONS)]
    history_revisions: u64,
    /// Commits within this many milliseconds become one xDS push.
    #[arg(long, default_value_t = 10)]
    xds_debounce_ms: u64,
    /// Seconds between autoscaler decisions (the leader decides for every `autoscalers`
    /// resource; see `weftctl autoscale status`).
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    autoscale_interval_s: f64,
    /// Seconds between the rollout engine's readings (the leader judges every `rollouts`
    /// resource; see `weftctl experiment status`).
    #[arg(long, default_value_t = 5.0, value_parser = positive_seconds)]
    rollout_interval_s: f64,
    /// Export trace spans of every API write (write → Raft commit → xDS push → sidecar ACK)
    /// to this OTLP/gRPC collector, e.g. http://127.0.0.1:4317 (default: no export).
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Share of new traces exported (a caller's `traceparent` sampled flag is followed).
    #[arg(long, default_value_t = 1.0)]
    otlp_sample_ratio: f64,
    /// Address of the Listener served to stock Envoy clients of the xDS port (LDS/RDS/CDS/EDS
    /// generated from weft's resources); it binds in Envoy's own network namespace.
    #[arg(long, default_value = weft_control::envoy::DEFAULT_LISTENER_ADDRESS)]
    envoy_listener: SocketAddr,
    /// The mesh's SPIFFE trust domain: workload certificates are for
    /// spiffe://TRUST_DOMAIN/ns/NS/sa/NAME or spiffe://TRUST_DOMAIN/service/NAME.
    #[arg(long, default_value = weft_control::server::DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
    /// Lifetime of the workload certificates the mesh CA signs ("24h", "30s"); sidecars renew
    /// two thirds through.
    #[arg(long, default_value = "24h", value_parser = weft_proxy::duration::parse)]
    leaf_lifetime: Duration,
    /// Your own CA certificate (PEM) to sign workload certificates with, instead of the root
    /// the first leader makes and keeps in the Raft store; give it (and --ca-key) to every node.
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    /// The --ca-cert's private key (PEM, PKCS#8).
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// TLS on the API/Raft and xDS ports: this node's certificate chain (PEM), for the names
    /// (DNS or IP SANs) peers, sidecars and weftctl reach it by. Reread when the file changes.
    #[arg(long, requires = "tls_key", conflicts_with = "tls_from_ca")]
    tls_cert: Option<PathBuf>,
    /// The --tls-cert's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// TLS on the API/Raft and xDS ports with a certificate this node issues itself from the
    /// --ca-cert/--ca-key mesh CA (for --tls-name, the hosts of --listen/--advertise/--xds-*,
    /// localhost and 127.0.0.1), renewed before it expires. Clients then trust the mesh root.
    #[arg(long, requires = "ca_cert")]
    tls_from_ca: bool,
    /// Extra names (DNS or IP) for the --tls-from-ca certificate, comma-separated.
    #[arg(long, value_delimiter = ',', requires = "tls_from_ca")]
    tls_name: Vec<String>,
    /// Roots (PEM) the other control nodes' certificates are checked against when this node
    /// calls them (Raft, forwarding); default: --ca-cert.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Roots (PEM) of client certificates: with it the API/Raft port requires one (peers present
    /// their serving certificate, weftctl its --cert), and the xDS port checks one when offered.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// Log filter (RUST_LOG syntax).
    /// (openraft's per-retry replication errors are off by default: a down peer is logged once
    /// when it goes and once when it returns.)
    #[arg(long, default_value = "info,openraft=warn,openraft::replication=off")]
    log: String,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=3600.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is not between 0.1 and 3600 seconds")),
        Err(e) => Err(format!("{s:?} is not a number of seconds: {e}")),
    }
}

/// `--tls-*` into settings (files read now, so a missing one is a start-up error naming it).
fn tls_settings(args: &Args) -> anyhow::Result<Option<weft_control::tls::Settings>> {
    use weft_control::tls::{CertSource, ISSUED_LIFETIME, Settings};
    let read = |flag: &str, p: &PathBuf| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", p.display()));
    let source = match (&args.tls_cert, &args.tls_key, args.tls_from_ca) {
        (Some(cert), Some(key), _) => CertSource::Files { cert: cert.clone(), key: key.clone() },
        (_, _, true) => {
            let (Some(cert), Some(key)) = (&args.ca_cert, &args.ca_key) else { anyhow::bail!("--tls-from-ca: needs --ca-cert and --ca-key") };
            let ca = weft_control::ca::MeshCa::from_pem(&args.trust_domain, &read("--ca-cert", cert)?, &read("--ca-key", key)?)
                .map_err(|e| anyhow::anyhow!("--ca-cert/--ca-key: {e}"))?;
            let mut names = args.tls_name.clone();
            let hosts = [args.advertise.clone(), args.xds_advertise.clone(), Some(args.listen.to_string()), Some(args.xds_listen.to_string())];
            for addr in hosts.into_iter().flatten() {
                let host = weft_control::tls::dial::server_name(&addr).map_err(|e| anyhow::anyhow!("--tls-from-ca: {addr}: {e}"))?;
                let host = host.to_str().into_owned();
                // A wildcard bind address is nobody's name.
                if host != "0.0.0.0" && host != "::" {
                    names.push(host);
                }
            }
            names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
            names.sort();
            names.dedup();
            CertSource::Issued { ca: std::sync::Arc::new(ca), names, lifetime: ISSUED_LIFETIME }
        }
        _ if args.tls_ca.is_some() || args.tls_client_ca.is_some() => {
            anyhow::bail!("--tls-ca/--tls-client-ca: give the node's own certificate too (--tls-cert and --tls-key, or --tls-from-ca)")
        }
        _ => return Ok(None),
    };
    let peer_roots_pem = match (&args.tls_ca, &args.ca_cert) {
        (Some(p), _) => read("--tls-ca", p)?,
        (None, Some(p)) => read("--ca-cert", p)?,
        (None, None) => anyhow::bail!("--tls-cert: give --tls-ca, the CA that signed the control nodes' certificates (or --ca-cert)"),
    };
    let client_roots_pem = args.tls_client_ca.as_ref().map(|p| read("--tls-client-ca", p)).transpose()?;
    Ok(Some(Settings { source, peer_roots_pem, client_roots_pem }))
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    weft_proxy::logging::init(tracing_subscriber::EnvFilter::new(&args.log));
    let tokens = match &args.tokens {
        Some(p) => Tokens::load(p).map_err(|e| anyhow::anyhow!("--tokens {e}"))?,
        None => {
            tracing::warn!("no --tokens file: the API accepts every request without authentication");
            Tokens::default()
        }
    };
    let tls = tls_settings(&args)?;
    if let Some(i) = args.pod_index {
        args.id = i + 1;
        if i == 0 {
            args.init = true;
            args.join = None;
        } else if args.join.is_none() {
            anyhow::bail!("--pod-index {i}: every pod after the first needs --join (pod 0's API address)");
        }
    }
    let mut opts = Options::new(args.id, args.listen, args.xds_listen, args.data_dir);
    opts.advertise = args.advertise;
    opts.xds_advertise = args.xds_advertise;
    opts.init = args.init;
    opts.join = args.join;
    opts.tokens = tokens;
    opts.snapshot_every = args.snapshot_every;
    opts.history_revisions = args.history_revisions;
    opts.xds_debounce = Duration::from_millis(args.xds_debounce_ms);
    opts.autoscale_interval = Duration::from_secs_f64(args.autoscale_interval_s);
    opts.rollout_interval = Duration::from_secs_f64(args.rollout_interval_s);
    opts.otlp_endpoint = args.otlp_endpoint.clone();
    opts.otlp_sample_ratio = args.otlp_sample_ratio;
    opts.envoy_listener = args.envoy_listener;
    opts.trust_domain = args.trust_domain.clone();
    opts.leaf_lifetime = args.leaf_lifetime;
    opts.ca_files = args.ca_cert.clone().zip(args.ca_key.clone());
    opts.tls = tls;
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async move {
        let running = server::start(opts).await?;
        weft_proxy::signals::stop_requested().await;
        tracing::info!("shutting down");
        running.shutdown().await
    })
}


//! A running control node: the store, Raft over HTTP, the REST API, the xDS server, and the
//! publisher that feeds committed config to the xDS cache. `weft-control` (the binary) parses
//! flags into [`Options`] and calls [`run`]; tests and the demo call it in-process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;

use crate::api::{self, AppState, auth::Tokens, forward::Peers};
use crate::reports::Tracker;
use crate::store::{Member, Node, NodeId, Store, raft_config};
use crate::transport::HttpNetwork;

/// The trust domain when `--trust-domain` is not given.
pub const DEFAULT_TRUST_DOMAIN: &str = "weft.local";

/// Everything a node needs to start.
#[derive(Debug, Clone)]
pub struct Options {
    pub id: NodeId,
    /// REST API + Raft RPCs.
    pub listen: SocketAddr,
    /// xDS (gRPC).
    pub xds_listen: SocketAddr,
    /// Addresses peers and sidecars use to reach this node (default: the listen addresses).
    pub advertise: Option<String>,
    pub xds_advertise: Option<String>,
    pub data_dir: PathBuf,
    /// Bootstrap a new cluster with this node as its only member (no-op if the data dir
    /// already holds one).
    pub init: bool,
    /// A member to ask to add this node (`host:port` or `http://host:port`).
    pub join: Option<String>,
    pub tokens: Tokens,
    /// Snapshot (and compact the log) every this many applied entries.
    pub snapshot_every: u64,
    /// How many revisions back resource history reaches (0 = all).
    pub history_revisions: u64,
    /// Window in which commits are coalesced into one xDS push.
    pub xds_debounce: Duration,
    /// Between the autoscaler's decisions (on the leader).
    pub autoscale_interval: Duration,
    /// Between the rollout engine's readings (on the leader).
    pub rollout_interval: Duration,
    /// OTLP/gRPC collector for the control plane's trace spans (`None` = no export).
    pub otlp_endpoint: Option<String>,
    pub otlp_sample_ratio: f64,
    /// Where the Listener served to stock Envoy clients binds (in Envoy's network namespace).
    pub envoy_listener: SocketAddr,
    /// The mesh's SPIFFE trust domain (workload IDs are `spiffe://TRUST_DOMAIN/...`).
    pub trust_domain: String,
    /// Lifetime of the workload certificates the mesh CA signs (sidecars renew at 2/3).
    pub leaf_lifetime: Duration,
    /// The user's own CA (certificate, key: PEM files); `None` = the root a leader makes.
    pub ca_files: Option<(PathBuf, PathBuf)>,
    /// TLS on the API/Raft and xDS ports (`--tls-*`); `None` = plaintext.
    pub tls: Option<crate::tls::Settings>,
}

impl Options {
    pub fn new(id: NodeId, listen: SocketAddr, xds_listen: SocketAddr, data_dir: PathBuf) -> Options {
        Options {
            id,
            listen,
            xds_listen,
            advertise: None,
            xds_advertise: None,
            data_dir,
            init: false,
            join: None,
            tokens: Tokens::default(),
            snapshot_every: 10_000,
            history_revisions: crate::store::DEFAULT_HISTORY_REVISIONS,
            xds_debounce: Duration::from_millis(10),
            autoscale_interval: crate::scaling::DEFAULT_INTERVAL,
            rollout_interval: crate::rollouts::DEFAULT_INTERVAL,
            otlp_endpoint: None,
            otlp_sample_ratio: 1.0,
            envoy_listener: crate::envoy::DEFAULT_LISTENER_ADDRESS.parse().expect("a socket address"),
            trust_domain: DEFAULT_TRUST_DOMAIN.into(),
            leaf_lifetime: crate::ca::DEFAULT_LEAF_LIFETIME,
            ca_files: None,
            tls: None,
        }
    }
}

/// A started node; dropping it does not stop it, [`Running::shutdown`] does.
pub struct Running {
    pub node: Arc<Node>,
    pub api_addr: SocketAddr,
    pub xds_addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops serving, shuts Raft down and releases the data file.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        match Arc::try_unwrap(self.node) {
            Ok(node) => node.shutdown().await.context("raft shutdown")?,
            Err(node) => {
                node.raft().shutdown().await.context("raft shutdown")?;
            }
        }
        Ok(())
    }
}

/// A listener with a deep accept queue: after a control node restarts, thousands of sidecars
/// reconnect at once, and a short queue makes the kernel drop SYNs (each costing a client a
/// 1 s retransmit).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

fn strip_scheme(addr: &str) -> &str {
    addr.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/')
}

/// Starts a node and returns once it serves (not necessarily once it has a leader).
pub async fn start(opts: Options) -> anyhow::Result<Running> {
    if opts.id == 0 {
        bail!("--id: node ids start at 1");
    }
    std::fs::create_dir_all(&opts.data_dir).with_context(|| format!("--data-dir {}", opts.data_dir.display()))?;
    let api_listener = listen(opts.listen).with_context(|| format!("--listen {}", opts.listen))?;
    let xds_listener = listen(opts.xds_listen).with_context(|| format!("--xds-listen {}", opts.xds_listen))?;
    let api_addr = api_listener.local_addr()?;
    let xds_addr = xds_listener.local_addr()?;
    let me = Member {
        addr: opts.advertise.clone().unwrap_or_else(|| api_addr.to_string()),
        xds_addr: opts.xds_advertise.clone().unwrap_or_else(|| xds_addr.to_string()),
    };

    let store = Store::open(opts.data_dir.join("weft-control.redb")).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(before) = store.keep_history(opts.history_revisions).map_err(|e| anyhow::anyhow!("{e}"))? {
        tracing::warn!(
            before,
            now = opts.history_revisions,
            "--history-revisions changed since this node last ran: lowering it compacts history this \
             node kept until now at its next compaction, raising it cannot bring compacted rows back, \
             and the other members keep their own value (GET /v1/status on each shows it)"
        );
    }
    let config = raft_config(opts.snapshot_every, 1000).map_err(|e| anyhow::anyhow!("{e}"))?;
    let tls = opts.tls.as_ref().map(crate::tls::ControlTls::new).transpose().map_err(|e| anyhow::anyhow!("{e}"))?.map(Arc::new);
    let dialer = tls.as_ref().map(|t| t.dialer.clone()).unwrap_or_default();
    let network = HttpNetwork::new(opts.tokens.admin_token(), dialer.clone());
    let node = Arc::new(Node::start(opts.id, &store, config, network).await.map_err(|e| anyhow::anyhow!("{e}"))?);
    if opts.init && node.initialize(BTreeMap::from([(opts.id, me.clone())])).await.map_err(|e| anyhow::anyhow!("{e}"))? {
        tracing::info!(id = opts.id, "initialized a new cluster");
    }

    let cache = weft_xds::Cache::new(opts.xds_debounce);
    let spans = Arc::new(match &opts.otlp_endpoint {
        Some(e) => crate::spans::Spans::otlp(e, opts.id, opts.otlp_sample_ratio).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => crate::spans::Spans::off(),
    });
    cache.observe(spans.clone());
    let peers = Arc::new(Peers::new(dialer.clone()));
    let reports = Arc::new(Tracker::new(node.clone(), api_addr.to_string(), opts.tokens.admin_token(), peers.clone()));
    let ca_files = opts.ca_files.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let identity = Arc::new(crate::identity::Authority::new(node.clone(), &opts.trust_domain, opts.leaf_lifetime, ca_files)?);
    let state = Arc::new(AppState {
        identity: identity.clone(),
        node: node.clone(),
        cache: cache.clone(),
        tokens: opts.tokens.clone(),
        peers,
        reports: reports.clone(),
        schedule: tokio::sync::Mutex::new(()),
        autoscale: crate::scaling::Autoscale::new(opts.autoscale_interval),
        rollouts: crate::rollouts::Engine::new(opts.rollout_interval),
        training: crate::training::Training::default(),
        spans,
        requests: crate::metrics::Requests::default(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = vec![
        tokio::spawn(reports.clone().run(stopped.clone())),
        tokio::spawn(match tls.clone() {
            Some(t) => futures_util::future::Either::Left(t.keep_fresh(stopped.clone())),
            None => futures_util::future::Either::Right(std::future::ready(())),
        }),
        tokio::spawn(crate::scaling::run(state.clone(), stopped.clone())),
        tokio::spawn(crate::rollouts::run(state.clone(), stopped.clone())),
        tokio::spawn(crate::training::run(state.clone(), stopped.clone())),
        // The first leader makes the mesh CA's root (unless the user brought one).
        tokio::spawn(crate::leader_loop::every(state.clone(), Duration::from_secs(1), stopped.clone(), "mesh CA", |_| {}, |st| async move {
            st.identity.ensure_root().await
        })),
    ];

    let app = api::router(state.clone());
    let (api_tls, xds_tls) = (tls.as_ref().map(|t| t.api.clone()), tls.as_ref().map(|t| t.xds.clone()));
    let mut s = stopped.clone();
    tasks.push(tokio::spawn(async move {
        let shutdown = async move {
            let _ = s.wait_for(|v| *v).await;
        };
        let served = match api_tls {
            Some(cfg) => match crate::tls::listen::accept(api_listener, cfg, "api") {
                Ok(l) => axum::serve(l, app).with_graceful_shutdown(shutdown).await,
                Err(e) => Err(e),
            },
            None => {
                // No Nagle delay on responses (Raft RPC answers are on this listener too).
                let l = axum::serve::ListenerExt::tap_io(api_listener, |tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                axum::serve(l, app).with_graceful_shutdown(shutdown).await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "API server failed");
        }
    }));

    let ads = weft_xds::AdsServer::new(cache.clone()).into_service();
    let report_service = reports.service();
    let identity_service = weft_xds::resources::v1::identity_server::IdentityServer::new(crate::identity::Service(identity));
    // grpc.health.v1 beside ADS, so load balancers and `grpc_health_probe` can check the xDS
    // port itself: "" and the ADS service are SERVING while the port serves (it answers from
    // the cache even without a leader), NOT_SERVING once shutdown begins.
    let (health, health_service) = tonic_health::server::health_reporter();
    const ADS: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
    health.set_service_status("", tonic_health::ServingStatus::Serving).await;
    health.set_service_status(ADS, tonic_health::ServingStatus::Serving).await;
    // gRPC reflection (grpcurl list / describe): ADS, weft's report stream, health, itself.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(weft_xds::descriptors::ADS)
        .register_encoded_file_descriptor_set(weft_xds::descriptors::WEFT_V1)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| anyhow::anyhow!("gRPC reflection: {e}"))?;
    let mut s = stopped.clone();
    tasks.push(tokio::spawn(async move {
        let shutdown = async move {
            let _ = s.wait_for(|v| *v).await;
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
            health.set_service_status(ADS, tonic_health::ServingStatus::NotServing).await;
        };
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(ads)
            .add_service(report_service)
            .add_service(identity_service);
        let served = match xds_tls {
            Some(cfg) => match crate::tls::listen::accept(xds_listener, cfg, "xds") {
                Ok(l) => server.serve_with_incoming_shutdown(l.into_incoming(), shutdown).await,
                Err(e) => return tracing::error!(error = %e, "xDS server failed"),
            },
            None => {
                let incoming = tonic::transport::server::TcpIncoming::from(xds_listener).with_nodelay(Some(true));
                server.serve_with_incoming_shutdown(incoming, shutdown).await
            }
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "xDS server failed");
        }
    }));

    let (n, c, envoy_listener) = (node.clone(), cache.clone(), opts.envoy_listener);
    let mut s = stopped.clone();
    tasks.push(tokio::spawn(async move {
        tokio::select! {
            _ = crate::publish::run(n, c, envoy_listener) => {}
            _ = s.wait_for(|v| *v) => {}
        }
    }));

    if let Some(join) = &opts.join {
        join_cluster(&node, strip_scheme(join), opts.id, &me, opts.history_revisions, opts.tokens.admin_token(), dialer).await?;
    }
    tracing::info!(id = opts.id, api = %api_addr, xds = %xds_addr, "control node serving");
    Ok(Running { node, api_addr, xds_addr, stop, tasks })
}

/// Asks `via` to add this node as a voter; retried while the cluster elects a leader. A node
/// that already is a member (a restart) skips this.
async fn join_cluster(
    node: &Node,
    via: &str,
    id: NodeId,
    me: &Member,
    history_revisions: u64,
    token: Option<String>,
    dialer: crate::tls::dial::Dialer,
) -> anyhow::Result<()> {
    if node.members().members.iter().any(|m| m.id == id) {
        return Ok(());
    }
    let mut body =
        serde_json::json!({ "id": id, "addr": me.addr, "xds_addr": me.xds_addr, "voter": true, "history_revisions": history_revisions });
    let peers = Peers::new(dialer);
    let mut req = http::Request::post("/v1/members").header(http::header::CONTENT_TYPE, "application/json");
    if let Some(t) = &token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let (parts, _) = req.body(())?.into_parts();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let outcome = peers.forward(via, None, &parts, body.to_string().into()).await;
        match outcome {
            Ok(r) if r.status().is_success() => {
                tracing::info!(via, "joined the cluster");
                return Ok(());
            }
            Ok(r) if r.status().is_client_error() => {
                let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap_or_default();
                let why = String::from_utf8_lossy(&bytes);
                // A leader older than the history check rejects the field it does not know;
                // join it without the check rather than not at all (a rolling upgrade).
                if why.contains("unknown field `history_revisions`") && body.as_object_mut().and_then(|b| b.remove("history_revisions")).is_some() {
                    tracing::warn!(via, "the leader predates the --history-revisions check; joining unchecked");
                    continue;
                }
                bail!("--join {via}: refused: {why}");
            }
            other => {
                let why = match other {
                    Ok(r) => format!("HTTP {}", r.status()),
                    Err(e) => e,
                };
                if tokio::time::Instant::now() >= deadline {
                    bail!("--join {via}: gave up after 60 s: {why}");
                }
                tracing::info!(via, %why, "join not accepted yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

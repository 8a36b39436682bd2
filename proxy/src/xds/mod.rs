//! The sidecar's xDS client (`--xds addr,...`): the control plane pushes services, experiments,
//! clusters and endpoints; the bootstrap file keeps node identity, admin and listeners.
//!
//! - [`convert`]: weft.v1 resources → config types, and how they overlay the bootstrap (pure);
//! - [`encode`]: config types → weft.v1 resources, for the control plane (pure);
//! - [`state`]: which pushes to apply together, ACK or NACK (pure, validator passed in);
//! - [`disk`]: the last good pushed config on disk, served after a restart;
//! - [`client`]: the ADS stream IO loop: failover between control nodes, backoff;
//! - [`report`]: registration, heartbeats and load reports on the same connection;
//! - [`dial`]: the channel to a control node, TLS when it runs `--tls-*` (`--xds-ca`);
//! - [`issue`]: the sidecar's certificate from the mesh CA (`identity.token_file`), renewed.
//!
//! Every push goes through `Shared::apply`, the same validate-then-swap path as a file reload,
//! so a push that would not load from a file is NACKed and the old config keeps serving.

pub mod client;
pub mod convert;
pub mod dial;
pub mod disk;
pub mod encode;
pub mod issue;
pub mod report;
pub mod state;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::Shared;
use crate::config::Config;

/// How the sidecar reaches its control plane.
#[derive(Debug, Clone)]
pub struct XdsOptions {
    /// Control nodes (`host:port` or `http://host:port`); the first reachable one is used, the
    /// next one on error.
    pub servers: Vec<String>,
    /// The node id sent to the control plane; empty = the bootstrap's `node.id`.
    pub node_id: String,
    /// Where the last good pushed config is saved; `None` = not saved.
    pub cache_path: Option<PathBuf>,
    /// Wait after a round in which no control node answered (or each stream ended within 5 s of
    /// opening); doubles up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// The inbound endpoint this sidecar fronts, registered with the control plane so other
    /// sidecars route to it; `None` = register nothing (an outbound-only sidecar).
    pub registration: Option<weft_xds::resources::v1::Registration>,
    /// Heartbeat and load-report period.
    pub report_interval: Duration,
    /// TLS to the control nodes (`--xds-ca`, `https://` addresses).
    pub tls: dial::ControlTls,
}

impl XdsOptions {
    pub fn new(servers: Vec<String>) -> XdsOptions {
        XdsOptions {
            servers,
            node_id: String::new(),
            cache_path: None,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(5),
            registration: None,
            report_interval: Duration::from_secs(1),
            tls: dial::ControlTls::default(),
        }
    }

    /// The node id to use with `cfg` as bootstrap: the explicit one, else `node.id`.
    pub fn node_id(&self, cfg: &Config) -> String {
        if self.node_id.is_empty() { cfg.node.id.clone() } else { self.node_id.clone() }
    }

    /// Checks what must hold before the proxy starts, so a misconfiguration is a startup
    /// error rather than a stream the control plane refuses forever.
    pub fn check(&self, cfg: &Config) -> Result<(), String> {
        if self.servers.is_empty() || self.servers.iter().any(|s| s.trim().is_empty()) {
            return Err("xds: give at least one control node address, and no empty ones".into());
        }
        if self.node_id(cfg).is_empty() {
            return Err(
                "node.id: required with xDS (the control plane keys each sidecar by it); set it or pass --node-id"
                    .into(),
            );
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err("xds: backoff must be positive and base <= max".into());
        }
        Ok(())
    }
}

/// Starts the xDS client on its own thread and runtime (one current-thread runtime, like the
/// control thread), so a slow control plane never competes with the data path; it stops when
/// `stop` turns true. Call after the proxy started: the config it serves is the bootstrap.
pub fn spawn(
    sh: Arc<Shared>,
    opts: XdsOptions,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let bootstrap = sh.snapshot.load().config.clone();
    let node = weft_xds::transport::Node {
        id: opts.node_id(&bootstrap),
        user_agent_name: "weft-proxy".into(),
        ..Default::default()
    };
    std::thread::Builder::new().name("weft-xds".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "xDS client not started: no runtime");
                return;
            }
        };
        rt.block_on(async move {
            if let Some(mesh) = sh.tls.mesh.clone().filter(|m| m.issued.is_some()) {
                tokio::spawn(issue::run(mesh, sh.tls.clone(), opts.servers.clone(), opts.tls.clone()));
            }
            tokio::select! {
                () = client::Client::new(sh, opts, node).run() => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    })
}

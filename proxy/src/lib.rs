//! weft-proxy: the sidecar data plane.
//!
//! Start at [`proxy::handle`] for the request path. Module map:
//! - config, duration: the YAML bootstrap as written by users;
//! - snapshot: validated, compiled config, swapped atomically (`arc-swap`) on reload;
//! - route, assign, limit, shadow: routing, A/B variant assignment, per-variant isolation,
//!   traffic shadowing;
//! - cluster, lb, pool, breaker, outlier, retry, window: upstream selection and protection;
//! - h1: the HTTP/1.1 upstream client, run inside the request's own task (`h1::codec` the
//!   framing rules);
//! - body: streaming bodies (bounded replay copy, idle timeout, end-of-stream accounting);
//! - telemetry: Prometheus metrics, tenant cardinality limit, access log, traceparent;
//! - otlp: OpenTelemetry spans (server, upstream tries, shadow copies) exported over OTLP/gRPC;
//! - server, linger, admin, reload, worker: sockets (closed lingering), the admin API, hot
//!   reload, per-core workers;
//! - xds: the control-plane client (ADS), pushes validated and swapped like a reload;
//! - training: a training worker's sidecar: shard map, checkpoints and the trainer's API.

pub mod admin;
pub mod assign;
pub mod authz;
pub mod body;
pub mod breaker;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod drain;
pub mod grpc_reply;
pub mod duration;
pub mod h1;
pub mod headers;
pub mod identity;
pub mod infer;
pub mod lb;
pub mod limit;
pub mod logging;
pub mod linger;
pub mod model_sim;
pub mod mtls;
pub mod otlp;
pub mod otlp_metrics;
pub mod outlier;
pub mod pool;
pub mod proxy;
pub mod reload;
pub mod retry;
pub mod route;
pub mod server;
pub mod shadow;
pub mod signals;
pub mod series;
pub mod sketch;
pub mod snapshot;
pub mod stream;
pub mod telemetry;
pub mod tls;
pub mod training;
pub mod tunnel;
pub mod usage;
pub mod window;
pub mod worker;
pub mod xds;

use arc_swap::ArcSwap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

pub use config::Config;
pub use server::{Options, Proxy};
pub use snapshot::Snapshot;
use telemetry::Telemetry;

/// State shared by every worker, the admin API and the reloader.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub telemetry: Telemetry,
    /// The mesh identity and TLS counters (fixed for the process: `identity` needs a restart).
    pub tls: Arc<mtls::TlsContext>,
    pub workers: usize,
    pub shadows_in_flight: AtomicUsize,
    /// `true` once draining: listeners stop accepting, connections close when idle.
    pub draining: tokio::sync::watch::Sender<bool>,
    /// Present on a training worker's sidecar (config `training`).
    pub training: Option<Arc<training::Trainer>>,
    reload_lock: Mutex<()>,
    /// Listener and admin addresses as first configured (maybe `:0`), so a reloaded file that
    /// still says `:0` is accepted as "unchanged".
    configured: (Vec<String>, config::Admin),
}

impl Shared {
    fn new(
        snapshot: Snapshot,
        telemetry: Telemetry,
        tls: Arc<mtls::TlsContext>,
        workers: usize,
        configured: (Vec<String>, config::Admin),
        training: Option<Arc<training::Trainer>>,
    ) -> Shared {
        Shared {
            training,
            configured,
            snapshot: ArcSwap::from_pointee(snapshot),
            telemetry,
            tls,
            workers,
            shadows_in_flight: AtomicUsize::new(0),
            draining: tokio::sync::watch::Sender::new(false),
            reload_lock: Mutex::new(()),
        }
    }

    /// Validate `cfg` against the running snapshot and swap it in. The old snapshot keeps
    /// serving the requests that started on it. Returns the new version.
    pub fn apply(&self, cfg: Config) -> Result<u64, String> {
        let _one_at_a_time = self.reload_lock.lock().unwrap();
        let result = self.apply_locked(cfg);
        let outcome = if result.is_ok() { "ok" } else { "rejected" };
        self.telemetry
            .counter("weft_config_reloads_total", vec![metrics::Label::new("result", outcome)])
            .increment(1);
        result
    }

    fn apply_locked(&self, mut cfg: Config) -> Result<u64, String> {
        let cur = self.snapshot.load();
        let (first_listeners, first_admin) = &self.configured;
        let same_listeners = cfg.listeners.len() == cur.config.listeners.len()
            && cfg.listeners.iter().zip(&cur.config.listeners).zip(first_listeners).all(|((new, bound), first)| {
                new.name == bound.name && (new.address == bound.address || &new.address == first)
            });
        if !same_listeners {
            return Err("listeners: names and addresses cannot change on reload; restart the proxy to change them".into());
        }
        if cfg.identity != cur.config.identity {
            return Err("identity: cannot change on reload; restart the proxy to change it (the files it names are reread when they change)".into());
        }
        mtls::check(&cfg, self.tls.mesh.is_some())?;
        if cfg.training != cur.config.training {
            return Err("training: cannot change on reload; restart the proxy to change it".into());
        }
        if cfg.admin.address != cur.config.admin.address && cfg.admin.address != first_admin.address {
            return Err("admin.address: cannot change on reload; restart the proxy".into());
        }
        if cfg.admin.metrics_address != cur.config.admin.metrics_address && cfg.admin.metrics_address != first_admin.metrics_address {
            return Err("admin.metrics_address: cannot change on reload; restart the proxy".into());
        }
        // Keep showing the addresses really bound.
        for (new, bound) in cfg.listeners.iter_mut().zip(&cur.config.listeners) {
            new.address = bound.address.clone();
        }
        cfg.admin = cur.config.admin.clone();
        let snap = Snapshot::compile(cfg, Some(&cur), self.workers, &self.telemetry, &self.tls)?;
        // Reconfigured on every apply (a SIGHUP after log rotation reopens the access log), but
        // an unchanged section that cannot be set up again (the log's directory is gone, say)
        // keeps the running one rather than refusing the config: otherwise every xDS push
        // would be NACKed for a reason local to this sidecar. `configure` changes nothing
        // when it fails.
        match self.telemetry.configure(&snap.config.telemetry) {
            Ok(()) => {}
            Err(e) if snap.config.telemetry == cur.config.telemetry => {
                tracing::warn!(error = %e, "telemetry unchanged and could not be set up again; keeping the running one")
            }
            Err(e) => return Err(e),
        }
        let v = snap.version;
        if let Some(m) = &self.tls.mesh {
            m.set_revocations(&snap.config.revocations);
        }
        self.snapshot.store(Arc::new(snap));
        Ok(v)
    }
}

//! A cluster at run time: its endpoints with their load, health and connection pools, its
//! thresholds and error-rate breaker. Runtime state outlives config reloads: a reload that
//! keeps a cluster unchanged keeps the very same `Cluster`, and an endpoint that stays (same
//! address and protocol) keeps its EWMA, ejection and idle connections.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::breaker::{self, Admit, Breaker};
use crate::clock::now_ms;
use crate::config::{self, UpstreamProtocol};
use crate::lb;
use crate::outlier::{self, Health, Outcome};
use crate::pool::{Dial, Pool};
use crate::telemetry::Telemetry;

pub struct Endpoint {
    pub addr: SocketAddr,
    /// `host:port` as configured; the `endpoint` metric label.
    pub label: Arc<str>,
    pub protocol: UpstreamProtocol,
    pub load: lb::Load,
    pub health: Health,
    pools: Box<[Pool]>,
    /// The cluster's name (the endpoint's metrics are labelled with it).
    cluster: Arc<str>,
    ejections: std::sync::atomic::AtomicU64,
}

/// An endpoint's metrics are read at scrape time, so they leave `/metrics` with the endpoint
/// (removed from the config, scaled away) instead of staying forever at their last value.
impl crate::series::Live for Endpoint {
    fn samples(&self, now_ms: u64, out: &mut Vec<(&'static str, String, f64)>) {
        let labels = crate::series::label_pairs(&[("cluster", &self.cluster), ("endpoint", &self.label)]);
        let ejected = if self.health.is_ejected(now_ms) { 1.0 } else { 0.0 };
        out.push(("weft_outlier_ejections_total", labels.clone(), self.ejections.load(Relaxed) as f64));
        out.push(("weft_endpoint_ejected", labels, ejected));
    }
}

impl Endpoint {
    /// The calling worker's pool.
    pub fn pool(&self) -> &Pool {
        &self.pools[crate::worker::id() % self.pools.len()]
    }
    pub fn idle_connections(&self) -> usize {
        self.pools.iter().map(|p| p.idle_count()).sum()
    }
}

/// Which threshold refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    MaxRequests,
    MaxPending,
    MaxConnections,
    MaxRetries,
    BreakerOpen,
}

impl Overflow {
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::MaxRequests => "max_requests",
            Overflow::MaxPending => "max_pending",
            Overflow::MaxConnections => "max_connections",
            Overflow::MaxRetries => "max_retries",
            Overflow::BreakerOpen => "breaker_open",
        }
    }
    const ALL: [Overflow; 5] = [
        Overflow::MaxRequests,
        Overflow::MaxPending,
        Overflow::MaxConnections,
        Overflow::MaxRetries,
        Overflow::BreakerOpen,
    ];
}

pub struct Cluster {
    pub name: Arc<str>,
    pub cfg: config::Cluster,
    pub endpoints: Vec<Arc<Endpoint>>,
    rr: AtomicUsize,
    breaker: Option<Mutex<Breaker>>,
    outlier: Option<outlier::Settings>,
    eject_lock: Mutex<()>,
    pub active: AtomicU32,
    pub pending: AtomicU32,
    pub retries_active: AtomicU32,
    pub connections: Arc<AtomicU32>,
    /// Counters shared by every build of this cluster (a reload that changes it keeps them).
    pub stats: Arc<ClusterStats>,
    /// TLS origination (`tls`); `None` = plaintext.
    pub origin: Option<crate::mtls::Origin>,
}

/// A cluster's counters. Shared across reloads, so `weft_requests_in_flight` counts the
/// requests of the previous build still running, and counters never restart on a change.
#[derive(Default)]
pub struct ClusterStats {
    breaker_transitions: [AtomicU64; 3],
    overflows: [AtomicU64; 5],
    pub in_flight: AtomicU64,
    pub budget_exhausted: AtomicU64,
    /// Upgraded connections open now ([`crate::tunnel`]).
    pub tunnels_active: AtomicU64,
    /// Bytes tunnelled: towards the upstream, towards the client.
    pub tunnel_bytes: [AtomicU64; 2],
    /// Tunnels ended, by [`crate::tunnel::Close`].
    pub tunnels_closed: [AtomicU64; 4],
}

/// A cluster's metrics are read at scrape time, so a cluster removed from the config leaves
/// `/metrics` (its breaker state would otherwise stay at its last value for good).
impl crate::series::Live for Cluster {
    fn samples(&self, now_ms: u64, out: &mut Vec<(&'static str, String, f64)>) {
        let cl = crate::series::label_pairs(&[("cluster", &self.name)]);
        let st = &self.stats;
        let state = self.breaker.as_ref().map_or(0, |b| b.lock().unwrap().state(now_ms).code());
        out.push(("weft_circuit_breaker_state", cl.clone(), state as f64));
        for (s, n) in ["closed", "open", "half_open"].into_iter().zip(&st.breaker_transitions) {
            let labels = crate::series::label_pairs(&[("cluster", &self.name), ("state", s)]);
            out.push(("weft_circuit_breaker_transitions_total", labels, n.load(Relaxed) as f64));
        }
        for (o, n) in Overflow::ALL.into_iter().zip(&st.overflows) {
            let labels = crate::series::label_pairs(&[("cluster", &self.name), ("reason", o.as_str())]);
            out.push(("weft_overflow_total", labels, n.load(Relaxed) as f64));
        }
        out.push(("weft_requests_in_flight", cl.clone(), st.in_flight.load(Relaxed) as f64));
        out.push(("weft_retry_budget_exhausted_total", cl.clone(), st.budget_exhausted.load(Relaxed) as f64));
        out.push(("weft_tunnels_active", cl, st.tunnels_active.load(Relaxed) as f64));
        for (d, n) in ["upstream", "downstream"].into_iter().zip(&st.tunnel_bytes) {
            let labels = crate::series::label_pairs(&[("cluster", &self.name), ("direction", d)]);
            out.push(("weft_tunnel_bytes_total", labels, n.load(Relaxed) as f64));
        }
        for (c, n) in crate::tunnel::Close::ALL.into_iter().zip(&st.tunnels_closed) {
            let labels = crate::series::label_pairs(&[("cluster", &self.name), ("reason", c.as_str())]);
            out.push(("weft_tunnels_closed_total", labels, n.load(Relaxed) as f64));
        }
    }
}

impl Cluster {
    /// Build a cluster from config, reusing endpoints of `prev` with the same address.
    pub fn build(
        cfg: &config::Cluster,
        prev: Option<&Arc<Cluster>>,
        workers: usize,
        tel: &Telemetry,
        tls: &Arc<crate::mtls::TlsContext>,
    ) -> Result<Arc<Cluster>, String> {
        if let Some(p) = prev.filter(|p| p.cfg == *cfg) {
            return Ok(p.clone());
        }
        let name: Arc<str> = Arc::from(cfg.name.as_str());
        // An empty cluster is valid (a model scaled to zero, or whose sidecars have not
        // registered yet): its requests get a 503 naming it, as in Envoy.
        let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
        for ep in &cfg.endpoints {
            let addr = resolve(ep).map_err(|e| format!("clusters.{}.endpoints: {e}", cfg.name))?;
            let reused = prev.and_then(|p| {
                // Pools of another TLS setting hold connections of the wrong kind.
                let same_tls = p.cfg.tls == cfg.tls;
                p.endpoints.iter().find(|e| same_tls && e.addr == addr && e.protocol == cfg.protocol).cloned()
            });
            endpoints.push(match reused {
                Some(e) => e,
                None => {
                    let e = Arc::new(Endpoint {
                        addr,
                        label: Arc::from(ep.as_str()),
                        protocol: cfg.protocol,
                        load: lb::Load::new(now_ms()),
                        health: Health::default(),
                        pools: (0..workers.max(1)).map(|_| Pool::default()).collect(),
                        cluster: name.clone(),
                        ejections: Default::default(),
                    });
                    tel.track(Arc::downgrade(&(e.clone() as Arc<dyn crate::series::Live>)));
                    e
                }
            });
        }
        if cfg.connect_timeout.is_zero() {
            return Err(format!("clusters.{}.connect_timeout: must be above 0", cfg.name));
        }
        let breaker = match &cfg.circuit_breaker.error_rate {
            None => None,
            Some(er) => {
                if !(er.threshold_pct > 0.0 && er.threshold_pct <= 100.0) {
                    return Err(format!(
                        "clusters.{}.circuit_breaker.error_rate.threshold_pct: {} is not in (0, 100]",
                        cfg.name, er.threshold_pct
                    ));
                }
                if er.window.is_zero() || er.open_duration.is_zero() {
                    return Err(format!(
                        "clusters.{}.circuit_breaker.error_rate: window and open_duration must be above 0",
                        cfg.name
                    ));
                }
                // Keep the breaker's state across a reload unless its settings changed.
                let kept = prev
                    .filter(|p| p.cfg.circuit_breaker.error_rate.as_ref() == Some(er))
                    .and_then(|p| p.breaker.as_ref().map(|b| b.lock().unwrap().clone()));
                Some(Mutex::new(kept.unwrap_or_else(|| {
                    Breaker::new(breaker::Settings {
                        threshold_pct: er.threshold_pct,
                        min_requests: er.min_requests as u64,
                        window_ms: er.window.0.as_millis() as u64,
                        open_ms: er.open_duration.0.as_millis() as u64,
                        probes: er.half_open_probes,
                    })
                })))
            }
        };
        if let Some(o) = &cfg.outlier
            && o.max_ejection_pct > 100 {
                return Err(format!(
                    "clusters.{}.outlier.max_ejection_pct: {} is above 100",
                    cfg.name, o.max_ejection_pct
                ));
            }
        let origin = crate::mtls::Origin::compile(cfg, tls)?;
        let cluster = Arc::new(Cluster {
            origin,
            name,
            endpoints,
            rr: AtomicUsize::new(0),
            breaker,
            outlier: cfg.outlier.as_ref().map(outlier::Settings::from),
            eject_lock: Mutex::new(()),
            active: AtomicU32::new(0),
            pending: AtomicU32::new(0),
            retries_active: AtomicU32::new(0),
            connections: prev.map(|p| p.connections.clone()).unwrap_or_default(),
            stats: prev.map(|p| p.stats.clone()).unwrap_or_default(),
            cfg: cfg.clone(),
        });
        tel.track(Arc::downgrade(&(cluster.clone() as Arc<dyn crate::series::Live>)));
        Ok(cluster)
    }

    pub fn count_overflow(&self, o: Overflow) {
        self.stats.overflows[o as usize].fetch_add(1, Relaxed);
    }

    /// How to connect to `ep`, one of this cluster's endpoints.
    pub fn dial<'a>(&'a self, ep: &'a Endpoint) -> Dial<'a> {
        Dial {
            label: &ep.label,
            origin: self.origin.as_ref(),
            protocol: self.cfg.protocol,
            connect_timeout: self.cfg.connect_timeout.0,
            max_connections: self.cfg.circuit_breaker.max_connections,
            open: &self.connections,
        }
    }

    /// Ask the error-rate breaker whether a request may go (`now` from `clock`).
    pub fn admit(&self, now: u64) -> Admit {
        match &self.breaker {
            None => Admit::Yes,
            Some(b) => {
                let (a, changed) = b.lock().unwrap().admit(now);
                if let Some(s) = changed {
                    self.note_transition(s);
                }
                a
            }
        }
    }

    /// A half-open probe ended without a verdict: free its slot (see [`Breaker::abandon_probe`]).
    pub fn abandon_probe(&self) {
        if let Some(b) = &self.breaker {
            b.lock().unwrap().abandon_probe();
        }
    }

    pub fn breaker_state(&self) -> Option<breaker::State> {
        self.breaker.as_ref().map(|b| b.lock().unwrap().state(now_ms()))
    }

    fn note_transition(&self, s: breaker::State) {
        self.stats.breaker_transitions[s.code() as usize].fetch_add(1, Relaxed);
        tracing::info!(cluster = %self.name, state = s.name(), "circuit breaker state changed");
    }

    /// Pick an endpoint for a try, skipping ejected ones and (if possible) those in `tried`.
    pub fn pick(&self, tried: &[usize], now: u64) -> Option<usize> {
        let eps = &self.endpoints;
        lb::pick(
            self.cfg.lb,
            eps.len(),
            |i| !eps[i].health.is_ejected(now),
            |i| eps[i].load.cost(now),
            tried,
            &self.rr,
            |n| rand::random_range(0..n),
        )
    }

    /// Account for the outcome of one try: breaker window, outlier detection. `now` may be the
    /// try's start: the breaker window has second granularity; ejection reads a fresh clock.
    pub fn record(&self, ep: usize, outcome: Outcome, probe: bool, now: u64) {
        if let Some(b) = &self.breaker {
            let changed = b.lock().unwrap().record(now, outcome == Outcome::Success, probe);
            if let Some(s) = changed {
                self.note_transition(s);
            }
        }
        let Some(settings) = &self.outlier else { return };
        let e = &self.endpoints[ep];
        if e.health.record(settings, outcome) {
            let _g = self.eject_lock.lock().unwrap();
            let now = now_ms();
            let ejected = self.endpoints.iter().filter(|e| e.health.is_ejected(now)).count();
            if !e.health.is_ejected(now) && outlier::may_eject(settings, ejected, self.endpoints.len()) {
                let until = e.health.eject(settings, now);
                e.ejections.fetch_add(1, Relaxed);
                tracing::warn!(cluster = %self.name, endpoint = %e.label, for_ms = until - now, "endpoint ejected");
            }
        }
    }

    /// JSON for the admin `/clusters` page.
    pub fn describe(&self) -> serde_json::Value {
        let now = now_ms();
        serde_json::json!({
            "name": &*self.name,
            "protocol": self.cfg.protocol,
            "lb": self.cfg.lb,
            "active_requests": self.active.load(Relaxed),
            "open_connections": self.connections.load(Relaxed),
            "circuit_breaker": self.breaker_state().map(|s| s.name()).unwrap_or("disabled"),
            "endpoints": self.endpoints.iter().map(|e| serde_json::json!({
                "address": &*e.label,
                "healthy": !e.health.is_ejected(now),
                "ejected_for_ms": e.health.ejected_until_ms().saturating_sub(now),
                "times_ejected": e.health.times_ejected(),
                "in_flight": e.load.in_flight(),
                "ewma_latency_ms": e.load.ewma_us(now) / 1000.0,
                "idle_connections": e.idle_connections(),
            })).collect::<Vec<_>>(),
        })
    }
}

fn resolve(ep: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = ep.parse() {
        return Ok(a);
    }
    if !ep.contains(':') {
        return Err(format!("{ep:?} has no port: write host:port"));
    }
    ep.to_socket_addrs()
        .map_err(|e| format!("{ep:?} does not resolve: {e}"))?
        .next()
        .ok_or_else(|| format!("{ep:?} resolves to no address"))
}

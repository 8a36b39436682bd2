//! weft-control's own Prometheus metrics (`GET /metrics`): the Raft node's state, write
//! latency, the xDS server's connected sidecars, pushes and NACKs, and API requests by route
//! and status. Counters are plain atomics kept by whoever counts; the text is rendered per
//! scrape from them and from the Raft metrics, so nothing runs between scrapes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A latency histogram with fixed buckets (seconds), lock-free to record.
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, plus +Inf.
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

/// Raft writes on a LAN take a few milliseconds; a lost quorum makes them wait for the 10 s
/// commit timeout, so the buckets reach past it.
const WRITE_BOUNDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(WRITE_BOUNDS)
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_micros: AtomicU64::new(0) }
    }

    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|b| s <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// The exposition lines of histogram `name` (cumulative buckets, `_sum`, `_count`).
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// API requests by (method, route template, status).
#[derive(Default)]
pub struct Requests {
    counts: Mutex<BTreeMap<(String, String, u16), u64>>,
}

impl Requests {
    /// `route` is the matched template (`/v1/{kind}/{name}`), so the series stay bounded
    /// whatever names are requested; unmatched paths count as `unmatched`.
    pub fn count(&self, method: &str, route: &str, status: u16) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *c.entry((method.to_owned(), route.to_owned(), status)).or_default() += 1;
    }

    fn render(&self, out: &mut String) {
        let name = "weft_control_api_requests_total";
        let _ = writeln!(out, "# HELP {name} API requests answered, by method, route template and status.\n# TYPE {name} counter");
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for ((method, route, status), n) in c.iter() {
            let _ = writeln!(out, "{name}{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}", escape(route));
        }
    }
}

/// A label value as the exposition format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What a scrape shows of the Raft node (read off openraft's metrics by the caller).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RaftView {
    pub id: u64,
    pub term: u64,
    /// 0 = no leader known.
    pub leader: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub members: u64,
}

/// Connected sidecars and the xDS totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct XdsView {
    pub connected: u64,
    pub known: u64,
    pub revision: u64,
    pub counters: weft_xds::Counters,
}

fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
}

/// The whole exposition text.
pub fn render(raft: &RaftView, xds: &XdsView, writes: &Histogram, requests: &Requests) -> String {
    let mut out = String::with_capacity(4096);
    gauge(&mut out, "weft_control_raft_node_id", "This node's Raft id.", raft.id);
    gauge(&mut out, "weft_control_raft_term", "The current Raft term.", raft.term);
    gauge(&mut out, "weft_control_raft_leader_id", "The leader this node knows (0 = none).", raft.leader);
    gauge(&mut out, "weft_control_raft_is_leader", "1 while this node leads.", u8::from(raft.leader != 0 && raft.leader == raft.id));
    gauge(&mut out, "weft_control_raft_members", "Members of the cluster's configuration.", raft.members);
    gauge(&mut out, "weft_control_raft_last_log_index", "Index of the last entry in this node's log.", raft.last_log_index);
    gauge(
        &mut out,
        "weft_control_raft_commit_index",
        "Highest log index this node has applied; entries are applied once committed, so it trails the commit index by the apply lag at most.",
        raft.applied_index,
    );
    gauge(
        &mut out,
        "weft_control_raft_apply_lag",
        "Log entries this node holds but has not applied yet (last log index - applied index).",
        raft.last_log_index.saturating_sub(raft.applied_index),
    );
    writes.render(&mut out, "weft_control_write_duration_seconds", "Time from proposing a write to its commit and apply, as callers see it.");
    gauge(&mut out, "weft_control_xds_connected_sidecars", "Sidecars with an xDS stream open to this node.", xds.connected);
    gauge(&mut out, "weft_control_xds_known_sidecars", "Sidecars that ever connected to this node since it started.", xds.known);
    gauge(&mut out, "weft_control_xds_revision", "The store revision the xDS snapshot was built from.", xds.revision);
    counter(&mut out, "weft_control_xds_pushes_total", "xDS responses sent (one per type per push).", xds.counters.pushes);
    counter(&mut out, "weft_control_xds_acks_total", "ACKs received from sidecars.", xds.counters.acks);
    counter(&mut out, "weft_control_xds_nacks_total", "NACKs received from sidecars (see weftctl proxy-status for the errors).", xds.counters.nacks);
    counter(
        &mut out,
        "weft_control_xds_unknown_type_requests_total",
        "Subscriptions to a type URL this server does not serve (refused with an error).",
        xds.counters.unknown_types,
    );
    requests.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.record(Duration::from_micros(300));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(30));
        let mut out = String::new();
        h.render(&mut out, "w", "help");
        assert!(out.contains("w_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("w_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("w_bucket{le=\"10\"} 2\nw_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("w_count 3\n") && out.contains("w_sum 30.0033\n"), "{out}");
    }

    #[test]
    fn every_family_is_rendered_with_its_values() {
        let r = Requests::default();
        r.count("GET", "/v1/{kind}", 200);
        r.count("GET", "/v1/{kind}", 200);
        r.count("PUT", "/v1/{kind}/{name}", 422);
        let raft = RaftView { id: 2, term: 7, leader: 2, last_log_index: 12, applied_index: 10, members: 3 };
        let text = render(&raft, &XdsView { connected: 4, ..Default::default() }, &Histogram::default(), &r);
        for line in [
            "weft_control_raft_term 7\n",
            "weft_control_raft_is_leader 1\n",
            "weft_control_raft_apply_lag 2\n",
            "weft_control_xds_connected_sidecars 4\n",
            "weft_control_api_requests_total{method=\"GET\",route=\"/v1/{kind}\",status=\"200\"} 2\n",
            "weft_control_api_requests_total{method=\"PUT\",route=\"/v1/{kind}/{name}\",status=\"422\"} 1\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
    }
}

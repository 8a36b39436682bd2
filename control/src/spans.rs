//! Control-plane trace spans (`weft-control --otlp-endpoint`): an API write, its Raft commit,
//! and the xDS push of the change to each sidecar until that sidecar's ACK (or NACK), as one
//! trace, exported over OTLP/gRPC through the sidecar's exporter (bounded queue, drops
//! counted, a collector that is down costs nothing).
//!
//! - `PUT|DELETE /v1/{kind}/{name}` (SERVER span; continues the caller's `traceparent`), with a
//!   child `raft.commit` (INTERNAL: proposal to commit, `weft.revision`);
//! - `xds.push` (CLIENT, child of the write span) per sidecar and type: from the push that
//!   carried the write's revision to the sidecar's answer; `weft.node_id`, `xds.type_url`,
//!   `xds.version`, `xds.ack` (`ACK` or `NACK`, with the error as the span's status).
//!
//! Pushes are seen on the node that handled the write (the leader: followers forward writes),
//! so sidecars connected to other control nodes do not show up in the trace.
//!
//! [`Pending`] is the pure matching of writes to pushes and answers; [`Spans`] wires it to the
//! xDS cache ([`weft_xds::cache::Observer`]) and the exporter.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use weft_proxy::otlp::{Custom, CustomKind};
use weft_xds::cache::Feedback;
use weft_xds::typeurl;

/// How long a write waits for its pushes' answers before it is forgotten.
pub const PENDING_FOR: Duration = Duration::from_secs(60);
/// Writes followed at once (beyond: the oldest is forgotten).
pub const PENDING_MAX: usize = 256;

/// The xDS types a write of `kind` changes (none: not pushed to sidecars).
pub fn types_of(kind: &str) -> &'static [&'static str] {
    match kind {
        "clusters" => &[typeurl::CLUSTER],
        "endpoints" => &[typeurl::ENDPOINTS],
        "experiments" => &[typeurl::EXPERIMENT],
        "services" => &[typeurl::SERVICE],
        "authorizationpolicies" => &[typeurl::AUTHORIZATION_POLICY],
        "revocations" => &[typeurl::REVOCATION],
        "shardmaps" => &[typeurl::SHARD_MAP],
        "scalingdecisions" => &[typeurl::SCALING_DECISION],
        "placements" => &[typeurl::PLACEMENT],
        _ => &[],
    }
}

/// A traced write: its trace and the span id of its SERVER span.
#[derive(Debug, Clone)]
pub struct Write {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    parent: [u8; 8],
    name: String,
    start: SystemTime,
}

struct Followed {
    revision: u64,
    types: &'static [&'static str],
    trace_id: [u8; 16],
    parent: [u8; 8],
    since: Instant,
    /// (node, type) → when the push carrying the revision went out.
    pushed: BTreeMap<(String, String), SystemTime>,
    answered: std::collections::BTreeSet<(String, String)>,
}

/// Writes waiting for their pushes and answers (pure: times are passed in).
#[derive(Default)]
pub struct Pending {
    writes: VecDeque<Followed>,
    /// (node, type) → the last push: (version, when), for pushes that beat the registration.
    last_push: BTreeMap<(String, String), (u64, SystemTime)>,
}

impl Pending {
    /// Follows the pushes of `revision` (a write of `kind` in `trace_id`, under span `parent`).
    pub fn follow(&mut self, revision: u64, kind: &str, trace_id: [u8; 16], parent: [u8; 8], now: Instant) {
        let types = types_of(kind);
        if types.is_empty() {
            return;
        }
        let pushed = self
            .last_push
            .iter()
            .filter(|((_, t), (v, _))| *v >= revision && types.contains(&t.as_str()))
            .map(|(k, (_, at))| (k.clone(), *at))
            .collect();
        self.writes.push_back(Followed { revision, types, trace_id, parent, since: now, pushed, answered: Default::default() });
        while self.writes.len() > PENDING_MAX {
            self.writes.pop_front();
        }
    }

    pub fn pushed(&mut self, node: &str, type_url: &str, version: u64, at: SystemTime) {
        let key = (node.to_owned(), type_url.to_owned());
        self.last_push.insert(key.clone(), (version, at));
        for w in self.writes.iter_mut().filter(|w| w.revision <= version && w.types.contains(&type_url)) {
            w.pushed.entry(key.clone()).or_insert(at);
        }
    }

    /// An answer of `node` for `type_url` at `version`: the push spans it completes.
    pub fn answered(&mut self, node: &str, type_url: &str, version: u64, error: Option<&str>, at: SystemTime) -> Vec<Custom> {
        let key = (node.to_owned(), type_url.to_owned());
        let mut out = Vec::new();
        for w in self.writes.iter_mut().filter(|w| w.revision <= version) {
            let Some(start) = w.pushed.get(&key).copied() else { continue };
            if !w.answered.insert(key.clone()) {
                continue;
            }
            out.push(Custom {
                trace_id: w.trace_id,
                span_id: weft_proxy::otlp::span_id(),
                parent: w.parent,
                parent_remote: false,
                kind: CustomKind::Client,
                name: "xds.push".into(),
                start,
                end: at,
                error: error.map(|e| format!("NACK: {e}")),
                attrs: vec![
                    ("weft.node_id", node.to_owned()),
                    ("xds.type_url", type_url.to_owned()),
                    ("xds.version", version.to_string()),
                    ("weft.revision", w.revision.to_string()),
                    ("xds.ack", if error.is_some() { "NACK" } else { "ACK" }.to_owned()),
                ],
            });
        }
        out
    }

    /// Forgets writes older than [`PENDING_FOR`].
    pub fn expire(&mut self, now: Instant) {
        self.writes.retain(|w| now.duration_since(w.since) < PENDING_FOR);
    }
}

/// The control node's span source: the exporter (if configured) and the pending writes.
pub struct Spans {
    telemetry: Option<weft_proxy::telemetry::Telemetry>,
    pending: Mutex<Pending>,
}

impl Spans {
    /// Off: nothing is recorded.
    pub fn off() -> Spans {
        Spans { telemetry: None, pending: Mutex::default() }
    }

    /// Exports to the OTLP/gRPC collector at `endpoint` as `service.name` = weft-control.
    pub fn otlp(endpoint: &str, node_id: u64, sample_ratio: f64) -> Result<Spans, String> {
        let node = weft_proxy::config::Node { id: format!("control-{node_id}"), job_type: "control".into(), ..Default::default() };
        let t = weft_proxy::telemetry::Telemetry::new(&node);
        let otlp = weft_proxy::config::Otlp {
            endpoint: endpoint.to_owned(),
            service_name: "weft-control".into(),
            sample_ratio,
            resource: BTreeMap::from([("weft.control_node".to_string(), node_id.to_string())]),
            metrics_interval: weft_proxy::duration::Dur(Duration::ZERO), // no sidecar registry here
            ..Default::default()
        };
        t.configure(&weft_proxy::config::Telemetry { otlp: Some(otlp), ..Default::default() })
            .map_err(|e| format!("--otlp-endpoint: {e}"))?;
        Ok(Spans { telemetry: Some(t), pending: Mutex::default() })
    }

    /// A write starts (`traceparent` = the request's header, continued when valid).
    pub fn begin(&self, method: &str, path_template: &str, traceparent: Option<&[u8]>) -> Option<Write> {
        self.telemetry.as_ref()?;
        let (trace_id, parent) = match traceparent.and_then(weft_proxy::otlp::parse_traceparent) {
            Some((_, _, false)) => return None, // the caller's trace is not sampled
            Some((t, p, true)) => (t, p),
            None => (weft_proxy::otlp::trace_id(), [0; 8]),
        };
        Some(Write { trace_id, span_id: weft_proxy::otlp::span_id(), parent, name: format!("{method} {path_template}"), start: SystemTime::now() })
    }

    /// The write ended: its commit span (when it reached Raft) and its SERVER span go out,
    /// and a committed change is followed to the sidecars' answers.
    pub fn finish(&self, w: Write, kind: &str, name: &str, outcome: Result<(u64, bool), String>) {
        let Some(t) = &self.telemetry else { return };
        let end = SystemTime::now();
        let mut attrs = vec![("weft.kind", kind.to_owned()), ("weft.name", name.to_owned())];
        let error = outcome.as_ref().err().cloned();
        if let Ok((revision, changed)) = &outcome {
            attrs.push(("weft.revision", revision.to_string()));
            attrs.push(("weft.changed", changed.to_string()));
        }
        let server = Custom {
            trace_id: w.trace_id,
            span_id: w.span_id,
            parent: w.parent,
            parent_remote: w.parent != [0; 8],
            kind: CustomKind::Server,
            name: w.name,
            start: w.start,
            end,
            error: error.clone(),
            attrs: attrs.clone(),
        };
        if !t.export_span(server) {
            return; // not sampled: no children either
        }
        if let Ok((revision, changed)) = outcome {
            t.export_span(Custom {
                trace_id: w.trace_id,
                span_id: weft_proxy::otlp::span_id(),
                parent: w.span_id,
                parent_remote: false,
                kind: CustomKind::Internal,
                name: "raft.commit".into(),
                start: w.start,
                end,
                error: None,
                attrs,
            });
            if changed {
                self.pending.lock().unwrap().follow(revision, kind, w.trace_id, w.span_id, Instant::now());
            }
        }
    }

    fn export(&self, spans: Vec<Custom>) {
        if let Some(t) = &self.telemetry {
            for s in spans {
                t.export_span(s);
            }
        }
    }
}

impl weft_xds::cache::Observer for Spans {
    fn pushed(&self, node_id: &str, type_url: &str, version: &str) {
        if self.telemetry.is_none() {
            return;
        }
        if let Ok(v) = version.parse() {
            let mut p = self.pending.lock().unwrap();
            p.expire(Instant::now());
            p.pushed(node_id, type_url, v, SystemTime::now());
        }
    }

    fn answered(&self, node_id: &str, feedback: &Feedback) {
        if self.telemetry.is_none() {
            return;
        }
        let done = {
            let mut p = self.pending.lock().unwrap();
            match feedback {
                Feedback::Ack { type_url, version } => match version.parse() {
                    Ok(v) => p.answered(node_id, type_url, v, None, SystemTime::now()),
                    Err(_) => Vec::new(),
                },
                Feedback::Nack { type_url, nack } => p.answered(node_id, type_url, nack.version, Some(&nack.error), SystemTime::now()),
            }
        };
        self.export(done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_followed_to_each_sidecars_answer_once() {
        let mut p = Pending::default();
        let t0 = SystemTime::now();
        let now = Instant::now();
        // A push of an older version is not this write's.
        p.pushed("side-a", typeurl::CLUSTER, 6, t0);
        p.follow(7, "clusters", [1; 16], [2; 8], now);
        p.pushed("side-a", typeurl::CLUSTER, 7, t0 + Duration::from_millis(5));
        p.pushed("side-b", typeurl::SERVICE, 9, t0 + Duration::from_millis(5));
        assert!(p.answered("side-a", typeurl::CLUSTER, 6, None, t0).is_empty(), "an ACK of the old version");
        let spans = p.answered("side-a", typeurl::CLUSTER, 7, None, t0 + Duration::from_millis(9));
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!((s.trace_id, s.parent, s.name.as_str(), s.error.as_ref()), ([1; 16], [2; 8], "xds.push", None));
        assert_eq!(s.end.duration_since(s.start).unwrap(), Duration::from_millis(4));
        assert!(p.answered("side-a", typeurl::CLUSTER, 8, None, t0).is_empty(), "answered once");
        assert!(p.answered("side-b", typeurl::SERVICE, 9, None, t0).is_empty(), "another type than the write's");
    }

    #[test]
    fn a_push_that_beat_the_registration_and_a_nack_are_kept() {
        let mut p = Pending::default();
        let t0 = SystemTime::now();
        p.pushed("side-a", typeurl::EXPERIMENT, 12, t0);
        p.follow(12, "experiments", [3; 16], [4; 8], Instant::now());
        let spans = p.answered("side-a", typeurl::EXPERIMENT, 12, Some("weights do not sum to 100"), t0 + Duration::from_millis(1));
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].error.as_deref(), Some("NACK: weights do not sum to 100"));
        p.follow(13, "autoscalers", [5; 16], [6; 8], Instant::now());
        p.expire(Instant::now() + PENDING_FOR + Duration::from_secs(1));
        assert!(p.writes.is_empty(), "old writes are forgotten; kinds not pushed are never followed");
    }
}

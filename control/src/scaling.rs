//! The autoscaler's decision loop (the IO around `autoscaler::live`): on the Raft leader only,
//! every interval, read the `autoscalers`, gather the sidecars' load counters from every
//! control node (`GET /v1/proxies?scope=local` on each peer), decide, and commit the targets
//! that change what runs as `scalingdecisions/<name>` (pushed over xDS as
//! `weft.v1.ScalingDecision`). The last statuses are kept for `GET /v1/autoscale/status`.
//!
//! Why on the leader: one writer of decisions (followers would race each other's writes), and
//! reads of the stored specs are then local and current. A new leader starts its forecasters
//! afresh (plain smoothing until they have history again); the committed targets stay.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::api::AppState;
use crate::autoscaler::live::{Change, Controller, Counters, LoadMeter, Status};
use crate::autoscaler::spec::{AutoscalerSpec, DecisionRecord};
use crate::resources::{Kind, REGISTRATIONS, Registration};
use crate::store::{Command, StoreError};

/// Wall-clock seconds since the epoch (the budget ledger's clock: months are calendar months).
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Default decision interval (Knative's KPA ticks every 2 s; the forecaster's step is a
/// minute; 10 s is the replay's bin and leaves the panic window two reports per tick).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// The decision state of this node (used while it leads).
pub struct Autoscale {
    pub interval: Duration,
    started: Instant,
    inner: Mutex<Inner>,
}

struct Inner {
    controller: Controller,
    meter: LoadMeter,
    statuses: Vec<Status>,
    /// When the statuses were decided (seconds on this node's clock).
    decided_at: Option<f64>,
    leading: bool,
}

/// Stored decisions by autoscaler name, with their revisions.
pub type Committed = BTreeMap<String, (DecisionRecord, u64)>;

impl Autoscale {
    pub fn new(interval: Duration) -> Self {
        Autoscale {
            interval,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                controller: Controller::new(interval.as_secs_f64()),
                meter: LoadMeter::default(),
                statuses: Vec::new(),
                decided_at: None,
                leading: false,
            }),
        }
    }

    pub fn now_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Forgets everything when this node stops leading (a later term starts afresh).
    fn follow(&self) {
        let mut i = self.inner.lock().unwrap();
        if i.leading {
            *i = Inner {
                controller: Controller::new(self.interval.as_secs_f64()),
                meter: LoadMeter::default(),
                statuses: Vec::new(),
                decided_at: None,
                leading: false,
            };
        }
    }

    /// The last statuses and how many seconds ago they were decided.
    pub fn statuses(&self) -> (Vec<Status>, Option<f64>) {
        let i = self.inner.lock().unwrap();
        (i.statuses.clone(), i.decided_at.map(|t| self.now_s() - t))
    }

    /// Applies a preemption notice: `lost` spot replicas per autoscaler name.
    pub fn preempted(&self, notice_s: f64, lost: &BTreeMap<String, u32>, committed: &Committed) -> Vec<(Change, u32)> {
        let records = committed.iter().map(|(n, (r, _))| (n.clone(), r.clone())).collect();
        self.inner.lock().unwrap().controller.preempted(self.now_s(), unix_now(), notice_s, lost, &records)
    }
}

/// Runs until `stop`: one tick per interval while this node leads.
pub async fn run(st: Arc<AppState>, stop: tokio::sync::watch::Receiver<bool>) {
    let interval = st.autoscale.interval;
    crate::leader_loop::every(st, interval, stop, "autoscaler", |st| st.autoscale.follow(), |st| async move {
        tick_once(&st).await
    })
    .await
}

/// The stored autoscaler specs (one that no longer parses is skipped with a warning).
pub fn specs(st: &AppState) -> Result<BTreeMap<String, AutoscalerSpec>, StoreError> {
    let mut out = BTreeMap::new();
    for r in st.node.local().list(Kind::Autoscalers.as_str()).map_err(StoreError::from)? {
        match serde_json::from_str(&r.value_json) {
            Ok(s) => {
                out.insert(r.name, s);
            }
            Err(e) => tracing::warn!(autoscaler = %r.name, error = %e, "stored autoscaler no longer parses; skipped"),
        }
    }
    Ok(out)
}

pub fn committed(st: &AppState) -> Result<Committed, StoreError> {
    let mut out = BTreeMap::new();
    for r in st.node.local().list(Kind::ScalingDecisions.as_str()).map_err(StoreError::from)? {
        if let Ok(d) = serde_json::from_str(&r.value_json) {
            out.insert(r.name, (d, r.revision));
        }
    }
    Ok(out)
}

/// Healthy registered endpoints per variant: the replicas that serve now.
fn ready(st: &AppState) -> Result<BTreeMap<String, u32>, StoreError> {
    let mut out = BTreeMap::new();
    for r in st.node.local().list(REGISTRATIONS).map_err(StoreError::from)? {
        if let Ok(reg) = serde_json::from_str::<Registration>(&r.value_json)
            && !reg.variant.is_empty()
        {
            *out.entry(reg.variant).or_insert(0) += u32::from(reg.healthy);
        }
    }
    Ok(out)
}

/// `(source, variant, counters)` from `/v1/proxies` items (one per sidecar per control node).
fn counters(items: &[Value]) -> Vec<(String, String, Counters)> {
    let mut out = Vec::new();
    for it in items {
        let source = format!("{}/{}", it["control_node"], it["node_id"].as_str().unwrap_or_default());
        let live = it["connected"] == Value::Bool(true);
        let Some(load) = it["load"].as_object() else { continue };
        for (variant, l) in load {
            if let Ok(l) = serde_json::from_value::<crate::reports::Load>(l.clone()) {
                let c = Counters {
                    requests: l.requests,
                    latency_ms_sum: l.latency_ms_sum,
                    in_flight: l.in_flight,
                    queued: l.queued,
                    live,
                };
                out.push((source.clone(), variant.clone(), c));
            }
        }
    }
    out
}

/// Writes `changes` (conditional on the revisions read, so a concurrent delete or a
/// preemption notice is not overwritten blindly: the next tick decides again).
pub async fn commit(st: &AppState, changes: &[Change], committed: &Committed) -> Result<u64, String> {
    let mut revision = 0;
    for c in changes {
        let value_json = serde_json::to_string(&c.record).map_err(|e| e.to_string())?;
        let expect = committed.get(&c.name).map_or(0, |(_, r)| *r);
        let cmd = Command::Put {
            kind: Kind::ScalingDecisions.as_str().into(),
            name: c.name.clone(),
            value_json,
            expect_revision: Some(expect),
        };
        revision = revision.max(st.node.write(cmd).await.map_err(|e| format!("committing {}: {e}", c.name))?);
    }
    Ok(revision)
}

async fn tick_once(st: &AppState) -> Result<(), String> {
    let specs = specs(st).map_err(|e| e.to_string())?;
    let committed = committed(st).map_err(|e| e.to_string())?;
    // Decisions of deleted autoscalers go too (no one would ever change them again).
    for (name, (_, revision)) in committed.iter().filter(|(n, _)| !specs.contains_key(*n)) {
        let cmd =
            Command::Delete { kind: Kind::ScalingDecisions.as_str().into(), name: name.clone(), expect_revision: Some(*revision) };
        st.node.write(cmd).await.map_err(|e| e.to_string())?;
    }
    if specs.is_empty() {
        let mut i = st.autoscale.inner.lock().unwrap();
        i.leading = true;
        i.statuses.clear();
        return Ok(());
    }
    let ready = ready(st).map_err(|e| e.to_string())?;
    let token = st.tokens.admin_token().and_then(|t| http::HeaderValue::from_str(&format!("Bearer {t}")).ok());
    let (items, unreachable) = crate::api::every_nodes_proxies(st, token.as_ref()).await;
    if !unreachable.is_empty() {
        tracing::debug!(?unreachable, "some control nodes did not report their sidecars' load");
    }
    let samples = counters(&items);
    let changes = {
        let mut i = st.autoscale.inner.lock().unwrap();
        i.leading = true;
        let now = st.autoscale.now_s();
        let Some(loads) = i.meter.observe(now, samples.iter().map(|(s, v, c)| (s.clone(), v.as_str(), c.clone()))) else {
            return Ok(()); // a rate needs a second reading
        };
        let records = committed.iter().map(|(n, (r, _))| (n.clone(), r.clone())).collect();
        let (statuses, changes) = i.controller.tick(now, unix_now(), &specs, &loads, &ready, &records);
        i.statuses = statuses;
        i.decided_at = Some(now);
        changes
    };
    if !changes.is_empty() {
        let revision = commit(st, &changes, &committed).await?;
        for c in &changes {
            tracing::info!(autoscaler = %c.name, replicas = c.record.replicas, on_demand = c.record.on_demand,
                spot = c.record.spot, reason = %c.record.reason, revision, "scaling decision committed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proxies_items_become_counters_per_sidecar_and_control_node() {
        let items = vec![
            json!({"node_id": "s1", "control_node": 1, "connected": true,
                "load": {"a": {"requests": 10, "errors": 0, "latency_ms_sum": 50.0, "in_flight": 2, "queued": 1}}}),
            json!({"node_id": "s1", "control_node": 2, "connected": false,
                "load": {"a": {"requests": 4, "errors": 1, "latency_ms_sum": 8.0}}}),
            json!({"node_id": "s2", "control_node": 2, "connected": true, "load": {}}),
        ];
        let c = counters(&items);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].0.as_str(), c[0].1.as_str(), c[0].2.requests, c[0].2.in_flight, c[0].2.live), ("1/s1", "a", 10, 2, true));
        assert_eq!((c[1].0.as_str(), c[1].2.requests, c[1].2.in_flight, c[1].2.live), ("2/s1", 4, 0, false));
    }
}

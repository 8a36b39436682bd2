//! The autoscaler's decision loop (the IO around `autoscaler::live`): on the Raft leader only,
//! every interval, read the `autoscalers`, gather the sidecars' load counters from every
//! control node (`GET /v1/proxies?scope=local` on each peer), decide, and commit the targets
//! that change what runs as `scalingdecisions/<name>` (pushed over xDS as
//! `weft.v1.ScalingDecision`). The last statuses are kept for `GET /v1/autoscale/status`.
//!
//! With a `placement` in its spec, an autoscaler's replicas are then placed: after each tick
//! the committed on-demand and spot counts become `placements/<autoscaler>-od-N` / `-spot-N`
//! through weft's scheduler (`autoscaler::placing` decides what to add and release), pushed
//! over xDS as `weft.v1.Placement` for the node agents to start.
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
use crate::autoscaler::placing::{self, Owned, Target};
use crate::autoscaler::spec::{AutoscalerSpec, DecisionRecord};
use crate::placements::{self as placements_logic, PlacementRecord};
use crate::scheduler::SchedulerConfig;
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
    /// Where each placing autoscaler's replicas stand after the last placement pass.
    placed: Mutex<BTreeMap<String, Placed>>,
    /// Spot nodes under a preemption notice, until when (seconds on this node's clock): no new
    /// replica goes there, and theirs are released first.
    doomed: Mutex<BTreeMap<String, f64>>,
}

/// How long after its notice a preempted node is still avoided (if nobody removed it from the
/// inventory by then, it is trusted again).
const DOOMED_FOR_S: f64 = 600.0;

/// An autoscaler's replicas as placed: what its decision wants, what is placed, and why the
/// rest is not.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Placed {
    pub want_on_demand: u32,
    pub want_spot: u32,
    pub on_demand: u32,
    pub spot: u32,
    /// Why replicas could not be placed (the scheduler's reasons), from the last pass.
    pub unplaced: Vec<String>,
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
            placed: Mutex::new(BTreeMap::new()),
            doomed: Mutex::new(BTreeMap::new()),
        }
    }

    /// Records a preemption notice for spot `node`, going in `notice_s` seconds.
    pub fn doom(&self, node: &str, notice_s: f64) {
        let until = self.now_s() + notice_s + DOOMED_FOR_S;
        self.doomed.lock().unwrap().insert(node.to_string(), until);
    }

    /// The nodes under a notice now.
    fn doomed_nodes(&self) -> std::collections::BTreeSet<String> {
        let now = self.now_s();
        let mut d = self.doomed.lock().unwrap();
        d.retain(|_, until| *until > now);
        d.keys().cloned().collect()
    }

    /// The placement state per autoscaler (those with a `placement` only).
    pub fn placed(&self) -> BTreeMap<String, Placed> {
        self.placed.lock().unwrap().clone()
    }

    pub fn now_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Forgets everything when this node stops leading (a later term starts afresh).
    fn follow(&self) {
        self.placed.lock().unwrap().clear();
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
        {
            let mut i = st.autoscale.inner.lock().unwrap();
            i.leading = true;
            i.statuses.clear();
        }
        return place(st, &specs).await;
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
    place(st, &specs).await
}

/// One placement pass: every autoscaler with a `placement` gets its committed replica counts
/// placed (and the replicas of autoscalers that were deleted or stopped placing are released).
/// Runs every tick, so a replica whose node left the inventory, or a placement deleted by
/// hand, is replaced on the next one.
async fn place(st: &AppState, specs: &BTreeMap<String, AutoscalerSpec>) -> Result<(), String> {
    let placing = specs.values().any(|s| s.placement.is_some());
    // Cheap check first (a local read, no lock): no placing autoscaler and nothing owned by one
    // means nothing to do.
    let owns_any = || -> Result<bool, String> {
        let list = st.node.local().list(Kind::Placements.as_str()).map_err(|e| e.to_string())?;
        Ok(list.iter().filter_map(|r| serde_json::from_str::<PlacementRecord>(&r.value_json).ok()).any(|p| owner(&p).is_some()))
    };
    if !placing && !owns_any()? {
        st.autoscale.placed.lock().unwrap().clear();
        return Ok(());
    }
    let _one_at_a_time = st.schedule.lock().await;
    let basis = crate::api::schedule::basis(st).await.map_err(|e| e.to_string())?;
    let decisions = committed(st).map_err(|e| e.to_string())?;
    let inventory: std::collections::BTreeSet<&str> = basis.nodes.iter().map(|n| n.name.as_str()).collect();
    let doomed = st.autoscale.doomed_nodes();
    let mut owned: BTreeMap<String, Vec<Owned>> = BTreeMap::new();
    for (name, rec, _) in &basis.committed {
        if let Some(a) = owner(rec) {
            let healthy = rec.allocations.iter().all(|x| inventory.contains(x.node.as_str()));
            let doomed = rec.allocations.iter().any(|x| doomed.contains(&x.node));
            owned.entry(a.to_string()).or_default().push(Owned { name: name.clone(), healthy, doomed });
        }
    }
    let mut names: Vec<&String> = specs.iter().filter(|(_, s)| s.placement.is_some()).map(|(n, _)| n).collect();
    names.extend(owned.keys().filter(|n| specs.get(*n).is_none_or(|s| s.placement.is_none())));
    let mut add = Vec::new();
    let mut release = Vec::new();
    let mut owner_of = BTreeMap::new();
    for name in names {
        let spec = specs.get(name);
        let target = Target {
            autoscaler: name,
            variant: spec.map_or("", |s| s.variant.as_str()),
            template: spec.and_then(|s| s.placement.as_ref()),
            want: decisions.get(name).map(|(d, _)| (d.on_demand, d.spot)),
        };
        let diff = placing::reconcile(&target, owned.get(name).map_or(&[][..], Vec::as_slice));
        for w in &diff.add {
            owner_of.insert(w.name().to_string(), name.clone());
        }
        add.extend(diff.add);
        release.extend(diff.remove);
    }
    let mut unplaced: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut placed = BTreeMap::new();
    if !add.is_empty() {
        let kept: Vec<(String, PlacementRecord)> =
            basis.committed.iter().filter(|(n, _, _)| !release.contains(n)).map(|(n, p, _)| (n.clone(), p.clone())).collect();
        // Nothing new goes to a node that is about to be taken back.
        let usable: Vec<_> = basis.nodes.iter().filter(|n| !doomed.contains(&n.name)).cloned().collect();
        if usable.is_empty() {
            for (w, a) in &owner_of {
                unplaced.entry(a.clone()).or_default().push(format!("{w}: no GPU inventory (create nodes: kind Node) outside preemption notices"));
            }
        } else {
            // Placements on a doomed node are left out of the scheduler, never evicted by it.
            let mut loaded = placements_logic::load(usable, &kept, SchedulerConfig::default())?;
            let committed_names = kept.iter().map(|(n, _)| n.clone()).collect();
            // Preemption evicts only strictly lower priorities (the template's `priority`).
            let d = placements_logic::decide(&mut loaded.scheduler, &add, &committed_names, true);
            for (name, mut rec) in d.placed {
                rec.owner = owner_of.get(&name).map(|a| placing::owner(a));
                placed.insert(name, rec);
            }
            release.extend(d.evicted);
            for u in d.unplaced {
                let a = owner_of.get(&u.workload).cloned().unwrap_or_default();
                unplaced.entry(a).or_default().push(format!("{}: {}", u.workload, u.reason));
            }
        }
    }
    let writes = crate::api::schedule::placement_writes(&basis, &placed, &release);
    if !writes.is_empty() {
        let n = writes.len();
        let revision = crate::api::schedule::write_all(st, writes).await.map_err(|e| e.to_string())?;
        tracing::info!(writes = n, revision, "autoscaler replicas placed and released");
    }
    record_placed(st, specs, &decisions, unplaced)
}

/// The autoscaler that placed `p`, if one did.
fn owner(p: &PlacementRecord) -> Option<&str> {
    p.owner.as_deref().and_then(placing::owning_autoscaler)
}

/// Counts each placing autoscaler's placements as now stored, per pool, for the status.
fn record_placed(
    st: &AppState,
    specs: &BTreeMap<String, AutoscalerSpec>,
    decisions: &Committed,
    mut unplaced: BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    let mut out: BTreeMap<String, Placed> = specs
        .iter()
        .filter(|(_, s)| s.placement.is_some())
        .map(|(n, _)| {
            let (od, spot) = decisions.get(n).map_or((0, 0), |(d, _)| (d.on_demand, d.spot));
            let p = Placed { want_on_demand: od, want_spot: spot, unplaced: unplaced.remove(n).unwrap_or_default(), ..Default::default() };
            (n.clone(), p)
        })
        .collect();
    for r in st.node.local().list(Kind::Placements.as_str()).map_err(|e| e.to_string())? {
        let Ok(rec) = serde_json::from_str::<PlacementRecord>(&r.value_json) else { continue };
        let Some(a) = owner(&rec) else { continue };
        let Some(p) = out.get_mut(a) else { continue };
        match placing::lane_of(a, &r.name) {
            Some(placing::Lane::OnDemand) => p.on_demand += 1,
            Some(placing::Lane::Spot) => p.spot += 1,
            None => {}
        }
    }
    *st.autoscale.placed.lock().unwrap() = out;
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

//! `GET /v1/autoscale/status` (what the leader's decision loop saw and decided, per
//! autoscaler) and `POST /v1/autoscale/preemption` (a spot preemption notice: critical
//! replicas replaced on on-demand at once). Both run on the leader (the gate forwards them),
//! where the decision loop lives.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::placements::PlacementRecord;
use crate::resources::Kind;
use crate::scheduler::workload::Workload;
use crate::store::StoreError;

/// `GET /v1/autoscale/status`: every autoscaler with its last status (demand, forecast, ready,
/// decision and why), the committed decision and, when it places its replicas, how many are
/// placed per pool and why the rest are not.
pub async fn status(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let specs = crate::scaling::specs(&st)?;
    let committed = crate::scaling::committed(&st)?;
    let (statuses, age) = st.autoscale.statuses();
    let placed = st.autoscale.placed();
    let items: Vec<Value> = specs
        .iter()
        .map(|(name, spec)| {
            let live = statuses.iter().find(|s| &s.name == name);
            json!({
                "name": name,
                "variant": spec.variant,
                "policy": spec.policy,
                "spec": spec,
                "status": live,
                "placement": placed.get(name),
                "committed": committed.get(name).map(|(d, rev)| json!({"decision": d, "revision": rev})),
            })
        })
        .collect();
    Ok(Json(json!({
        "leader": st.node.id(),
        "interval_s": st.autoscale.interval.as_secs_f64(),
        "decided_s_ago": age,
        "items": items,
    })))
}

/// A preemption notice: the spot `node` (its replicas, as placed by the scheduler) or
/// `replicas` spot replicas of `autoscaler` go after `notice_s` seconds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Notice {
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub autoscaler: Option<String>,
    #[serde(default)]
    pub replicas: Option<u32>,
    /// Seconds until the capacity goes (AWS gives 120, GCP 30).
    #[serde(default = "default_notice")]
    pub notice_s: f64,
    /// Training jobs on the node checkpoint this many steps past their furthest rank
    /// (default 5; make it cover the steps ranks run while the notice travels).
    #[serde(default)]
    pub checkpoint_after_steps: Option<u64>,
}

fn default_notice() -> f64 {
    120.0
}

fn unprocessable(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, message)
}

/// Spot replicas lost per autoscaler when `node` goes: the node's replica placements, by the
/// autoscalers of their variants.
fn lost_on_node(
    st: &AppState,
    node: &str,
    specs: &BTreeMap<String, crate::autoscaler::spec::AutoscalerSpec>,
) -> ApiResult<BTreeMap<String, u32>> {
    let sm = st.node.local();
    let Some(n) = sm.get(Kind::Nodes.as_str(), node).map_err(StoreError::from)? else {
        return Err(unprocessable("node", format!("no node {node:?} in the inventory (GET /v1/nodes)")));
    };
    let spec: crate::scheduler::inventory::NodeSpec =
        serde_json::from_str(&n.value_json).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    if spec.pool != crate::scheduler::inventory::Pool::Spot {
        return Err(unprocessable("node", format!("node {node:?} is not in the spot pool; only spot capacity is preempted")));
    }
    let mut lost = BTreeMap::new();
    for r in sm.list(Kind::Placements.as_str()).map_err(StoreError::from)? {
        let Ok(p) = serde_json::from_str::<PlacementRecord>(&r.value_json) else { continue };
        let Workload::Replica(rep) = &p.workload else { continue };
        let here = p.allocations.iter().filter(|a| a.node == node).count() as u32;
        if here == 0 {
            continue;
        }
        for (name, _) in specs.iter().filter(|(_, s)| s.variant == rep.variant) {
            *lost.entry(name.clone()).or_insert(0) += here;
        }
    }
    Ok(lost)
}

/// `POST /v1/autoscale/preemption`.
pub async fn preemption(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let notice: Notice = serde_json::from_slice(&body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body: {e}")))?;
    if !(notice.notice_s.is_finite() && notice.notice_s >= 0.0) {
        return Err(unprocessable("notice_s", format!("{} must be 0 or more seconds", notice.notice_s)));
    }
    st.node.linearize().await?;
    let specs = crate::scaling::specs(&st)?;
    let committed = crate::scaling::committed(&st)?;
    // Training workers on the node: their sidecars call the trainer's checkpoint hook, and the
    // whole gang checkpoints at a step a few past the furthest rank.
    let training = match &notice.node {
        Some(node) => {
            let after = notice.checkpoint_after_steps.unwrap_or(PREEMPTION_CHECKPOINT_STEPS);
            if !(1..=1_000_000).contains(&after) {
                return Err(unprocessable("checkpoint_after_steps", format!("{after} is not in 1..=1000000")));
            }
            preempt_training(&st, node, notice.notice_s, after).await?
        }
        None => Vec::new(),
    };
    let lost = match (&notice.node, &notice.autoscaler, notice.replicas) {
        (Some(node), None, None) => match lost_on_node(&st, node, &specs) {
            Err(_) if !training.is_empty() => BTreeMap::new(),
            other => {
                let lost = other?;
                // Placing autoscalers release this node's replicas first and place nothing there.
                st.autoscale.doom(node, notice.notice_s);
                lost
            }
        },
        (None, Some(name), Some(n)) => {
            if !specs.contains_key(name) {
                return Err(unprocessable("autoscaler", format!("no autoscaler {name:?}")));
            }
            BTreeMap::from([(name.clone(), n)])
        }
        (None, Some(_), None) => return Err(unprocessable("replicas", "give how many spot replicas go")),
        _ => return Err(unprocessable("node", "give either node, or autoscaler and replicas")),
    };
    let outcomes = st.autoscale.preempted(notice.notice_s, &lost, &committed);
    let changes: Vec<_> = outcomes.iter().map(|(c, _)| c.clone()).collect();
    let revision = crate::scaling::commit(&st, &changes, &committed)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e))?;
    let replaced: Vec<Value> = outcomes
        .iter()
        .map(|(c, on_demand)| {
            json!({
                "autoscaler": c.name,
                "variant": c.record.variant,
                "lost": lost.get(&c.name).copied().unwrap_or(0),
                "on_demand_started": on_demand,
                "decision": c.record,
            })
        })
        .collect();
    Ok(Json(json!({"revision": revision, "replaced": replaced, "training": training})))
}

/// Steps past the furthest rank at which a preempted gang checkpoints.
const PREEMPTION_CHECKPOINT_STEPS: u64 = 5;

/// Marks the training workers whose sidecars report `host == node` as draining in their jobs'
/// maps (their sidecars call the checkpoint hook within `notice_s`) and asks each such job for
/// a coordinated checkpoint a few steps ahead. Returns what was done per job.
async fn preempt_training(st: &AppState, node: &str, notice_s: f64, after_steps: u64) -> ApiResult<Vec<Value>> {
    let mut out = Vec::new();
    for (job, workers) in crate::training::workers(st).await {
        let here: Vec<String> = workers.values().filter(|w| w.host == node).map(|w| w.worker.clone()).collect();
        if here.is_empty() {
            continue;
        }
        let (map, revision) = crate::training::stored_map(st, &job)?;
        let Some(mut map) = map.filter(|m| m.completed.is_none()) else { continue };
        let members: Vec<String> = here.into_iter().filter(|w| map.ranks.iter().any(|r| &r.worker == w)).collect();
        if members.is_empty() {
            continue;
        }
        if let Some(f) = crate::shards::checkpoint::furthest(&map, &workers) {
            map.checkpoint_at = Some(f.saturating_add(after_steps));
        }
        for w in &members {
            if !map.draining.contains(w) {
                map.draining.push(w.clone());
            }
        }
        map.drain_deadline_ms = (notice_s * 1000.0) as u64;
        crate::training::put(st, Kind::ShardMaps, &job, &map, revision).await?;
        tracing::warn!(%job, ?members, checkpoint_at = ?map.checkpoint_at, "preemption notice: training workers draining, gang checkpoint requested");
        out.push(json!({"job": job, "draining": members, "checkpoint_at": map.checkpoint_at}));
    }
    Ok(out)
}

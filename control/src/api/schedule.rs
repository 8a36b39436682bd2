//! Scheduling endpoints: `POST /v1/schedule/plan` (dry run) and `POST /v1/schedule/apply`
//! (commit through Raft as `placements` resources, which the publisher pushes over xDS as
//! `weft.v1.Placement`). The decisions are `crate::placements`' pure logic; this is the IO.
//!
//! Both run on the leader (the leader gate forwards them) and read the committed inventory and
//! placements linearizably. Applies are serialized by a lock on the leader, and each write is
//! conditional (a new placement must not exist; an evicted one must still be at the revision
//! the plan saw), so two plans never book the same capacity through this node, and a change
//! that raced the plan makes the apply fail with 409 instead of over-committing.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::placements::{self, Decision, PlacementRecord};
use crate::resources::Kind;
use crate::scheduler::SchedulerConfig;
use crate::scheduler::inventory::NodeSpec;
use crate::scheduler::workload::{InferenceReplica, Workload};
use crate::store::{Command, StoreError};

/// The request body of both endpoints (also how `weftctl` checks a workloads file).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    pub workloads: Vec<Workload>,
    /// Plan on these nodes instead of the stored inventory (dry run only).
    #[serde(default)]
    pub nodes: Option<Vec<NodeSpec>>,
    /// Let higher-priority workloads evict strictly lower-priority ones.
    #[serde(default)]
    pub preempt: bool,
}

impl PlanRequest {
    /// Checks what the types alone do not: each replica's launch. The error's field is a path
    /// into the request (`workloads[2].launch.cluster`).
    pub fn validate(&self) -> Result<(), (String, String)> {
        self.workloads.iter().enumerate().try_for_each(|(i, w)| match w {
            Workload::Replica(InferenceReplica { launch: Some(launch), .. }) => launch.validate_under(&format!("workloads[{i}].launch")),
            _ => Ok(()),
        })
    }
}

fn parse(body: &Bytes) -> ApiResult<PlanRequest> {
    if body.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "the request body is empty; send {\"workloads\": [...]}"));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let req: PlanRequest = serde_path_to_error::deserialize(de).map_err(|e| {
        let status = if e.inner().is_syntax() || e.inner().is_eof() { StatusCode::BAD_REQUEST } else { StatusCode::UNPROCESSABLE_ENTITY };
        ApiError::field(status, &e.path().to_string(), e.inner())
    })?;
    req.validate().map_err(|(field, message)| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, &field, message))?;
    Ok(req)
}

/// What the plan was made against.
pub(crate) struct Basis {
    pub revision: u64,
    /// Stored placements: name, record, revision.
    pub committed: Vec<(String, PlacementRecord, u64)>,
    pub nodes: Vec<NodeSpec>,
}

/// Reads the stored inventory and placements (linearizable). Callers that write placements
/// from it hold `AppState::schedule` meanwhile.
pub(crate) async fn basis(st: &AppState) -> ApiResult<Basis> {
    st.node.linearize().await?;
    // One view: the inventory, the placements and the revision they are checked against agree.
    let sm = st.node.local().view().map_err(StoreError::from)?;
    let revision = sm.revision().map_err(StoreError::from)?;
    let mut nodes = Vec::new();
    for r in sm.list(Kind::Nodes.as_str()).map_err(StoreError::from)? {
        match serde_json::from_str::<NodeSpec>(&r.value_json) {
            Ok(n) => nodes.push(n),
            Err(e) => tracing::warn!(node = %r.name, error = %e, "stored node spec no longer parses; left out"),
        }
    }
    let mut committed = Vec::new();
    for r in sm.list(Kind::Placements.as_str()).map_err(StoreError::from)? {
        match serde_json::from_str::<PlacementRecord>(&r.value_json) {
            Ok(p) => committed.push((r.name.clone(), p, r.revision)),
            Err(e) => tracing::warn!(placement = %r.name, error = %e, "stored placement no longer parses; left out"),
        }
    }
    Ok(Basis { revision, committed, nodes })
}

fn decide(basis: &Basis, req: &PlanRequest, nodes: Vec<NodeSpec>) -> ApiResult<(Decision, Vec<String>)> {
    if nodes.is_empty() {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "nodes",
            "no GPU inventory: create nodes (PUT /v1/nodes/NAME or weftctl apply, kind: Node) or pass \"nodes\"",
        ));
    }
    let committed: Vec<(String, PlacementRecord)> = basis.committed.iter().map(|(n, p, _)| (n.clone(), p.clone())).collect();
    let mut loaded = placements::load(nodes, &committed, SchedulerConfig::default())
        .map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "nodes", e))?;
    let names: BTreeSet<String> = committed.into_iter().map(|(n, _)| n).collect();
    let decision = placements::decide(&mut loaded.scheduler, &req.workloads, &names, req.preempt);
    Ok((decision, loaded.warnings))
}

fn answer(d: &Decision, warnings: &[String], revision: u64, committed: bool) -> Value {
    let placed: Vec<Value> = d
        .placed
        .iter()
        .map(|(name, p)| json!({ "workload": name, "kind": kind_of(&p.workload), "allocations": p.allocations }))
        .collect();
    let unplaced: Vec<Value> = d
        .unplaced
        .iter()
        .map(|u| {
            let mut v = serde_json::to_value(u).unwrap_or(Value::Null);
            v["message"] = Value::String(u.reason.to_string());
            v
        })
        .collect();
    json!({
        "revision": revision,
        "committed": committed,
        "placed": placed,
        "evicted": d.evicted,
        "unplaced": unplaced,
        "warnings": warnings,
    })
}

fn kind_of(w: &Workload) -> &'static str {
    match w {
        Workload::Pod(_) => "pod",
        Workload::Replica(_) => "replica",
        Workload::Gang(_) => "gang",
    }
}

/// `POST /v1/schedule/plan`: where the workloads would go; writes nothing.
pub async fn plan(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let mut req = parse(&body)?;
    let basis = basis(&st).await?;
    let nodes = req.nodes.take().unwrap_or_else(|| basis.nodes.clone());
    let (decision, warnings) = decide(&basis, &req, nodes)?;
    Ok(Json(answer(&decision, &warnings, basis.revision, false)))
}

/// `POST /v1/schedule/apply`: plans on the stored inventory and commits the placements (and
/// the evictions of preempted placements).
pub async fn apply(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let req = parse(&body)?;
    if req.nodes.is_some() {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "nodes",
            "apply places on the stored inventory only; use /v1/schedule/plan to try other nodes",
        ));
    }
    let _one_at_a_time = st.schedule.lock().await;
    let basis = basis(&st).await?;
    let (decision, warnings) = decide(&basis, &req, basis.nodes.clone())?;
    let writes = placement_writes(&basis, &decision.placed, &decision.evicted);
    let revision = write_all(&st, writes).await?.max(basis.revision);
    Ok(Json(answer(&decision, &warnings, revision, true)))
}

/// The commands that store `placed` (each must be new) and delete `released` (each at the
/// revision `basis` read, so a placement changed meanwhile makes the write fail, not vanish).
pub(crate) fn placement_writes<'a>(
    basis: &Basis,
    placed: impl IntoIterator<Item = (&'a String, &'a PlacementRecord)>,
    released: impl IntoIterator<Item = &'a String>,
) -> Vec<Command> {
    let kind = || Kind::Placements.as_str().to_string();
    let mut writes: Vec<Command> = placed
        .into_iter()
        .map(|(name, p)| Command::Put {
            kind: kind(),
            name: name.clone(),
            value_json: serde_json::to_string(p).expect("placement records serialize"),
            expect_revision: Some(0),
        })
        .collect();
    for name in released {
        let revision = basis.committed.iter().find(|(n, _, _)| n == name).map(|(_, _, r)| *r);
        writes.push(Command::Delete { kind: kind(), name: name.clone(), expect_revision: revision });
    }
    writes
}

/// Commits `writes`, submitted together so the proposer commits them as one log entry when it
/// can; the highest revision written (0 for none).
pub(crate) async fn write_all(st: &AppState, writes: Vec<Command>) -> ApiResult<u64> {
    let pending: Vec<_> = writes
        .into_iter()
        .map(|w| {
            let node = st.node.clone();
            tokio::spawn(async move { node.write(w).await })
        })
        .collect();
    let mut revision = 0;
    for p in pending {
        let written = p.await.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("write task failed: {e}")))?;
        revision = revision.max(written?);
    }
    Ok(revision)
}

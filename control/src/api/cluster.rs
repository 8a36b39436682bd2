//! Cluster endpoints: members (list, add, remove), this node's status, the connected
//! sidecars' xDS status across all nodes, and the Raft RPCs peers send each other.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::BodyExt;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::store::{Member, NodeId, TypeConfig};

/// Refuses an RPC addressed to another node id (see `transport::TARGET_HEADER`).
fn check_target(st: &AppState, headers: &http::HeaderMap) -> ApiResult<()> {
    let target = headers.get(crate::transport::TARGET_HEADER).and_then(|v| v.to_str().ok());
    match target.map(str::parse::<NodeId>) {
        Some(Ok(t)) if t == st.node.id() => Ok(()),
        Some(Ok(t)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("this is node {}, not node {t}: the member's address is wrong", st.node.id()),
        )),
        _ => Err(ApiError::field(StatusCode::BAD_REQUEST, crate::transport::TARGET_HEADER, "missing or not a node id")),
    }
}

pub async fn raft_append(
    State(st): State<Arc<AppState>>,
    headers: http::HeaderMap,
    Json(req): Json<AppendEntriesRequest<TypeConfig>>,
) -> ApiResult<Json<Value>> {
    check_target(&st, &headers)?;
    Ok(Json(json!(st.node.raft().append_entries(req).await)))
}

pub async fn raft_vote(
    State(st): State<Arc<AppState>>,
    headers: http::HeaderMap,
    Json(req): Json<VoteRequest<NodeId>>,
) -> ApiResult<Json<Value>> {
    check_target(&st, &headers)?;
    Ok(Json(json!(st.node.raft().vote(req).await)))
}

pub async fn raft_snapshot(
    State(st): State<Arc<AppState>>,
    headers: http::HeaderMap,
    Json(req): Json<InstallSnapshotRequest<TypeConfig>>,
) -> ApiResult<Json<Value>> {
    check_target(&st, &headers)?;
    Ok(Json(json!(st.node.raft().install_snapshot(req).await)))
}

/// A write of control-plane bookkeeping (sidecar registrations) from another node, which
/// sent it here because this node leads. User resources never take this path: they are
/// validated by the resource API.
pub async fn internal_write(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<Json<Value>> {
    let cmd: crate::store::Command = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("command: {e}")))?;
    let kind = match &cmd {
        crate::store::Command::Put { kind, .. } | crate::store::Command::Delete { kind, .. } => kind.clone(),
    };
    if kind != crate::resources::REGISTRATIONS {
        return Err(ApiError::field(StatusCode::FORBIDDEN, "kind", format!("{kind:?} is not an internal kind")));
    }
    let revision = st.node.write(cmd).await?;
    Ok(Json(json!({ "revision": revision })))
}

pub async fn status(State(st): State<Arc<AppState>>) -> Json<Value> {
    let m = st.node.raft().metrics().borrow().clone();
    Json(json!({
        "id": st.node.id(),
        "role": format!("{:?}", m.state).to_lowercase(),
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "last_applied": m.last_applied.map(|l| l.index),
        "snapshot": m.snapshot.map(|l| l.index),
        "xds_revision": st.cache.snapshot().revision(),
        "history_revisions": st.node.history_revisions(),
    }))
}

pub async fn members(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!(st.node.members()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    id: NodeId,
    addr: String,
    #[serde(default)]
    xds_addr: String,
    #[serde(default = "yes")]
    voter: bool,
    /// The joining node's `--history-revisions` (sent by `--join`); checked against the
    /// leader's, since each member compacts its own history and `history`/`rollback` read the
    /// history of whichever member answers. Absent: not checked.
    #[serde(default)]
    history_revisions: Option<u64>,
}

fn yes() -> bool {
    true
}

/// How long adding a member waits for it to catch up with the log before answering 202.
const CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn add_member(State(st): State<Arc<AppState>>, body: Bytes) -> ApiResult<(StatusCode, Json<Value>)> {
    let b: AddMember = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("member: {e}")))?;
    if b.id == 0 {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "id", "node ids start at 1"));
    }
    for (field, addr) in [("addr", &b.addr), ("xds_addr", &b.xds_addr)] {
        if field == "addr" || !addr.is_empty() {
            crate::resources::check_address(field, addr)
                .map_err(|e| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, &e.field, &e.message))?;
        }
    }
    let keep = st.node.history_revisions();
    if let Some(theirs) = b.history_revisions.filter(|v| *v != keep) {
        return Err(ApiError::field(
            StatusCode::CONFLICT,
            "history_revisions",
            format!(
                "node {} runs with --history-revisions {theirs}, this cluster's leader with {keep}; give every member the same value",
                b.id
            ),
        ));
    }
    let view = st.node.members();
    if let Some(m) = view.members.iter().find(|m| m.addr == b.addr && m.id != b.id) {
        return Err(ApiError::field(
            StatusCode::CONFLICT,
            "addr",
            format!("{} is the address of member {}; two members cannot share one", b.addr, m.id),
        ));
    }
    if let Some(m) = view.members.iter().find(|m| m.id == b.id) {
        if m.addr == b.addr && m.voter == b.voter {
            return Ok((StatusCode::OK, Json(json!(view))));
        }
        if m.addr != b.addr {
            return Err(ApiError::field(
                StatusCode::CONFLICT,
                "id",
                format!("node {} is already a member at {}; remove it first", b.id, m.addr),
            ));
        }
    }
    let (id, addr) = (b.id, b.addr.clone());
    let adding = st.node.add_member(b.id, Member { addr: b.addr, xds_addr: b.xds_addr }, b.voter);
    match tokio::time::timeout(CATCH_UP_WAIT, adding).await {
        Ok(done) => done?,
        Err(_) => {
            // Accepted, not finished: it stays a learner (no vote, not in any quorum) until
            // the same request is repeated once the node runs and has caught up.
            let mut view = json!(st.node.members());
            view["pending"] = json!(format!(
                "node {id} was added as a learner but did not catch up within {CATCH_UP_WAIT:?} (is it running at {addr}?); repeat this request to make it a voter"
            ));
            return Ok((StatusCode::ACCEPTED, Json(view)));
        }
    }
    Ok((StatusCode::OK, Json(json!(st.node.members()))))
}

pub async fn remove_member(State(st): State<Arc<AppState>>, Path(id): Path<NodeId>) -> ApiResult<Json<Value>> {
    let view = st.node.members();
    let voters = view.members.iter().filter(|m| m.voter).count();
    if view.members.iter().any(|m| m.id == id && m.voter) && voters == 1 {
        return Err(ApiError::field(StatusCode::CONFLICT, "id", "cannot remove the last voter"));
    }
    st.node.remove_member(id).await?;
    Ok(Json(json!(st.node.members())))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProxiesQuery {
    /// `local`: only sidecars connected to this node (what peers ask each other).
    scope: Option<String>,
}

/// Sidecars connected to this node, as JSON items: those with an ADS stream, and those
/// that only report load (a report stream without ADS, e.g. a load generator's agent).
fn local_proxies(st: &AppState) -> Vec<Value> {
    let mut reports = st.reports.views();
    let mut items: Vec<Value> = st
        .cache
        .node_statuses()
        .into_iter()
        .map(|(node_id, s)| {
            let report = reports.remove(&node_id);
            let nack = s.nacked.iter().next_back().map(|(t, n)| json!({"type_url": t, "version": n.version, "error": n.error}));
            json!({
                "node_id": node_id,
                "control_node": st.node.id(),
                "connected": s.streams > 0,
                "disconnected_s": s.disconnected_at.map(|t| t.elapsed().as_secs()),
                "acked": s.acked,
                "nacks": s.nacked.iter().map(|(t, n)| (t.clone(), json!({"version": n.version, "error": n.error}))).collect::<serde_json::Map<_, _>>(),
                "nack": nack,
                "registration": report.as_ref().and_then(|r| r.registration.clone()),
                "phi": report.as_ref().and_then(|r| r.phi),
                "training": report.as_ref().and_then(|r| r.training.clone()),
                "identity": report.as_ref().and_then(|r| r.identity.clone()),
                "load": report.map(|r| r.load).unwrap_or_default(),
            })
        })
        .collect();
    // A sidecar gone for good (no stream for `FORGET_DISCONNECTED`) ages out of the list, as
    // its ADS status does.
    let forget = weft_xds::cache::FORGET_DISCONNECTED.as_millis() as u64;
    items.extend(reports.into_iter().filter(|(_, r)| r.disconnected_ms.is_none_or(|ms| ms < forget)).map(|(node_id, r)| {
        json!({
            "node_id": node_id,
            "control_node": st.node.id(),
            "connected": r.reporting,
            "disconnected_s": r.disconnected_ms.map(|ms| ms / 1000),
            "acked": {},
            "nacks": {},
            "nack": null,
            "registration": r.registration,
            "phi": r.phi,
            "training": r.training,
            "identity": r.identity,
            "load": r.load,
        })
    }));
    items
}

/// The sidecars of this node and of every peer that answers (`auth` is passed on), and the
/// peers that did not answer. A sidecar that failed over is listed by each node it reported to.
pub(crate) async fn every_nodes_proxies(st: &AppState, auth: Option<&http::HeaderValue>) -> (Vec<Value>, Vec<Value>) {
    let mut items = local_proxies(st);
    let mut unreachable = Vec::new();
    for m in st.node.members().members.into_iter().filter(|m| m.id != st.node.id()) {
        match peer_proxies(st, &m.addr, auth).await {
            Ok(more) => items.extend(more),
            Err(e) => unreachable.push(json!({"id": m.id, "addr": m.addr, "error": e})),
        }
    }
    (items, unreachable)
}

/// GET `/v1/proxies?scope=local` from a peer.
async fn peer_proxies(st: &AppState, addr: &str, auth: Option<&http::HeaderValue>) -> Result<Vec<Value>, String> {
    let v = peer_get(st, addr, "/v1/proxies?scope=local", auth).await?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// Every node's cumulative per-experiment-variant load, by node id (this node's included),
/// and the peers that did not answer.
pub(crate) async fn every_nodes_loads(
    st: &AppState,
    auth: Option<&http::HeaderValue>,
) -> (Vec<(u64, Vec<crate::reports::ExperimentLoad>)>, Vec<Value>) {
    let mut out = vec![(st.node.id(), st.reports.experiment_loads())];
    let mut unreachable = Vec::new();
    for m in st.node.members().members.into_iter().filter(|m| m.id != st.node.id()) {
        let got = peer_get(st, &m.addr, "/v1/load?scope=local", auth).await.and_then(|v| {
            serde_json::from_value::<Vec<crate::reports::ExperimentLoad>>(v["items"].clone()).map_err(|e| e.to_string())
        });
        match got {
            Ok(items) => out.push((m.id, items)),
            Err(e) => unreachable.push(json!({"id": m.id, "addr": m.addr, "error": e})),
        }
    }
    (out, unreachable)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LoadQuery {
    scope: Option<String>,
    /// Seconds of recent load (10..=300, whole 10 s buckets) instead of the totals.
    window: Option<u64>,
}

/// Merges per-node loads per (experiment, variant).
pub(crate) fn merge_loads(items: impl IntoIterator<Item = crate::reports::ExperimentLoad>) -> Vec<crate::reports::ExperimentLoad> {
    let mut merged: std::collections::BTreeMap<(String, String), crate::reports::ExperimentLoad> = Default::default();
    for l in items {
        match merged.get_mut(&(l.experiment.clone(), l.variant.clone())) {
            Some(m) => m.add(&l),
            None => {
                merged.insert((l.experiment.clone(), l.variant.clone()), l);
            }
        }
    }
    merged.into_values().collect()
}

/// `GET /v1/load`: per experiment variant, requests, errors and latency sketch reported to
/// this node (`?scope=local`) or to every node, merged (default): the totals since each node
/// started, or with `?window=S` the last S seconds (and `window_s`, the seconds covered).
pub async fn load(
    State(st): State<Arc<AppState>>,
    Query(q): Query<LoadQuery>,
    headers: http::HeaderMap,
) -> ApiResult<Json<Value>> {
    let local = |st: &AppState| match q.window {
        None => (st.reports.experiment_loads(), None),
        Some(w) => {
            let (items, covered) = st.reports.experiment_window(w);
            (items, Some(covered))
        }
    };
    match q.scope.as_deref() {
        Some("local") => {
            let (items, covered) = local(&st);
            Ok(Json(json!({"node": st.node.id(), "items": items, "window_s": covered})))
        }
        None | Some("cluster") if q.window.is_none() => {
            let (by_node, unreachable) = every_nodes_loads(&st, headers.get(http::header::AUTHORIZATION)).await;
            let items = merge_loads(by_node.into_iter().flat_map(|(_, items)| items));
            Ok(Json(json!({"items": items, "unreachable": unreachable})))
        }
        None | Some("cluster") => {
            let (mut items, covered) = local(&st);
            let path = format!("/v1/load?scope=local&window={}", q.window.unwrap_or(60));
            let auth = headers.get(http::header::AUTHORIZATION);
            let mut unreachable = Vec::new();
            for m in st.node.members().members.into_iter().filter(|m| m.id != st.node.id()) {
                let got = peer_get(&st, &m.addr, &path, auth).await.and_then(|v| {
                    serde_json::from_value::<Vec<crate::reports::ExperimentLoad>>(v["items"].clone()).map_err(|e| e.to_string())
                });
                match got {
                    Ok(more) => items.extend(more),
                    Err(e) => unreachable.push(json!({"id": m.id, "addr": m.addr, "error": e})),
                }
            }
            Ok(Json(json!({"items": merge_loads(items), "window_s": covered, "unreachable": unreachable})))
        }
        Some(other) => Err(ApiError::field(StatusCode::BAD_REQUEST, "scope", format!("{other:?} is not local or cluster"))),
    }
}

/// GET `path` from a peer's API, as JSON.
async fn peer_get(st: &AppState, addr: &str, path: &str, auth: Option<&http::HeaderValue>) -> Result<Value, String> {
    let mut b = http::Request::get(path);
    if let Some(a) = auth {
        b = b.header(http::header::AUTHORIZATION, a.clone());
    }
    let (parts, _) = b.body(()).map_err(|e| e.to_string())?.into_parts();
    let resp = st.peers.forward(addr, None, &parts, Bytes::new()).await?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// Every sidecar connected to any node. A sidecar seen by several nodes (it failed over) is
/// listed once, preferring the node it is connected to now.
pub async fn proxies(
    State(st): State<Arc<AppState>>,
    Query(q): Query<ProxiesQuery>,
    headers: http::HeaderMap,
) -> ApiResult<Json<Value>> {
    let (items, unreachable) = match q.scope.as_deref() {
        Some("local") => (local_proxies(&st), vec![]),
        None | Some("cluster") => every_nodes_proxies(&st, headers.get(http::header::AUTHORIZATION)).await,
        Some(other) => {
            return Err(ApiError::field(StatusCode::BAD_REQUEST, "scope", format!("{other:?} is not local or cluster")));
        }
    };
    let mut by_node: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
    for it in items {
        let id = it["node_id"].as_str().unwrap_or_default().to_owned();
        let keep = match by_node.get(&id) {
            None => true,
            Some(old) => it["connected"] == json!(true) && old["connected"] != json!(true),
        };
        if keep {
            by_node.insert(id, it);
        }
    }
    Ok(Json(json!({ "items": by_node.into_values().collect::<Vec<_>>(), "unreachable": unreachable })))
}

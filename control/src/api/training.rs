//! `GET /v1/training/{job}` (the job, its current shard map per rank, each worker's trainer as
//! its sidecar reports it, and the complete checkpoints) and
//! `POST /v1/training/{job}/scale` (`{"workers": N}`: a conditional write of the job's worker
//! count; the leader computes the next map within a second), and
//! `POST /v1/training/{job}/checkpoint` (a coordinated checkpoint a few steps ahead).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use bytes::Bytes;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState};
use crate::resources::Kind;
use crate::shards::job::JobSpec;
use crate::store::StoreError;

fn job(st: &AppState, name: &str) -> ApiResult<(JobSpec, u64)> {
    let Some(r) = st.node.local().get(Kind::TrainingJobs.as_str(), name).map_err(StoreError::from)? else {
        return Err(ApiError::field(StatusCode::NOT_FOUND, "name", format!("trainingjobs/{name} does not exist")));
    };
    let spec = serde_json::from_str(&r.value_json).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok((spec, r.revision))
}

/// `GET /v1/training/{job}`.
pub async fn status(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    st.node.linearize().await?;
    let (spec, revision) = job(&st, &name)?;
    let (map, map_revision) = crate::training::stored_map(&st, &name)?;
    let current = map.as_ref().is_some_and(|m| m.job_revision == revision);
    let (checkpoints, _) = crate::training::stored_checkpoints(&st, &name)?;
    let workers = crate::training::workers(&st).await.remove(&name).unwrap_or_default();
    Ok(Json(json!({
        "job": name,
        "revision": revision,
        "workers": spec.workers,
        "shards": spec.shard_sizes.len(),
        "global_batch": spec.global_batch,
        "map": map,
        "map_revision": map_revision,
        // False while the leader computes the map of a changed job.
        "map_current": current,
        "completed": map.as_ref().is_some_and(|m| m.completed.is_some()),
        "checkpoints": checkpoints,
        "trainers": workers,
    })))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointNow {
    /// How many steps past the furthest rank the barrier goes (default 5): far enough that
    /// every rank sees the map before it gets there.
    pub after_steps: Option<u64>,
}

/// `POST /v1/training/{job}/checkpoint`: the control plane picks a barrier step k a few steps
/// past the furthest rank of the current map and pushes it in the map; every rank
/// checkpoints at k, and the checkpoint completes like the periodic ones.
pub async fn checkpoint(State(st): State<Arc<AppState>>, Path(name): Path<String>, body: Bytes) -> ApiResult<Json<Value>> {
    let req: CheckpointNow = if body.is_empty() {
        CheckpointNow::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "after_steps", format!("body: {e}")))?
    };
    let after = req.after_steps.unwrap_or(5);
    if !(1..=1_000_000).contains(&after) {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "after_steps", format!("{after} is not in 1..=1000000")));
    }
    st.node.linearize().await?;
    job(&st, &name)?;
    let (map, map_revision) = crate::training::stored_map(&st, &name)?;
    let Some(mut map) = map else {
        return Err(ApiError::field(StatusCode::CONFLICT, "name", format!("trainingjobs/{name} has no shard map yet")));
    };
    if map.completed.is_some() {
        return Err(ApiError::field(StatusCode::CONFLICT, "name", format!("trainingjobs/{name} is completed")));
    }
    let trainers = crate::training::workers(&st).await.remove(&name).unwrap_or_default();
    let Some(furthest) = crate::shards::checkpoint::furthest(&map, &trainers) else {
        return Err(ApiError::field(
            StatusCode::CONFLICT,
            "name",
            format!("no rank of trainingjobs/{name} has acknowledged map version {} yet", map.version),
        ));
    };
    let step = furthest.saturating_add(after);
    map.checkpoint_at = Some(step);
    let revision = crate::training::put(&st, Kind::ShardMaps, &name, &map, map_revision).await?;
    Ok(Json(json!({"job": name, "map_version": map.version, "step": step, "furthest_rank_step": furthest, "revision": revision})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    pub workers: u32,
}

/// `POST /v1/training/{job}/scale`.
pub async fn scale(State(st): State<Arc<AppState>>, Path(name): Path<String>, body: Bytes) -> ApiResult<Json<Value>> {
    let req: Scale = serde_json::from_slice(&body).map_err(|e| ApiError::field(StatusCode::BAD_REQUEST, "workers", format!("body: {e}")))?;
    st.node.linearize().await?;
    let (mut spec, revision) = job(&st, &name)?;
    spec.workers = req.workers;
    spec.validate().map_err(|(f, e)| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, f, e))?;
    let value = serde_json::to_value(&spec).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    super::write_spec(&st, Kind::TrainingJobs, &name, &value, Some(revision), false, false).await
}

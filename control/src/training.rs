//! Training jobs' shard maps (the IO around `shards::job`): on the Raft leader, every
//! [`INTERVAL`], every `trainingjobs/<job>` whose map was computed from an older revision of
//! the job (or has none) gets its next map, moving as few shards as possible from the previous
//! one, written as `shardmaps/<job>` (pushed over xDS as `weft.v1.ShardMap`); maps of deleted
//! jobs go. `POST /v1/training/{job}/scale` changes the worker count (a conditional write of
//! the job), which the next pass turns into a map.

use std::sync::Arc;
use std::time::Duration;

use crate::api::AppState;
use crate::resources::Kind;
use crate::shards::job::{JobSpec, ShardMapRecord, next_map};
use crate::store::{Command, StoreError};

/// Between two passes.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// The stored map of `job` and its revision (0 = none).
pub fn stored_map(st: &AppState, job: &str) -> Result<(Option<ShardMapRecord>, u64), StoreError> {
    let r = st.node.local().get(Kind::ShardMaps.as_str(), job).map_err(StoreError::from)?;
    Ok(match r {
        Some(r) => (serde_json::from_str(&r.value_json).ok(), r.revision),
        None => (None, 0),
    })
}

async fn pass(st: Arc<AppState>) -> Result<(), String> {
    let sm = st.node.local();
    let jobs = sm.list(Kind::TrainingJobs.as_str()).map_err(|e| e.to_string())?;
    for j in &jobs {
        let (prev, map_revision) = stored_map(&st, &j.name).map_err(|e| e.to_string())?;
        if prev.as_ref().is_some_and(|m| m.job_revision == j.revision) {
            continue;
        }
        let spec: JobSpec = match serde_json::from_str(&j.value_json) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(job = %j.name, error = %e, "stored training job no longer parses; skipped");
                continue;
            }
        };
        let map = match next_map(&j.name, &spec, j.revision, prev.as_ref()) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(job = %j.name, error = %e, "no shard map for this job");
                continue;
            }
        };
        let value_json = serde_json::to_string(&map).map_err(|e| e.to_string())?;
        let cmd = Command::Put {
            kind: Kind::ShardMaps.as_str().into(),
            name: j.name.clone(),
            value_json,
            expect_revision: Some(map_revision),
        };
        st.node.write(cmd).await.map_err(|e| format!("storing shardmaps/{}: {e}", j.name))?;
        tracing::info!(job = %j.name, version = map.version, workers = map.workers, moved = map.moved, "shard map committed");
    }
    for m in sm.list(Kind::ShardMaps.as_str()).map_err(|e| e.to_string())? {
        if !jobs.iter().any(|j| j.name == m.name) {
            let cmd = Command::Delete { kind: Kind::ShardMaps.as_str().into(), name: m.name.clone(), expect_revision: Some(m.revision) };
            st.node.write(cmd).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Runs until `stop`: one pass per interval while this node leads.
pub async fn run(st: Arc<AppState>, stop: tokio::sync::watch::Receiver<bool>) {
    crate::leader_loop::every(st, INTERVAL, stop, "shard map", |_| {}, pass).await
}

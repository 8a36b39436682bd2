//! Training jobs on the Raft leader (the IO around `shards::job` and `shards::checkpoint`).
//! Every [`INTERVAL`], per `trainingjobs/<job>`:
//!
//! 1. **Checkpoints.** The training sidecars' reports are gathered from every control node
//!    (`GET /v1/proxies?scope=local`). When every rank of the current map reported a
//!    checkpoint at one step newer than the last complete one, its manifest is committed to
//!    `checkpoints/<job>`. A manifest of the job's last step marks the map completed.
//! 2. **Fault detector.** A member whose trainer went silent for `dead_after_s` (or never
//!    showed up within `start_grace_s`) is declared dead: the job's worker count drops by the
//!    dead (a conditional write of the job, so history shows it) and the next map leaves them
//!    out, resuming every rank from the last complete checkpoint. If the smaller count would
//!    not fit the model layout, the dead are replaced by fresh workers instead.
//! 3. **Rescale.** A job whose spec changed (`POST /v1/training/{job}/scale`) gets its next map
//!    once a checkpoint newer than the request completed (the switch then loses at most the
//!    steps ranks ran past it), or after `rescale_wait_s` from the last complete one.
//!
//! Maps are `shardmaps/<job>`, pushed over xDS as `weft.v1.ShardMap`; maps and checkpoints of
//! deleted jobs go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::AppState;
use crate::resources::Kind;
use crate::shards::checkpoint::{CheckpointRecord, Deadlines, WorkerState, complete, dead, freshest};
use crate::shards::job::{JobSpec, ShardMapRecord, next_map};
use crate::store::{Command, StoreError};

/// Between two passes.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// The leader's memory of training jobs (forgotten when it stops leading).
pub struct Training {
    started: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (job, worker) → when this node first saw the worker as a member (ms).
    member_since: BTreeMap<(String, String), u64>,
    /// job → the rescale waiting for a fresh checkpoint.
    pending: BTreeMap<String, Pending>,
}

struct Pending {
    job_revision: u64,
    since_ms: u64,
    /// The last complete step when the rescale was asked for.
    after: Option<u64>,
}

impl Default for Training {
    fn default() -> Self {
        Training { started: Instant::now(), inner: Mutex::new(Inner::default()) }
    }
}

impl Training {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn forget(&self) {
        *self.inner.lock().unwrap() = Inner::default();
    }
}

/// The stored map of `job` and its revision (0 = none).
#[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
pub fn stored_map(st: &AppState, job: &str) -> Result<(Option<ShardMapRecord>, u64), StoreError> {
    stored(st, Kind::ShardMaps, job)
}

/// The stored checkpoints of `job` and their revision (0 = none).
#[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
pub fn stored_checkpoints(st: &AppState, job: &str) -> Result<(CheckpointRecord, u64), StoreError> {
    let (r, rev) = stored(st, Kind::Checkpoints, job)?;
    Ok((r.unwrap_or_default(), rev))
}

#[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
fn stored<T: serde::de::DeserializeOwned>(st: &AppState, kind: Kind, name: &str) -> Result<(Option<T>, u64), StoreError> {
    let r = st.node.local().get(kind.as_str(), name).map_err(StoreError::from)?;
    Ok(match r {
        Some(r) => (serde_json::from_str(&r.value_json).ok(), r.revision),
        None => (None, 0),
    })
}

/// What every control node's training sidecars last reported, freshest per worker, by job.
pub async fn workers(st: &AppState) -> BTreeMap<String, BTreeMap<String, WorkerState>> {
    let token = st.tokens.admin_token().and_then(|t| http::HeaderValue::from_str(&format!("Bearer {t}")).ok());
    let (items, unreachable) = crate::api::every_nodes_proxies(st, token.as_ref()).await;
    if !unreachable.is_empty() {
        tracing::debug!(?unreachable, "some control nodes did not report their training sidecars");
    }
    let all = freshest(items.iter().filter_map(|it| serde_json::from_value::<WorkerState>(it["training"].clone()).ok()));
    let mut out: BTreeMap<String, BTreeMap<String, WorkerState>> = BTreeMap::new();
    for (w, s) in all {
        out.entry(s.job.clone()).or_default().insert(w, s);
    }
    out
}

/// Writes `value` as `<kind>/<name>`, conditional on `expect` (its revision when read).
#[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
pub async fn put<T: serde::Serialize>(st: &AppState, kind: Kind, name: &str, value: &T, expect: u64) -> Result<u64, StoreError> {
    let value_json = serde_json::to_string(value).expect("training records serialize");
    let cmd = Command::Put { kind: kind.as_str().into(), name: name.into(), value_json, expect_revision: Some(expect) };
    st.node.write(cmd).await
}

async fn pass(st: Arc<AppState>) -> Result<(), String> {
    let sm = st.node.local();
    let jobs = sm.list(Kind::TrainingJobs.as_str()).map_err(|e| e.to_string())?;
    let reports = if jobs.is_empty() { BTreeMap::new() } else { workers(&st).await };
    let none = BTreeMap::new();
    for j in &jobs {
        let spec: JobSpec = match serde_json::from_str(&j.value_json) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(job = %j.name, error = %e, "stored training job no longer parses; skipped");
                continue;
            }
        };
        let w = reports.get(&j.name).unwrap_or(&none);
        if let Err(e) = job_pass(&st, &j.name, &spec, j.revision, w).await {
            tracing::warn!(job = %j.name, error = %e, "training pass failed; retrying");
        }
    }
    for kind in [Kind::ShardMaps, Kind::Checkpoints] {
        for m in sm.list(kind.as_str()).map_err(|e| e.to_string())? {
            if !jobs.iter().any(|j| j.name == m.name) {
                let cmd = Command::Delete { kind: kind.as_str().into(), name: m.name.clone(), expect_revision: Some(m.revision) };
                st.node.write(cmd).await.map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// One job: checkpoints, then dead members, then a requested rescale.
async fn job_pass(
    st: &AppState,
    name: &str,
    spec: &JobSpec,
    revision: u64,
    workers: &BTreeMap<String, WorkerState>,
) -> Result<(), String> {
    let (prev, mut map_rev) = stored_map(st, name).map_err(|e| e.to_string())?;
    let (mut ck, ck_rev) = stored_checkpoints(st, name).map_err(|e| e.to_string())?;
    let now = st.training.now_ms();
    if let Some(map) = &prev {
        if map.completed.is_some() {
            return Ok(()); // finished: nothing to detect or rescale
        }
        if let Some(m) = complete(map, workers, ck.last.as_ref().map(|l| l.step)) {
            tracing::info!(job = %name, step = m.step, map = m.map_version, ranks = m.parts.len(), r#final = m.r#final, "checkpoint complete");
            let is_final = m.r#final;
            ck.push(m.clone());
            put(st, Kind::Checkpoints, name, &ck, ck_rev).await.map_err(|e| e.to_string())?;
            if is_final {
                let done = ShardMapRecord { completed: Some(m), ..map.clone() };
                put(st, Kind::ShardMaps, name, &done, map_rev).await.map_err(|e| e.to_string())?;
                tracing::info!(job = %name, "training job completed");
                return Ok(());
            }
        }
    }
    let map = match &prev {
        Some(m) if m.job_revision == revision => m,
        _ => {
            if let Some(p) = &prev
                && !rescale_ready(st, name, spec, revision, p, workers, ck.last.as_ref().map(|l| l.step), now)
            {
                return Ok(());
            }
            let mut next = next_map(name, spec, revision, prev.as_ref(), &BTreeSet::new())?;
            next.resume = ck.last.clone();
            put(st, Kind::ShardMaps, name, &next, map_rev).await.map_err(|e| e.to_string())?;
            st.training.inner.lock().unwrap().pending.remove(name);
            tracing::info!(job = %name, version = next.version, workers = next.workers, moved = next.moved,
                resume = ?next.resume.as_ref().map(|m| m.step), "shard map committed");
            return Ok(());
        }
    };
    // The fault detector.
    let member_for: BTreeMap<String, u64> = {
        let mut i = st.training.inner.lock().unwrap();
        i.member_since.retain(|(job, w), _| job != name || map.ranks.iter().any(|r| &r.worker == w));
        map.ranks
            .iter()
            .map(|r| {
                let since = *i.member_since.entry((name.to_owned(), r.worker.clone())).or_insert(now);
                (r.worker.clone(), now - since)
            })
            .collect()
    };
    let deadlines = Deadlines {
        dead_after_ms: (spec.dead_after_s * 1000.0) as u64,
        start_grace_ms: (spec.start_grace_s * 1000.0) as u64,
    };
    let gone = dead(map, workers, &member_for, deadlines);
    if gone.is_empty() {
        return Ok(());
    }
    let alive = map.workers.saturating_sub(gone.len() as u32);
    let mut smaller = spec.clone();
    smaller.workers = alive;
    let (spec, revision) = if alive >= 1 && smaller.validate().is_ok() {
        let rev = put(st, Kind::TrainingJobs, name, &smaller, revision).await.map_err(|e| e.to_string())?;
        (smaller, rev)
    } else {
        (spec.clone(), revision) // replaced by fresh workers instead
    };
    let dead_set: BTreeSet<String> = gone.iter().cloned().collect();
    let mut next = next_map(name, &spec, revision, Some(map), &dead_set)?;
    next.resume = ck.last.clone();
    map_rev = put(st, Kind::ShardMaps, name, &next, map_rev).await.map_err(|e| e.to_string())?;
    tracing::warn!(job = %name, dead = ?gone, workers = next.workers, version = next.version, map_revision = map_rev,
        resume = ?next.resume.as_ref().map(|m| m.step), "training workers declared dead; next map resumes from the last complete checkpoint");
    Ok(())
}

/// Whether a requested rescale of `name` may switch maps now: a checkpoint newer than the
/// request completed, the wait ran out, or no rank of the current map is running anyway.
#[allow(clippy::too_many_arguments)]
fn rescale_ready(
    st: &AppState,
    name: &str,
    spec: &JobSpec,
    revision: u64,
    current: &ShardMapRecord,
    workers: &BTreeMap<String, WorkerState>,
    last: Option<u64>,
    now: u64,
) -> bool {
    let running = current.ranks.iter().any(|r| workers.get(&r.worker).is_some_and(|w| w.trainer_seen));
    if !running {
        return true;
    }
    let mut i = st.training.inner.lock().unwrap();
    let p = i.pending.entry(name.to_owned()).or_insert(Pending { job_revision: revision, since_ms: now, after: last });
    if p.job_revision != revision {
        *p = Pending { job_revision: revision, since_ms: now, after: last };
    }
    let fresh = last.is_some_and(|l| p.after.is_none_or(|a| l > a));
    let waited = now - p.since_ms >= (spec.rescale_wait_s * 1000.0) as u64;
    if !fresh && !waited {
        tracing::debug!(job = %name, "rescale waits for a fresh complete checkpoint");
    }
    fresh || waited
}

/// Runs until `stop`: one pass per interval while this node leads.
pub async fn run(st: Arc<AppState>, stop: tokio::sync::watch::Receiver<bool>) {
    crate::leader_loop::every(st, INTERVAL, stop, "training", |st| st.training.forget(), pass).await
}

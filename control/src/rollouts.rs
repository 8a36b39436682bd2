//! The rollout engine (the IO around `experiments::rollout`): on the Raft leader, every
//! interval, for every `rollouts/<experiment>` resource: read the per-experiment-variant load
//! every control node summed from its sidecars' reports (`GET /v1/load?scope=local`),
//! difference it per node into the load since the last reading, advance the rollout's state
//! machine, write the experiment's new weights when the candidate moves, and store the state
//! (`rolloutstates/<experiment>`) with its evidence: on every phase or weight change, and at
//! least every [`SAVE_EVERY`] otherwise, so a new leader resumes from recent counts.
//! `weftctl history rolloutstates NAME` shows every decision and why.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::api::AppState;
use crate::experiments::rollout::{ArmDelta, RolloutSpec, RolloutState};
use crate::reports::ExperimentLoad;
use crate::resources::Kind;
use crate::store::{Command, StoreError};

/// Default interval between readings.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// The longest a changed state waits before it is stored.
pub const SAVE_EVERY: Duration = Duration::from_secs(30);

/// The engine's memory on this node (used while it leads).
pub struct Engine {
    pub interval: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Last cumulative reading per (control node, experiment, variant).
    last: HashMap<(u64, String, String), ExperimentLoad>,
    /// Unsaved states (ahead of the stored ones) and when each was last saved.
    pending: BTreeMap<String, (RolloutState, Instant)>,
    leading: bool,
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Engine {
    pub fn new(interval: Duration) -> Self {
        Engine { interval, inner: Mutex::new(Inner::default()) }
    }

    fn follow(&self) {
        let mut i = self.inner.lock().unwrap();
        if i.leading {
            *i = Inner::default();
        }
    }

    /// Per (experiment, variant), the load since the previous call, from every node's
    /// cumulative readings (a node seen for the first time, or whose counters went back because
    /// it restarted, contributes from its next reading).
    fn deltas(&self, by_node: Vec<(u64, Vec<ExperimentLoad>)>) -> HashMap<(String, String), ArmDelta> {
        let mut i = self.inner.lock().unwrap();
        i.leading = true;
        let mut out: HashMap<(String, String), ArmDelta> = HashMap::new();
        for (node, items) in by_node {
            for l in items {
                let key = (node, l.experiment.clone(), l.variant.clone());
                if let Some(prev) = i.last.get(&key)
                    && l.requests >= prev.requests
                {
                    let d = out.entry((l.experiment.clone(), l.variant.clone())).or_default();
                    d.requests += l.requests - prev.requests;
                    d.errors += l.errors.saturating_sub(prev.errors);
                    d.latency.merge(&l.latency.since(&prev.latency));
                }
                i.last.insert(key, l);
            }
        }
        out
    }

    /// The state to continue from: this leader's unsaved one, else the stored one.
    fn current(&self, name: &str, stored: Option<RolloutState>) -> Option<RolloutState> {
        self.inner.lock().unwrap().pending.get(name).map(|(s, _)| s.clone()).or(stored)
    }

    /// Forgets the unsaved state of `name` (after an operator's write, or its deletion).
    pub fn forget(&self, name: &str) {
        self.inner.lock().unwrap().pending.remove(name);
    }
}

fn specs(st: &AppState) -> Result<BTreeMap<String, RolloutSpec>, StoreError> {
    let mut out = BTreeMap::new();
    for r in st.node.local().list(Kind::Rollouts.as_str()).map_err(StoreError::from)? {
        match serde_json::from_str(&r.value_json) {
            Ok(s) => {
                out.insert(r.name, s);
            }
            Err(e) => tracing::warn!(rollout = %r.name, error = %e, "stored rollout no longer parses; skipped"),
        }
    }
    Ok(out)
}

/// The stored state of rollout `name` and its revision.
pub fn stored_state(st: &AppState, name: &str) -> Result<(Option<RolloutState>, u64), StoreError> {
    let r = st.node.local().get(Kind::RolloutStates.as_str(), name).map_err(StoreError::from)?;
    Ok(match r {
        Some(r) => (serde_json::from_str(&r.value_json).ok(), r.revision),
        None => (None, 0),
    })
}

/// Writes the candidate's and the baseline's weights for `weight` percent of candidate.
pub async fn set_weight(st: &AppState, spec: &RolloutSpec, experiment: &str, weight: u32) -> Result<(), String> {
    let weights = BTreeMap::from([(spec.candidate.clone(), weight), (spec.baseline.clone(), 100 - weight.min(100))]);
    crate::api::set_experiment_weights(st, experiment, &weights, None, false)
        .await
        .map(|_| ())
        .map_err(|e| format!("setting the weights of {experiment}: {e:?}"))
}

/// Stores `state` (conditional on the revision read).
pub async fn save(st: &AppState, name: &str, state: &RolloutState, revision: u64) -> Result<u64, String> {
    let value_json = serde_json::to_string(state).map_err(|e| e.to_string())?;
    let cmd = Command::Put {
        kind: Kind::RolloutStates.as_str().into(),
        name: name.into(),
        value_json,
        expect_revision: Some(revision),
    };
    st.node.write(cmd).await.map_err(|e| format!("storing rolloutstates/{name}: {e}"))
}

/// Runs until `stop`: one reading per interval while this node leads.
pub async fn run(st: std::sync::Arc<AppState>, stop: tokio::sync::watch::Receiver<bool>) {
    let interval = st.rollouts.interval;
    crate::leader_loop::every(st, interval, stop, "rollout engine", |st| st.rollouts.follow(), |st| async move {
        tick_once(&st).await
    })
    .await
}

async fn tick_once(st: &AppState) -> Result<(), String> {
    let specs = specs(st).map_err(|e| e.to_string())?;
    let token = st.tokens.admin_token().and_then(|t| http::HeaderValue::from_str(&format!("Bearer {t}")).ok());
    let (by_node, _unreachable) = crate::api::every_nodes_loads(st, token.as_ref()).await;
    let mut deltas = st.rollouts.deltas(by_node);
    for (name, spec) in &specs {
        let (stored, revision) = stored_state(st, name).map_err(|e| e.to_string())?;
        let now = now_ms();
        let Some(mut state) = st.rollouts.current(name, stored.clone()) else {
            let state = RolloutState::start(spec, now);
            set_weight(st, spec, name, state.weight).await?;
            save(st, name, &state, revision).await?;
            tracing::info!(rollout = %name, weight = state.weight, "rollout started");
            continue;
        };
        let base = deltas.remove(&(name.clone(), spec.baseline.clone())).unwrap_or_default();
        let cand = deltas.remove(&(name.clone(), spec.candidate.clone())).unwrap_or_default();
        let before = (state.phase, state.weight);
        let moved = state.advance(spec, now, &base, &cand);
        if let Some(w) = moved {
            set_weight(st, spec, name, w).await?;
        }
        let changed = before != (state.phase, state.weight);
        let due = st.rollouts.inner.lock().unwrap().pending.get(name).is_none_or(|(_, at)| at.elapsed() >= SAVE_EVERY);
        if changed || due {
            save(st, name, &state, revision).await?;
            st.rollouts.inner.lock().unwrap().pending.insert(name.clone(), (state.clone(), Instant::now()));
            if changed {
                tracing::info!(rollout = %name, phase = ?state.phase, weight = state.weight, reason = %state.reason, "rollout decision");
            }
        } else {
            let mut i = st.rollouts.inner.lock().unwrap();
            let saved_at = i.pending.get(name).map_or_else(Instant::now, |(_, at)| *at);
            i.pending.insert(name.clone(), (state, saved_at));
        }
    }
    // Rollouts that were deleted: forget their unsaved states.
    let mut i = st.rollouts.inner.lock().unwrap();
    i.pending.retain(|name, _| specs.contains_key(name));
    Ok(())
}

//! Coordinated checkpoints and the training fault detector, as pure logic.
//!
//! Every rank of a map checkpoints at the map's barrier steps (multiples of
//! `checkpoint_every`, and the job's last step). In synchronous data-parallel training the
//! ranks' states at one step form a consistent cut (no message is in flight between two
//! ranks across a step boundary: the all-reduce of step k completes before step k + 1), so
//! the barrier-aligned checkpoint is the practical form of Chandy–Lamport here. A checkpoint
//! counts only once every rank of one map reported it at the same step: that is a
//! [`Manifest`], stored through Raft; after any failure or rescale every rank restarts from
//! the last one.
//!
//! A rank is dead when its trainer has not called its sidecar for `dead_after` (the sidecar
//! reports how long ago the trainer last called; the report's own age on the control node
//! is added), or when it never showed up within `start_grace` of becoming a member.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::job::ShardMapRecord;

/// One rank's share of a complete checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub rank: u32,
    pub worker: String,
    pub location: String,
}

/// A complete checkpoint: every rank of map `map_version` reported step `step`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub step: u64,
    pub map_version: u64,
    pub parts: Vec<Part>,
    /// Taken at the job's last step: the job is done.
    #[serde(default)]
    pub r#final: bool,
}

impl Manifest {
    pub fn to_xds(&self) -> weft_xds::resources::v1::CheckpointManifest {
        use weft_xds::resources::v1;
        v1::CheckpointManifest {
            step: self.step,
            map_version: self.map_version,
            parts: self
                .parts
                .iter()
                .map(|p| v1::CheckpointPart { rank: p.rank, worker: p.worker.clone(), location: p.location.clone() })
                .collect(),
            r#final: self.r#final,
        }
    }
}

/// `checkpoints/<job>`: the last complete checkpoint and a few before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub last: Option<Manifest>,
    /// Newest last; at most [`HISTORY`].
    #[serde(default)]
    pub history: Vec<Manifest>,
}

/// Complete checkpoints kept per job.
pub const HISTORY: usize = 10;

impl CheckpointRecord {
    /// Records `m` as the newest complete checkpoint.
    pub fn push(&mut self, m: Manifest) {
        self.history.push(m.clone());
        if self.history.len() > HISTORY {
            self.history.remove(0);
        }
        self.last = Some(m);
    }
}

/// One finished checkpoint as a rank reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reported {
    pub map_version: u64,
    pub step: u64,
    pub location: String,
    #[serde(default)]
    pub r#final: bool,
}

/// What the control plane knows of one worker, from its sidecar's reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerState {
    pub job: String,
    pub worker: String,
    /// The map version the trainer acknowledged (0 = none).
    pub map_version: u64,
    pub step: u64,
    /// Whether the trainer ever called its sidecar, and how long ago it last did (ms).
    pub trainer_seen: bool,
    pub trainer_idle_ms: u64,
    pub checkpoints: Vec<Reported>,
    pub draining: bool,
    pub ready_to_stop: bool,
    #[serde(default)]
    pub host: String,
    /// How old the report is on the control node that holds it (ms).
    #[serde(default)]
    pub age_ms: u64,
}

/// The newest step after `after` at which every rank of `map` reported a checkpoint under
/// `map.version`.
pub fn complete(map: &ShardMapRecord, workers: &BTreeMap<String, WorkerState>, after: Option<u64>) -> Option<Manifest> {
    let mut common: Option<BTreeSet<u64>> = None;
    for r in &map.ranks {
        let steps: BTreeSet<u64> = workers
            .get(&r.worker)
            .map(|w| w.checkpoints.iter().filter(|c| c.map_version == map.version).map(|c| c.step).collect())
            .unwrap_or_default();
        common = Some(match common {
            None => steps,
            Some(c) => c.intersection(&steps).copied().collect(),
        });
    }
    let step = common?.into_iter().rev().find(|s| after.is_none_or(|a| *s > a))?;
    let mut r#final = true;
    let parts = map
        .ranks
        .iter()
        .map(|r| {
            let c = workers[&r.worker].checkpoints.iter().rfind(|c| c.map_version == map.version && c.step == step).expect("in common");
            r#final &= c.r#final;
            Part { rank: r.rank, worker: r.worker.clone(), location: c.location.clone() }
        })
        .collect();
    Some(Manifest { step, map_version: map.version, parts, r#final })
}

/// The furthest step a rank of `map` reported while running it (none: no rank acknowledged
/// it yet): where a requested coordinated checkpoint is counted from.
pub fn furthest(map: &ShardMapRecord, workers: &BTreeMap<String, WorkerState>) -> Option<u64> {
    map.ranks.iter().filter_map(|r| workers.get(&r.worker)).filter(|w| w.map_version == map.version).map(|w| w.step).max()
}

/// Fault-detector settings of a job, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub dead_after_ms: u64,
    pub start_grace_ms: u64,
}

/// The members of `map` that are dead: `member_for_ms` says how long each has been a member
/// (as far as this control node knows).
pub fn dead(
    map: &ShardMapRecord,
    workers: &BTreeMap<String, WorkerState>,
    member_for_ms: &BTreeMap<String, u64>,
    d: Deadlines,
) -> Vec<String> {
    map.ranks
        .iter()
        .map(|r| &r.worker)
        .filter(|w| match workers.get(*w) {
            Some(s) if s.trainer_seen => s.trainer_idle_ms.saturating_add(s.age_ms) > d.dead_after_ms,
            _ => member_for_ms.get(*w).copied().unwrap_or(0) > d.start_grace_ms,
        })
        .cloned()
        .collect()
}

/// Merges the views of several control nodes: per worker, the freshest report.
pub fn freshest(views: impl IntoIterator<Item = WorkerState>) -> BTreeMap<String, WorkerState> {
    let mut out: BTreeMap<String, WorkerState> = BTreeMap::new();
    for v in views {
        match out.get(&v.worker) {
            Some(old) if old.age_ms <= v.age_ms => {}
            _ => {
                out.insert(v.worker.clone(), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shards::job::{JobSpec, next_map};

    fn map(workers: u32) -> ShardMapRecord {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({"workers": workers, "shard_sizes": [10, 10, 10, 10, 10, 10],
            "global_batch": 12})).unwrap();
        next_map("j", &spec, 1, None, &BTreeSet::new()).unwrap()
    }

    fn state(worker: &str, cps: &[(u64, u64, bool)]) -> WorkerState {
        WorkerState {
            job: "j".into(),
            worker: worker.into(),
            trainer_seen: true,
            checkpoints: cps
                .iter()
                .map(|&(map_version, step, f)| Reported { map_version, step, location: format!("/ck/{worker}/{step}"), r#final: f })
                .collect(),
            ..WorkerState::default()
        }
    }

    #[test]
    fn a_checkpoint_counts_only_when_every_rank_of_the_map_took_it() {
        let m = map(3);
        let mut w: BTreeMap<String, WorkerState> = BTreeMap::new();
        w.insert("j-0".into(), state("j-0", &[(1, 10, false), (1, 20, false)]));
        w.insert("j-1".into(), state("j-1", &[(1, 10, false), (1, 20, false)]));
        assert_eq!(complete(&m, &w, None), None, "rank 2 has not reported");
        // Rank 2's step-20 checkpoint was taken under an older map: not part of this cut.
        w.insert("j-2".into(), state("j-2", &[(1, 10, false), (0, 20, false)]));
        let got = complete(&m, &w, None).unwrap();
        assert_eq!((got.step, got.map_version, got.r#final), (10, 1, false));
        assert_eq!(got.parts.iter().map(|p| (p.rank, p.location.as_str())).collect::<Vec<_>>(), vec![
            (0, "/ck/j-0/10"),
            (1, "/ck/j-1/10"),
            (2, "/ck/j-2/10")
        ]);
        assert_eq!(complete(&m, &w, Some(10)), None, "nothing newer than the last manifest");
        w.insert("j-2".into(), state("j-2", &[(1, 10, false), (1, 20, false)]));
        assert_eq!(complete(&m, &w, Some(10)).unwrap().step, 20);
        for k in ["j-0", "j-1"] {
            w.get_mut(k).unwrap().checkpoints.push(Reported { map_version: 1, step: 25, location: "x".into(), r#final: true });
        }
        assert_eq!(complete(&m, &w, Some(20)), None);
        w.get_mut("j-2").unwrap().checkpoints.push(Reported { map_version: 1, step: 25, location: "y".into(), r#final: true });
        assert!(complete(&m, &w, Some(20)).unwrap().r#final, "every rank's last step: the job is done");
    }

    #[test]
    fn silent_trainers_and_no_shows_are_dead() {
        let m = map(3);
        let d = Deadlines { dead_after_ms: 2_000, start_grace_ms: 60_000 };
        let mut w: BTreeMap<String, WorkerState> = BTreeMap::new();
        w.insert("j-0".into(), WorkerState { trainer_idle_ms: 100, age_ms: 500, ..state("j-0", &[]) });
        // Idle 1.8 s on its sidecar, and that report is 0.5 s old here: 2.3 s > 2 s.
        w.insert("j-1".into(), WorkerState { trainer_idle_ms: 1_800, age_ms: 500, ..state("j-1", &[]) });
        let young = BTreeMap::from([("j-2".to_string(), 5_000)]);
        assert_eq!(dead(&m, &w, &young, d), vec!["j-1".to_string()], "j-2 is still within its start grace");
        let old = BTreeMap::from([("j-2".to_string(), 61_000)]);
        assert_eq!(dead(&m, &w, &old, d), vec!["j-1".to_string(), "j-2".to_string()]);
    }

    #[test]
    fn the_freshest_report_of_a_worker_wins() {
        let a = WorkerState { age_ms: 900, step: 5, ..state("j-0", &[]) };
        let b = WorkerState { age_ms: 100, step: 7, ..state("j-0", &[]) };
        let c = WorkerState { age_ms: 50, ..state("j-1", &[]) };
        let got = freshest([a, b, c]);
        assert_eq!(got["j-0"].step, 7);
        assert_eq!(got.len(), 2);
    }
}

//! A training job as a user writes it (`trainingjobs/<job>`) and the shard map the control plane
//! computes for it (`shardmaps/<job>`, pushed over xDS as `weft.v1.ShardMap`), as pure logic:
//! the next map from the job and the previous map (sticky data shards, the exact batch split,
//! the model layout).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::batch::{RankBatch, split};
use super::data::{Assignment, Shard, assign, moved};
use super::checkpoint::Manifest;
use super::layout::{LayoutSpec, RankLayout, plan};

/// The model layout knobs of a job (the worker count comes from the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    #[serde(default = "one")]
    pub tensor_parallel: u32,
    #[serde(default = "one")]
    pub pipeline_stages: u32,
    #[serde(default = "eight")]
    pub gpus_per_node: u32,
    /// Estimated memory per layer, bytes (default: 32 equal layers).
    #[serde(default = "default_layers")]
    pub layer_bytes: Vec<u64>,
    #[serde(default = "default_params")]
    pub parameters: u64,
    #[serde(default)]
    pub zero_stage: u8,
}

fn one() -> u32 {
    1
}
fn eight() -> u32 {
    8
}
fn default_layers() -> Vec<u64> {
    vec![1 << 28; 32]
}
fn default_params() -> u64 {
    7_000_000_000
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            tensor_parallel: 1,
            pipeline_stages: 1,
            gpus_per_node: 8,
            layer_bytes: default_layers(),
            parameters: default_params(),
            zero_stage: 0,
        }
    }
}

/// `trainingjobs/<job>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Worker processes (ranks).
    pub workers: u32,
    /// Sizes of the dataset's shards (ids `shard-00000`, ...).
    pub shard_sizes: Vec<u64>,
    pub global_batch: u64,
    #[serde(default = "default_micro")]
    pub max_micro_batch: u64,
    #[serde(default)]
    pub model: ModelSpec,
    /// Size cap slack of the data-shard placement.
    #[serde(default = "default_slack")]
    pub slack: f64,
    /// Every rank checkpoints at multiples of this step (the coordinated barrier steps).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// A rank whose trainer has not called its sidecar for this long is dead (seconds).
    #[serde(default = "default_dead_after")]
    pub dead_after_s: f64,
    /// A new member whose trainer never showed up within this is dead (seconds).
    #[serde(default = "default_start_grace")]
    pub start_grace_s: f64,
    /// On a requested rescale, how long to wait for a fresh complete checkpoint before
    /// switching maps anyway (from the last complete one); seconds.
    #[serde(default = "default_rescale_wait")]
    pub rescale_wait_s: f64,
}

fn default_micro() -> u64 {
    8
}
fn default_slack() -> f64 {
    0.05
}
fn default_checkpoint_every() -> u64 {
    100
}
fn default_dead_after() -> f64 {
    30.0
}
fn default_start_grace() -> f64 {
    300.0
}
fn default_rescale_wait() -> f64 {
    60.0
}

/// Longest accepted wait or deadline (a day): keeps the detector's arithmetic finite.
const MAX_WAIT_S: f64 = 86_400.0;
/// Most bytes a job's shards (or a model's layers) may add up to.
const MAX_TOTAL_BYTES: u64 = 1 << 60;
/// Most parameters a model may have (the ZeRO memory arithmetic multiplies them by bytes).
const MAX_PARAMETERS: u64 = 1 << 50;

impl JobSpec {
    /// Checks every field by computing the map it asks for; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.workers == 0 || self.workers > 100_000 {
            return Err(("workers", format!("{} is not in 1..=100000", self.workers)));
        }
        if self.shard_sizes.is_empty() || self.shard_sizes.len() > 1_000_000 {
            return Err(("shard_sizes", "give 1 to 1,000,000 shard sizes".into()));
        }
        if !(self.slack.is_finite() && (0.0..=1.0).contains(&self.slack)) {
            return Err(("slack", format!("{} is not in [0, 1]", self.slack)));
        }
        if self.checkpoint_every == 0 {
            return Err(("checkpoint_every", "must be at least 1 step".into()));
        }
        for (field, v) in [("dead_after_s", self.dead_after_s), ("start_grace_s", self.start_grace_s), ("rescale_wait_s", self.rescale_wait_s)] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_WAIT_S) {
                return Err((field, format!("{v} is not in (0, {MAX_WAIT_S}] seconds")));
            }
        }
        // Bounds that keep every sum and product of the layout and map arithmetic in u64.
        let within = |v: &[u64]| v.iter().try_fold(0u64, |a, &b| a.checked_add(b)).is_some_and(|t| t <= MAX_TOTAL_BYTES);
        if !within(&self.shard_sizes) {
            return Err(("shard_sizes", "the shard sizes add up to more than 2^60 bytes (1 EiB)".into()));
        }
        if !within(&self.model.layer_bytes) {
            return Err(("model.layer_bytes", "the layers add up to more than 2^60 bytes (1 EiB)".into()));
        }
        if self.model.parameters > MAX_PARAMETERS {
            return Err(("model.parameters", format!("{} is more than 2^50", self.model.parameters)));
        }
        let dp = self.data_parallel().map_err(|e| ("model", e))?;
        split(self.global_batch, u64::from(dp), self.max_micro_batch).map_err(|e| ("global_batch", e))?;
        plan(&self.layout())?;
        Ok(())
    }

    fn layout(&self) -> LayoutSpec {
        LayoutSpec {
            workers: self.workers,
            tensor_parallel: self.model.tensor_parallel,
            pipeline_stages: self.model.pipeline_stages,
            gpus_per_node: self.model.gpus_per_node,
            layer_bytes: self.model.layer_bytes.clone(),
            parameters: self.model.parameters,
            zero_stage: self.model.zero_stage,
        }
    }

    fn data_parallel(&self) -> Result<u32, String> {
        let per = self.model.tensor_parallel.max(1).checked_mul(self.model.pipeline_stages.max(1)).ok_or_else(|| {
            format!(
                "tensor_parallel × pipeline_stages ({} × {}) is past any worker count",
                self.model.tensor_parallel, self.model.pipeline_stages
            )
        })?;
        if !self.workers.is_multiple_of(per) {
            return Err(format!("workers {} is not a multiple of tensor_parallel × pipeline_stages = {per}", self.workers));
        }
        Ok(self.workers / per)
    }

    pub fn shards(&self) -> Vec<Shard> {
        self.shard_sizes.iter().enumerate().map(|(i, &size)| Shard { id: format!("shard-{i:05}"), size }).collect()
    }
}

/// One rank's part of the map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankMap {
    pub rank: u32,
    pub worker: String,
    pub shards: Vec<String>,
    /// The sizes of `shards`, in order.
    #[serde(default)]
    pub shard_sizes: Vec<u64>,
    pub shard_bytes: u64,
    /// The data-parallel replica's batch (shared by the ranks of one replica).
    pub batch: RankBatch,
    pub layout: RankLayout,
}

/// `shardmaps/<job>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardMapRecord {
    pub version: u64,
    /// The revision of the job spec this map was computed from.
    pub job_revision: u64,
    pub workers: u32,
    pub global_batch: u64,
    pub ranks: Vec<RankMap>,
    /// Share of shards that changed owner against the previous map.
    pub moved: f64,
    /// The index the next new worker name gets (`<job>-<index>`): names are never reused,
    /// so a dead worker's name cannot come back as a member.
    #[serde(default)]
    pub next_worker: u32,
    /// Barrier step period (from the job).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// Where every rank starts this map: the last complete checkpoint when it was made.
    #[serde(default)]
    pub resume: Option<Manifest>,
    /// Set once the job's last step is checkpointed by every rank.
    #[serde(default)]
    pub completed: Option<Manifest>,
    /// An extra barrier step asked for (`POST /v1/training/{job}/checkpoint`).
    #[serde(default)]
    pub checkpoint_at: Option<u64>,
    /// Workers whose node is being preempted (their sidecars call the checkpoint hook), and
    /// the notice's deadline in milliseconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,
    #[serde(default)]
    pub drain_deadline_ms: u64,
}

impl ShardMapRecord {
    pub fn to_xds(&self, job: &str) -> weft_xds::resources::v1::ShardMap {
        use weft_xds::resources::v1;
        v1::ShardMap {
            name: job.into(),
            version: self.version,
            workers: self.workers,
            global_batch: self.global_batch,
            checkpoint_every: self.checkpoint_every,
            resume: self.resume.as_ref().map(Manifest::to_xds),
            completed: self.completed.as_ref().map(Manifest::to_xds),
            checkpoint_at: self.checkpoint_at.unwrap_or(0),
            draining: self.draining.clone(),
            drain_deadline_ms: self.drain_deadline_ms,
            ranks: self
                .ranks
                .iter()
                .map(|r| v1::RankShards {
                    rank: r.rank,
                    worker: r.worker.clone(),
                    shards: r.shards.clone(),
                    samples: r.batch.samples,
                    accumulation_steps: r.batch.accumulation_steps,
                    micro_batches: r.batch.micro_batches.clone(),
                    tp_index: r.layout.tp_index,
                    stage: r.layout.stage,
                    dp_index: r.layout.dp_index,
                    first_layer: r.layout.layers.0,
                    end_layer: r.layout.layers.1,
                    partition_start: r.layout.partition.0,
                    partition_end: r.layout.partition.1,
                    owns: r.layout.owns.clone(),
                    shard_sizes: r.shard_sizes.clone(),
                })
                .collect(),
        }
    }
}

/// The workers of the next map, in rank order, and the next fresh name index: the previous
/// members that are not `dead`, in their old rank order, cut to `n` (the highest ranks
/// leave first) or topped up with fresh names `<job>-<index>`.
pub fn members(job: &str, n: u32, prev: Option<&ShardMapRecord>, dead: &BTreeSet<String>) -> (Vec<String>, u32) {
    let mut names: Vec<String> = Vec::new();
    for r in prev.map(|p| p.ranks.as_slice()).unwrap_or_default() {
        if !dead.contains(&r.worker) && !names.contains(&r.worker) {
            names.push(r.worker.clone());
        }
    }
    names.truncate(n as usize);
    let mut next = prev.map_or(0, |p| p.next_worker);
    while names.len() < n as usize {
        let name = format!("{job}-{next}");
        next += 1;
        if !names.contains(&name) && !dead.contains(&name) {
            names.push(name);
        }
    }
    (names, next)
}

/// The next map for `spec` (named `job`, at `job_revision`), moving as few shards as possible
/// from `prev` and leaving out the `dead` workers.
pub fn next_map(
    job: &str,
    spec: &JobSpec,
    job_revision: u64,
    prev: Option<&ShardMapRecord>,
    dead: &BTreeSet<String>,
) -> Result<ShardMapRecord, String> {
    spec.validate().map_err(|(f, e)| format!("{f}: {e}"))?;
    let shards = spec.shards();
    // Data shards go to data-parallel replicas (every rank of a replica reads the same data);
    // a replica is named after its first worker.
    let dp = spec.data_parallel()?;
    let per = spec.workers / dp;
    let (names, next_worker) = members(job, spec.workers, prev, dead);
    let replicas: Vec<String> = (0..dp).map(|d| names[(d * per) as usize].clone()).collect();
    let prev_assignment: Option<Assignment> = prev.map(|p| {
        p.ranks.iter().filter(|r| r.layout.tp_index == 0 && r.layout.stage == 0).flat_map(|r| r.shards.iter().map(move |s| (s.clone(), r.worker.clone()))).collect()
    });
    let assignment = assign(&shards, &replicas, prev_assignment.as_ref(), spec.slack);
    let batches = split(spec.global_batch, u64::from(dp), spec.max_micro_batch)?;
    let layout = plan(&spec.layout()).map_err(|(f, e)| format!("{f}: {e}"))?;
    let size: std::collections::HashMap<&str, u64> = shards.iter().map(|s| (s.id.as_str(), s.size)).collect();
    let ranks = layout
        .into_iter()
        .map(|l| {
            let replica = &replicas[l.dp_index as usize];
            let mine: Vec<String> = assignment.iter().filter(|(_, w)| *w == replica).map(|(s, _)| s.clone()).collect();
            RankMap {
                rank: l.rank,
                worker: names[l.rank as usize].clone(),
                shard_sizes: mine.iter().map(|s| size[s.as_str()]).collect(),
                shard_bytes: mine.iter().map(|s| size[s.as_str()]).sum(),
                shards: mine,
                batch: batches[l.dp_index as usize].clone(),
                layout: l,
            }
        })
        .collect();
    Ok(ShardMapRecord {
        version: prev.map_or(1, |p| p.version + 1),
        job_revision,
        workers: spec.workers,
        global_batch: spec.global_batch,
        ranks,
        moved: prev_assignment.as_ref().map_or(0.0, |p| moved(p, &assignment)),
        next_worker,
        checkpoint_every: spec.checkpoint_every,
        resume: None,
        completed: None,
        checkpoint_at: None,
        draining: Vec::new(),
        drain_deadline_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(workers: u32) -> JobSpec {
        serde_json::from_value(serde_json::json!({"workers": workers, "shard_sizes": (0..600).map(|i| 100 + i % 50).collect::<Vec<u64>>(),
            "global_batch": 1000, "max_micro_batch": 16})).unwrap()
    }

    #[test]
    fn absurd_numbers_are_refused_or_computed_never_a_panic() {
        let mut s = spec(4);
        s.model.tensor_parallel = u32::MAX;
        s.model.pipeline_stages = u32::MAX;
        assert_eq!(s.validate().unwrap_err().0, "model");
        let mut s = spec(4);
        s.global_batch = u64::MAX;
        assert_eq!(s.validate().unwrap_err().0, "global_batch", "would be 2^60 micro-batches per rank");
        type Case = (fn(&mut JobSpec), &'static str);
        let cases: [Case; 3] = [
            (|s| s.shard_sizes = vec![u64::MAX; 8], "shard_sizes"),
            (|s| s.model.layer_bytes = vec![u64::MAX; 4], "model.layer_bytes"),
            (|s| s.model.parameters = u64::MAX, "model.parameters"),
        ];
        for (break_it, field) in cases {
            let mut s = spec(4);
            break_it(&mut s);
            assert_eq!(s.validate().unwrap_err().0, field);
        }
        // At the bounds, the map is computed.
        let mut s = spec(4);
        s.shard_sizes = vec![1 << 50; 1024];
        s.model.layer_bytes = vec![1 << 58; 4];
        s.model.parameters = 1 << 50;
        s.model.zero_stage = 3;
        if s.validate().is_ok() {
            let m = next_map("j", &s, 1, None, &BTreeSet::new()).unwrap();
            assert!(m.ranks.iter().all(|r| r.shard_bytes > 0));
        }
    }

    #[test]
    fn rescales_keep_the_batch_and_move_few_shards() {
        let none = BTreeSet::new();
        let m4 = next_map("j", &spec(4), 1, None, &none).unwrap();
        let m6 = next_map("j", &spec(6), 2, Some(&m4), &none).unwrap();
        let m3 = next_map("j", &spec(3), 3, Some(&m6), &none).unwrap();
        for m in [&m4, &m6, &m3] {
            assert_eq!(m.ranks.iter().map(|r| r.batch.samples).sum::<u64>(), 1000, "global batch exact");
            let mut all: Vec<&String> = m.ranks.iter().flat_map(|r| &r.shards).collect();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), 600, "every shard owned once");
        }
        assert_eq!((m4.version, m6.version, m3.version), (1, 2, 3));
        assert!((m6.moved - 1.0 / 3.0).abs() < 0.08 && (m3.moved - 0.5).abs() < 0.08, "{} {}", m6.moved, m3.moved);
    }

    #[test]
    fn a_dead_worker_leaves_and_its_name_never_comes_back() {
        let none = BTreeSet::new();
        let m6 = next_map("j", &spec(6), 1, None, &none).unwrap();
        let dead = BTreeSet::from(["j-2".to_string()]);
        let m5 = next_map("j", &spec(5), 2, Some(&m6), &dead).unwrap();
        let names: Vec<&str> = m5.ranks.iter().map(|r| r.worker.as_str()).collect();
        assert_eq!(names, vec!["j-0", "j-1", "j-3", "j-4", "j-5"], "survivors keep their order; ranks close up");
        assert_eq!(m5.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        let m7 = next_map("j", &spec(7), 3, Some(&m5), &none).unwrap();
        let names: Vec<&str> = m7.ranks.iter().map(|r| r.worker.as_str()).collect();
        assert_eq!(names, vec!["j-0", "j-1", "j-3", "j-4", "j-5", "j-6", "j-7"], "fresh names, not the dead j-2");
        // Shards move away from the dead worker only (plus the capped rebalancing).
        let owner = |m: &ShardMapRecord, s: &str| m.ranks.iter().find(|r| r.shards.iter().any(|x| x == s)).unwrap().worker.clone();
        let of_dead: Vec<String> = m6.ranks[2].shards.clone();
        assert!(of_dead.iter().all(|s| owner(&m5, s) != "j-2"));
        assert!(m5.moved > 0.1 && m5.moved < 0.3, "about a sixth moved: {}", m5.moved);
        for r in &m5.ranks {
            assert_eq!(r.shard_sizes.iter().sum::<u64>(), r.shard_bytes, "sizes ride with the shard ids");
        }
    }

    #[test]
    fn a_layout_that_does_not_fit_names_the_field() {
        let mut s = spec(6);
        s.model.tensor_parallel = 4;
        assert_eq!(s.validate().unwrap_err().0, "model");
        let mut s = spec(4);
        s.global_batch = 2;
        assert_eq!(s.validate().unwrap_err().0, "global_batch");
        let mut s = spec(4);
        s.dead_after_s = f64::NAN;
        assert_eq!(s.validate().unwrap_err().0, "dead_after_s");
        let mut s = spec(4);
        s.checkpoint_every = 0;
        assert_eq!(s.validate().unwrap_err().0, "checkpoint_every");
    }
}

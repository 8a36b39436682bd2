//! A training job as a user writes it (`trainingjobs/<job>`) and the shard map the control plane
//! computes for it (`shardmaps/<job>`, pushed over xDS as `weft.v1.ShardMap`), as pure logic:
//! the next map from the job and the previous map (sticky data shards, the exact batch split,
//! the model layout).

use serde::{Deserialize, Serialize};

use super::batch::{RankBatch, split};
use super::data::{Assignment, Shard, assign, moved};
use super::layout::{LayoutSpec, RankLayout, plan};

/// The model layout knobs of a job (the worker count comes from the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

fn default_micro() -> u64 {
    8
}
fn default_slack() -> f64 {
    0.05
}

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
        let dp = self.data_parallel().map_err(|e| ("model", e))?;
        split(self.global_batch, u64::from(dp), self.max_micro_batch).map_err(|e| ("global_batch", e))?;
        plan(&self.layout()).map_err(|(f, e)| (f, e))?;
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
        let per = self.model.tensor_parallel.max(1) * self.model.pipeline_stages.max(1);
        if self.workers % per != 0 {
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
}

impl ShardMapRecord {
    pub fn to_xds(&self, job: &str) -> weft_xds::resources::v1::ShardMap {
        use weft_xds::resources::v1;
        v1::ShardMap {
            name: job.into(),
            version: self.version,
            workers: self.workers,
            global_batch: self.global_batch,
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
                })
                .collect(),
        }
    }
}

/// Worker names of a job of `n` ranks.
pub fn worker_names(job: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{job}-{i}")).collect()
}

/// The next map for `spec` (named `job`, at `job_revision`), moving as few shards as possible
/// from `prev`.
pub fn next_map(job: &str, spec: &JobSpec, job_revision: u64, prev: Option<&ShardMapRecord>) -> Result<ShardMapRecord, String> {
    spec.validate().map_err(|(f, e)| format!("{f}: {e}"))?;
    let shards = spec.shards();
    // Data shards go to data-parallel replicas (every rank of a replica reads the same data);
    // a replica is named after its first worker.
    let dp = spec.data_parallel()?;
    let per = spec.workers / dp;
    let names = worker_names(job, spec.workers);
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
    fn rescales_keep_the_batch_and_move_few_shards() {
        let m4 = next_map("j", &spec(4), 1, None).unwrap();
        let m6 = next_map("j", &spec(6), 2, Some(&m4)).unwrap();
        let m3 = next_map("j", &spec(3), 3, Some(&m6)).unwrap();
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
    fn a_layout_that_does_not_fit_names_the_field() {
        let mut s = spec(6);
        s.model.tensor_parallel = 4;
        assert_eq!(s.validate().unwrap_err().0, "model");
        let mut s = spec(4);
        s.global_batch = 2;
        assert_eq!(s.validate().unwrap_err().0, "global_batch");
    }
}

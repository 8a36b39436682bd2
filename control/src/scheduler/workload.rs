//! What the scheduler places: plain GPU-sharing pods (the Alibaba trace's shape), inference
//! replicas of model variants (which can share base weights), and training gangs.

use serde::{Deserialize, Serialize};

use super::inventory::{Level, MILLI};

/// Importance of a workload: higher wins, and preemption only ever evicts strictly lower.
pub type Priority = i32;

/// Which capacity pool a workload may use. Critical inference stays on on-demand nodes (a spot
/// reclaim would drop live traffic); best-effort work goes to spot nodes whose expected uptime
/// clears its `min_uptime_hours`, falling back to on-demand; standard work goes anywhere and
/// takes the cheaper node on a tie.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceClass {
    Critical,
    #[default]
    Standard,
    BestEffort,
}

/// A pod as in the trace: CPU, memory, and either a fraction of one GPU (`num_gpu == 1`,
/// `gpu_milli < 1000`) or whole GPUs (`gpu_milli == 1000`), on any of the listed GPU models.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePod {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub num_gpu: u8,
    /// Per GPU; 0 when `num_gpu == 0`.
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    #[serde(default)]
    pub gpu_spec: Vec<String>,
}

impl TracePod {
    /// Total milli-GPU asked for.
    pub fn gpu_milli_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// Normalizes the trace's encoding: multi-GPU pods always take whole GPUs, and a GPU count
    /// without milli (or milli without count) means no GPU.
    pub fn normalized(mut self) -> Self {
        if self.num_gpu == 0 || self.gpu_milli == 0 {
            self.num_gpu = 0;
            self.gpu_milli = 0;
        } else if self.num_gpu > 1 || self.gpu_milli > MILLI {
            self.gpu_milli = MILLI;
        }
        self
    }
}

/// One replica of a model variant for inference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferenceReplica {
    /// Unique name of this replica.
    pub name: String,
    pub variant: String,
    /// Base model the variant is derived from; replicas of variants of one base on one GPU
    /// map a single copy of its weights.
    pub base_model: String,
    pub base_bytes: u64,
    /// The variant's own weights (fine-tuned layers, adapter).
    pub delta_bytes: u64,
    /// KV cache and activations while serving.
    pub working_set_bytes: u64,
    /// Share of one GPU's compute, in milli-GPU (1..=1000).
    pub compute_milli: u32,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub class: ServiceClass,
    /// Best-effort work: the expected spot uptime it needs to be worth starting there.
    #[serde(default)]
    pub min_uptime_hours: f64,
    #[serde(default)]
    pub gpu_spec: Vec<String>,
    /// How the node agent starts it (absent: placed, but started by someone else). The
    /// scheduler does not read it; boxed so that it does not triple the size of every
    /// `Workload` the scheduler moves around.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Box<crate::launch::Launch>>,
}

impl InferenceReplica {
    /// GPU memory on a GPU that does not yet hold the base.
    pub fn cold_bytes(&self) -> u64 {
        // Saturating: sizes come from API input, and a sum past u64 fits no GPU anyway.
        self.base_bytes.saturating_add(self.own_bytes())
    }

    /// GPU memory on a GPU where the base is already resident.
    pub fn own_bytes(&self) -> u64 {
        self.delta_bytes.saturating_add(self.working_set_bytes)
    }
}

/// Gang workers must sit inside one domain at `level`: strictly (`required`) or when possible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyConstraint {
    pub level: Level,
    #[serde(default)]
    pub required: bool,
}

/// A training job: `workers` workers of `gpus_per_worker` whole GPUs each, placed all together
/// or not at all (a partial gang holds GPUs while doing nothing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingGang {
    pub name: String,
    pub workers: u16,
    pub gpus_per_worker: u8,
    /// GPU memory each worker needs on each of its GPUs (see [`super::memory`]).
    pub gpu_memory_bytes: u64,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub class: ServiceClass,
    #[serde(default)]
    pub min_uptime_hours: f64,
    #[serde(default)]
    pub topology: Option<TopologyConstraint>,
    #[serde(default)]
    pub gpu_spec: Vec<String>,
}

/// Anything the scheduler places.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    Pod(TracePod),
    Replica(InferenceReplica),
    Gang(TrainingGang),
}

impl Workload {
    pub fn name(&self) -> &str {
        match self {
            Workload::Pod(p) => &p.name,
            Workload::Replica(r) => &r.name,
            Workload::Gang(g) => &g.name,
        }
    }

    /// Trace pods carry no priority: they all rank equal.
    pub fn priority(&self) -> Priority {
        match self {
            Workload::Pod(_) => 0,
            Workload::Replica(r) => r.priority,
            Workload::Gang(g) => g.priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_encoding_is_normalized() {
        let p = |n, m| {
            TracePod {
                name: "p".into(),
                cpu_milli: 1,
                memory_mib: 1,
                num_gpu: n,
                gpu_milli: m,
                gpu_spec: vec![],
            }
            .normalized()
        };
        assert_eq!((p(0, 500).num_gpu, p(0, 500).gpu_milli), (0, 0));
        assert_eq!((p(2, 500).num_gpu, p(2, 500).gpu_milli), (2, 1000));
        assert_eq!(p(1, 460).gpu_milli_total(), 460);
        assert_eq!(p(8, 1000).gpu_milli_total(), 8000);
    }

    #[test]
    fn workloads_read_from_yaml_like_json() {
        let w: Workload = serde_json::from_value(serde_json::json!({
            "kind": "gang", "name": "llm", "workers": 4, "gpus_per_worker": 8,
            "gpu_memory_bytes": 1, "cpu_milli": 1, "memory_mib": 1,
            "topology": {"level": "rack", "required": true}
        }))
        .unwrap();
        let Workload::Gang(g) = &w else { panic!() };
        assert_eq!(g.topology.unwrap().level, Level::Rack);
        assert_eq!(w.priority(), 0);
        assert_eq!(w.name(), "llm");
    }
}

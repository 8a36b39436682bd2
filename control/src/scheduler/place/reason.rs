//! Why a workload was not placed, worded for the operator who reads a plan.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::scheduler::inventory::{Cluster, Level, NodeId, NodeSpec};
use crate::scheduler::policy::Shape;

/// A node resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Cpu,
    Memory,
    Gpu,
    GpuMemory,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Cpu => "CPU",
            Resource::Memory => "memory",
            Resource::Gpu => "GPU",
            Resource::GpuMemory => "GPU memory",
        })
    }
}

/// The reason a workload is unplaced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// No node has one of the allowed GPU models.
    NoMatchingGpuModel,
    /// The pool rules leave no node (e.g. critical work on a cluster with only spot nodes).
    NoEligibleNode,
    /// Larger than any eligible node even when empty.
    TooLarge { resource: Resource },
    /// Fits an empty eligible node, but not the free capacity now; `resource` is the one
    /// that blocks the most eligible nodes.
    Insufficient { resource: Resource },
    /// Every GPU with room already runs the per-GPU limit of active variants.
    VariantLimit { limit: u32 },
    /// Not all of a gang's workers fit (so none was placed).
    GangIncomplete { placeable: u32, workers: u32 },
    /// No single domain at `level` holds the whole gang, and the constraint is required.
    Topology { level: Level },
    /// Preemption found no set of strictly lower-priority work whose eviction makes room.
    NoVictims,
    /// A gang kept failing until its timeout.
    TimedOut { attempts: u32 },
    /// The workload is malformed (zero workers, compute share above one GPU, ...).
    Invalid { detail: String },
    /// Placed, then evicted by higher-priority work later in the same plan.
    Preempted { by: String },
}

impl Reason {
    /// Whether evicting other work could help (capacity, not a mismatch or a malformed spec).
    pub fn capacity_bound(&self) -> bool {
        matches!(
            self,
            Reason::Insufficient { .. }
                | Reason::VariantLimit { .. }
                | Reason::GangIncomplete { .. }
                | Reason::Topology { .. }
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoMatchingGpuModel => write!(f, "no node has an allowed GPU model"),
            Reason::NoEligibleNode => {
                write!(
                    f,
                    "no node is eligible (pool rules: critical work needs on-demand nodes, spot nodes need enough expected uptime)"
                )
            }
            Reason::TooLarge { resource } => {
                write!(
                    f,
                    "needs more {resource} than any eligible node has in total"
                )
            }
            Reason::Insufficient { resource } => {
                write!(f, "not enough free {resource} on any eligible node")
            }
            Reason::VariantLimit { limit } => {
                write!(
                    f,
                    "every GPU with room already runs {limit} active variants"
                )
            }
            Reason::GangIncomplete { placeable, workers } => write!(
                f,
                "only {placeable} of {workers} gang workers fit; a gang is placed whole or not at all"
            ),
            Reason::Topology { level } => write!(f, "no single {level} can hold the whole gang"),
            Reason::NoVictims => write!(f, "no lower-priority work whose eviction would make room"),
            Reason::TimedOut { attempts } => write!(
                f,
                "gang not placeable after {attempts} attempts (timed out)"
            ),
            Reason::Invalid { detail } => write!(f, "invalid workload: {detail}"),
            Reason::Preempted { by } => write!(f, "evicted by higher-priority {by:?} in the same plan"),
        }
    }
}

/// Why no node takes a task of `shape` among nodes passing `eligible` (pool and similar rules).
pub fn diagnose(
    cluster: &Cluster,
    shape: &Shape,
    eligible: impl Fn(NodeId, &NodeSpec) -> bool,
) -> Reason {
    let wants_gpu = shape.num_gpu > 0;
    let model_ok = |n: NodeId| !wants_gpu || shape.models.contains(cluster.node(n).model);
    let nodes = || (0..cluster.len() as NodeId).filter(|&n| model_ok(n));
    if nodes().next().is_none() {
        return Reason::NoMatchingGpuModel;
    }
    let mut too_large = [0u32; 3];
    let mut blocked = [0u32; 3];
    let mut any_eligible = false;
    let mut any_big_enough = false;
    for n in nodes().filter(|&n| eligible(n, cluster.spec(n))) {
        any_eligible = true;
        let s = cluster.spec(n);
        let total = [
            s.cpu_milli >= shape.cpu_milli,
            s.memory_mib >= shape.memory_mib,
            s.gpu_count >= shape.num_gpu,
        ];
        if let Some(i) = total.iter().position(|ok| !ok) {
            too_large[i] += 1;
            continue;
        }
        any_big_enough = true;
        let f = cluster.node(n);
        let gpu_ok = match shape.num_gpu {
            0 => true,
            1 if shape.gpu_milli < 1000 => f.max_gpu_milli >= shape.gpu_milli,
            k => f.full_gpus >= k,
        };
        let now = [
            f.cpu_milli >= shape.cpu_milli,
            f.memory_mib >= shape.memory_mib,
            gpu_ok,
        ];
        if let Some(i) = now.iter().position(|ok| !ok) {
            blocked[i] += 1;
        }
    }
    const RES: [Resource; 3] = [Resource::Cpu, Resource::Memory, Resource::Gpu];
    let most = |c: [u32; 3]| RES[(0..3).max_by_key(|&i| (c[i], 3 - i)).unwrap_or(0)];
    if !any_eligible {
        Reason::NoEligibleNode
    } else if !any_big_enough {
        Reason::TooLarge {
            resource: most(too_large),
        }
    } else {
        Reason::Insufficient {
            resource: most(blocked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{ModelSet, NodeSpec};

    fn shape(cpu: u32, mem: u64, num_gpu: u8, milli: u32) -> Shape {
        Shape {
            cpu_milli: cpu,
            memory_mib: mem,
            num_gpu,
            gpu_milli: milli,
            models: ModelSet::ANY,
        }
    }

    #[test]
    fn reasons_name_the_binding_resource() {
        let c = Cluster::new(vec![
            NodeSpec::trace("a", 4000, 1000, 2, "T4"),
            NodeSpec::trace("b", 8000, 1000, 1, "T4"),
        ])
        .unwrap();
        let all = |_: NodeId, _: &NodeSpec| true;
        assert_eq!(
            diagnose(&c, &shape(1, 1, 4, 1000), all),
            Reason::TooLarge {
                resource: Resource::Gpu
            }
        );
        assert_eq!(
            diagnose(&c, &shape(9000, 1, 0, 0), all),
            Reason::TooLarge {
                resource: Resource::Cpu
            }
        );
        assert_eq!(
            diagnose(&c, &shape(1, 1, 1, 100), |_, _| false),
            Reason::NoEligibleNode
        );
        let mut wrong = shape(1, 1, 1, 100);
        wrong.models = ModelSet::NONE;
        assert_eq!(diagnose(&c, &wrong, all), Reason::NoMatchingGpuModel);
        assert!(
            Reason::Insufficient {
                resource: Resource::Gpu
            }
            .capacity_bound()
        );
        assert!(!Reason::NoMatchingGpuModel.capacity_bound());
        assert!(
            Reason::Topology { level: Level::Rack }
                .to_string()
                .contains("rack")
        );
    }
}

//! weft's placement policy for GPU-sharing tasks: FGD's score over a better fragmentation
//! measure.
//!
//! FGD (see [`super::fgd`]) places each task where the expected fragmentation of the target
//! workload grows the least. Replaying the Alibaba trace shows where it still loses GPUs, and
//! weft's measure addresses each:
//! - **CPU starvation.** FGD's fragment test asks whether *one more* task of a shape fits, so
//!   a node whose free CPU can feed 2 more tasks but that still has 8 free GPUs reports no
//!   fragment; CPU-only and CPU-heavy tasks then land there and strand GPUs. weft counts only
//!   the GPU compute the free CPU can feed ([`TargetDistribution::capacity_aware`]), which also
//!   steers CPU-only tasks to nodes whose GPUs are already taken.
//! - **Rare large shapes.** FGD keeps the most popular shapes covering 95% of tasks, so 8-GPU
//!   and 120-core tasks are invisible to it. weft keeps every shape, and shapes that at most
//!   10% of nodes can host weigh `nodes / hosts` times more
//!   ([`TargetDistribution::scarcity_weighted`]): other work stops drifting onto the few
//!   nodes able to run them (with capacity awareness alone those roomy nodes look best).
//! - The score is FGD's integer one, with ties going to the first node in the seeded order:
//!   near-equal placements then consistently pack onto the same nodes (finer scores, e.g.
//!   exact deltas as a tie-breaker, measured worse).
//!
//! Measured with `sched-openb` on every pod list of the trace (10 seeds): see the bench.

#[cfg(test)]
use std::sync::Arc;

#[cfg(test)]
use super::{Choice, GpuPick};
use super::{Shape, TargetDistribution};
use crate::scheduler::inventory::{Cluster, ModelId, NodeId};

/// Shapes that at most this share of the nodes can host count as scarce.
pub const SCARCE_HOSTS: f64 = 0.10;

/// weft's target workload for `shapes` on `cluster`: every shape, capacity-aware, with scarce
/// shapes weighted up.
pub fn target(cluster: &Cluster, shapes: &[Shape]) -> TargetDistribution {
    let models: Vec<ModelId> = (0..cluster.len() as NodeId)
        .map(|n| cluster.node(n).model)
        .collect();
    TargetDistribution::popular(shapes, 1.0, false)
        .capacity_aware()
        .scarcity_weighted(cluster.specs(), &models, SCARCE_HOSTS)
}

/// The weft policy: FGD's scorer (same score, same tie rule) over the target distribution
/// built by [`target`] — the measure is the whole difference, so the scorer is shared.
pub type WeftScorer = super::fgd::FragScorer;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{Allocation, NodeSpec};
    use crate::scheduler::policy::tests::shape;

    /// A CPU-only task goes where it strands no GPU: to the node whose GPUs are taken, not to
    /// the one whose free GPUs still need the CPU (FGD sees no difference: one more GPU task
    /// still fits either way).
    #[test]
    fn cpu_only_work_avoids_stranding_gpus() {
        let mut c = Cluster::new(vec![
            NodeSpec::trace("busy", 64_000, 1 << 20, 4, "G2"),
            NodeSpec::trace("free", 64_000, 1 << 20, 4, "G2"),
        ])
        .unwrap();
        // Node 0: all 4 GPUs taken; node 1: 4 free GPUs. Both have 40 free cores.
        for node in [0, 1] {
            let gpus = if node == 0 {
                Choice {
                    node,
                    gpus: GpuPick::Whole(4),
                }
                .grants(&c, &shape(0, 4, 1000))
            } else {
                vec![]
            };
            c.allocate(Allocation {
                owner: "x".into(),
                node,
                cpu_milli: 24_000,
                memory_mib: 0,
                gpus,
                priority: 0,
                gang: None,
                shared_base: None,
            })
            .unwrap();
        }
        let gpu_task = shape(10_000, 1, 1000);
        let shapes = vec![gpu_task; 9]
            .into_iter()
            .chain([shape(30_000, 0, 0)])
            .collect::<Vec<_>>();
        let mut w = WeftScorer::new(Arc::new(target(&c, &shapes)));
        let ch = w.choose(&c, &shape(30_000, 0, 0), None, &[1, 0]).unwrap();
        assert_eq!(
            ch.node, 0,
            "the node without free GPUs takes the CPU-only task"
        );
    }
}

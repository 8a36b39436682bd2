//! The FGD paper's baselines, from their published descriptions.
//!
//! - Random: any feasible node, any GPU that fits.
//! - Best-fit: the node with the least free resources left after placement, as a weighted sum
//!   of free CPU and free GPU each normalized by the largest node spec (128 cores, 8 GPUs).
//! - Dot-product (Tetris, Grandl et al. SIGCOMM'14, in the FGD paper's form): the node whose
//!   free-resource vector has the smallest dot product with the task's demand vector, both
//!   normalized by the largest node spec, i.e. the tightest fit along the task's own dimensions.
//! - GPU Packing: first GPUs that are already partly used (tightest first), then free GPUs on
//!   nodes already in use, then untouched nodes (smallest first), so idle nodes stay whole.
//!
//! A shared task takes its best-fit GPU on the chosen node under every baseline but Random.
//! Equal scores go to the node first in the seeded node order (see [`super::Best`]).

use super::{Best, Choice, GpuPick, Shape, best_fit_gpu, default_pick, fits, free_milli};
use crate::scheduler::inventory::{Cluster, MILLI, NodeFree, NodeId};
use crate::scheduler::rng::SplitMix64;

/// Largest node spec of the trace (CPU milli, GPU milli), to normalize resource dimensions.
const MAX_CPU: f64 = 128_000.0;
const MAX_GPU: f64 = 8_000.0;

/// Offers every feasible (and allowed) node to `score` and returns the best (ties by `rank`).
fn scan(
    cluster: &Cluster,
    shape: &Shape,
    allowed: Option<&dyn Fn(NodeId) -> bool>,
    rank: &[u32],
    mut score: impl FnMut(NodeId, &NodeFree) -> (f64, GpuPick),
) -> Option<Choice> {
    let mut best = Best::new(rank);
    for (n, f) in cluster.free().iter().enumerate() {
        let n = n as NodeId;
        if !fits(f, shape) || allowed.is_some_and(|a| !a(n)) {
            continue;
        }
        let (s, gpus) = score(n, f);
        best.offer(s, Choice { node: n, gpus });
    }
    best.choice()
}

pub fn random(
    cluster: &Cluster,
    shape: &Shape,
    allowed: Option<&dyn Fn(NodeId) -> bool>,
    rng: &mut SplitMix64,
) -> Option<Choice> {
    // Uniform over feasible nodes (reservoir sampling), then over the GPUs that fit.
    let mut chosen = None;
    let mut seen = 0u64;
    for (n, f) in cluster.free().iter().enumerate() {
        let n = n as NodeId;
        if !fits(f, shape) || allowed.is_some_and(|a| !a(n)) {
            continue;
        }
        seen += 1;
        if rng.below(seen) == 0 {
            chosen = Some(n);
        }
    }
    let node = chosen?;
    let (free, len) = free_milli(cluster, node);
    let gpus = match shape.num_gpu {
        0 => GpuPick::None,
        1 if shape.gpu_milli < MILLI => {
            let fitting = free[..len]
                .iter()
                .filter(|&&f| f >= shape.gpu_milli)
                .count();
            let k = rng.below(fitting as u64) as usize;
            let g = free[..len]
                .iter()
                .enumerate()
                .filter(|(_, f)| **f >= shape.gpu_milli)
                .nth(k)
                .map_or(0, |(i, _)| i);
            GpuPick::Share(g as u8)
        }
        k => GpuPick::Whole(k),
    };
    Some(Choice { node, gpus })
}

pub fn best_fit(
    cluster: &Cluster,
    shape: &Shape,
    allowed: Option<&dyn Fn(NodeId) -> bool>,
    rank: &[u32],
) -> Option<Choice> {
    let (cpu, gpu) = (f64::from(shape.cpu_milli), f64::from(shape.gpu_total()));
    scan(cluster, shape, allowed, rank, |n, f| {
        let left = 0.5 * (f64::from(f.cpu_milli) - cpu) / MAX_CPU
            + 0.5 * (f64::from(f.gpu_milli) - gpu) / MAX_GPU;
        let (free, len) = free_milli(cluster, n);
        (left, default_pick(&free[..len], shape))
    })
}

pub fn dot_product(
    cluster: &Cluster,
    shape: &Shape,
    allowed: Option<&dyn Fn(NodeId) -> bool>,
    rank: &[u32],
) -> Option<Choice> {
    let (cpu, gpu) = (
        f64::from(shape.cpu_milli) / MAX_CPU,
        f64::from(shape.gpu_total()) / MAX_GPU,
    );
    scan(cluster, shape, allowed, rank, |n, f| {
        let dot = cpu * f64::from(f.cpu_milli) / MAX_CPU + gpu * f64::from(f.gpu_milli) / MAX_GPU;
        let (free, len) = free_milli(cluster, n);
        (dot, default_pick(&free[..len], shape))
    })
}

pub fn packing(
    cluster: &Cluster,
    shape: &Shape,
    allowed: Option<&dyn Fn(NodeId) -> bool>,
    rank: &[u32],
) -> Option<Choice> {
    scan(cluster, shape, allowed, rank, |n, f| {
        let (free, len) = free_milli(cluster, n);
        let pick = default_pick(&free[..len], shape);
        let score = match pick {
            // Tasks without GPUs do not change GPU packing: any node is as good.
            GpuPick::None => 0.0,
            _ if f.full_gpus == f.gpu_count => 3.0 + f64::from(f.gpu_count) / 100.0,
            GpuPick::Share(g) if free[usize::from(g)] < MILLI => {
                1.0 + f64::from(free[usize::from(g)]) / f64::from(MILLI) / 10.0
            }
            GpuPick::Share(_) => 2.0 + 1.0 / 100.0,
            GpuPick::Whole(k) => 2.0 + f64::from(k) / 100.0,
        };
        (score, pick)
    })
}

/// The GPU index [`best_fit_gpu`] picks on node `n` (tests and callers that need it directly).
pub fn best_fit_gpu_on(cluster: &Cluster, n: NodeId, milli: u32) -> Option<u8> {
    let (free, len) = free_milli(cluster, n);
    best_fit_gpu(&free[..len], milli)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{Allocation, GpuGrant, NodeSpec};
    use crate::scheduler::policy::tests::shape;

    /// Node 0: 8 GPUs, one of them with 300 milli used; node 1: an untouched 2-GPU node;
    /// node 2: an untouched 8-GPU node.
    fn cluster() -> Cluster {
        let mut c = Cluster::new(vec![
            NodeSpec::trace("used8", 64000, 1 << 20, 8, "G2"),
            NodeSpec::trace("idle2", 64000, 1 << 20, 2, "G2"),
            NodeSpec::trace("idle8", 64000, 1 << 20, 8, "G2"),
        ])
        .unwrap();
        c.allocate(Allocation {
            owner: "x".into(),
            node: 0,
            cpu_milli: 0,
            memory_mib: 0,
            gpus: vec![GpuGrant {
                gpu: 3,
                milli: 300,
                memory_bytes: 0,
            }],
            priority: 0,
            gang: None,
            shared_base: None,
        })
        .unwrap();
        c
    }

    #[test]
    fn packing_prefers_used_gpus_then_used_nodes_then_small_idle_nodes() {
        let c = cluster();
        let rank = [0, 1, 2];
        let share = packing(&c, &shape(0, 1, 500), None, &rank).unwrap();
        assert_eq!(
            share,
            Choice {
                node: 0,
                gpus: GpuPick::Share(3)
            }
        );
        let whole = packing(&c, &shape(0, 1, 1000), None, &rank).unwrap();
        assert_eq!(whole.node, 0, "free GPU on a node already in use");
        let eight = packing(&c, &shape(0, 8, 1000), None, &rank).unwrap();
        assert_eq!(eight.node, 2);
        let big_share = packing(&c, &shape(0, 1, 800), None, &rank).unwrap();
        assert_eq!(
            big_share.node, 0,
            "a free GPU on a used node beats an idle node"
        );
    }

    #[test]
    fn best_fit_takes_the_fullest_node() {
        let c = cluster();
        let rank = [0, 1, 2];
        assert_eq!(
            best_fit(&c, &shape(1000, 1, 1000), None, &rank)
                .unwrap()
                .node,
            1
        );
        let s = best_fit(&c, &shape(0, 1, 500), None, &rank).unwrap();
        assert_eq!(s.node, 1);
    }

    #[test]
    fn dot_product_minimizes_alignment_with_free_resources() {
        let c = cluster();
        assert_eq!(
            dot_product(&c, &shape(0, 1, 1000), None, &[0, 1, 2])
                .unwrap()
                .node,
            1
        );
    }

    #[test]
    fn random_only_returns_feasible_choices() {
        let c = cluster();
        let mut rng = SplitMix64::new(5);
        for _ in 0..200 {
            let ch = random(&c, &shape(0, 1, 800), None, &mut rng).unwrap();
            if let GpuPick::Share(g) = ch.gpus {
                assert!(c.gpus(ch.node)[usize::from(g)].milli >= 800);
            } else {
                panic!("a shared task gets a shared GPU");
            }
        }
        assert!(random(&c, &shape(0, 9, 1000), None, &mut rng).is_none());
        let only1 = |n: NodeId| n == 1;
        assert_eq!(
            random(&c, &shape(0, 1, 100), Some(&only1), &mut rng)
                .unwrap()
                .node,
            1
        );
        assert_eq!(best_fit_gpu_on(&c, 0, 600), Some(3));
    }
}

//! GPU fragmentation of a node with respect to a target workload (FGD, Weng et al., ATC'23).
//!
//! A target workload is a distribution over task shapes (CPU, GPU count, milli-GPU per GPU,
//! allowed models) with popularities `p_m`. For one shape `m`, the free GPU compute of node `n`
//! that `m` cannot use is its fragment `F_n(m)`:
//! - if `m` cannot run on `n` at all (wrong GPU model, too little CPU, or fewer than
//!   `num_gpu` GPUs with at least `gpu_milli` free), every free milli-GPU of `n` is a fragment;
//! - otherwise the fragments are the GPUs whose free compute is below `m`'s per-GPU demand.
//!
//! A shape with no GPU demand cannot use any GPU, so all free GPU compute counts for it (this
//! only shifts every placement's score by the same amount). The node's fragmentation is the
//! expectation `F_n = Σ_m p_m F_n(m)`, and FGD places a task where `F_n` grows the least.
//! Memory is not part of the paper's definition; weft's policy can ask for it.

use std::collections::HashMap;

use crate::scheduler::inventory::{ModelId, ModelSet, NodeSpec};

/// A task shape, as placement and fragmentation see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Number of GPUs; 0 for CPU-only tasks.
    pub num_gpu: u8,
    /// Per GPU: below 1000 for a shared GPU, 1000 for whole GPUs, 0 without GPUs.
    pub gpu_milli: u32,
    pub models: ModelSet,
}

impl Shape {
    pub fn gpu_total(&self) -> u32 {
        u32::from(self.num_gpu) * self.gpu_milli
    }

    pub fn is_share(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < 1000
    }
}

/// One shape of the target workload with its popularity (a count: fragmentation is computed
/// in integers, so equal placements score exactly equal and ties are real ties).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetType {
    pub shape: Shape,
    pub weight: u64,
}

/// The workload a cluster is expected to receive, as the most popular task shapes.
///
/// Fragmentation is `Σ_m count_m × F_n(m)` in milli-GPU × tasks: the expectation scaled by the
/// number of tasks kept ([`TargetDistribution::scale`]), exact in integers. (With floating
/// point, mathematically equal deltas differ in the last bit depending on the node's state,
/// and "exact" tie-breaking then systematically favours untouched nodes, whose arithmetic is
/// identical, which spreads load over every node.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDistribution {
    types: Vec<TargetType>,
    /// Popularity of shapes with no GPU demand (they count all free GPU compute as fragment).
    gpu_less: u64,
    /// Tasks kept (the sum of all weights).
    scale: u64,
    /// Whether a shape also needs its memory to count as runnable on a node.
    check_memory: bool,
    /// Count only the GPU compute that the node's CPU (and memory) can feed (see
    /// [`TargetDistribution::capacity_aware`]).
    capacity: bool,
    /// Distinct per-GPU demands of the types (ascending) and each type's index into them: a
    /// node's GPUs are summarized once per demand, not once per type (speed).
    thresholds: Vec<u32>,
    threshold_of: Vec<u8>,
}

/// Most distinct per-GPU demands summarized on the stack; beyond, types are summarized one by one.
const MAX_THRESHOLDS: usize = 64;

impl TargetDistribution {
    /// The most popular shapes among `shapes` until they cover `coverage` (0..=1) of the tasks,
    /// with popularities renormalized over the kept shapes. FGD's simulator uses 0.95 and
    /// ignores memory (`with_memory = false`); equal shapes differing only in memory then merge.
    pub fn popular(shapes: &[Shape], coverage: f64, with_memory: bool) -> Self {
        let mut counts: HashMap<Shape, u64> = HashMap::new();
        for s in shapes {
            let key = if with_memory {
                *s
            } else {
                Shape {
                    memory_mib: 0,
                    ..*s
                }
            };
            *counts.entry(key).or_default() += 1;
        }
        Self::from_counts(counts, coverage, with_memory)
    }

    /// Like [`TargetDistribution::popular`] from (shape, count) pairs.
    pub fn from_counts(
        counts: impl IntoIterator<Item = (Shape, u64)>,
        coverage: f64,
        with_memory: bool,
    ) -> Self {
        let mut all: Vec<(Shape, u64)> = counts.into_iter().filter(|(_, w)| *w > 0).collect();
        // Most popular first; a total order on the shape keeps the cut deterministic.
        all.sort_by_key(|(s, w)| {
            (
                std::cmp::Reverse(*w),
                s.cpu_milli,
                s.gpu_milli,
                s.num_gpu,
                s.models.0,
                s.memory_mib,
            )
        });
        let total: u64 = all.iter().map(|x| x.1).sum();
        let mut kept = 0u64;
        let mut n = 0;
        while n < all.len() && (kept as f64) < coverage * total as f64 {
            kept += all[n].1;
            n += 1;
        }
        all.truncate(n);
        let mut types = Vec::new();
        let mut gpu_less = 0;
        for (shape, weight) in all {
            if shape.num_gpu == 0 || shape.gpu_milli == 0 {
                gpu_less += weight;
            } else {
                types.push(TargetType { shape, weight });
            }
        }
        let mut thresholds: Vec<u32> = types.iter().map(|t| t.shape.gpu_milli).collect();
        thresholds.sort_unstable();
        thresholds.dedup();
        let threshold_of = types
            .iter()
            .map(|t| {
                thresholds
                    .binary_search(&t.shape.gpu_milli)
                    .unwrap_or(0)
                    .min(255) as u8
            })
            .collect();
        Self {
            types,
            gpu_less,
            scale: kept,
            check_memory: with_memory,
            capacity: false,
            thresholds,
            threshold_of,
        }
    }

    /// This distribution with capacity-aware fragments (weft). FGD asks whether one more task
    /// of a shape fits, so a node with 8 free GPUs but CPU for only 2 more tasks counts all 8
    /// GPUs as usable, and the 6 that will starve for CPU never show up as fragments. Here the
    /// usable GPU compute is scaled by `min(1, tasks the free CPU can feed / tasks the GPUs can
    /// take)`, where the GPUs take `fitting GPUs / num_gpu` tasks of a whole-GPU shape and one
    /// task per fitting GPU of a shared shape (a shared GPU's remainder may go to other shapes,
    /// so it is not charged to this one).
    pub fn capacity_aware(mut self) -> Self {
        self.capacity = true;
        self
    }

    /// Weights of shapes that few nodes can host (at most `fraction` of the nodes, when empty)
    /// multiplied by `nodes / hosts`, leaving the scale (and so the score's units) unchanged.
    /// Such shapes are rare, so their popularity alone barely registers, yet the nodes able to
    /// run them are few: without this, other work drifts onto those nodes early (they look
    /// roomy) and the rare large tasks find no host later.
    pub fn scarcity_weighted(&self, specs: &[NodeSpec], models: &[ModelId], fraction: f64) -> Self {
        let n = specs.len().max(1) as f64;
        let mut out = self.clone();
        for t in &mut out.types {
            let s = t.shape;
            let hosts = specs
                .iter()
                .zip(models)
                .filter(|(sp, m)| {
                    sp.cpu_milli >= s.cpu_milli
                        && sp.memory_mib >= s.memory_mib
                        && sp.gpu_count >= s.num_gpu
                        && s.models.contains(**m)
                })
                .count()
                .max(1) as f64;
            if hosts / n <= fraction {
                t.weight = (t.weight as f64 * n / hosts).round() as u64;
            }
        }
        out
    }

    /// The number of tasks the weights sum to: `node_frag / scale` is the expectation.
    pub fn scale(&self) -> u64 {
        self.scale
    }

    pub fn types(&self) -> &[TargetType] {
        &self.types
    }

    /// Fragmented milli-GPU of a node, `Σ_m count_m × F_n(m)`, for a node with GPU model
    /// `model`, `cpu_milli` and `memory_mib` free, and free milli-GPU `free` per GPU.
    pub fn node_frag(&self, model: ModelId, cpu_milli: u32, memory_mib: u64, free: &[u32]) -> u64 {
        let total: u32 = free.iter().sum();
        if total == 0 {
            return 0;
        }
        let all = u64::from(total);
        // (GPUs with at least d free, their free compute) for each distinct demand d.
        let mut summary = [(0u8, 0u32); MAX_THRESHOLDS];
        let summarized = self.thresholds.len() <= MAX_THRESHOLDS;
        if summarized {
            for (sum, &d) in summary.iter_mut().zip(&self.thresholds) {
                for &f in free {
                    if f >= d {
                        sum.0 += 1;
                        sum.1 += f;
                    }
                }
            }
        }
        let mut frag = self.gpu_less * all;
        for (t, &ti) in self.types.iter().zip(&self.threshold_of) {
            let s = &t.shape;
            if !s.models.contains(model)
                || cpu_milli < s.cpu_milli
                || (self.check_memory && memory_mib < s.memory_mib)
            {
                frag += t.weight * all;
                continue;
            }
            let (fit, usable) = if summarized {
                summary[usize::from(ti)]
            } else {
                free.iter()
                    .filter(|&&f| f >= s.gpu_milli)
                    .fold((0u8, 0u32), |(n, u), &f| (n + 1, u + f))
            };
            if fit < s.num_gpu {
                frag += t.weight * all;
                continue;
            }
            let mut usable = u64::from(usable);
            if self.capacity {
                let by_gpus = u64::from(fit / s.num_gpu);
                let by_cpu = u64::from(cpu_milli / s.cpu_milli.max(1));
                if by_cpu < by_gpus {
                    usable = usable * by_cpu / by_gpus;
                }
            }
            frag += t.weight * (all - usable);
        }
        frag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(cpu: u32, num_gpu: u8, gpu_milli: u32) -> Shape {
        Shape {
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu,
            gpu_milli,
            models: ModelSet::ANY,
        }
    }

    fn dist(types: &[(Shape, u64)]) -> TargetDistribution {
        TargetDistribution::from_counts(types.iter().copied(), 1.0, false)
    }

    #[test]
    fn fragments_are_the_gpus_a_task_cannot_use() {
        // Half the tasks want 0.5 GPU, half want a whole GPU.
        let d = dist(&[(shape(0, 1, 500), 1), (shape(0, 1, 1000), 1)]);
        // GPUs with 1000 and 300 free: the 300 is a fragment to both shapes (weight 1 each).
        assert_eq!(d.node_frag(0, 10, 0, &[1000, 300]), 600);
        // 600 free: usable by the 0.5 task, a fragment to the whole-GPU task.
        assert_eq!(d.node_frag(0, 10, 0, &[600]), 600);
        // Nothing free: no fragments.
        assert_eq!(d.node_frag(0, 10, 0, &[0, 0]), 0);
        assert_eq!(d.scale(), 2);
    }

    #[test]
    fn unrunnable_tasks_see_everything_as_fragment() {
        let mut big = shape(8000, 2, 1000);
        big.models = ModelSet(0b10);
        let d = dist(&[(big, 1)]);
        // Model 1 with enough CPU and two free GPUs: no fragment.
        assert_eq!(d.node_frag(1, 8000, 0, &[1000, 1000]), 0);
        // Too little CPU, wrong model, or only one whole GPU: all 2000 (or 1500) are fragments.
        assert_eq!(d.node_frag(1, 7999, 0, &[1000, 1000]), 2000);
        assert_eq!(d.node_frag(0, 8000, 0, &[1000, 1000]), 2000);
        assert_eq!(d.node_frag(1, 8000, 0, &[1000, 500]), 1500);
    }

    #[test]
    fn cpu_only_tasks_count_all_free_gpu() {
        let d = dist(&[(shape(1000, 0, 0), 1), (shape(0, 1, 500), 1)]);
        assert_eq!(d.node_frag(0, 0, 0, &[1000]), 1000);
    }

    #[test]
    fn memory_only_matters_when_asked() {
        let mut s = shape(0, 1, 500);
        s.memory_mib = 100;
        let without = TargetDistribution::from_counts([(s, 1)], 1.0, false);
        let with = TargetDistribution::from_counts([(s, 1)], 1.0, true);
        assert_eq!(without.node_frag(0, 0, 50, &[1000]), 0);
        assert_eq!(with.node_frag(0, 0, 50, &[1000]), 1000);
    }

    #[test]
    fn capacity_aware_counts_only_what_cpu_can_feed() {
        // 1-GPU tasks with 10 cores; a node with 4 free GPUs and 20 free cores feeds 2 of them.
        let d = dist(&[(shape(10_000, 1, 1000), 1)]);
        let free = [1000, 1000, 1000, 1000];
        assert_eq!(
            d.node_frag(0, 20_000, 0, &free),
            0,
            "FGD: one more task fits, all usable"
        );
        let c = d.capacity_aware();
        assert_eq!(
            c.node_frag(0, 20_000, 0, &free),
            2000,
            "two GPUs will starve for CPU"
        );
        assert_eq!(c.node_frag(0, 40_000, 0, &free), 0);
        // Shared tasks of 0.5 GPU: both GPUs (600 and 1000 free) fit one, CPU feeds one task.
        let s = dist(&[(shape(10_000, 1, 500), 1)]).capacity_aware();
        assert_eq!(s.node_frag(0, 10_000, 0, &[600, 1000]), 1600 - 1600 / 2);
        assert_eq!(s.node_frag(0, 20_000, 0, &[600, 1000]), 0);
    }

    #[test]
    fn scarce_shapes_weigh_more_without_changing_the_scale() {
        let big = NodeSpec::trace("big", 128_000, 1 << 20, 8, "G3");
        let small = NodeSpec::trace("small", 96_000, 1 << 19, 8, "G2");
        let mut specs = vec![big];
        specs.extend(std::iter::repeat_n(small, 19));
        let models = vec![0u8; 20];
        let d = dist(&[(shape(120_000, 8, 1000), 1), (shape(1000, 1, 1000), 9)]);
        let w = d.scarcity_weighted(&specs, &models, 0.1);
        // One host in 20: ×20. The common shape runs anywhere: unchanged.
        let weights: Vec<u64> = w.types().iter().map(|t| t.weight).collect();
        assert_eq!(weights, [9, 20]);
        assert_eq!(w.scale(), d.scale());
    }

    #[test]
    fn popular_keeps_the_top_shapes_and_renormalizes() {
        let mut shapes = vec![shape(1, 1, 500); 6];
        shapes.extend(vec![shape(2, 1, 1000); 3]);
        shapes.push(shape(3, 2, 1000));
        let d = TargetDistribution::popular(&shapes, 0.9, false);
        assert_eq!(d.types().len(), 2, "the 10% tail is dropped");
        let w: Vec<u64> = d.types().iter().map(|t| t.weight).collect();
        assert_eq!((w, d.scale()), (vec![6, 3], 9));
    }
}

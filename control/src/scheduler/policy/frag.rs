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

use std::collections::HashMap;

use crate::scheduler::inventory::{ModelId, ModelSet};

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

/// One shape of the target workload with its popularity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetType {
    pub shape: Shape,
    pub weight: f64,
}

/// The workload a cluster is expected to receive, as the most popular task shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetDistribution {
    types: Vec<TargetType>,
    /// Popularity of shapes with no GPU demand (they count all free GPU compute as fragment).
    gpu_less: f64,
    /// Whether a shape also needs its memory to count as runnable on a node.
    check_memory: bool,
}

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
        Self::from_counts(counts.into_iter().map(|(s, c)| (s, c as f64)), coverage, with_memory)
    }

    /// Like [`TargetDistribution::popular`] from (shape, weight) pairs.
    pub fn from_counts(
        counts: impl IntoIterator<Item = (Shape, f64)>,
        coverage: f64,
        with_memory: bool,
    ) -> Self {
        let mut all: Vec<(Shape, f64)> = counts.into_iter().filter(|(_, w)| *w > 0.0).collect();
        // Most popular first; a total order on the shape keeps the cut deterministic.
        all.sort_by(|a, b| {
            b.1.total_cmp(&a.1).then_with(|| {
                let k = |s: &Shape| (s.cpu_milli, s.gpu_milli, s.num_gpu, s.models.0, s.memory_mib);
                k(&a.0).cmp(&k(&b.0))
            })
        });
        let total: f64 = all.iter().map(|x| x.1).sum();
        let mut kept = 0.0;
        let mut n = 0;
        while n < all.len() && kept < coverage * total {
            kept += all[n].1;
            n += 1;
        }
        all.truncate(n.max(1).min(all.len()));
        let mut types = Vec::new();
        let mut gpu_less = 0.0;
        for (shape, w) in all {
            let weight = w / kept.max(f64::MIN_POSITIVE);
            if shape.num_gpu == 0 || shape.gpu_milli == 0 {
                gpu_less += weight;
            } else {
                types.push(TargetType { shape, weight });
            }
        }
        Self {
            types,
            gpu_less,
            check_memory: with_memory,
        }
    }

    pub fn types(&self) -> &[TargetType] {
        &self.types
    }

    /// Expected fragmented milli-GPU `F_n` of a node with GPU model `model`, `cpu_milli` and
    /// `memory_mib` free, and free milli-GPU `free` per GPU.
    pub fn node_frag(&self, model: ModelId, cpu_milli: u32, memory_mib: u64, free: &[u32]) -> f64 {
        let total: u32 = free.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let all = f64::from(total);
        let mut frag = self.gpu_less * all;
        for t in &self.types {
            let s = &t.shape;
            if !s.models.contains(model)
                || cpu_milli < s.cpu_milli
                || (self.check_memory && memory_mib < s.memory_mib)
            {
                frag += t.weight * all;
                continue;
            }
            let (mut fit, mut usable) = (0u8, 0u32);
            for &f in free {
                if f >= s.gpu_milli {
                    fit += 1;
                    usable += f;
                }
            }
            frag += t.weight * if fit < s.num_gpu { all } else { f64::from(total - usable) };
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

    fn dist(types: &[(Shape, f64)]) -> TargetDistribution {
        TargetDistribution::from_counts(types.iter().copied(), 1.0, false)
    }

    #[test]
    fn fragments_are_the_gpus_a_task_cannot_use() {
        // Half the tasks want 0.5 GPU, half want a whole GPU.
        let d = dist(&[(shape(0, 1, 500), 1.0), (shape(0, 1, 1000), 1.0)]);
        // GPUs with 1000 and 300 free: the 300 is a fragment to both shapes.
        assert_eq!(d.node_frag(0, 10, 0, &[1000, 300]), 300.0);
        // 600 free: usable by the 0.5 task, a fragment to the whole-GPU task.
        assert_eq!(d.node_frag(0, 10, 0, &[600]), 300.0);
        // Nothing free: no fragments.
        assert_eq!(d.node_frag(0, 10, 0, &[0, 0]), 0.0);
    }

    #[test]
    fn unrunnable_tasks_see_everything_as_fragment() {
        let mut big = shape(8000, 2, 1000);
        big.models = ModelSet(0b10);
        let d = dist(&[(big, 1.0)]);
        // Model 1 with enough CPU and two free GPUs: no fragment.
        assert_eq!(d.node_frag(1, 8000, 0, &[1000, 1000]), 0.0);
        // Too little CPU, wrong model, or only one whole GPU: all 2000 (or 1500) are fragments.
        assert_eq!(d.node_frag(1, 7999, 0, &[1000, 1000]), 2000.0);
        assert_eq!(d.node_frag(0, 8000, 0, &[1000, 1000]), 2000.0);
        assert_eq!(d.node_frag(1, 8000, 0, &[1000, 500]), 1500.0);
    }

    #[test]
    fn cpu_only_tasks_count_all_free_gpu() {
        let d = dist(&[(shape(1000, 0, 0), 1.0), (shape(0, 1, 500), 1.0)]);
        assert_eq!(d.node_frag(0, 0, 0, &[1000]), 500.0 + 0.0);
    }

    #[test]
    fn memory_only_matters_when_asked() {
        let mut s = shape(0, 1, 500);
        s.memory_mib = 100;
        let without = TargetDistribution::from_counts([(s, 1.0)], 1.0, false);
        let with = TargetDistribution::from_counts([(s, 1.0)], 1.0, true);
        assert_eq!(without.node_frag(0, 0, 50, &[1000]), 0.0);
        assert_eq!(with.node_frag(0, 0, 50, &[1000]), 1000.0);
    }

    #[test]
    fn popular_keeps_the_top_shapes_and_renormalizes() {
        let mut shapes = vec![shape(1, 1, 500); 6];
        shapes.extend(vec![shape(2, 1, 1000); 3]);
        shapes.push(shape(3, 2, 1000));
        let d = TargetDistribution::popular(&shapes, 0.9, false);
        assert_eq!(d.types().len(), 2, "the 10% tail is dropped");
        let w: Vec<f64> = d.types().iter().map(|t| t.weight).collect();
        assert!((w[0] - 6.0 / 9.0).abs() < 1e-12 && (w[1] - 3.0 / 9.0).abs() < 1e-12);
    }
}

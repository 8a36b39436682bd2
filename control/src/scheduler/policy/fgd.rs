//! FGD: place a task where the node's expected fragmentation grows the least.
//!
//! For each feasible node the scorer computes `ΔF = F_n(after) − F_n(before)` (see [`frag`]);
//! for a shared task it tries each GPU that fits and keeps the one with the smallest `F_n(after)`
//! (GPUs with equal free compute give equal results, so each distinct value is tried once);
//! whole-GPU tasks take free GPUs, which are interchangeable.
//!
//! Nodes are ranked by [`fgd_score`], FGD's published integer score of `−ΔF`.
//!
//! `F_n(before)` is cached per node and `ΔF` per (task shape, node), both keyed on the node's
//! version: one placement changes one node, so a decision recomputes only the nodes that
//! changed since the same shape was last scored.
//!
//! [`frag`]: super::frag

use std::collections::HashMap;
use std::sync::Arc;

use super::{Best, Choice, GpuPick, Shape, TargetDistribution, fits, free_milli};
use crate::scheduler::inventory::{Cluster, MILLI, NodeFree, NodeId};

/// A cached per-node result; `stamp` is the node version + 1 it was computed at (0: empty).
#[derive(Clone, Copy, Debug, Default)]
struct Cached<T> {
    stamp: u32,
    cluster: u64,
    value: T,
}

impl<T: Copy> Cached<T> {
    fn get(&self, cluster: u64, f: &NodeFree) -> Option<T> {
        (self.stamp == f.version.wrapping_add(1) && self.cluster == cluster).then_some(self.value)
    }

    fn set(&mut self, cluster: u64, f: &NodeFree, value: T) {
        *self = Self {
            stamp: f.version.wrapping_add(1),
            cluster,
            value,
        };
    }
}

/// The outcome of placing one shape on one node: the fragmentation change and the GPUs
/// (fragmentation in [`TargetDistribution::node_frag`]'s integer units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delta {
    pub frag: i64,
    /// Fragmentation after placement.
    pub after: u64,
    pub gpus: GpuPick,
}

impl Default for Delta {
    fn default() -> Self {
        Self {
            frag: 0,
            after: 0,
            gpus: GpuPick::None,
        }
    }
}

/// Fragmentation deltas with per-node caches, shared by FGD and weft.
pub struct FragCache {
    target: Arc<TargetDistribution>,
    /// Among GPUs leaving equal fragmentation, take the fullest (weft) instead of the first.
    pub gpu_best_fit: bool,
    node_frag: Vec<Cached<u64>>,
    shapes: HashMap<Shape, usize>,
    deltas: Vec<Vec<Cached<Delta>>>,
}

impl FragCache {
    pub fn new(target: Arc<TargetDistribution>) -> Self {
        Self {
            target,
            gpu_best_fit: false,
            node_frag: Vec::new(),
            shapes: HashMap::new(),
            deltas: Vec::new(),
        }
    }

    pub fn target(&self) -> &TargetDistribution {
        &self.target
    }

    /// Index of `shape`'s delta cache, sized for `nodes` nodes. Memory is part of the key only
    /// when the target distribution checks it.
    fn shape_slot(&mut self, shape: &Shape, nodes: usize) -> usize {
        let next = self.shapes.len();
        let slot = *self.shapes.entry(*shape).or_insert(next);
        if slot == self.deltas.len() {
            self.deltas.push(Vec::new());
        }
        if self.deltas[slot].len() < nodes {
            self.deltas[slot].resize(nodes, Cached::default());
        }
        slot
    }

    /// `F_n` of node `n` as it is now.
    pub fn node_frag(&mut self, cluster: &Cluster, n: NodeId) -> u64 {
        if self.node_frag.len() < cluster.len() {
            self.node_frag.resize(cluster.len(), Cached::default());
        }
        let f = cluster.node(n);
        let id = cluster.id();
        if let Some(v) = self.node_frag[n as usize].get(id, f) {
            return v;
        }
        let (free, len) = free_milli(cluster, n);
        let v = self
            .target
            .node_frag(f.model, f.cpu_milli, f.memory_mib, &free[..len]);
        self.node_frag[n as usize].set(id, f, v);
        v
    }

    /// Calls `visit` with the delta of every feasible, allowed node for `shape`.
    pub fn scan(
        &mut self,
        cluster: &Cluster,
        shape: &Shape,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
        mut visit: impl FnMut(NodeId, &NodeFree, Delta),
    ) {
        let slot = self.shape_slot(shape, cluster.len());
        let id = cluster.id();
        for (n, f) in cluster.free().iter().enumerate() {
            let n = n as NodeId;
            if !fits(f, shape) || allowed.is_some_and(|a| !a(n)) {
                continue;
            }
            let d = match self.deltas[slot][n as usize].get(id, f) {
                Some(d) => d,
                None => {
                    let d = self.compute(cluster, n, shape);
                    self.deltas[slot][n as usize].set(id, f, d);
                    d
                }
            };
            visit(n, f, d);
        }
    }

    /// The fragmentation change of placing `shape` on node `n` (which fits it).
    fn compute(&mut self, cluster: &Cluster, n: NodeId, shape: &Shape) -> Delta {
        let before = self.node_frag(cluster, n);
        let f = cluster.node(n);
        let (mut free, len) = free_milli(cluster, n);
        let (cpu, mem) = (
            f.cpu_milli - shape.cpu_milli,
            f.memory_mib - shape.memory_mib,
        );
        let t = &self.target;
        let frag_of = |free: &[u32]| t.node_frag(f.model, cpu, mem, free);
        let (after, gpus) = match shape.num_gpu {
            0 => (frag_of(&free[..len]), GpuPick::None),
            1 if shape.gpu_milli < MILLI => {
                let mut best = (u64::MAX, 0u8);
                for i in 0..len {
                    let v = free[i];
                    if v < shape.gpu_milli || free[..i].contains(&v) {
                        continue;
                    }
                    free[i] = v - shape.gpu_milli;
                    let a = frag_of(&free[..len]);
                    free[i] = v;
                    let better = a < best.0
                        || (self.gpu_best_fit && a == best.0 && v < free[usize::from(best.1)]);
                    if better {
                        best = (a, i as u8);
                    }
                }
                (best.0, GpuPick::Share(best.1))
            }
            k => {
                let mut left = k;
                for v in free[..len].iter_mut() {
                    if left > 0 && *v == MILLI {
                        *v = 0;
                        left -= 1;
                    }
                }
                (frag_of(&free[..len]), GpuPick::Whole(k))
            }
        };
        Delta {
            frag: after as i64 - before as i64,
            after,
            gpus,
        }
    }
}

/// FGD's node score as its authors' simulator computes it: the fragmentation reduction
/// `−ΔF` (expected milli-GPU) through a sigmoid onto Kubernetes' 0–100 range, truncated to an
/// integer, `⌊100 · σ(−ΔF / 1000)⌋`. Truncation makes reductions within roughly 25–40
/// milli-GPU of each other tie, and ties then go to the first node in the seeded order; this
/// reproduces the paper's figures (exact `ΔF` with the same tie rule places about 0.8 points
/// fewer GPUs on the default trace).
pub fn fgd_score(frag_delta: i64, scale: f64) -> f64 {
    let reduction = -(frag_delta as f64) / scale;
    (100.0 / (1.0 + (-reduction / 1000.0).exp())).floor()
}

/// FGD's target workload: the most popular shapes covering 95% of the tasks (its simulator's
/// default), memory ignored, weighted by count.
pub fn target(shapes: &[Shape]) -> TargetDistribution {
    TargetDistribution::popular(shapes, 0.95, false)
}

/// The FGD policy.
pub struct FragScorer {
    cache: FragCache,
}

impl FragScorer {
    pub fn new(target: Arc<TargetDistribution>) -> Self {
        Self {
            cache: FragCache::new(target),
        }
    }

    pub fn choose(
        &mut self,
        cluster: &Cluster,
        shape: &Shape,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
        rank: &[u32],
    ) -> Option<Choice> {
        let mut best = Best::new(rank);
        // FGD's frag ignores memory, so the cached delta does not depend on it.
        let key = Shape {
            memory_mib: 0,
            ..*shape
        };
        let scale = self.cache.target().scale().max(1) as f64;
        self.cache.scan(cluster, &key, allowed, |n, f, d| {
            if f.memory_mib >= shape.memory_mib {
                best.offer(
                    -fgd_score(d.frag, scale),
                    Choice {
                        node: n,
                        gpus: d.gpus,
                    },
                );
            }
        });
        best.choice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{Allocation, GpuGrant, NodeSpec};
    use crate::scheduler::policy::tests::shape;

    fn target(types: &[(Shape, u64)]) -> Arc<TargetDistribution> {
        Arc::new(TargetDistribution::from_counts(
            types.iter().copied(),
            1.0,
            false,
        ))
    }

    fn take(c: &mut Cluster, node: NodeId, gpu: u8, milli: u32) {
        c.allocate(Allocation {
            owner: "x".into(),
            node,
            cpu_milli: 0,
            memory_mib: 0,
            gpus: vec![GpuGrant {
                gpu,
                milli,
                memory_bytes: 0,
            }],
            priority: 0,
            gang: None,
            shared_base: None,
        })
        .unwrap();
    }

    #[test]
    fn fills_the_gap_that_would_otherwise_be_a_fragment() {
        // Target: 0.5-GPU tasks only. GPU 0 has 600 free, GPU 1 is idle.
        let mut c = Cluster::new(vec![NodeSpec::trace("a", 64000, 1 << 20, 2, "T4")]).unwrap();
        take(&mut c, 0, 0, 400);
        let t = target(&[(shape(0, 1, 500), 1)]);
        let mut s = FragScorer::new(t);
        let rank = [0u32, 1];
        // A 0.6 task on GPU 0 leaves [0, 1000]: no fragment; on GPU 1 it leaves [600, 400]
        // and the 400 is a fragment to every 0.5 task.
        let ch = s.choose(&c, &shape(0, 1, 600), None, &rank).unwrap();
        assert_eq!(ch.gpus, GpuPick::Share(0));
    }

    #[test]
    fn prefers_the_node_where_fragmentation_grows_least() {
        // Node 0 has one GPU with 500 free; node 1 is idle. Target: whole-GPU tasks.
        let mut c = Cluster::new(vec![
            NodeSpec::trace("a", 64000, 1 << 20, 1, "T4"),
            NodeSpec::trace("b", 64000, 1 << 20, 1, "T4"),
        ])
        .unwrap();
        take(&mut c, 0, 0, 500);
        let mut s = FragScorer::new(target(&[(shape(0, 1, 1000), 1)]));
        let rank = [0u32, 1];
        // A 0.5 task on node 1 would turn an idle GPU into a fragment (+500); on node 0 it
        // removes one (−500).
        let ch = s.choose(&c, &shape(0, 1, 500), None, &rank).unwrap();
        assert_eq!(ch.node, 0);
    }

    #[test]
    fn cache_follows_node_changes_and_cluster_identity() {
        let mut c = Cluster::new(vec![
            NodeSpec::trace("a", 64000, 1 << 20, 1, "T4"),
            NodeSpec::trace("b", 64000, 1 << 20, 1, "T4"),
        ])
        .unwrap();
        let mut s = FragScorer::new(target(&[(shape(0, 1, 1000), 1)]));
        let rank = [0u32, 1];
        let sh = shape(0, 1, 500);
        let first = s.choose(&c, &sh, None, &rank).unwrap();
        take(&mut c, first.node, 0, 500);
        // The cached delta of the changed node must be recomputed: now it is the better one.
        assert_eq!(s.choose(&c, &sh, None, &rank).unwrap().node, first.node);
        // A clone diverging from the original must not reuse the original's cache entries.
        let mut other = c.clone();
        take(&mut other, first.node, 0, 500);
        assert_eq!(
            s.choose(&other, &sh, None, &rank).unwrap().node,
            1 - first.node
        );
    }
}

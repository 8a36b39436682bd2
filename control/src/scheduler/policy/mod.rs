//! Placement policies: which node, and which GPUs on it, a task of a given [`Shape`] goes to.
//!
//! Every policy scores each feasible node (lower is better) and the best wins; equal scores are
//! broken uniformly at random (as Kubernetes' scheduler does), except where a policy says
//! otherwise. The baselines follow their published descriptions as used in the FGD paper:
//! Random, Best-fit, Dot-product (Tetris), GPU Packing, and FGD itself; [`weft`] is ours.
//!
//! The hot loop reads only [`NodeFree`] aggregates to reject infeasible nodes, and the
//! fragmentation-based policies cache per-node results keyed on the node's version, so a
//! decision costs a scan plus the work for nodes that changed since the same shape was seen.

pub mod baselines;
pub mod fgd;
pub mod frag;
pub mod weft;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::inventory::{Cluster, GpuGrant, MAX_GPUS_PER_NODE, MILLI, NodeFree, NodeId};
use super::rng::SplitMix64;
pub use frag::{Shape, TargetDistribution};

/// The policies the bench compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Weft,
    Fgd,
    BestFit,
    DotProd,
    Packing,
    Random,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Weft,
        PolicyKind::Fgd,
        PolicyKind::BestFit,
        PolicyKind::DotProd,
        PolicyKind::Packing,
        PolicyKind::Random,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Weft => "weft",
            PolicyKind::Fgd => "fgd",
            PolicyKind::BestFit => "bestfit",
            PolicyKind::DotProd => "dotprod",
            PolicyKind::Packing => "packing",
            PolicyKind::Random => "random",
        }
    }

    /// Whether the policy needs a [`TargetDistribution`].
    pub fn needs_target(self) -> bool {
        matches!(self, PolicyKind::Weft | PolicyKind::Fgd)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown policy {s:?} (weft, fgd, bestfit, dotprod, packing, random)")
            })
    }
}

/// Which GPUs of the chosen node a task gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPick {
    /// No GPU.
    None,
    /// Part of GPU `index`.
    Share(u8),
    /// This many fully free GPUs, the lowest-indexed ones (free GPUs are interchangeable).
    Whole(u8),
}

/// A placement decision for one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub node: NodeId,
    pub gpus: GpuPick,
}

impl Choice {
    /// The per-GPU grants of this choice for a task of `shape` (GPU memory left to the caller).
    pub fn grants(&self, cluster: &Cluster, shape: &Shape) -> Vec<GpuGrant> {
        match self.gpus {
            GpuPick::None => Vec::new(),
            GpuPick::Share(g) => vec![GpuGrant {
                gpu: g,
                milli: shape.gpu_milli,
                memory_bytes: 0,
            }],
            GpuPick::Whole(k) => cluster
                .gpus(self.node)
                .iter()
                .enumerate()
                .filter(|(_, g)| g.milli == MILLI)
                .take(usize::from(k))
                .map(|(i, _)| GpuGrant {
                    gpu: i as u8,
                    milli: MILLI,
                    memory_bytes: 0,
                })
                .collect(),
        }
    }
}

/// Whether a task of `shape` fits node `f` now, from the aggregates alone.
pub fn fits(f: &NodeFree, shape: &Shape) -> bool {
    // A task without GPUs ignores GPU models (as the trace's GPU filter does).
    f.cpu_milli >= shape.cpu_milli
        && f.memory_mib >= shape.memory_mib
        && match shape.num_gpu {
            0 => true,
            1 if shape.gpu_milli < MILLI => {
                shape.models.contains(f.model) && f.max_gpu_milli >= shape.gpu_milli
            }
            k => shape.models.contains(f.model) && f.full_gpus >= k,
        }
}

/// Free milli-GPU of node `n`'s GPUs, copied to a stack buffer (hot path: no allocation).
pub(crate) fn free_milli(cluster: &Cluster, n: NodeId) -> ([u32; MAX_GPUS_PER_NODE], usize) {
    let mut buf = [0u32; MAX_GPUS_PER_NODE];
    let gpus = cluster.gpus(n);
    for (b, g) in buf.iter_mut().zip(gpus) {
        *b = g.milli;
    }
    (buf, gpus.len())
}

/// Best-fit GPU for a shared task: the one with the least free compute that still fits it.
pub(crate) fn best_fit_gpu(free: &[u32], milli: u32) -> Option<u8> {
    let mut best: Option<(u32, u8)> = None;
    for (i, &f) in free.iter().enumerate() {
        if f >= milli && best.is_none_or(|(b, _)| f < b) {
            best = Some((f, i as u8));
        }
    }
    best.map(|(_, i)| i)
}

/// The GPUs a task takes on a node that fits it, chosen best-fit for a shared GPU.
pub(crate) fn default_pick(free: &[u32], shape: &Shape) -> GpuPick {
    match shape.num_gpu {
        0 => GpuPick::None,
        1 if shape.gpu_milli < MILLI => {
            GpuPick::Share(best_fit_gpu(free, shape.gpu_milli).unwrap_or(0))
        }
        k => GpuPick::Whole(k),
    }
}

/// The running minimum of a scan; equal scores go to the node with the lowest rank.
///
/// Ranks are a seeded random permutation of the nodes, fixed for a [`Placer`]'s lifetime: this
/// is how the FGD authors' simulator breaks ties (their Kubernetes fork picks the
/// lexicographically smallest node name, and node names carry a per-seed random prefix). A
/// consistent order makes tied decisions land on the same nodes, which packs instead of
/// spreading, and it makes every decision reproducible from the seed.
pub(crate) struct Best<'r> {
    score: (f64, f64),
    choice: Option<Choice>,
    rank: &'r [u32],
}

impl<'r> Best<'r> {
    pub(crate) fn new(rank: &'r [u32]) -> Self {
        Self {
            score: (f64::INFINITY, f64::INFINITY),
            choice: None,
            rank,
        }
    }

    pub(crate) fn offer(&mut self, score: f64, choice: Choice) {
        self.offer2((score, 0.0), choice);
    }

    /// Lexicographic (primary, secondary) score, lower first.
    pub(crate) fn offer2(&mut self, score: (f64, f64), choice: Choice) {
        let better = match self.choice {
            None => true,
            Some(c) => {
                score < self.score
                    || (score == self.score
                        && self.rank[choice.node as usize] < self.rank[c.node as usize])
            }
        };
        if better {
            self.score = score;
            self.choice = Some(choice);
        }
    }

    pub(crate) fn choice(&self) -> Option<Choice> {
        self.choice
    }
}

/// A policy with its state (seeded node order, random stream, caches): decides where each
/// task goes.
pub struct Placer {
    kind: PolicyKind,
    seed: u64,
    rng: SplitMix64,
    rank: Vec<u32>,
    fgd: Option<fgd::FragScorer>,
    weft: Option<weft::WeftScorer>,
}

impl Placer {
    /// A placer for `kind`; FGD and weft need the expected workload (`target`).
    pub fn new(kind: PolicyKind, seed: u64, target: Option<Arc<TargetDistribution>>) -> Self {
        let target = || {
            target
                .clone()
                .unwrap_or_else(|| Arc::new(TargetDistribution::from_counts([], 1.0, false)))
        };
        Self {
            kind,
            seed,
            rng: SplitMix64::new(seed),
            rank: Vec::new(),
            fgd: (kind == PolicyKind::Fgd).then(|| fgd::FragScorer::new(target())),
            weft: (kind == PolicyKind::Weft).then(|| weft::WeftScorer::new(target())),
        }
    }

    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// The tie-break order for `n` nodes: a permutation drawn from the seed (its own stream,
    /// so it does not depend on how many random draws decisions made before).
    fn ranks(&mut self, n: usize) -> &[u32] {
        if self.rank.len() != n {
            let mut order: Vec<u32> = (0..n as u32).collect();
            SplitMix64::new(self.seed ^ 0x5EED_F0DE).shuffle(&mut order);
            self.rank = vec![0; n];
            for (r, &node) in order.iter().enumerate() {
                self.rank[node as usize] = r as u32;
            }
        }
        &self.rank
    }

    /// The node and GPUs for a task of `shape`, among nodes `allowed` accepts (all when `None`);
    /// `None` when no node fits.
    pub fn choose(
        &mut self,
        cluster: &Cluster,
        shape: &Shape,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Option<Choice> {
        self.ranks(cluster.len());
        let (rank, rng) = (&self.rank[..], &mut self.rng);
        match self.kind {
            PolicyKind::Random => baselines::random(cluster, shape, allowed, rng),
            PolicyKind::BestFit => baselines::best_fit(cluster, shape, allowed, rank),
            PolicyKind::DotProd => baselines::dot_product(cluster, shape, allowed, rank),
            PolicyKind::Packing => baselines::packing(cluster, shape, allowed, rank),
            PolicyKind::Fgd => self.fgd.as_mut()?.choose(cluster, shape, allowed, rank),
            PolicyKind::Weft => self.weft.as_mut()?.choose(cluster, shape, allowed, rank),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{ModelSet, NodeSpec};

    pub(crate) fn shape(cpu: u32, num_gpu: u8, gpu_milli: u32) -> Shape {
        Shape {
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu,
            gpu_milli,
            models: ModelSet::ANY,
        }
    }

    #[test]
    fn fits_reads_the_aggregates() {
        let c = Cluster::new(vec![NodeSpec::trace("a", 4000, 100, 2, "T4")]).unwrap();
        let f = c.node(0);
        assert!(fits(f, &shape(4000, 2, 1000)));
        assert!(!fits(f, &shape(4001, 0, 0)));
        assert!(!fits(f, &shape(0, 3, 1000)));
        assert!(fits(f, &shape(0, 1, 999)));
        let mut wrong = shape(0, 1, 100);
        wrong.models = ModelSet::NONE;
        assert!(!fits(f, &wrong));
        wrong.num_gpu = 0;
        assert!(fits(f, &wrong), "no GPU, no model constraint");
        let mut mem = shape(0, 0, 0);
        mem.memory_mib = 101;
        assert!(!fits(f, &mem));
    }

    #[test]
    fn best_fit_gpu_takes_the_tightest() {
        assert_eq!(best_fit_gpu(&[1000, 400, 600, 400], 300), Some(1));
        assert_eq!(best_fit_gpu(&[1000, 400], 500), Some(0));
        assert_eq!(best_fit_gpu(&[100], 500), None);
    }

    #[test]
    fn ties_go_to_the_lowest_rank() {
        let rank = [2, 0, 1, 3];
        let mut b = Best::new(&rank);
        for n in [0, 2, 1] {
            b.offer(
                1.0,
                Choice {
                    node: n,
                    gpus: GpuPick::None,
                },
            );
        }
        b.offer(
            2.0,
            Choice {
                node: 3,
                gpus: GpuPick::None,
            },
        );
        assert_eq!(b.choice().unwrap().node, 1);
        b.offer(
            0.5,
            Choice {
                node: 3,
                gpus: GpuPick::None,
            },
        );
        assert_eq!(b.choice().unwrap().node, 3, "a better score beats any rank");
    }

    #[test]
    fn the_node_order_is_a_seeded_permutation() {
        let mut a = Placer::new(PolicyKind::BestFit, 7, None);
        let mut b = Placer::new(PolicyKind::BestFit, 7, None);
        let mut c = Placer::new(PolicyKind::BestFit, 8, None);
        let ra = a.ranks(100).to_vec();
        assert_eq!(ra, b.ranks(100));
        assert_ne!(ra, c.ranks(100));
        let mut sorted = ra.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
    }

    #[test]
    fn policy_names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>().unwrap(), p);
        }
        assert!("tetris".parse::<PolicyKind>().is_err());
    }
}

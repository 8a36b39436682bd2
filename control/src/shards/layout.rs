//! The model layout of a training job: tensor-parallel degree × pipeline stages ×
//! data-parallel replicas = workers; pipeline stages as contiguous layer ranges balanced by
//! the memory estimate; and under ZeRO, which data-parallel rank owns which slice of the
//! optimizer state (stage ≥ 1), gradients (≥ 2) and parameters (3).
//!
//! Rank numbering (Megatron's order): `rank = dp_index × (pp × tp) + stage × tp + tp_index`.
//! A partition of `n` elements over `d` ranks gives the first `n mod d` ranks one element
//! more (exact, no element dropped or shared).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutSpec {
    pub workers: u32,
    pub tensor_parallel: u32,
    pub pipeline_stages: u32,
    pub gpus_per_node: u32,
    /// Estimated memory of each layer (bytes), in model order.
    pub layer_bytes: Vec<u64>,
    /// Parameters of each pipeline stage are counted from the layers' share of the memory.
    pub parameters: u64,
    /// 0 (none) ..= 3.
    pub zero_stage: u8,
}

/// One rank's place in the layout and what it owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankLayout {
    pub rank: u32,
    pub tp_index: u32,
    pub stage: u32,
    pub dp_index: u32,
    /// The stage's layers, `[first, end)`.
    pub layers: (u32, u32),
    /// Parameter index range `[start, end)` of the stage's parameters whose optimizer state,
    /// gradients and/or parameters this rank owns under ZeRO (per `owns`), or the whole
    /// stage when nothing is partitioned.
    pub partition: (u64, u64),
    /// What the partition covers: a subset of `optimizer`, `gradients`, `parameters`.
    pub owns: Vec<String>,
}

/// `[start, end)` of part `i` of `n` elements split over `d` parts (first `n mod d` larger).
pub fn part(n: u64, d: u64, i: u64) -> (u64, u64) {
    let (q, r) = (n / d, n % d);
    let start = i * q + i.min(r);
    (start, start + q + u64::from(i < r))
}

/// Contiguous ranges of `weights` into `k` non-empty groups minimizing the largest group sum:
/// binary search on that limit with a greedy cut (fewest groups under the limit), then groups
/// of two or more layers are split until there are exactly `k` (splitting never raises the
/// largest sum).
pub fn balance(weights: &[u64], k: usize) -> Result<Vec<(usize, usize)>, String> {
    if k == 0 || k > weights.len() {
        return Err(format!("{k} pipeline stages for {} layers: need 1..=layers", weights.len()));
    }
    let greedy = |limit: u64| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let (mut start, mut sum) = (0, 0u64);
        for (i, &w) in weights.iter().enumerate() {
            if sum + w > limit && i > start {
                out.push((start, i));
                start = i;
                sum = 0;
            }
            sum += w;
        }
        out.push((start, weights.len()));
        out
    };
    let (mut lo, mut hi) = (weights.iter().copied().max().unwrap_or(0), weights.iter().sum::<u64>());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if greedy(mid).len() <= k { hi = mid } else { lo = mid + 1 }
    }
    let mut groups = greedy(lo);
    while groups.len() < k {
        let at = groups.iter().rposition(|(a, b)| b - a >= 2).ok_or("no layer left to split")?;
        let (a, b) = groups[at];
        groups[at] = (a, b - 1);
        groups.insert(at + 1, (b - 1, b));
    }
    Ok(groups)
}

/// The layout of every rank, or why it is invalid (naming the field).
pub fn plan(spec: &LayoutSpec) -> Result<Vec<RankLayout>, (&'static str, String)> {
    let (tp, pp) = (spec.tensor_parallel, spec.pipeline_stages);
    if tp == 0 || spec.gpus_per_node == 0 || !spec.gpus_per_node.is_multiple_of(tp) {
        return Err(("tensor_parallel", format!("{tp} must divide the GPUs of a node ({})", spec.gpus_per_node)));
    }
    if pp == 0 || spec.workers == 0 || !spec.workers.is_multiple_of(tp * pp) {
        return Err(("workers", format!("{} is not a multiple of tensor_parallel × pipeline_stages = {}", spec.workers, tp * pp)));
    }
    if spec.zero_stage > 3 {
        return Err(("zero_stage", format!("{} is not 0..=3", spec.zero_stage)));
    }
    let stages = balance(&spec.layer_bytes, pp as usize).map_err(|e| ("pipeline_stages", e))?;
    let total_bytes: u64 = spec.layer_bytes.iter().sum::<u64>().max(1);
    let dp = spec.workers / (tp * pp);
    // Parameters per stage, proportional to its memory (exact: the last stage takes the rest).
    let mut stage_params = Vec::new();
    let mut given = 0;
    for (i, (a, b)) in stages.iter().enumerate() {
        let bytes: u64 = spec.layer_bytes[*a..*b].iter().sum();
        let p = if i + 1 == stages.len() {
            spec.parameters - given
        } else {
            (u128::from(spec.parameters) * u128::from(bytes) / u128::from(total_bytes)) as u64
        };
        given += p;
        stage_params.push(p);
    }
    let owns: Vec<String> = ["optimizer", "gradients", "parameters"].iter().take(usize::from(spec.zero_stage)).map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    for rank in 0..spec.workers {
        let (dp_index, rest) = (rank / (tp * pp), rank % (tp * pp));
        let (stage, tp_index) = (rest / tp, rest % tp);
        let n = stage_params[stage as usize];
        let partition = if spec.zero_stage == 0 { (0, n) } else { part(n, u64::from(dp), u64::from(dp_index)) };
        let (a, b) = stages[stage as usize];
        out.push(RankLayout { rank, tp_index, stage, dp_index, layers: (a as u32, b as u32), partition, owns: owns.clone() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stages_balance_memory_and_invalid_layouts_name_the_field() {
        let spec = LayoutSpec {
            workers: 16,
            tensor_parallel: 2,
            pipeline_stages: 4,
            gpus_per_node: 8,
            layer_bytes: vec![10, 10, 10, 10, 10, 10, 10, 10, 40, 40],
            parameters: 1_000_000,
            zero_stage: 1,
        };
        let l = plan(&spec).unwrap();
        let stages: Vec<(u32, u32)> = (0..4).map(|s| l.iter().find(|r| r.stage == s).unwrap().layers).collect();
        assert_eq!(stages, vec![(0, 4), (4, 8), (8, 9), (9, 10)]);
        assert_eq!(plan(&LayoutSpec { tensor_parallel: 3, ..spec.clone() }).unwrap_err().0, "tensor_parallel");
        assert_eq!(plan(&LayoutSpec { workers: 12, ..spec.clone() }).unwrap_err().0, "workers");
        assert_eq!(plan(&LayoutSpec { pipeline_stages: 11, workers: 22, gpus_per_node: 2, ..spec }).unwrap_err().0, "pipeline_stages");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Under every ZeRO stage, within each (stage, tensor slice) data-parallel group, every
        /// parameter index of the stage is owned by exactly one rank.
        #[test]
        fn every_partition_has_exactly_one_owner_per_data_parallel_group(
            tp_pow in 0u32..3, pp in 1u32..5, dp in 1u32..9, zero in 0u8..4, params in 1u64..100_000, extra in 0usize..6,
        ) {
            let tp = 1 << tp_pow;
            let layers: Vec<u64> = (0..(pp as usize + extra)).map(|i| 5 + (i as u64 * 37) % 11).collect();
            let spec = LayoutSpec { workers: tp * pp * dp, tensor_parallel: tp, pipeline_stages: pp, gpus_per_node: 8,
                layer_bytes: layers.clone(), parameters: params, zero_stage: zero };
            let l = plan(&spec).unwrap();
            prop_assert_eq!(l.len() as u32, tp * pp * dp);
            // Stages cover every layer once, in order.
            let mut covered = 0;
            for s in 0..pp {
                let (a, b) = l.iter().find(|r| r.stage == s).unwrap().layers;
                prop_assert_eq!(a, covered);
                prop_assert!(b > a);
                covered = b;
            }
            prop_assert_eq!(covered as usize, layers.len());
            let mut stage_total = 0u64;
            for s in 0..pp {
                for t in 0..tp {
                    let mut group: Vec<(u64, u64)> = l.iter().filter(|r| r.stage == s && r.tp_index == t).map(|r| r.partition).collect();
                    prop_assert_eq!(group.len() as u32, dp);
                    if zero == 0 {
                        prop_assert!(group.windows(2).all(|w| w[0] == w[1]), "replicated without ZeRO");
                        if t == 0 { stage_total += group[0].1; }
                        continue;
                    }
                    group.sort_unstable();
                    prop_assert_eq!(group[0].0, 0);
                    for w in group.windows(2) {
                        prop_assert_eq!(w[0].1, w[1].0, "no gap, no overlap");
                    }
                    if t == 0 { stage_total += group.last().unwrap().1; }
                }
            }
            prop_assert_eq!(stage_total, params, "every parameter in exactly one stage");
        }
    }
}

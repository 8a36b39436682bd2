//! The global batch split over data-parallel ranks, in exact integer arithmetic, so it is
//! identical before and after every rescale.
//!
//! Remainders: with `B` samples over `D` ranks, the first `B mod D` ranks (in rank order) take
//! `⌊B/D⌋ + 1` samples and the others `⌊B/D⌋`. Every rank runs the same number of
//! gradient-accumulation steps `g = ⌈max samples per rank / max micro-batch⌉` (synchronous
//! training steps together); within a rank the first `b mod g` micro-batches take one sample
//! more than the others.

use serde::{Deserialize, Serialize};

/// One data-parallel rank's share of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankBatch {
    pub samples: u64,
    pub accumulation_steps: u64,
    /// Sizes of the rank's micro-batches in one step (sum = `samples`).
    pub micro_batches: Vec<u64>,
}

/// Most micro-batches (gradient-accumulation steps) a rank may run per step: far beyond any
/// real job, and it keeps a map's size bounded whatever the numbers asked for.
pub const MAX_ACCUMULATION_STEPS: u64 = 65_536;

/// Splits `global` samples over `ranks` data-parallel ranks with micro-batches of at most
/// `max_micro` samples.
pub fn split(global: u64, ranks: u64, max_micro: u64) -> Result<Vec<RankBatch>, String> {
    if ranks == 0 {
        return Err("data-parallel degree must be at least 1".into());
    }
    if max_micro == 0 {
        return Err("max micro-batch must be at least 1".into());
    }
    if global < ranks {
        return Err(format!("global batch {global} is smaller than the data-parallel degree {ranks}: a rank would get no sample"));
    }
    let (base, rem) = (global / ranks, global % ranks);
    let largest = base + u64::from(rem > 0);
    let g = largest.div_ceil(max_micro);
    if g > MAX_ACCUMULATION_STEPS {
        return Err(format!(
            "global batch {global} over {ranks} ranks needs {g} micro-batches of at most {max_micro} per rank and step; \
             the limit is {MAX_ACCUMULATION_STEPS} (raise max_micro_batch or lower global_batch)"
        ));
    }
    Ok((0..ranks)
        .map(|r| {
            let b = base + u64::from(r < rem);
            let (q, m) = (b / g, b % g);
            RankBatch { samples: b, accumulation_steps: g, micro_batches: (0..g).map(|i| q + u64::from(i < m)).collect() }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn remainders_go_to_the_first_ranks() {
        let s = split(1024, 6, 64).unwrap();
        let samples: Vec<u64> = s.iter().map(|r| r.samples).collect();
        assert_eq!(samples, vec![171, 171, 171, 171, 170, 170]);
        assert!(s.iter().all(|r| r.accumulation_steps == 3 && r.micro_batches.iter().all(|&m| m <= 64)));
        assert_eq!(s[0].micro_batches, vec![57, 57, 57]);
        assert_eq!(s[5].micro_batches, vec![57, 57, 56]);
        assert!(split(3, 4, 8).is_err());
    }

    proptest! {
        #[test]
        fn the_global_batch_is_exact_for_any_degree(global in 1u64..100_000, ranks in 1u64..512, micro in 1u64..256) {
            prop_assume!(global >= ranks);
            let s = split(global, ranks, micro).unwrap();
            prop_assert_eq!(s.iter().map(|r| r.samples).sum::<u64>(), global);
            let g = s[0].accumulation_steps;
            for r in &s {
                prop_assert_eq!(r.accumulation_steps, g);
                prop_assert_eq!(r.micro_batches.iter().sum::<u64>(), r.samples);
                prop_assert!(r.micro_batches.iter().all(|&m| m <= micro));
            }
            let (lo, hi) = (s.iter().map(|r| r.samples).min().unwrap(), s.iter().map(|r| r.samples).max().unwrap());
            prop_assert!(hi - lo <= 1);
        }
    }
}

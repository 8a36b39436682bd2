//! Which rank reads which data shard: rendezvous (highest-random-weight) hashing with a size
//! cap, sticky across rescales.
//!
//! Every (shard, worker) pair has a stable pseudo-random score; a shard prefers workers in
//! score order. On a rescale a shard stays with its owner unless the owner left, or a newly
//! joined worker outranks the owner (the rendezvous rule: each shard then moves with
//! probability new/N, the 1/N ideal, and only ever to a new worker). Placement is capped at
//! `(1 + slack) × total size / N` per worker, so sizes stay balanced: shards over the cap and
//! orphans go, largest first, to their best-ranked worker with room (or the least loaded).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A data shard: an id and its size (bytes or samples; only ratios matter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub id: String,
    pub size: u64,
}

/// Shard id → owning worker.
pub type Assignment = BTreeMap<String, String>;

/// FNV-1a, then a SplitMix64 finalizer: stable across platforms and Rust versions (std's
/// hasher is not), so every control node computes the same map.
fn score(shard: &str, worker: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in shard.bytes().chain([0xff]).chain(worker.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The per-worker cap for `total` over `n` workers (never below the largest shard).
fn cap(total: u64, n: usize, slack: f64, largest: u64) -> u64 {
    (((total as f64 / n as f64) * (1.0 + slack)).ceil() as u64).max(largest)
}

/// The assignment of `shards` to `workers` (non-empty), continuing from `prev` when given.
pub fn assign(shards: &[Shard], workers: &[String], prev: Option<&Assignment>, slack: f64) -> Assignment {
    assert!(!workers.is_empty(), "assign needs at least one worker");
    let total: u64 = shards.iter().map(|s| s.size).sum();
    let largest = shards.iter().map(|s| s.size).max().unwrap_or(0);
    let cap = cap(total, workers.len(), slack, largest);
    let before: std::collections::BTreeSet<&str> = prev.map(|p| p.values().map(String::as_str).collect()).unwrap_or_default();
    let joined: Vec<&String> = workers.iter().filter(|w| prev.is_some() && !before.contains(w.as_str())).collect();
    let alive: std::collections::BTreeSet<&str> = workers.iter().map(String::as_str).collect();
    let mut load: BTreeMap<&str, u64> = workers.iter().map(|w| (w.as_str(), 0)).collect();
    let mut owner: Assignment = Assignment::new();
    let mut kept: BTreeMap<&str, Vec<&Shard>> = BTreeMap::new();
    let mut open: Vec<&Shard> = Vec::new();
    for s in shards {
        let keep = prev.and_then(|p| p.get(&s.id)).filter(|o| alive.contains(o.as_str())).filter(|o| {
            let mine = score(&s.id, o);
            joined.iter().all(|j| score(&s.id, j) < mine)
        });
        match keep {
            Some(o) => kept.entry(alive.get(o.as_str()).copied().expect("alive")).or_default().push(s),
            None => open.push(s),
        }
    }
    // Kept shards up to the cap, the ones the owner ranks highest first.
    for (w, mut list) in kept {
        list.sort_by_key(|s| std::cmp::Reverse(score(&s.id, w)));
        for s in list {
            let l = load.get_mut(w).expect("worker");
            if *l + s.size <= cap {
                *l += s.size;
                owner.insert(s.id.clone(), w.to_string());
            } else {
                open.push(s);
            }
        }
    }
    // The rest, largest first (ties by id, so the result is deterministic).
    open.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    for s in open {
        let mut ranked: Vec<&String> = workers.iter().collect();
        ranked.sort_by_key(|w| std::cmp::Reverse(score(&s.id, w)));
        let to = ranked
            .iter()
            .find(|w| load[w.as_str()] + s.size <= cap)
            .or_else(|| ranked.iter().min_by_key(|w| load[w.as_str()]))
            .expect("a worker");
        *load.get_mut(to.as_str()).expect("worker") += s.size;
        owner.insert(s.id.clone(), to.to_string());
    }
    owner
}

/// The naive baseline: shard i (in the given order) → worker i mod N.
pub fn modulo(shards: &[Shard], workers: &[String]) -> Assignment {
    shards.iter().enumerate().map(|(i, s)| (s.id.clone(), workers[i % workers.len()].clone())).collect()
}

/// Share of shards (by count) whose owner differs between `a` and `b`.
pub fn moved(a: &Assignment, b: &Assignment) -> f64 {
    if a.is_empty() {
        return 0.0;
    }
    a.iter().filter(|(id, w)| b.get(*id) != Some(*w)).count() as f64 / a.len() as f64
}

/// Largest per-worker size over the mean per-worker size (1.0 = perfectly even).
pub fn imbalance(shards: &[Shard], a: &Assignment, workers: &[String]) -> f64 {
    let mut load: BTreeMap<&str, u64> = workers.iter().map(|w| (w.as_str(), 0)).collect();
    for s in shards {
        if let Some(w) = a.get(&s.id) {
            *load.entry(w.as_str()).or_insert(0) += s.size;
        }
    }
    let total: u64 = load.values().sum();
    let max = load.values().copied().max().unwrap_or(0);
    if total == 0 { 1.0 } else { max as f64 * workers.len() as f64 / total as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shards(n: usize) -> Vec<Shard> {
        (0..n).map(|i| Shard { id: format!("s{i:05}"), size: 1_000 + (i as u64 * 7919) % 3_000 }).collect()
    }

    fn workers(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("w{i}")).collect()
    }

    #[test]
    fn rescales_move_about_the_ideal_share_and_stay_balanced() {
        let s = shards(2_000);
        let a4 = assign(&s, &workers(4), None, 0.05);
        let a6 = assign(&s, &workers(6), Some(&a4), 0.05);
        let a3 = assign(&s, &workers(3), Some(&a6), 0.05);
        // Ideal: 2 of 6 workers are new → 1/3 moves; 3 of 6 leave → 1/2 moves.
        assert!((moved(&a4, &a6) - 1.0 / 3.0).abs() < 0.06, "4→6 moved {}", moved(&a4, &a6));
        assert!((moved(&a6, &a3) - 0.5).abs() < 0.06, "6→3 moved {}", moved(&a6, &a3));
        for (a, n) in [(&a4, 4), (&a6, 6), (&a3, 3)] {
            assert!(imbalance(&s, a, &workers(n)) <= 1.05 + 1e-9, "{n} workers: {}", imbalance(&s, a, &workers(n)));
        }
        // The naive baseline moves most of the data.
        assert!(moved(&modulo(&s, &workers(4)), &modulo(&s, &workers(6))) > 0.6);
    }

    #[test]
    fn one_more_worker_moves_about_one_in_n() {
        let s = shards(10_000);
        let a = assign(&s, &workers(100), None, 0.05);
        let b = assign(&s, &workers(101), Some(&a), 0.05);
        assert!(moved(&a, &b) < 0.03, "100→101 moved {}", moved(&a, &b));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_shard_is_owned_by_exactly_one_live_worker(n in 1usize..300, w1 in 1usize..12, w2 in 1usize..12) {
            let s = shards(n);
            let a = assign(&s, &workers(w1), None, 0.05);
            let b = assign(&s, &workers(w2), Some(&a), 0.05);
            for m in [(&a, w1), (&b, w2)] {
                prop_assert_eq!(m.0.len(), n);
                let ws = workers(m.1);
                prop_assert!(m.0.values().all(|w| ws.contains(w)));
            }
        }
    }
}

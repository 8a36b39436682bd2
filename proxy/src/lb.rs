//! Load balancing over a cluster's endpoints: power of two choices over
//! EWMA latency × (in-flight + 1) by default, or round robin. Ejected endpoints are skipped,
//! and so are endpoints this request already tried, when another one is available.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::config::LbPolicy;

/// Load signals of one endpoint, updated lock-free from every worker.
#[derive(Debug)]
pub struct Load {
    /// EWMA of time-to-response-headers in µs, stored as f64 bits.
    ewma_us: AtomicU64,
    in_flight: AtomicU32,
}

/// Weight of the newest sample in the EWMA.
const ALPHA: f64 = 0.3;
/// Prior for an endpoint with no samples yet: optimistic, so new endpoints get traffic.
const PRIOR_US: f64 = 1_000.0;

impl Default for Load {
    fn default() -> Self {
        Load { ewma_us: AtomicU64::new(PRIOR_US.to_bits()), in_flight: AtomicU32::new(0) }
    }
}

impl Load {
    pub fn cost(&self) -> f64 {
        f64::from_bits(self.ewma_us.load(Relaxed)) * (self.in_flight.load(Relaxed) as f64 + 1.0)
    }
    pub fn ewma_us(&self) -> f64 {
        f64::from_bits(self.ewma_us.load(Relaxed))
    }
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }
    pub fn start(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }
    pub fn end(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }
    /// Fold in one observed latency. A racing update may be lost; that only costs one sample.
    pub fn observe(&self, latency_us: f64) {
        let old = f64::from_bits(self.ewma_us.load(Relaxed));
        self.ewma_us.store((old * (1.0 - ALPHA) + latency_us * ALPHA).to_bits(), Relaxed);
    }
}

/// Choose an endpoint index. `available(i)` says whether endpoint `i` may take traffic;
/// `tried` lists endpoints this request already used (avoided unless nothing else is left).
/// `random(n)` returns a uniform index below `n`.
pub fn pick(
    policy: LbPolicy,
    n: usize,
    available: impl Fn(usize) -> bool,
    cost: impl Fn(usize) -> f64,
    tried: &[usize],
    rr: &AtomicUsize,
    mut random: impl FnMut(usize) -> usize,
) -> Option<usize> {
    let fresh = |i: usize| available(i) && !tried.contains(&i);
    let mut count = (0..n).filter(|i| fresh(*i)).count();
    let usable: &dyn Fn(usize) -> bool = if count > 0 {
        &fresh
    } else {
        count = (0..n).filter(|i| available(*i)).count();
        &available
    };
    let nth = |k: usize| (0..n).filter(|i| usable(*i)).nth(k);
    match count {
        0 => None,
        1 => nth(0),
        _ => match policy {
            LbPolicy::RoundRobin => nth(rr.fetch_add(1, Relaxed) % count),
            LbPolicy::P2cEwma => {
                let a = random(count);
                let mut b = random(count - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (nth(a)?, nth(b)?);
                Some(if cost(b) < cost(a) { b } else { a })
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2c_prefers_cheaper_endpoint() {
        let costs = [10.0, 1.0, 5.0];
        let rr = AtomicUsize::new(0);
        let mut seq = [0usize, 0].into_iter().cycle();
        // random picks candidates 0 and 1 → cheaper is 1.
        let got = pick(LbPolicy::P2cEwma, 3, |_| true, |i| costs[i], &[], &rr, |_| seq.next().unwrap());
        assert_eq!(got, Some(1));
    }

    #[test]
    fn skips_ejected_and_tried_but_falls_back() {
        let rr = AtomicUsize::new(0);
        let got = pick(LbPolicy::RoundRobin, 3, |i| i != 1, |_| 0.0, &[0], &rr, |_| 0);
        assert_eq!(got, Some(2));
        let only_tried = pick(LbPolicy::P2cEwma, 2, |i| i == 0, |_| 0.0, &[0], &rr, |_| 0);
        assert_eq!(only_tried, Some(0), "a tried endpoint beats none at all");
        assert_eq!(pick(LbPolicy::P2cEwma, 2, |_| false, |_| 0.0, &[], &rr, |_| 0), None);
    }

    #[test]
    fn round_robin_cycles() {
        let rr = AtomicUsize::new(0);
        let seq: Vec<_> = (0..6)
            .map(|_| pick(LbPolicy::RoundRobin, 3, |_| true, |_| 0.0, &[], &rr, |_| 0).unwrap())
            .collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn ewma_moves_toward_samples() {
        let l = Load::default();
        for _ in 0..50 {
            l.observe(100.0);
        }
        assert!((l.ewma_us() - 100.0).abs() < 1.0);
        l.start();
        assert!((l.cost() - 2.0 * l.ewma_us()).abs() < 1e-9);
    }
}

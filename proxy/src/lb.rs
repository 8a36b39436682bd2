//! Load balancing over a cluster's endpoints: power of two choices over
//! EWMA latency × (in-flight + 1) by default, or round robin. Ejected endpoints are skipped,
//! and so are endpoints this request already tried, when another one is available.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::config::LbPolicy;

/// Load signals of one endpoint, updated lock-free from every worker.
///
/// The latency estimate is a peak EWMA that decays with time, as in Finagle and Linkerd: a
/// sample above the current estimate replaces it at once (a slowing endpoint is avoided at
/// once), a lower one is blended in, and an estimate nobody refreshes decays toward zero with
/// time constant [`DECAY_MS`]. Without that decay an endpoint that lost one comparison is never
/// measured again: with two endpoints p2c compares both on every pick, so sequential traffic
/// would stay on whichever looked faster once, for good. The estimate only decays while nothing
/// is in flight to the endpoint (a hung endpoint holding requests must not look free), and a
/// try that failed (connect failure, reset, timeout) counts as a sample of at least
/// [`FAILURE_US`], so a dead endpoint is not the cheapest one.
#[derive(Debug)]
pub struct Load {
    /// Estimate of time-to-response-headers in µs as of `stamp_ms`, stored as f64 bits.
    ewma_us: AtomicU64,
    /// When `ewma_us` was last set, on the `clock` millisecond scale.
    stamp_ms: AtomicU64,
    in_flight: AtomicU32,
}

/// Weight of a sample below the current estimate.
const ALPHA: f64 = 0.3;
/// Prior for an endpoint with no samples yet: optimistic, so new endpoints get traffic.
const PRIOR_US: f64 = 1_000.0;
/// The sample a failed try counts as, at least: one second.
pub const FAILURE_US: f64 = 1_000_000.0;
/// Time constant of the decay of an unrefreshed estimate (Linkerd's default): an endpoint
/// that looked twice as slow is tried again after about 7 s without samples.
pub const DECAY_MS: f64 = 10_000.0;

impl Load {
    /// A new endpoint's load; its prior starts decaying at `now_ms` (not earlier, or endpoints
    /// added to a running cluster would look free and draw every request until they answer).
    pub fn new(now_ms: u64) -> Load {
        Load {
            ewma_us: AtomicU64::new(PRIOR_US.to_bits()),
            stamp_ms: AtomicU64::new(now_ms),
            in_flight: AtomicU32::new(0),
        }
    }
    /// Estimated cost of sending one more request at `now_ms`: latency × (in-flight + 1).
    pub fn cost(&self, now_ms: u64) -> f64 {
        self.ewma_us(now_ms) * (self.in_flight.load(Relaxed) as f64 + 1.0)
    }
    /// The latency estimate at `now_ms`, decayed since its last sample if nothing is in flight.
    pub fn ewma_us(&self, now_ms: u64) -> f64 {
        let ewma = f64::from_bits(self.ewma_us.load(Relaxed));
        if self.in_flight.load(Relaxed) > 0 {
            return ewma;
        }
        match now_ms.saturating_sub(self.stamp_ms.load(Relaxed)) {
            0 => ewma,
            idle => ewma * (-(idle as f64) / DECAY_MS).exp(),
        }
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
    /// Fold in the try that started at `started` and ended now: its time to the response head,
    /// or, if it `failed`, a failure sample (see [`FAILURE_US`]).
    pub fn finished(&self, started: std::time::Instant, failed: bool) {
        let done = std::time::Instant::now();
        let (us, now) = ((done - started).as_micros() as f64, crate::clock::ms_of(done));
        if failed { self.failed(us, now) } else { self.observe(us, now) }
    }

    /// Fold in a try that failed after `elapsed_us` (see [`FAILURE_US`]).
    pub fn failed(&self, elapsed_us: f64, now_ms: u64) {
        self.observe(elapsed_us.max(FAILURE_US), now_ms);
    }

    /// Fold in one latency observed at `now_ms`. A racing update may be lost; that only costs
    /// one sample.
    pub fn observe(&self, latency_us: f64, now_ms: u64) {
        let current = self.ewma_us(now_ms);
        let next = if latency_us > current { latency_us } else { current + (latency_us - current) * ALPHA };
        self.ewma_us.store(next.to_bits(), Relaxed);
        self.stamp_ms.store(now_ms, Relaxed);
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
        let l = Load::new(1);
        for _ in 0..50 {
            l.observe(100.0, 1);
        }
        assert!((l.ewma_us(1) - 100.0).abs() < 1.0);
        l.start();
        assert!((l.cost(1) - 2.0 * l.ewma_us(1)).abs() < 1e-9);
    }

    #[test]
    fn a_slower_sample_is_taken_at_once() {
        let l = Load::new(1);
        l.observe(100.0, 1);
        l.observe(100.0, 1);
        l.observe(5_000.0, 2);
        assert_eq!(l.ewma_us(2), 5_000.0);
    }

    #[test]
    fn an_unrefreshed_estimate_decays_with_time() {
        let l = Load::new(0);
        l.observe(4_000.0, 1_000);
        assert_eq!(l.ewma_us(1_000), 4_000.0);
        let later = l.ewma_us(1_000 + (DECAY_MS * 2f64.ln()) as u64);
        assert!((later - 2_000.0).abs() < 1.0, "one half-life later: {later}");
        // The next sample blends with the decayed estimate, not the stale one.
        l.observe(1_500.0, 1_000 + (DECAY_MS * 2f64.ln()) as u64);
        assert!(l.ewma_us(1_000 + (DECAY_MS * 2f64.ln()) as u64) < 2_000.0);
    }

    /// A hung endpoint holding requests does not decay into the cheapest one, and a failed try
    /// makes an endpoint costly at once.
    #[test]
    fn in_flight_requests_stop_the_decay_and_failures_count_as_slow() {
        let hung = Load::new(0);
        hung.observe(1_000.0, 0);
        hung.start();
        assert_eq!(hung.ewma_us(60_000), 1_000.0, "no decay while a request is in flight");
        assert_eq!(hung.cost(60_000), 2_000.0);
        hung.end();
        assert!(hung.ewma_us(60_000) < 10.0, "decays once idle");
        let refused = Load::new(0);
        refused.observe(1_000.0, 0);
        refused.failed(50.0, 1);
        assert_eq!(refused.ewma_us(1), FAILURE_US);
    }

    #[test]
    fn a_new_endpoint_starts_at_the_prior_whenever_it_is_added() {
        let late = Load::new(3_600_000);
        assert_eq!(late.cost(3_600_000), PRIOR_US, "no head start for endpoints added later");
    }

    /// Two endpoints, one request at a time (each 1 ms long), p2c: the one measured slower once
    /// must still be measured again; the faster one keeps nearly all the traffic.
    #[test]
    fn p2c_does_not_starve_an_endpoint_that_looked_slower_once() {
        let loads = [Load::new(0), Load::new(0)];
        loads[0].observe(1_000.0, 0);
        loads[1].observe(2_000.0, 0);
        let rr = AtomicUsize::new(0);
        let mut picks = [0u32; 2];
        let mut first_retry_ms = None;
        for now in 1..60_000u64 {
            let i = pick(LbPolicy::P2cEwma, 2, |_| true, |i| loads[i].cost(now), &[], &rr, |n| {
                (now as usize) % n
            })
            .unwrap();
            // Endpoint 1 is really as fast as endpoint 0 minus a little noise on the slow side.
            loads[i].observe(if i == 0 { 1_000.0 } else { 1_100.0 }, now);
            picks[i] += 1;
            if i == 1 && first_retry_ms.is_none() {
                first_retry_ms = Some(now);
            }
        }
        let first = first_retry_ms.expect("endpoint 1 was never tried again");
        assert!(first < 10_000, "endpoint 1 waited {first} ms");
        assert!(picks[0] > 50 * picks[1], "the faster endpoint keeps the traffic: {picks:?}");
    }
}

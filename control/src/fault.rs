//! Phi-accrual failure detection (Hayashibara et al., 2004) over sidecar heartbeats.
//!
//! Instead of a fixed "missed N heartbeats" rule, the detector learns each sidecar's
//! inter-arrival distribution (mean and deviation over a sliding window) and reports
//! φ = −log10 P(a heartbeat arrives later than now). φ = 8 means the silence so far would
//! happen by chance once in 10⁸ — the sidecar is very likely gone. A slow-but-regular sidecar and
//! a fast one are judged against their own rhythm. Pure logic: time is passed in (ms).

use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone)]
pub struct Settings {
    /// φ at or above which a node is considered down (Akka and Cassandra use 8).
    pub threshold: f64,
    /// Inter-arrival samples kept per node.
    pub window: usize,
    /// Floor on the deviation, so a perfectly regular sender is not declared dead by jitter.
    pub min_std_ms: f64,
    /// Allowed extra pause (e.g. a GC) added to the mean before suspicion grows.
    pub acceptable_pause_ms: f64,
    /// Assumed interval before enough samples exist.
    pub first_interval_ms: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { threshold: 8.0, window: 100, min_std_ms: 100.0, acceptable_pause_ms: 0.0, first_interval_ms: 1000.0 }
    }
}

#[derive(Debug, Clone)]
struct History {
    last_ms: u64,
    intervals: VecDeque<f64>,
    sum: f64,
    sum_sq: f64,
}

impl History {
    fn new(now: u64, first_interval: f64) -> History {
        // Seed with a guess so the first silence is judged against something sensible.
        let mut h = History { last_ms: now, intervals: VecDeque::new(), sum: 0.0, sum_sq: 0.0 };
        h.push(first_interval, usize::MAX);
        h
    }

    fn push(&mut self, interval: f64, cap: usize) {
        self.intervals.push_back(interval);
        self.sum += interval;
        self.sum_sq += interval * interval;
        while self.intervals.len() > cap {
            let old = self.intervals.pop_front().expect("non-empty");
            self.sum -= old;
            self.sum_sq -= old * old;
        }
    }

    fn mean_std(&self) -> (f64, f64) {
        let n = self.intervals.len() as f64;
        let mean = self.sum / n;
        let var = (self.sum_sq / n - mean * mean).max(0.0);
        (mean, var.sqrt())
    }
}

/// Heartbeat histories of every node, keyed by node id.
#[derive(Debug, Default)]
pub struct Detector {
    pub settings: Settings,
    nodes: HashMap<String, History>,
}

impl Detector {
    pub fn new(settings: Settings) -> Detector {
        Detector { settings, nodes: HashMap::new() }
    }

    /// Record a heartbeat from `node` at `now_ms`.
    pub fn heartbeat(&mut self, node: &str, now_ms: u64) {
        let s = &self.settings;
        match self.nodes.get_mut(node) {
            None => {
                self.nodes.insert(node.to_string(), History::new(now_ms, s.first_interval_ms));
            }
            Some(h) => {
                let interval = now_ms.saturating_sub(h.last_ms) as f64;
                h.last_ms = now_ms;
                h.push(interval, s.window.max(1));
            }
        }
    }

    /// Suspicion level of `node` at `now_ms`; None for a node never heard from.
    pub fn phi(&self, node: &str, now_ms: u64) -> Option<f64> {
        let h = self.nodes.get(node)?;
        let (mean, std) = h.mean_std();
        let mean = mean + self.settings.acceptable_pause_ms;
        let std = std.max(self.settings.min_std_ms);
        let elapsed = now_ms.saturating_sub(h.last_ms) as f64;
        Some(phi(elapsed, mean, std))
    }

    pub fn is_available(&self, node: &str, now_ms: u64) -> bool {
        self.phi(node, now_ms).is_some_and(|p| p < self.settings.threshold)
    }

    /// Nodes whose φ is at or above the threshold.
    pub fn suspects(&self, now_ms: u64) -> Vec<String> {
        let mut v: Vec<String> =
            self.nodes.keys().filter(|n| !self.is_available(n, now_ms)).cloned().collect();
        v.sort();
        v
    }

    /// Forget a node (deregistered on purpose, not failed).
    pub fn remove(&mut self, node: &str) {
        self.nodes.remove(node);
    }
}

/// φ for `elapsed` ms of silence under a normal model of inter-arrival times, using the
/// logistic approximation of the normal CDF that Akka uses (no erf needed, monotone, accurate
/// to about 1e-4 in the tail region that matters).
pub fn phi(elapsed: f64, mean: f64, std: f64) -> f64 {
    let y = (elapsed - mean) / std;
    let k = y * (1.5976 + 0.070566 * y * y);
    let e = (-k).exp();
    if elapsed > mean {
        // -log10(e / (1 + e)), written so a long silence gives a large finite φ, not ∞.
        k / std::f64::consts::LN_10 + e.ln_1p() / std::f64::consts::LN_10
    } else {
        -(1.0 - 1.0 / (1.0 + e)).log10()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regular(d: &mut Detector, node: &str, every: u64, count: u64) -> u64 {
        let mut t = 0;
        for i in 0..count {
            t = i * every;
            d.heartbeat(node, t);
        }
        t
    }

    #[test]
    fn phi_grows_with_silence() {
        let mut d = Detector::new(Settings::default());
        let last = regular(&mut d, "a", 1000, 50);
        let p1 = d.phi("a", last + 1000).unwrap();
        let p2 = d.phi("a", last + 3000).unwrap();
        let p3 = d.phi("a", last + 10_000).unwrap();
        assert!(p1 < 1.0, "on time: {p1}");
        assert!(p1 < p2 && p2 < p3, "{p1} {p2} {p3}");
        assert!(d.is_available("a", last + 1100));
        assert!(!d.is_available("a", last + 10_000), "10 s of silence after a 1 s rhythm");
        assert_eq!(d.suspects(last + 10_000), vec!["a".to_string()]);
    }

    #[test]
    fn each_node_is_judged_by_its_own_rhythm() {
        let mut d = Detector::new(Settings::default());
        let fast = regular(&mut d, "fast", 200, 100);
        let slow = regular(&mut d, "slow", 5000, 100);
        // 3 s of silence: alarming for a 200 ms sender, normal for a 5 s sender.
        assert!(!d.is_available("fast", fast + 3000));
        assert!(d.is_available("slow", slow + 3000));
    }

    #[test]
    fn recovers_when_heartbeats_return_and_handles_unknown_nodes() {
        let mut d = Detector::new(Settings::default());
        let last = regular(&mut d, "a", 1000, 20);
        assert!(!d.is_available("a", last + 20_000));
        d.heartbeat("a", last + 20_000);
        assert!(d.is_available("a", last + 20_500), "back as soon as a heartbeat arrives");
        assert_eq!(d.phi("nobody", 0), None);
        assert!(!d.is_available("nobody", 0));
        d.remove("a");
        assert!(d.suspects(u64::MAX).is_empty());
    }

    #[test]
    fn phi_is_finite_and_monotone() {
        let mut prev = -1.0;
        for ms in (0..20_000).step_by(250) {
            let p = phi(ms as f64, 1000.0, 100.0);
            assert!(p.is_finite() && p >= prev, "phi({ms}) = {p}");
            prev = p;
        }
    }
}

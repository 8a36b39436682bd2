//! An always-valid sequential test: the mixture sequential probability ratio test (mSPRT) of
//! Johari, Koomen, Pekelis and Walsh ("Peeking at A/B tests", KDD 2017), as Optimizely runs it,
//! for the difference of two proportions (an error rate, or the share of requests slower than
//! a latency threshold).
//!
//! Why: a fixed-horizon test read again and again as data arrives ("peeking") fires far more
//! often than its α (`experiment-sim` measures it). The mSPRT's statistic Λ is a
//! non-negative martingale under the null, so by Ville's inequality P(Λ ever ≥ 1/α) ≤ α: the
//! result may be read after every request and still means what it says.
//!
//! With θ̂ = p̂_B − p̂_A and its variance V = p̂_A(1−p̂_A)/n_A + p̂_B(1−p̂_B)/n_B (the normal
//! approximation, with a floor so that zero observed events do not make V zero), and a normal
//! mixing prior N(0, τ²) on θ:
//!
//! `Λ = sqrt(V / (V + τ²)) · exp(θ̂² τ² / (2 V (V + τ²)))`
//!
//! The always-valid p-value is the running minimum of `min(1, 1/Λ)`; the matching confidence
//! sequence is `θ̂ ± sqrt(2 V (V + τ²) / τ² · ln(sqrt((V + τ²) / V) / α))`. τ is the effect
//! size the test is most sensitive to (a point of error rate: τ = 0.01).

use serde::{Deserialize, Serialize};

/// Counts of one arm: trials and events (errors, or requests over the latency threshold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub n: u64,
    pub events: u64,
}

impl Counts {
    pub fn rate(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.events as f64 / self.n as f64 }
    }
}

/// The test's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Msprt {
    /// Type I error bound over the whole (unbounded) monitoring.
    pub alpha: f64,
    /// Standard deviation of the mixing prior on the difference.
    pub tau: f64,
    /// No decision before each arm has this many trials (the normal approximation needs them).
    pub min_n: u64,
}

impl Msprt {
    pub fn new(alpha: f64, tau: f64) -> Self {
        Msprt { alpha, tau, min_n: 500 }
    }
}

/// The test's reading at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// p̂_B − p̂_A.
    pub diff: f64,
    /// The always-valid (1 − α) confidence sequence for the difference.
    pub lo: f64,
    pub hi: f64,
    /// The mixture likelihood ratio.
    pub lambda: f64,
    /// min(1, 1/Λ) now (running it to its minimum is the caller's job: see [`Monitor`]).
    pub p: f64,
    /// Both arms have `min_n` trials.
    pub ready: bool,
}

/// A variance floor: the variance of a proportion of 1/(n+1) (as if one event had been seen),
/// so an arm with no events yet does not claim perfect certainty.
fn arm_var(c: Counts) -> f64 {
    let n = c.n.max(1) as f64;
    let p = c.rate().clamp(1.0 / (n + 1.0), 1.0 - 1.0 / (n + 1.0));
    p * (1.0 - p) / n
}

impl Msprt {
    /// Reads the test on the counts so far.
    pub fn read(&self, a: Counts, b: Counts) -> Reading {
        let diff = b.rate() - a.rate();
        let v = arm_var(a) + arm_var(b);
        let t2 = self.tau * self.tau;
        let log_lambda = 0.5 * (v / (v + t2)).ln() + diff * diff * t2 / (2.0 * v * (v + t2));
        // Capped so the state stays finite (JSON has no infinity); e^700 is evidence enough.
        let lambda = log_lambda.min(700.0).exp();
        let half = (2.0 * v * (v + t2) / t2 * (((v + t2) / v).sqrt() / self.alpha).ln()).sqrt();
        Reading {
            diff,
            lo: diff - half,
            hi: diff + half,
            lambda,
            p: (1.0 / lambda).min(1.0),
            ready: a.n >= self.min_n && b.n >= self.min_n,
        }
    }
}

/// Continuous monitoring: keeps the running minimum p-value and the intersection of the
/// confidence sequence (both stay valid at every step).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Monitor {
    pub test: Msprt,
    pub p: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Monitor {
    pub fn new(test: Msprt) -> Self {
        // A difference of proportions lies in [-1, 1] (finite bounds also keep the state JSON).
        Monitor { test, p: 1.0, lo: -1.0, hi: 1.0 }
    }

    /// Feeds the cumulative counts now; returns the current reading.
    pub fn update(&mut self, a: Counts, b: Counts) -> Reading {
        let r = self.test.read(a, b);
        if r.ready {
            self.p = self.p.min(r.p);
            self.lo = self.lo.max(r.lo);
            self.hi = self.hi.min(r.hi);
        }
        r
    }

    /// B's rate is higher than A's, with confidence 1 − α.
    pub fn b_higher(&self) -> bool {
        self.p <= self.test.alpha && self.lo > 0.0
    }

    /// B's rate is lower than A's, with confidence 1 − α.
    pub fn b_lower(&self) -> bool {
        self.p <= self.test.alpha && self.hi < 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_difference_gives_no_evidence() {
        let t = Msprt::new(0.05, 0.01);
        let c = Counts { n: 10_000, events: 200 };
        let r = t.read(c, c);
        assert!(r.lambda < 1.0 && r.p == 1.0, "{r:?}");
        assert!(r.lo < 0.0 && r.hi > 0.0);
    }

    #[test]
    fn a_large_difference_is_found_and_bounded() {
        let t = Msprt::new(0.05, 0.01);
        let r = t.read(Counts { n: 20_000, events: 400 }, Counts { n: 20_000, events: 800 });
        assert!(r.p < 1e-6, "{r:?}");
        assert!(r.lo > 0.0 && r.lo < 0.02 && r.hi > 0.02, "the interval holds the true +2 points: {r:?}");
        // The always-valid interval is wider than the fixed-horizon 95% one.
        let v: f64 = 0.02 * 0.98 / 20_000.0 + 0.04 * 0.96 / 20_000.0;
        assert!(r.hi - r.lo > 2.0 * 1.96 * v.sqrt());
    }

    #[test]
    fn nothing_is_decided_before_the_minimum_sample() {
        let mut m = Monitor::new(Msprt::new(0.05, 0.01));
        m.update(Counts { n: 100, events: 0 }, Counts { n: 100, events: 30 });
        assert!(!m.b_higher() && m.p == 1.0);
        m.update(Counts { n: 600, events: 6 }, Counts { n: 600, events: 60 });
        assert!(m.b_higher() && !m.b_lower());
    }

    #[test]
    fn zero_events_do_not_claim_certainty() {
        let t = Msprt::new(0.05, 0.01);
        let r = t.read(Counts { n: 1_000, events: 0 }, Counts { n: 1_000, events: 1 });
        assert!(r.p > 0.5, "{r:?}");
    }
}

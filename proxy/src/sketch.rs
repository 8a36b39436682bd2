//! A mergeable latency sketch with a stated error bound (the DDSketch idea): values fall in
//! logarithmic buckets `(γ^(i−1), γ^i]` with `γ = (1 + α) / (1 − α)`, so any quantile read
//! back is within a relative error α = 1% of the true one, and two sketches merge exactly by
//! adding bucket counts. Sidecars send the per-variant sketch of each report interval to the
//! control plane, which merges them per experiment and window without losing the bound.
//!
//! The store is dense between the lowest and highest bucket seen: a latency range of
//! 1 ms .. 100 s is ~580 buckets (4.6 KiB).

use weft_xds::resources::v1;

/// The relative accuracy every weft sketch uses (a sketch of another accuracy is refused).
pub const RELATIVE_ACCURACY: f64 = 0.01;
/// Values at or below this (ms) are counted in the zero bucket.
const MIN_VALUE: f64 = 1e-3;
/// Buckets a sketch may span (a guard against absurd inputs: 1e-3 .. 1e12 ms is ~1,700).
const MAX_BUCKETS: usize = 4096;

fn ln_gamma() -> f64 {
    ((1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY)).ln()
}

/// Counts of latencies (milliseconds) in logarithmic buckets.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogSketch {
    /// Bucket index of `counts[0]`.
    offset: i32,
    counts: Vec<u64>,
    zero: u64,
}

/// Why a sketch from the wire was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct SketchError(pub String);

impl LogSketch {
    pub fn new() -> Self {
        Self::default()
    }

    fn index(v: f64) -> i32 {
        (v.ln() / ln_gamma()).ceil() as i32
    }

    /// The value reported for bucket `i`: within α of anything in it.
    fn value(i: i32) -> f64 {
        let g = ln_gamma().exp();
        2.0 * (f64::from(i) * ln_gamma()).exp() / (g + 1.0)
    }

    /// Adds one latency in milliseconds (NaN and negatives count as 0).
    pub fn add(&mut self, ms: f64) {
        self.add_n(ms, 1);
    }

    fn add_n(&mut self, ms: f64, n: u64) {
        if ms <= MIN_VALUE || !ms.is_finite() {
            self.zero += n;
            return;
        }
        self.bump(Self::index(ms), n);
    }

    fn bump(&mut self, i: i32, n: u64) {
        if self.counts.is_empty() {
            self.offset = i;
            self.counts.push(0);
        }
        if i < self.offset {
            let grow = (self.offset - i) as usize;
            if self.counts.len() + grow > MAX_BUCKETS {
                // Beyond the span: clamp into the lowest bucket (keeps the count exact).
                self.counts[0] += n;
                return;
            }
            self.counts.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = i;
        }
        let at = (i - self.offset) as usize;
        if at >= self.counts.len() {
            if at >= MAX_BUCKETS {
                *self.counts.last_mut().expect("non-empty") += n;
                return;
            }
            self.counts.resize(at + 1, 0);
        }
        self.counts[at] += n;
    }

    pub fn count(&self) -> u64 {
        self.zero + self.counts.iter().sum::<u64>()
    }

    /// Adds `other`'s counts (exact).
    pub fn merge(&mut self, other: &LogSketch) {
        self.zero += other.zero;
        for (k, &c) in other.counts.iter().enumerate() {
            if c > 0 {
                self.bump(other.offset + k as i32, c);
            }
        }
    }

    /// `self − before`, bucket by bucket (for cumulative sketches: what was added since).
    pub fn since(&self, before: &LogSketch) -> LogSketch {
        let mut out = LogSketch { zero: self.zero.saturating_sub(before.zero), ..LogSketch::default() };
        for (k, &c) in self.counts.iter().enumerate() {
            let i = self.offset + k as i32;
            let b = before.bucket(i);
            if c > b {
                out.bump(i, c - b);
            }
        }
        out
    }

    fn bucket(&self, i: i32) -> u64 {
        let k = i - self.offset;
        if k < 0 { 0 } else { self.counts.get(k as usize).copied().unwrap_or(0) }
    }

    /// The `q`-quantile (0..=1), within α relative error; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        // Rank of the q-quantile among n values (0-based, lower median convention).
        let rank = (q.clamp(0.0, 1.0) * (n - 1) as f64).floor() as u64;
        if rank < self.zero {
            return Some(0.0);
        }
        let mut seen = self.zero;
        for (k, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Some(Self::value(self.offset + k as i32));
            }
        }
        self.counts.last().map(|_| Self::value(self.offset + self.counts.len() as i32 - 1))
    }

    /// Values above `threshold_ms`, counting the bucket that holds the threshold as not above
    /// (an undercount of at most that one bucket, i.e. values within α of the threshold).
    pub fn count_above(&self, threshold_ms: f64) -> u64 {
        if self.counts.is_empty() {
            return 0;
        }
        let t = if threshold_ms > MIN_VALUE { Self::index(threshold_ms) } else { i32::MIN };
        self.counts.iter().enumerate().filter(|(k, _)| self.offset + *k as i32 > t).map(|(_, c)| c).sum()
    }

    pub fn to_proto(&self) -> v1::LatencySketch {
        v1::LatencySketch {
            relative_accuracy: RELATIVE_ACCURACY,
            offset: self.offset,
            counts: self.counts.clone(),
            zero_count: self.zero,
        }
    }

    pub fn from_proto(p: &v1::LatencySketch) -> Result<LogSketch, SketchError> {
        if p.counts.is_empty() && p.zero_count == 0 {
            return Ok(LogSketch::default());
        }
        if (p.relative_accuracy - RELATIVE_ACCURACY).abs() > 1e-12 {
            return Err(SketchError(format!(
                "latency sketch accuracy {} is not weft's {RELATIVE_ACCURACY}",
                p.relative_accuracy
            )));
        }
        if p.counts.len() > MAX_BUCKETS {
            return Err(SketchError(format!("latency sketch has {} buckets (at most {MAX_BUCKETS})", p.counts.len())));
        }
        Ok(LogSketch { offset: p.offset, counts: p.counts.clone(), zero: p.zero_count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    #[test]
    fn quantiles_are_within_the_stated_relative_error() {
        let mut s = LogSketch::new();
        let mut values: Vec<f64> = (1..=20_000).map(|i| 0.5 + (i as f64).powf(1.3) / 10.0).collect();
        for v in &values {
            s.add(*v);
        }
        values.sort_by(f64::total_cmp);
        for q in [0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0] {
            let (got, want) = (s.quantile(q).unwrap(), exact_quantile(&values, q));
            assert!((got - want).abs() <= RELATIVE_ACCURACY * want * 1.0001, "q{q}: {got} vs {want}");
        }
        assert_eq!(s.count(), 20_000);
    }

    #[test]
    fn merging_is_exact_and_since_undoes_it() {
        let (mut a, mut b, mut all) = (LogSketch::new(), LogSketch::new(), LogSketch::new());
        for i in 0..1000 {
            let v = 1.0 + i as f64 * 0.37;
            if i % 3 == 0 { a.add(v) } else { b.add(v * 50.0) }
            all.add(if i % 3 == 0 { v } else { v * 50.0 });
        }
        a.add(0.0);
        all.add(0.0);
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!(m, all, "merge = one sketch of everything");
        assert_eq!(m.since(&a), b, "a cumulative sketch minus an earlier reading = what came since");
        let wire = LogSketch::from_proto(&m.to_proto()).unwrap();
        assert_eq!(wire, m);
    }

    #[test]
    fn count_above_a_threshold_and_odd_inputs() {
        let mut s = LogSketch::new();
        for v in [1.0, 10.0, 100.0, 1000.0, f64::NAN, -5.0] {
            s.add(v);
        }
        assert_eq!(s.count(), 6);
        assert_eq!(s.count_above(50.0), 2);
        assert_eq!(s.count_above(0.0), 4);
        assert_eq!(s.quantile(0.0), Some(0.0), "NaN and negatives sit in the zero bucket");
        let mut bad = s.to_proto();
        bad.relative_accuracy = 0.05;
        assert!(LogSketch::from_proto(&bad).is_err());
    }
}

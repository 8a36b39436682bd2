//! A ring of per-interval counters: "how many X in the last N seconds" without storing events.
//! Used by the error-rate breaker and the retry budget. Pure: time is passed in.

#[derive(Debug, Clone)]
pub struct Window<const K: usize> {
    bucket_ms: u64,
    /// Bucket number (now / bucket_ms) each slot currently holds.
    epoch: [u64; K],
    counts: [[u64; 2]; K],
}

impl<const K: usize> Window<K> {
    /// A window of `K` buckets covering `span_ms` in total.
    pub fn new(span_ms: u64) -> Self {
        Window { bucket_ms: (span_ms / K as u64).max(1), epoch: [0; K], counts: [[0; 2]; K] }
    }

    pub fn span_ms(&self) -> u64 {
        self.bucket_ms * K as u64
    }

    /// Add to counter `which` (0 or 1) at time `now_ms`.
    pub fn add(&mut self, now_ms: u64, which: usize, n: u64) {
        let b = now_ms / self.bucket_ms;
        let slot = (b % K as u64) as usize;
        if self.epoch[slot] != b {
            self.epoch[slot] = b;
            self.counts[slot] = [0; 2];
        }
        self.counts[slot][which] += n;
    }

    /// Totals of both counters over the buckets still inside the window.
    pub fn totals(&self, now_ms: u64) -> [u64; 2] {
        let b = now_ms / self.bucket_ms;
        let mut t = [0; 2];
        for slot in 0..K {
            if self.epoch[slot] + (K as u64) > b && self.epoch[slot] <= b {
                t[0] += self.counts[slot][0];
                t[1] += self.counts[slot][1];
            }
        }
        t
    }

    pub fn clear(&mut self) {
        self.counts = [[0; 2]; K];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_buckets_fall_out() {
        let mut w: Window<10> = Window::new(10_000);
        w.add(1_000, 0, 5);
        w.add(5_500, 1, 2);
        assert_eq!(w.totals(6_000), [5, 2]);
        assert_eq!(w.totals(11_500), [0, 2]);
        assert_eq!(w.totals(16_000), [0, 0]);
        w.add(16_000, 0, 1);
        assert_eq!(w.totals(16_000), [1, 0]);
    }
}

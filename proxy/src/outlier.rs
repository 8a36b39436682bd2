//! Passive outlier detection: an endpoint answering with consecutive 5xx (or gateway errors:
//! 502/503/504, connect failures, resets) is ejected from load balancing for
//! `base_ejection_time × times ejected` (capped), and comes back by itself when that passes.
//! At most `max_ejection_pct` of a cluster's endpoints are ejected at once (at least one may be),
//! so a cluster-wide outage does not eject everything and leave nothing to try.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::config;

#[derive(Debug, Clone)]
pub struct Settings {
    pub consecutive_5xx: u32,
    pub consecutive_gateway: u32,
    pub base_ms: u64,
    pub max_ms: u64,
    pub max_pct: u32,
}

impl From<&config::Outlier> for Settings {
    fn from(o: &config::Outlier) -> Settings {
        Settings {
            consecutive_5xx: o.consecutive_5xx,
            consecutive_gateway: o.consecutive_gateway_errors,
            base_ms: o.base_ejection_time.0.as_millis() as u64,
            max_ms: o.max_ejection_time.0.as_millis() as u64,
            max_pct: o.max_ejection_pct,
        }
    }
}

/// What an upstream attempt looked like, for outlier and breaker accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// A 5xx other than 502/503/504.
    ServerError,
    /// 502/503/504, connect failure, reset or timeout.
    GatewayError,
}

impl Outcome {
    pub fn from_status(status: u16) -> Outcome {
        match status {
            502..=504 => Outcome::GatewayError,
            500..=599 => Outcome::ServerError,
            _ => Outcome::Success,
        }
    }
}

/// Per-endpoint health counters; lock-free so the hot path only touches atomics.
#[derive(Debug, Default)]
pub struct Health {
    consecutive_5xx: AtomicU32,
    consecutive_gateway: AtomicU32,
    ejected_until_ms: AtomicU64,
    times_ejected: AtomicU32,
}

impl Health {
    pub fn is_ejected(&self, now_ms: u64) -> bool {
        self.ejected_until_ms.load(Relaxed) > now_ms
    }
    pub fn ejected_until_ms(&self) -> u64 {
        self.ejected_until_ms.load(Relaxed)
    }
    pub fn times_ejected(&self) -> u32 {
        self.times_ejected.load(Relaxed)
    }

    /// Count an outcome; true when the endpoint crossed a threshold and should be ejected
    /// (the caller decides, since only it knows how many siblings are already out).
    pub fn record(&self, s: &Settings, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Success => {
                // Avoid dirtying the cache line on the common path.
                if self.consecutive_5xx.load(Relaxed) != 0 {
                    self.consecutive_5xx.store(0, Relaxed);
                }
                if self.consecutive_gateway.load(Relaxed) != 0 {
                    self.consecutive_gateway.store(0, Relaxed);
                }
                false
            }
            Outcome::ServerError | Outcome::GatewayError => {
                let c5 = self.consecutive_5xx.fetch_add(1, Relaxed) + 1;
                let gw = if outcome == Outcome::GatewayError {
                    self.consecutive_gateway.fetch_add(1, Relaxed) + 1
                } else {
                    self.consecutive_gateway.store(0, Relaxed);
                    0
                };
                (s.consecutive_5xx > 0 && c5 >= s.consecutive_5xx)
                    || (s.consecutive_gateway > 0 && gw >= s.consecutive_gateway)
            }
        }
    }

    /// Eject now; returns the time it returns.
    pub fn eject(&self, s: &Settings, now_ms: u64) -> u64 {
        let times = self.times_ejected.fetch_add(1, Relaxed) + 1;
        let until = now_ms + ejection_ms(s, times);
        self.ejected_until_ms.store(until, Relaxed);
        self.consecutive_5xx.store(0, Relaxed);
        self.consecutive_gateway.store(0, Relaxed);
        until
    }
}

/// How long the `times`-th ejection lasts.
pub fn ejection_ms(s: &Settings, times: u32) -> u64 {
    s.base_ms.saturating_mul(times.max(1) as u64).min(s.max_ms.max(s.base_ms))
}

/// May one more of `total` endpoints be ejected while `ejected` already are?
pub fn may_eject(s: &Settings, ejected: usize, total: usize) -> bool {
    let cap = (total * s.max_pct.min(100) as usize / 100).max(1);
    ejected < cap && (s.max_pct >= 100 || ejected + 1 < total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> Settings {
        Settings { consecutive_5xx: 5, consecutive_gateway: 3, base_ms: 1000, max_ms: 2500, max_pct: 50 }
    }

    #[test]
    fn consecutive_gateway_errors_eject_and_success_resets() {
        let h = Health::default();
        assert!(!h.record(&s(), Outcome::GatewayError));
        assert!(!h.record(&s(), Outcome::GatewayError));
        assert!(!h.record(&s(), Outcome::Success));
        assert!(!h.record(&s(), Outcome::GatewayError));
        assert!(!h.record(&s(), Outcome::GatewayError));
        assert!(h.record(&s(), Outcome::GatewayError));
        let until = h.eject(&s(), 10);
        assert_eq!(until, 1010);
        assert!(h.is_ejected(500));
        assert!(!h.is_ejected(1010), "returns when the ejection time passes");
    }

    #[test]
    fn ejection_grows_then_caps() {
        assert_eq!(ejection_ms(&s(), 1), 1000);
        assert_eq!(ejection_ms(&s(), 2), 2000);
        assert_eq!(ejection_ms(&s(), 3), 2500);
    }

    #[test]
    fn never_ejects_past_the_cap() {
        assert!(may_eject(&s(), 0, 4));
        assert!(may_eject(&s(), 1, 4));
        assert!(!may_eject(&s(), 2, 4));
        assert!(may_eject(&s(), 0, 2));
        assert!(!may_eject(&s(), 0, 1), "a lone endpoint stays in unless max_ejection_pct is 100");
        let all = Settings { max_pct: 100, ..s() };
        assert!(may_eject(&all, 0, 1));
    }

    #[test]
    fn plain_5xx_counts_only_toward_5xx() {
        let h = Health::default();
        for _ in 0..4 {
            assert!(!h.record(&s(), Outcome::ServerError));
        }
        assert!(h.record(&s(), Outcome::ServerError));
    }
}

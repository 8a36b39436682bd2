//! Hybrid: the larger of the predictive and the reactive (KPA) targets.
//!
//! The forecast provisions ahead of the daily ramp, so the reactive half is only a safety net
//! for what no forecast sees (bursts, a shifted day): it panics on a 2x burst within one panic
//! window, where the predictive half would wait for its undershoot rule's minute-long average.

use super::predictive::Predictive;
use super::reactive::Kpa;
use super::{Decision, Policy, VariantLoad};

#[derive(Clone, Debug)]
pub struct Hybrid {
    pub predictive: Predictive,
    pub reactive: Kpa,
}

impl Policy for Hybrid {
    fn decide(&mut self, now_s: f64, load: &VariantLoad, ready: u32, current: u32) -> Decision {
        let p = self.predictive.decide(now_s, load, ready, current);
        let r = self.reactive.decide(now_s, load, ready, current);
        if r.replicas > p.replicas { r } else { p }
    }

    fn forecast_rps(&self, at_s: f64) -> Option<f64> {
        self.predictive.forecast_rps(at_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::predictive::PredictiveConfig;
    use crate::autoscaler::reactive::KpaConfig;
    use crate::autoscaler::{Reason, VariantConfig};

    #[test]
    fn takes_the_larger_target() {
        let v = VariantConfig::new(10.0, 50.0);
        let full = KpaConfig {
            target_utilization: 1.0,
            ..KpaConfig::default()
        };
        let mut h = Hybrid {
            predictive: Predictive::new(PredictiveConfig::default(), v.clone()),
            reactive: Kpa::new(full, v),
        };
        let load = |r| VariantLoad {
            request_rate: r,
            ..Default::default()
        };
        h.decide(10.0, &load(10.0), 1, 1);
        // A burst to 50 rps: the KPA panics at once (5 replicas needed vs 1 ready).
        let d = h.decide(20.0, &load(50.0), 1, 1);
        assert_eq!(
            d,
            Decision {
                replicas: 5,
                reason: Reason::Panic
            }
        );
    }
}

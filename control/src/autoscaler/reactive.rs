//! The reactive baseline, modelled on Knative's KPA (pkg/autoscaler/scaling/autoscaler.go).
//!
//! Demand is averaged over a 60 s stable window and a 6 s panic window. Normally the target is
//! the stable-window demand over the per-replica target (capacity × target utilization, 70% as
//! in Knative). When the panic-window demand needs at least twice the ready replicas, the KPA
//! panics: it follows the short window and, until a whole stable window passes without that
//! condition, never lowers the target. Scale-down per decision is limited to halving the ready
//! replicas (Knative's max-scale-down-rate 2).

use std::collections::VecDeque;

use super::{Decision, Policy, Reason, VariantConfig, VariantLoad};

/// Knative's defaults, with the target given as a utilization of `capacity_rps`.
#[derive(Clone, Debug, PartialEq)]
pub struct KpaConfig {
    pub stable_window_s: f64,
    pub panic_window_s: f64,
    /// Panic when the panic-window demand needs this many times the ready replicas.
    pub panic_threshold: f64,
    pub target_utilization: f64,
    pub max_scale_up_rate: f64,
    pub max_scale_down_rate: f64,
}

impl Default for KpaConfig {
    fn default() -> Self {
        Self {
            stable_window_s: 60.0,
            panic_window_s: 6.0,
            panic_threshold: 2.0,
            target_utilization: 0.7,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
        }
    }
}

/// The KPA's state for one variant: recent demand samples and the panic episode.
#[derive(Clone, Debug)]
pub struct Kpa {
    pub cfg: KpaConfig,
    pub variant: VariantConfig,
    /// (time, demand req/s), oldest first, no older than the stable window.
    samples: VecDeque<(f64, f64)>,
    /// When the panic condition last held, while panicking.
    panic_since: Option<f64>,
    max_panic: u32,
}

impl Kpa {
    pub fn new(cfg: KpaConfig, variant: VariantConfig) -> Self {
        Self {
            cfg,
            variant,
            samples: VecDeque::new(),
            panic_since: None,
            max_panic: 0,
        }
    }

    /// Records the demand reported at `now_s`.
    pub fn observe(&mut self, now_s: f64, demand_rps: f64) {
        self.samples.push_back((now_s, demand_rps));
        while let Some(&(t, _)) = self.samples.front() {
            if t > now_s - self.cfg.stable_window_s {
                break;
            }
            self.samples.pop_front();
        }
    }

    /// Mean demand over the last `window_s` (at least the latest sample).
    pub fn window_mean(&self, now_s: f64, window_s: f64) -> f64 {
        let recent: Vec<f64> = self
            .samples
            .iter()
            .rev()
            .enumerate()
            .take_while(|(i, (t, _))| *i == 0 || *t > now_s - window_s)
            .map(|(_, (_, d))| *d)
            .collect();
        if recent.is_empty() {
            0.0
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        }
    }

    pub fn panicking(&self) -> bool {
        self.panic_since.is_some()
    }

    /// The KPA's target at `now_s` with `ready` replicas serving.
    pub fn desired(&mut self, now_s: f64, ready: u32) -> Decision {
        let util = self.cfg.target_utilization;
        let stable = self
            .variant
            .replicas_for(self.window_mean(now_s, self.cfg.stable_window_s), util);
        let panic = self
            .variant
            .replicas_for(self.window_mean(now_s, self.cfg.panic_window_s), util);
        let ready_f = f64::from(ready.max(1));
        let up = (self.cfg.max_scale_up_rate * ready_f).ceil() as u32;
        let down = (f64::from(ready) / self.cfg.max_scale_down_rate).floor() as u32;
        let (stable, panic) = (stable.clamp(down, up), panic.clamp(down, up));

        let over = f64::from(panic) / ready_f >= self.cfg.panic_threshold;
        match self.panic_since {
            _ if over => self.panic_since = Some(now_s),
            Some(t) if now_s > t + self.cfg.stable_window_s => {
                self.panic_since = None;
                self.max_panic = 0;
            }
            _ => {}
        }
        if self.panic_since.is_some() {
            // As Knative: provision for the larger window, start from the ready count, and
            // only ever raise the target until the panic ends.
            self.max_panic = self.max_panic.max(panic).max(stable).max(ready);
            Decision {
                replicas: self.variant.clamp(self.max_panic),
                reason: Reason::Panic,
            }
        } else {
            Decision {
                replicas: self.variant.clamp(stable),
                reason: Reason::Stable,
            }
        }
    }
}

impl Policy for Kpa {
    fn decide(&mut self, now_s: f64, load: &VariantLoad, ready: u32, _current: u32) -> Decision {
        let demand = self.variant.demand_rps(load);
        self.observe(now_s, demand);
        self.desired(now_s, ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kpa() -> Kpa {
        // 10 rps per replica at 100% utilization: demand in rps / 10 = replicas.
        let cfg = KpaConfig {
            target_utilization: 1.0,
            ..KpaConfig::default()
        };
        Kpa::new(cfg, VariantConfig::new(10.0, 60.0))
    }

    /// A KPA that has seen 40 rps on 4 ready replicas at t = 0..50 s.
    fn steady_at_40() -> Kpa {
        let mut k = kpa();
        for t in 0..6 {
            k.decide(f64::from(t) * 10.0, &rate(40.0), 4, 4);
        }
        k
    }

    fn rate(r: f64) -> VariantLoad {
        VariantLoad {
            request_rate: r,
            ..Default::default()
        }
    }

    #[test]
    fn stable_window_averages_sixty_seconds() {
        let mut k = steady_at_40();
        // 5 samples of 40 and one of 70 in the window: mean 45 -> 5 replicas; 70 needs 7 and
        // 7/4 < 2, so no panic.
        let d = k.decide(60.0, &rate(70.0), 4, 4);
        assert_eq!(
            d,
            Decision {
                replicas: 5,
                reason: Reason::Stable
            }
        );
    }

    #[test]
    fn panics_at_twice_the_ready_capacity_and_not_below() {
        let mut k = steady_at_40();
        // 79 rps needs 8 replicas: 8/4 = 2.0 -> panic, follow the short window.
        let d = k.decide(60.0, &rate(79.0), 4, 4);
        assert_eq!(
            d,
            Decision {
                replicas: 8,
                reason: Reason::Panic
            }
        );
    }

    #[test]
    fn never_scales_down_while_panicking_and_leaves_after_a_stable_window() {
        let mut k = kpa();
        k.decide(0.0, &rate(10.0), 1, 1);
        assert_eq!(k.decide(10.0, &rate(50.0), 1, 1).replicas, 5);
        assert!(k.panicking());
        // Demand collapses: the target holds at the panic peak (and at the ready count).
        for t in 2..8 {
            let d = k.decide(f64::from(t) * 10.0, &rate(5.0), 5, 5);
            assert_eq!(
                d,
                Decision {
                    replicas: 5,
                    reason: Reason::Panic
                },
                "t={t}0"
            );
        }
        // More than 60 s after the panic condition last held: back to the stable window.
        let d = k.decide(80.0, &rate(5.0), 5, 5);
        assert_eq!(
            d,
            Decision {
                replicas: 2,
                reason: Reason::Stable
            }
        );
        assert!(!k.panicking());
    }

    #[test]
    fn scale_down_is_at_most_halving() {
        let mut k = kpa();
        for t in 0..10 {
            k.decide(f64::from(t) * 10.0, &rate(1.0), 10, 10);
        }
        assert_eq!(k.decide(100.0, &rate(1.0), 10, 10).replicas, 5);
    }

    #[test]
    fn backlog_raises_the_target() {
        let mut k = kpa();
        let load = VariantLoad {
            request_rate: 20.0,
            queue_depth: 600.0, // drained over 30 s: +20 rps
            ..Default::default()
        };
        assert_eq!(k.decide(0.0, &load, 4, 4).replicas, 4);
    }
}

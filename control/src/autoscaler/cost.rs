//! Cost awareness: which pool (spot or on-demand) replicas go to, monthly budget pacing, and
//! the replacement of preempted spot replicas.
//!
//! - **Pool by risk**: a spot replica survives a horizon with probability
//!   `exp(-preemptions/h × horizon)`; the risk of putting a variant there is
//!   `(1 - expected uptime) × criticality`. Above `max_risk` the variant runs on on-demand only;
//!   below it, a critical variant still keeps a safety buffer (a share of its replicas) on
//!   on-demand so a preemption wave cannot take all of its capacity at once.
//! - **Budget pacing** (a burn-rate limit): the projected spend is what has been spent, plus the
//!   next interval at the planned size, plus the rest of the period at the average burn rate so
//!   far (or at what the uncuttable floors burn now, if higher). When that would pass the cap, replicas are cut, least critical first, down to each
//!   variant's floor. Because the projection never counts less than `spent + next interval`,
//!   the spend cannot pass the cap while the floors fit in it.
//! - **Preemption**: on a spot preemption notice, a critical variant gets the lost replicas back
//!   on on-demand at once (their cold start overlaps the notice period); best-effort variants
//!   wait for the next decision.

/// A GPU pool's price and reliability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pool {
    pub price_per_hour: f64,
    pub preemptions_per_hour: f64,
}

/// Probability that a replica in `pool` runs through `horizon_s` without preemption.
pub fn expected_uptime(pool: &Pool, horizon_s: f64) -> f64 {
    (-pool.preemptions_per_hour.max(0.0) * horizon_s.max(0.0) / 3600.0).exp()
}

/// `(1 - expected uptime) × criticality`.
pub fn risk_score(expected_uptime: f64, criticality: f64) -> f64 {
    (1.0 - expected_uptime).max(0.0) * criticality.clamp(0.0, 1.0)
}

#[derive(Clone, Debug, PartialEq)]
pub struct PoolPolicy {
    /// Above this risk score a variant runs on on-demand only.
    pub max_risk: f64,
    /// Criticality from which a variant counts as critical.
    pub critical_at: f64,
    /// Share of a critical variant's replicas kept on on-demand (rounded up).
    pub on_demand_buffer: f64,
    /// Horizon of the uptime estimate, seconds.
    pub horizon_s: f64,
}

impl Default for PoolPolicy {
    fn default() -> Self {
        Self {
            max_risk: 0.05,
            critical_at: 0.5,
            on_demand_buffer: 0.5,
            horizon_s: 3600.0,
        }
    }
}

/// Replicas per pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolSplit {
    pub on_demand: u32,
    pub spot: u32,
}

/// Where `replicas` of a variant with `criticality` should run.
pub fn split(replicas: u32, criticality: f64, spot: &Pool, policy: &PoolPolicy) -> PoolSplit {
    let risk = risk_score(expected_uptime(spot, policy.horizon_s), criticality);
    let on_demand = if risk > policy.max_risk {
        replicas
    } else if criticality >= policy.critical_at {
        ((f64::from(replicas) * policy.on_demand_buffer).ceil() as u32).min(replicas)
    } else {
        0
    };
    PoolSplit {
        on_demand,
        spot: replicas - on_demand,
    }
}

/// On-demand replicas to start now when `lost` spot replicas of a variant got a preemption
/// notice: all of them for a critical variant, none for best effort.
pub fn replacement(lost: u32, criticality: f64, policy: &PoolPolicy) -> u32 {
    if criticality >= policy.critical_at {
        lost
    } else {
        0
    }
}

/// A spending cap over a period (a month; the replay scales it to the trace).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub cap: f64,
    pub period_s: f64,
}

impl Budget {
    /// The most the next `interval_s` may cost, having spent `spent` in `elapsed_s`, when
    /// what cannot be cut already burns `floor_per_s`: the rest of the period is projected at
    /// the average burn so far or that floor, whichever is higher.
    pub fn allowed(&self, spent: f64, elapsed_s: f64, interval_s: f64, floor_per_s: f64) -> f64 {
        let burn = if elapsed_s > 0.0 {
            spent / elapsed_s
        } else {
            self.cap / self.period_s
        }
        .max(floor_per_s);
        let rest = (self.period_s - elapsed_s - interval_s).max(0.0);
        (self.cap - spent - burn * rest).max(0.0)
    }
}

/// One variant's request to the budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ask {
    pub wanted: u32,
    /// Never cut below this (its `min_replicas`).
    pub floor: u32,
    pub criticality: f64,
    /// Blended price of one of its replicas, per hour.
    pub price_per_hour: f64,
}

/// What the budget grants.
#[derive(Clone, Debug, PartialEq)]
pub struct Paced {
    pub replicas: Vec<u32>,
    /// Some replicas were cut.
    pub limited: bool,
    /// Even the floors do not fit: the cap will be passed.
    pub over_cap: bool,
}

/// Fits `asks` into the budget for the next `interval_s`, cutting least critical first.
pub fn pace(budget: &Budget, spent: f64, elapsed_s: f64, interval_s: f64, asks: &[Ask]) -> Paced {
    let floor_per_s: f64 = asks
        .iter()
        .map(|a| f64::from(a.floor) * a.price_per_hour / 3600.0)
        .sum();
    let allowed = budget.allowed(spent, elapsed_s, interval_s, floor_per_s);
    let unit = |a: &Ask| a.price_per_hour * interval_s / 3600.0;
    let mut replicas: Vec<u32> = asks.iter().map(|a| a.wanted).collect();
    let mut total: f64 = asks.iter().map(|a| f64::from(a.wanted) * unit(a)).sum();
    let mut order: Vec<usize> = (0..asks.len()).collect();
    order.sort_by(|&a, &b| asks[a].criticality.total_cmp(&asks[b].criticality));
    let mut limited = false;
    for i in order {
        let excess = total - allowed;
        if excess <= 1e-12 {
            break;
        }
        let (a, u) = (&asks[i], unit(&asks[i]));
        if u <= 0.0 {
            continue;
        }
        let room = replicas[i].saturating_sub(a.floor);
        let cut = ((excess / u - 1e-9).ceil().max(0.0) as u32).min(room);
        if cut > 0 {
            limited = true;
            replicas[i] -= cut;
            total -= f64::from(cut) * u;
        }
    }
    Paced {
        replicas,
        limited,
        over_cap: total > allowed + 1e-9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPOT: Pool = Pool {
        price_per_hour: 1.0,
        preemptions_per_hour: 0.02,
    };

    #[test]
    fn risk_score_picks_on_demand_for_critical_when_spot_is_shaky() {
        let shaky = Pool {
            preemptions_per_hour: 0.2,
            ..SPOT
        };
        let p = PoolPolicy::default();
        // Uptime over an hour e^-0.2 = 0.819: risk 0.181 for critical -> on-demand only.
        let risk = risk_score(expected_uptime(&shaky, 3600.0), 1.0);
        assert!((risk - (1.0 - (-0.2f64).exp())).abs() < 1e-12);
        assert_eq!(
            split(10, 1.0, &shaky, &p),
            PoolSplit {
                on_demand: 10,
                spot: 0
            }
        );
        // The same pool for a best-effort variant (0.1 × 0.181 < 0.05): spot only.
        assert_eq!(
            split(10, 0.1, &shaky, &p),
            PoolSplit {
                on_demand: 0,
                spot: 10
            }
        );
        // Reliable spot: a critical variant keeps half on on-demand (rounded up).
        assert_eq!(
            split(7, 1.0, &SPOT, &p),
            PoolSplit {
                on_demand: 4,
                spot: 3
            }
        );
    }

    #[test]
    fn preempted_critical_replicas_are_replaced_on_demand_at_once() {
        let p = PoolPolicy::default();
        assert_eq!(replacement(3, 1.0, &p), 3);
        assert_eq!(replacement(3, 0.2, &p), 0);
    }

    #[test]
    fn pacing_cuts_best_effort_first_and_caps_spend() {
        // 100 over 100 h: 1 per hour. Spent 50 in 50 h, exactly on pace: the next hour may cost
        // 100 - 50 - 1 × 49 = 1.
        let b = Budget {
            cap: 100.0,
            period_s: 100.0 * 3600.0,
        };
        assert!((b.allowed(50.0, 50.0 * 3600.0, 3600.0, 0.0) - 1.0).abs() < 1e-9);
        // Floors burning 2/h project the rest at 2/h: nothing left for the next hour.
        assert_eq!(b.allowed(50.0, 50.0 * 3600.0, 3600.0, 2.0 / 3600.0), 0.0);
        let asks = [
            Ask {
                wanted: 1,
                floor: 0,
                criticality: 1.0,
                price_per_hour: 0.6,
            },
            Ask {
                wanted: 2,
                floor: 0,
                criticality: 0.1,
                price_per_hour: 0.3,
            },
        ];
        let p = pace(&b, 50.0, 50.0 * 3600.0, 3600.0, &asks);
        // 1.2 wanted, 1 allowed: one best-effort replica goes, the critical one stays.
        assert_eq!(p.replicas, vec![1, 1]);
        assert!(p.limited && !p.over_cap);
    }

    #[test]
    fn pacing_never_passes_the_cap_over_a_period() {
        // A variant that always wants 3 replicas at 1/h, a cap worth 2 replicas on average.
        let hours = 240.0;
        let b = Budget {
            cap: 2.0 * hours,
            period_s: hours * 3600.0,
        };
        let (mut spent, step) = (0.0, 600.0);
        let mut t = 0.0;
        while t < b.period_s {
            let ask = Ask {
                wanted: 3,
                floor: 0,
                criticality: 0.0,
                price_per_hour: 1.0,
            };
            let p = pace(&b, spent, t, step, &[ask]);
            spent += f64::from(p.replicas[0]) * step / 3600.0;
            assert!(spent <= b.cap + 1e-9, "t={t}: {spent}");
            t += step;
        }
        // And it uses most of it.
        assert!(spent > 0.95 * b.cap, "{spent}");
    }

    #[test]
    fn floors_that_do_not_fit_are_reported() {
        let b = Budget {
            cap: 1.0,
            period_s: 3600.0,
        };
        let ask = Ask {
            wanted: 5,
            floor: 4,
            criticality: 1.0,
            price_per_hour: 1.0,
        };
        let p = pace(&b, 0.0, 0.0, 3600.0, &[ask]);
        assert_eq!(p.replicas, vec![4]);
        assert!(p.over_cap);
    }
}

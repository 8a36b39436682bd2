//! The replay: a trace's arrivals against replicas that take a cold start to serve, a fluid
//! queue per bin, and one autoscaling policy deciding every decision interval.
//!
//! Per bin of width `dt` (10 s):
//! - **Preemption** (spot runs): each spot replica gets a notice with probability
//!   `1 - exp(-rate × dt)`; it serves until the notice ends, and a critical variant starts its
//!   replacement on on-demand at once (`cost::replacement`).
//! - **Service**: a replica serves `capacity_rps` from the moment its cold start ends until it is
//!   stopped or preempted, pro rata within the bin. Arrivals join the backlog; the bin's
//!   queueing delay is the mean backlog over the bin divided by the service rate (fluid model:
//!   within-bin burstiness is not modelled, which is what a policy's target utilization is
//!   for). A bin meets the SLO when that delay is at most `slo_s`; attainment is weighted by
//!   the bin's requests.
//! - **Cost**: every replica costs from its start (booting included) to its stop, at its pool's
//!   price; GPU-hours likewise.
//! - **Decision** (every `decision_interval_s`): the policy sees the arrival rate since the last
//!   decision, the backlog and the ready replicas, and returns a target; new replicas boot for
//!   `warm_start_s` when the base weights are already resident on the GPU they land on (drawn
//!   with probability `base_resident`) and `cold_start_s` otherwise; a lower target stops the
//!   replicas still booting first, then ready ones. With spot, the target is split between the
//!   pools by `cost::split`, and a budget (if any) paces the target and a best-effort batch
//!   variant by `cost::pace`.

use std::collections::BTreeMap;

use weft_control::autoscaler::cost::{self, Ask, Budget, Pool, PoolPolicy, PoolSplit};
use weft_control::autoscaler::forecast::smape;
use weft_control::autoscaler::{Policy, VariantLoad};
use weft_control::scheduler::rng::SplitMix64;

use super::trace::Trace;

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub capacity_rps: f64,
    /// Boot time when the base weights must be loaded.
    pub cold_start_s: f64,
    /// Boot time when the base is resident and only the variant's delta loads.
    pub warm_start_s: f64,
    /// Probability that a new replica finds its base resident.
    pub base_resident: f64,
    pub decision_interval_s: f64,
    pub slo_s: f64,
    /// Horizon of the forecasts scored by sMAPE (the policies' lead time).
    pub lead_s: f64,
    /// Bucket over which forecasts and actual demand are compared.
    pub forecast_bucket_s: f64,
    /// Metrics count from this offset into the trace (the rest is warm-up).
    pub eval_from_s: f64,
    /// Replicas ready at t = 0.
    pub initial_replicas: u32,
    pub on_demand: Pool,
    pub seed: u64,
    pub spot: Option<SpotSetup>,
}

#[derive(Clone, Debug)]
pub struct SpotSetup {
    pub pool: Pool,
    pub policy: PoolPolicy,
    pub notice_s: f64,
    /// The replayed variant's criticality.
    pub criticality: f64,
    pub budget: Option<BudgetSetup>,
}

/// A budget over the evaluated window, shared with a best-effort batch variant that always
/// wants `batch_replicas` (on spot; its replicas are modelled as cost only).
#[derive(Clone, Debug)]
pub struct BudgetSetup {
    pub budget: Budget,
    pub batch_replicas: u32,
    pub batch_criticality: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    OnDemand,
    Spot,
}

#[derive(Clone, Debug)]
struct Replica {
    pool: PoolKind,
    ready_at: f64,
    /// End of its preemption notice.
    gone_at: Option<f64>,
}

/// One point per bin, for the plot.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub t_s: f64,
    pub demand_rps: f64,
    pub replicas: u32,
    pub ready: u32,
}

#[derive(Clone, Debug, Default)]
pub struct BatchOutcome {
    pub cap: f64,
    pub spent: f64,
    /// Largest `spent - cap` seen at any bin (≤ 0: never passed).
    pub max_over_cap: f64,
    pub wanted_replica_hours: f64,
    pub granted_replica_hours: f64,
    pub limited_decisions: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub requests: f64,
    pub slo_attainment: f64,
    pub bins_in_slo: f64,
    pub mean_queue_delay_s: f64,
    pub gpu_hours: f64,
    pub on_demand_gpu_hours: f64,
    pub spot_gpu_hours: f64,
    /// The replayed variant's cost (the batch variant's is in `batch`).
    pub cost: f64,
    pub scale_events: u64,
    pub cold_starts: u64,
    pub cold_start_delay_s: f64,
    pub preemptions: u64,
    pub smape: Option<f64>,
    /// sMAPE of "the demand one lead time ago" (persistence), the bar a forecaster must beat.
    pub smape_persistence: Option<f64>,
    pub batch: Option<BatchOutcome>,
    pub series: Vec<Point>,
    /// (bucket start, forecast made one lead time earlier), evaluated window.
    pub forecasts: Vec<(f64, f64)>,
}

/// The fleet and its counters while replaying.
struct Fleet<'a> {
    cfg: &'a SimConfig,
    reps: Vec<Replica>,
    rng: SplitMix64,
    eval: bool,
    out: Outcome,
}

impl Fleet<'_> {
    fn alive(&self, pool: PoolKind) -> u32 {
        self.reps
            .iter()
            .filter(|r| r.pool == pool && r.gone_at.is_none())
            .count() as u32
    }

    fn start(&mut self, pool: PoolKind, now: f64) {
        let boot = if self.rng.unit() < self.cfg.base_resident {
            self.cfg.warm_start_s
        } else {
            self.cfg.cold_start_s
        };
        self.reps.push(Replica {
            pool,
            ready_at: now + boot,
            gone_at: None,
        });
        if self.eval {
            self.out.cold_starts += 1;
            self.out.cold_start_delay_s += boot;
        }
    }

    /// Stops `n` replicas of `pool`, those still booting (latest first) before ready ones.
    fn stop(&mut self, pool: PoolKind, n: u32) {
        for _ in 0..n {
            let victim = self
                .reps
                .iter()
                .enumerate()
                .filter(|(_, r)| r.pool == pool && r.gone_at.is_none())
                .max_by(|a, b| a.1.ready_at.total_cmp(&b.1.ready_at))
                .map(|(i, _)| i);
            if let Some(i) = victim {
                self.reps.swap_remove(i);
            }
        }
    }

    /// Moves the fleet to `split`: new replicas go to the pools below their share, stops come
    /// from the pools above it (spot first). Returns whether anything changed.
    fn apply(&mut self, split: PoolSplit, now: f64) -> bool {
        let (od, spot) = (self.alive(PoolKind::OnDemand), self.alive(PoolKind::Spot));
        let (have, want) = (od + spot, split.on_demand + split.spot);
        if want > have {
            let n = want - have;
            let to_od = split.on_demand.saturating_sub(od).min(n);
            for _ in 0..to_od {
                self.start(PoolKind::OnDemand, now);
            }
            for _ in to_od..n {
                self.start(PoolKind::Spot, now);
            }
        } else if want < have {
            let n = have - want;
            let from_spot = spot.saturating_sub(split.spot).min(n);
            self.stop(PoolKind::Spot, from_spot);
            self.stop(PoolKind::OnDemand, n - from_spot);
        }
        want != have
    }

    /// Spot preemption notices for this bin, and the replacements they trigger.
    fn preempt(&mut self, spot: &SpotSetup, t0: f64, dt: f64) {
        let p = 1.0 - (-spot.pool.preemptions_per_hour * dt / 3600.0).exp();
        let mut lost = 0;
        for r in self.reps.iter_mut() {
            if r.pool == PoolKind::Spot && r.gone_at.is_none() && self.rng.unit() < p {
                r.gone_at = Some(t0 + spot.notice_s);
                lost += 1;
            }
        }
        for _ in 0..cost::replacement(lost, spot.criticality, &spot.policy) {
            self.start(PoolKind::OnDemand, t0);
        }
        if self.eval {
            self.out.preemptions += u64::from(lost);
        }
    }

    /// Serving capacity (replica-bins) and cost over `[t0, t0 + dt)`; drops replicas gone by
    /// its end.
    fn run_bin(&mut self, t0: f64, dt: f64, spot_price: f64) -> f64 {
        let t1 = t0 + dt;
        let mut serving = 0.0;
        for r in &self.reps {
            let until = r.gone_at.unwrap_or(f64::INFINITY).min(t1);
            serving += ((until - r.ready_at.max(t0)) / dt).clamp(0.0, 1.0);
            if self.eval {
                let hours = ((until - t0) / dt).clamp(0.0, 1.0) * dt / 3600.0;
                self.out.gpu_hours += hours;
                if r.pool == PoolKind::Spot {
                    self.out.spot_gpu_hours += hours;
                    self.out.cost += hours * spot_price;
                } else {
                    self.out.on_demand_gpu_hours += hours;
                    self.out.cost += hours * self.cfg.on_demand.price_per_hour;
                }
            }
        }
        self.reps.retain(|r| r.gone_at.is_none_or(|g| g > t1));
        serving
    }
}

/// Replays `trace` under `policy`.
pub fn replay(trace: &Trace, cfg: &SimConfig, policy: &mut dyn Policy) -> Outcome {
    let dt = trace.bin_s;
    let mut fleet = Fleet {
        cfg,
        reps: (0..cfg.initial_replicas)
            .map(|_| Replica {
                pool: PoolKind::OnDemand,
                ready_at: 0.0,
                gone_at: None,
            })
            .collect(),
        rng: SplitMix64::new(cfg.seed),
        eval: false,
        out: Outcome::default(),
    };
    let spot_price = cfg.spot.as_ref().map_or(0.0, |s| s.pool.price_per_hour);
    let every = (cfg.decision_interval_s / dt).round().max(1.0) as usize;
    let (mut backlog, mut target) = (0.0f64, cfg.initial_replicas);
    let (mut arrived_since, mut bins_since) = (0.0, 0usize);
    let (mut ok, mut ok_bins, mut bins, mut delay_sum) = (0.0, 0usize, 0usize, 0.0);
    let mut batch = cfg.spot.as_ref().and_then(|s| s.budget.as_ref()).map(|b| {
        (
            b,
            BatchOutcome {
                cap: b.budget.cap,
                max_over_cap: f64::NEG_INFINITY,
                ..Default::default()
            },
            b.batch_replicas,
        )
    });
    let mut forecasts: BTreeMap<i64, (f64, u32)> = BTreeMap::new();

    for (i, &arrived) in trace.counts.iter().enumerate() {
        let t0 = i as f64 * dt;
        fleet.eval = t0 >= cfg.eval_from_s;
        if let Some(spot) = &cfg.spot {
            fleet.preempt(spot, t0, dt);
        }
        let serving = fleet.run_bin(t0, dt, spot_price);
        let rate = serving * cfg.capacity_rps;
        let total = backlog + arrived;
        let (delay, after) = queue_bin(backlog, arrived, rate, dt);
        backlog = after;
        if fleet.eval {
            bins += 1;
            fleet.out.requests += arrived;
            delay_sum += arrived * delay.min(3600.0);
            if delay <= cfg.slo_s {
                ok += arrived;
                ok_bins += 1;
            }
            if let Some((setup, b, granted)) = batch.as_mut() {
                let hours = dt / 3600.0;
                b.wanted_replica_hours += f64::from(setup.batch_replicas) * hours;
                b.granted_replica_hours += f64::from(*granted) * hours;
                b.spent += f64::from(*granted) * hours * spot_price;
                let spent = b.spent + fleet.out.cost;
                b.max_over_cap = b.max_over_cap.max(spent - b.cap);
            }
        }
        fleet.out.series.push(Point {
            t_s: t0,
            demand_rps: arrived / dt,
            replicas: fleet.alive(PoolKind::OnDemand) + fleet.alive(PoolKind::Spot),
            ready: fleet.reps.iter().filter(|r| r.ready_at <= t0 + dt).count() as u32,
        });
        arrived_since += arrived;
        bins_since += 1;
        if (i + 1) % every != 0 {
            continue;
        }

        // A decision at the end of the bin.
        let now = t0 + dt;
        let load = VariantLoad {
            request_rate: arrived_since / (bins_since as f64 * dt),
            in_flight: rate.min(total / dt),
            queue_depth: backlog,
            latency_s: delay.min(3600.0),
        };
        (arrived_since, bins_since) = (0.0, 0);
        let ready = fleet
            .reps
            .iter()
            .filter(|r| r.gone_at.is_none() && r.ready_at <= now)
            .count() as u32;
        target = policy.decide(now, &load, ready, target).replicas;
        if let Some(f) = policy.forecast_rps(now + cfg.lead_s) {
            let k = ((now + cfg.lead_s) / cfg.forecast_bucket_s).floor() as i64;
            let e = forecasts.entry(k).or_default();
            (e.0, e.1) = (e.0 + f, e.1 + 1);
        }
        let split = match &cfg.spot {
            Some(s) => cost::split(target, s.criticality, &s.pool, &s.policy),
            None => PoolSplit {
                on_demand: target,
                spot: 0,
            },
        };
        let split = match (batch.as_mut(), &cfg.spot) {
            (Some((setup, b, granted)), Some(spot)) if fleet.eval => {
                let paced = pace(
                    setup,
                    spot,
                    cfg,
                    split,
                    b.spent + fleet.out.cost,
                    now - cfg.eval_from_s,
                );
                *granted = paced.1;
                b.limited_decisions += u64::from(paced.2);
                paced.0
            }
            _ => split,
        };
        if fleet.apply(split, now) && fleet.eval {
            fleet.out.scale_events += 1;
        }
    }

    let mut out = fleet.out;
    out.slo_attainment = if out.requests > 0.0 {
        ok / out.requests
    } else {
        1.0
    };
    out.bins_in_slo = ok_bins as f64 / bins.max(1) as f64;
    out.mean_queue_delay_s = delay_sum / out.requests.max(1.0);
    out.batch = batch.map(|b| b.1);
    score_forecasts(trace, cfg, &forecasts, &mut out);
    out
}

/// One bin of the fluid queue: `backlog` waiting at its start, `arrived` during it, served at
/// `rate` req/s for `dt` s. Returns (queueing delay: the mean backlog over the service rate,
/// backlog at its end).
pub fn queue_bin(backlog: f64, arrived: f64, rate: f64, dt: f64) -> (f64, f64) {
    let total = backlog + arrived;
    let after = total - total.min(rate * dt);
    let delay = if backlog + after <= 1e-9 {
        0.0
    } else if rate > 0.0 {
        (backlog + after) / 2.0 / rate
    } else {
        f64::INFINITY
    };
    (delay, after)
}

/// The budget's cut of the target (`split`) and of the batch variant: (split, batch replicas,
/// whether anything was cut).
fn pace(
    setup: &BudgetSetup,
    spot: &SpotSetup,
    cfg: &SimConfig,
    split: PoolSplit,
    spent: f64,
    elapsed_s: f64,
) -> (PoolSplit, u32, bool) {
    let want = split.on_demand + split.spot;
    let blended = if want == 0 {
        cfg.on_demand.price_per_hour
    } else {
        (f64::from(split.on_demand) * cfg.on_demand.price_per_hour
            + f64::from(split.spot) * spot.pool.price_per_hour)
            / f64::from(want)
    };
    let asks = [
        Ask {
            wanted: want,
            // A critical variant is not cut by the budget in this replay (only best effort is):
            // a cap below its own spend shows up as `max_over_cap` > 0.
            floor: if spot.criticality >= spot.policy.critical_at {
                want
            } else {
                1
            },
            criticality: spot.criticality,
            price_per_hour: blended,
        },
        Ask {
            wanted: setup.batch_replicas,
            floor: 0,
            criticality: setup.batch_criticality,
            price_per_hour: spot.pool.price_per_hour,
        },
    ];
    let paced = cost::pace(
        &setup.budget,
        spent,
        elapsed_s,
        cfg.decision_interval_s,
        &asks,
    );
    let granted = paced.replicas[0];
    let split = if granted < want {
        cost::split(granted, spot.criticality, &spot.pool, &spot.policy)
    } else {
        split
    };
    (split, paced.replicas[1], paced.limited)
}

/// sMAPE of the lead-time forecasts against the bucket means, over the evaluated window, and
/// of persistence (the bucket one lead time earlier).
fn score_forecasts(
    trace: &Trace,
    cfg: &SimConfig,
    forecasts: &BTreeMap<i64, (f64, u32)>,
    out: &mut Outcome,
) {
    let actual = trace.bucket_means(cfg.forecast_bucket_s);
    let first = (cfg.eval_from_s / cfg.forecast_bucket_s).ceil() as usize;
    let lag = (cfg.lead_s / cfg.forecast_bucket_s).ceil() as usize;
    let (mut a, mut f, mut p, mut pa) = (vec![], vec![], vec![], vec![]);
    for k in first..actual.len() {
        if let Some(&(sum, n)) = forecasts.get(&(k as i64)) {
            a.push(actual[k]);
            f.push(sum / f64::from(n));
            out.forecasts
                .push((k as f64 * cfg.forecast_bucket_s, sum / f64::from(n)));
        }
        if k >= lag {
            pa.push(actual[k]);
            p.push(actual[k - lag]);
        }
    }
    out.smape = smape(&a, &f);
    out.smape_persistence = smape(&pa, &p);
}

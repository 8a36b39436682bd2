//! Clairvoyant controls: policies that read the trace's future, to tell how much of a real
//! policy's GPU-hours is its forecaster's fault and how much the SLO itself demands.
//!
//! - [`Clairvoyant`] with [`Foresight::Minutes`] knows every future minute's mean arrival rate
//!   and the spread of the 10 s rates inside it (with `error` 0, a perfect forecaster: sMAPE 0),
//!   but not which 10 s bin of the minute the burst lands in. It plans for mean + z × spread,
//!   as the predictive policy does with its own estimates. With `error` > 0 each minute's mean
//!   is off by a seeded, independent relative error of that standard deviation, and the margin
//!   covers it too: how good a forecaster must be for a given cost.
//! - [`Clairvoyant`] with [`Foresight::Bins`] knows every future bin's arrivals exactly.
//! - Both still pay real cold starts: they decide every interval and their replicas boot like
//!   anyone's, sized for the highest planned rate over the next lead time.
//! - [`free_boot_floor`] drops the boots too: every bin gets the fewest replicas that keep its
//!   queueing delay within the SLO, instantly and for free.
//!
//! None of these is a policy anyone can run; they are the yardsticks for the ones that can.

use weft_control::autoscaler::forecast::smape;
use weft_control::autoscaler::{Decision, Policy, Reason, VariantConfig, VariantLoad};
use weft_control::scheduler::rng::SplitMix64;

use super::sim::queue_bin;
use super::trace::Trace;

/// What a clairvoyant control knows of the future.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Foresight {
    /// Each minute's mean rate, times (1 + `error` × a standard normal draw), plus `z` × the
    /// standard deviation of its bins' rates and of that error.
    Minutes {
        bucket_s: f64,
        z: f64,
        error: f64,
        seed: u64,
    },
    /// Each bin's rate.
    Bins,
}

/// Sizes for the highest planned rate over `[now, now + lead]`, at `utilization`.
#[derive(Clone, Debug)]
pub struct Clairvoyant {
    variant: VariantConfig,
    /// Rate (req/s) to plan for, per bin of the trace.
    planned: Vec<f64>,
    bin_s: f64,
    lead_s: f64,
    utilization: f64,
}

impl Clairvoyant {
    pub fn new(
        trace: &Trace,
        foresight: Foresight,
        variant: VariantConfig,
        lead_s: f64,
        utilization: f64,
    ) -> Self {
        Self {
            planned: planned_rates(trace, foresight).0,
            variant,
            bin_s: trace.bin_s,
            lead_s,
            utilization,
        }
    }
}

/// Per bin, the rate a clairvoyant with `foresight` plans for; and the sMAPE (%) of the
/// forecast minute means against the true ones (`None` for bin foresight).
pub fn planned_rates(trace: &Trace, foresight: Foresight) -> (Vec<f64>, Option<f64>) {
    let rates: Vec<f64> = trace.counts.iter().map(|c| c / trace.bin_s).collect();
    let Foresight::Minutes {
        bucket_s,
        z,
        error,
        seed,
    } = foresight
    else {
        return (rates, None);
    };
    let per = (bucket_s / trace.bin_s).round().max(1.0) as usize;
    let mut rng = SplitMix64::new(seed);
    let (mut planned, mut means, mut forecasts) = (Vec::with_capacity(rates.len()), vec![], vec![]);
    for c in rates.chunks(per) {
        let n = c.len() as f64;
        let mean = c.iter().sum::<f64>() / n;
        let spread = c.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / n;
        let forecast = (mean * (1.0 + error * std_normal(&mut rng))).max(0.0);
        let margin = z * (spread + (error * forecast).powi(2)).sqrt();
        planned.extend(std::iter::repeat_n(forecast + margin, c.len()));
        means.push(mean);
        forecasts.push(forecast);
    }
    (planned, smape(&means, &forecasts))
}

/// A standard normal draw (Box-Muller).
fn std_normal(rng: &mut SplitMix64) -> f64 {
    let u = 1.0 - rng.unit(); // (0, 1]: ln is finite
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * rng.unit()).cos()
}

impl Policy for Clairvoyant {
    fn decide(&mut self, now_s: f64, load: &VariantLoad, _ready: u32, _current: u32) -> Decision {
        let from = (now_s / self.bin_s).floor() as usize;
        let to = ((now_s + self.lead_s) / self.bin_s).ceil() as usize;
        let peak = self
            .planned
            .get(from.min(self.planned.len())..to.min(self.planned.len()))
            .and_then(|w| w.iter().copied().reduce(f64::max))
            .unwrap_or(0.0);
        // A backlog left by a miss still has to drain, as for every policy.
        let backlog = self.variant.demand_rps(load) - load.request_rate.max(0.0);
        Decision {
            replicas: self
                .variant
                .clamp(self.variant.replicas_for(peak + backlog, self.utilization)),
            reason: Reason::Forecast,
        }
    }

    fn forecast_rps(&self, at_s: f64) -> Option<f64> {
        self.planned.get((at_s / self.bin_s).floor() as usize).copied()
    }
}

/// GPU-hours from `eval_from_s` on when every bin gets, instantly and at no boot cost, the
/// fewest replicas (at least `min_replicas`) that keep its queueing delay within `slo_s`
/// (every bin meets the SLO). Greedy, bin by bin: a reference point, not a proven minimum.
pub fn free_boot_floor(
    trace: &Trace,
    capacity_rps: f64,
    slo_s: f64,
    min_replicas: u32,
    eval_from_s: f64,
) -> f64 {
    let dt = trace.bin_s;
    let mut backlog = 0.0;
    let mut replica_s = 0.0;
    for (i, &arrived) in trace.counts.iter().enumerate() {
        let mut n = min_replicas.max(1);
        let (mut delay, mut after) = queue_bin(backlog, arrived, f64::from(n) * capacity_rps, dt);
        while delay > slo_s {
            n += 1;
            (delay, after) = queue_bin(backlog, arrived, f64::from(n) * capacity_rps, dt);
        }
        backlog = after;
        if i as f64 * dt >= eval_from_s {
            replica_s += f64::from(n) * dt;
        }
    }
    replica_s / 3600.0
}

/// sMAPE (%) of each minute's mean rate from `from_s` on against the mean of its `w` neighbours
/// on either side (the minute itself left out). A two-sided smoother sees the future as well as
/// the past, so no forecaster one lead time ahead should beat it by much: it estimates how much
/// of a minute's demand is noise around the local level.
pub fn neighbour_smape(trace: &Trace, bucket_s: f64, from_s: f64, w: usize) -> Option<f64> {
    let means = trace.bucket_means(bucket_s);
    let first = (from_s / bucket_s).ceil() as usize;
    let (mut actual, mut smoothed) = (vec![], vec![]);
    for k in first..means.len() {
        let (lo, hi) = (k.saturating_sub(w), (k + w + 1).min(means.len()));
        let others: Vec<f64> = (lo..hi).filter(|&j| j != k).map(|j| means[j]).collect();
        if !others.is_empty() {
            actual.push(means[k]);
            smoothed.push(others.iter().sum::<f64>() / others.len() as f64);
        }
    }
    smape(&actual, &smoothed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(counts: &[f64]) -> Trace {
        Trace {
            name: "t".into(),
            start_s: 0.0,
            bin_s: 10.0,
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn minute_foresight_plans_mean_plus_z_spread_for_the_whole_minute() {
        // One minute of six 10 s bins: rates 1,1,1,1,1,7 req/s → mean 2, std √5.
        let t = trace(&[10.0, 10.0, 10.0, 10.0, 10.0, 70.0, 20.0]);
        let minutes = |z, error| Foresight::Minutes {
            bucket_s: 60.0,
            z,
            error,
            seed: 7,
        };
        let (p, smape) = planned_rates(&t, minutes(2.0, 0.0));
        let want = 2.0 + 2.0 * 5f64.sqrt();
        assert!(p[..6].iter().all(|r| (r - want).abs() < 1e-9), "{p:?}");
        assert_eq!(p[6], 2.0, "a lone bin is its own mean, no spread");
        assert_eq!(smape, Some(0.0), "no error: a perfect forecast");
        assert_eq!(planned_rates(&t, Foresight::Bins).0[5], 7.0);
        // With an error, the forecast means are off and the margin grows with the error.
        let (p, smape) = planned_rates(&t, minutes(0.0, 0.2));
        assert!(smape.unwrap() > 0.0 && p[0] != 2.0, "{p:?}");
    }

    #[test]
    fn a_forecast_error_of_s_gives_an_smape_near_0_8_s() {
        // E|N(0, s)| = s·√(2/π) ≈ 0.8 s: the draws are standard normal.
        let t = trace(&[60.0; 60_000]);
        let minutes = Foresight::Minutes {
            bucket_s: 60.0,
            z: 0.0,
            error: 0.1,
            seed: 1,
        };
        let smape = planned_rates(&t, minutes).1.unwrap();
        assert!((7.5..8.5).contains(&smape), "{smape}");
    }

    #[test]
    fn sizes_for_the_peak_within_the_lead_time_only() {
        // 1 req/s, a 10 req/s bin 30 s ahead, 30 req/s 100 s ahead; 1 req/s per replica.
        let mut counts = vec![10.0; 20];
        counts[3] = 100.0;
        counts[10] = 300.0;
        let t = trace(&counts);
        let variant = VariantConfig::new(1.0, 20.0);
        let mut short = Clairvoyant::new(&t, Foresight::Bins, variant.clone(), 40.0, 1.0);
        let d = short.decide(0.0, &VariantLoad::default(), 0, 0);
        assert_eq!(d.replicas, 10, "the 10 req/s bin is within 40 s; the 30 req/s one is not");
        let mut long = Clairvoyant::new(&t, Foresight::Bins, variant, 110.0, 1.0);
        assert_eq!(long.decide(0.0, &VariantLoad::default(), 0, 0).replicas, 30);
    }

    #[test]
    fn a_smooth_series_has_no_neighbour_noise_and_a_jagged_one_does() {
        // Minutes alternating 1 and 3 req/s: each one's neighbours average 3 or 1 → sMAPE 100%.
        let jagged: Vec<f64> = (0..60).map(|i| if (i / 6) % 2 == 0 { 10.0 } else { 30.0 }).collect();
        let s = neighbour_smape(&trace(&jagged), 60.0, 60.0, 1).unwrap();
        assert!((s - 100.0).abs() < 1e-9, "{s}");
        let flat = trace(&[10.0; 60]);
        assert_eq!(neighbour_smape(&flat, 60.0, 0.0, 2), Some(0.0));
    }

    #[test]
    fn the_free_boot_floor_lets_the_slo_absorb_a_burst() {
        // 1 replica at 10 req/s. Steady 100 per bin: 1 replica. A 140 bin: one replica leaves
        // 40 waiting, mean backlog 20 / 10 req/s = 2 s, within a 2 s SLO; 150 would not be.
        let t = trace(&[100.0, 140.0, 0.0, 0.0]);
        assert!((free_boot_floor(&t, 10.0, 2.0, 1, 0.0) - 40.0 / 3600.0).abs() < 1e-12);
        let t = trace(&[100.0, 150.0, 0.0, 0.0]);
        assert!((free_boot_floor(&t, 10.0, 2.0, 1, 0.0) - 50.0 / 3600.0).abs() < 1e-12);
    }
}

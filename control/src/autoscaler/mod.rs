//! Autoscaler: how many replicas each model variant should run, and on which GPU pool.
//!
//! Pure decision logic in the openraft-engine style: a policy is fed one load report at a time
//! (time is a parameter, there are no clocks, sockets or tasks here) and returns a [`Decision`];
//! the control plane applies it. The pieces:
//!
//! - [`reactive`]: Knative's KPA (stable/panic windows): scale to the demand just observed.
//! - [`forecast`]: Holt-Winters with additive daily seasonality, simple exponential smoothing
//!   while the history is shorter than two days, parameter fitting and sMAPE.
//! - [`predictive`]: scale out ahead of the demand forecast over a lead time of one cold start
//!   plus one decision interval; never scale in on a forecast alone; fall back to the observed
//!   demand when the forecast undershoots.
//! - [`hybrid`]: the larger of the predictive and the reactive targets.
//! - [`capacity`]: a replica's capacity estimated from observed latency vs concurrency.
//! - [`cost`]: spot vs on-demand by risk score, monthly budget pacing, preemption replacement.
//! - [`spec`]: the `Autoscaler` resource users write and the `ScalingDecision` record the
//!   leader commits.
//! - [`live`]: the leader's decision loop as pure logic: sidecar counters → loads → decisions,
//!   and preemption notices.
//! - [`placing`]: a committed decision → the replica placements to add and release, for the
//!   scheduler to place on the GPU inventory.
//!
//! Why demand is in requests per second: the sidecars report request rates, and a replica's
//! capacity in requests per second (configured or estimated) turns demand into replicas the same
//! way for every policy, so they differ only in *when* they ask for capacity.

pub mod capacity;
pub mod cost;
pub mod forecast;
pub mod hybrid;
pub mod ledger;
pub mod live;
pub mod placing;
pub mod predictive;
pub mod reactive;
pub mod spec;

/// One variant's load as its sidecars report it (aggregated over the variant's replicas).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VariantLoad {
    /// Arrivals per second over the last report interval.
    pub request_rate: f64,
    /// Requests being served now.
    pub in_flight: f64,
    /// Requests waiting for a replica.
    pub queue_depth: f64,
    /// Recent mean latency (queueing + service), seconds.
    pub latency_s: f64,
}

/// What the autoscaler knows about one variant.
#[derive(Clone, Debug, PartialEq)]
pub struct VariantConfig {
    /// Requests per second one replica serves at full utilization (configured, or from
    /// [`capacity::estimate_rps`]).
    pub capacity_rps: f64,
    /// Worst-case time from "start a replica" to "it serves" (base weights not resident).
    pub cold_start_s: f64,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// 0 (best effort) ..= 1 (critical): weighs preemption risk and budget cuts.
    pub criticality: f64,
    /// A backlog counts as extra demand that drains it within this many seconds: a queue that
    /// grows must raise the target even while the arrival rate is flat.
    pub backlog_drain_s: f64,
}

impl VariantConfig {
    /// A variant with `capacity_rps` per replica, 0..=1000 replicas, critical.
    pub fn new(capacity_rps: f64, cold_start_s: f64) -> Self {
        Self {
            capacity_rps,
            cold_start_s,
            min_replicas: 0,
            max_replicas: 1000,
            criticality: 1.0,
            backlog_drain_s: 30.0,
        }
    }

    /// The request rate to plan for: arrivals plus draining the backlog.
    pub fn demand_rps(&self, load: &VariantLoad) -> f64 {
        load.request_rate.max(0.0) + load.queue_depth.max(0.0) / self.backlog_drain_s.max(1e-9)
    }

    /// Replicas that serve `rps` with each one at `utilization` of its capacity (unclamped).
    pub fn replicas_for(&self, rps: f64, utilization: f64) -> u32 {
        let per_replica = self.capacity_rps * utilization;
        if rps <= 0.0 || per_replica <= 0.0 {
            return 0;
        }
        // 1e-9: 30 rps at 10 rps/replica is 3 replicas, not 4 by rounding noise.
        (rps / per_replica - 1e-9).ceil().min(u32::MAX as f64) as u32
    }

    pub fn clamp(&self, n: u32) -> u32 {
        n.clamp(self.min_replicas, self.max_replicas.max(self.min_replicas))
    }
}

/// Why a target was chosen (for `weftctl autoscale status` and the replay's logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Reactive, stable window.
    Stable,
    /// Reactive, panic mode (short-window demand at 2x the ready capacity); no scale-down.
    Panic,
    /// Ahead of the forecast demand over the lead time.
    Forecast,
    /// The forecast undershot the observed demand: the observed demand set the target.
    Undershoot,
    /// A scale-in was held back: the observed demand (or the forecast) still needs the replicas.
    HoldScaleIn,
}

/// A replica target for one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub replicas: u32,
    pub reason: Reason,
}

/// A scaling policy: one call per decision interval, with the latest report.
pub trait Policy {
    /// The target at `now_s`, given the `load` just reported and the replicas `ready` to serve
    /// (booting replicas excluded) out of `current` (the last target).
    fn decide(&mut self, now_s: f64, load: &VariantLoad, ready: u32, current: u32) -> Decision;

    /// The demand (req/s) the policy expects at `at_s`, when it forecasts; for plots and sMAPE.
    fn forecast_rps(&self, _at_s: f64) -> Option<f64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_for_rounds_up_exactly() {
        let v = VariantConfig::new(10.0, 60.0);
        assert_eq!(v.replicas_for(30.0, 1.0), 3);
        assert_eq!(v.replicas_for(30.1, 1.0), 4);
        assert_eq!(v.replicas_for(21.0, 0.7), 3);
        assert_eq!(v.replicas_for(0.0, 0.7), 0);
    }

    #[test]
    fn backlog_counts_as_demand() {
        let v = VariantConfig::new(10.0, 60.0);
        let load = VariantLoad {
            request_rate: 20.0,
            queue_depth: 300.0,
            ..Default::default()
        };
        assert_eq!(v.demand_rps(&load), 30.0);
    }
}

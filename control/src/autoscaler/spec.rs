//! What a user writes to autoscale one variant (an `autoscalers/<name>` resource), and what the
//! decision loop writes back (a `scalingdecisions/<name>` resource, pushed over xDS as
//! `weft.v1.ScalingDecision`). Validation names the field at fault.

use serde::{Deserialize, Serialize};

use super::VariantConfig;
use super::cost::Pool;

/// Which policy decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Knative's KPA on the observed demand.
    Reactive,
    /// Ahead of the Holt-Winters forecast, falling back to the observed demand.
    Predictive,
    /// The larger of the two (the default).
    #[default]
    Hybrid,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Reactive => "reactive",
            PolicyKind::Predictive => "predictive",
            PolicyKind::Hybrid => "hybrid",
        }
    }
}

/// The spot pool a variant may use: what a GPU-hour costs there and how often one is taken back.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpotSpec {
    pub price_per_hour: f64,
    pub preemptions_per_hour: f64,
}

/// A monthly spending cap shared by every autoscaler that names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    pub name: String,
    /// The cap per UTC calendar month (the smallest one given wins when autoscalers of one
    /// budget disagree).
    pub monthly_usd: f64,
}

/// What one replica of the variant needs, so the scheduler can place the decided replicas on
/// the GPU inventory (`placements/<autoscaler>-od-N` and `-spot-N`, pushed over xDS as
/// `weft.v1.Placement`). Without it the decision is only pushed, for an outside orchestrator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaTemplate {
    /// Replicas of variants of one base on one GPU share a single copy of its weights.
    pub base_model: String,
    pub base_bytes: u64,
    /// The variant's own weights (fine-tuned layers, adapter).
    #[serde(default)]
    pub delta_bytes: u64,
    /// KV cache and activations while serving.
    #[serde(default)]
    pub working_set_bytes: u64,
    /// Share of one GPU's compute, milli-GPU (1..=1000).
    pub compute_milli: u32,
    #[serde(default)]
    pub cpu_milli: u32,
    #[serde(default)]
    pub memory_mib: u64,
    /// Placement priority: may evict strictly lower-priority placements when space is short.
    #[serde(default)]
    pub priority: crate::scheduler::workload::Priority,
    /// Allowed GPU models (empty: any).
    #[serde(default)]
    pub gpu_spec: Vec<String>,
    /// How node agents start each replica (copied into every placement; absent: placed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<crate::launch::Launch>,
}

/// An autoscaler for one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AutoscalerSpec {
    /// The resource's name (the API fills it in from the URL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The variant as the sidecars label their load reports (the experiment variant's name).
    pub variant: String,
    #[serde(default)]
    pub policy: PolicyKind,
    /// Requests per second one replica serves at full utilization.
    pub capacity_rps: f64,
    /// Seconds from "start a replica" to "it serves", base weights not resident.
    #[serde(default = "default_cold_start")]
    pub cold_start_s: f64,
    #[serde(default = "default_min")]
    pub min_replicas: u32,
    #[serde(default = "default_max")]
    pub max_replicas: u32,
    /// 0 (best effort) ..= 1 (critical): decides the pool and preemption replacement.
    #[serde(default = "default_criticality")]
    pub criticality: f64,
    /// A queue counts as extra demand that drains it within this many seconds.
    #[serde(default = "default_drain")]
    pub backlog_drain_s: f64,
    /// Without it, every replica runs on on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<SpotSpec>,
    /// What an on-demand replica costs per hour (for the budget; 0 = not counted).
    #[serde(default)]
    pub price_per_hour: f64,
    /// Pace this variant's spend with the others of the budget: when the month's projected
    /// spend would pass the cap, replicas are cut, least critical first, down to `min_replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// Place the decided replicas with weft's scheduler (see [`ReplicaTemplate`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<ReplicaTemplate>,
}

fn default_cold_start() -> f64 {
    60.0
}
fn default_min() -> u32 {
    1
}
fn default_max() -> u32 {
    100
}
fn default_criticality() -> f64 {
    1.0
}
fn default_drain() -> f64 {
    30.0
}

/// A spec field that does not hold: `(field, message)`, the field a path
/// (`placement.launch.cluster`).
pub type SpecError = (String, String);

impl AutoscalerSpec {
    /// Checks every field; the error names the first one at fault.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_own_fields().map_err(|(field, message)| (field.to_string(), message))?;
        match self.placement.as_ref().and_then(|p| p.launch.as_ref()) {
            Some(launch) => launch.validate_under("placement.launch"),
            None => Ok(()),
        }
    }

    /// Every field but the placement's launch, which names its own.
    fn validate_own_fields(&self) -> Result<(), (&'static str, String)> {
        // Upper bounds keep the policies' arithmetic finite (the forecaster scans the buckets of
        // one lead time): no real replica takes an hour to start or serves 10^9 requests/s.
        let within = |field: &'static str, v: f64, max: f64| {
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(())
            } else {
                Err((field, format!("{v} must be above 0 and at most {max}")))
            }
        };
        if self.variant.trim().is_empty() {
            return Err(("variant", "must name the variant the sidecars report load for".into()));
        }
        within("capacity_rps", self.capacity_rps, 1e9)?;
        within("cold_start_s", self.cold_start_s, 3600.0)?;
        within("backlog_drain_s", self.backlog_drain_s, 86_400.0)?;
        if self.max_replicas > 100_000 {
            return Err(("max_replicas", format!("{} is above 100000", self.max_replicas)));
        }
        if self.max_replicas == 0 {
            return Err(("max_replicas", "must be at least 1".into()));
        }
        if self.min_replicas > self.max_replicas {
            return Err(("min_replicas", format!("{} is above max_replicas {}", self.min_replicas, self.max_replicas)));
        }
        if !(0.0..=1.0).contains(&self.criticality) {
            return Err(("criticality", format!("{} is not in [0, 1]", self.criticality)));
        }
        if !(self.price_per_hour.is_finite() && self.price_per_hour >= 0.0) {
            return Err(("price_per_hour", format!("{} must be 0 or more", self.price_per_hour)));
        }
        if let Some(b) = &self.budget {
            if b.name.trim().is_empty() {
                return Err(("budget.name", "must name the budget the autoscalers share".into()));
            }
            if !(b.monthly_usd.is_finite() && b.monthly_usd > 0.0 && b.monthly_usd <= 1e12) {
                return Err(("budget.monthly_usd", format!("{} must be above 0 and at most 1e12", b.monthly_usd)));
            }
        }
        if let Some(s) = &self.spot {
            if !(s.price_per_hour.is_finite() && s.price_per_hour >= 0.0) {
                return Err(("spot.price_per_hour", format!("{} must be 0 or more", s.price_per_hour)));
            }
            if !(s.preemptions_per_hour.is_finite() && s.preemptions_per_hour >= 0.0) {
                return Err(("spot.preemptions_per_hour", format!("{} must be 0 or more", s.preemptions_per_hour)));
            }
        }
        if let Some(p) = &self.placement {
            if p.base_model.trim().is_empty() {
                return Err(("placement.base_model", "must name the base model (replicas of one base share its weights)".into()));
            }
            if !(1..=1000).contains(&p.compute_milli) {
                return Err(("placement.compute_milli", format!("{} is not in 1..=1000 (milli-GPU)", p.compute_milli)));
            }
            if p.base_bytes == 0 && p.delta_bytes == 0 {
                return Err(("placement.base_bytes", "a replica needs GPU memory for its weights (base_bytes and delta_bytes are 0)".into()));
            }
            // The names `<autoscaler>-od-N` must stay valid resource names.
            if self.name.len() > 240 {
                return Err(("name", format!("{:?} is longer than 240 characters, too long to name its replicas' placements", self.name)));
            }
        }
        Ok(())
    }

    pub fn variant_config(&self) -> VariantConfig {
        VariantConfig {
            capacity_rps: self.capacity_rps,
            cold_start_s: self.cold_start_s,
            min_replicas: self.min_replicas,
            max_replicas: self.max_replicas,
            criticality: self.criticality,
            backlog_drain_s: self.backlog_drain_s,
        }
    }

    pub fn spot_pool(&self) -> Option<Pool> {
        self.spot.map(|s| Pool { price_per_hour: s.price_per_hour, preemptions_per_hour: s.preemptions_per_hour })
    }
}

/// A committed replica target (the `scalingdecisions/<autoscaler>` resource).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub variant: String,
    pub policy: PolicyKind,
    pub replicas: u32,
    pub on_demand: u32,
    pub spot: u32,
    /// `stable`, `panic`, `forecast`, `undershoot`, `hold_scale_in` or `preemption`.
    pub reason: String,
    pub demand_rps: f64,
    #[serde(default)]
    pub forecast_rps: Option<f64>,
    /// This month's spend of the autoscaler up to `spent_at` (unix seconds); see `ledger`.
    #[serde(default)]
    pub spent_usd: f64,
    #[serde(default)]
    pub spent_at: f64,
}

impl DecisionRecord {
    /// Whether committing `self` over `old` changes what runs (the sizing inputs alone do not:
    /// they change every interval and would make every decision a Raft write).
    pub fn differs_from(&self, old: &DecisionRecord) -> bool {
        (self.replicas, self.on_demand, self.spot, self.policy) != (old.replicas, old.on_demand, old.spot, old.policy)
    }

    pub fn to_xds(&self, name: &str) -> weft_xds::resources::v1::ScalingDecision {
        weft_xds::resources::v1::ScalingDecision {
            name: name.into(),
            variant: self.variant.clone(),
            replicas: self.replicas,
            on_demand: self.on_demand,
            spot: self.spot,
            policy: self.policy.as_str().into(),
            reason: self.reason.clone(),
            demand_rps: self.demand_rps,
            forecast_rps: self.forecast_rps.unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn spec() -> AutoscalerSpec {
        serde_json::from_value(serde_json::json!({"variant": "a", "capacity_rps": 10.0})).unwrap()
    }

    #[test]
    fn defaults_are_filled_and_valid() {
        let s = spec();
        assert_eq!((s.policy, s.min_replicas, s.max_replicas, s.cold_start_s), (PolicyKind::Hybrid, 1, 100, 60.0));
        assert_eq!(s.validate(), Ok(()));
    }

    pub(crate) fn template(compute_milli: u32) -> ReplicaTemplate {
        ReplicaTemplate {
            base_model: "llama-8b".into(),
            base_bytes: 16 << 30,
            delta_bytes: 1 << 30,
            working_set_bytes: 4 << 30,
            compute_milli,
            cpu_milli: 1000,
            memory_mib: 4096,
            priority: 10,
            gpu_spec: vec![],
            launch: None,
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        type Case = (fn(&mut AutoscalerSpec), &'static str);
        let cases: [Case; 11] = [
            (|s| s.placement = Some(template(0)), "placement.compute_milli"),
            (
                |s| {
                    let launch = crate::launch::Launch { cluster: String::new(), ..crate::launch::tests::reference() };
                    s.placement = Some(ReplicaTemplate { launch: Some(launch), ..template(500) })
                },
                "placement.launch.cluster",
            ),
            (
                |s| s.placement = Some(ReplicaTemplate { base_model: "".into(), ..template(500) }),
                "placement.base_model",
            ),
            (|s| s.price_per_hour = f64::NAN, "price_per_hour"),
            (|s| s.budget = Some(BudgetSpec { name: "team".into(), monthly_usd: 0.0 }), "budget.monthly_usd"),
            (|s| s.capacity_rps = 0.0, "capacity_rps"),
            (|s| s.cold_start_s = 1e308, "cold_start_s"),
            (|s| s.min_replicas = 200, "min_replicas"),
            (|s| s.criticality = 1.5, "criticality"),
            (|s| s.variant = " ".into(), "variant"),
            (
                |s| s.spot = Some(SpotSpec { price_per_hour: 1.0, preemptions_per_hour: -1.0 }),
                "spot.preemptions_per_hour",
            ),
        ];
        for (break_it, field) in cases {
            let mut s = spec();
            break_it(&mut s);
            assert_eq!(s.validate().unwrap_err().0, field);
        }
    }

    #[test]
    fn only_what_runs_makes_a_new_decision() {
        let a = DecisionRecord {
            variant: "a".into(),
            policy: PolicyKind::Hybrid,
            replicas: 3,
            on_demand: 2,
            spot: 1,
            reason: "stable".into(),
            demand_rps: 20.0,
            forecast_rps: None,
            spent_usd: 0.0,
            spent_at: 0.0,
        };
        let resized = DecisionRecord { demand_rps: 21.0, reason: "forecast".into(), ..a.clone() };
        assert!(!resized.differs_from(&a));
        assert!(DecisionRecord { spot: 0, on_demand: 3, ..a.clone() }.differs_from(&a));
    }
}

//! The live autoscaler, as pure logic: what the leader's decision loop (`crate::scaling`) feeds
//! once per interval and what it gets back.
//!
//! - [`LoadMeter`] turns the sidecars' cumulative per-variant counters (as every control node
//!   keeps them for the sidecars connected to it) into per-variant [`VariantLoad`]s over the
//!   last interval. Counters are differenced per source, so a sidecar that moves to another
//!   control node, or a control node that restarts (its counters start again from 0), is
//!   never counted twice or negative.
//! - [`Controller`] keeps one policy per autoscaler (rebuilt when its spec changes), turns
//!   loads into [`DecisionRecord`]s, splits them between spot and on-demand, and applies
//!   preemption notices (critical replicas replaced on on-demand at once, held there until the
//!   replacements have had a cold start to come up).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::cost::{self, PoolPolicy, PoolSplit};
use super::hybrid::Hybrid;
use super::predictive::{Predictive, PredictiveConfig};
use super::reactive::{Kpa, KpaConfig};
use super::ledger;
use super::spec::{AutoscalerSpec, DecisionRecord, PolicyKind};
use super::{Decision, Policy, Reason, VariantLoad};

/// One source's cumulative counters for one variant, as a control node reports them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Counters {
    pub requests: u64,
    pub latency_ms_sum: f64,
    /// Gauges at the source's last report.
    pub in_flight: u32,
    pub queued: u32,
    /// Whether the sidecar is reporting now (a gone sidecar's gauges are stale).
    pub live: bool,
}

/// Differences cumulative counters between calls.
#[derive(Debug, Default)]
pub struct LoadMeter {
    last: HashMap<String, (u64, f64)>,
    last_at: Option<f64>,
}

impl LoadMeter {
    /// Per-variant load over the interval since the previous call, from `(source key, variant,
    /// counters)` (a source key names one sidecar at one control node). `None` on the first
    /// call: a rate needs two readings.
    pub fn observe<'a>(
        &mut self,
        now_s: f64,
        samples: impl IntoIterator<Item = (String, &'a str, Counters)>,
    ) -> Option<BTreeMap<String, VariantLoad>> {
        let mut requests: BTreeMap<String, (f64, f64, f64, f64)> = BTreeMap::new();
        let mut seen = HashMap::new();
        for (source, variant, c) in samples {
            let key = format!("{source}\u{0}{variant}");
            let (r0, l0) = self.last.get(&key).copied().unwrap_or((0, 0.0));
            // A counter below its last reading started again (its control node restarted).
            let (dr, dl) = if c.requests >= r0 {
                (c.requests - r0, (c.latency_ms_sum - l0).max(0.0))
            } else {
                (c.requests, c.latency_ms_sum)
            };
            let slot = requests.entry(variant.to_owned()).or_default();
            slot.0 += dr as f64;
            slot.1 += dl;
            if c.live {
                slot.2 += f64::from(c.in_flight);
                slot.3 += f64::from(c.queued);
            }
            seen.insert(key, (c.requests, c.latency_ms_sum));
        }
        // A source seen before but absent now (its control node did not answer) keeps its
        // last reading, so its next answer is not counted from 0.
        for (k, v) in seen {
            self.last.insert(k, v);
        }
        let first = self.last_at.is_none();
        let dt = now_s - self.last_at.unwrap_or(now_s);
        self.last_at = Some(now_s);
        if first || dt <= 0.0 {
            return None;
        }
        Some(
            requests
                .into_iter()
                .map(|(variant, (n, lat, in_flight, queued))| {
                    let load = VariantLoad {
                        request_rate: n / dt,
                        in_flight,
                        queue_depth: queued,
                        latency_s: if n > 0.0 { lat / n / 1000.0 } else { 0.0 },
                    };
                    (variant, load)
                })
                .collect(),
        )
    }
}

/// What one autoscaler decided at its last tick, for `GET /v1/autoscale/status`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    pub name: String,
    pub variant: String,
    pub policy: &'static str,
    /// Arrival rate plus backlog drain, requests/s.
    pub demand_rps: f64,
    pub request_rate: f64,
    pub in_flight: f64,
    pub queued: f64,
    pub latency_ms: f64,
    /// The forecast demand over the lead time (predictive and hybrid).
    pub forecast_rps: Option<f64>,
    /// Replicas serving now (healthy registered endpoints of the variant).
    pub ready: u32,
    pub decision: DecisionRecord,
    /// The policy's reason, in words.
    pub why: String,
    /// The budget this autoscaler spends from, as paced this tick.
    pub budget: Option<BudgetStatus>,
}

/// A budget as of one tick (shared by its autoscalers).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BudgetStatus {
    pub name: String,
    pub monthly_usd: f64,
    /// This month so far.
    pub spent_usd: f64,
    /// The pacer's projection for the month: so far, the next interval as paced, and the rest
    /// at the burn rate so far (or what the floors burn, if higher).
    pub projected_usd: f64,
    /// Some replicas were cut this tick.
    pub limited: bool,
    /// Even the floors (`min_replicas`) do not fit: the cap will be passed.
    pub over_cap: bool,
}

/// A record to commit for an autoscaler, with what it replaces.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub name: String,
    pub record: DecisionRecord,
}

struct State {
    spec: AutoscalerSpec,
    policy: Box<dyn Policy + Send>,
    /// On-demand replicas held after a preemption notice, until the given time.
    pinned: Option<(u32, f64)>,
}

/// One policy state per autoscaler.
#[derive(Default)]
pub struct Controller {
    states: BTreeMap<String, State>,
    pools: PoolPolicy,
    interval_s: f64,
}

fn build(spec: &AutoscalerSpec, interval_s: f64) -> Box<dyn Policy + Send> {
    let v = spec.variant_config();
    let predictive = || {
        let cfg = PredictiveConfig { decision_interval_s: interval_s, ..PredictiveConfig::default() };
        Predictive::new(cfg, v.clone())
    };
    match spec.policy {
        PolicyKind::Reactive => Box::new(Kpa::new(KpaConfig::default(), v.clone())),
        PolicyKind::Predictive => Box::new(predictive()),
        PolicyKind::Hybrid => Box::new(Hybrid { predictive: predictive(), reactive: Kpa::new(KpaConfig::default(), v.clone()) }),
    }
}

pub fn reason_str(r: Reason) -> &'static str {
    match r {
        Reason::Stable => "stable",
        Reason::Panic => "panic",
        Reason::Forecast => "forecast",
        Reason::Undershoot => "undershoot",
        Reason::HoldScaleIn => "hold_scale_in",
    }
}

fn why(r: Reason) -> &'static str {
    match r {
        Reason::Stable => "sized for the demand averaged over the 60 s stable window",
        Reason::Panic => "panic: the 6 s demand needs 2x the ready replicas; no scale-down while panicking",
        Reason::Forecast => "ahead of the forecast demand over the lead time (cold start + interval)",
        Reason::Undershoot => "the forecast undershot the observed demand; sized for the observed demand",
        Reason::HoldScaleIn => "scale-in held: the observed demand or the forecast still needs the replicas",
    }
}

impl Controller {
    /// Decisions every `interval_s` (the predictive lead time counts one interval).
    pub fn new(interval_s: f64) -> Self {
        Controller { states: BTreeMap::new(), pools: PoolPolicy::default(), interval_s }
    }

    /// Keeps a state per spec: new specs get a fresh policy, changed specs a rebuilt one, and
    /// the states of deleted autoscalers go.
    fn sync(&mut self, specs: &BTreeMap<String, AutoscalerSpec>) {
        self.states.retain(|name, s| specs.get(name) == Some(&s.spec));
        for (name, spec) in specs {
            self.states.entry(name.clone()).or_insert_with(|| State {
                spec: spec.clone(),
                policy: build(spec, self.interval_s),
                pinned: None,
            });
        }
    }

    fn split(&self, spec: &AutoscalerSpec, replicas: u32) -> PoolSplit {
        match spec.spot_pool() {
            Some(pool) => cost::split(replicas, spec.criticality, &pool, &self.pools),
            None => PoolSplit { on_demand: replicas, spot: 0 },
        }
    }

    /// One decision interval at `now_s`. `loads` by variant (a variant without load has none),
    /// `ready` replicas by variant (absent: unknown, the committed target is taken as ready),
    /// `committed` the stored records. Returns every autoscaler's status and the records that
    /// change what runs.
    #[allow(clippy::too_many_arguments)]
    pub fn tick(
        &mut self,
        now_s: f64,
        unix_s: f64,
        specs: &BTreeMap<String, AutoscalerSpec>,
        loads: &BTreeMap<String, VariantLoad>,
        ready: &BTreeMap<String, u32>,
        committed: &BTreeMap<String, DecisionRecord>,
    ) -> (Vec<Status>, Vec<Change>) {
        self.sync(specs);
        let mut statuses = Vec::new();
        let names: Vec<String> = self.states.keys().cloned().collect();
        for name in names {
            let spec = self.states[&name].spec.clone();
            let load = loads.get(&spec.variant).copied().unwrap_or_default();
            let old = committed.get(&name);
            let current = old.map_or(spec.min_replicas, |r| r.replicas);
            let ready_now = ready.get(&spec.variant).copied().unwrap_or(current);
            let state = self.states.get_mut(&name).expect("synced");
            let Decision { replicas, reason } = state.policy.decide(now_s, &load, ready_now, current);
            let replicas = spec.variant_config().clamp(replicas);
            let forecast_rps = state.policy.forecast_rps(now_s + spec.cold_start_s + self.interval_s);
            let pinned = match state.pinned {
                Some((n, until)) if now_s < until => n,
                _ => {
                    state.pinned = None;
                    0
                }
            };
            let mut split = self.split(&spec, replicas);
            if pinned > split.on_demand {
                split = PoolSplit { on_demand: pinned, spot: replicas.saturating_sub(pinned) };
            }
            let record = DecisionRecord {
                variant: spec.variant.clone(),
                policy: spec.policy,
                replicas: split.on_demand + split.spot,
                on_demand: split.on_demand,
                spot: split.spot,
                reason: reason_str(reason).into(),
                demand_rps: spec.variant_config().demand_rps(&load),
                forecast_rps,
                // The ledger up to now rides along (written only if what runs changes).
                spent_usd: old.map_or(0.0, |o| ledger::spent_now(&spec, o, unix_s)),
                spent_at: unix_s,
            };
            statuses.push(Status {
                name: name.clone(),
                variant: spec.variant.clone(),
                policy: spec.policy.as_str(),
                demand_rps: record.demand_rps,
                request_rate: load.request_rate,
                in_flight: load.in_flight,
                queued: load.queue_depth,
                latency_ms: load.latency_s * 1000.0,
                forecast_rps,
                ready: ready_now,
                decision: record,
                why: why(reason).into(),
                budget: None,
            });
        }
        self.pace(unix_s, &mut statuses);
        let changes = statuses
            .iter()
            .filter(|s| committed.get(&s.name).is_none_or(|o| s.decision.differs_from(o)))
            .map(|s| Change { name: s.name.clone(), record: s.decision.clone() })
            .collect();
        (statuses, changes)
    }

    /// Budget pacing: per budget, fits the decisions into what the month's cap allows for the
    /// next interval (see `cost::pace`), cutting the least critical variants first.
    fn pace(&self, unix_s: f64, statuses: &mut [Status]) {
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, s) in statuses.iter().enumerate() {
            if let Some(b) = self.states.get(&s.name).and_then(|st| st.spec.budget.as_ref()) {
                groups.entry(b.name.clone()).or_default().push(i);
            }
        }
        let (start, len) = ledger::month(unix_s);
        for (name, members) in groups {
            let specs: BTreeMap<usize, &AutoscalerSpec> = members.iter().map(|&i| (i, &self.states[&statuses[i].name].spec)).collect();
            let spec = |i: usize| specs[&i];
            let cap = members.iter().filter_map(|&i| spec(i).budget.as_ref()).map(|b| b.monthly_usd).fold(f64::INFINITY, f64::min);
            let spent: f64 = members.iter().map(|&i| statuses[i].decision.spent_usd).sum();
            let asks: Vec<cost::Ask> = members
                .iter()
                .map(|&i| {
                    let d = &statuses[i].decision;
                    let blended = if d.replicas == 0 { spec(i).price_per_hour } else { ledger::rate(spec(i), d.on_demand, d.spot) / f64::from(d.replicas) };
                    cost::Ask { wanted: d.replicas, floor: spec(i).min_replicas, criticality: spec(i).criticality, price_per_hour: blended }
                })
                .collect();
            let budget = cost::Budget { cap, period_s: len };
            let paced = cost::pace(&budget, spent, unix_s - start, self.interval_s, &asks);
            // The pacer's projection: spent, the next interval as paced, the rest of the month at
            // the burn so far (or the floors' burn, if higher).
            let per_s = |n: &dyn Fn(usize) -> u32| asks.iter().enumerate().map(|(k, a)| f64::from(n(k)) * a.price_per_hour).sum::<f64>() / 3600.0;
            let floor_per_s = per_s(&|k| asks[k].floor);
            let burn = if unix_s > start { (spent / (unix_s - start)).max(floor_per_s) } else { floor_per_s };
            let projected = spent + per_s(&|k| paced.replicas[k]) * self.interval_s + burn * (start + len - unix_s - self.interval_s).max(0.0);
            for (k, &i) in members.iter().enumerate() {
                let n = paced.replicas[k];
                if n < statuses[i].decision.replicas {
                    let split = self.split(spec(i), n);
                    let d = &mut statuses[i].decision;
                    (d.replicas, d.on_demand, d.spot) = (n, split.on_demand, split.spot);
                    d.reason = "budget".into();
                    statuses[i].why = format!("cut to {n} replicas by budget {name:?}: the month's projected spend would pass its ${cap:.0} cap");
                }
                statuses[i].budget = Some(BudgetStatus {
                    name: name.clone(),
                    monthly_usd: cap,
                    spent_usd: spent,
                    projected_usd: projected,
                    limited: paced.limited,
                    over_cap: paced.over_cap,
                });
            }
        }
    }

    /// A spot preemption notice at `now_s`: `lost` spot replicas of each autoscaler (by name)
    /// go within the notice. A critical variant gets them back on on-demand at once (held there
    /// for one cold start past the notice, so the next tick does not move them back to the pool
    /// that is being taken away); a best-effort one only loses them until its next decision.
    pub fn preempted(
        &mut self,
        now_s: f64,
        unix_s: f64,
        notice_s: f64,
        lost: &BTreeMap<String, u32>,
        committed: &BTreeMap<String, DecisionRecord>,
    ) -> Vec<(Change, u32)> {
        let mut out = Vec::new();
        for (name, &n) in lost {
            let (Some(state), Some(old)) = (self.states.get_mut(name), committed.get(name)) else { continue };
            let n = n.min(old.spot);
            if n == 0 {
                continue;
            }
            let replaced = cost::replacement(n, state.spec.criticality, &self.pools);
            let on_demand = old.on_demand + replaced;
            if replaced > 0 {
                state.pinned = Some((on_demand, now_s + notice_s + state.spec.cold_start_s));
            }
            let record = DecisionRecord {
                on_demand,
                spot: old.spot - n,
                replicas: on_demand + old.spot - n,
                reason: "preemption".into(),
                spent_usd: ledger::spent_now(&state.spec, old, unix_s),
                spent_at: unix_s,
                ..old.clone()
            };
            out.push((Change { name: name.clone(), record }, replaced));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::spec::SpotSpec;

    /// 2026-11-30T12:00:00Z.
    const T0: f64 = 1_796_040_000.0;

    fn counters(requests: u64, latency_ms_sum: f64, in_flight: u32) -> Counters {
        Counters { requests, latency_ms_sum, in_flight, queued: 0, live: true }
    }

    #[test]
    fn rates_are_differences_per_source_and_survive_moves_and_restarts() {
        let mut m = LoadMeter::default();
        assert_eq!(m.observe(0.0, [("n1/s1".to_string(), "a", counters(100, 1000.0, 2))]), None);
        // 10 s later: s1 did 50 more at node 1, s2 appeared at node 2 with 30.
        let l = m
            .observe(10.0, [("n1/s1".to_string(), "a", counters(150, 1500.0, 2)), ("n2/s2".to_string(), "a", counters(30, 300.0, 1))])
            .unwrap();
        assert_eq!(l["a"].request_rate, 8.0);
        assert_eq!(l["a"].in_flight, 3.0);
        assert!((l["a"].latency_s - 0.010).abs() < 1e-12);
        // Node 1 restarted (its counters start from 0) and node 2 did not answer this time.
        let l = m.observe(20.0, [("n1/s1".to_string(), "a", counters(20, 200.0, 0))]).unwrap();
        assert_eq!(l["a"].request_rate, 2.0, "a counter below its last reading starts again");
        let l = m.observe(30.0, [("n2/s2".to_string(), "a", counters(40, 400.0, 0))]).unwrap();
        assert_eq!(l["a"].request_rate, 1.0, "a source that missed a reading is not counted from 0");
    }

    #[test]
    fn gone_sidecars_gauges_do_not_count() {
        let mut m = LoadMeter::default();
        m.observe(0.0, [("n1/s1".to_string(), "a", counters(0, 0.0, 0))]);
        let stale = Counters { live: false, ..counters(0, 0.0, 50) };
        let l = m.observe(1.0, [("n1/s1".to_string(), "a", stale)]).unwrap();
        assert_eq!(l["a"].in_flight, 0.0);
    }

    fn spec(policy: PolicyKind) -> AutoscalerSpec {
        serde_json::from_value(serde_json::json!({
            "variant": "a", "capacity_rps": 10.0, "policy": policy, "min_replicas": 1, "max_replicas": 50,
            "spot": {"price_per_hour": 1.0, "preemptions_per_hour": 0.01}
        }))
        .unwrap()
    }

    fn load(rps: f64) -> BTreeMap<String, VariantLoad> {
        BTreeMap::from([("a".to_string(), VariantLoad { request_rate: rps, ..Default::default() })])
    }

    #[test]
    fn a_burst_scales_out_at_once_and_only_changes_are_committed() {
        let specs = BTreeMap::from([("chat-a".to_string(), spec(PolicyKind::Reactive))]);
        let mut c = Controller::new(10.0);
        let mut committed = BTreeMap::new();
        let (_, ch) = c.tick(0.0, T0 + 0.0, &specs, &load(5.0), &BTreeMap::new(), &committed);
        assert_eq!(ch.len(), 1, "the first decision is committed");
        committed.insert("chat-a".to_string(), ch[0].record.clone());
        let (_, ch) = c.tick(10.0, T0 + 10.0, &specs, &load(5.0), &BTreeMap::new(), &committed);
        assert!(ch.is_empty(), "the same target is not written again");
        // 100 rps against 1 ready replica of 10 rps: the KPA panics.
        let ready = BTreeMap::from([("a".to_string(), 1)]);
        let (st, ch) = c.tick(20.0, T0 + 20.0, &specs, &load(100.0), &ready, &committed);
        assert_eq!(st[0].decision.reason, "panic");
        assert!(ch[0].record.replicas >= 10, "{:?}", ch[0].record);
        let r = &ch[0].record;
        assert_eq!(r.on_demand + r.spot, r.replicas);
        assert!(r.on_demand >= r.replicas / 2, "a critical variant keeps a buffer on on-demand");
    }

    #[test]
    fn a_tight_budget_cuts_best_effort_first_and_the_ledger_rides_on_the_records() {
        let mk = |variant: &str, criticality: f64, min: u32| -> AutoscalerSpec {
            serde_json::from_value(serde_json::json!({"variant": variant, "capacity_rps": 10.0, "policy": "reactive",
                "min_replicas": min, "max_replicas": 50, "criticality": criticality, "price_per_hour": 2.0})).unwrap()
        };
        let mut specs = BTreeMap::from([("chat".to_string(), mk("a", 1.0, 2)), ("batch".to_string(), mk("b", 0.0, 1))]);
        let loads = BTreeMap::from([
            ("a".to_string(), VariantLoad { request_rate: 100.0, ..Default::default() }),
            ("b".to_string(), VariantLoad { request_rate: 100.0, ..Default::default() }),
        ]);
        let (start, len) = ledger::month(T0);
        // Each has run 2 replicas since an hour into the month (committed then, $0 so far).
        let ran = |name: &str| DecisionRecord {
            variant: specs[name].variant.clone(),
            policy: PolicyKind::Reactive,
            replicas: 2,
            on_demand: 2,
            spot: 0,
            reason: "stable".into(),
            demand_rps: 20.0,
            forecast_rps: None,
            spent_usd: 0.0,
            spent_at: start + 3600.0,
        };
        let committed = BTreeMap::from([("chat".to_string(), ran("chat")), ("batch".to_string(), ran("batch"))]);
        let mut free = Controller::new(10.0);
        let (st, _) = free.tick(0.0, T0, &specs, &loads, &BTreeMap::new(), &committed);
        let want = |st: &[Status], n: &str| st.iter().find(|s| s.name == n).unwrap().decision.clone();
        let (chat_wants, batch_wants) = (want(&st, "chat").replicas, want(&st, "batch").replicas);
        assert!(chat_wants > 2 && batch_wants > 2, "both want to grow: {chat_wants} {batch_wants}");
        let spent = want(&st, "chat").spent_usd + want(&st, "batch").spent_usd;
        assert!((spent - 2.0 * ledger::spent_now(&specs["chat"], &ran("chat"), T0)).abs() < 1e-9);
        assert!((spent - 2.0 * 2.0 * 2.0 * (T0 - start - 3600.0) / 3600.0).abs() < 1e-6, "2 replicas × $2/h each since then");
        // A cap that leaves room, beyond the projected burn, for chat's wish and batch's floor.
        let floor_per_s = (2.0 + 1.0) * 2.0 / 3600.0;
        let burn = (spent / (T0 - start)).max(floor_per_s);
        let cap = spent + burn * (start + len - T0 - 10.0) + f64::from(chat_wants + 1) * 2.0 * 10.0 / 3600.0 + 1e-7;
        for s in specs.values_mut() {
            s.budget = Some(crate::autoscaler::spec::BudgetSpec { name: "team".into(), monthly_usd: cap });
        }
        let mut c = Controller::new(10.0);
        let (st, ch) = c.tick(0.0, T0, &specs, &loads, &BTreeMap::new(), &committed);
        let (chat, batch) = (want(&st, "chat"), want(&st, "batch"));
        assert_eq!(chat.replicas, chat_wants, "the critical variant keeps what it needs");
        assert_eq!((batch.replicas, batch.reason.as_str()), (1, "budget"), "best effort is cut to its floor first");
        let b = st[0].budget.as_ref().unwrap();
        assert!(b.limited && !b.over_cap && b.projected_usd <= cap + 1e-6, "{b:?}");
        assert!(ch.iter().all(|c| c.record.spent_at == T0), "committed records carry the ledger to now");
        // A cap the floors alone pass: cut to the floors and say so.
        for s in specs.values_mut() {
            s.budget = Some(crate::autoscaler::spec::BudgetSpec { name: "team".into(), monthly_usd: spent });
        }
        let (st, _) = c.tick(10.0, T0 + 10.0, &specs, &loads, &BTreeMap::new(), &committed);
        assert_eq!((want(&st, "chat").replicas, want(&st, "batch").replicas), (2, 1));
        assert!(st[0].budget.as_ref().unwrap().over_cap);
    }

    #[test]
    fn a_changed_spec_gets_a_fresh_policy_and_bounds() {
        let mut specs = BTreeMap::from([("chat-a".to_string(), spec(PolicyKind::Hybrid))]);
        let mut c = Controller::new(10.0);
        c.tick(0.0, T0 + 0.0, &specs, &load(5.0), &BTreeMap::new(), &BTreeMap::new());
        specs.get_mut("chat-a").unwrap().min_replicas = 7;
        let (st, _) = c.tick(10.0, T0 + 10.0, &specs, &load(5.0), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(st[0].decision.replicas, 7);
        specs.clear();
        let (st, _) = c.tick(20.0, T0 + 20.0, &specs, &load(5.0), &BTreeMap::new(), &BTreeMap::new());
        assert!(st.is_empty());
    }

    #[test]
    fn preempted_spot_replicas_of_a_critical_variant_move_to_on_demand_and_stay() {
        let mut s = spec(PolicyKind::Reactive);
        s.spot = Some(SpotSpec { price_per_hour: 1.0, preemptions_per_hour: 0.01 });
        let specs = BTreeMap::from([("chat-a".to_string(), s.clone())]);
        let mut c = Controller::new(10.0);
        let l = load(55.0);
        let ready = BTreeMap::from([("a".to_string(), 8)]);
        let (_, ch) = c.tick(0.0, T0 + 0.0, &specs, &l, &ready, &BTreeMap::new());
        let mut committed = BTreeMap::from([("chat-a".to_string(), ch[0].record.clone())]);
        let before = ch[0].record.clone();
        assert!(before.spot >= 2, "{before:?}");
        let out = c.preempted(5.0, T0 + 5.0, 120.0, &BTreeMap::from([("chat-a".to_string(), 2)]), &committed);
        let (change, replaced) = &out[0];
        assert_eq!(*replaced, 2);
        assert_eq!(change.record.on_demand, before.on_demand + 2);
        assert_eq!(change.record.spot, before.spot - 2);
        assert_eq!(change.record.reason, "preemption");
        committed.insert("chat-a".to_string(), change.record.clone());
        // The next tick keeps the replacements on on-demand (the spot pool is being taken).
        let (st, _) = c.tick(10.0, T0 + 10.0, &specs, &l, &ready, &committed);
        assert!(st[0].decision.on_demand >= before.on_demand + 2, "{:?}", st[0].decision);

        // A best-effort variant is not replaced.
        let mut be = s;
        be.criticality = 0.0;
        let specs = BTreeMap::from([("batch".to_string(), be)]);
        let mut c = Controller::new(10.0);
        let (_, ch) = c.tick(0.0, T0 + 0.0, &specs, &l, &ready, &BTreeMap::new());
        let committed = BTreeMap::from([("batch".to_string(), ch[0].record.clone())]);
        let out = c.preempted(5.0, T0 + 5.0, 120.0, &BTreeMap::from([("batch".to_string(), 2)]), &committed);
        assert_eq!(out[0].1, 0);
        assert_eq!(out[0].0.record.replicas, ch[0].record.replicas - 2);
    }
}

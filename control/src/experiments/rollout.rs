//! A progressive rollout as a state machine, pure: the `Rollout` resource a user writes (which
//! experiment, which variant is the baseline and which the candidate, the weight steps and the
//! guardrails), the state the engine keeps through Raft (phase, step, counts, the sequential
//! tests and the last judgement — the evidence of each decision), and the transitions: feed the
//! load since the last reading, get back the candidate weight to set, if it changes.
//!
//! Phases: `warming_up` (the baseline's latency in the first `warmup_s` sets the latency
//! threshold; nothing is counted) → `running` (judged after every reading) → `promoted` or
//! `rolled_back`; `held` while the split does not match the weights (SRM); `paused` by an
//! operator. The first reading after a weight change only counts towards the totals, not the
//! new step (sidecars are still receiving the new weights, so the split is in flux).

use serde::{Deserialize, Serialize};
use weft_proxy::sketch::LogSketch;

use super::judge::{ArmCounts, Judgement, Rollout, Tests, Verdict, judge};
use super::sequential::Msprt;

/// What a user writes (`rollouts/<experiment name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// The experiment's name (the API fills it in from the URL).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub baseline: String,
    pub candidate: String,
    /// The candidate's weight (percent) at each step.
    #[serde(default = "default_steps")]
    pub steps: Vec<u32>,
    /// Candidate requests per step before the next one.
    #[serde(default = "default_min_per_step")]
    pub min_per_step: u64,
    #[serde(default = "default_warmup")]
    pub warmup_s: f64,
    /// Roll back when the candidate's error rate exceeds the baseline's by more than this.
    #[serde(default)]
    pub max_error_increase: f64,
    /// Roll back when its share of requests over the latency threshold exceeds the baseline's
    /// by more than this.
    #[serde(default)]
    pub max_slow_increase: f64,
    /// The latency threshold (ms); default: the baseline's p95 during warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_threshold_ms: Option<f64>,
    #[serde(default = "default_alpha")]
    pub alpha: f64,
}

fn default_steps() -> Vec<u32> {
    vec![1, 5, 25, 50, 100]
}
fn default_min_per_step() -> u64 {
    2_000
}
fn default_warmup() -> f64 {
    30.0
}
fn default_alpha() -> f64 {
    0.05
}

impl RolloutSpec {
    /// Checks every field; the error names the first one at fault.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.baseline.trim().is_empty() {
            return Err(("baseline", "must name a variant of the experiment".into()));
        }
        if self.candidate.trim().is_empty() || self.candidate == self.baseline {
            return Err(("candidate", "must name a variant of the experiment other than the baseline".into()));
        }
        if self.steps.is_empty() || self.steps.len() > 20 {
            return Err(("steps", "give 1 to 20 weights".into()));
        }
        for (i, w) in self.steps.iter().enumerate() {
            if !(1..=100).contains(w) || (i > 0 && *w <= self.steps[i - 1]) {
                return Err(("steps", format!("{:?}: each weight in 1..=100, increasing", self.steps)));
            }
        }
        if !(1..=1_000_000_000).contains(&self.min_per_step) {
            return Err(("min_per_step", format!("{} is not in 1..=1e9", self.min_per_step)));
        }
        if !(self.warmup_s.is_finite() && (0.0..=86_400.0).contains(&self.warmup_s)) {
            return Err(("warmup_s", format!("{} is not in 0..=86400", self.warmup_s)));
        }
        for (field, v) in [("max_error_increase", self.max_error_increase), ("max_slow_increase", self.max_slow_increase)] {
            if !(v.is_finite() && (0.0..1.0).contains(&v)) {
                return Err((field, format!("{v} is not a proportion in [0, 1)")));
            }
        }
        if let Some(t) = self.latency_threshold_ms
            && !(t.is_finite() && t > 0.0)
        {
            return Err(("latency_threshold_ms", format!("{t} must be above 0")));
        }
        if !(self.alpha > 0.0 && self.alpha <= 0.5) {
            return Err(("alpha", format!("{} is not in (0, 0.5]", self.alpha)));
        }
        Ok(())
    }

    pub fn rollout(&self) -> Rollout {
        Rollout {
            steps: self.steps.clone(),
            min_per_step: self.min_per_step,
            max_error_increase: self.max_error_increase,
            max_slow_increase: self.max_slow_increase,
            errors_test: Msprt::new(self.alpha, 0.01),
            slow_test: Msprt::new(self.alpha, 0.02),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    WarmingUp,
    Running,
    Held,
    Paused,
    Promoted,
    RolledBack,
}

impl Phase {
    pub fn finished(self) -> bool {
        matches!(self, Phase::Promoted | Phase::RolledBack)
    }
}

/// The engine's state of one rollout (`rolloutstates/<name>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutState {
    pub phase: Phase,
    pub step: usize,
    /// The candidate's weight now (percent).
    pub weight: u32,
    pub started_ms: u64,
    pub step_started_ms: u64,
    pub threshold_ms: Option<f64>,
    /// The baseline's latencies during warm-up.
    pub warm: LogSketch,
    pub total_baseline: ArmCounts,
    pub total_candidate: ArmCounts,
    pub step_baseline: ArmCounts,
    pub step_candidate: ArmCounts,
    pub tests: Tests,
    /// The first reading after a weight change does not count towards the step.
    pub settling: bool,
    pub last: Option<Judgement>,
    /// Why the phase or weight last changed, in words.
    pub reason: String,
}

/// One arm's load since the last reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArmDelta {
    pub requests: u64,
    pub errors: u64,
    pub latency: LogSketch,
}

/// An operator's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Promote,
    Rollback,
    Pause,
    Resume,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        match s {
            "promote" => Some(Command::Promote),
            "rollback" => Some(Command::Rollback),
            "pause" => Some(Command::Pause),
            "resume" => Some(Command::Resume),
            _ => None,
        }
    }
}

fn pct(x: f64) -> String {
    format!("{:+.2} points", x * 100.0)
}

impl RolloutState {
    /// A new rollout at `now_ms`: the candidate goes to the first step's weight.
    pub fn start(spec: &RolloutSpec, now_ms: u64) -> RolloutState {
        let r = spec.rollout();
        RolloutState {
            phase: Phase::WarmingUp,
            step: 0,
            weight: spec.steps[0],
            started_ms: now_ms,
            step_started_ms: now_ms,
            threshold_ms: spec.latency_threshold_ms,
            warm: LogSketch::new(),
            total_baseline: ArmCounts::default(),
            total_candidate: ArmCounts::default(),
            step_baseline: ArmCounts::default(),
            step_candidate: ArmCounts::default(),
            tests: Tests::new(&r),
            settling: true,
            last: None,
            reason: format!("started: candidate {} at {}%", spec.candidate, spec.steps[0]),
        }
    }

    fn set_weight(&mut self, weight: u32, now_ms: u64) -> Option<u32> {
        self.weight = weight;
        self.step_started_ms = now_ms;
        self.step_baseline = ArmCounts::default();
        self.step_candidate = ArmCounts::default();
        self.settling = true;
        Some(weight)
    }

    /// Feeds the load since the last reading; returns the candidate weight to set, if it
    /// changes.
    pub fn advance(&mut self, spec: &RolloutSpec, now_ms: u64, base: &ArmDelta, cand: &ArmDelta) -> Option<u32> {
        match self.phase {
            Phase::Paused | Phase::Promoted | Phase::RolledBack => return None,
            Phase::WarmingUp => {
                self.warm.merge(&base.latency);
                let done = now_ms.saturating_sub(self.started_ms) as f64 >= spec.warmup_s * 1000.0;
                if done {
                    if self.threshold_ms.is_none() {
                        self.threshold_ms = self.warm.quantile(0.95);
                    }
                    if let Some(t) = self.threshold_ms {
                        self.phase = Phase::Running;
                        self.settling = false;
                        self.reason = format!("warm-up over: latency threshold {t:.1} ms (baseline p95)");
                    }
                }
                return None;
            }
            Phase::Running | Phase::Held => {}
        }
        let threshold = self.threshold_ms.unwrap_or(f64::INFINITY);
        let arm = |d: &ArmDelta| ArmCounts { n: d.requests, errors: d.errors, slow: d.latency.count_above(threshold) };
        let (b, c) = (arm(base), arm(cand));
        let add = |into: &mut ArmCounts, x: ArmCounts| {
            into.n += x.n;
            into.errors += x.errors;
            into.slow += x.slow;
        };
        add(&mut self.total_baseline, b);
        add(&mut self.total_candidate, c);
        if self.settling {
            self.settling = false;
        } else {
            add(&mut self.step_baseline, b);
            add(&mut self.step_candidate, c);
        }
        let r = spec.rollout();
        let j = judge(
            &r,
            &mut self.tests,
            self.step,
            self.total_baseline,
            self.total_candidate,
            self.step_baseline,
            self.step_candidate,
        );
        let verdict = j.verdict.clone();
        let evidence = format!(
            "errors {} [{}, {}], p {:.2e}; slow share {} [{}, {}], p {:.2e}; SRM p {:.2e}",
            pct(j.errors.diff),
            pct(j.errors.lo),
            pct(j.errors.hi),
            j.error_p,
            pct(j.slow.diff),
            pct(j.slow.lo),
            pct(j.slow.hi),
            j.slow_p,
            j.srm_p
        );
        self.last = Some(j);
        match verdict {
            Verdict::Continue => {
                self.phase = Phase::Running;
                None
            }
            Verdict::Hold => {
                if self.phase != Phase::Held {
                    self.reason = format!("held: the split does not match the weights ({evidence})");
                }
                self.phase = Phase::Held;
                None
            }
            Verdict::StepUp { weight } => {
                self.phase = Phase::Running;
                self.step += 1;
                self.reason = format!("step {} passed: candidate to {weight}% ({evidence})", self.step);
                self.set_weight(weight, now_ms)
            }
            Verdict::Promote => {
                self.phase = Phase::Promoted;
                self.reason = format!("promoted: every step passed ({evidence})");
                self.set_weight(100, now_ms)
            }
            Verdict::Rollback { guardrail } => {
                self.phase = Phase::RolledBack;
                self.reason = format!("rolled back: the {guardrail} guardrail failed with confidence ({evidence})");
                self.set_weight(0, now_ms)
            }
        }
    }

    /// An operator's command; returns the candidate weight to set, if it changes.
    pub fn command(&mut self, cmd: Command, now_ms: u64) -> Result<Option<u32>, String> {
        let finished = self.phase.finished();
        match cmd {
            Command::Promote if self.phase == Phase::Promoted => Err("already promoted".into()),
            Command::Rollback if self.phase == Phase::RolledBack => Err("already rolled back".into()),
            Command::Promote => {
                self.phase = Phase::Promoted;
                self.reason = "promoted by an operator".into();
                Ok(self.set_weight(100, now_ms))
            }
            Command::Rollback => {
                self.phase = Phase::RolledBack;
                self.reason = "rolled back by an operator".into();
                Ok(self.set_weight(0, now_ms))
            }
            Command::Pause if finished => Err(format!("the rollout is {:?}; nothing to pause", self.phase)),
            Command::Pause if self.phase == Phase::Paused => Err("already paused".into()),
            Command::Pause => {
                self.phase = Phase::Paused;
                self.reason = format!("paused by an operator at {}%", self.weight);
                Ok(None)
            }
            Command::Resume if self.phase != Phase::Paused => Err(format!("the rollout is {:?}, not paused", self.phase)),
            Command::Resume => {
                self.phase = if self.threshold_ms.is_some() { Phase::Running } else { Phase::WarmingUp };
                self.reason = "resumed by an operator".into();
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RolloutSpec {
        serde_json::from_value(serde_json::json!({"baseline": "a", "candidate": "b", "steps": [10, 50, 100],
            "min_per_step": 1000, "warmup_s": 1.0})).unwrap()
    }

    fn delta(n: u64, err_rate: f64, ms: f64) -> ArmDelta {
        let mut latency = LogSketch::new();
        for i in 0..n {
            latency.add(ms * (1.0 + (i % 10) as f64 / 10.0));
        }
        ArmDelta { requests: n, errors: (n as f64 * err_rate).round() as u64, latency }
    }

    /// Feeds readings every second at the state's current weight (1,000 requests per second
    /// in all); returns the weights set, in order.
    fn drive(s: &mut RolloutState, spec: &RolloutSpec, seconds: u64, cand_err: f64) -> Vec<u32> {
        let mut set = Vec::new();
        for t in 1..=seconds {
            let w = u64::from(s.weight);
            let (nb, nc) = (1000 * (100 - w) / 100, 1000 * w / 100);
            if let Some(w) = s.advance(spec, t * 1000, &delta(nb, 0.01, 50.0), &delta(nc, cand_err, 50.0)) {
                set.push(w);
            }
            if s.phase.finished() {
                break;
            }
        }
        set
    }

    #[test]
    fn a_healthy_candidate_is_promoted_step_by_step() {
        let spec = spec();
        let mut s = RolloutState::start(&spec, 0);
        assert_eq!((s.phase, s.weight), (Phase::WarmingUp, 10));
        let set = drive(&mut s, &spec, 200, 0.01);
        assert_eq!(set, vec![50, 100, 100]);
        assert_eq!(s.phase, Phase::Promoted);
        assert!(s.reason.starts_with("promoted"), "{}", s.reason);
        assert!(s.threshold_ms.unwrap() > 50.0);
    }

    #[test]
    fn a_candidate_with_more_errors_is_rolled_back() {
        let spec = spec();
        let mut s = RolloutState::start(&spec, 0);
        let set = drive(&mut s, &spec, 400, 0.03);
        assert_eq!(set.last(), Some(&0));
        assert_eq!(s.phase, Phase::RolledBack);
        assert!(s.reason.contains("error_rate"), "{}", s.reason);
        let state: RolloutState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        // The state round-trips through its stored JSON (floats to within their printing).
        assert_eq!((state.phase, state.weight, &state.reason, state.total_candidate), (s.phase, s.weight, &s.reason, s.total_candidate));
    }

    #[test]
    fn operator_commands() {
        let spec = spec();
        let mut s = RolloutState::start(&spec, 0);
        assert_eq!(s.command(Command::Pause, 5), Ok(None));
        assert_eq!(s.advance(&spec, 10_000, &delta(100, 0.5, 50.0), &delta(100, 0.5, 50.0)), None, "paused: nothing moves");
        assert!(s.command(Command::Pause, 6).is_err());
        assert_eq!(s.command(Command::Resume, 7), Ok(None));
        assert_eq!(s.command(Command::Rollback, 8), Ok(Some(0)));
        assert!(s.command(Command::Rollback, 9).is_err());
        assert_eq!(s.command(Command::Promote, 10), Ok(Some(100)));
    }

    #[test]
    fn bad_specs_name_the_field() {
        for (patch, field) in [
            (serde_json::json!({"candidate": "a"}), "candidate"),
            (serde_json::json!({"steps": [50, 10]}), "steps"),
            (serde_json::json!({"steps": [0, 100]}), "steps"),
            (serde_json::json!({"alpha": 0.9}), "alpha"),
            (serde_json::json!({"max_error_increase": 1.5}), "max_error_increase"),
            (serde_json::json!({"latency_threshold_ms": -1.0}), "latency_threshold_ms"),
        ] {
            let mut v = serde_json::to_value(spec()).unwrap();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            let s: RolloutSpec = serde_json::from_value(v).unwrap();
            assert_eq!(s.validate().unwrap_err().0, field);
        }
        assert_eq!(spec().validate(), Ok(()));
    }
}

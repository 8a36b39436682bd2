//! The verdict on a progressive rollout of a candidate variant against its baseline, as pure
//! logic: given the counts since the rollout began (warm-up excluded) and the counts of the
//! current step, say whether to continue, step the candidate's weight up, promote it, roll it
//! back (a guardrail failed with confidence), or hold (the split itself is broken).
//!
//! Guardrails are non-inferiority margins on always-valid confidence sequences
//! ([`super::sequential`]): a guardrail fails when the lower bound of (candidate − baseline)
//! passes its limit, so a rollback is a statement with confidence 1 − α however often the
//! engine looks. A step is passed after enough candidate requests at that weight with no
//! guardrail failing; the sample-ratio check runs on the current step (its weights).

use serde::{Deserialize, Serialize};

use super::sequential::{Counts, Monitor, Msprt, Reading};
use super::stats::{Srm, srm_weighted};

/// One arm's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmCounts {
    pub n: u64,
    pub errors: u64,
    /// Requests slower than the latency threshold (the baseline's p95 in warm-up, or set).
    pub slow: u64,
}

impl ArmCounts {
    fn errors(&self) -> Counts {
        Counts { n: self.n, events: self.errors }
    }
    fn slow(&self) -> Counts {
        Counts { n: self.n, events: self.slow }
    }
}

/// How a rollout proceeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rollout {
    /// The candidate's weight (percent) at each step; the last is usually 100.
    pub steps: Vec<u32>,
    /// Candidate requests a step needs (after warm-up) before the next.
    pub min_per_step: u64,
    /// Error-rate guardrail: roll back when the candidate's error rate is above the
    /// baseline's by more than this (0 = any increase), with confidence.
    pub max_error_increase: f64,
    /// Latency guardrail: the same on the share of requests over the latency threshold.
    pub max_slow_increase: f64,
    pub errors_test: Msprt,
    pub slow_test: Msprt,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            steps: vec![1, 5, 25, 50, 100],
            min_per_step: 2_000,
            max_error_increase: 0.0,
            max_slow_increase: 0.0,
            errors_test: Msprt::new(0.05, 0.01),
            slow_test: Msprt::new(0.05, 0.02),
        }
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Verdict {
    /// Keep collecting at this step.
    Continue,
    /// Move the candidate to `weight` percent.
    StepUp { weight: u32 },
    /// The last step passed: the candidate takes all traffic.
    Promote,
    /// A guardrail failed with confidence: the candidate goes back to 0%.
    Rollback { guardrail: String },
    /// The traffic split does not match the weights (SRM): no decision is trusted.
    Hold,
}

/// The verdict and everything it rests on (stored with each step as its evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub step: usize,
    pub weight: u32,
    pub baseline: ArmCounts,
    pub candidate: ArmCounts,
    pub errors: Reading,
    pub slow: Reading,
    pub error_p: f64,
    pub slow_p: f64,
    pub srm_p: f64,
    /// 1 − the always-valid p-value of the error difference (how sure it is not chance).
    pub confidence: f64,
}

/// The running state of one rollout's tests (kept by the engine between readings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tests {
    pub errors: Monitor,
    pub slow: Monitor,
}

impl Tests {
    pub fn new(r: &Rollout) -> Self {
        Tests { errors: Monitor::new(r.errors_test), slow: Monitor::new(r.slow_test) }
    }
}

/// Judges the rollout at `step` (index into `r.steps`). `total_*` are the counts since the
/// rollout began (warm-up excluded), `step_*` those since the current step began.
pub fn judge(
    r: &Rollout,
    tests: &mut Tests,
    step: usize,
    total_base: ArmCounts,
    total_cand: ArmCounts,
    step_base: ArmCounts,
    step_cand: ArmCounts,
) -> Judgement {
    let weight = r.steps.get(step).copied().unwrap_or(100);
    let errors = tests.errors.update(total_base.errors(), total_cand.errors());
    let slow = tests.slow.update(total_base.slow(), total_cand.slow());
    let srm: Srm = if weight >= 100 {
        Srm { chi2: 0.0, p: 1.0, ok: true }
    } else {
        srm_weighted(&[step_base.n, step_cand.n], &[f64::from(100 - weight), f64::from(weight)])
    };
    let verdict = if !srm.ok {
        Verdict::Hold
    } else if tests.errors.p <= r.errors_test.alpha && tests.errors.lo > r.max_error_increase {
        Verdict::Rollback { guardrail: "error_rate".into() }
    } else if tests.slow.p <= r.slow_test.alpha && tests.slow.lo > r.max_slow_increase {
        Verdict::Rollback { guardrail: "latency".into() }
    } else if step_cand.n < r.min_per_step {
        Verdict::Continue
    } else if step + 1 < r.steps.len() {
        Verdict::StepUp { weight: r.steps[step + 1] }
    } else {
        Verdict::Promote
    };
    Judgement {
        verdict,
        step,
        weight,
        baseline: total_base,
        candidate: total_cand,
        errors,
        slow,
        error_p: tests.errors.p,
        slow_p: tests.slow.p,
        srm_p: srm.p,
        confidence: 1.0 - tests.errors.p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(n: u64, err_rate: f64, slow_rate: f64) -> ArmCounts {
        ArmCounts { n, errors: (n as f64 * err_rate) as u64, slow: (n as f64 * slow_rate) as u64 }
    }

    #[test]
    fn a_healthy_candidate_steps_up_then_is_promoted() {
        let r = Rollout::default();
        let mut t = Tests::new(&r);
        // Step 0 (1%): not enough candidate requests yet.
        let j = judge(&r, &mut t, 0, arm(99_000, 0.02, 0.05), arm(1_000, 0.02, 0.05), arm(99_000, 0.02, 0.05), arm(1_000, 0.02, 0.05));
        assert_eq!(j.verdict, Verdict::Continue);
        let j = judge(&r, &mut t, 0, arm(198_000, 0.02, 0.05), arm(2_000, 0.02, 0.05), arm(198_000, 0.02, 0.05), arm(2_000, 0.02, 0.05));
        assert_eq!(j.verdict, Verdict::StepUp { weight: 5 });
        let j = judge(&r, &mut t, 4, arm(300_000, 0.02, 0.05), arm(100_000, 0.02, 0.05), arm(0, 0.0, 0.0), arm(5_000, 0.02, 0.05));
        assert_eq!(j.verdict, Verdict::Promote);
    }

    #[test]
    fn more_errors_roll_back_with_confidence() {
        let r = Rollout::default();
        let mut t = Tests::new(&r);
        let j = judge(&r, &mut t, 2, arm(30_000, 0.01, 0.05), arm(10_000, 0.03, 0.05), arm(3_000, 0.01, 0.05), arm(1_000, 0.03, 0.05));
        assert_eq!(j.verdict, Verdict::Rollback { guardrail: "error_rate".into() });
        assert!(j.confidence > 0.95 && j.errors.lo > 0.0, "{j:?}");
    }

    #[test]
    fn slower_responses_roll_back_on_the_latency_guardrail() {
        let r = Rollout::default();
        let mut t = Tests::new(&r);
        let j = judge(&r, &mut t, 2, arm(30_000, 0.01, 0.05), arm(10_000, 0.01, 0.10), arm(3_000, 0.01, 0.05), arm(1_000, 0.01, 0.10));
        assert_eq!(j.verdict, Verdict::Rollback { guardrail: "latency".into() });
    }

    #[test]
    fn a_broken_split_holds_everything() {
        let r = Rollout::default();
        let mut t = Tests::new(&r);
        // 25% asked, 20% delivered.
        let j = judge(&r, &mut t, 2, arm(80_000, 0.01, 0.05), arm(20_000, 0.01, 0.05), arm(80_000, 0.01, 0.05), arm(20_000, 0.01, 0.05));
        assert_eq!(j.verdict, Verdict::Hold);
        assert!(j.srm_p < 0.001);
    }

    #[test]
    fn an_error_increase_within_the_margin_is_tolerated() {
        let r = Rollout { max_error_increase: 0.02, ..Rollout::default() };
        let mut t = Tests::new(&r);
        let j = judge(&r, &mut t, 2, arm(30_000, 0.01, 0.05), arm(10_000, 0.015, 0.05), arm(3_000, 0.01, 0.05), arm(2_500, 0.015, 0.05));
        assert_ne!(j.verdict, Verdict::Rollback { guardrail: "error_rate".into() });
    }
}

//! The A/B report's statistics, pure: percentiles with distribution-free confidence intervals,
//! Wilson intervals for error rates, a sample-ratio-mismatch (SRM) chi-square test against the
//! configured 50/50 split, a stickiness check, and the comparison of the two variants (Mann-Whitney U on latency,
//! a two-proportion z-test on errors) that says which one is better and with what confidence.
//!
//! "Confidence" is 1 − the one-sided p-value in the observed direction: how sure the data makes
//! us that the better-looking variant is not better by chance alone.

/// One measured request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since traffic started (warm-up is judged by it).
    pub at_s: f64,
    /// The assignment unit the request was sent for (the demo's user id).
    pub unit: u64,
    pub latency_ms: f64,
    pub ok: bool,
}

use std::collections::HashSet;

pub use crate::experiments::stats::*;

/// A percentile with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pct {
    pub q: f64,
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

/// One variant's numbers (after warm-up).
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    pub name: String,
    pub requests: u64,
    /// Distinct units (users) among its requests: what the split assigns, so what the SRM
    /// test counts.
    pub units: u64,
    pub errors: u64,
    pub error_ci: (f64, f64),
    /// p50, p95, p99 of successful requests' latency.
    pub latency: [Pct; 3],
    /// Latencies of successful requests, sorted (for charts).
    pub sorted_ms: Vec<f64>,
}

impl Arm {
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 { 0.0 } else { self.errors as f64 / self.requests as f64 }
    }
}

/// Which variant looks better on one metric, and how sure we are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lean {
    /// Index of the better-looking variant (0 = a, 1 = b).
    pub better: usize,
    /// 1 − one-sided p in that direction.
    pub confidence: f64,
}

/// Below this confidence a difference is reported as "no clear difference".
pub const DECIDE_AT: f64 = 0.95;

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub experiment: String,
    pub warmup_s: f64,
    pub excluded: u64,
    pub arms: [Arm; 2],
    /// Chi-square of the arms' unit counts against 50/50. Units, not requests: the split
    /// assigns units, and one unit's requests are not independent draws (a heavy user moves
    /// the request shares without anything being wrong with the split).
    pub srm: Srm,
    /// Units seen in both arms: a sticky split has none.
    pub units_in_both: u64,
    pub latency: MannWhitney,
    pub errors: Proportions,
    pub latency_lean: Lean,
    pub errors_lean: Lean,
    /// One line: which variant is better and with what confidence, or why none is.
    pub verdict: String,
}

/// `units`: the distinct units among `samples` (analyze counts them once for the SRM test and
/// the stickiness check both).
fn arm(name: &str, samples: &[Sample], units: &HashSet<u64>) -> Arm {
    let mut sorted: Vec<f64> = samples.iter().filter(|s| s.ok).map(|s| s.latency_ms).collect();
    sorted.sort_by(f64::total_cmp);
    let requests = samples.len() as u64;
    let errors = samples.iter().filter(|s| !s.ok).count() as u64;
    let pct = |q: f64| {
        if sorted.is_empty() {
            return Pct { q, value: f64::NAN, lo: f64::NAN, hi: f64::NAN };
        }
        let (lo, hi) = quantile_ci(sorted.len(), q, Z95);
        Pct { q, value: quantile(&sorted, q), lo: sorted[lo], hi: sorted[hi] }
    };
    Arm {
        name: name.to_string(),
        requests,
        units: units.len() as u64,
        errors,
        error_ci: wilson(errors, requests, Z95),
        latency: [pct(0.50), pct(0.95), pct(0.99)],
        sorted_ms: sorted,
    }
}

/// A p-value for people: tiny ones are not shown as 0.
pub fn fmt_p(p: f64) -> String {
    if p < 1e-4 { "< 0.0001".into() } else { format!("{p:.4}") }
}

/// Confidence in percent, never shown as a flat 100%.
pub fn pct_confidence(c: f64) -> String {
    if c > 0.9999 { "> 99.99%".into() } else { format!("{:.2}%", 100.0 * c) }
}

/// Builds the report from every measured request of each variant, leaving out those that
/// started before `warmup_s`.
pub fn analyze(experiment: &str, names: [&str; 2], a: &[Sample], b: &[Sample], warmup_s: f64) -> Report {
    let keep = |s: &[Sample]| s.iter().copied().filter(|s| s.at_s >= warmup_s).collect::<Vec<_>>();
    let (ka, kb) = (keep(a), keep(b));
    let excluded = (a.len() + b.len() - ka.len() - kb.len()) as u64;
    let units = |s: &[Sample]| s.iter().map(|s| s.unit).collect::<HashSet<u64>>();
    let (ua, ub) = (units(&ka), units(&kb));
    let arms = [arm(names[0], &ka, &ua), arm(names[1], &kb, &ub)];
    let srm = srm(arms[0].units, arms[1].units);
    let units_in_both = ua.intersection(&ub).count() as u64;
    let latency = mann_whitney(&arms[0].sorted_ms, &arms[1].sorted_ms);
    let errors = two_proportions(arms[0].errors, arms[0].requests, arms[1].errors, arms[1].requests);
    // The Mann-Whitney z is positive when a is slower; the proportions' z when b errs more.
    let lean = |a_better: bool, z: f64| Lean { better: if a_better { 0 } else { 1 }, confidence: normal_cdf(z.abs()) };
    let (latency_lean, errors_lean) = (lean(latency.z <= 0.0, latency.z), lean(errors.z >= 0.0, errors.z));
    let verdict = verdict(&arms, &srm, latency_lean, errors_lean);
    Report {
        experiment: experiment.to_string(),
        warmup_s,
        excluded,
        arms,
        srm,
        units_in_both,
        latency,
        errors,
        latency_lean,
        errors_lean,
        verdict,
    }
}

fn verdict(arms: &[Arm; 2], srm: &Srm, lat: Lean, err: Lean) -> String {
    if arms.iter().any(|a| a.requests == 0) {
        return "no verdict: a variant got no requests".into();
    }
    if !srm.ok {
        return format!(
            "no verdict: sample ratio mismatch (p = {:.2e} < {SRM_ALPHA}); the split is broken, fix it before comparing",
            srm.p
        );
    }
    let name = |i: usize| &arms[i].name;
    let (lat_sure, err_sure) = (lat.confidence >= DECIDE_AT, err.confidence >= DECIDE_AT);
    match (lat_sure, err_sure) {
        (true, true) if lat.better == err.better => format!(
            "variant {} is better: faster (confidence {}) and fewer errors (confidence {})",
            name(lat.better),
            pct_confidence(lat.confidence),
            pct_confidence(err.confidence)
        ),
        (true, true) => format!(
            "a trade-off: variant {} is faster (confidence {}), variant {} has fewer errors (confidence {})",
            name(lat.better),
            pct_confidence(lat.confidence),
            name(err.better),
            pct_confidence(err.confidence)
        ),
        (true, false) => format!(
            "variant {} is better: faster (confidence {}); error rates show no clear difference",
            name(lat.better),
            pct_confidence(lat.confidence)
        ),
        (false, true) => format!(
            "variant {} is better: fewer errors (confidence {}); latencies show no clear difference",
            name(err.better),
            pct_confidence(err.confidence)
        ),
        (false, false) => format!(
            "no clear winner: neither latency nor errors differ with {:.0}% confidence (run longer for more data)",
            100.0 * DECIDE_AT
        ),
    }
}

/// "users a 4,102 (50.1%) / b 4,085 (49.9%) (requests a 50.2% / b 49.8%)": the units the SRM
/// test counts, then the request shares for context.
pub fn split_text(r: &Report) -> String {
    let share = |n: [u64; 2], i: usize| {
        let total = n[0] + n[1];
        if total == 0 { 0.0 } else { 100.0 * n[i] as f64 / total as f64 }
    };
    let units = [r.arms[0].units, r.arms[1].units];
    let requests = [r.arms[0].requests, r.arms[1].requests];
    let (a, b) = (&r.arms[0].name, &r.arms[1].name);
    format!(
        "users {a} {} ({:.1}%) / {b} {} ({:.1}%) (requests {a} {:.1}% / {b} {:.1}%)",
        fmt_n(units[0]),
        share(units, 0),
        fmt_n(units[1]),
        share(units, 1),
        share(requests, 0),
        share(requests, 1)
    )
}

/// Whether every user stayed on one variant, in words.
pub fn stickiness_text(r: &Report) -> String {
    let users = r.arms[0].units + r.arms[1].units - r.units_in_both;
    if r.units_in_both == 0 {
        format!("each of the {} users saw one variant only", fmt_n(users))
    } else {
        format!("{} of {} users saw both variants: the split is not sticky", fmt_n(r.units_in_both), fmt_n(users))
    }
}

fn fmt_n(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "= 0.0123" or "< 0.0001".
fn p_eq(p: f64) -> String {
    let s = fmt_p(p);
    if s.starts_with('<') { s } else { format!("= {s}") }
}

/// The report as terminal text.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let total: u64 = r.arms.iter().map(|a| a.requests).sum();
    s += &format!(
        "== A/B report: experiment {} ({} requests measured; {} in the first {:.0} s of warm-up excluded) ==\n\n",
        r.experiment,
        fmt_n(total),
        fmt_n(r.excluded),
        r.warmup_s
    );
    s += &format!(
        "{:<8} {:>9} {:>7}  {:<24} {:<22} {:<22} {:<22}\n",
        "variant", "requests", "errors", "error rate [95% CI]", "p50 ms [95% CI]", "p95 ms [95% CI]", "p99 ms [95% CI]"
    );
    for a in &r.arms {
        let er = format!("{:.2}% [{:.2}, {:.2}]", 100.0 * a.error_rate(), 100.0 * a.error_ci.0, 100.0 * a.error_ci.1);
        let p = |p: &Pct| format!("{:.1} [{:.1}, {:.1}]", p.value, p.lo, p.hi);
        s += &format!(
            "{:<8} {:>9} {:>7}  {:<24} {:<22} {:<22} {:<22}\n",
            a.name,
            fmt_n(a.requests),
            fmt_n(a.errors),
            er,
            p(&a.latency[0]),
            p(&a.latency[1]),
            p(&a.latency[2])
        );
    }
    s += "(latency of successful requests, as seen by the client through the sidecars)\n\n";
    s += &format!(
        "sample ratio (expected 50/50): {}; chi² = {:.2}, p = {:.3} → {}\n",
        split_text(r),
        r.srm.chi2,
        r.srm.p,
        if r.srm.ok { "ok" } else { "MISMATCH: the split is broken, do not trust the comparison" }
    );
    s += &format!("stickiness: {}\n", stickiness_text(r));
    let (a, b) = (&r.arms[0].name, &r.arms[1].name);
    let lat_better = &r.arms[r.latency_lean.better].name;
    s += &format!(
        "latency:    {lat_better} faster; P({a} faster than {b}) = {:.3}, Mann-Whitney z = {:.2}, p {}, confidence {}\n",
        r.latency.prob_a_faster,
        r.latency.z,
        p_eq(r.latency.p_two_sided),
        pct_confidence(r.latency_lean.confidence)
    );
    let err_better = &r.arms[r.errors_lean.better].name;
    s += &format!(
        "error rate: {err_better} lower; {a} {:.2}% vs {b} {:.2}%, z = {:.2}, p {}, confidence {}\n\n",
        100.0 * r.errors.rate_a,
        100.0 * r.errors.rate_b,
        r.errors.z,
        p_eq(r.errors.p_two_sided),
        pct_confidence(r.errors_lean.confidence)
    );
    s += &format!("verdict: {}\n", r.verdict);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` requests, one per unit, the units numbered from `first_unit`.
    fn samples_of(first_unit: u64, n: usize, ms: f64, step: f64, err_every: usize, t0: f64) -> Vec<Sample> {
        (0..n)
            .map(|i| Sample {
                at_s: t0 + i as f64 * 0.01,
                unit: first_unit + i as u64,
                latency_ms: ms + step * (i % 10) as f64,
                ok: err_every == 0 || i % err_every != 0,
            })
            .collect()
    }

    /// As `samples_of`, on units that no call with another `ms` uses (each arm its own users).
    fn samples(n: usize, ms: f64, step: f64, err_every: usize, t0: f64) -> Vec<Sample> {
        samples_of((ms * 1e6) as u64, n, ms, step, err_every, t0)
    }

    #[test]
    fn analyze_excludes_warm_up_and_names_the_better_variant() {
        let mut a = samples(2000, 20.0, 1.0, 100, 0.0);
        let b = samples(2000, 24.0, 1.0, 25, 0.0);
        // Slow warm-up requests of a (before 2 s) are left out.
        a.extend((0..100).map(|_| Sample { at_s: 0.5, unit: 7, latency_ms: 500.0, ok: true }));
        let r = analyze("ab", ["a", "b"], &a, &b, 2.0);
        assert_eq!(r.excluded, 200 + 200 + 100);
        assert_eq!((r.arms[0].requests, r.arms[1].requests), (1800, 1800));
        assert_eq!(r.arms[0].errors, 18);
        assert!(r.arms[0].latency[2].value < 30.0, "warm-up excluded: {:?}", r.arms[0].latency);
        assert!(r.srm.ok);
        assert_eq!(r.latency_lean.better, 0);
        assert_eq!(r.errors_lean.better, 0);
        assert!(r.verdict.starts_with("variant a is better: faster"), "{}", r.verdict);
        let text = render_text(&r);
        assert!(
            text.contains("sample ratio (expected 50/50): users a 1,800 (50.0%) / b 1,800 (50.0%) (requests a 50.0% / b 50.0%)"),
            "{text}"
        );
        assert!(text.contains("stickiness: each of the 3,600 users saw one variant only"), "{text}");
        assert!(text.contains("verdict: variant a is better"), "{text}");
    }

    #[test]
    fn verdicts_for_trade_offs_ties_and_broken_splits() {
        // a faster, b fewer errors.
        let r = analyze("ab", ["a", "b"], &samples(3000, 20.0, 1.0, 20, 0.0), &samples(3000, 25.0, 1.0, 0, 0.0), 0.0);
        assert!(r.verdict.starts_with("a trade-off: variant a is faster"), "{}", r.verdict);
        // Identical arms.
        let r = analyze("ab", ["a", "b"], &samples(1000, 20.0, 1.0, 0, 0.0), &samples(1000, 20.0, 1.0, 0, 0.0), 0.0);
        assert!(r.verdict.starts_with("no clear winner"), "{}", r.verdict);
        // 1000 vs 1400 users: the split is broken.
        let r = analyze("ab", ["a", "b"], &samples(1000, 20.0, 1.0, 0, 0.0), &samples(1400, 30.0, 1.0, 0, 0.0), 0.0);
        assert!(!r.srm.ok && r.verdict.starts_with("no verdict: sample ratio mismatch"), "{}", r.verdict);
        let r = analyze("ab", ["a", "b"], &[], &samples(10, 20.0, 1.0, 0, 0.0), 0.0);
        assert!(r.verdict.starts_with("no verdict: a variant got no requests"));
    }

    #[test]
    fn the_sample_ratio_counts_users_not_requests() {
        // 1000 users each way; one of a's users sends 400 requests. By requests that is 1400 vs
        // 1000 (chi² 67), but the split assigned users, and it assigned them evenly.
        let mut a = samples_of(0, 1000, 20.0, 1.0, 0, 0.0);
        a.extend((0..400).map(|i| Sample { at_s: i as f64 * 0.01, unit: 3, latency_ms: 20.0, ok: true }));
        let b = samples_of(10_000, 1000, 20.0, 1.0, 0, 0.0);
        let r = analyze("ab", ["a", "b"], &a, &b, 0.0);
        assert_eq!((r.arms[0].units, r.arms[1].units), (1000, 1000));
        assert_eq!((r.arms[0].requests, r.arms[1].requests), (1400, 1000));
        assert!(r.srm.ok && r.srm.chi2 == 0.0, "{:?}", r.srm);
        assert!(render_text(&r).contains("users a 1,000 (50.0%) / b 1,000 (50.0%) (requests a 58.3% / b 41.7%)"));
        // 1000 users against 1200: broken, however the requests fall.
        let r = analyze("ab", ["a", "b"], &a, &samples_of(10_000, 1200, 20.0, 1.0, 0, 0.0), 0.0);
        assert!(!r.srm.ok, "{:?}", r.srm);
    }

    #[test]
    fn users_seen_on_both_variants_are_counted() {
        let a = samples_of(0, 100, 20.0, 1.0, 0, 0.0);
        let b = samples_of(95, 100, 20.0, 1.0, 0, 0.0);
        let r = analyze("ab", ["a", "b"], &a, &b, 0.0);
        assert_eq!(r.units_in_both, 5);
        assert_eq!(stickiness_text(&r), "5 of 195 users saw both variants: the split is not sticky");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(fmt_n(0), "0");
        assert_eq!(fmt_n(999), "999");
        assert_eq!(fmt_n(1000), "1,000");
        assert_eq!(fmt_n(1234567), "1,234,567");
    }
}

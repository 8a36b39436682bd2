//! experiment-sim: the experiment engine's statistics, measured by simulation (issue 7).
//!
//! weft's always-valid sequential test (mSPRT, `control/src/experiments/sequential.rs`) and its
//! peer, the fixed-horizon two-proportion z-test read the way dashboards and threshold gates
//! read it — after every batch of requests ("peeking") — run side by side on the same
//! simulated requests:
//!
//! - A/A: both arms identical (2% errors; log-normal latency). The share of experiments in
//!   which a test ever declares a difference is its false-positive rate; the target is ≤ α = 5%
//!   for the sequential test, and peeking should be seen to exceed it.
//! - Power: the candidate has +1 point of errors (2% → 3%), or its latency is 10% higher (its
//!   p95 +10%, judged as the share of requests over the baseline's warm-up p95). The share of
//!   experiments detected by each sample size per arm is the power; the target is ≥ 80%.
//! - SRM: a 50/50 split delivered as 51/49 at n = 100,000 must be flagged (p < 0.001), and a
//!   true 50/50 split almost never.
//!
//! Deterministic (seeded); no network, no peers to install.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use serde_json::{Value, json};
use weft_bench::workspace::{machine, results_path, write_json};
use weft_control::experiments::sequential::{Counts, Monitor, Msprt};
use weft_control::experiments::stats::{srm, srm_weighted, two_proportions};
use weft_control::scheduler::rng::SplitMix64;

/// Simulate A/A and A/B experiments monitored continuously.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 200 experiments per scenario, up to 20,000 requests per arm.
    #[arg(long)]
    quick: bool,
    /// Experiments per scenario [default: 1000; quick: 200].
    #[arg(long)]
    experiments: Option<usize>,
    /// Requests per arm between two looks.
    #[arg(long, default_value_t = 100)]
    batch: u64,
    /// Most requests per arm [default: 40000; quick: 20000].
    #[arg(long)]
    max_n: Option<u64>,
    /// α of both tests.
    #[arg(long, default_value_t = 0.05)]
    alpha: f64,
    /// Where to write the JSON [default: bench/results/experiment-sim.json; quick under tmp/].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Baseline error rate and latency (log-normal: median 100 ms, σ of the log 0.5).
const BASE_ERRORS: f64 = 0.02;
const LOG_MEDIAN_MS: f64 = 4.605_170_185_988_092; // ln(100)
const LOG_SIGMA: f64 = 0.5;
/// Baseline requests whose latency sets the threshold (its p95) before the comparison starts.
const WARMUP: usize = 2_000;
/// Both tests wait for this many requests per arm before any decision.
const MIN_N: u64 = 500;
/// Sample sizes per arm at which power is read.
const CHECKPOINTS: [u64; 6] = [2_000, 5_000, 10_000, 20_000, 30_000, 40_000];

/// Standard normal draw (Box-Muller).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = rng.unit().max(1e-300);
    let u2 = rng.unit();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn latency_ms(rng: &mut SplitMix64, scale: f64) -> f64 {
    (LOG_MEDIAN_MS + LOG_SIGMA * normal(rng)).exp() * scale
}

/// What the candidate arm differs in.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    cand_errors: f64,
    cand_latency_scale: f64,
    /// Which metric is judged: errors, or the share over the latency threshold.
    metric: Metric,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Metric {
    Errors,
    Slow,
}

/// One simulated experiment: when (requests per arm) each test first declared a difference.
struct Outcome {
    msprt_at: Option<u64>,
    msprt_right_direction: bool,
    peek_at: Option<u64>,
    fixed_end_rejects: bool,
}

fn run_one(s: &Scenario, seed: u64, batch: u64, max_n: u64, alpha: f64) -> Outcome {
    let mut rng = SplitMix64::new(seed);
    let mut warm: Vec<f64> = (0..WARMUP).map(|_| latency_ms(&mut rng, 1.0)).collect();
    warm.sort_by(f64::total_cmp);
    let threshold = warm[(WARMUP as f64 * 0.95) as usize];
    let tau = if s.metric == Metric::Errors { 0.01 } else { 0.02 };
    let mut monitor = Monitor::new(Msprt { alpha, tau, min_n: MIN_N });
    let (mut a, mut b) = (Counts::default(), Counts::default());
    let mut out = Outcome { msprt_at: None, msprt_right_direction: false, peek_at: None, fixed_end_rejects: false };
    let event = |rng: &mut SplitMix64, errors: f64, scale: f64| match s.metric {
        Metric::Errors => rng.unit() < errors,
        Metric::Slow => latency_ms(rng, scale) > threshold,
    };
    while a.n < max_n {
        for _ in 0..batch {
            a.n += 1;
            a.events += u64::from(event(&mut rng, BASE_ERRORS, 1.0));
            b.n += 1;
            b.events += u64::from(event(&mut rng, s.cand_errors, s.cand_latency_scale));
        }
        monitor.update(a, b);
        if out.msprt_at.is_none() && (monitor.b_higher() || monitor.b_lower()) {
            out.msprt_at = Some(a.n);
            out.msprt_right_direction = monitor.b_higher();
        }
        if out.peek_at.is_none() && a.n >= MIN_N && two_proportions(a.events, a.n, b.events, b.n).p_two_sided < alpha {
            out.peek_at = Some(a.n);
        }
    }
    out.fixed_end_rejects = two_proportions(a.events, a.n, b.events, b.n).p_two_sided < alpha;
    out
}

fn share(hits: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { hits as f64 / of as f64 }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// Runs `experiments` of a scenario; returns its JSON row.
fn scenario(s: &Scenario, experiments: usize, batch: u64, max_n: u64, alpha: f64) -> Value {
    let outcomes: Vec<Outcome> =
        (0..experiments).map(|i| run_one(s, 0x5eed_0000 + i as u64 * 7919, batch, max_n, alpha)).collect();
    let by = |n: u64, f: &dyn Fn(&Outcome) -> Option<u64>| share(outcomes.iter().filter(|o| f(o).is_some_and(|at| at <= n)).count(), experiments);
    let checkpoints: Vec<u64> = CHECKPOINTS.iter().copied().filter(|&n| n <= max_n).collect();
    let power_msprt: Vec<Value> = checkpoints
        .iter()
        .map(|&n| json!({"n": n, "share": round(by(n, &|o: &Outcome| o.msprt_at.filter(|_| o.msprt_right_direction)), 4)}))
        .collect();
    let power_peek: Vec<Value> =
        checkpoints.iter().map(|&n| json!({"n": n, "share": round(by(n, &|o: &Outcome| o.peek_at), 4)})).collect();
    let mut detected: Vec<u64> = outcomes.iter().filter_map(|o| o.msprt_at).collect();
    detected.sort_unstable();
    json!({
        "scenario": s.name,
        "experiments": experiments,
        "max_n_per_arm": max_n,
        "msprt_ever_rejects": round(share(outcomes.iter().filter(|o| o.msprt_at.is_some()).count(), experiments), 4),
        "peeking_z_ever_rejects": round(share(outcomes.iter().filter(|o| o.peek_at.is_some()).count(), experiments), 4),
        "fixed_z_at_max_n_rejects": round(share(outcomes.iter().filter(|o| o.fixed_end_rejects).count(), experiments), 4),
        "msprt_detected_by_n": power_msprt,
        "peeking_z_detected_by_n": power_peek,
        "msprt_median_n_at_detection": detected.get(detected.len() / 2),
    })
}

/// SRM detection over `experiments` splits of `n` with the candidate's true share `p_b`
/// (arm sizes drawn from the normal approximation of the binomial).
fn srm_rate(experiments: usize, n: u64, p_b: f64, seed: u64) -> f64 {
    let mut rng = SplitMix64::new(seed);
    let sd = (n as f64 * p_b * (1.0 - p_b)).sqrt();
    let flagged = (0..experiments)
        .filter(|_| {
            let nb = (n as f64 * p_b + sd * normal(&mut rng)).round().clamp(0.0, n as f64) as u64;
            !srm_weighted(&[n - nb, nb], &[1.0, 1.0]).ok
        })
        .count();
    share(flagged, experiments)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("experiment-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let args = Args::parse();
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        anyhow::bail!("--alpha {} is not in (0, 1)", args.alpha);
    }
    if args.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    let experiments = args.experiments.unwrap_or(if args.quick { 200 } else { 1000 });
    let max_n = args.max_n.unwrap_or(if args.quick { 20_000 } else { 40_000 });
    let scenarios = [
        Scenario { name: "aa_errors", cand_errors: BASE_ERRORS, cand_latency_scale: 1.0, metric: Metric::Errors },
        Scenario { name: "aa_latency", cand_errors: BASE_ERRORS, cand_latency_scale: 1.0, metric: Metric::Slow },
        Scenario { name: "errors_plus_1pt", cand_errors: BASE_ERRORS + 0.01, cand_latency_scale: 1.0, metric: Metric::Errors },
        Scenario { name: "p95_plus_10pct", cand_errors: BASE_ERRORS, cand_latency_scale: 1.1, metric: Metric::Slow },
    ];
    let started = std::time::Instant::now();
    let rows: Vec<Value> = scenarios
        .iter()
        .map(|s| {
            let r = scenario(s, experiments, args.batch, max_n, args.alpha);
            eprintln!("{}: done ({:.1} s)", s.name, started.elapsed().as_secs_f64());
            r
        })
        .collect();
    let exact = srm(51_000, 49_000);
    let srm_51_49 = srm_rate(experiments, 100_000, 0.49, 1);
    let srm_50_50 = srm_rate(experiments, 100_000, 0.50, 2);

    println!("\n| scenario | mSPRT ever rejects | peeking z ever rejects | fixed z at max n | mSPRT detected by n/arm |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        let by: Vec<String> =
            r["msprt_detected_by_n"].as_array().unwrap().iter().map(|p| format!("{}: {}", p["n"], p["share"])).collect();
        println!(
            "| {} | {} | {} | {} | {} |",
            r["scenario"].as_str().unwrap(),
            r["msprt_ever_rejects"],
            r["peeking_z_ever_rejects"],
            r["fixed_z_at_max_n_rejects"],
            by.join(", ")
        );
    }
    println!("\nSRM: 51,000 vs 49,000 → chi2 {:.1}, p {:.2e}; flagged in {:.1}% of simulated 51/49 splits at n = 100,000, {:.2}% of true 50/50 ones", exact.chi2, exact.p, srm_51_49 * 100.0, srm_50_50 * 100.0);

    let row = |name: &str| rows.iter().find(|r| r["scenario"] == name).cloned().unwrap_or(Value::Null);
    let (aa_e, aa_l, pe, pl) = (row("aa_errors"), row("aa_latency"), row("errors_plus_1pt"), row("p95_plus_10pct"));
    let fpr = aa_e["msprt_ever_rejects"].as_f64().unwrap_or(1.0).max(aa_l["msprt_ever_rejects"].as_f64().unwrap_or(1.0));
    let peek_fpr = aa_e["peeking_z_ever_rejects"].as_f64().unwrap_or(0.0);
    // The smallest checkpoint with power ≥ 80%.
    let n80 = |r: &Value| -> Option<u64> {
        r["msprt_detected_by_n"].as_array()?.iter().filter(|p| p["share"].as_f64() >= Some(0.8)).filter_map(|p| p["n"].as_u64()).min()
    };
    let checks = vec![
        json!({"target": format!("A/A false-positive rate of the sequential test <= {}", args.alpha), "pass": fpr <= args.alpha, "weft": fpr}),
        json!({"target": "peeking a fixed-horizon z-test exceeds alpha", "pass": peek_fpr > args.alpha, "peer": peek_fpr}),
        json!({"target": "power >= 80% for +1 point of errors", "pass": n80(&pe).is_some(), "n_per_arm": n80(&pe)}),
        json!({"target": "power >= 80% for +10% p95", "pass": n80(&pl).is_some(), "n_per_arm": n80(&pl)}),
        json!({"target": "SRM flags 51/49 at n = 100,000", "pass": !exact.ok && srm_51_49 >= 0.99, "p": exact.p, "flagged_share": srm_51_49}),
    ];
    println!();
    for c in &checks {
        println!("{} {}", if c["pass"] == json!(true) { "PASS" } else { "FAIL" }, c["target"].as_str().unwrap_or_default());
    }
    let summary = json!({
        "aa_false_positive_rate_msprt": fpr,
        "aa_false_positive_rate_peeking_z": peek_fpr,
        "aa_false_positive_ratio_peeking_vs_msprt": if fpr > 0.0 { Value::from(round(peek_fpr / fpr, 2)) } else { Value::Null },
        "power_errors_plus_1pt_n_per_arm_for_80pct": n80(&pe),
        "power_p95_plus_10pct_n_per_arm_for_80pct": n80(&pl),
        "srm_51_49_at_100k_p": exact.p,
        "srm_51_49_at_100k_flagged_share": srm_51_49,
        "srm_50_50_at_100k_flagged_share": srm_50_50,
    });
    let doc = json!({
        "bench": "experiment-sim",
        "machine": machine(),
        "settings": {"experiments": experiments, "batch_per_look": args.batch, "max_n_per_arm": max_n, "alpha": args.alpha,
            "min_n_per_arm": MIN_N, "baseline_errors": BASE_ERRORS, "latency": "log-normal, median 100 ms, sigma 0.5",
            "latency_threshold": format!("baseline p95 over {WARMUP} warm-up requests"), "tau_errors": 0.01, "tau_slow": 0.02, "quick": args.quick},
        "summary": summary,
        "scenarios": rows,
        "targets": checks,
        "notes": [
            "both tests see the same simulated requests and look after every batch; peeking_z = the fixed-horizon two-proportion z-test read at every look (the way a dashboard or a threshold gate is read)",
            "msprt_detected_by_n: share of experiments in which the sequential test declared the candidate worse by n requests per arm (power); peeking_z_detected_by_n: any declared difference; A/A rows: ever_rejects (a difference declared either way) is the false-positive rate",
            "p95 +10%: candidate latency scaled by 1.1; judged as the share of requests over the baseline's warm-up p95 (5% for the baseline, ~7.3% for the candidate)",
        ],
    });
    let out = args.out.unwrap_or_else(|| results_path("experiment-sim.json", args.quick));
    write_json(&out, &doc)?;
    println!("\nwrote {}", out.display());
    Ok(args.quick || checks.iter().all(|c| c["pass"] == json!(true)))
}

//! autoscale-replay: weft's autoscaling policies (reactive KPA, predictive Holt-Winters,
//! hybrid, hybrid on spot with a budget) replayed on the Azure LLM inference traces.
//!
//! The 2024 coding week (10 s bins) is the main scenario: Holt-Winters constants are fitted on
//! the first `--fit-days` days, every policy replays the whole week from scratch (the fit days
//! are its warm-up and the forecaster keeps learning online, as it would in production), and
//! the metrics count on the days after. The 2023 one-hour per-request traces, binned to 10 s,
//! are the burst scenario. See bench/README.md (## autoscale-replay) for the model.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use serde_json::{Map, Value, json};

use weft_bench::autoscale::oracle::{self, Clairvoyant, Foresight};
use weft_bench::autoscale::repeats::{self, Repeats};
use weft_bench::autoscale::sim::{self, BudgetSetup, Outcome, SimConfig, SpotSetup};
use weft_bench::autoscale::trace::{self, Trace};
use weft_bench::sched::plot::{self, Panel, Series};
use weft_bench::stats::Spread;
use weft_bench::workspace::{machine, results_path, write_json};
use weft_control::autoscaler::cost::{Budget, Pool, PoolPolicy};
use weft_control::autoscaler::forecast::{FitGrid, HoltWinters, HwParams};
use weft_control::autoscaler::hybrid::Hybrid;
use weft_control::autoscaler::predictive::{Predictive, PredictiveConfig};
use weft_control::autoscaler::reactive::{Kpa, KpaConfig};
use weft_control::autoscaler::{Policy, VariantConfig};

/// Replay the Azure LLM traces under weft's autoscaling policies.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// CI mode: the first 3 days (fit on 2), one burst trace [results under bench/results/tmp/].
    #[arg(long)]
    quick: bool,
    /// A `time,requests` trace in fixed bins [default: azure-llm-2024-coding-10s.csv in
    /// ../shared/data/azure-llm].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Per-request `TIMESTAMP,...` traces for the burst scenario (comma-separated) [default:
    /// AzureLLMInferenceTrace_code.csv and _conv.csv beside the default trace].
    #[arg(long, value_delimiter = ',')]
    bursts: Vec<PathBuf>,
    /// Days of the trace used to fit the forecaster; the rest is evaluated.
    #[arg(long, default_value_t = 4.0)]
    fit_days: f64,
    /// Requests per second one replica serves (the trace peaks near 107 req/s: ~36 replicas).
    #[arg(long, default_value_t = 3.0)]
    capacity_rps: f64,
    /// Replica capacity for the burst traces, req/s [default: each trace's mean rate / 10, so
    /// the mean needs 10 replicas].
    #[arg(long)]
    burst_capacity_rps: Option<f64>,
    /// Cold start when the base weights must be loaded, seconds.
    #[arg(long, default_value_t = 120.0)]
    cold_start_s: f64,
    /// Cold start when the base is resident and only the delta loads, seconds.
    #[arg(long, default_value_t = 20.0)]
    warm_start_s: f64,
    /// Probability that a new replica finds its base weights resident.
    #[arg(long, default_value_t = 0.5)]
    base_resident: f64,
    /// Seconds between decisions (a multiple of the trace's bin).
    #[arg(long, default_value_t = 10.0)]
    decision_interval_s: f64,
    /// SLO on the queueing delay, seconds.
    #[arg(long, default_value_t = 2.0)]
    slo_s: f64,
    /// The reactive baseline's target utilization (Knative's default 70%).
    #[arg(long, default_value_t = 0.7)]
    reactive_util: f64,
    /// Target utilization of the predictive policy and of the hybrid's reactive half.
    #[arg(long, default_value_t = 0.95)]
    predictive_util: f64,
    /// Target utilization of the hybrid's reactive half (its safety net) [default: the
    /// predictive utilization].
    #[arg(long)]
    hybrid_reactive_util: Option<f64>,
    /// Safety margin of the predictive policy, in standard deviations of the forecast error.
    #[arg(long, default_value_t = 1.5)]
    z: f64,
    /// The forecast must stay low this much longer than the lead time before a scale-in, s.
    #[arg(long, default_value_t = 300.0)]
    scale_in_hold_s: f64,
    /// On-demand price per GPU-hour.
    #[arg(long, default_value_t = 3.0)]
    on_demand_price: f64,
    /// Spot price per GPU-hour.
    #[arg(long, default_value_t = 1.2)]
    spot_price: f64,
    /// Spot preemptions per replica-hour.
    #[arg(long, default_value_t = 0.05)]
    spot_preemptions_per_hour: f64,
    /// Preemption notice, seconds.
    #[arg(long, default_value_t = 30.0)]
    notice_s: f64,
    /// Monthly budget (scaled to the evaluated window) shared by the replayed variant and a
    /// best-effort batch variant, for hybrid_spot.
    #[arg(long, default_value_t = 30_000.0)]
    budget_month: f64,
    /// Replicas the best-effort batch variant always wants (hybrid_spot).
    #[arg(long, default_value_t = 8)]
    batch_replicas: u32,
    /// First seed of the preemption and base-residency draws (and of the clairvoyant
    /// controls' forecast errors).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Replays per policy, with seeds `seed`, `seed + 1`, ...; the summary holds the medians
    /// and their ranges [default: 9; quick: 3].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: Option<u64>,
    /// Where to write the JSON [default: bench/results/autoscale-replay.json; quick:
    /// bench/results/tmp/autoscale-replay-quick.json]; the SVG goes beside it.
    #[arg(long)]
    out: Option<PathBuf>,
}

const BUCKET_S: f64 = 60.0;
const DAY_S: f64 = 86_400.0;
const POLICIES: [&str; 4] = ["reactive", "predictive", "hybrid", "hybrid_spot"];

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("autoscale-replay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `../shared/data/azure-llm` beside the repository (or `shared/` inside it).
fn data_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let beside = root.join("../shared/data/azure-llm");
    if beside.is_dir() {
        beside
    } else {
        root.join("shared/data/azure-llm")
    }
}

/// What every policy of one scenario shares.
struct Scenario<'a> {
    args: &'a Args,
    variant: VariantConfig,
    params: HwParams,
    sim: SimConfig,
}

impl Scenario<'_> {
    fn kpa(&self, util: f64) -> Kpa {
        let cfg = KpaConfig {
            target_utilization: util,
            ..KpaConfig::default()
        };
        Kpa::new(cfg, self.variant.clone())
    }

    fn predictive(&self) -> Predictive {
        let cfg = PredictiveConfig {
            bucket_s: BUCKET_S,
            season_s: DAY_S,
            params: self.params,
            target_utilization: self.args.predictive_util,
            z: self.args.z,
            decision_interval_s: self.args.decision_interval_s,
            scale_in_hold_s: self.args.scale_in_hold_s,
            ..PredictiveConfig::default()
        };
        Predictive::new(cfg, self.variant.clone())
    }

    fn policy(&self, name: &str) -> Box<dyn Policy> {
        match name {
            "reactive" => Box::new(self.kpa(self.args.reactive_util)),
            "reactive_at_predictive_util" => Box::new(self.kpa(self.args.predictive_util)),
            "predictive" => Box::new(self.predictive()),
            _ => Box::new(Hybrid {
                predictive: self.predictive(),
                reactive: self.kpa(
                    self.args
                        .hybrid_reactive_util
                        .unwrap_or(self.args.predictive_util),
                ),
            }),
        }
    }

    /// `name` replayed once per seed.
    fn replay(&self, trace: &Trace, name: &str) -> Repeats {
        let runs = seeds(self.args)
            .map(|seed| {
                let mut cfg = self.sim.clone();
                cfg.seed = seed;
                if name != "hybrid_spot" {
                    cfg.spot = None;
                }
                sim::replay(trace, &cfg, self.policy(name).as_mut())
            })
            .collect();
        Repeats { runs }
    }
}

/// The seeds every policy is replayed under.
fn seeds(args: &Args) -> std::ops::Range<u64> {
    let n = args.seeds.unwrap_or(if args.quick { 3 } else { 9 });
    args.seed..args.seed.saturating_add(n)
}

fn sim_config(args: &Args, trace: &Trace, capacity_rps: f64, eval_from_s: f64) -> SimConfig {
    let lead_s = args.cold_start_s + args.decision_interval_s;
    let per = (BUCKET_S / trace.bin_s).round().max(1.0) as usize;
    let first_minute = trace.counts.iter().take(per).sum::<f64>() / (per as f64 * trace.bin_s);
    let initial = (first_minute / (capacity_rps * args.reactive_util))
        .ceil()
        .max(1.0) as u32;
    let eval_s = trace.duration_s() - eval_from_s;
    SimConfig {
        capacity_rps,
        cold_start_s: args.cold_start_s,
        warm_start_s: args.warm_start_s,
        base_resident: args.base_resident,
        decision_interval_s: args.decision_interval_s,
        slo_s: args.slo_s,
        lead_s,
        forecast_bucket_s: BUCKET_S,
        eval_from_s,
        initial_replicas: initial,
        on_demand: Pool {
            price_per_hour: args.on_demand_price,
            preemptions_per_hour: 0.0,
        },
        seed: args.seed,
        spot: Some(SpotSetup {
            pool: Pool {
                price_per_hour: args.spot_price,
                preemptions_per_hour: args.spot_preemptions_per_hour,
            },
            policy: PoolPolicy::default(),
            notice_s: args.notice_s,
            criticality: 1.0,
            budget: Some(BudgetSetup {
                budget: Budget {
                    cap: args.budget_month * eval_s / (30.0 * DAY_S),
                    period_s: eval_s,
                },
                batch_replicas: args.batch_replicas,
                batch_criticality: 0.1,
            }),
        }),
    }
}

fn variant(args: &Args, capacity_rps: f64) -> VariantConfig {
    VariantConfig {
        min_replicas: 1,
        ..VariantConfig::new(capacity_rps, args.cold_start_s)
    }
}

/// 60 s bucket means of the first `days` of `trace`.
fn buckets(trace: &Trace, days: f64) -> Vec<f64> {
    trace
        .head((days * DAY_S / trace.bin_s) as usize)
        .bucket_means(BUCKET_S)
}

/// The medians (as `metrics`) with each one's range over the seeds.
fn summarised(r: &Repeats) -> (Outcome, Value) {
    let m = r.median();
    let mut v = metrics(&m);
    let ranges: Map<String, Value> = repeats::METRICS
        .iter()
        .filter_map(|(name, f)| {
            r.spread(*f)
                .map(|s| ((*name).into(), json!([s.min, s.max])))
        })
        .collect();
    v["range"] = Value::Object(ranges);
    v["seeds"] = json!(r.runs.len());
    (m, v)
}

fn metrics(o: &Outcome) -> Value {
    json!({
        "slo_attainment": o.slo_attainment,
        "bins_in_slo": o.bins_in_slo,
        "mean_queue_delay_s": o.mean_queue_delay_s,
        "gpu_hours": o.gpu_hours,
        "on_demand_gpu_hours": o.on_demand_gpu_hours,
        "spot_gpu_hours": o.spot_gpu_hours,
        "cost": o.cost,
        "scale_events": o.scale_events,
        "cold_starts": o.cold_starts,
        "cold_start_delay_s": o.cold_start_delay_s,
        "preemptions": o.preemptions,
        "smape": o.smape,
        "requests": o.requests,
    })
}

fn run(args: &Args) -> Result<bool> {
    let dir = data_dir();
    let path = args
        .trace
        .clone()
        .unwrap_or_else(|| dir.join("azure-llm-2024-coding-10s.csv"));
    let mut week = trace::read_binned(&path)?;
    let fit_days = if args.quick { 2.0 } else { args.fit_days };
    if args.quick {
        week = week.head((3.0 * DAY_S / week.bin_s) as usize);
    }
    let eval_from_s = (fit_days * DAY_S).min(week.duration_s());

    // Fit the Holt-Winters constants on the fit days, for the lead time's horizon.
    let lead_s = args.cold_start_s + args.decision_interval_s;
    let h = (lead_s / BUCKET_S).ceil() as usize;
    let fit_started = Instant::now();
    let params = HoltWinters::fit(
        &buckets(&week, fit_days),
        (DAY_S / BUCKET_S) as usize,
        h,
        &FitGrid::default(),
    );
    let fit_ms = fit_started.elapsed().as_secs_f64() * 1e3;
    println!(
        "{}: {} bins of {} s; fit on {fit_days} days (α={}, β={}, γ={}, season window ±{}, {fit_ms:.0} ms), evaluate {:.1} days",
        week.name,
        week.counts.len(),
        week.bin_s,
        params.alpha,
        params.beta,
        params.gamma,
        params.season_window,
        (week.duration_s() - eval_from_s) / DAY_S
    );

    let main = Scenario {
        args,
        variant: variant(args, args.capacity_rps),
        params,
        sim: sim_config(args, &week, args.capacity_rps, eval_from_s),
    };
    let mut outcomes = Vec::new();
    let mut summary = Map::new();
    println!(
        "{:<28} {:>8} {:>9} {:>9} {:>7} {:>7} {:>10} {:>7}   SLO % range",
        "policy", "SLO %", "GPU-h", "cost $", "events", "starts", "boot s", "sMAPE"
    );
    let names: Vec<&str> = POLICIES
        .iter()
        .copied()
        .chain(["reactive_at_predictive_util"])
        .collect();
    let mut runs = Vec::new();
    for name in &names {
        let r = main.replay(&week, name);
        let (o, v) = summarised(&r);
        let range = r
            .spread(|o| Some(o.slo_attainment))
            .map_or("-".into(), |s| {
                format!("{:.3}-{:.3}", 100.0 * s.min, 100.0 * s.max)
            });
        println!(
            "{:<28} {:>8.3} {:>9.1} {:>9.0} {:>7} {:>7} {:>10.0} {:>7}   {range}",
            name,
            100.0 * o.slo_attainment,
            o.gpu_hours,
            o.cost,
            o.scale_events,
            o.cold_starts,
            o.cold_start_delay_s,
            o.smape.map_or("-".into(), |s| format!("{s:.1}")),
        );
        summary.insert((*name).into(), v);
        outcomes.push((*name, o));
        runs.push((*name, r));
    }
    let repeats_of = |n: &str| &runs.iter().find(|(m, _)| *m == n).unwrap().1;
    let wins = repeats_of("hybrid").paired_wins(repeats_of("reactive"), |o| o.slo_attainment);
    println!(
        "medians over {} seeds ({}..); SLO range in the last column; hybrid >= reactive's attainment in {wins} of {} seeds (same seed)",
        runs[0].1.runs.len(),
        args.seed,
        runs[0].1.runs.len()
    );
    let get = |n: &str| &outcomes.iter().find(|(m, _)| *m == n).unwrap().1;
    let (reactive, predictive, hybrid, spot) = (
        get("reactive"),
        get("predictive"),
        get("hybrid"),
        get("hybrid_spot"),
    );
    let budget = spot.batch.clone().unwrap_or_default();
    // Both variants' spend, seed by seed, then the median (a sum of medians is not a median).
    let spent = repeats_of("hybrid_spot")
        .spread(|o| o.batch.as_ref().map(|b| b.spent + o.cost))
        .map_or(f64::NAN, |s| s.median);
    println!(
        "budget (hybrid_spot + batch): cap ${:.0}, spent ${:.0}, max over cap ${:.2}, batch granted {:.0}/{:.0} replica-h",
        budget.cap,
        spent,
        budget.max_over_cap,
        budget.granted_replica_hours,
        budget.wanted_replica_hours
    );

    let ratio = |o: &Outcome, f: fn(&Outcome) -> f64| {
        let base = f(reactive);
        if base > 0.0 { f(o) / base } else { f64::NAN }
    };
    let ratios = |o: &Outcome| {
        json!({
            "gpu_hours": ratio(o, |x| x.gpu_hours),
            "cost": ratio(o, |x| x.cost),
            "scale_events": ratio(o, |x| x.scale_events as f64),
            "cold_starts": ratio(o, |x| x.cold_starts as f64),
            "cold_start_delay_s": ratio(o, |x| x.cold_start_delay_s),
        })
    };
    let halves = |o: &Outcome| {
        ratio(o, |x| x.scale_events as f64) <= 0.5 && ratio(o, |x| x.cold_start_delay_s) <= 0.5
    };
    let checks = vec![
        check(
            "hybrid SLO attainment >= 99%",
            hybrid.slo_attainment >= 0.99,
            hybrid.slo_attainment,
        ),
        check(
            "hybrid GPU-hours <= 0.85x reactive",
            ratio(hybrid, |x| x.gpu_hours) <= 0.85,
            ratio(hybrid, |x| x.gpu_hours),
        ),
        check(
            "hybrid SLO attainment >= reactive's",
            hybrid.slo_attainment >= reactive.slo_attainment,
            hybrid.slo_attainment - reactive.slo_attainment,
        ),
        check(
            "budget pacing never passes the cap",
            budget.max_over_cap <= 1e-9,
            budget.max_over_cap,
        ),
    ];
    for c in &checks {
        println!(
            "{}: {} ({:.4})",
            c["target"].as_str().unwrap_or(""),
            c["result"].as_str().unwrap_or(""),
            c["value"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let claim = json!({
        "claim": "predictive scaling cuts reactive scaling events and cold-start latency by more than 50%",
        "predictive": {"confirmed": halves(predictive), "vs_reactive": ratios(predictive)},
        "hybrid": {"confirmed": halves(hybrid), "vs_reactive": ratios(hybrid)},
    });

    let controls = clairvoyant_controls(&main, &week, reactive, args.quick);

    // The burst scenario.
    let burst_paths: Vec<PathBuf> = if !args.bursts.is_empty() {
        args.bursts.clone()
    } else if args.quick {
        vec![dir.join("AzureLLMInferenceTrace_conv.csv")]
    } else {
        vec![
            dir.join("AzureLLMInferenceTrace_code.csv"),
            dir.join("AzureLLMInferenceTrace_conv.csv"),
        ]
    };
    let mut bursts = Map::new();
    let mut burst_plot = None;
    for p in &burst_paths {
        let t = trace::read_requests(p, week.bin_s)?;
        let mean = t.counts.iter().sum::<f64>() / t.duration_s();
        let cap = args.burst_capacity_rps.unwrap_or(mean / 10.0);
        let s = Scenario {
            args,
            variant: variant(args, cap),
            params,
            sim: sim_config(args, &t, cap, 300.0_f64.min(t.duration_s())),
        };
        let mut per = Map::new();
        let peak = t.counts.iter().copied().fold(0.0, f64::max) / t.bin_s;
        println!(
            "burst {}: {} bins, mean {mean:.2} req/s, peak {peak:.1} req/s, {cap:.3} req/s per replica",
            t.name,
            t.counts.len()
        );
        let mut runs = Vec::new();
        for name in POLICIES {
            let (o, v) = summarised(&s.replay(&t, name));
            println!(
                "  {:<12} SLO {:>7.3}%  GPU-h {:>6.2}  events {:>4}  starts {:>4}  boot {:>6.0} s",
                name,
                100.0 * o.slo_attainment,
                o.gpu_hours,
                o.scale_events,
                o.cold_starts,
                o.cold_start_delay_s
            );
            per.insert(name.into(), v);
            runs.push((name, o));
        }
        per.insert("capacity_rps".into(), json!(cap));
        per.insert("mean_rps".into(), json!(mean));
        per.insert("peak_rps".into(), json!(peak));
        bursts.insert(t.name.clone(), Value::Object(per));
        burst_plot.get_or_insert((t.name.clone(), cap, runs));
    }

    let out = args.out.clone().unwrap_or_else(|| {
        results_path(
            if args.quick {
                "autoscale-replay-quick.json"
            } else {
                "autoscale-replay.json"
            },
            args.quick,
        )
    });
    let doc = json!({
        "bench": "autoscale-replay",
        "quick": args.quick,
        "machine": machine(),
        "trace": {"path": path.display().to_string(), "bins": week.counts.len(), "bin_s": week.bin_s,
                  "fit_days": fit_days, "evaluated_days": (week.duration_s() - eval_from_s) / DAY_S},
        "config": config(args, &main),
        "holt_winters": {"alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
                          "season_window": params.season_window,
                          "bucket_s": BUCKET_S, "horizon_buckets": h, "fit_ms": fit_ms},
        "summary": Value::Object(summary),
        "smape_persistence": hybrid.smape_persistence,
        "vs_reactive": {"predictive": ratios(predictive), "hybrid": ratios(hybrid), "hybrid_spot": ratios(spot)},
        "budget": {"cap": budget.cap, "spent": spent, "batch_spent": budget.spent,
                    "max_over_cap": budget.max_over_cap, "batch_wanted_replica_hours": budget.wanted_replica_hours,
                    "batch_granted_replica_hours": budget.granted_replica_hours,
                    "limited_decisions": budget.limited_decisions},
        "claim_50pct": claim,
        "paired": {"hybrid_attainment_at_least_reactive_seeds": wins, "seeds": seeds(args).count()},
        "targets": checks,
        "clairvoyant": controls,
        "bursts": Value::Object(bursts),
    });
    write_json(&out, &doc)?;
    let svg_path = out.with_extension("svg");
    std::fs::write(
        &svg_path,
        figure(
            &outcomes,
            eval_from_s,
            week.duration_s(),
            args.capacity_rps,
            burst_plot,
        ),
    )?;
    println!("wrote {} and {}", out.display(), svg_path.display());
    Ok(args.quick || checks.iter().all(|c| c["pass"] == json!(true)))
}

/// Minutes on either side of the two-sided smoother that estimates the trace's minute noise.
const NEIGHBOURS: usize = 3;

/// The clairvoyant controls on the main trace (`oracle`): for each, a sweep of its sizing knobs
/// and the cheapest point that matches the reactive baseline's attainment (and reaches 99%).
fn clairvoyant_controls(s: &Scenario, week: &Trace, reactive: &Outcome, quick: bool) -> Value {
    let utils: &[f64] = if quick {
        &[0.9, 1.0]
    } else {
        &[0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2]
    };
    let zs: &[f64] = if quick {
        &[1.0]
    } else {
        &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    };
    // Each seed draws both the fleet's base residency and the forecast errors; the point is the
    // medians over the seeds, as for the policies.
    let run = |foresight: &dyn Fn(u64) -> Foresight, util: f64| {
        let runs = seeds(s.args)
            .map(|seed| {
                let mut policy =
                    Clairvoyant::new(week, foresight(seed), s.variant.clone(), s.sim.lead_s, util);
                let mut cfg = s.sim.clone();
                cfg.spot = None;
                cfg.seed = seed;
                sim::replay(week, &cfg, &mut policy)
            })
            .collect();
        Repeats { runs }.median()
    };
    let point = |knobs: Value, o: &Outcome| {
        json!({"knobs": knobs, "slo_attainment": o.slo_attainment, "gpu_hours": o.gpu_hours,
               "vs_reactive_gpu_hours": o.gpu_hours / reactive.gpu_hours,
               "scale_events": o.scale_events, "cold_starts": o.cold_starts})
    };
    let cheapest = |points: &[Value], at_least: f64| {
        points
            .iter()
            .filter(|p| p["slo_attainment"].as_f64().unwrap_or(0.0) >= at_least)
            .min_by(|a, b| {
                let g = |v: &Value| v["gpu_hours"].as_f64().unwrap_or(f64::INFINITY);
                g(a).total_cmp(&g(b))
            })
            .cloned()
            .unwrap_or(Value::Null)
    };
    let errors: &[f64] = if quick {
        &[0.0, 0.05]
    } else {
        &[0.0, 0.025, 0.05, 0.0625, 0.075, 0.09, 0.1]
    };
    let section = |points: Vec<Value>| {
        json!({"cheapest_matching_reactive": cheapest(&points, reactive.slo_attainment),
               "cheapest_at_99": cheapest(&points, 0.99), "sweep": points})
    };
    let mut minutes = Vec::new();
    for &error in errors {
        let foresight = |z| {
            move |seed| Foresight::Minutes {
                bucket_s: BUCKET_S,
                z,
                error,
                seed,
            }
        };
        // A seed draws the same forecast means for every z and utilization; the label is the
        // median over the seeds, as the points are.
        let smape = Spread::of(
            seeds(s.args).map(|seed| oracle::planned_rates(week, foresight(0.0)(seed)).1),
        )
        .map(|s| s.median);
        let mut points = Vec::new();
        for &util in utils {
            for &z in zs {
                let o = run(&foresight(z), util);
                points.push(point(json!({"utilization": util, "z": z}), &o));
            }
        }
        let mut level = section(points);
        level["forecast_error"] = json!(error);
        level["smape"] = json!(smape);
        minutes.push(level);
    }
    let bins: Vec<Value> = utils
        .iter()
        .map(|&util| {
            point(
                json!({"utilization": util}),
                &run(&|_| Foresight::Bins, util),
            )
        })
        .collect();
    let floor = oracle::free_boot_floor(
        week,
        s.sim.capacity_rps,
        s.sim.slo_s,
        s.variant.min_replicas,
        s.sim.eval_from_s,
    );
    let noise = oracle::neighbour_smape(week, BUCKET_S, s.sim.eval_from_s, NEIGHBOURS);
    let doc = json!({
        "reactive_slo_attainment": reactive.slo_attainment,
        "neighbour_smape": {"minutes_each_side": NEIGHBOURS, "smape": noise},
        "minute_foresight": minutes,
        "bin_foresight": section(bins),
        "free_boot_floor": {"gpu_hours": floor, "vs_reactive_gpu_hours": floor / reactive.gpu_hours,
                            "slo_attainment": 1.0},
    });
    println!("clairvoyant controls (GPU-hours vs reactive at matching attainment / at 99%):");
    let show = |name: String, v: &Value| {
        let one = |p: &Value| match p["vs_reactive_gpu_hours"].as_f64() {
            Some(r) => format!(
                "{r:.3}x ({:.3}%, {})",
                100.0 * p["slo_attainment"].as_f64().unwrap_or(0.0),
                p["knobs"]
            ),
            None => "none".into(),
        };
        println!(
            "  {name:<30} {}  /  {}",
            one(&v["cheapest_matching_reactive"]),
            one(&v["cheapest_at_99"])
        );
    };
    for level in doc["minute_foresight"].as_array().into_iter().flatten() {
        let name = format!(
            "minutes, error {:.3} (sMAPE {:.1}%)",
            level["forecast_error"].as_f64().unwrap_or(0.0),
            level["smape"].as_f64().unwrap_or(0.0)
        );
        show(name, level);
    }
    show("bins".into(), &doc["bin_foresight"]);
    println!(
        "  {:<30} {:.3}x (every bin in SLO)",
        "free boots, bins",
        floor / reactive.gpu_hours
    );
    println!(
        "  sMAPE of each minute vs the mean of its {NEIGHBOURS} neighbours each side (a two-sided smoother): {:.1}%",
        noise.unwrap_or(f64::NAN)
    );
    doc
}

fn check(target: &str, pass: bool, value: f64) -> Value {
    json!({"target": target, "pass": pass, "result": if pass { "PASS" } else { "FAIL" }, "value": value})
}

fn config(args: &Args, s: &Scenario) -> Value {
    json!({
        "capacity_rps": args.capacity_rps, "burst_capacity_rps": args.burst_capacity_rps.map_or(json!("mean/10"), |c| json!(c)),
        "cold_start_s": args.cold_start_s, "warm_start_s": args.warm_start_s,
        "base_resident": args.base_resident, "decision_interval_s": args.decision_interval_s,
        "lead_s": s.sim.lead_s, "slo_queueing_delay_s": args.slo_s,
        "reactive_util": args.reactive_util, "predictive_util": args.predictive_util,
        "hybrid_reactive_util": args.hybrid_reactive_util.unwrap_or(args.predictive_util),
        "z": args.z, "scale_in_hold_s": args.scale_in_hold_s,
        "kpa": {"stable_window_s": 60.0, "panic_window_s": 6.0, "panic_threshold": 2.0, "max_scale_down_rate": 2.0},
        "on_demand_price": args.on_demand_price, "spot_price": args.spot_price,
        "spot_preemptions_per_hour": args.spot_preemptions_per_hour, "notice_s": args.notice_s,
        "pool_policy": {"max_risk": PoolPolicy::default().max_risk, "on_demand_buffer": PoolPolicy::default().on_demand_buffer,
                        "horizon_s": PoolPolicy::default().horizon_s},
        "budget_month": args.budget_month, "batch_replicas": args.batch_replicas,
        "initial_replicas": s.sim.initial_replicas, "min_replicas": s.variant.min_replicas,
        "seeds": seeds(args).collect::<Vec<_>>(),
    })
}

/// Means of `(x, y)` points over consecutive windows of `w` (x in seconds → hours).
fn coarse(points: impl Iterator<Item = (f64, f64)>, w: f64, x_scale: f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let (mut key, mut sum, mut n) = (f64::NAN, 0.0, 0.0);
    for (x, y) in points {
        let k = (x / w).floor();
        if k != key && n > 0.0 {
            out.push((key * w / x_scale, sum / n));
            (sum, n) = (0.0, 0.0);
        }
        key = k;
        sum += y;
        n += 1.0;
    }
    if n > 0.0 {
        out.push((key * w / x_scale, sum / n));
    }
    out
}

const COLORS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

type BurstRuns<'a> = (String, f64, Vec<(&'a str, Outcome)>);

fn figure(
    runs: &[(&str, Outcome)],
    from_s: f64,
    to_s: f64,
    cap: f64,
    burst: Option<BurstRuns>,
) -> String {
    let hybrid = &runs.iter().find(|(n, _)| *n == "hybrid").unwrap().1;
    let w = 600.0;
    let demand = Series {
        label: "demand req/s".into(),
        color: "#7f7f7f",
        points: coarse(
            hybrid.series.iter().map(|p| (p.t_s, p.demand_rps)),
            w,
            3600.0,
        ),
    };
    let forecast = Series {
        label: "lead-time forecast".into(),
        color: "#ff7f0e",
        points: coarse(hybrid.forecasts.iter().copied(), w, 3600.0),
    };
    let capacity = Series {
        label: "hybrid capacity".into(),
        color: "#2ca02c",
        points: coarse(
            hybrid
                .series
                .iter()
                .map(|p| (p.t_s, f64::from(p.ready) * cap)),
            w,
            3600.0,
        ),
    };
    let replicas: Vec<Series> = runs
        .iter()
        .take(4)
        .zip(COLORS)
        .map(|((name, o), color)| Series {
            label: (*name).to_string(),
            color,
            points: coarse(
                o.series.iter().map(|p| (p.t_s, f64::from(p.replicas))),
                w,
                3600.0,
            ),
        })
        .collect();
    let range = (from_s / 3600.0, to_s / 3600.0);
    let mut svg = plot::svg(
        &[
            Panel {
                title: "demand, forecast, hybrid capacity".into(),
                series: vec![demand, forecast, capacity],
            },
            Panel {
                title: "replicas (10-min means)".into(),
                series: replicas,
            },
        ],
        range,
        2,
        "hours since trace start",
        "req/s | replicas",
    );
    if let Some((name, _, runs)) = burst {
        let series: Vec<Series> = std::iter::once(Series {
            label: "demand req/s".into(),
            color: "#7f7f7f",
            points: coarse(
                runs[0].1.series.iter().map(|p| (p.t_s, p.demand_rps)),
                60.0,
                60.0,
            ),
        })
        .chain(runs.iter().zip(COLORS).map(|((n, o), color)| Series {
            label: format!("{n} replicas"),
            color,
            points: coarse(
                o.series.iter().map(|p| (p.t_s, f64::from(p.replicas))),
                60.0,
                60.0,
            ),
        }))
        .collect();
        let b = plot::svg(
            &[Panel {
                title: format!("bursts: {name}"),
                series,
            }],
            (0.0, 60.0),
            1,
            "minutes",
            "req/s | replicas",
        );
        svg.push_str(&b);
    }
    svg
}

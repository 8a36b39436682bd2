//! shard-rescale: data-shard movement when a training job is rescaled (issue 8).
//!
//! weft's planner (`control/src/shards/data.rs`: rendezvous hashing with a size cap, sticky
//! across rescales) and the naive peer (shard i → worker i mod N, recomputed) on the same
//! dataset, for 4 → 6 → 3 and 100 → 101 workers: the share of shards that change owner, the
//! ideal (the share that must move: the joined workers' share on scale-up, the departed
//! workers' share on scale-down), the size imbalance (largest worker / mean), and the global
//! batch before and after (exact).
//!
//! The dataset is synthetic (no shard trace ships in ../shared/data): `--shards` shards with
//! log-normal sizes (seeded), or `--sizes FILE` with one size per line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{Value, json};
use weft_bench::workspace::{machine, results_path, write_json};
use weft_control::scheduler::rng::SplitMix64;
use weft_control::shards::batch;
use weft_control::shards::data::{Assignment, Shard, assign, imbalance, modulo, moved};

/// Shard movement on rescale: weft's planner vs modulo reassignment.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 2,000 shards.
    #[arg(long)]
    quick: bool,
    /// Shards in the synthetic dataset [default: 20000; quick: 2000].
    #[arg(long)]
    shards: Option<usize>,
    /// A file with one shard size per line, instead of the synthetic dataset.
    #[arg(long)]
    sizes: Option<PathBuf>,
    /// Size cap slack over the even share.
    #[arg(long, default_value_t = 0.05)]
    slack: f64,
    /// Global batch (samples per step) checked across the rescales.
    #[arg(long, default_value_t = 1024)]
    global_batch: u64,
    /// Largest micro-batch.
    #[arg(long, default_value_t = 32)]
    max_micro_batch: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where to write the JSON [default: bench/results/shard-rescale.json; quick under tmp/].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn workers(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("worker-{i}")).collect()
}

fn dataset(args: &Args) -> Result<Vec<Shard>> {
    if let Some(p) = &args.sizes {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        return text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                let size = l.trim().parse::<u64>().with_context(|| format!("{} line {}: not a size: {l:?}", p.display(), i + 1))?;
                Ok(Shard { id: format!("shard-{i:06}"), size })
            })
            .collect();
    }
    let n = args.shards.unwrap_or(if args.quick { 2_000 } else { 20_000 });
    let mut rng = SplitMix64::new(args.seed);
    Ok((0..n)
        .map(|i| {
            let (u1, u2) = (rng.unit().max(1e-300), rng.unit());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            // Median 64 MiB, sigma 0.8 of the log.
            Shard { id: format!("shard-{i:06}"), size: (67_108_864.0 * (0.8 * z).exp()) as u64 }
        })
        .collect())
}

fn round(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("shard-rescale: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<bool> {
    let args = Args::parse();
    anyhow::ensure!(args.slack >= 0.0 && args.slack.is_finite(), "--slack {} must be 0 or more", args.slack);
    let shards = dataset(&args)?;
    anyhow::ensure!(!shards.is_empty(), "the dataset has no shards");
    let mut rows = Vec::new();
    let mut summary = serde_json::Map::new();
    // Movement within 1.25x the ideal (+1 point) is the target on the full dataset; with few
    // shards per worker (quick) the size cap moves more, so quick runs only check the batch.
    let mut all_ok = true;
    let mut batch_ok = true;
    for path in [vec![4usize, 6, 3], vec![100, 101]] {
        let mut prev: Option<(usize, Assignment, Assignment)> = None;
        for &n in &path {
            let ws = workers(n);
            let weft = assign(&shards, &ws, prev.as_ref().map(|p| &p.1), args.slack);
            let naive = modulo(&shards, &ws);
            let batch = batch::split(args.global_batch, n as u64, args.max_micro_batch).map_err(anyhow::Error::msg)?;
            let batch_total: u64 = batch.iter().map(|r| r.samples).sum();
            batch_ok &= batch_total == args.global_batch;
            if let Some((m, pw, pn)) = &prev {
                let ideal = if n > *m { (n - m) as f64 / n as f64 } else { (m - n) as f64 / *m as f64 };
                let (mw, mn) = (moved(pw, &weft), moved(pn, &naive));
                let key = format!("{m}_to_{n}");
                println!(
                    "{m:>3} → {n:<3}  weft moved {:>6.2}%   modulo moved {:>6.2}%   ideal {:>6.2}%   weft imbalance {:.3}   global batch {} = {}",
                    mw * 100.0,
                    mn * 100.0,
                    ideal * 100.0,
                    imbalance(&shards, &weft, &ws),
                    args.global_batch,
                    batch_total
                );
                summary.insert(format!("moved_{key}"), json!(round(mw)));
                summary.insert(format!("moved_{key}_modulo"), json!(round(mn)));
                summary.insert(format!("moved_{key}_ideal"), json!(round(ideal)));
                all_ok &= mw <= ideal * 1.25 + 0.01;
                rows.push(json!({"from": m, "to": n, "weft_moved": mw, "modulo_moved": mn, "ideal": ideal,
                    "weft_imbalance": imbalance(&shards, &weft, &ws), "modulo_imbalance": imbalance(&shards, &naive, &ws),
                    "global_batch": batch_total, "rank_samples": batch.iter().map(|r| r.samples).collect::<Vec<_>>(),
                    "accumulation_steps": batch[0].accumulation_steps}));
            } else {
                println!("{n:>3} workers: weft imbalance {:.3} (modulo {:.3})", imbalance(&shards, &weft, &ws), imbalance(&shards, &naive, &ws));
            }
            prev = Some((n, weft, naive));
        }
    }
    summary.insert("global_batch_constant".into(), json!(batch_ok));
    let doc = json!({
        "bench": "shard-rescale",
        "machine": machine(),
        "settings": {"shards": shards.len(), "sizes": args.sizes.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "synthetic log-normal, median 64 MiB, sigma 0.8".into()),
            "slack": args.slack, "global_batch": args.global_batch, "max_micro_batch": args.max_micro_batch, "seed": args.seed, "quick": args.quick},
        "summary": Value::Object(summary),
        "rescales": rows,
        "notes": [
            "moved: share of shards (by count) whose owner changed; ideal: the joined workers' share (scale-up) or the departed workers' share (scale-down)",
            "imbalance: largest worker's total shard size / the mean (the planner caps placement at (1 + slack) x the mean, never below the largest shard)",
            "global batch: the first B mod D ranks take one sample more; every rank runs the same accumulation steps",
        ],
    });
    let out = args.out.clone().unwrap_or_else(|| results_path("shard-rescale.json", args.quick));
    write_json(&out, &doc)?;
    println!("\nwrote {}", out.display());
    Ok(batch_ok && (args.quick || all_ok))
}

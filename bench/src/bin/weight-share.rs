//! weight-share: memory of N variant replicas of one base on one node, with the base shared
//! (one `weft-agent hold` per base, replicas mapping its sealed memfd) against each replica
//! loading its own copy (`weft-model-server --base FILE`), same binaries, same files, same run.
//!
//! Memory is PSS summed over every process (`/proc/PID/smaps_rollup`), read once every
//! replica has answered (so every page it uses is resident): shared pages count once in total,
//! split between the processes mapping them. The target is the issue's: shared total ≤ 1.1 ×
//! (base + N·delta) / (N·(base + delta)) of the unshared total, as a ratio.
//!
//! `first_token_cold_ms`: from placing the N replicas (`POST /v1/schedule/apply` to a
//! weft-control node, carried out by one `weft-agent run`) to the first answer of the 1st and
//! of the Nth replica through its sidecar (see [`weft_bench::agent_run`]). The same memory is
//! read there too (holder + servers, and the sidecars apart), and the answers must match the
//! direct runs'. `direct_first_token_cold_ms`: the same from starting the processes directly.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use weft_agent::weights::make;
use weft_agent::weights::model::Dims;
use weft_bench::agent_run::{self, ask};
use weft_bench::procfs::pss_kib;
use weft_bench::stats::Spread;
use weft_bench::workspace::{machine, release_bin, results_path, write_json};

#[derive(Parser, Debug)]
struct Args {
    /// CI mode: a 16 MiB base, one repeat.
    #[arg(long)]
    quick: bool,
    /// Variant replicas of the base.
    #[arg(long, default_value_t = 4)]
    variants: usize,
    /// Base layers of d×d [default: 128; quick: 16].
    #[arg(long)]
    layers: Option<usize>,
    /// Layer width [default: 1024; quick: 512] (the base is 4·layers·d² bytes).
    #[arg(long)]
    d: Option<usize>,
    /// LoRA rank of each variant's delta (on every layer), plus its own head.
    #[arg(long, default_value_t = 16)]
    rank: usize,
    #[arg(long, default_value_t = 256)]
    classes: usize,
    /// Repeats of both configurations [default: 3; quick: 1].
    #[arg(long)]
    repeats: Option<usize>,
    /// Where to write the JSON [default: bench/results/weight-share.json; quick under tmp/].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A child killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Run {
    total_mib: f64,
    per_process_mib: Vec<f64>,
    first_ms: f64,
    nth_ms: f64,
    answers: Vec<Value>,
}

/// Starts `n` replicas (shared: behind a holder) and waits for each one's first answer.
fn run(bins: &agent_run::Bins, base: &Path, deltas: &[PathBuf], shared: bool, dir: &Path) -> Result<Run> {
    let started = Instant::now();
    let mut procs = Vec::new();
    let socket = dir.join("holder.sock");
    if shared {
        let mut c = Command::new(&bins.agent).arg("hold").arg("--base").arg(base).arg("--socket").arg(&socket).stderr(Stdio::piped()).spawn()?;
        let mut line = String::new();
        BufReader::new(c.stderr.take().context("holder stderr")?).read_line(&mut line)?;
        if !line.contains("shared on") {
            bail!("the weight holder did not start: {line}");
        }
        procs.push(Proc(c));
    }
    let mut ports = Vec::new();
    for (i, delta) in deltas.iter().enumerate() {
        let port = weft_bench::net::free_addrs(1)?[0].port();
        let mut c = Command::new(&bins.server);
        c.args(["--port", &port.to_string(), "--variant", &format!("v{i}")]).arg(if shared { "--holder" } else { "--base" });
        c.arg(if shared { socket.as_path() } else { base }).arg("--delta").arg(delta).stderr(Stdio::null());
        procs.push(Proc(c.spawn()?));
        ports.push(port);
    }
    let mut answered = vec![None; ports.len()];
    let mut answers = vec![Value::Null; ports.len()];
    while answered.iter().any(Option::is_none) {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("replicas did not answer within 300 s");
        }
        for (i, port) in ports.iter().enumerate() {
            if answered[i].is_none()
                && let Some(a) = ask(SocketAddr::from(([127, 0, 0, 1], *port)))
            {
                answered[i] = Some(started.elapsed().as_secs_f64() * 1e3);
                answers[i] = a;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut times: Vec<f64> = answered.into_iter().flatten().collect();
    times.sort_by(f64::total_cmp);
    let per_process_mib: Vec<f64> = procs.iter().map(|p| pss_kib(p.0.id()).map(|k| k as f64 / 1024.0)).collect::<Result<_>>()?;
    Ok(Run { total_mib: per_process_mib.iter().sum(), per_process_mib, first_ms: times[0], nth_ms: times[times.len() - 1], answers })
}

/// Median of the repeats (every repeat yields every figure, or the run fails before this).
fn median(v: Vec<f64>) -> f64 {
    Spread::of(v.into_iter().map(Some)).map_or(f64::NAN, |s| s.median)
}

fn stats(v: &[f64]) -> Value {
    Spread::of(v.iter().copied().map(Some)).map_or(Value::Null, |s| json!({"median": s.median, "min": s.min, "max": s.max}))
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("weight-share: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn real_main() -> Result<bool> {
    let args = Args::parse();
    anyhow::ensure!(args.variants >= 1, "--variants must be at least 1");
    let dims = Dims {
        layers: args.layers.unwrap_or(if args.quick { 16 } else { 128 }),
        d: args.d.unwrap_or(if args.quick { 512 } else { 1024 }),
        classes: args.classes,
    };
    let repeats = args.repeats.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let bins = agent_run::Bins {
        control: release_bin("weft-control")?,
        agent: release_bin("weft-agent")?,
        server: release_bin("weft-model-server")?,
        proxy: release_bin("weft-proxy")?,
    };
    let dir = tempfile::tempdir()?;
    let base = dir.path().join("base.safetensors");
    make::base(&base, dims, 1).map_err(anyhow::Error::msg)?;
    let deltas: Vec<PathBuf> = (0..args.variants)
        .map(|i| {
            let p = dir.path().join(format!("delta-{i}.safetensors"));
            make::delta(&p, dims, args.rank, true, 100 + i as u64).map(|_| p)
        })
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    let mib = |floats: usize| floats as f64 * 4.0 / (1u64 << 20) as f64;
    let base_mib = mib(dims.layers * dims.d * dims.d + dims.classes * dims.d);
    let delta_mib = mib(dims.layers * 2 * args.rank * dims.d + dims.classes * dims.d);
    let n = args.variants as f64;
    let target = 1.1 * (base_mib + n * delta_mib) / (n * (base_mib + delta_mib));
    println!(
        "weight-share: {} variants of a {base_mib:.1} MiB base ({} layers of {}x{}), {delta_mib:.2} MiB delta each (LoRA rank {} + head), {repeats} repeat(s)",
        args.variants, dims.layers, dims.d, dims.d, args.rank
    );

    weft_bench::guard::stop_children_on_signal()?;
    let (mut shared, mut unshared, mut placed) = (Vec::new(), Vec::new(), Vec::new());
    let mut outputs_agree = true;
    for r in 0..repeats {
        let s = run(&bins, &base, &deltas, true, dir.path())?;
        let u = run(&bins, &base, &deltas, false, dir.path())?;
        let run_dir = dir.path().join(format!("agent-{r}"));
        std::fs::create_dir_all(&run_dir)?;
        let p = agent_run::run(&bins, &base, &deltas, &run_dir).context("the run through weft-agent")?;
        outputs_agree &= s.answers == u.answers && s.answers == p.answers;
        println!(
            "  repeat {}: shared {:>8.1} MiB (holder {:.1}, replicas {:?})  unshared {:>8.1} MiB  first/Nth answer {:.0}/{:.0} ms shared, {:.0}/{:.0} ms unshared",
            r + 1,
            s.total_mib,
            s.per_process_mib[0],
            s.per_process_mib[1..].iter().map(|m| (m * 10.0).round() / 10.0).collect::<Vec<_>>(),
            u.total_mib,
            s.first_ms,
            s.nth_ms,
            u.first_ms,
            u.nth_ms
        );
        println!(
            "            placed through weft-agent: holder + servers {:.1} MiB, sidecars {:.1} MiB, first/Nth answer {:.0}/{:.0} ms from the apply",
            p.holder_and_servers_mib, p.sidecars_mib, p.first_ms, p.nth_ms
        );
        shared.push(s);
        unshared.push(u);
        placed.push(p);
    }
    let distinct = {
        let mut logits: Vec<String> = shared[0].answers.iter().map(|a| a["logits"].to_string()).collect();
        logits.sort();
        logits.dedup();
        logits.len() == args.variants
    };
    let col = |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
    let shared_total = median(col(&shared, |r| r.total_mib));
    let unshared_total = median(col(&unshared, |r| r.total_mib));
    let ratio = shared_total / unshared_total;
    let pass = ratio <= target && outputs_agree && distinct;
    println!();
    println!("| PSS total, MiB (median) | shared | unshared | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} variants | {shared_total:.1} | {unshared_total:.1} | {ratio:.3} | ≤ {target:.3} {} |",
        args.variants,
        if ratio <= target { "PASS" } else { "FAIL" }
    );
    let cold = |runs: &[agent_run::Placed], f: fn(&agent_run::Placed) -> f64| median(runs.iter().map(f).collect());
    let (placed_first, placed_nth) = (cold(&placed, |p| p.first_ms), cold(&placed, |p| p.nth_ms));
    println!(
        "| placed through weft-agent | {:.1} (+ sidecars {:.1}) | | | |",
        cold(&placed, |p| p.holder_and_servers_mib),
        cold(&placed, |p| p.sidecars_mib)
    );
    println!();
    println!("| first answer, ms (median) | 1st | Nth |");
    println!("|---|---|---|");
    println!("| from schedule apply, through weft-agent and the sidecar | {placed_first:.0} | {placed_nth:.0} |");
    println!(
        "| from process start, shared (direct) | {:.0} | {:.0} |",
        median(col(&shared, |r| r.first_ms)),
        median(col(&shared, |r| r.nth_ms))
    );
    println!(
        "| from process start, unshared (direct) | {:.0} | {:.0} |",
        median(col(&unshared, |r| r.first_ms)),
        median(col(&unshared, |r| r.nth_ms))
    );
    println!("answers: shared = unshared = placed per variant: {outputs_agree}; every variant's answer distinct: {distinct}");
    let doc = json!({
        "bench": "weight-share",
        "machine": machine(),
        "config": {"variants": args.variants, "layers": dims.layers, "d": dims.d, "classes": dims.classes, "rank": args.rank, "repeats": repeats, "quick": args.quick},
        "summary": {
            "variants": args.variants,
            "base_mib": base_mib,
            "delta_mib": delta_mib,
            "shared_total_mib": shared_total,
            "unshared_total_mib": unshared_total,
            "ratio": ratio,
            "first_token_cold_ms": {"first": placed_first, "nth": placed_nth},
            "target_ratio": target,
            "pass": pass,
        },
        "first_token_cold_ms_is": "from POST /v1/schedule/apply (N replica placements) to each replica's first answer through its sidecar, the endpoint read from the agent's NodeStatus; one weft-control node and one weft-agent run, declared inventory",
        "direct_first_token_cold_ms": {"first": median(col(&shared, |r| r.first_ms)), "nth": median(col(&shared, |r| r.nth_ms))},
        "unshared_first_token_cold_ms": {"first": median(col(&unshared, |r| r.first_ms)), "nth": median(col(&unshared, |r| r.nth_ms))},
        "placed": {
            "holder_and_servers_mib": stats(&placed.iter().map(|p| p.holder_and_servers_mib).collect::<Vec<_>>()),
            "sidecars_mib": stats(&placed.iter().map(|p| p.sidecars_mib).collect::<Vec<_>>()),
            "first_ms": stats(&placed.iter().map(|p| p.first_ms).collect::<Vec<_>>()),
            "nth_ms": stats(&placed.iter().map(|p| p.nth_ms).collect::<Vec<_>>()),
        },
        "ranges": {
            "shared_total_mib": stats(&col(&shared, |r| r.total_mib)),
            "unshared_total_mib": stats(&col(&unshared, |r| r.total_mib)),
            "shared_first_ms": stats(&col(&shared, |r| r.first_ms)),
            "shared_nth_ms": stats(&col(&shared, |r| r.nth_ms)),
        },
        "per_process_mib": {"shared": shared.iter().map(|r| r.per_process_mib.clone()).collect::<Vec<_>>(),
                            "unshared": unshared.iter().map(|r| r.per_process_mib.clone()).collect::<Vec<_>>()},
        "outputs_agree": outputs_agree,
        "variants_distinct": distinct,
        "launched_by": "memory: the bench directly (shared and unshared, same binaries); first_token_cold_ms: weft-agent run from placements",
    });
    let out = args.out.unwrap_or_else(|| results_path("weight-share.json", args.quick));
    write_json(&out, &doc)?;
    println!("wrote {}", out.display());
    // Quick mode's small base is dwarfed by each process's own few MiB, so only a full run is
    // held to the ratio; wrong answers fail either way.
    Ok(outputs_agree && distinct && (pass || args.quick))
}

//! weight-share: memory of N variant replicas of one base on one node, with the base shared
//! (one `weft-agent hold` per base, replicas mapping its sealed memfd) against each replica
//! loading its own copy (`weft-model-server --base FILE`), same binaries, same files, same run.
//!
//! Memory is PSS summed over every process (`/proc/PID/smaps_rollup`), read once every
//! replica has answered (so every page it uses is resident): shared pages count once in total,
//! split between the processes mapping them. The target is the issue's: shared total ≤ 1.1 ×
//! (base + N·delta) / (N·(base + delta)) of the unshared total, as a ratio.
//!
//! `first_token_cold_ms`: from starting the replicas (and, shared, the holder) to the first
//! answer of the 1st and of the Nth replica. The bench launches the processes itself, not
//! through `weft-agent run` from a placement (which adds the sidecar's start and the ADS push).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use weft_agent::weights::make;
use weft_agent::weights::model::Dims;
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

/// PSS of `pid` in KiB (`Pss:` of smaps_rollup).
fn pss_kib(pid: u32) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).with_context(|| format!("smaps_rollup of {pid}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .context("no Pss line")
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// One inference answer from `port`, or None while it is not up.
fn ask(port: u16) -> Option<Value> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "POST /v1/infer HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    serde_json::from_str(out.split_once("\r\n\r\n")?.1).ok()
}

struct Run {
    total_mib: f64,
    per_process_mib: Vec<f64>,
    first_ms: f64,
    nth_ms: f64,
    answers: Vec<Value>,
}

/// Starts `n` replicas (shared: behind a holder) and waits for each one's first answer.
fn run(bins: &Bins, base: &Path, deltas: &[PathBuf], shared: bool, dir: &Path) -> Result<Run> {
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
        let port = free_port()?;
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
                && let Some(a) = ask(*port)
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

struct Bins {
    agent: PathBuf,
    server: PathBuf,
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
    let bins = Bins { agent: release_bin("weft-agent")?, server: release_bin("weft-model-server")? };
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

    let (mut shared, mut unshared) = (Vec::new(), Vec::new());
    let mut outputs_agree = true;
    for r in 0..repeats {
        let s = run(&bins, &base, &deltas, true, dir.path())?;
        let u = run(&bins, &base, &deltas, false, dir.path())?;
        outputs_agree &= s.answers == u.answers;
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
        shared.push(s);
        unshared.push(u);
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
    println!("answers: shared = unshared per variant: {outputs_agree}; every variant's answer distinct: {distinct}");
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
            "first_token_cold_ms": {"first": median(col(&shared, |r| r.first_ms)), "nth": median(col(&shared, |r| r.nth_ms))},
            "target_ratio": target,
            "pass": pass,
        },
        "unshared_first_token_cold_ms": {"first": median(col(&unshared, |r| r.first_ms)), "nth": median(col(&unshared, |r| r.nth_ms))},
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
        "launched_by": "the bench directly (not weft-agent run from a placement)",
    });
    let out = args.out.unwrap_or_else(|| results_path("weight-share.json", args.quick));
    write_json(&out, &doc)?;
    println!("wrote {}", out.display());
    // Quick mode's small base is dwarfed by each process's own few MiB, so only a full run is
    // held to the ratio; wrong answers fail either way.
    Ok(outputs_agree && distinct && (pass || args.quick))
}

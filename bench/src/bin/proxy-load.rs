//! proxy-load: weft-proxy against Envoy, nginx and HAProxy on one machine, one core each side.
//!
//! Every proxy runs one worker pinned to core 0; the upstream and the load generators share
//! core 1. Per repeat each target (in a rotated order, so drifting machine noise is shared) gets a
//! fresh upstream and a fresh proxy, then: idle RSS, warm-up, closed-loop `wrk` (throughput and
//! CPU per request), open-loop `h2load` at a fixed rate (p50/p99), peak RSS. All of it runs in a
//! network namespace of the bench's own (`netns`), away from the host's firewall. See
//! bench/README.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};

use weft_bench::guard::{self, TempDir};
use weft_bench::peers::{Running, Target, WeftBuild};
use weft_bench::report::{self, Sample, Summary};
use weft_bench::workspace;
use weft_bench::{install, load, procfs, upstream::Upstream};

/// Compare weft-proxy with Envoy, nginx and HAProxy under the same load on the same machine.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 1 repeat, 2 s per phase; missing peers are reported, not fatal.
    #[arg(long)]
    quick: bool,
    /// Repeats (targets interleaved in each) [default: 3, quick: 1].
    #[arg(long)]
    repeats: Option<usize>,
    /// Seconds per load phase (closed loop, then open loop) [default: 10, quick: 2].
    #[arg(long)]
    duration: Option<u64>,
    /// Open-loop request rate, req/s.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// Connections of the load generator (both phases).
    #[arg(long, default_value_t = 50)]
    connections: u32,
    /// Which build `weft` is: `pgo`, the profile-guided build of scripts/pgo-build.sh (what
    /// ships; about 8 minutes to build the first time), or `release`, the plain `cargo build
    /// --release` [default: pgo; quick: release]. With `pgo`, `weft_release` (the plain build)
    /// runs beside it unless `--only` leaves it out. `WEFT_PROXY_BIN=PATH` measures that
    /// binary as `weft` instead.
    #[arg(long, value_enum)]
    weft_build: Option<WeftBuild>,
    /// Comma-separated subset of weft,weft_release,envoy,nginx,haproxy (`direct` always runs:
    /// it is the baseline for added latency).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Where to write the JSON results [default: bench/results/proxy-load.json; quick:
    /// bench/results/tmp/proxy-load-quick.json, git-ignored so CI runs leave the tree clean].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Measure on the host's network namespace instead of a private one of the bench's own.
    /// On the host's loopback every packet also passes the host's firewall (here Docker's
    /// iptables chains and connection tracking), which taxes every target and the load
    /// generator alike; by default the targets, upstream and load generators run in a fresh
    /// namespace with only a loopback (needs root; without it the bench says so and uses the
    /// host's).
    #[arg(long)]
    host_network: bool,
    /// Internal: run as the upstream server with this many listeners.
    #[arg(long, hide = true)]
    serve_upstream: Option<usize>,
}

/// Resolved run settings.
struct Plan {
    repeats: usize,
    duration: Duration,
    warmup: Duration,
    rate: u32,
    connections: u32,
    proxy_core: usize,
    load_core: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(ports) = args.serve_upstream {
        return exit_on(weft_bench::upstream::serve(ports).map(|()| true));
    }
    exit_on(run(&args))
}

fn exit_on(result: Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("proxy-load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the bench; `Ok(false)` when weft could not be measured (the run still reports the rest).
fn run(args: &Args) -> Result<bool> {
    guard::stop_children_on_signal()?;
    let plan = plan(args)?;
    let wrk =
        install::ensure_apt("wrk", "wrk").context("the closed-loop load generator is required")?;
    let h2load = install::ensure_apt("h2load", "nghttp2-client")
        .context("the open-loop load generator is required")?;

    let mut missing = serde_json::Map::new();
    let mut versions = serde_json::Map::new();
    let mut ready: Vec<(Target, Option<PathBuf>)> = Vec::new();
    let weft_build = weft_build(args);
    for target in selected(args)? {
        match target.prepare(weft_build) {
            Ok(bin) => {
                let version = bin.as_deref().and_then(|b| target.version(b));
                versions.insert(target.name().into(), json!(version));
                ready.push((target, bin));
            }
            Err(e) => {
                eprintln!("{}: missing: {e:#}", target.name());
                missing.insert(target.name().into(), json!(format!("{e:#}")));
            }
        }
    }
    versions.insert("wrk".into(), json!(install::version_line(&wrk, &["-v"])));
    versions.insert(
        "h2load".into(),
        json!(install::version_line(&h2load, &["--version"])),
    );

    // After the installs and builds above, which may need the network.
    let network = network(args.host_network);
    let tmp = TempDir::new("weft-proxy-load")?;
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for repeat in 0..plan.repeats {
        for (target, bin) in rotated(&ready, repeat) {
            match measure(&plan, *target, bin.as_deref(), repeat, tmp.path()) {
                Ok(s) => {
                    eprintln!(
                        "repeat {}/{} {:<12} {:>8.0} req/s  p50 {:.3} ms  p99 {:.3} ms  {:>6.1} µs/req  idle {:.1} MiB",
                        repeat + 1,
                        plan.repeats,
                        target.name(),
                        s.rps,
                        s.p50_ms,
                        s.p99_ms,
                        s.cpu_us_per_req,
                        s.rss_idle_mib
                    );
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!(
                        "repeat {}/{} {}: FAILED: {e:#}",
                        repeat + 1,
                        plan.repeats,
                        target.name()
                    );
                    failures.push(json!({"target": target.name(), "repeat": repeat, "error": format!("{e:#}")}));
                }
            }
        }
    }

    report::fill_added_latency(&mut samples);
    let summary = Summary::new(&samples);
    let checks = report::checks(&summary);
    println!("\n{}", summary.table());
    println!("{}", report::checks_table(&checks));
    let ratios = report::ratios(&summary);
    if let Some(ceiling) = ratios[report::CEILING].as_f64() {
        println!(
            "ceiling: the load core alone (direct) does {ceiling:.2}x Envoy's rps; no proxy can measure above that ratio here"
        );
    }
    if !missing.is_empty() || !failures.is_empty() {
        println!(
            "missing: {:?}; failed runs: {}",
            missing.keys().collect::<Vec<_>>(),
            failures.len()
        );
    }

    let doc = json!({
        "bench": "proxy-load",
        "machine": workspace::machine(),
        "settings": settings(&plan, args.quick, weft_build, &network),
        "versions": versions,
        "summary": summary.to_json(),
        "ratios": ratios,
        "targets": report::checks_json(&checks),
        "missing": missing,
        "failures": failures,
        "repeats": samples.iter().map(report::sample_json).collect::<Vec<_>>(),
        "notes": NOTES,
    });
    let out = args.out.clone().unwrap_or_else(|| default_out(args.quick));
    workspace::write_json(&out, &doc)?;
    println!("wrote {}", out.display());

    let weft_wanted = selected(args)?.contains(&Target::Weft);
    let weft_measured = samples.iter().filter(|s| s.target == Target::Weft).count();
    Ok(!weft_wanted || weft_measured == plan.repeats)
}

/// Explanations stored with the numbers, so the JSON reads on its own.
const NOTES: &[&str] = &[
    "rps: closed loop, wrk -t1 with --connections connections for --duration s, after a warm-up",
    "p50_ms/p99_ms: open loop, h2load --h1 at --rate req/s spread over --connections connections; *_added_ms subtract direct of the same repeat",
    "cpu_us_per_req: utime+stime of the measured process tree during the closed loop / requests completed; cpu_busy: the same CPU time / wall time (1.0 = its core was saturated, so it was the bottleneck); foreign_cpu: machine busy time (/proc/stat, incl. irq/softirq/steal) not used by the bench and its children / wall time, in cores, the larger of the two load phases: a noise indicator",
    "rss_idle_mib: sum of VmRSS of the process tree after start-up, before load; rss_peak_mib: sum of VmHWM after both phases",
    "direct: the load generator straight to the upstream; its cpu/rss are the upstream server's own",
    "summary holds medians over repeats; summary.*.range holds [min, max]",
];

/// CPU (in cores) used outside the bench above which a sample is flagged.
const NOISY: f64 = 0.10;

/// One target in one repeat: fresh upstream, fresh proxy, idle RSS, warm-up, closed loop with
/// CPU accounting, open loop, peak RSS.
fn measure(
    plan: &Plan,
    target: Target,
    bin: Option<&Path>,
    repeat: usize,
    tmp: &Path,
) -> Result<Sample> {
    let upstream = Upstream::start(plan.load_core, 2)?;
    let mut running = target.start(bin, &upstream, plan.proxy_core, tmp)?;
    std::thread::sleep(Duration::from_millis(300));
    let idle = read_usage(&running)?;

    let listen = running.listen;
    let wrk = |duration| load::wrk(plan.load_core, listen, plan.connections, duration);
    wrk(plan.warmup)?;
    let (closed, closed_cpu) = during(&running, &upstream, || wrk(plan.duration))?;
    let log = tmp.join(format!("h2load-{}.tsv", target.name()));
    let (open, open_cpu) = during(&running, &upstream, || {
        load::h2load(
            plan.load_core,
            listen,
            plan.rate,
            plan.connections,
            plan.duration,
            &log,
        )
    })?;

    let peak = read_usage(&running)?;
    running.check_alive()?;
    let foreign = closed_cpu
        .foreign
        .into_iter()
        .chain(open_cpu.foreign)
        .reduce(f64::max);
    warn_if_noisy(plan, target, foreign, &open);

    let per_request = |cpu_s: f64| cpu_s * 1e6 / closed.requests.max(1) as f64;
    Ok(Sample {
        target,
        repeat,
        rps: closed.rps,
        requests: closed.requests,
        closed_loop_errors: closed.errors,
        open_loop_rps: open.achieved_rps,
        p50_ms: open.p50_ms,
        p99_ms: open.p99_ms,
        open_loop_errors: open.errors,
        p50_added_ms: None,
        p99_added_ms: None,
        cpu_us_per_req: per_request(closed_cpu.cpu_s),
        cpu_busy: closed_cpu.cpu_s / closed_cpu.wall_s,
        foreign_cpu: foreign,
        upstream_cpu_us_per_req: per_request(closed_cpu.upstream_cpu_s),
        rss_idle_mib: idle.rss_mib,
        rss_peak_mib: peak.hwm_mib,
        variant_a_share: running.variant_a_share().transpose()?,
    })
}

/// Runs one load phase and reads the CPU spent during it.
fn during<T>(
    running: &Running,
    upstream: &Upstream,
    phase: impl FnOnce() -> Result<T>,
) -> Result<(T, PhaseCpu)> {
    let begun = Phase::begin(running, upstream)?;
    let out = phase()?;
    Ok((out, begun.end(running, upstream)?))
}

/// CPU readings taken when a load phase begins.
struct Phase {
    started: Instant,
    machine_busy_s: Option<f64>,
    own_cpu_s: f64,
    target_cpu_s: f64,
    upstream_cpu_s: f64,
}

/// CPU spent during a load phase.
struct PhaseCpu {
    wall_s: f64,
    /// CPU seconds of the measured process tree and of the upstream.
    cpu_s: f64,
    upstream_cpu_s: f64,
    /// CPU taken by anything outside the bench, in cores (a noise indicator).
    foreign: Option<f64>,
}

impl Phase {
    fn begin(running: &Running, upstream: &Upstream) -> Result<Self> {
        Ok(Self {
            started: Instant::now(),
            machine_busy_s: procfs::machine_busy_s(),
            own_cpu_s: procfs::own_cpu_s(),
            target_cpu_s: read_usage(running)?.cpu_s,
            upstream_cpu_s: usage_of(upstream.process.pid())?.cpu_s,
        })
    }

    fn end(self, running: &Running, upstream: &Upstream) -> Result<PhaseCpu> {
        let wall_s = self.started.elapsed().as_secs_f64();
        let machine_busy_s = procfs::machine_busy_s();
        let own_cpu_s = procfs::own_cpu_s() - self.own_cpu_s;
        let cpu_s = read_usage(running)?.cpu_s - self.target_cpu_s;
        Ok(PhaseCpu {
            wall_s,
            cpu_s,
            upstream_cpu_s: usage_of(upstream.process.pid())?.cpu_s - self.upstream_cpu_s,
            foreign: self
                .machine_busy_s
                .zip(machine_busy_s)
                .map(|(b, a)| (a - b - own_cpu_s) / wall_s),
        })
    }
}

/// Flags samples a shared machine or a slow generator made doubtful (they are kept: the
/// reader sees the flag in the JSON and the ranges).
fn warn_if_noisy(plan: &Plan, target: Target, foreign_cpu: Option<f64>, open: &load::OpenLoop) {
    let foreign = foreign_cpu.unwrap_or(0.0);
    if foreign > NOISY {
        eprintln!(
            "warning: {}: work outside the bench used {foreign:.2} cores meanwhile",
            target.name()
        );
    }
    if open.achieved_rps < 0.95 * f64::from(plan.rate) {
        eprintln!(
            "warning: {}: open loop reached {:.0} of {} req/s",
            target.name(),
            open.achieved_rps,
            plan.rate
        );
    }
}

fn read_usage(running: &Running) -> Result<procfs::Usage> {
    usage_of(running.measured_pid).with_context(|| format!("{} is gone", running.target.name()))
}

fn usage_of(pid: u32) -> Result<procfs::Usage> {
    procfs::usage(pid).with_context(|| format!("process {pid} is gone"))
}

fn plan(args: &Args) -> Result<Plan> {
    let duration = Duration::from_secs(args.duration.unwrap_or(if args.quick { 2 } else { 10 }));
    if duration.is_zero() || args.rate == 0 || args.connections == 0 {
        bail!("--duration, --rate and --connections must be positive");
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if cores < 2 {
        eprintln!(
            "only one core: proxy and load generator share core 0, numbers are not comparable to the README"
        );
    }
    Ok(Plan {
        repeats: args
            .repeats
            .unwrap_or(if args.quick { 1 } else { 3 })
            .max(1),
        warmup: if duration.as_secs() >= 10 {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(1)
        },
        duration,
        rate: args.rate,
        connections: args.connections,
        proxy_core: 0,
        load_core: usize::from(cores >= 2),
    })
}

fn weft_build(args: &Args) -> WeftBuild {
    args.weft_build.unwrap_or(if args.quick {
        WeftBuild::Release
    } else {
        WeftBuild::Pgo
    })
}

/// `direct` plus the `--only` subset (by default every peer, and `weft_release` when `weft` is
/// the profile-guided build), in report order.
fn selected(args: &Args) -> Result<Vec<Target>> {
    let Some(only) = &args.only else {
        let beside = weft_build(args) == WeftBuild::Pgo;
        return Ok(Target::ALL
            .into_iter()
            .filter(|t| *t != Target::WeftRelease || beside)
            .collect());
    };
    let wanted = only
        .iter()
        .map(|n| Target::from_name(n.trim()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Target::ALL
        .into_iter()
        .filter(|t| *t == Target::Direct || wanted.contains(t))
        .collect())
}

/// The targets rotated by `repeat`, so no target is always first (or last) after a change.
fn rotated<T>(items: &[T], repeat: usize) -> impl Iterator<Item = &T> {
    let k = if items.is_empty() {
        0
    } else {
        repeat % items.len()
    };
    items[k..].iter().chain(&items[..k])
}

/// Enters a private network namespace unless told not to; says which network was used.
fn network(host_network: bool) -> String {
    if host_network {
        return "host: the host's network namespace (--host-network)".into();
    }
    match weft_bench::netns::enter_private() {
        Ok(()) => "private: a network namespace of the bench's own, loopback only".into(),
        Err(e) => {
            eprintln!("proxy-load: measuring on the host's loopback instead: {e:#}");
            format!("host: a private namespace was refused ({e:#})")
        }
    }
}

fn settings(plan: &Plan, quick: bool, weft_build: WeftBuild, network: &str) -> Value {
    json!({
        "network": network,
        "quick": quick,
        "repeats": plan.repeats,
        "duration_s": plan.duration.as_secs(),
        "warmup_s": plan.warmup.as_secs(),
        "rate_rps": plan.rate,
        "connections": plan.connections,
        "proxy_core": plan.proxy_core,
        "load_core": plan.load_core,
        "upstream": format!("hyper HTTP/1.1, {}-byte body, keep-alive, on the load core", weft_bench::upstream::BODY.len()),
        // `weft` is this workspace's build named here, unless weft_proxy_bin names another
        // binary measured in its place (an A/B against an older commit's build).
        "weft_build": match weft_build {
            WeftBuild::Pgo => "pgo: scripts/pgo-build.sh (fat LTO, 1 codegen unit, profile from scripts/pgo/training.yaml's load)",
            WeftBuild::Release => "release: cargo build --release (thin LTO, 4 codegen units)",
        },
        "weft_proxy_bin": std::env::var("WEFT_PROXY_BIN").ok(),
    })
}

fn default_out(quick: bool) -> PathBuf {
    workspace::results_path(
        if quick {
            "proxy-load-quick.json"
        } else {
            "proxy-load.json"
        },
        quick,
    )
}

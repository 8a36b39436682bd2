//! proxy-load: weft-proxy against Envoy, nginx and HAProxy on one machine, one core each side.
//!
//! Every proxy runs one worker pinned to core 0; the upstream and the load generators share
//! core 1. Per repeat each target (in a rotated order, so drifting machine noise is shared) gets a
//! fresh upstream and a fresh proxy, then: idle RSS, warm-up, closed-loop `wrk` (throughput and
//! CPU per request), open-loop `h2load` at a fixed rate (p50/p99), peak RSS. All of it runs in a
//! network namespace of the bench's own (`netns`), away from the host's firewall.
//!
//! The mTLS scenario (`--scenario mtls`, issue 38) runs after it on the same peers: weft and
//! Envoy as two sidecars each with mutual TLS between them, nginx and HAProxy terminating TLS;
//! closed-loop throughput and CPU per request, then new TLS connections per second from the
//! bench's handshake generator. See bench/README.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};

use weft_bench::guard::{self, TempDir};
use weft_bench::mtls::{self, handshake, report::MtlsSample};
use weft_bench::peers::{Running, Target, WeftBuild};
use weft_bench::phase::{self, PhaseCpu, during};
use weft_bench::report::{self, Closed, Sample, Summary};
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
    /// Which scenario to run: `plain` (HTTP/1.1 through one proxy), `mtls` (weft and Envoy as
    /// two sidecars with mutual TLS between them, nginx and HAProxy terminating TLS) or both.
    /// A run of one scenario keeps the other's results already in the output file.
    #[arg(long, value_enum, default_value_t = Scenario::Both)]
    scenario: Scenario,
    /// Internal: run as the upstream server with this many listeners.
    #[arg(long, hide = true)]
    serve_upstream: Option<usize>,
    /// Internal: run as the handshake generator (`ADDR,CONCURRENCY,MILLIS,PKI_DIR`).
    #[arg(long, hide = true)]
    handshake_load: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Plain,
    Mtls,
    Both,
}

impl Scenario {
    fn plain(self) -> bool {
        self != Scenario::Mtls
    }

    fn mtls(self) -> bool {
        self != Scenario::Plain
    }
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
    if let Some(spec) = &args.handshake_load {
        return exit_on(handshake::serve(spec).map(|()| true));
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
    let h2load = if args.scenario.plain() {
        Some(
            install::ensure_apt("h2load", "nghttp2-client")
                .context("the open-loop load generator is required")?,
        )
    } else {
        None
    };

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
    if let Some(h2load) = &h2load {
        versions.insert(
            "h2load".into(),
            json!(install::version_line(h2load, &["--version"])),
        );
    }

    // After the installs and builds above, which may need the network.
    let network = network(args.host_network);
    let tmp = TempDir::new("weft-proxy-load")?;
    let settings = settings(&plan, args, weft_build, &network);
    let mut doc = json!({
        "bench": "proxy-load",
        "machine": workspace::machine(),
        "settings": settings,
        "versions": versions,
        "summary": {},
    });
    let weft_wanted = selected(args)?.contains(&Target::Weft);
    let mut weft_ok = true;
    if args.scenario.plain() {
        let (plain, measured) = plain_scenario(&plan, &ready, tmp.path());
        weft_ok &= !weft_wanted || measured == plan.repeats;
        doc["missing"] = json!(missing);
        merge_into(&mut doc, plain);
    }
    if args.scenario.mtls() {
        let (part, measured) = mtls_scenario(&plan, &ready, tmp.path())?;
        weft_ok &= !weft_wanted || measured == plan.repeats;
        doc["summary"]["mtls"] = part.summary;
        doc["mtls"] = json!({
            "machine": doc["machine"],
            "settings": doc["settings"],
            "versions": doc["versions"],
            "ratios": part.ratios,
            "targets": part.targets,
            "missing": missing,
            "failures": part.failures,
            "repeats": part.repeats,
            "notes": mtls::report::NOTES,
        });
    }
    if !missing.is_empty() {
        println!("missing: {:?}", missing.keys().collect::<Vec<_>>());
    }

    let out = args.out.clone().unwrap_or_else(|| default_out(args.quick));
    let previous = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    workspace::write_json(&out, &merged(doc, previous, args.scenario))?;
    println!("wrote {}", out.display());
    Ok(weft_ok)
}

/// Copies every key of `part` into `doc` (objects are merged one level deep: `summary`).
fn merge_into(doc: &mut Value, part: Value) {
    let Value::Object(part) = part else { return };
    for (k, v) in part {
        match (&mut doc[&k], v) {
            (Value::Object(mine), Value::Object(theirs)) => mine.extend(theirs),
            (slot, v) => *slot = v,
        }
    }
}

/// The document to write: `doc`, plus what the scenario that did not run left in `previous`
/// (the file this run replaces), so a run of one scenario keeps the other's numbers.
fn merged(doc: Value, previous: Option<Value>, scenario: Scenario) -> Value {
    let Some(previous) = previous.filter(|p| p["bench"] == "proxy-load") else {
        return doc;
    };
    let (mut out, from) = match scenario {
        Scenario::Both => return doc,
        // The plaintext run's keys stay; the mTLS ones come from this run.
        Scenario::Mtls => (previous, doc),
        Scenario::Plain => (doc, previous),
    };
    if from["mtls"].is_null() {
        return out;
    }
    if !out["summary"].is_object() {
        out["summary"] = json!({});
    }
    out["summary"]["mtls"] = from["summary"]["mtls"].clone();
    out["mtls"] = from["mtls"].clone();
    out
}

/// The plaintext scenario: every target in every repeat; its part of the document and how many
/// repeats measured weft.
fn plain_scenario(plan: &Plan, ready: &[(Target, Option<PathBuf>)], tmp: &Path) -> (Value, usize) {
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for repeat in 0..plan.repeats {
        for (target, bin) in rotated(ready, repeat) {
            match measure(plan, *target, bin.as_deref(), repeat, tmp) {
                Ok(s) => {
                    eprintln!(
                        "repeat {}/{} {:<12} {:>8.0} req/s  p50 {:.3} ms  p99 {:.3} ms  {:>6.1} µs/req  idle {:.1} MiB",
                        repeat + 1,
                        plan.repeats,
                        target.name(),
                        s.closed.rps,
                        s.p50_ms,
                        s.p99_ms,
                        s.closed.cpu_us_per_req,
                        s.closed.rss_idle_mib
                    );
                    samples.push(s);
                }
                Err(e) => failures.push(failed(plan, *target, repeat, &e)),
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
    if !failures.is_empty() {
        println!("failed runs: {}", failures.len());
    }
    let weft_measured = samples.iter().filter(|s| s.target == Target::Weft).count();
    let part = json!({
        "summary": summary.to_json(),
        "ratios": ratios,
        "targets": report::checks_json(&checks),
        "failures": failures,
        "repeats": samples.iter().map(report::sample_json).collect::<Vec<_>>(),
        "notes": NOTES,
    });
    (part, weft_measured)
}

/// A failed measurement, said on stderr and kept for the JSON.
fn failed(plan: &Plan, target: Target, repeat: usize, e: &anyhow::Error) -> Value {
    eprintln!(
        "repeat {}/{} {}: FAILED: {e:#}",
        repeat + 1,
        plan.repeats,
        target.name()
    );
    json!({"target": target.name(), "repeat": repeat, "error": format!("{e:#}")})
}

/// The mTLS scenario's results, for the document.
struct MtlsPart {
    summary: Value,
    ratios: Value,
    targets: Value,
    failures: Vec<Value>,
    repeats: Vec<Value>,
}

/// The mTLS scenario: certificates, then every target but `direct` in every repeat (rotated);
/// its results and how many repeats measured weft.
fn mtls_scenario(
    plan: &Plan,
    ready: &[(Target, Option<PathBuf>)],
    tmp: &Path,
) -> Result<(MtlsPart, usize)> {
    mtls::pki::generate(tmp).context("making the mTLS scenario's certificates")?;
    let targets: Vec<(Target, &Path)> = ready
        .iter()
        .filter_map(|(t, bin)| Some((*t, bin.as_deref()?)))
        .collect();
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for repeat in 0..plan.repeats {
        for &(target, bin) in rotated(&targets, repeat) {
            match measure_mtls(plan, target, bin, repeat, tmp) {
                Ok(s) => {
                    eprintln!(
                        "mtls repeat {}/{} {:<12} {:>8.0} req/s  {:>6.1} µs/req  {:>6.0} handshakes/s ({} errors; {}, {} hello retries)",
                        repeat + 1,
                        plan.repeats,
                        target.name(),
                        s.closed.rps,
                        s.closed.cpu_us_per_req,
                        s.handshakes_per_s,
                        s.handshake_errors,
                        s.handshake_negotiated.as_deref().unwrap_or("-"),
                        s.handshake_hello_retries
                    );
                    samples.push(s);
                }
                Err(e) => failures.push(failed(plan, target, repeat, &e)),
            }
        }
    }
    let summary = mtls::report::summary(&samples);
    let checks = mtls::report::checks(&summary);
    println!("\nmTLS scenario (nginx, haproxy: TLS termination only)\n{}", summary.table());
    println!("{}", report::checks_table(&checks));
    if !failures.is_empty() {
        println!("mtls: failed runs: {}", failures.len());
    }
    let weft_measured = samples.iter().filter(|s| s.target == Target::Weft).count();
    let part = MtlsPart {
        summary: summary.to_json(),
        ratios: mtls::report::ratios(&summary),
        targets: report::checks_json(&checks),
        failures,
        repeats: samples.iter().map(mtls::report::sample_json).collect(),
    };
    Ok((part, weft_measured))
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
    let mut running = target.start(false, bin, &upstream, plan.proxy_core, tmp)?;
    let first = closed_loop(plan, &running, &upstream)?;
    let log = tmp.join(format!("h2load-{}.tsv", target.name()));
    let (open, open_cpu) = during(&running.measured_pids, &upstream, || {
        load::h2load(
            plan.load_core,
            running.listen,
            plan.rate,
            plan.connections,
            plan.duration,
            &log,
        )
    })?;
    let closed = first.finish(&mut running, &open_cpu)?;
    if open.achieved_rps < 0.95 * f64::from(plan.rate) {
        eprintln!(
            "warning: {}: open loop reached {:.0} of {} req/s",
            target.name(),
            open.achieved_rps,
            plan.rate
        );
    }
    Ok(Sample {
        target,
        repeat,
        closed,
        open_loop_rps: open.achieved_rps,
        p50_ms: open.p50_ms,
        p99_ms: open.p99_ms,
        open_loop_errors: open.errors,
        p50_added_ms: None,
        p99_added_ms: None,
        variant_a_share: running.variant_a_share().transpose()?,
    })
}

/// One target in one repeat of the mTLS scenario: fresh upstream, fresh proxies (a pair of
/// sidecars, or a terminator), idle RSS, warm-up, closed loop with CPU accounting (every proxy
/// process), handshakes against the TLS server (its CPU), peak RSS.
fn measure_mtls(
    plan: &Plan,
    target: Target,
    bin: &Path,
    repeat: usize,
    tmp: &Path,
) -> Result<MtlsSample> {
    let upstream = Upstream::start(plan.load_core, 1)?;
    let mut running = target.start(true, Some(bin), &upstream, plan.proxy_core, tmp)?;
    let (tls_addr, tls_pid) = running
        .tls_server
        .context("the mTLS scenario's peer has no TLS server")?;
    let first = closed_loop(plan, &running, &upstream)?;
    let (hs, hs_cpu) = during(&[tls_pid], &upstream, || {
        handshake::run(
            plan.load_core,
            tls_addr,
            plan.connections,
            plan.duration,
            tmp,
        )
    })?;
    let closed = first.finish(&mut running, &hs_cpu)?;
    if hs.errors > 0 {
        eprintln!(
            "warning: {}: {} failed handshake exchanges (first: {})",
            target.name(),
            hs.errors,
            hs.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(MtlsSample {
        target,
        repeat,
        closed,
        handshakes_per_s: hs.per_second(),
        handshakes: hs.completed,
        handshake_errors: hs.errors,
        handshake_error: hs.first_error.clone(),
        handshake_server_cpu_us: hs_cpu.cpu_s * 1e6 / hs.completed.max(1) as f64,
        handshake_server_cpu_busy: hs_cpu.cpu_s / hs_cpu.wall_s,
        handshake_client_cpu_busy: hs.cpu_s / hs.wall_s.max(1e-9),
        handshake_hello_retries: hs.hello_retries,
        handshake_negotiated: hs.negotiated.clone(),
    })
}

/// The first phases of either scenario, on a started target.
struct FirstPhases {
    idle: procfs::Usage,
    closed: load::ClosedLoop,
    cpu: PhaseCpu,
}

/// Idle RSS 300 ms after start-up, a warm-up, then the closed loop with the CPU of every
/// measured process.
fn closed_loop(plan: &Plan, running: &Running, upstream: &Upstream) -> Result<FirstPhases> {
    std::thread::sleep(Duration::from_millis(300));
    let idle = phase::usage_of(&running.measured_pids)?;
    let url = running.url();
    let wrk = |duration| load::wrk(plan.load_core, &url, plan.connections, duration);
    wrk(plan.warmup)?;
    let (closed, cpu) = during(&running.measured_pids, upstream, || wrk(plan.duration))?;
    Ok(FirstPhases { idle, closed, cpu })
}

impl FirstPhases {
    /// After the last phase (`last`): peak RSS, the target still alive, the noise of the
    /// noisier phase; the closed-loop numbers.
    fn finish(self, running: &mut Running, last: &PhaseCpu) -> Result<Closed> {
        let peak = phase::usage_of(&running.measured_pids)?;
        running.check_alive()?;
        let foreign = self.cpu.foreign.into_iter().chain(last.foreign).reduce(f64::max);
        warn_if_noisy(running.target, foreign);
        let per_request = |cpu_s: f64| cpu_s * 1e6 / self.closed.requests.max(1) as f64;
        Ok(Closed {
            rps: self.closed.rps,
            requests: self.closed.requests,
            closed_loop_errors: self.closed.errors,
            cpu_us_per_req: per_request(self.cpu.cpu_s),
            cpu_busy: self.cpu.cpu_s / self.cpu.wall_s,
            foreign_cpu: foreign,
            upstream_cpu_us_per_req: per_request(self.cpu.upstream_cpu_s),
            rss_idle_mib: self.idle.rss_mib,
            rss_peak_mib: peak.hwm_mib,
        })
    }
}

/// Flags samples a shared machine made doubtful (they are kept: the reader sees the flag in
/// the JSON and the ranges).
fn warn_if_noisy(target: Target, foreign_cpu: Option<f64>) {
    let foreign = foreign_cpu.unwrap_or(0.0);
    if foreign > NOISY {
        eprintln!(
            "warning: {}: work outside the bench used {foreign:.2} cores meanwhile",
            target.name()
        );
    }
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

fn settings(plan: &Plan, args: &Args, weft_build: WeftBuild, network: &str) -> Value {
    json!({
        "network": network,
        "quick": args.quick,
        "scenario": format!("{:?}", args.scenario).to_lowercase(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_doc(rps: f64) -> Value {
        json!({"bench": "proxy-load", "settings": {"scenario": "plain"}, "summary": {"weft": {"rps": rps}}, "ratios": {"x": 1}})
    }

    fn mtls_doc(rps: f64) -> Value {
        json!({"bench": "proxy-load", "settings": {"scenario": "mtls"}, "summary": {"mtls": {"weft": {"rps": rps}}}, "mtls": {"ratios": {"y": 2}}})
    }

    /// A run of one scenario keeps the other scenario's numbers from the file it replaces.
    #[test]
    fn one_scenario_keeps_the_others_results() {
        let kept = merged(mtls_doc(2.0), Some(plain_doc(1.0)), Scenario::Mtls);
        assert_eq!(kept["summary"]["weft"]["rps"], json!(1.0));
        assert_eq!(kept["summary"]["mtls"]["weft"]["rps"], json!(2.0));
        assert_eq!(kept["ratios"]["x"], json!(1));
        assert_eq!(kept["mtls"]["ratios"]["y"], json!(2));
        assert_eq!(kept["settings"]["scenario"], json!("plain"), "the plaintext run's settings");

        let both = merged(mtls_doc(2.0), Some(plain_doc(1.0)), Scenario::Mtls);
        let again = merged(plain_doc(3.0), Some(both), Scenario::Plain);
        assert_eq!(again["summary"]["weft"]["rps"], json!(3.0));
        assert_eq!(again["summary"]["mtls"]["weft"]["rps"], json!(2.0));

        let fresh = merged(plain_doc(3.0), Some(mtls_doc(2.0)), Scenario::Both);
        assert!(fresh["mtls"].is_null());
        assert_eq!(merged(mtls_doc(2.0), None, Scenario::Mtls), mtls_doc(2.0));
        let other = json!({"bench": "other"});
        assert_eq!(merged(plain_doc(1.0), Some(other), Scenario::Plain), plain_doc(1.0));
    }

    #[test]
    fn a_part_merges_into_the_document() {
        let mut doc = json!({"bench": "proxy-load", "summary": {"mtls": {"a": 1}}});
        merge_into(&mut doc, json!({"summary": {"weft": {"rps": 1}}, "ratios": {}}));
        assert_eq!(doc["summary"]["mtls"]["a"], json!(1));
        assert_eq!(doc["summary"]["weft"]["rps"], json!(1));
        assert!(doc["ratios"].is_object());
    }
}

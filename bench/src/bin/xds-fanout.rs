//! xds-fanout: how long a committed config change takes to reach N sidecars, and what N
//! sidecars cost the control node in memory.
//!
//! N simulated sidecars ([`weft_bench::xds_clients`]: in-process ADS clients, one TCP
//! connection and one node id each) connect to one control node running as a separate process,
//! so its RSS is its own: `weft-control` built from this workspace (one node, `--init`), or with
//! `--stand-in` the [`StandIn`] (weft-xds's cache and ADS server without Raft or REST). Per N:
//! the control node's RSS before any sidecar connects; the fleet connects (a bounded number at a
//! time) and ACKs the initial config; RSS again; then a series of changes, each timed from the
//! instant before it is triggered to the instant the last sidecar ACKs it. See bench/README.md.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use hyper::Method;
use serde_json::{Map, Value, json};
use tokio::runtime::{Handle, Runtime};
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use weft_bench::guard::{self, TempDir};
use weft_bench::raft_clusters::{Cluster, request_json};
use weft_bench::report::{self, Check};
use weft_bench::stats::percentile;
use weft_bench::xds_clients::{Convergence, Fleet, FleetOptions};
use weft_bench::{install, procfs, workspace};
use weft_control::resources::{self, Kind, XdsBuilder};
use weft_control::store::Resource;
use weft_xds::{AdsServer, Cache, Resources};

/// Time a config change takes to reach every sidecar over xDS, for N = 1,000 and 10,000.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 200 and 1,000 sidecars, 5 changes each, well under a minute.
    #[arg(long)]
    quick: bool,
    /// Fleet sizes, comma-separated [default: 1000,10000; quick: 200,1000].
    #[arg(long, value_delimiter = ',')]
    sidecars: Option<Vec<usize>>,
    /// Timed changes per fleet size [default: 20; quick: 5].
    #[arg(long)]
    changes: Option<usize>,
    /// Pause before each change, ms: the previous push's aftermath (server and client
    /// bookkeeping) is over, so each change starts from a quiet fleet.
    #[arg(long, default_value_t = 500)]
    pause_ms: u64,
    /// Sidecars connecting at once while the fleet comes up.
    #[arg(long, default_value_t = 200)]
    connect_concurrency: usize,
    /// The control node's debounce window, ms (weft-control's `--xds-debounce-ms`: how long
    /// each stream waits after a commit for more commits before it pushes; part of every
    /// measured latency).
    #[arg(long, default_value_t = 10)]
    debounce_ms: u64,
    /// Run against the stand-in control node (weft-xds's cache and ADS server in a child
    /// process: no Raft, no REST API) instead of weft-control, for comparison.
    #[arg(long)]
    stand_in: bool,
    /// Use this weft-control binary instead of building target/release/weft-control (to
    /// compare two builds on the same machine; the JSON records its `--version`).
    #[arg(long, conflicts_with = "stand_in")]
    weft_control: Option<PathBuf>,
    /// Where to write the JSON results [default: bench/results/xds-fanout.json; quick:
    /// bench/results/tmp/xds-fanout.json, git-ignored so CI runs leave the tree clean].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: run as the stand-in control node, serving xDS on this address.
    #[arg(long, hide = true)]
    serve_xds: Option<SocketAddr>,
}

/// Resolved run settings.
struct Plan {
    control: Control,
    quick: bool,
    sizes: Vec<usize>,
    changes: usize,
    pause: Duration,
    connect_concurrency: usize,
    debounce: Duration,
}

/// Quiet time after the control node starts and after the fleet connects, before reading RSS.
const SETTLE: Duration = Duration::from_millis(500);
/// Longest wait for one change to reach the whole fleet before the run is declared failed.
const CHANGE_PATIENCE: Duration = Duration::from_secs(60);
/// Open files a process needs beyond one socket per sidecar (stdio, listener, runtime, /proc).
const FD_SLACK: u64 = 256;
/// Set in the environment of a re-run with a raised open-file limit (so it never loops).
const FD_RAISED_ENV: &str = "WEFT_BENCH_FD_RAISED";

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(addr) = args.serve_xds {
        return exit_on(serve(addr, Duration::from_millis(args.debounce_ms)));
    }
    let plan = plan(&args);
    if plan.sizes.is_empty() {
        return exit_on(Err(anyhow::anyhow!("--sidecars: no fleet size above 0")));
    }
    let needed = plan.sizes.iter().copied().max().unwrap_or(0) as u64 + FD_SLACK;
    match ensure_open_files(needed) {
        Ok(None) => exit_on(run(&plan, &args)),
        Ok(Some(code)) => code,
        Err(e) => exit_on(Err(e)),
    }
}

fn exit_on(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xds-fanout: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn plan(args: &Args) -> Plan {
    let sizes = args.sidecars.clone().unwrap_or_else(|| {
        if args.quick {
            vec![200, 1000]
        } else {
            vec![1000, 10_000]
        }
    });
    Plan {
        control: if args.stand_in {
            Control::StandIn
        } else {
            Control::Weft
        },
        quick: args.quick,
        sizes: sizes.into_iter().filter(|&n| n > 0).collect(),
        changes: args
            .changes
            .unwrap_or(if args.quick { 5 } else { 20 })
            .max(1),
        pause: Duration::from_millis(args.pause_ms),
        connect_concurrency: args.connect_concurrency.max(1),
        debounce: Duration::from_millis(args.debounce_ms),
    }
}

/// What one fleet size measured.
struct Run {
    sidecars: usize,
    connect: Duration,
    changes: Vec<Convergence>,
    /// Per change: from the same instant as its fan-out time until it was committed.
    commits: Vec<Duration>,
    rss_before_mib: f64,
    rss_connected_mib: f64,
    rss_after_mib: f64,
    hwm_mib: f64,
    /// CPU over the timed changes (pauses included).
    cpu: CpuSpent,
}

/// A run's reported figures, computed once for the table, the JSON and the checks.
struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Median over changes of the time until half the sidecars ACKed.
    median_sidecar_ms: f64,
    /// Median over changes of the time until the change was committed.
    commit_ms: f64,
    /// Control-node memory per 1,000 connected sidecars: growth from before the first
    /// connection to after the fleet ACKed its first config.
    rss_mib_per_1k: f64,
    control_cpu_ms_per_change: f64,
    sidecars_cpu_ms_per_change: f64,
}

impl Run {
    fn figures(&self) -> Figures {
        let sorted_ms = |durations: &mut dyn Iterator<Item = Duration>| {
            let mut v: Vec<f64> = durations.map(|d| d.as_secs_f64() * 1e3).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let all = sorted_ms(&mut self.changes.iter().map(|c| c.all));
        let median =
            |durations: &mut dyn Iterator<Item = Duration>| percentile(&sorted_ms(durations), 0.5);
        let per_change = |s: f64| s * 1e3 / self.changes.len() as f64;
        Figures {
            p50_ms: percentile(&all, 0.5),
            p99_ms: percentile(&all, 0.99),
            max_ms: percentile(&all, 1.0),
            median_sidecar_ms: median(&mut self.changes.iter().map(|c| c.half)),
            commit_ms: median(&mut self.commits.iter().copied()),
            rss_mib_per_1k: (self.rss_connected_mib - self.rss_before_mib) / self.sidecars as f64
                * 1000.0,
            control_cpu_ms_per_change: per_change(self.cpu.control_s),
            sidecars_cpu_ms_per_change: per_change(self.cpu.sidecars_s),
        }
    }

    fn key(&self) -> String {
        format!("n{}", self.sidecars)
    }

    fn summary_json(&self) -> Value {
        let f = self.figures();
        json!({
            "p50_ms": r(f.p50_ms, 1),
            "p99_ms": r(f.p99_ms, 1),
            "max_ms": r(f.max_ms, 1),
            "median_sidecar_p50_ms": r(f.median_sidecar_ms, 1),
            "commit_p50_ms": r(f.commit_ms, 1),
            "rss_mib_per_1k": r(f.rss_mib_per_1k, 2),
            "rss_before_mib": r(self.rss_before_mib, 1),
            "rss_connected_mib": r(self.rss_connected_mib, 1),
            "rss_after_changes_mib": r(self.rss_after_mib, 1),
            "hwm_mib": r(self.hwm_mib, 1),
            "connect_s": r(self.connect.as_secs_f64(), 2),
            "control_cpu_ms_per_change": r(f.control_cpu_ms_per_change, 1),
            "sidecars_cpu_ms_per_change": r(f.sidecars_cpu_ms_per_change, 1),
            "foreign_cpu": self.cpu.foreign_cores.map(|c| r(c, 3)),
        })
    }

    fn changes_json(&self) -> Value {
        let ms = |d: Duration| r(d.as_secs_f64() * 1e3, 2);
        json!({
            "all_ms": self.changes.iter().map(|c| ms(c.all)).collect::<Vec<_>>(),
            "median_sidecar_ms": self.changes.iter().map(|c| ms(c.half)).collect::<Vec<_>>(),
            "commit_ms": self.commits.iter().map(|&d| ms(d)).collect::<Vec<_>>(),
        })
    }
}

fn run(plan: &Plan, args: &Args) -> Result<()> {
    // weft-control runs in its own process group: stop it if the bench is interrupted.
    guard::stop_children_on_signal()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Built (or found up to date) once, before anything is timed.
    let weft_control = match plan.control {
        Control::Weft => Some(match &args.weft_control {
            Some(bin) => bin.clone(),
            None => workspace::release_bin("weft-control")
                .context("building weft-control")?,
        }),
        Control::StandIn => None,
    };
    let mut runs = Vec::new();
    for &sidecars in &plan.sizes {
        eprintln!("== {sidecars} sidecars, {}", plan.control.name());
        // A fresh control node per fleet size, so each RSS baseline is a fresh process.
        let mut control: Box<dyn ControlNode> = match &weft_control {
            Some(bin) => Box::new(WeftControl::start(bin, rt.handle(), plan.debounce)?),
            None => Box::new(StandIn::start(plan.debounce)?),
        };
        let run = measure(plan, &rt, sidecars, control.as_mut())
            .with_context(|| format!("{sidecars} sidecars"))?;
        runs.push(run);
    }

    let checks = checks(&runs);
    println!("\n{}", table(&runs));
    println!("{}", report::checks_table(&checks));

    let doc = json!({
        "bench": "xds-fanout",
        "machine": workspace::machine(),
        "settings": {
            "quick": plan.quick,
            "sidecars": plan.sizes,
            "changes": plan.changes,
            "pause_ms": plan.pause.as_millis() as u64,
            "connect_concurrency": plan.connect_concurrency,
            "debounce_ms": plan.debounce.as_millis() as u64,
            "control_node": plan.control.name(),
            "control_node_setup": plan.control.description(),
            "control_node_binary": weft_control.as_deref().map(|bin| bin.display().to_string()),
            "control_node_version": weft_control
                .as_deref()
                .and_then(|bin| install::version_line(bin, &["--version"])),
            "mesh": MESH_DESCRIPTION,
        },
        "summary": runs.iter().map(|r| (r.key(), r.summary_json())).collect::<Map<_, _>>(),
        "targets": report::checks_json(&checks),
        "changes": runs.iter().map(|r| (r.key(), r.changes_json())).collect::<Map<_, _>>(),
        "notes": NOTES.iter().chain([&plan.control.change_note()]).collect::<Vec<_>>(),
    });
    let out = args.out.clone().unwrap_or_else(|| default_out(plan.quick));
    workspace::write_json(&out, &doc)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Explanations stored with the numbers, so the JSON reads on its own.
const NOTES: &[&str] = &[
    "p50_ms/p99_ms/max_ms: over the timed changes, each from the instant before the change was triggered to the instant the last sidecar handed its ACK of the new cluster version to its gRPC stream; with fewer than 100 changes p99 is the slowest change (nearest rank)",
    "median_sidecar_p50_ms: the same, until half the sidecars had ACKed (median over changes)",
    "commit_p50_ms: the same, until the change was committed (weft-control: the PUT's response arrived; stand-in: the child confirmed its cache.set), median over changes; part of p50_ms",
    "rss_mib_per_1k: (control node VmRSS after the fleet connected and ACKed its first config - VmRSS before any sidecar connected) / sidecars * 1000",
    "control_cpu_ms_per_change / sidecars_cpu_ms_per_change: CPU (utime+stime) of the control node and of the bench process (all sidecars) during the timed changes, per change; both share the machine's cores; foreign_cpu: machine busy time (/proc/stat) not used by the bench or the control node over that window, in cores (a noise indicator; > 0.1 is flagged)",
    "every sidecar has its own TCP connection and node id, subscribes (SotW ADS) to Cluster, Endpoints, Experiment and Service, decodes every resource and ACKs through weft_xds::subscription::SotwClient",
];

/// Connects `sidecars` sidecars to a freshly started `control` and times the changes.
fn measure(
    plan: &Plan,
    rt: &Runtime,
    sidecars: usize,
    control: &mut dyn ControlNode,
) -> Result<Run> {
    std::thread::sleep(SETTLE);
    let before = usage(control.pid())?;

    let started = Instant::now();
    let options = FleetOptions {
        sidecars,
        connect_concurrency: plan.connect_concurrency,
        connect_patience: Duration::from_secs(60) + Duration::from_millis(10) * sidecars as u32,
    };
    let mut fleet = rt.block_on(Fleet::connect(control.xds_addr(), &options))?;
    let connect = started.elapsed();
    eprintln!("connected and synced in {:.2} s", connect.as_secs_f64());
    std::thread::sleep(SETTLE);
    let connected = usage(control.pid())?;

    let mark = CpuMark::now(control.pid())?;
    let mut changes = Vec::with_capacity(plan.changes);
    let mut commits = Vec::with_capacity(plan.changes);
    for i in 0..plan.changes {
        std::thread::sleep(plan.pause);
        let since = Instant::now();
        let revision = control.commit_change(i)?;
        commits.push(since.elapsed());
        let c = rt.block_on(fleet.converge(revision, since, CHANGE_PATIENCE))?;
        eprintln!(
            "change {}/{}: all {} sidecars ACKed in {:.1} ms (half in {:.1} ms)",
            i + 1,
            plan.changes,
            fleet.size(),
            c.all.as_secs_f64() * 1e3,
            c.half.as_secs_f64() * 1e3
        );
        changes.push(c);
    }
    let cpu = mark.spent(control.pid())?;
    if let Some(foreign) = cpu.foreign_cores.filter(|&c| c > NOISY) {
        eprintln!("warning: work outside the bench used {foreign:.2} cores during the changes");
    }
    let after = usage(control.pid())?;
    drop(fleet);
    Ok(Run {
        sidecars,
        connect,
        changes,
        commits,
        rss_before_mib: before.rss_mib,
        rss_connected_mib: connected.rss_mib,
        rss_after_mib: after.rss_mib,
        hwm_mib: after.hwm_mib,
        cpu,
    })
}

fn usage(pid: u32) -> Result<procfs::Usage> {
    procfs::usage(pid).with_context(|| format!("the control node (pid {pid}) is gone"))
}

/// CPU (in cores) used outside the bench above which a run is flagged as noisy.
const NOISY: f64 = 0.10;

/// CPU readings when the timed changes begin.
struct CpuMark {
    at: std::time::Instant,
    machine_busy_s: Option<f64>,
    own_s: f64,
    control_s: f64,
}

/// CPU spent over the timed changes.
struct CpuSpent {
    /// The control node's CPU seconds.
    control_s: f64,
    /// The bench process's own: the sidecars (orchestration is negligible).
    sidecars_s: f64,
    /// CPU taken by anything else on the machine, in cores (other work on a shared machine,
    /// interrupts, steal): a noise indicator.
    foreign_cores: Option<f64>,
}

impl CpuMark {
    fn now(control: u32) -> Result<Self> {
        Ok(CpuMark {
            at: std::time::Instant::now(),
            machine_busy_s: procfs::machine_busy_s(),
            own_s: procfs::own_cpu_s(),
            control_s: usage(control)?.cpu_s,
        })
    }

    fn spent(self, control: u32) -> Result<CpuSpent> {
        let wall_s = self.at.elapsed().as_secs_f64();
        let control_s = usage(control)?.cpu_s - self.control_s;
        // `own_cpu_s` counts live children, so it includes the control node.
        let own_s = procfs::own_cpu_s() - self.own_s;
        let foreign_cores = self
            .machine_busy_s
            .zip(procfs::machine_busy_s())
            .map(|(before, after)| (after - before - own_s) / wall_s);
        Ok(CpuSpent {
            control_s,
            sidecars_s: own_s - control_s,
            foreign_cores,
        })
    }
}

/// Which control node the sidecars connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    /// [`WeftControl`], the default.
    Weft,
    /// [`StandIn`] (`--stand-in`).
    StandIn,
}

impl Control {
    fn name(self) -> &'static str {
        match self {
            Control::Weft => "weft-control",
            Control::StandIn => "stand-in",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Control::Weft => WeftControl::DESCRIPTION,
            Control::StandIn => StandIn::DESCRIPTION,
        }
    }

    /// What a change is and what its timed interval includes (a note in the JSON).
    fn change_note(self) -> &'static str {
        match self {
            Control::Weft => {
                "change (weft-control): PUT /v1/clusters/svc0-a with the cluster's full spec and a new connect_timeout, on a fresh HTTP/1.1 connection; the timed interval starts right before the request is sent, so it includes the Raft commit on the 1-node cluster (one fsynced log append) and apply, the response, the publisher's rebuild and cache update, the debounce and the push; the sidecars must ACK a cluster version >= the revision in the PUT's response"
            }
            Control::StandIn => {
                "change (stand-in): one cache.set of the next revision, asked for by a line on the child's stdin; the timed interval starts right before that line is written (no Raft commit, no HTTP)"
            }
        }
    }
}

/// The control node under test, reduced to what the bench needs from it: [`WeftControl`], or
/// [`StandIn`] for comparison.
trait ControlNode {
    /// Where sidecars connect (ADS over gRPC).
    fn xds_addr(&self) -> SocketAddr;
    /// The process whose RSS and CPU are measured.
    fn pid(&self) -> u32;
    /// Commits change number `i` (a new cluster spec) and returns once it is committed, with
    /// the revision it was committed at.
    fn commit_change(&mut self, i: usize) -> Result<u64>;
}

/// The real control node: `weft-control --init` (a one-node cluster) with its data in a scratch
/// directory, loaded with [`mesh`] through the REST API. Dropping it stops the process (its
/// process group) and then removes the directory.
struct WeftControl {
    node: Cluster,
    xds: SocketAddr,
    /// Runs the HTTP requests (the bench's runtime).
    rt: Handle,
    /// Removed on drop, after [`Drop::drop`] stopped the node.
    _dir: TempDir,
}

impl WeftControl {
    const DESCRIPTION: &str = "weft-control built from this workspace (release), one node started with --init (a 1-node Raft cluster: each write is one fsynced redb append) and --xds-debounce-ms from --debounce-ms, other flags at their defaults, data dir in a scratch directory; the mesh is loaded with PUT /v1/{kind}/{name} before any sidecar connects";

    /// How long the node may take to publish the loaded mesh to its xDS cache.
    const PUBLISH_WITHIN: Duration = Duration::from_secs(10);

    /// Starts the node, waits for it to lead, loads the mesh and waits until the node's xDS
    /// cache holds it, so the first sidecar already gets the whole mesh.
    fn start(bin: &Path, rt: &Handle, debounce: Duration) -> Result<Self> {
        let dir = TempDir::new("weft-xds-fanout")?;
        let args = [
            "--xds-debounce-ms".to_string(),
            debounce.as_millis().to_string(),
        ];
        let node = rt
            .block_on(Cluster::start_weft_nodes(bin, &[], false, &args, dir.path(), 1))
            .context("starting weft-control")?;
        let (_, members) = rt.block_on(request_json(
            node.leader_api(),
            Method::GET,
            "/v1/members",
            "",
        ))?;
        let xds = members["members"][0]["xds_addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no xDS address in /v1/members: {members}"))?;
        let mut control = WeftControl {
            node,
            xds,
            rt: rt.clone(),
            _dir: dir,
        };
        let mut loaded = 0;
        for spec in mesh(0) {
            loaded = control.put(&spec)?;
        }
        control.wait_published(loaded)?;
        Ok(control)
    }

    /// `PUT /v1/{kind}/{name}`; the revision it was committed at. A spec the node refuses, that
    /// changes nothing, or that refers to a missing resource (which a sidecar would NACK) is an
    /// error.
    fn put(&mut self, spec: &Spec) -> Result<u64> {
        let path = format!("/v1/{}/{}", spec.kind.as_str(), spec.name);
        let answer = self.rt.block_on(request_json(
            self.node.leader_api(),
            Method::PUT,
            &path,
            &spec.spec.to_string(),
        ));
        let (status, body) = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.node.check_alive()?;
                return Err(e.context(format!("PUT {path}")));
            }
        };
        if status != 200 || body["changed"] != true {
            bail!("PUT {path}: HTTP {status} {body}");
        }
        if body["warnings"].as_array().is_some_and(|w| !w.is_empty()) {
            bail!("PUT {path}: {}", body["warnings"]);
        }
        body["revision"]
            .as_u64()
            .with_context(|| format!("PUT {path}: no revision in {body}"))
    }

    /// Polls `GET /v1/status` until the node's xDS cache is at `revision` or later.
    fn wait_published(&mut self, revision: u64) -> Result<()> {
        let deadline = std::time::Instant::now() + Self::PUBLISH_WITHIN;
        loop {
            self.node.check_alive()?;
            let (_, status) = self.rt.block_on(request_json(
                self.node.leader_api(),
                Method::GET,
                "/v1/status",
                "",
            ))?;
            if status["xds_revision"].as_u64() >= Some(revision) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                bail!(
                    "weft-control did not publish revision {revision} within {:?}: {status}",
                    Self::PUBLISH_WITHIN
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl ControlNode for WeftControl {
    fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    fn pid(&self) -> u32 {
        self.node.members[0].process.pid()
    }

    fn commit_change(&mut self, i: usize) -> Result<u64> {
        self.put(&cluster_spec(CHANGED_CLUSTER, 1 + i as u64))
    }
}

impl Drop for WeftControl {
    fn drop(&mut self) {
        // SIGTERM to the node's process group, SIGKILL 2 s later; `_dir` is removed after this.
        for member in &mut self.node.members {
            member.process.stop();
        }
    }
}

/// A stand-in control node: this binary re-run with `--serve-xds`, serving [`mesh`] from a
/// `weft_xds::Cache` through `weft_xds::AdsServer`, as weft-control's resource builder turns
/// it into xDS resources ([`StoredMesh`]). It takes `set REVISION` lines on stdin, publishes
/// that revision and answers `ok REVISION` once it is in the cache (committed: every stream is
/// woken). It exits when its stdin closes, so it cannot outlive the bench.
struct StandIn {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    xds: SocketAddr,
}

impl StandIn {
    const DESCRIPTION: &str = "stand-in for weft-control: weft_xds::Cache + AdsServer (the xDS server code weft-control uses) in a child process of the bench, serving the resources weft-control's XdsBuilder makes of the same mesh specs, default tonic settings, listen backlog 4096; no Raft, no REST API";

    fn start(debounce: Duration) -> Result<Self> {
        let mut child = Command::new(weft_bench::workspace::self_exe())
            .args([
                "--serve-xds",
                "127.0.0.1:0",
                "--debounce-ms",
                &debounce.as_millis().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the stand-in control node")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut node = StandIn {
            child,
            stdin,
            stdout,
            xds: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let line = node.read_line()?;
        node.xds = line
            .strip_prefix("xds ")
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("the control node said {line:?}, not its xDS address"))?;
        Ok(node)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the control node exited ({:?})", self.child.try_wait()?);
        }
        Ok(line.trim_end().to_string())
    }
}

impl ControlNode for StandIn {
    fn xds_addr(&self) -> SocketAddr {
        self.xds
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn commit_change(&mut self, i: usize) -> Result<u64> {
        let revision = FIRST_REVISION + 1 + i as u64;
        let stdin = self
            .stdin
            .as_mut()
            .context("the control node's stdin is closed")?;
        writeln!(stdin, "set {revision}")?;
        stdin.flush()?;
        let line = self.read_line()?;
        if line != format!("ok {revision}") {
            bail!("committing revision {revision}: the control node said {line:?}");
        }
        Ok(revision)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // EOF on stdin is the stop signal; SIGKILL if it has not exited 2 s later.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The stand-in's revision of the initial mesh; change `i` is committed at
/// `FIRST_REVISION + 1 + i`.
const FIRST_REVISION: u64 = 1;
/// Services in the mesh; each has an experiment with two variants, each variant its own
/// cluster with `ENDPOINTS_PER_CLUSTER` endpoints.
const SERVICES: usize = 8;
const ENDPOINTS_PER_CLUSTER: usize = 4;
/// Each variant's name and weight.
const VARIANTS: [(&str, u32); 2] = [("a", 90), ("b", 10)];
/// The cluster every change rewrites.
const CHANGED_CLUSTER: &str = "svc0-a";
const MESH_DESCRIPTION: &str = "8 services, each routed to an experiment with 2 weighted variants on 2 clusters of 4 endpoints (16 clusters, 16 Endpoints resources of 4, 8 experiments, 8 services), loaded as REST specs; each change sets cluster svc0-a's connect_timeout to a new value; the endpoints do not change, so only the Cluster type gets a new version and every sidecar gets one push (all 16 clusters: SotW) and sends one ACK; the time until that ACK is what is measured";

/// One resource of the mesh as weft-control's REST API takes it: `PUT /v1/{kind}/{name}`
/// with `spec` (a section of weft-proxy's config in JSON, see docs/control-api.md).
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    kind: Kind,
    name: String,
    spec: Value,
}

impl Spec {
    fn new(kind: Kind, name: &str, spec: Value) -> Self {
        Spec {
            kind,
            name: name.to_string(),
            spec,
        }
    }
}

/// Cluster `name` of [`mesh`] at `step`: the changing cluster's connect timeout is
/// 1001 + `step` ms, every other one's 1000 ms.
fn cluster_spec(name: &str, step: u64) -> Spec {
    let connect_ms = if name == CHANGED_CLUSTER {
        1001 + step
    } else {
        1000
    };
    Spec::new(
        Kind::Clusters,
        name,
        json!({ "connect_timeout": format!("{connect_ms}ms") }),
    )
}

/// The mesh at `step` (0: the initial config; change `i` is step `i + 1`): a small inference
/// mesh whose cluster `svc0-a` has a connect timeout of 1001 + `step` ms, so each step changes
/// that one spec. In load order: each cluster before its endpoints, clusters before the
/// experiments that split between them, experiments before the services that route to them,
/// so no write refers to a resource that does not exist yet (weft-control would accept it with
/// a warning, and a sidecar NACK the config until the reference resolves).
fn mesh(step: u64) -> Vec<Spec> {
    let services: Vec<String> = (0..SERVICES).map(|s| format!("svc{s}")).collect();
    let cluster = |service: &str, variant: &str| format!("{service}-{variant}");
    let mut specs = Vec::new();
    for (s, service) in services.iter().enumerate() {
        for (v, (variant, _)) in VARIANTS.iter().enumerate() {
            let name = cluster(service, variant);
            specs.push(cluster_spec(&name, step));
            let endpoints: Vec<Value> = (0..ENDPOINTS_PER_CLUSTER)
                .map(|e| json!({ "address": format!("10.0.{s}.{}:8000", e + 100 * v), "variant": variant }))
                .collect();
            specs.push(Spec::new(
                Kind::Endpoints,
                &name,
                json!({ "endpoints": endpoints }),
            ));
        }
    }
    for service in &services {
        let variants: Vec<Value> = VARIANTS
            .iter()
            .map(|(variant, weight)| {
                json!({ "name": variant, "cluster": cluster(service, variant), "weight": weight })
            })
            .collect();
        specs.push(Spec::new(
            Kind::Experiments,
            &format!("{service}-ab"),
            json!({ "salt": service, "variants": variants }),
        ));
    }
    for service in &services {
        specs.push(Spec::new(
            Kind::Services,
            service,
            json!({
                "hosts": [service],
                "routes": [{
                    "name": "default",
                    "match": { "path_prefix": "/" },
                    "experiment": format!("{service}-ab"),
                    "timeout": "30s",
                }],
            }),
        ));
    }
    specs
}

/// The stand-in's copy of what weft-control stores and serves for [`mesh`]: each write is
/// validated and normalized by weft-control's own code (once per changed spec, as its API
/// does) and versioned by the revision that wrote it, and its `XdsBuilder` (the publisher's)
/// makes the xDS resources.
#[derive(Default)]
struct StoredMesh {
    /// In [`mesh`]'s order: each spec as written and as stored.
    stored: Vec<(Spec, Resource)>,
    builder: XdsBuilder,
}

impl StoredMesh {
    /// Writes the mesh's step `revision - FIRST_REVISION` at `revision` (only the specs that
    /// changed) and returns the resources to publish.
    fn write(&mut self, revision: u64) -> Result<Resources> {
        let step = revision
            .checked_sub(FIRST_REVISION)
            .with_context(|| format!("revision {revision} is before the first"))?;
        for (i, spec) in mesh(step).into_iter().enumerate() {
            if self.stored.get(i).is_some_and(|(old, _)| *old == spec) {
                continue;
            }
            let valid = resources::validate(spec.kind, &spec.name, &spec.spec)
                .map_err(|e| anyhow!("{}/{}: {e}", spec.kind, spec.name))?;
            let resource = Resource {
                kind: spec.kind.as_str().to_string(),
                name: spec.name.clone(),
                value_json: valid.json,
                revision,
            };
            match self.stored.get_mut(i) {
                Some(slot) => *slot = (spec, resource),
                None => self.stored.push((spec, resource)),
            }
        }
        // The builder takes resources in (kind, name) order, as weft-control's store keeps them.
        let mut sorted: Vec<&Resource> = self.stored.iter().map(|(_, r)| r).collect();
        sorted.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
        Ok(self.builder.build(sorted))
    }
}

/// Accept queue of the xDS listener. `TcpListener::bind` (std's and tokio's) asks for 128,
/// which a fleet connecting 200 at a time overflows while both cores are busy with handshakes:
/// each dropped SYN costs its sidecar a 1 s retransmit. (The kernel caps it at somaxconn.)
const BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// `--serve-xds`: the stand-in control node (see [`StandIn`]).
fn serve(addr: SocketAddr, debounce: Duration) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let cache = Cache::new(debounce);
    let mut mesh = StoredMesh::default();
    cache.set(FIRST_REVISION, mesh.write(FIRST_REVISION)?)?;
    let listener = rt.block_on(async { listen(addr) })?;
    let local = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = AdsServer::new(cache.clone()).into_service();
    rt.spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "xds {local}")?;
    stdout.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let answer = match line.strip_prefix("set ").map(str::parse::<u64>) {
            Some(Ok(revision)) => match mesh
                .write(revision)
                .and_then(|r| Ok(cache.set(revision, r)?))
            {
                Ok(()) => format!("ok {revision}"),
                Err(e) => format!("error {e:#}"),
            },
            _ => format!("error unknown command {line:?}"),
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    // stdin closed: the bench is done (or gone).
    Ok(())
}

/// The issue's targets: p99 under 1 s at 10,000 sidecars; at most 30 MiB of control-node
/// memory per 1,000 sidecars (checked at the largest fleet measured).
fn checks(runs: &[Run]) -> Vec<Check> {
    let at_10k = runs.iter().find(|r| r.sidecars == 10_000);
    let largest = runs.iter().max_by_key(|r| r.sidecars);
    vec![
        Check {
            name: "p99 fan-out at 10,000 sidecars < 1000 ms",
            value: at_10k.map(|r| r.figures().p99_ms),
            limit: Some(1000.0),
            at_least: false,
        },
        Check {
            name: "control RSS per 1,000 sidecars <= 30 MiB",
            value: largest.map(|r| r.figures().rss_mib_per_1k),
            limit: Some(30.0),
            at_least: false,
        },
    ]
}

fn table(runs: &[Run]) -> String {
    let mut lines = vec![
        "| sidecars | p50 ms | p99 ms | max ms | median sidecar ms | commit ms | connect s | control RSS before → connected MiB | MiB / 1k sidecars | control CPU ms/change | sidecars CPU ms/change |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for run in runs {
        let f = run.figures();
        lines.push(format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} → {:.1} | {:.2} | {:.1} | {:.1} |",
            run.sidecars,
            f.p50_ms,
            f.p99_ms,
            f.max_ms,
            f.median_sidecar_ms,
            f.commit_ms,
            run.connect.as_secs_f64(),
            run.rss_before_mib,
            run.rss_connected_mib,
            f.rss_mib_per_1k,
            f.control_cpu_ms_per_change,
            f.sidecars_cpu_ms_per_change,
        ));
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Makes sure this process (and the control node, which inherits the limit) may open
/// `needed` files: one socket per sidecar on each side. Below that, and when the hard limit
/// allows it, the bench re-runs itself under `sh -c 'ulimit -n NEEDED; exec ...'` (raising
/// the limit in-process would need `unsafe` setrlimit) and returns its exit code.
fn ensure_open_files(needed: u64) -> Result<Option<ExitCode>> {
    let (soft, hard) = open_files_limit()?;
    let Some(soft) = soft.filter(|&s| s < needed) else {
        return Ok(None);
    };
    if hard.is_some_and(|h| h < needed) || std::env::var_os(FD_RAISED_ENV).is_some() {
        let hard = hard.map_or("unlimited".to_string(), |h| h.to_string());
        bail!(
            "{needed} open files are needed (one socket per sidecar in each process), but the limit is {soft} (hard {hard}); raise it (ulimit -n) or run fewer sidecars"
        );
    }
    eprintln!(
        "raising the open-file limit from {soft} to {needed} (re-running under sh -c 'ulimit -n')"
    );
    let status = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n "$0" && exec "$@""#)
        .arg(needed.to_string())
        .arg(weft_bench::workspace::self_exe())
        .args(std::env::args_os().skip(1))
        .env(FD_RAISED_ENV, "1")
        .status()
        .context("re-running under sh")?;
    Ok(Some(
        u8::try_from(status.code().unwrap_or(1)).map_or(ExitCode::FAILURE, ExitCode::from),
    ))
}

/// The soft and hard open-file limits from `/proc/self/limits` (`None` = unlimited).
fn open_files_limit() -> Result<(Option<u64>, Option<u64>)> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("no open-file limit in /proc/self/limits")?;
    let mut values = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse::<u64>().ok());
    Ok((values.next().flatten(), values.next().flatten()))
}

/// Rounds for the JSON.
fn r(v: f64, decimals: i32) -> Value {
    let f = 10f64.powi(decimals);
    json!((v * f).round() / f)
}

fn default_out(quick: bool) -> PathBuf {
    workspace::results_path("xds-fanout.json", quick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};
    use weft_xds::Snapshot;
    use weft_xds::resources::{from_any, v1};
    use weft_xds::typeurl::{CLUSTER, ENDPOINTS, EXPERIMENT, SERVICE};

    #[test]
    fn the_mesh_loads_in_order_without_dangling_references() {
        let mut loaded = HashSet::new();
        let mut per_kind = BTreeMap::new();
        for s in mesh(0) {
            let valid = resources::validate(s.kind, &s.name, &s.spec)
                .unwrap_or_else(|e| panic!("{}/{}: {e}", s.kind, s.name));
            let dangling =
                resources::missing(&valid.refs, |k, n| loaded.contains(&(k, n.to_string())));
            assert!(dangling.is_empty(), "{}/{}: {dangling:?}", s.kind, s.name);
            *per_kind.entry(s.kind).or_insert(0) += 1;
            loaded.insert((s.kind, s.name));
        }
        let clusters = 2 * SERVICES;
        assert_eq!(
            per_kind,
            BTreeMap::from([
                (Kind::Clusters, clusters),
                (Kind::Endpoints, clusters),
                (Kind::Experiments, SERVICES),
                (Kind::Services, SERVICES),
            ])
        );
    }

    #[test]
    fn a_change_versions_the_cluster_type_only() {
        let mut stored = StoredMesh::default();
        let first = Snapshot::default()
            .next(FIRST_REVISION, stored.write(FIRST_REVISION).unwrap())
            .unwrap();
        let next = first
            .next(
                FIRST_REVISION + 1,
                stored.write(FIRST_REVISION + 1).unwrap(),
            )
            .unwrap();
        assert_eq!(next.type_version(CLUSTER), FIRST_REVISION + 1);
        // The cluster's endpoints did not change: they keep their version and are not pushed.
        for unchanged in [ENDPOINTS, EXPERIMENT, SERVICE] {
            assert_eq!(next.type_version(unchanged), FIRST_REVISION, "{unchanged}");
        }
        assert_eq!(next.entries(CLUSTER).map(|e| e.len()), Some(2 * SERVICES));
        let endpoints = next.entries(ENDPOINTS).unwrap();
        assert_eq!(endpoints.len(), 2 * SERVICES);
        let svc0_b: v1::Endpoints = from_any(&endpoints["svc0-b"].body).unwrap();
        assert_eq!(svc0_b.endpoints.len(), ENDPOINTS_PER_CLUSTER);
        assert!(
            svc0_b
                .endpoints
                .iter()
                .all(|e| e.variant == "b" && e.healthy)
        );
    }
}

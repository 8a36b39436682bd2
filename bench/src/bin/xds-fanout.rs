//! xds-fanout: how long a committed config change takes to reach N sidecars, and what N
//! sidecars cost the control node in memory.
//!
//! N simulated sidecars ([`weft_bench::xds_clients`]: in-process ADS clients, one TCP
//! connection and one node id each) connect to one control node running as a separate process,
//! so its RSS is its own. Per N: the control node's RSS before any sidecar connects; the fleet
//! connects (a bounded number at a time) and ACKs the initial config; RSS again; then a series of
//! changes, each timed from the instant before it is triggered to the instant the last sidecar
//! ACKs it. See bench/README.md.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;
use tokio::time::Instant;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use weft_bench::procfs;
use weft_bench::report::{self, Check};
use weft_bench::stats::percentile;
use weft_bench::workspace;
use weft_bench::xds_clients::{Convergence, Fleet, FleetOptions};
use weft_xds::resources::v1;
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
    /// The stand-in control node's debounce window, ms (how long each stream waits after a
    /// commit for more commits before it pushes; part of every measured latency).
    #[arg(long, default_value_t = 10)]
    debounce_ms: u64,
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
        Ok(None) => exit_on(run(&plan, args.out.clone())),
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
    /// Control-node memory per 1,000 connected sidecars: growth from before the first
    /// connection to after the fleet ACKed its first config.
    rss_mib_per_1k: f64,
    control_cpu_ms_per_change: f64,
    sidecars_cpu_ms_per_change: f64,
}

impl Run {
    fn figures(&self) -> Figures {
        let sorted_ms = |pick: fn(&Convergence) -> Duration| {
            let mut v: Vec<f64> = self
                .changes
                .iter()
                .map(|c| pick(c).as_secs_f64() * 1e3)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let all = sorted_ms(|c| c.all);
        let per_change = |s: f64| s * 1e3 / self.changes.len() as f64;
        Figures {
            p50_ms: percentile(&all, 0.5),
            p99_ms: percentile(&all, 0.99),
            max_ms: percentile(&all, 1.0),
            median_sidecar_ms: percentile(&sorted_ms(|c| c.half), 0.5),
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
        })
    }
}

fn run(plan: &Plan, out: Option<PathBuf>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for &sidecars in &plan.sizes {
        eprintln!("== {sidecars} sidecars");
        // A fresh control node per fleet size, so each RSS baseline is a fresh process.
        let mut control = StandIn::start(plan.debounce)?;
        let run = measure(plan, &rt, sidecars, &mut control)
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
            "control_node": StandIn::DESCRIPTION,
            "mesh": MESH_DESCRIPTION,
        },
        "summary": runs.iter().map(|r| (r.key(), r.summary_json())).collect::<Map<_, _>>(),
        "targets": report::checks_json(&checks),
        "changes": runs.iter().map(|r| (r.key(), r.changes_json())).collect::<Map<_, _>>(),
        "notes": NOTES,
    });
    let out = out.unwrap_or_else(|| default_out(plan.quick));
    workspace::write_json(&out, &doc)?;
    println!("wrote {}", out.display());
    Ok(())
}

/// Explanations stored with the numbers, so the JSON reads on its own.
const NOTES: &[&str] = &[
    "p50_ms/p99_ms/max_ms: over the timed changes, each from the instant before the change was triggered to the instant the last sidecar handed its ACK of the new cluster version to its gRPC stream; with fewer than 100 changes p99 is the slowest change (nearest rank)",
    "median_sidecar_p50_ms: the same, until half the sidecars had ACKed (median over changes)",
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
    for i in 0..plan.changes {
        std::thread::sleep(plan.pause);
        let since = Instant::now();
        let revision = control.commit_change(i)?;
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

/// The control node under test, reduced to what the bench needs from it.
///
/// Today this is [`StandIn`]: weft-xds's `Cache` and `AdsServer` (the code weft-control serves
/// xDS with) in a child process, written while `weft-control` did not exist yet. Everything
/// that costs per sidecar (streams, pushes, ACK bookkeeping) is that code; what the real node
/// adds per change (a Raft commit, rebuilding the resources) is paid once, not per sidecar. To
/// measure the real node, implement this trait for a `weft-control` process (flags and API in
/// docs/control-api.md) and pass it to [`measure`] in [`run`] instead of `StandIn::start`:
/// - start `weft-control --id 1 --init --data-dir TMP --listen A --xds-listen B --log warn`
///   through `guard::Spawned` (ports from `net::free_addrs`, `TMP` a `guard::TempDir`), poll
///   `GET /v1/status` (`net::http_get`) until `leader` is set, then write the mesh of [`mesh`]
///   as `PUT /v1/{clusters,experiments,services}/{name}` JSON specs;
/// - `xds_addr` is `B`, `pid` is the Spawned pid;
/// - `commit_change(i)` is `PUT /v1/clusters/svc0-a` with that cluster's full spec and
///   `"connect_timeout": "<1000 + i + 2>ms"` (a PUT replaces the spec), returning the response's
///   `revision`. Revisions are Raft log indexes and the node publishes to its cache at the applied
///   index, so the cluster type's xDS version becomes a revision ≥ that one, which is what
///   [`Fleet::converge`] waits for.
trait ControlNode {
    /// Where sidecars connect (ADS over gRPC).
    fn xds_addr(&self) -> SocketAddr;
    /// The process whose RSS and CPU are measured.
    fn pid(&self) -> u32;
    /// Commits change number `i` (a new cluster spec) and returns once it is committed, with
    /// the revision it was committed at.
    fn commit_change(&mut self, i: usize) -> Result<u64>;
}

/// A stand-in control node: this binary re-run with `--serve-xds`, serving [`mesh`] from a
/// `weft_xds::Cache` through `weft_xds::AdsServer`. It takes `set REVISION` lines on stdin,
/// publishes that revision and answers `ok REVISION` once it is in the cache (committed: every
/// stream is woken). It exits when its stdin closes, so it cannot outlive the bench.
struct StandIn {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    xds: SocketAddr,
}

impl StandIn {
    const DESCRIPTION: &str = "stand-in for weft-control: weft_xds::Cache + AdsServer (the xDS server code weft-control uses) in a child process of the bench, default tonic settings, listen backlog 4096; a change is one cache.set";

    fn start(debounce: Duration) -> Result<Self> {
        let exe = std::env::current_exe().context("locating this binary")?;
        let mut child = Command::new(exe)
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

/// The revision of the initial mesh; change `i` is committed at `FIRST_REVISION + 1 + i`.
const FIRST_REVISION: u64 = 1;
/// Services in the mesh; each has an experiment with two variants, each variant its own
/// cluster with `ENDPOINTS_PER_CLUSTER` endpoints.
const SERVICES: usize = 8;
const ENDPOINTS_PER_CLUSTER: usize = 4;
const MESH_DESCRIPTION: &str = "8 services, each routed to an experiment with 2 weighted variants on 2 clusters of 4 endpoints (16 clusters, 64 endpoints); each change sets cluster svc0-a's connect_timeout to a new value, so a change pushes the cluster type (all 16 clusters, SotW) to every sidecar";

/// The config at `revision`: a small inference mesh whose cluster `svc0-a` has a connect
/// timeout that differs at every revision (so each revision changes the cluster type only).
fn mesh(revision: u64) -> Resources {
    let ms = |millis: u64| prost_types::Duration {
        seconds: (millis / 1000) as i64,
        nanos: (millis % 1000 * 1_000_000) as i32,
    };
    let mut r = Resources::new();
    for s in 0..SERVICES {
        let name = format!("svc{s}");
        let experiment = format!("{name}-ab");
        r.add(&v1::Service {
            name: name.clone(),
            hosts: vec![name.clone()],
            routes: vec![v1::Route {
                name: "default".into(),
                r#match: Some(v1::RouteMatch {
                    path_prefix: Some("/".into()),
                    ..Default::default()
                }),
                target: Some(v1::route::Target::Experiment(experiment.clone())),
                timeout: Some(ms(30_000)),
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut variants = Vec::new();
        for (variant, weight) in [("a", 90), ("b", 10)] {
            let cluster = format!("{name}-{variant}");
            let connect_ms = if s == 0 && variant == "a" {
                1000 + revision
            } else {
                1000
            };
            r.add(&v1::Cluster {
                name: cluster.clone(),
                connect_timeout: Some(ms(connect_ms)),
                ..Default::default()
            });
            r.add(&v1::Endpoints {
                cluster_name: cluster.clone(),
                endpoints: (0..ENDPOINTS_PER_CLUSTER)
                    .map(|e| v1::Endpoint {
                        address: format!(
                            "10.0.{s}.{}:8000",
                            e + if variant == "a" { 0 } else { 100 }
                        ),
                        variant: variant.into(),
                        healthy: true,
                        ..Default::default()
                    })
                    .collect(),
            });
            variants.push(v1::Variant {
                name: variant.into(),
                cluster,
                weight,
                ..Default::default()
            });
        }
        r.add(&v1::Experiment {
            name: experiment,
            salt: name,
            variants,
            ..Default::default()
        });
    }
    r
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
    cache.set(FIRST_REVISION, mesh(FIRST_REVISION))?;
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
            Some(Ok(revision)) => match cache.set(revision, mesh(revision)) {
                Ok(()) => format!("ok {revision}"),
                Err(e) => format!("error {e}"),
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
        "| sidecars | p50 ms | p99 ms | max ms | median sidecar ms | connect s | control RSS before → connected MiB | MiB / 1k sidecars | control CPU ms/change | sidecars CPU ms/change |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for run in runs {
        let f = run.figures();
        lines.push(format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} → {:.1} | {:.2} | {:.1} | {:.1} |",
            run.sidecars,
            f.p50_ms,
            f.p99_ms,
            f.max_ms,
            f.median_sidecar_ms,
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
        .arg(std::env::current_exe()?)
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
    use weft_xds::Snapshot;
    use weft_xds::typeurl::{CLUSTER, ENDPOINTS, EXPERIMENT, SERVICE};

    #[test]
    fn a_change_changes_the_cluster_type_only() {
        let first = Snapshot::default()
            .next(FIRST_REVISION, mesh(FIRST_REVISION))
            .unwrap();
        let next = first
            .next(FIRST_REVISION + 1, mesh(FIRST_REVISION + 1))
            .unwrap();
        assert_eq!(next.type_version(CLUSTER), FIRST_REVISION + 1);
        for unchanged in [ENDPOINTS, EXPERIMENT, SERVICE] {
            assert_eq!(next.type_version(unchanged), FIRST_REVISION, "{unchanged}");
        }
        assert_eq!(next.entries(CLUSTER).map(|e| e.len()), Some(2 * SERVICES));
    }
}

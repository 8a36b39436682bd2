//! raft-write: durable (fsynced) write latency and throughput of a 3-node weft-control cluster
//! against a 3-member etcd cluster, and the disk's own `fdatasync` latency, on one machine.
//!
//! Per repeat: `write 4 KiB + fdatasync` on the temp dir's disk, then for each system (order
//! rotated per repeat) a fresh 3-node loopback cluster with its own data dirs, closed-loop
//! writers sending to the leader (1, then 64 clients, each one keep-alive HTTP/1.1 connection
//! issuing writes back to back), a warm-up, a measured window, and the cluster stopped and its
//! data removed. See bench/README.md.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Map, Value, json};

use weft_bench::guard::{self, TempDir};
use weft_bench::raft_clusters::{Cluster, System};
use weft_bench::report::{self, Check};
use weft_bench::stats::Spread;
use weft_bench::workspace;
use weft_bench::write_load::{self, DiskCounters, Writes};
use weft_bench::{install, procfs};

/// Durable write latency and throughput: weft-control (openraft + redb) vs etcd, 3 nodes each.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 1 repeat, 2 s windows, 1 s warm-up, 50 fdatasync iterations; a missing etcd is
    /// reported, not fatal.
    #[arg(long)]
    quick: bool,
    /// Repeats [default: 3, quick: 1].
    #[arg(long)]
    repeats: Option<usize>,
    /// Seconds of each measured window [default: 10, quick: 2].
    #[arg(long)]
    duration: Option<u64>,
    /// Concurrent clients, one measurement each (the targets need 1 and 64).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 64])]
    clients: Vec<usize>,
    /// Comma-separated subset of weft,etcd.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Also measure weft with the writes sent to a follower (which forwards them to the leader).
    #[arg(long)]
    via_follower: bool,
    /// Iterations of the fdatasync test [default: 200, quick: 50].
    #[arg(long)]
    fsync_iterations: Option<usize>,
    /// Emulate a slower disk: every fdatasync/fsync of every node (both systems) takes this
    /// many ms longer (a seccomp filter traps only those calls; this binary, re-run as each
    /// node's wrapper, holds them; see bench/src/fsync_delay.rs), and so does each sample of the
    /// fdatasync test. Results go under bench/results/tmp/ unless --out.
    #[arg(long)]
    fsync_delay_ms: Option<f64>,
    /// With --fsync-delay-ms: weft's node 1, which initializes the cluster and leads it,
    /// runs without the delay (the followers and etcd keep it). The leader's own fsync then
    /// costs next to nothing, which bounds from above what replicating before the leader's
    /// flush could gain (docs/openraft-leader-append.md). The run stops if node 1 does not lead.
    #[arg(long, requires = "fsync_delay_ms")]
    fsync_delay_spares_leader: bool,
    /// Use this weft-control binary instead of building target/release/weft-control.
    #[arg(long)]
    weft_control: Option<PathBuf>,
    /// Where to write the JSON results [default: bench/results/raft-write.json; quick:
    /// bench/results/tmp/raft-write.json, git-ignored].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Resolved run settings.
struct Plan {
    repeats: usize,
    window: Duration,
    warmup: Duration,
    clients: Vec<usize>,
    systems: Vec<System>,
    via_follower: bool,
    fsync_iterations: usize,
    /// Emulated extra fsync latency (zero: the disk as it is).
    fsync_delay: Duration,
    /// weft's leader (node 1) runs without the emulated delay.
    spare_leader: bool,
}

/// One measured configuration in one repeat.
#[derive(Clone, Debug)]
struct Sample {
    system: System,
    clients: usize,
    /// Writes sent to a follower instead of the leader.
    via_follower: bool,
    repeat: usize,
    p50_ms: f64,
    p99_ms: f64,
    writes_per_s: f64,
    writes: u64,
    errors: u64,
    first_error: Option<String>,
    /// CPU of the three nodes during the window, per acknowledged write.
    cluster_cpu_us_per_write: f64,
    /// CPU of the bench's own writers, per acknowledged write.
    client_cpu_us_per_write: f64,
    /// CPU (cores) used by anything outside the bench meanwhile (noise indicator).
    foreign_cpu: Option<f64>,
    /// Device-level writes and cache flushes per acknowledged write (whole device).
    disk_writes_per_write: Option<f64>,
    disk_flushes_per_write: Option<f64>,
    /// The disk's fdatasync p50 measured right before this system's cluster started.
    fsync_p50_ms: f64,
    /// weft: the leader's last log index and snapshot index (if any) after the window.
    log_after: Option<(u64, Option<u64>)>,
    /// The leader before and after the window (a change means an election during the load).
    leader: String,
    leader_after: String,
}

fn main() -> ExitCode {
    // Re-executed as a node's wrapper by --fsync-delay-ms (before any thread exists).
    if let Some(code) = weft_bench::fsync_delay::exec_if_asked() {
        return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
    }
    match run(&Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("raft-write: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the bench; `Ok(false)` when weft could not be measured in every repeat.
fn run(args: &Args) -> Result<bool> {
    guard::stop_children_on_signal()?;
    let plan = plan(args)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    let mut missing = Map::new();
    let mut versions = Map::new();
    let mut bins: Vec<(System, PathBuf)> = Vec::new();
    for &system in &plan.systems {
        let found = match system {
            System::Weft => match &args.weft_control {
                Some(bin) => Ok(bin.clone()),
                None => workspace::release_bin("weft-control"),
            },
            System::Etcd => install::ensure_apt("etcd", "etcd-server"),
        };
        match found {
            Ok(bin) => {
                versions.insert(
                    system.name().into(),
                    json!(install::version_line(&bin, &["--version"])),
                );
                bins.push((system, bin));
            }
            Err(e) if system == System::Weft => return Err(e.context("building weft-control")),
            Err(e) => {
                eprintln!("{}: missing: {e:#}", system.name());
                missing.insert(system.name().into(), json!(format!("{e:#}")));
            }
        }
    }

    versions.insert("weft_source".into(), json!(weft_source()));
    let wrap = if plan.fsync_delay.is_zero() {
        Vec::new()
    } else {
        weft_bench::fsync_delay::wrapper(plan.fsync_delay)
    };

    let tmp = TempDir::new("weft-raft-write")?;
    let device = write_load::device_of(tmp.path());
    let mut fsyncs = Vec::new();
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for repeat in 0..plan.repeats {
        let k = repeat % bins.len().max(1);
        for (system, bin) in bins[k..].iter().chain(&bins[..k]) {
            // The disk's fsync latency drifts with whatever else writes to it, so it is
            // measured right before each system, and each sample keeps its own.
            let append = write_load::fdatasync_latency(
                tmp.path(),
                plan.fsync_iterations,
                true,
                plan.fsync_delay,
            )?;
            let overwrite = write_load::fdatasync_latency(
                tmp.path(),
                plan.fsync_iterations,
                false,
                plan.fsync_delay,
            )?;
            eprintln!(
                "repeat {}/{} fdatasync (4 KiB append) p50 {:.3} ms  p99 {:.3} ms; overwrite p50 {:.3} ms",
                repeat + 1,
                plan.repeats,
                append.p50_ms,
                append.p99_ms,
                overwrite.p50_ms
            );
            let fsync_p50_ms = append.p50_ms;
            fsyncs.push((append, overwrite));
            let dir = tmp.path().join(format!("r{repeat}-{}", system.name()));
            std::fs::create_dir_all(&dir)?;
            let measured = rt.block_on(measure_system(
                &plan,
                *system,
                bin,
                &wrap,
                &dir,
                repeat,
                device.as_deref(),
            ));
            let _ = std::fs::remove_dir_all(&dir);
            match measured {
                Ok(s) => samples.extend(s.into_iter().map(|s| Sample { fsync_p50_ms, ..s })),
                Err(e) => {
                    eprintln!(
                        "repeat {}/{} {}: FAILED: {e:#}",
                        repeat + 1,
                        plan.repeats,
                        system.name()
                    );
                    failures.push(json!({"system": system.name(), "repeat": repeat, "error": format!("{e:#}")}));
                }
            }
        }
    }

    let fsync_p50 = Spread::of(fsyncs.iter().map(|(a, _)| Some(a.p50_ms)));
    let summary = Summary::new(&samples, &plan.clients);
    let checks = checks(&summary, fsync_p50.map(|s| s.median));
    println!("\n{}", summary.table(fsync_p50));
    println!("{}", ratios_table(&summary, fsync_p50.map(|s| s.median)));
    println!("{}", report::checks_table(&checks));
    if !missing.is_empty() || !failures.is_empty() {
        println!(
            "missing: {:?}; failed runs: {}",
            missing.keys().collect::<Vec<_>>(),
            failures.len()
        );
    }
    let errors: u64 = samples.iter().map(|s| s.errors).sum();
    if errors > 0 {
        println!("failed writes inside the windows: {errors} (see repeats[].first_error)");
    }

    let fsync_spread = |get: fn(&(write_load::Fsync, write_load::Fsync)) -> f64| {
        spread_json(Spread::of(fsyncs.iter().map(|f| Some(get(f)))), 3)
    };
    let mut summary_json = summary.to_json(false);
    summary_json.insert(
        "fdatasync_p50_ms".into(),
        fsync_p50.map_or(Value::Null, |s| round(s.median, 4)),
    );
    let doc = json!({
        "bench": "raft-write",
        "machine": machine(tmp.path(), device.as_deref()),
        "settings": settings(&plan, args.quick),
        "versions": versions,
        "summary": summary_json,
        "ranges": summary.to_json(true),
        "via_follower": summary.via_follower_json(),
        "details": summary.details_json(),
        "fdatasync": {
            "append_4k": {"p50_ms": fsync_spread(|f| f.0.p50_ms), "p99_ms": fsync_spread(|f| f.0.p99_ms)},
            "overwrite_4k": {"p50_ms": fsync_spread(|f| f.1.p50_ms), "p99_ms": fsync_spread(|f| f.1.p99_ms)},
            "iterations": plan.fsync_iterations,
        },
        "ratios": ratios(&summary, fsync_p50.map(|s| s.median)),
        "targets": report::checks_json(&checks),
        "missing": missing,
        "failures": failures,
        "repeats": samples.iter().map(sample_json).collect::<Vec<_>>(),
        "notes": NOTES,
    });
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_out(args.quick, plan.fsync_delay));
    workspace::write_json(&out, &doc)?;
    println!("wrote {}", out.display());

    let weft_wanted = plan.systems.contains(&System::Weft);
    let weft_measured = samples
        .iter()
        .filter(|s| s.system == System::Weft && !s.via_follower)
        .count();
    Ok(!weft_wanted || weft_measured == plan.repeats * plan.clients.len())
}

/// Explanations stored with the numbers, so the JSON reads on its own.
const NOTES: &[&str] = &[
    "a write: weft PUT /v1/clusters/k{client} {\"max_idle_per_endpoint\": N} (200 and \"changed\": true), etcd POST /v3/kv/put (JSON gateway) of key k{client}; N grows with every write so each write changes the value; sent to the leader unless via_follower",
    "each client: one keep-alive HTTP/1.1 connection, writes back to back (closed loop); only writes completing inside the window count, after a warm-up",
    "summary: medians over repeats of each repeat's p50/p99 latency and writes/s; ranges: [min, max] over repeats",
    "fdatasync_p50_ms: write(4 KiB) appended to a file + fdatasync, in the same temp dir (same disk) as the clusters' data, measured right before each system in each repeat (the summary holds the median of all those runs, repeats[] the one before each sample); fdatasync.overwrite_4k rewrites offset 0 instead (no size change to journal)",
    "details: cluster_cpu_us_per_write = utime+stime of the 3 nodes during the window / acknowledged writes; disk_*_per_write = the device's completed writes / cache flushes (/proc/diskstats, whole device) / acknowledged writes; foreign_cpu: machine busy time not used by the bench or its children, in cores (noise indicator)",
    "every system runs on the same 2 cores as the writers; no pinning",
    "each system gets a fresh 3-node cluster per repeat, serving the client counts in order; weft samples record the leader's log_index_after and snapshot_index_after (weft-control snapshots every 10,000 applied entries, so a fast 64-client window crosses the first snapshot)",
];

/// CPU (in cores) used outside the bench above which a sample is flagged.
const NOISY: f64 = 0.10;

/// Starts `system`'s cluster under `dir` and measures every client count against it.
async fn measure_system(
    plan: &Plan,
    system: System,
    bin: &Path,
    wrap: &[String],
    dir: &Path,
    repeat: usize,
    device: Option<&str>,
) -> Result<Vec<Sample>> {
    let started = Instant::now();
    let mut cluster = match system {
        System::Weft => Cluster::start_weft(bin, wrap, plan.spare_leader, dir).await?,
        System::Etcd => Cluster::start_etcd(bin, wrap, dir).await?,
    };
    if plan.spare_leader && system == System::Weft && cluster.leader != 0 {
        bail!(
            "--fsync-delay-spares-leader: node 1 runs without the delay, but {} leads",
            cluster.members[cluster.leader].name
        );
    }
    eprintln!(
        "{}: 3 nodes up in {:.1} s, leader {}",
        system.name(),
        started.elapsed().as_secs_f64(),
        cluster.members[cluster.leader].name
    );
    let mut out = Vec::new();
    let vias: &[bool] = if plan.via_follower && system == System::Weft {
        &[false, true]
    } else {
        &[false]
    };
    for &via_follower in vias {
        for &clients in &plan.clients {
            let s = measure(plan, &mut cluster, clients, via_follower, repeat, device).await?;
            eprintln!(
                "repeat {}/{} {:<4} c{:<3}{} {:>8.0} writes/s  p50 {:.3} ms  p99 {:.3} ms  {:.0} µs CPU/write  {} flushes/write{}",
                repeat + 1,
                plan.repeats,
                system.name(),
                clients,
                if via_follower { " via follower" } else { "" },
                s.writes_per_s,
                s.p50_ms,
                s.p99_ms,
                s.cluster_cpu_us_per_write,
                s.disk_flushes_per_write
                    .map_or("-".into(), |f| format!("{f:.2}")),
                if s.errors > 0 {
                    format!("  {} FAILED WRITES", s.errors)
                } else {
                    String::new()
                }
            );
            out.push(s);
        }
    }
    for m in &mut cluster.members {
        m.process.stop();
    }
    Ok(out)
}

/// One client count against a running cluster.
async fn measure(
    plan: &Plan,
    cluster: &mut Cluster,
    clients: usize,
    via_follower: bool,
    repeat: usize,
    device: Option<&str>,
) -> Result<Sample> {
    let leader = cluster.find_leader().await?;
    let target = if via_follower {
        cluster.follower_api()
    } else {
        cluster.leader_api()
    };
    let from = Instant::now() + plan.warmup;
    let until = from + plan.window;
    let pids = cluster.pids();
    let device = device.map(str::to_string);
    let meter = std::thread::spawn(move || Meter::across(pids, from, until, device));
    let writes: Writes =
        write_load::closed_loop(cluster.system, target, clients, from, until).await?;
    let used = meter
        .join()
        .map_err(|_| anyhow::anyhow!("meter thread panicked"))??;
    cluster.check_alive()?;
    let log_after = cluster.weft_log_state().await;
    let leader_after = cluster
        .find_leader()
        .await
        .unwrap_or_else(|e| format!("{e:#}"));
    if writes.ok == 0 {
        bail!(
            "no write was acknowledged in the window ({} failed; first: {})",
            writes.errors,
            writes.first_error.as_deref().unwrap_or("-")
        );
    }
    if used.foreign_cpu.unwrap_or(0.0) > NOISY {
        eprintln!(
            "warning: {} c{clients}: work outside the bench used {:.2} cores meanwhile",
            cluster.system.name(),
            used.foreign_cpu.unwrap_or(0.0)
        );
    }
    if leader_after != leader {
        eprintln!(
            "warning: {} c{clients}: leader changed during the window ({leader} → {leader_after})",
            cluster.system.name()
        );
    }
    let per_write = |v: f64| v / writes.ok as f64;
    Ok(Sample {
        system: cluster.system,
        clients,
        via_follower,
        repeat,
        p50_ms: writes.p50_ms(),
        p99_ms: writes.p99_ms(),
        writes_per_s: writes.writes_per_s(),
        writes: writes.ok,
        errors: writes.errors,
        first_error: writes.first_error.clone(),
        cluster_cpu_us_per_write: per_write(used.cluster_cpu_s * 1e6),
        client_cpu_us_per_write: per_write(used.client_cpu_s * 1e6),
        foreign_cpu: used.foreign_cpu,
        disk_writes_per_write: used.disk.map(|d| per_write(d.writes as f64)),
        disk_flushes_per_write: used.disk.map(|d| per_write(d.flushes as f64)),
        fsync_p50_ms: f64::NAN,
        log_after,
        leader,
        leader_after,
    })
}

/// CPU and disk use over the measured window, read by a thread at the window's edges (the
/// writers' runtime is not disturbed by the `/proc` scans).
struct Meter {
    cluster_cpu_s: f64,
    client_cpu_s: f64,
    foreign_cpu: Option<f64>,
    disk: Option<DiskCounters>,
}

/// Readings at one instant.
struct Reading {
    at: Instant,
    machine_busy_s: Option<f64>,
    own_cpu_s: f64,
    cluster_cpu_s: f64,
    disk: Option<DiskCounters>,
}

impl Reading {
    fn take(pids: &[u32], device: Option<&str>) -> Result<Self> {
        let mut cluster_cpu_s = 0.0;
        for &pid in pids {
            cluster_cpu_s += procfs::usage(pid)
                .with_context(|| format!("cluster process {pid} is gone"))?
                .cpu_s;
        }
        Ok(Self {
            at: Instant::now(),
            machine_busy_s: procfs::machine_busy_s(),
            own_cpu_s: procfs::own_cpu_s(),
            cluster_cpu_s,
            disk: device.and_then(write_load::disk_counters),
        })
    }
}

impl Meter {
    fn across(
        pids: Vec<u32>,
        from: Instant,
        until: Instant,
        device: Option<String>,
    ) -> Result<Self> {
        std::thread::sleep(from.saturating_duration_since(Instant::now()));
        let a = Reading::take(&pids, device.as_deref())?;
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        let b = Reading::take(&pids, device.as_deref())?;
        let wall_s = b.at.duration_since(a.at).as_secs_f64();
        let cluster_cpu_s = b.cluster_cpu_s - a.cluster_cpu_s;
        // own_cpu_s covers the bench and every live child: the nodes are among them.
        let own_cpu_s = b.own_cpu_s - a.own_cpu_s;
        Ok(Self {
            cluster_cpu_s,
            client_cpu_s: (own_cpu_s - cluster_cpu_s).max(0.0),
            foreign_cpu: a
                .machine_busy_s
                .zip(b.machine_busy_s)
                .map(|(x, y)| (y - x - own_cpu_s) / wall_s),
            disk: a.disk.zip(b.disk).map(|(x, y)| DiskCounters {
                writes: y.writes.saturating_sub(x.writes),
                flushes: y.flushes.saturating_sub(x.flushes),
            }),
        })
    }
}

/// The reported quantities of a configuration: JSON key, table header, getter, decimals.
type Getter = fn(&Sample) -> Option<f64>;
const MAIN: &[(&str, &str, Getter, usize)] = &[
    ("p50_ms", "p50 ms", |s| Some(s.p50_ms), 2),
    ("p99_ms", "p99 ms", |s| Some(s.p99_ms), 2),
    ("writes_per_s", "writes/s", |s| Some(s.writes_per_s), 0),
];
const DETAILS: &[(&str, &str, Getter, usize)] = &[
    (
        "cluster_cpu_us_per_write",
        "cluster CPU µs/write",
        |s| Some(s.cluster_cpu_us_per_write),
        0,
    ),
    (
        "client_cpu_us_per_write",
        "client CPU µs/write",
        |s| Some(s.client_cpu_us_per_write),
        0,
    ),
    (
        "disk_flushes_per_write",
        "disk flushes/write",
        |s| s.disk_flushes_per_write,
        2,
    ),
    (
        "disk_writes_per_write",
        "disk writes/write",
        |s| s.disk_writes_per_write,
        2,
    ),
    ("foreign_cpu", "foreign CPU", |s| s.foreign_cpu, 2),
];

/// One row: a system at one client count, leader-direct or via a follower.
struct Row {
    system: System,
    clients: usize,
    via_follower: bool,
    main: Vec<Option<Spread>>,
    details: Vec<Option<Spread>>,
    errors: u64,
}

struct Summary {
    rows: Vec<Row>,
}

impl Summary {
    fn new(samples: &[Sample], clients: &[usize]) -> Self {
        let mut rows = Vec::new();
        for via_follower in [false, true] {
            for system in System::ALL {
                for &c in clients {
                    let mine: Vec<&Sample> = samples
                        .iter()
                        .filter(|s| {
                            s.system == system && s.clients == c && s.via_follower == via_follower
                        })
                        .collect();
                    if via_follower && mine.is_empty() {
                        continue;
                    }
                    let spread = |g: Getter| Spread::of(mine.iter().map(|s| g(s)));
                    rows.push(Row {
                        system,
                        clients: c,
                        via_follower,
                        main: MAIN.iter().map(|m| spread(m.2)).collect(),
                        details: DETAILS.iter().map(|m| spread(m.2)).collect(),
                        errors: mine.iter().map(|s| s.errors).sum(),
                    });
                }
            }
        }
        Self { rows }
    }

    fn row(&self, system: System, clients: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.system == system && r.clients == clients && !r.via_follower)
    }

    /// Median of a main metric (`p50_ms`, `p99_ms`, `writes_per_s`), leader-direct.
    fn median(&self, system: System, clients: usize, key: &str) -> Option<f64> {
        let i = MAIN.iter().position(|m| m.0 == key)?;
        self.row(system, clients)?.main[i].map(|s| s.median)
    }

    /// `{system: {cN: {p50_ms, p99_ms, writes_per_s}}}` of medians, or of `[min, max]`.
    fn to_json(&self, ranges: bool) -> Map<String, Value> {
        self.nested(false, |row| metrics_json(MAIN, &row.main, ranges))
    }

    fn via_follower_json(&self) -> Value {
        let v = self.nested(true, |row| {
            let mut m = metrics_json(MAIN, &row.main, false);
            m.insert(
                "range".into(),
                Value::Object(metrics_json(MAIN, &row.main, true)),
            );
            m
        });
        if v.is_empty() {
            Value::Null
        } else {
            Value::Object(v)
        }
    }

    fn details_json(&self) -> Value {
        Value::Object(self.nested(false, |row| {
            let mut m = metrics_json(DETAILS, &row.details, false);
            m.insert("failed_writes".into(), json!(row.errors));
            m
        }))
    }

    fn nested(
        &self,
        via_follower: bool,
        f: impl Fn(&Row) -> Map<String, Value>,
    ) -> Map<String, Value> {
        let mut out = Map::new();
        for row in self.rows.iter().filter(|r| r.via_follower == via_follower) {
            let by_clients = out
                .entry(row.system.name())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = by_clients {
                m.insert(format!("c{}", row.clients), Value::Object(f(row)));
            }
        }
        out
    }

    /// The table: `median (min–max)` per cell, `-` where nothing was measured.
    fn table(&self, fsync_p50: Option<Spread>) -> String {
        let headers: Vec<&str> = MAIN.iter().chain(DETAILS).map(|m| m.1).collect();
        let mut lines = vec![format!(
            "system | clients | {} | failed writes",
            headers.join(" | ")
        )];
        lines.push(vec!["---"; headers.len() + 3].join("|"));
        for row in &self.rows {
            let cells = MAIN
                .iter()
                .zip(&row.main)
                .chain(DETAILS.iter().zip(&row.details))
                .map(|(m, s)| cell(*s, m.3));
            let name = if row.via_follower {
                format!("{} via follower", row.system.name())
            } else {
                row.system.name().to_string()
            };
            lines.push(
                [name, row.clients.to_string()]
                    .into_iter()
                    .chain(cells)
                    .chain([row.errors.to_string()])
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
        let mut out: String = lines.iter().map(|l| format!("| {l} |\n")).collect();
        out.push_str(&format!(
            "\nfdatasync (4 KiB append) p50: {} ms\n",
            cell(fsync_p50, 3)
        ));
        out
    }
}

fn cell(s: Option<Spread>, decimals: usize) -> String {
    match s {
        None => "-".to_string(),
        Some(s) if s.min == s.max => format!("{:.*}", decimals, s.median),
        Some(s) => format!(
            "{:.*} ({:.*}–{:.*})",
            decimals, s.median, decimals, s.min, decimals, s.max
        ),
    }
}

fn metrics_json(
    metrics: &[(&str, &str, Getter, usize)],
    spreads: &[Option<Spread>],
    ranges: bool,
) -> Map<String, Value> {
    metrics
        .iter()
        .zip(spreads)
        .map(|(m, s)| {
            let v = if ranges {
                spread_json(*s, m.3 + 2)["range"].clone()
            } else {
                s.map_or(Value::Null, |s| round(s.median, m.3 + 2))
            };
            (m.0.to_string(), v)
        })
        .collect()
}

fn spread_json(s: Option<Spread>, digits: usize) -> Value {
    match s {
        None => json!({"median": null, "range": null}),
        Some(s) => json!({
            "median": round(s.median, digits),
            "range": [round(s.min, digits), round(s.max, digits)],
        }),
    }
}

/// The ratios the targets are about, from the medians.
fn ratio_values(s: &Summary, fsync_p50: Option<f64>) -> Vec<(&'static str, Option<f64>)> {
    let weft_c1 = s.median(System::Weft, 1, "p50_ms");
    vec![
        (
            "weft_c1_p50_over_fdatasync_p50",
            weft_c1.zip(fsync_p50).map(|(w, f)| w / f),
        ),
        (
            "weft_c1_p50_over_etcd_c1_p50",
            weft_c1
                .zip(s.median(System::Etcd, 1, "p50_ms"))
                .map(|(w, e)| w / e),
        ),
        (
            "weft_c64_over_etcd_c64_writes_per_s",
            s.median(System::Weft, 64, "writes_per_s")
                .zip(s.median(System::Etcd, 64, "writes_per_s"))
                .map(|(w, e)| w / e),
        ),
        (
            "etcd_c1_p50_over_fdatasync_p50",
            s.median(System::Etcd, 1, "p50_ms")
                .zip(fsync_p50)
                .map(|(e, f)| e / f),
        ),
    ]
}

fn ratios(s: &Summary, fsync_p50: Option<f64>) -> Value {
    Value::Object(
        ratio_values(s, fsync_p50)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.map_or(Value::Null, |v| round(v, 3))))
            .collect(),
    )
}

fn ratios_table(s: &Summary, fsync_p50: Option<f64>) -> String {
    ratio_values(s, fsync_p50)
        .into_iter()
        .map(|(k, v)| format!("{k}: {}\n", v.map_or("-".into(), |v| format!("{v:.3}"))))
        .collect()
}

/// The targets, from the medians.
fn checks(s: &Summary, fsync_p50: Option<f64>) -> Vec<Check> {
    let weft_c1 = s.median(System::Weft, 1, "p50_ms");
    vec![
        Check {
            name: "weft c1 p50 <= 1.2 x fdatasync p50 (ms)",
            value: weft_c1,
            limit: fsync_p50.map(|f| 1.2 * f),
            at_least: false,
        },
        Check {
            name: "weft c1 p50 <= etcd c1 p50 (ms)",
            value: weft_c1,
            limit: s.median(System::Etcd, 1, "p50_ms"),
            at_least: false,
        },
        Check {
            name: "weft c64 >= 10 x etcd c64 (writes/s)",
            value: s.median(System::Weft, 64, "writes_per_s"),
            limit: s.median(System::Etcd, 64, "writes_per_s").map(|e| 10.0 * e),
            at_least: true,
        },
    ]
}

fn sample_json(s: &Sample) -> Value {
    let opt = |v: Option<f64>, d| v.map_or(Value::Null, |v| round(v, d));
    json!({
        "system": s.system.name(),
        "clients": s.clients,
        "via_follower": s.via_follower,
        "repeat": s.repeat,
        "p50_ms": round(s.p50_ms, 4),
        "p99_ms": round(s.p99_ms, 4),
        "writes_per_s": round(s.writes_per_s, 1),
        "writes": s.writes,
        "failed_writes": s.errors,
        "first_error": s.first_error,
        "cluster_cpu_us_per_write": round(s.cluster_cpu_us_per_write, 1),
        "client_cpu_us_per_write": round(s.client_cpu_us_per_write, 1),
        "foreign_cpu": opt(s.foreign_cpu, 3),
        "disk_writes_per_write": opt(s.disk_writes_per_write, 3),
        "disk_flushes_per_write": opt(s.disk_flushes_per_write, 3),
        "fdatasync_p50_ms": round(s.fsync_p50_ms, 4),
        "p50_over_fdatasync_p50": round(s.p50_ms / s.fsync_p50_ms, 3),
        "log_index_after": s.log_after.map(|l| l.0),
        "snapshot_index_after": s.log_after.and_then(|l| l.1),
        "leader": s.leader,
        "leader_after": s.leader_after,
    })
}

fn round(v: f64, decimals: usize) -> Value {
    let f = 10f64.powi(decimals as i32);
    json!((v * f).round() / f)
}

fn plan(args: &Args) -> Result<Plan> {
    let window = Duration::from_secs(args.duration.unwrap_or(if args.quick { 2 } else { 10 }));
    if window.is_zero() {
        bail!("--duration must be positive");
    }
    if args.clients.is_empty() || args.clients.contains(&0) {
        bail!("--clients: give positive client counts");
    }
    let systems = match &args.only {
        None => System::ALL.to_vec(),
        Some(names) => {
            let mut out = Vec::new();
            for n in names {
                let s = System::ALL
                    .into_iter()
                    .find(|s| s.name() == n.trim())
                    .with_context(|| format!("--only: unknown system {n:?} (weft, etcd)"))?;
                out.push(s);
            }
            out
        }
    };
    Ok(Plan {
        repeats: args
            .repeats
            .unwrap_or(if args.quick { 1 } else { 3 })
            .max(1),
        warmup: if window.as_secs() >= 10 {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(1)
        },
        window,
        clients: args.clients.clone(),
        systems,
        via_follower: args.via_follower,
        fsync_delay: match args.fsync_delay_ms {
            None => Duration::ZERO,
            Some(ms) if ms.is_finite() && ms >= 0.0 => Duration::from_secs_f64(ms / 1e3),
            Some(ms) => bail!("--fsync-delay-ms: {ms} is not a delay"),
        },
        spare_leader: args.fsync_delay_spares_leader,
        fsync_iterations: args
            .fsync_iterations
            .unwrap_or(if args.quick { 50 } else { 200 })
            .max(1),
    })
}

fn settings(plan: &Plan, quick: bool) -> Value {
    json!({
        "quick": quick,
        "repeats": plan.repeats,
        "window_s": plan.window.as_secs(),
        "warmup_s": plan.warmup.as_secs(),
        "clients": plan.clients,
        "systems": plan.systems.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "via_follower": plan.via_follower,
        "fsync_iterations": plan.fsync_iterations,
        "fsync_delay_ms": plan.fsync_delay.as_secs_f64() * 1e3,
        "fsync_delay_spares_leader": plan.spare_leader,
        "weft": "3 × weft-control (openraft 0.9, redb, fsync per commit), defaults: heartbeat 100 ms, election 300–600 ms",
        "etcd": "3 × etcd (Debian etcd-server), defaults: heartbeat 100 ms, election 1000 ms, --logger zap",
    })
}

/// The workspace commit weft-control was built from, `+dirty` when the control plane's sources
/// (control/, xds/, proxy/) had uncommitted changes.
fn weft_source() -> Option<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(workspace)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--", "control", "xds", "proxy"])
        .is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit}+dirty")
    } else {
        commit
    })
}

fn machine(tmp: &Path, device: Option<&str>) -> Value {
    let mut m = workspace::machine();
    let write_cache = device.and_then(|d| {
        std::fs::read_to_string(format!("/sys/block/{d}/queue/write_cache"))
            .ok()
            .map(|v| v.trim().to_string())
    });
    m["data_dir_parent"] = json!(tmp.parent().map(|p| p.display().to_string()));
    m["disk"] = json!(device);
    m["disk_write_cache"] = json!(write_cache);
    m
}

fn default_out(quick: bool, fsync_delay: Duration) -> PathBuf {
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    if !fsync_delay.is_zero() {
        let ms = fsync_delay.as_secs_f64() * 1e3;
        let mode = if quick { "-quick" } else { "" };
        results.join(format!("tmp/raft-write-fsync-delay-{ms}ms{mode}.json"))
    } else if quick {
        results.join("tmp/raft-write.json")
    } else {
        results.join("raft-write.json")
    }
}

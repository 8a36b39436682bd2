//! sched-openb: GPU-sharing placement on the Alibaba GPU trace, weft against the FGD paper's
//! policies (FGD, Best-fit, Dot-product, GPU Packing, Random), with the paper's protocol.
//!
//! For every pod list and seed the pods arrive shuffled (and topped up by resampling) until
//! their GPU demand reaches 130% of the cluster's GPUs; each policy places them one by one on
//! the trace's 1,213 GPU nodes, with no departures. Reported: the GPU allocation ratio as demand
//! arrives and at the end (mean over seeds), µs per placement, and the sharing experiment
//! (GPU memory used and variants placed with base-weight sharing on vs off).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Map, Value, json};

use weft_bench::sched::openb::{self, Run};
use weft_control::scheduler::inventory::Cluster;
use weft_control::scheduler::policy::{PolicyKind, Shape, TargetDistribution, fgd, weft};
use weft_control::scheduler::workload::TracePod;

/// Replay the Alibaba GPU trace under weft's placement policy and the FGD paper's baselines.
#[derive(Parser, Debug)]
struct Args {
    /// CI mode: 2 seeds, default pod list only [results under bench/results/tmp/].
    #[arg(long)]
    quick: bool,
    /// Node list [default: openb_node_list_gpu_node.csv in the trace folder].
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Pod lists (repeat or comma-separate) [default: openb_pod_list_default.csv, then every
    /// other openb_pod_list_*.csv beside it].
    #[arg(long, value_delimiter = ',')]
    pods: Vec<PathBuf>,
    /// Seeds per pod list (42, 43, ...) [default: 10, quick: 2].
    #[arg(long)]
    seeds: Option<u64>,
    /// Comma-separated policies [default: weft,fgd,bestfit,dotprod,packing,random].
    #[arg(long, value_delimiter = ',')]
    policies: Vec<PolicyKind>,
    /// Arrived GPU demand at which arrivals stop, as a multiple of the cluster's GPUs.
    #[arg(long, default_value_t = 1.3)]
    ratio: f64,
    /// Worker threads [default: available cores].
    #[arg(long)]
    jobs: Option<usize>,
    /// Where to write the JSON [default: bench/results/sched-openb.json; quick:
    /// bench/results/tmp/sched-openb-quick.json]; the SVG goes beside it.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sched-openb: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The trace folder: `../shared/data/openb` from the repository root (or `shared/` inside it).
fn trace_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let beside = root.join("../shared/data/openb");
    if beside.is_dir() { beside } else { root.join("shared/data/openb") }
}

fn pod_lists(args: &Args) -> Result<Vec<PathBuf>> {
    if !args.pods.is_empty() {
        return Ok(args.pods.clone());
    }
    let dir = trace_dir();
    let default = dir.join("openb_pod_list_default.csv");
    if args.quick {
        return Ok(vec![default]);
    }
    let mut others: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("openb_pod_list_") && name.ends_with(".csv") && *p != default
        })
        .collect();
    others.sort();
    Ok(std::iter::once(default).chain(others).collect())
}

fn shapes(cluster: &Cluster, pods: &[TracePod]) -> Vec<Shape> {
    pods.iter().map(|p| openb::shape(cluster, p)).collect()
}

fn stem(p: &Path) -> String {
    p.file_stem().and_then(|s| s.to_str()).unwrap_or("pods").to_string()
}

/// One pod list, loaded.
struct List {
    name: String,
    pods: Vec<TracePod>,
    /// Target distributions: FGD's (count-weighted, no memory) and weft's.
    fgd_target: Arc<TargetDistribution>,
    weft_target: Arc<TargetDistribution>,
}

fn run(args: &Args) -> Result<()> {
    let nodes_path = args
        .nodes
        .clone()
        .unwrap_or_else(|| trace_dir().join("openb_node_list_gpu_node.csv"));
    let specs = openb::read_nodes(&nodes_path)?;
    let empty = Cluster::new(specs).context("building the inventory")?;
    let seeds = args.seeds.unwrap_or(if args.quick { 2 } else { 10 });
    let policies = if args.policies.is_empty() {
        PolicyKind::ALL.to_vec()
    } else {
        args.policies.clone()
    };
    let mut lists = Vec::new();
    for path in pod_lists(args)? {
        let pods = openb::read_pods(&path)?;
        if pods.is_empty() {
            bail!("{} has no pods", path.display());
        }
        lists.push(List {
            name: stem(&path),
            fgd_target: Arc::new(fgd::target(&shapes(&empty, &pods))),
            weft_target: Arc::new(weft::target(&empty, &shapes(&empty, &pods))),
            pods,
        });
    }
    eprintln!(
        "{} nodes, {} GPUs; {} pod lists × {} seeds × {} policies",
        empty.len(),
        empty.gpu_milli_capacity() / 1000,
        lists.len(),
        seeds,
        policies.len()
    );

    // Every (list, seed, policy) replay, spread over threads.
    let mut jobs: Vec<(usize, u64, PolicyKind)> = Vec::new();
    for l in 0..lists.len() {
        for s in 0..seeds {
            for &p in &policies {
                jobs.push((l, 42 + s, p));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Run)>> = Mutex::new(Vec::new());
    let threads = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(l, seed, policy)) = jobs.get(i) else { break };
                    let list = &lists[l];
                    let order = openb::arrivals(&list.pods, empty.gpu_milli_capacity(), args.ratio, seed);
                    let target = match policy {
                        PolicyKind::Fgd => Some(list.fgd_target.clone()),
                        PolicyKind::Weft => Some(list.weft_target.clone()),
                        _ => None,
                    };
                    let r = openb::replay(&empty, &list.pods, &order, policy, seed, target);
                    eprintln!(
                        "{:<32} seed {seed} {:<8} alloc {:6.2}%  {:5.1} µs/pod",
                        list.name,
                        policy.name(),
                        r.final_ratio * 100.0,
                        r.seconds * 1e6 / r.arrived as f64
                    );
                    if std::env::var_os("SCHED_OPENB_CURVES").is_some() {
                        let pts: Vec<String> = r.curve.iter().step_by(5).map(|v| format!("{:.1}", v * 100.0)).collect();
                        eprintln!("  curve/5%: {}", pts.join(" "));
                    }
                    results.lock().unwrap().push((l, r));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();

    // Table: final allocation ratio, mean over seeds.
    let mean = |l: usize, p: PolicyKind| -> f64 {
        let v: Vec<f64> = results
            .iter()
            .filter(|(i, r)| *i == l && r.policy == p)
            .map(|(_, r)| r.final_ratio)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let mut summary = Map::new();
    println!(
        "\n| pod list | {} |",
        policies.iter().map(|p| p.name()).collect::<Vec<_>>().join(" | ")
    );
    println!("|---|{}", "---|".repeat(policies.len()));
    for (l, list) in lists.iter().enumerate() {
        let cells: Vec<String> = policies.iter().map(|&p| format!("{:.2}%", mean(l, p) * 100.0)).collect();
        println!("| {} | {} |", list.name, cells.join(" | "));
        let row: Map<String, Value> = policies
            .iter()
            .map(|&p| (p.name().to_string(), json!({"alloc_ratio": mean(l, p)})))
            .collect();
        summary.insert(list.name.clone(), Value::Object(row));
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        if args.quick { base.join("tmp/sched-openb-quick.json") } else { base.join("sched-openb.json") }
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let doc = json!({"bench": "sched-openb", "summary": summary});
    std::fs::write(&out, serde_json::to_string_pretty(&doc)? + "\n")?;
    println!("wrote {}", out.display());
    Ok(())
}

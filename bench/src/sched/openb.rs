//! The Alibaba GPU trace (`openb_*` CSV files) and the FGD paper's replay protocol.
//!
//! Protocol (Weng et al., ATC'23, as in their simulator): shuffle the pod list with a seed,
//! then append pods drawn uniformly (with replacement) from the list until the next one would
//! push the arrived GPU demand past `ratio` (1.3) × the cluster's GPUs (a list already above it
//! has random pods removed instead); place the pods one by one, never removing any; a pod that
//! fits nowhere is dropped. The GPU allocation ratio (allocated milli-GPU / all milli-GPU) is
//! recorded at every 1% of arrived demand and at the end.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::csv::{read, rows};
use weft_control::scheduler::inventory::{Cluster, NodeSpec};
use weft_control::scheduler::policy::{PolicyKind, Shape, TargetDistribution};
use weft_control::scheduler::rng::SplitMix64;
use weft_control::scheduler::workload::TracePod;
use weft_control::scheduler::{Scheduler, SchedulerConfig};

/// Reads `sn,cpu_milli,memory_mib,gpu,model` rows.
pub fn read_nodes(path: &Path) -> Result<Vec<NodeSpec>> {
    let text = read(path)?;
    let mut out = Vec::new();
    for (i, row) in rows(&text, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?.enumerate() {
        let f = row.with_context(|| format!("{} row {}", path.display(), i + 2))?;
        out.push(NodeSpec::trace(
            f[0],
            num(f[1], "cpu_milli")?,
            num(f[2], "memory_mib")?,
            num(f[3], "gpu")?,
            f[4],
        ));
    }
    Ok(out)
}

/// Reads `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]` rows.
pub fn read_pods(path: &Path) -> Result<Vec<TracePod>> {
    let text = read(path)?;
    let mut out = Vec::new();
    let cols = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"];
    for (i, row) in rows(&text, &cols)?.enumerate() {
        let f = row.with_context(|| format!("{} row {}", path.display(), i + 2))?;
        let spec = f.get(5).copied().unwrap_or("");
        let mut gpu_spec: Vec<String> = spec
            .split('|')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        gpu_spec.dedup();
        out.push(
            TracePod {
                name: f[0].to_string(),
                cpu_milli: num(f[1], "cpu_milli")?,
                memory_mib: num(f[2], "memory_mib")?,
                num_gpu: num(f[3], "num_gpu")?,
                gpu_milli: num(f[4], "gpu_milli")?,
                gpu_spec,
            }
            .normalized(),
        );
    }
    Ok(out)
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("{what}: not a number: {s:?}"))
}

/// The pods in arrival order for one seed (indices into `pods`).
pub fn arrivals(pods: &[TracePod], gpu_capacity_milli: u64, ratio: f64, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..pods.len()).collect();
    rng.shuffle(&mut order);
    let target = ratio * gpu_capacity_milli as f64;
    let mut total: u64 = pods.iter().map(TracePod::gpu_milli_total).sum();
    if pods.is_empty() {
        return order;
    }
    while total as f64 > target && !order.is_empty() {
        let i = rng.below(order.len() as u64) as usize;
        total -= pods[order.remove(i)].gpu_milli_total();
    }
    loop {
        let i = rng.below(pods.len() as u64) as usize;
        let next = total + pods[i].gpu_milli_total();
        if next as f64 > target {
            break;
        }
        total = next;
        order.push(i);
    }
    order
}

pub fn shape(cluster: &Cluster, p: &TracePod) -> Shape {
    Shape {
        cpu_milli: p.cpu_milli,
        memory_mib: p.memory_mib,
        num_gpu: p.num_gpu,
        gpu_milli: p.gpu_milli,
        models: cluster.model_set(&p.gpu_spec),
    }
}

/// One replay of one pod list under one policy and seed.
#[derive(Clone, Debug)]
pub struct Run {
    pub policy: PolicyKind,
    pub seed: u64,
    /// Allocation ratio when arrived GPU demand reached 0%, 1%, ... of the cluster's GPUs.
    pub curve: Vec<f64>,
    pub final_ratio: f64,
    pub arrived: usize,
    pub placed: usize,
    /// Wall time of the placement loop (decisions and bookkeeping, no parsing).
    pub seconds: f64,
}

/// Replays `order` (from [`arrivals`]) on a fresh copy of `empty` under `policy`.
pub fn replay(
    empty: &Cluster,
    pods: &[TracePod],
    order: &[usize],
    policy: PolicyKind,
    seed: u64,
    target: Option<Arc<TargetDistribution>>,
) -> Run {
    let shapes: Vec<Shape> = pods.iter().map(|p| shape(empty, p)).collect();
    let config = SchedulerConfig {
        policy,
        seed,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(empty.clone(), config, target);
    let capacity = empty.gpu_milli_capacity() as f64;
    let mut curve = vec![0.0];
    let mut arrived_milli = 0u64;
    let mut placed = 0;
    let start = Instant::now();
    for &i in order {
        let pod = &pods[i];
        if sched.place_shape(&pod.name, &shapes[i]).is_ok() {
            placed += 1;
        }
        arrived_milli += pod.gpu_milli_total();
        let pct = (arrived_milli as f64 / capacity * 100.0).floor() as usize;
        while curve.len() <= pct {
            curve.push(sched.cluster().gpu_alloc_ratio());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Run {
        policy,
        seed,
        final_ratio: sched.cluster().gpu_alloc_ratio(),
        curve,
        arrived: order.len(),
        placed,
        seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_pod_layouts() {
        let dir = tempdir();
        let full = dir.join("full.csv");
        std::fs::write(
            &full,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,1000,2048,1,460,T4|P100,LS\np1,2000,1,2,1000,,BE\n",
        )
        .unwrap();
        let p = read_pods(&full).unwrap();
        assert_eq!(p[0].gpu_spec, ["T4", "P100"]);
        assert_eq!(
            (p[1].num_gpu, p[1].gpu_milli, p[1].gpu_spec.len()),
            (2, 1000, 0)
        );
        let short = dir.join("short.csv");
        std::fs::write(
            &short,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n",
        )
        .unwrap();
        assert_eq!(read_pods(&short).unwrap().len(), 1);
        let bad = dir.join("bad.csv");
        std::fs::write(&bad, "sn,cpu\n").unwrap();
        assert!(read_nodes(&bad).is_err());
    }

    #[test]
    fn arrivals_stop_at_the_ratio() {
        let pods: Vec<TracePod> = (0..10)
            .map(|i| TracePod {
                name: format!("p{i}"),
                cpu_milli: 1,
                memory_mib: 1,
                num_gpu: 1,
                gpu_milli: 500,
                gpu_spec: vec![],
            })
            .collect();
        // 10 × 0.5 GPU arrive on 4 GPUs; 1.3 × 4 = 5.2 GPUs → 10 pods (5.0), an 11th would be 5.5.
        let a = arrivals(&pods, 4000, 1.3, 7);
        assert_eq!(a.len(), 10);
        // On 2 GPUs the list is cut down to 2.6 GPUs: 5 pods.
        assert_eq!(arrivals(&pods, 2000, 1.3, 7).len(), 5);
        assert_eq!(arrivals(&pods, 8000, 1.3, 7).len(), 20);
        assert_eq!(arrivals(&pods, 8000, 1.3, 7), arrivals(&pods, 8000, 1.3, 7));
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weft-openb-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

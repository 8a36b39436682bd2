//! The sharing experiment: a synthetic catalogue of model variants placed on the trace's
//! nodes with base-weight sharing on and off.
//!
//! Catalogue (seeded): `bases` base models with sizes log-uniform in 2–70 GB, each with
//! `variants_per_base` variants whose deltas are 1–5% of the base; every replica also needs a
//! working set (KV cache, activations) of 1 GiB + 2% of the base and 0.1–0.25 of a GPU's
//! compute. Replica counts follow a Zipf law (exponent 1) over the variants in a seeded random
//! popularity order, at least one replica each. The trace's nodes get GPU memory by model
//! (P100, T4, V100M16: 16 GiB; A10: 24 GiB; V100M32: 32 GiB; the anonymized G2 and G3: 32
//! and 80 GiB, an assumption). Everything is placed as one plan (variants of a base
//! consecutively); a variant counts as placed when all its replicas are.

use std::collections::HashMap;

use serde_json::{Value, json};
use weft_control::scheduler::inventory::{Cluster, NodeSpec};
use weft_control::scheduler::policy::PolicyKind;
use weft_control::scheduler::rng::SplitMix64;
use weft_control::scheduler::workload::{InferenceReplica, Workload};
use weft_control::scheduler::{Scheduler, SchedulerConfig};

const GIB: f64 = (1u64 << 30) as f64;
const GB: f64 = 1e9;

/// GPU memory per model in the trace (GiB); G2 and G3 are anonymized in the trace: assumed.
pub fn gpu_memory_gib(model: &str) -> u64 {
    match model {
        "A10" => 24,
        "V100M32" | "G2" => 32,
        "G3" => 80,
        _ => 16,
    }
}

/// The trace's nodes with GPU memory set.
pub fn nodes_with_memory(specs: &[NodeSpec]) -> Vec<NodeSpec> {
    specs
        .iter()
        .map(|s| NodeSpec {
            gpu_memory_bytes: gpu_memory_gib(&s.gpu_model) << 30,
            ..s.clone()
        })
        .collect()
}

/// Catalogue size.
#[derive(Clone, Copy, Debug)]
pub struct Catalogue {
    pub bases: usize,
    pub variants_per_base: usize,
    /// Total replicas over all variants (at least one per variant).
    pub replicas: usize,
    pub seed: u64,
}

/// The replicas of a catalogue.
pub fn replicas(c: &Catalogue) -> Vec<InferenceReplica> {
    let mut rng = SplitMix64::new(c.seed);
    let mut variants = Vec::new();
    for b in 0..c.bases {
        let size_gb = (2f64.ln() + rng.unit() * (70f64.ln() - 2f64.ln())).exp();
        let base_bytes = (size_gb * GB) as u64;
        for v in 0..c.variants_per_base {
            let delta = (base_bytes as f64 * (0.01 + 0.04 * rng.unit())) as u64;
            variants.push((
                format!("base{b:02}"),
                base_bytes,
                format!("base{b:02}-v{v:02}"),
                delta,
            ));
        }
    }
    // Zipf popularity over a random order of the variants.
    let mut order: Vec<usize> = (0..variants.len()).collect();
    rng.shuffle(&mut order);
    let norm: f64 = (1..=variants.len()).map(|k| 1.0 / k as f64).sum();
    let mut out = Vec::new();
    for (k, &vi) in order.iter().enumerate() {
        let (base, base_bytes, variant, delta) = &variants[vi];
        let share = 1.0 / (k + 1) as f64 / norm;
        let n = ((c.replicas as f64 * share).round() as usize).max(1);
        for r in 0..n {
            out.push(InferenceReplica {
                name: format!("{variant}-r{r}"),
                variant: variant.clone(),
                base_model: base.clone(),
                base_bytes: *base_bytes,
                delta_bytes: *delta,
                working_set_bytes: (GIB + 0.02 * *base_bytes as f64) as u64,
                compute_milli: 100 + (rng.below(16) as u32) * 10,
                cpu_milli: 1000,
                memory_mib: 8192,
                priority: 0,
                class: Default::default(),
                min_uptime_hours: 0.0,
                gpu_spec: vec![],
                launch: None,
            });
        }
    }
    out
}

/// One placement of the catalogue.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    pub replicas: usize,
    pub replicas_placed: usize,
    pub variants: usize,
    pub variants_placed: usize,
    pub gpu_memory_bytes: u64,
    pub seconds: f64,
}

impl Outcome {
    pub fn memory_per_replica(&self) -> f64 {
        self.gpu_memory_bytes as f64 / self.replicas_placed.max(1) as f64
    }

    pub fn json(&self) -> Value {
        json!({
            "replicas": self.replicas,
            "replicas_placed": self.replicas_placed,
            "variants": self.variants,
            "variants_placed": self.variants_placed,
            "gpu_memory_gib": (self.gpu_memory_bytes as f64 / GIB * 10.0).round() / 10.0,
            "gpu_memory_gib_per_replica": (self.memory_per_replica() / GIB * 1000.0).round() / 1000.0,
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
        })
    }
}

/// Places `replicas` on `nodes` with sharing on or off.
pub fn place(nodes: &[NodeSpec], replicas: &[InferenceReplica], sharing: bool) -> Outcome {
    let cluster = Cluster::new(nodes.to_vec()).expect("the trace's nodes form an inventory");
    let config = SchedulerConfig {
        policy: PolicyKind::Weft,
        sharing,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(cluster, config, None);
    let workloads: Vec<Workload> = replicas.iter().cloned().map(Workload::Replica).collect();
    let start = std::time::Instant::now();
    let plan = sched.plan(&workloads, false);
    let seconds = start.elapsed().as_secs_f64();
    let mut per_variant: HashMap<&str, (usize, usize)> = HashMap::new();
    for r in replicas {
        per_variant.entry(r.variant.as_str()).or_default().0 += 1;
    }
    let by_name: HashMap<&str, &str> = replicas
        .iter()
        .map(|r| (r.name.as_str(), r.variant.as_str()))
        .collect();
    for p in &plan.placed {
        if let Some(e) = by_name
            .get(p.workload.as_str())
            .and_then(|v| per_variant.get_mut(v))
        {
            e.1 += 1;
        }
    }
    Outcome {
        replicas: replicas.len(),
        replicas_placed: plan.placed.len(),
        variants: per_variant.len(),
        variants_placed: per_variant
            .values()
            .filter(|(n, placed)| n == placed)
            .count(),
        gpu_memory_bytes: sched.cluster().gpu_memory_used(),
        seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_seeded_and_zipf_shaped() {
        let c = Catalogue {
            bases: 5,
            variants_per_base: 4,
            replicas: 200,
            seed: 1,
        };
        let a = replicas(&c);
        assert_eq!(a.len(), replicas(&c).len());
        assert!(a.len() >= 200 - 20 && a.len() <= 200 + 20, "{}", a.len());
        let mut per: HashMap<&str, usize> = HashMap::new();
        for r in &a {
            *per.entry(r.variant.as_str()).or_default() += 1;
            let f = r.delta_bytes as f64 / r.base_bytes as f64;
            assert!((0.01..=0.05).contains(&f));
            assert!((2e9..=70e9).contains(&(r.base_bytes as f64)));
        }
        assert_eq!(per.len(), 20, "every variant has a replica");
        let max = per.values().max().unwrap();
        assert!(*max > 40, "the most popular variant dominates: {max}");
    }

    #[test]
    fn sharing_uses_less_memory_per_replica() {
        let nodes = nodes_with_memory(&[
            NodeSpec::trace("a", 96_000, 1 << 20, 8, "G2"),
            NodeSpec::trace("b", 96_000, 1 << 20, 8, "G3"),
        ]);
        let reps = replicas(&Catalogue {
            bases: 3,
            variants_per_base: 4,
            replicas: 40,
            seed: 3,
        });
        let on = place(&nodes, &reps, true);
        let off = place(&nodes, &reps, false);
        assert!(on.replicas_placed >= off.replicas_placed);
        assert!(on.memory_per_replica() < off.memory_per_replica());
    }
}

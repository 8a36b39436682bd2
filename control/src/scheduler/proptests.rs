//! Property tests: random clusters and random sequences of placements (with and without
//! preemption) and releases, checked after every step:
//! - no GPU (compute or memory), node CPU or node memory is ever over-committed, recomputed
//!   from the live allocations independently of the inventory's own aggregates (which must
//!   agree);
//! - gangs are all-or-nothing: a failed gang placement changes nothing, and every live gang has
//!   all its workers;
//! - preemption never evicts work of equal or higher priority, and evicts gangs whole.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::inventory::{AllocId, Allocation, Cluster, Level, MILLI, NodeSpec, Pool};
use super::place::{Scheduler, SchedulerConfig};
use super::policy::PolicyKind;
use super::workload::{
    InferenceReplica, ServiceClass, TopologyConstraint, TracePod, TrainingGang, Workload,
};

const GB: u64 = 1 << 30;

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        (4u32..64).prop_map(|c| c * 1000),
        (8u64..256).prop_map(|m| m * 1024),
        0u8..=8,
        prop::bool::ANY,
        prop_oneof![Just(0u64), (16u64..=80).prop_map(|g| g * GB)],
        prop::bool::ANY,
        0u8..2,
        0.0f64..12.0,
    )
        .prop_map(
            |(cpu, mem, gpus, model_b, gpu_mem, spot, rack, uptime)| NodeSpec {
                name: String::new(),
                cpu_milli: cpu,
                memory_mib: mem,
                gpu_model: if model_b { "B" } else { "A" }.into(),
                gpu_count: gpus,
                gpu_memory_bytes: gpu_mem,
                topology: super::inventory::Topology {
                    zone: "z".into(),
                    rack: format!("r{rack}"),
                    switch: String::new(),
                },
                pool: if spot { Pool::Spot } else { Pool::OnDemand },
                price_per_hour: 1.0,
                expected_uptime_hours: Some(uptime),
            },
        )
}

fn class() -> impl Strategy<Value = ServiceClass> {
    prop_oneof![
        Just(ServiceClass::Critical),
        Just(ServiceClass::Standard),
        Just(ServiceClass::BestEffort)
    ]
}

fn workload() -> impl Strategy<Value = Workload> {
    let pod = (
        (0u32..16).prop_map(|c| c * 1000),
        (0u64..64).prop_map(|m| m * 1024),
        0u8..=3,
        prop_oneof![(1u32..10).prop_map(|x| x * 100), Just(MILLI)],
    )
        .prop_map(|(cpu, mem, n, milli)| {
            Workload::Pod(
                TracePod {
                    name: String::new(),
                    cpu_milli: cpu,
                    memory_mib: mem,
                    num_gpu: n,
                    gpu_milli: milli,
                    gpu_spec: vec![],
                }
                .normalized(),
            )
        });
    let replica = (
        0usize..3,
        1u64..30,
        1u32..=10,
        (0u32..8).prop_map(|c| c * 1000),
        -2i32..=3,
        class(),
        0.0f64..8.0,
    )
        .prop_map(|(base, base_gb, compute, cpu, priority, class, uptime)| {
            Workload::Replica(InferenceReplica {
                name: String::new(),
                variant: String::new(),
                base_model: format!("base{base}"),
                base_bytes: base_gb * GB,
                delta_bytes: GB / 2,
                working_set_bytes: GB,
                compute_milli: compute * 50,
                cpu_milli: cpu,
                memory_mib: 4096,
                priority,
                class,
                min_uptime_hours: uptime,
                gpu_spec: vec![],
                launch: None,
            })
        });
    let gang = (
        1u16..=4,
        1u8..=4,
        (0u32..16).prop_map(|c| c * 1000),
        -2i32..=3,
        prop::option::of(prop::bool::ANY),
        class(),
    )
        .prop_map(|(workers, gpus, cpu, priority, topo, class)| {
            Workload::Gang(TrainingGang {
                name: String::new(),
                workers,
                gpus_per_worker: gpus,
                gpu_memory_bytes: 8 * GB,
                cpu_milli: cpu,
                memory_mib: 8192,
                priority,
                class,
                min_uptime_hours: 0.0,
                topology: topo.map(|required| TopologyConstraint {
                    level: Level::Rack,
                    required,
                }),
                gpu_spec: vec![],
            })
        });
    prop_oneof![pod, replica, gang]
}

#[derive(Clone, Debug)]
enum Op {
    Place(Workload, bool),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (workload(), prop::bool::ANY).prop_map(|(w, p)| Op::Place(w, p)),
        1 => (0usize..64).prop_map(Op::Release),
    ]
}

fn set_name(w: &mut Workload, name: String) {
    match w {
        Workload::Pod(p) => p.name = name,
        Workload::Replica(r) => r.name = name,
        Workload::Gang(g) => g.name = name,
    }
}

/// Recomputes every node's and GPU's use from the allocations and checks capacity and the
/// inventory's aggregates.
fn check_capacity(c: &Cluster) -> Result<(), TestCaseError> {
    let mut cpu = vec![0u64; c.len()];
    let mut mem = vec![0u64; c.len()];
    let mut milli: HashMap<(u32, u8), u64> = HashMap::new();
    let mut own: HashMap<(u32, u8), u64> = HashMap::new();
    let mut bases: HashMap<(u32, u8), BTreeSet<(String, u64)>> = HashMap::new();
    for (_, a) in c.allocations() {
        cpu[a.node as usize] += u64::from(a.cpu_milli);
        mem[a.node as usize] += a.memory_mib;
        for g in &a.gpus {
            *milli.entry((a.node, g.gpu)).or_default() += u64::from(g.milli);
            *own.entry((a.node, g.gpu)).or_default() += g.memory_bytes;
            if let Some(b) = &a.shared_base {
                bases
                    .entry((a.node, g.gpu))
                    .or_default()
                    .insert((b.base.clone(), b.bytes));
            }
        }
    }
    for n in 0..c.len() as u32 {
        let s = c.spec(n);
        let f = c.node(n);
        prop_assert!(
            cpu[n as usize] <= u64::from(s.cpu_milli),
            "CPU over-committed on {n}"
        );
        prop_assert!(
            mem[n as usize] <= s.memory_mib,
            "memory over-committed on {n}"
        );
        prop_assert_eq!(
            u64::from(f.cpu_milli),
            u64::from(s.cpu_milli) - cpu[n as usize]
        );
        prop_assert_eq!(f.memory_mib, s.memory_mib - mem[n as usize]);
        let mut free_total = 0;
        for (g, free) in c.gpus(n).iter().enumerate() {
            let k = (n, g as u8);
            let used = milli.get(&k).copied().unwrap_or(0);
            prop_assert!(
                used <= u64::from(MILLI),
                "GPU {n}/{g} compute over-committed"
            );
            prop_assert_eq!(u64::from(free.milli), u64::from(MILLI) - used);
            free_total += free.milli;
            if s.gpu_memory_bytes > 0 {
                let resident: u64 = bases.get(&k).map_or(0, |b| b.iter().map(|x| x.1).sum());
                let used = own.get(&k).copied().unwrap_or(0) + resident;
                prop_assert!(
                    used <= s.gpu_memory_bytes,
                    "GPU {n}/{g} memory over-committed"
                );
                prop_assert_eq!(free.memory_bytes, s.gpu_memory_bytes - used);
            }
        }
        prop_assert_eq!(f.gpu_milli, free_total);
    }
    Ok(())
}

fn snapshot(c: &Cluster) -> BTreeMap<AllocId, Allocation> {
    c.allocations().map(|(i, a)| (i, a.clone())).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn placement_invariants(
        specs in prop::collection::vec(node_spec(), 1..6),
        ops in prop::collection::vec(op(), 1..40),
        policy in prop::sample::select(PolicyKind::ALL.to_vec()),
        sharing in prop::bool::ANY,
    ) {
        let specs: Vec<NodeSpec> = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| NodeSpec { name: format!("n{i}"), ..s })
            .collect();
        let config = SchedulerConfig { policy, sharing, max_variants_per_gpu: 3, ..SchedulerConfig::default() };
        let mut s = Scheduler::new(Cluster::new(specs).unwrap(), config, None);
        // Workers each placed gang must keep, by owner.
        let mut gang_workers: HashMap<String, usize> = HashMap::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Release(k) => {
                    let ids: Vec<AllocId> = s.cluster().allocations().map(|(id, _)| id).collect();
                    if let Some(&id) = ids.get(k % ids.len().max(1)) {
                        // Releasing a gang worker alone would break the gang invariant the
                        // scheduler never breaks itself: release whole gangs.
                        let gang = s.cluster().allocation(id).and_then(|a| a.gang);
                        let group: Vec<AllocId> = match gang {
                            Some(g) => s.cluster().allocations().filter(|(_, a)| a.gang == Some(g)).map(|(i, _)| i).collect(),
                            None => vec![id],
                        };
                        for id in group {
                            s.release(id);
                        }
                    }
                }
                Op::Place(mut w, preempt) => {
                    set_name(&mut w, format!("w{i}"));
                    let before = snapshot(s.cluster());
                    let result = if preempt { s.place_preempting(&w) } else { s.place(&w) };
                    let after = snapshot(s.cluster());
                    match &result {
                        Err(_) => prop_assert_eq!(&before, &after, "a failed placement changes nothing"),
                        Ok(p) => {
                            if let Workload::Gang(g) = &w {
                                prop_assert_eq!(p.allocations.len(), usize::from(g.workers));
                                gang_workers.insert(g.name.clone(), usize::from(g.workers));
                            }
                            // Anything that disappeared was evicted by this placement, and had
                            // strictly lower priority.
                            let evicted: BTreeSet<(String, i32)> = p.preempted.iter().map(|e| (e.owner.clone(), e.priority)).collect();
                            for (id, a) in &before {
                                if !after.contains_key(id) {
                                    prop_assert!(a.priority < w.priority(), "evicted priority {} >= {}", a.priority, w.priority());
                                    prop_assert!(evicted.contains(&(a.owner.clone(), a.priority)));
                                }
                            }
                            for e in &p.preempted {
                                prop_assert!(e.priority < w.priority());
                                prop_assert!(!preempt || !e.allocations.is_empty());
                                // A gang goes whole: none of its workers remain.
                                if e.allocations.iter().any(|a| a.gang.is_some()) {
                                    prop_assert!(s.cluster().allocations().all(|(_, a)| a.owner != e.owner));
                                    gang_workers.remove(&e.owner);
                                }
                            }
                            prop_assert!(preempt || p.preempted.is_empty());
                        }
                    }
                }
            }
            check_capacity(s.cluster())?;
            // Every live gang has all its workers.
            let mut live: HashMap<&str, usize> = HashMap::new();
            for (_, a) in s.cluster().allocations() {
                if a.gang.is_some() {
                    *live.entry(a.owner.as_str()).or_default() += 1;
                }
            }
            for (owner, n) in live {
                prop_assert_eq!(Some(&n), gang_workers.get(owner), "gang {} is partial", owner);
            }
        }
    }
}

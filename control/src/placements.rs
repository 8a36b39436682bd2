//! Scheduling through the control plane, as pure logic: the GPU inventory (`nodes` resources)
//! and the committed placements (`placements` resources) become a [`Scheduler`]; a plan for new
//! workloads becomes the placements to write and the committed ones its preemptions evict; a
//! stored placement becomes the `weft.v1.Placement` pushed over xDS. The API (`api::schedule`)
//! does the IO around it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use weft_xds::resources::v1;

use crate::scheduler::inventory::{Allocation, Cluster, GpuGrant, NodeSpec, SharedBase};
use crate::scheduler::workload::Workload;
use crate::scheduler::{Reason, Scheduler, SchedulerConfig, Unplaced};

/// A committed placement as stored (kind `placements`, named after the workload): the workload
/// as it was asked for, and where each of its allocations went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementRecord {
    pub workload: Workload,
    pub allocations: Vec<Assigned>,
    /// Who placed it when not a user: `autoscaler/<name>` for the replicas an autoscaler's
    /// decision asked for (see `autoscaler::placing`), which its loop adds and releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// One allocation, with its node by name (node indexes are not stable across inventories).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assigned {
    pub node: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpus: Vec<GpuGrant>,
    #[serde(default)]
    pub shared_base: Option<SharedBase>,
}

/// The scheduler over the stored inventory with the committed placements taken back, and
/// what could not be taken back (a placement whose node left or shrank).
pub struct Loaded {
    pub scheduler: Scheduler,
    pub warnings: Vec<String>,
}

/// Builds the scheduler for a plan. `committed` must be in name order (as the store lists it),
/// which makes plans reproducible.
pub fn load(nodes: Vec<NodeSpec>, committed: &[(String, PlacementRecord)], config: SchedulerConfig) -> Result<Loaded, String> {
    let cluster = Cluster::new(nodes).map_err(|e| format!("the GPU inventory (nodes) is invalid: {e:?}"))?;
    let index: HashMap<String, u32> =
        cluster.specs().iter().enumerate().map(|(i, s)| (s.name.clone(), i as u32)).collect();
    let mut scheduler = Scheduler::new(cluster, config, None);
    let mut warnings = Vec::new();
    for (name, record) in committed {
        let priority = record.workload.priority();
        let gang = matches!(record.workload, Workload::Gang(_)).then_some(0);
        let mut allocations = Vec::with_capacity(record.allocations.len());
        let mut missing = None;
        for a in &record.allocations {
            match index.get(&a.node) {
                Some(&node) => allocations.push(Allocation {
                    owner: name.clone(),
                    node,
                    cpu_milli: a.cpu_milli,
                    memory_mib: a.memory_mib,
                    gpus: a.gpus.clone(),
                    priority,
                    gang,
                    shared_base: a.shared_base.clone(),
                }),
                None => missing = Some(a.node.clone()),
            }
        }
        if let Some(node) = missing {
            warnings.push(format!("placement {name:?} is on node {node:?}, which is not in the inventory: not counted"));
            continue;
        }
        if let Err((i, shortfall)) = scheduler.adopt(allocations) {
            warnings.push(format!(
                "placement {name:?} no longer fits node {:?} ({shortfall:?}): not counted",
                record.allocations[i].node
            ));
        }
    }
    Ok(Loaded { scheduler, warnings })
}

/// What a plan decided.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// New placements to write, by workload name.
    pub placed: BTreeMap<String, PlacementRecord>,
    /// Committed placements the plan's preemptions evict (to delete).
    pub evicted: Vec<String>,
    pub unplaced: Vec<Unplaced>,
}

/// Plans `workloads` on `scheduler` (loaded with the committed placements named `committed`).
/// A workload whose name is already placed, or repeats in the request, is refused rather
/// than placed twice.
pub fn decide(scheduler: &mut Scheduler, workloads: &[Workload], committed: &BTreeSet<String>, preempt: bool) -> Decision {
    let mut decision = Decision::default();
    let mut names = BTreeSet::new();
    let mut fresh = Vec::new();
    for w in workloads {
        let name = w.name();
        let refuse = if name.is_empty() {
            Some("the workload has no name".to_string())
        } else if committed.contains(name) {
            Some(format!("{name:?} is already placed (DELETE /v1/placements/{name} releases it)"))
        } else if !names.insert(name.to_string()) {
            Some(format!("{name:?} appears more than once in the request"))
        } else {
            None
        };
        match refuse {
            Some(detail) => decision.unplaced.push(Unplaced { workload: name.to_string(), reason: Reason::Invalid { detail } }),
            None => fresh.push(w.clone()),
        }
    }
    // What the scheduler holds before planning: a committed placement it could not take back
    // (its node left the inventory, or was left out of it) can be missing afterwards without
    // having been evicted.
    let held: BTreeSet<String> = scheduler.cluster().allocations().map(|(_, a)| a.owner.clone()).collect();
    let plan = scheduler.plan(&fresh, preempt);
    let mut evicted_by: HashMap<String, String> = HashMap::new();
    for p in &plan.placed {
        for e in &p.preempted {
            evicted_by.insert(e.owner.clone(), p.workload.clone());
        }
    }
    // Where everything is once the plan is done: later preemptions may have evicted work
    // placed earlier in the same plan.
    let cluster = scheduler.cluster();
    let mut now: BTreeMap<&str, Vec<Assigned>> = BTreeMap::new();
    for (_, a) in cluster.allocations() {
        now.entry(a.owner.as_str()).or_default().push(Assigned {
            node: cluster.spec(a.node).name.clone(),
            cpu_milli: a.cpu_milli,
            memory_mib: a.memory_mib,
            gpus: a.gpus.clone(),
            shared_base: a.shared_base.clone(),
        });
    }
    for w in &fresh {
        match now.remove(w.name()) {
            Some(allocations) => {
                decision.placed.insert(w.name().to_string(), PlacementRecord { workload: w.clone(), allocations, owner: None });
            }
            None => {
                if let Some(by) = evicted_by.get(w.name()) {
                    decision.unplaced.push(Unplaced { workload: w.name().to_string(), reason: Reason::Preempted { by: by.clone() } });
                }
            }
        }
    }
    decision.unplaced.extend(plan.unplaced);
    decision.evicted = committed.iter().filter(|n| held.contains(*n) && !now.contains_key(n.as_str())).cloned().collect();
    decision
}

/// The xDS form of a stored placement.
pub fn to_xds(name: &str, r: &PlacementRecord) -> v1::Placement {
    let (kind, variant, base_model, launch) = match &r.workload {
        Workload::Pod(_) => ("pod", String::new(), String::new(), None),
        Workload::Replica(x) => ("replica", x.variant.clone(), x.base_model.clone(), x.launch.as_deref().map(v1::Launch::from)),
        Workload::Gang(_) => ("gang", String::new(), String::new(), None),
    };
    v1::Placement {
        name: name.to_string(),
        kind: kind.into(),
        variant,
        base_model,
        priority: r.workload.priority(),
        launch,
        assignments: r
            .allocations
            .iter()
            .map(|a| v1::Assignment {
                node: a.node.clone(),
                cpu_milli: a.cpu_milli,
                memory_mib: a.memory_mib,
                gpus: a
                    .gpus
                    .iter()
                    .map(|g| v1::GpuShare { index: u32::from(g.gpu), milli: g.milli, memory_bytes: g.memory_bytes })
                    .collect(),
                shared_base: a.shared_base.as_ref().map(|b| b.base.clone()).unwrap_or_default(),
                shared_base_bytes: a.shared_base.as_ref().map_or(0, |b| b.bytes),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::Pool;
    use crate::scheduler::workload::{InferenceReplica, ServiceClass};

    const GB: u64 = 1 << 30;

    fn node(name: &str) -> NodeSpec {
        NodeSpec { gpu_memory_bytes: 80 * GB, pool: Pool::OnDemand, ..NodeSpec::trace(name, 64_000, 512_000, 2, "A100") }
    }

    fn replica(name: &str, variant: &str, priority: i32, compute: u32) -> Workload {
        Workload::Replica(InferenceReplica {
            name: name.into(),
            variant: variant.into(),
            base_model: "llama-8b".into(),
            base_bytes: 16 * GB,
            delta_bytes: GB / 2,
            working_set_bytes: 4 * GB,
            compute_milli: compute,
            cpu_milli: 1000,
            memory_mib: 4096,
            priority,
            class: ServiceClass::Standard,
            min_uptime_hours: 0.0,
            gpu_spec: vec![],
            launch: None,
        })
    }

    #[test]
    fn a_placement_the_inventory_lost_is_not_reported_evicted() {
        let (first, _) = plan(&[], &[replica("a-0", "a", 0, 500)], false);
        let mut committed: Vec<(String, PlacementRecord)> = first.placed.into_iter().collect();
        committed[0].1.allocations[0].node = "gone".into();
        let (second, warnings) = plan(&committed, &[replica("b-0", "b", 5, 1000), replica("c-0", "c", 5, 1000)], true);
        assert_eq!(warnings.len(), 1, "the lost placement is named: {warnings:?}");
        assert_eq!(second.placed.len(), 2);
        assert!(second.evicted.is_empty(), "nothing held was evicted: {second:?}");
    }

    #[test]
    fn absurd_sizes_are_unplaced_not_a_panic() {
        let mut huge = replica("huge", "a", 0, 500);
        if let Workload::Replica(r) = &mut huge {
            (r.base_bytes, r.delta_bytes, r.working_set_bytes) = (u64::MAX, u64::MAX, u64::MAX);
            r.cpu_milli = u32::MAX;
            r.memory_mib = u64::MAX;
        }
        let (d, _) = plan(&[], &[huge.clone()], true);
        assert!(d.placed.is_empty() && d.unplaced.len() == 1, "{:?}", d.unplaced);
        // Only the GPU memory absurd: the byte sums must not overflow.
        if let Workload::Replica(r) = &mut huge {
            (r.cpu_milli, r.memory_mib) = (1000, 4096);
        }
        let (d, _) = plan(&[], &[huge], true);
        assert!(d.placed.is_empty() && d.unplaced.len() == 1, "{:?}", d.unplaced);
        let gang: Workload = serde_json::from_value(serde_json::json!({
            "kind": "gang", "name": "g", "workers": u16::MAX, "gpus_per_worker": u8::MAX,
            "gpu_memory_bytes": u64::MAX, "cpu_milli": u32::MAX, "memory_mib": u64::MAX, "priority": i32::MAX
        }))
        .unwrap();
        let (d, _) = plan(&[], &[gang], true);
        assert!(d.placed.is_empty() && d.unplaced.len() == 1, "{:?}", d.unplaced);
    }

    fn plan(committed: &[(String, PlacementRecord)], ws: &[Workload], preempt: bool) -> (Decision, Vec<String>) {
        let mut l = load(vec![node("n1")], committed, SchedulerConfig::default()).unwrap();
        let names = committed.iter().map(|(n, _)| n.clone()).collect();
        (decide(&mut l.scheduler, ws, &names, preempt), l.warnings)
    }

    #[test]
    fn committed_placements_take_capacity_and_variants_share_the_base() {
        let (first, _) = plan(&[], &[replica("a-0", "a", 0, 500), replica("b-0", "b", 0, 500)], false);
        assert!(first.unplaced.is_empty(), "{first:?}");
        let a = &first.placed["a-0"].allocations[0];
        let b = &first.placed["b-0"].allocations[0];
        assert_eq!(a.node, "n1");
        assert_eq!((a.gpus[0].gpu, b.gpus[0].gpu), (b.gpus[0].gpu, a.gpus[0].gpu), "variants of one base gather on one GPU");
        assert!(b.shared_base.is_some(), "the second maps the resident base");

        // Committed: both GPUs' compute is now half used on one GPU; a third half-GPU replica
        // fits, a whole-GPU one twice does not.
        let committed: Vec<(String, PlacementRecord)> = first.placed.into_iter().collect();
        let (second, warnings) =
            plan(&committed, &[replica("c-0", "c", 0, 1000), replica("d-0", "d", 0, 1000)], false);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(second.placed.len(), 1, "one GPU left whole: {second:?}");
        assert_eq!(second.unplaced.len(), 1);
        assert!(second.evicted.is_empty());
    }

    #[test]
    fn names_are_never_placed_twice() {
        let (first, _) = plan(&[], &[replica("a-0", "a", 0, 100)], false);
        let committed: Vec<(String, PlacementRecord)> = first.placed.into_iter().collect();
        let (d, _) = plan(&committed, &[replica("a-0", "a", 0, 100), replica("x", "x", 0, 100), replica("x", "x", 0, 100)], false);
        assert_eq!(d.placed.keys().collect::<Vec<_>>(), ["x"]);
        let reasons: Vec<_> = d.unplaced.iter().map(|u| (u.workload.as_str(), u.reason.to_string())).collect();
        assert!(reasons[0].1.contains("already placed"), "{reasons:?}");
        assert!(reasons[1].1.contains("more than once"), "{reasons:?}");
    }

    #[test]
    fn preemption_evicts_committed_lower_priority_work() {
        let (first, _) = plan(&[], &[replica("low-0", "l", 0, 1000), replica("low-1", "l", 0, 1000)], false);
        assert_eq!(first.placed.len(), 2);
        let committed: Vec<(String, PlacementRecord)> = first.placed.into_iter().collect();
        let (no, _) = plan(&committed, &[replica("high", "h", 10, 1000)], false);
        assert!(no.placed.is_empty() && no.evicted.is_empty(), "without preempt nothing moves");
        let (yes, _) = plan(&committed, &[replica("high", "h", 10, 1000)], true);
        assert_eq!(yes.placed.keys().collect::<Vec<_>>(), ["high"]);
        assert_eq!(yes.evicted.len(), 1, "{yes:?}");
    }

    #[test]
    fn a_placement_whose_node_left_is_reported_not_counted() {
        let (first, _) = plan(&[], &[replica("a-0", "a", 0, 1000)], false);
        let mut committed: Vec<(String, PlacementRecord)> = first.placed.into_iter().collect();
        committed[0].1.allocations[0].node = "gone".into();
        let (d, warnings) = plan(&committed, &[replica("b", "b", 0, 1000), replica("c", "c", 0, 1000)], false);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(d.placed.len(), 2, "its capacity is free");
    }

    #[test]
    fn xds_form_names_nodes_gpus_the_shared_base_and_the_launch() {
        let mut b = replica("b-0", "b", 3, 500);
        if let Workload::Replica(r) = &mut b {
            r.launch = Some(Box::new(crate::launch::tests::own_command()));
        }
        let (d, _) = plan(&[], &[replica("a-0", "a", 3, 500), b], false);
        let p = to_xds("b-0", &d.placed["b-0"]);
        assert_eq!((p.kind.as_str(), p.variant.as_str(), p.base_model.as_str(), p.priority), ("replica", "b", "llama-8b", 3));
        assert_eq!(p.assignments[0].node, "n1");
        assert_eq!(p.assignments[0].gpus[0].milli, 500);
        assert_eq!(p.assignments[0].shared_base, "llama-8b");
        let launch = p.launch.expect("the replica's launch is pushed with it");
        assert_eq!((launch.cluster.as_str(), launch.command[0].as_str(), launch.health_path.as_str()), ("chat-b", "vllm", "/health"));
        assert_eq!(launch.labels["tier"], "gold");
        assert_eq!(to_xds("a-0", &d.placed["a-0"]).launch, None, "no launch, none pushed");
    }
}

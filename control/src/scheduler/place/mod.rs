//! Placing workloads on a [`Cluster`]: one at a time, or a whole plan.
//!
//! - Trace pods go where the configured [`PolicyKind`] says ([`Scheduler::place_shape`] is the
//!   allocation-light path the trace replay uses).
//! - Inference replicas are placed sharing-aware ([`replica`]): a GPU that already holds the
//!   replica's base model costs only the delta and working set, replicas gather where their
//!   base already is, and each GPU runs a bounded number of active variants.
//! - Training gangs are placed whole or not at all, inside one topology domain when asked
//!   ([`gang`]), with a retry/back-off/timeout helper for callers that wait for room.
//! - [`Scheduler::place_preempting`] evicts the cheapest set of strictly lower-priority work
//!   when nothing fits, never a part of a gang ([`preempt`]).
//! - Pools: critical work runs on on-demand nodes; best-effort work prefers spot nodes whose
//!   expected uptime clears its threshold; standard work may use such spot nodes too.

pub mod gang;
pub mod preempt;
pub mod reason;
pub mod replica;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use reason::{Reason, Resource};

use super::inventory::{AllocId, Allocation, Cluster, NodeId, NodeSpec, Pool, Shortfall};
use super::policy::{Placer, PolicyKind, Shape, TargetDistribution};
use super::workload::{Priority, ServiceClass, TracePod, Workload};

/// Scheduler settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    pub policy: PolicyKind,
    pub seed: u64,
    /// Share resident base weights between variants (off: every replica loads its own copy).
    pub sharing: bool,
    /// Most replicas (active variants) one GPU serves at once; 0 = no limit beyond memory.
    pub max_variants_per_gpu: u32,
    /// Expected spot uptime that work asks for when it does not say (hours).
    pub spot_min_uptime_hours: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Weft,
            seed: 0,
            sharing: true,
            max_variants_per_gpu: 8,
            spot_min_uptime_hours: 4.0,
        }
    }
}

/// A placed workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub workload: String,
    pub allocations: Vec<AllocId>,
    /// Work evicted to make room (only from [`Scheduler::place_preempting`]).
    pub preempted: Vec<Evicted>,
}

/// Work evicted by preemption: a single allocation, or every allocation of a gang.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evicted {
    pub owner: String,
    pub priority: Priority,
    pub allocations: Vec<Allocation>,
}

/// A workload that could not be placed, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unplaced {
    pub workload: String,
    #[serde(flatten)]
    pub reason: Reason,
}

/// The outcome of [`Scheduler::plan`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub placed: Vec<Placement>,
    pub unplaced: Vec<Unplaced>,
}

/// The pool rules: may work of `class` needing `min_uptime` hours run on `spec`?
pub fn pool_allows(spec: &NodeSpec, class: ServiceClass, min_uptime: f64) -> bool {
    match (class, spec.pool) {
        (_, Pool::OnDemand) => true,
        (ServiceClass::Critical, Pool::Spot) => false,
        (_, Pool::Spot) => spec.uptime_at_least(min_uptime),
    }
}

/// Preference among allowed nodes (lower first): best-effort work goes to spot first.
pub fn pool_rank(spec: &NodeSpec, class: ServiceClass) -> u8 {
    match (class, spec.pool) {
        (ServiceClass::BestEffort, Pool::Spot) => 0,
        (ServiceClass::BestEffort, Pool::OnDemand) => 1,
        _ => 0,
    }
}

/// Places workloads on a cluster it owns.
pub struct Scheduler {
    cluster: Cluster,
    placer: Placer,
    config: SchedulerConfig,
    next_gang: u32,
}

impl Scheduler {
    /// `target` is the expected workload the fragmentation-aware policies score against.
    pub fn new(
        cluster: Cluster,
        config: SchedulerConfig,
        target: Option<Arc<TargetDistribution>>,
    ) -> Self {
        let placer = Placer::new(config.policy, config.seed, target);
        Self {
            cluster,
            placer,
            config,
            next_gang: 0,
        }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Places `w` without evicting anything.
    pub fn place(&mut self, w: &Workload) -> Result<Placement, Unplaced> {
        let unplaced = |reason| Unplaced {
            workload: w.name().to_string(),
            reason,
        };
        let allocations = match w {
            Workload::Pod(p) => self.place_pod(p).map(|id| vec![id]),
            Workload::Replica(r) => self.place_replica(r).map(|id| vec![id]),
            Workload::Gang(g) => self.place_gang(g),
        }
        .map_err(unplaced)?;
        Ok(Placement {
            workload: w.name().to_string(),
            allocations,
            preempted: Vec::new(),
        })
    }

    /// Places a batch: higher priority first, then gangs (largest first, they are hardest to
    /// fit), then replicas grouped by base model (largest base first, so variants of one base
    /// are drawn together), then pods by GPU demand. With `preempt`, capacity-bound failures
    /// may evict strictly lower-priority work (including work placed earlier in the batch).
    pub fn plan(&mut self, workloads: &[Workload], preempt: bool) -> Plan {
        let mut order: Vec<&Workload> = workloads.iter().collect();
        order.sort_by_key(|w| {
            let (kind, size, base) = match w {
                Workload::Gang(g) => (0, u64::from(g.workers) * u64::from(g.gpus_per_worker), ""),
                Workload::Replica(r) => (1, r.base_bytes, r.base_model.as_str()),
                Workload::Pod(p) => (2, p.gpu_milli_total(), ""),
            };
            (
                std::cmp::Reverse(w.priority()),
                kind,
                std::cmp::Reverse(size),
                base,
            )
        });
        let mut plan = Plan::default();
        for w in order {
            let r = if preempt {
                self.place_preempting(w)
            } else {
                self.place(w)
            };
            match r {
                Ok(p) => plan.placed.push(p),
                Err(u) => plan.unplaced.push(u),
            }
        }
        plan
    }

    /// Takes back the allocations of one workload committed earlier (the control plane's
    /// stored placements), so new decisions see them: all of them or none. A gang gets a fresh
    /// gang id (ids are per scheduler, and preemption evicts a gang by its id).
    pub fn adopt(&mut self, mut allocations: Vec<Allocation>) -> Result<Vec<AllocId>, (usize, Shortfall)> {
        if allocations.iter().any(|a| a.gang.is_some()) {
            self.next_gang += 1;
            for a in &mut allocations {
                a.gang = Some(self.next_gang);
            }
        }
        let mut made = Vec::with_capacity(allocations.len());
        for (i, a) in allocations.into_iter().enumerate() {
            match self.cluster.allocate(a) {
                Ok(id) => made.push(id),
                Err(e) => {
                    for id in made {
                        self.cluster.release(id);
                    }
                    return Err((i, e));
                }
            }
        }
        Ok(made)
    }

    /// Gives back allocation `id`.
    pub fn release(&mut self, id: AllocId) -> Option<Allocation> {
        self.cluster.release(id)
    }

    fn place_pod(&mut self, p: &TracePod) -> Result<AllocId, Reason> {
        let shape = Shape {
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
            num_gpu: p.num_gpu,
            gpu_milli: p.gpu_milli,
            models: self.cluster.model_set(&p.gpu_spec),
        };
        if p.num_gpu > 0 && p.gpu_milli > 1000 {
            return Err(Reason::Invalid {
                detail: format!("gpu_milli {} is more than one GPU", p.gpu_milli),
            });
        }
        self.place_shape(&p.name, &shape)
    }

    /// Places one task of `shape` with the configured policy (the trace replay's hot path).
    pub fn place_shape(&mut self, name: &str, shape: &Shape) -> Result<AllocId, Reason> {
        self.place_shape_on(name, shape, 0, None)
    }

    /// [`Scheduler::place_shape`] with a priority and a node filter.
    fn place_shape_on(
        &mut self,
        name: &str,
        shape: &Shape,
        priority: Priority,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Result<AllocId, Reason> {
        if shape.num_gpu > 0 && shape.models.is_empty() {
            return Err(Reason::NoMatchingGpuModel);
        }
        let Some(choice) = self.placer.choose(&self.cluster, shape, allowed) else {
            let cluster = &self.cluster;
            return Err(reason::diagnose(cluster, shape, |n, _| {
                allowed.is_none_or(|a| a(n))
            }));
        };
        let alloc = Allocation {
            owner: name.to_string(),
            node: choice.node,
            cpu_milli: shape.cpu_milli,
            memory_mib: shape.memory_mib,
            gpus: choice.grants(&self.cluster, shape),
            priority,
            gang: None,
            shared_base: None,
        };
        self.cluster
            .allocate(alloc)
            .map_err(|e| unreachable_shortfall(&e))
    }
}

/// A policy proposed a node the inventory refuses: a bug, reported rather than panicking.
fn unreachable_shortfall(e: &super::inventory::Shortfall) -> Reason {
    Reason::Invalid {
        detail: format!("internal: policy chose a node that does not fit ({e:?})"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::scheduler::inventory::NodeSpec;

    pub(crate) fn pod(name: &str, cpu: u32, num_gpu: u8, milli: u32) -> TracePod {
        TracePod {
            name: name.into(),
            cpu_milli: cpu,
            memory_mib: 1024,
            num_gpu,
            gpu_milli: milli,
            gpu_spec: vec![],
        }
    }

    fn sched(policy: PolicyKind) -> Scheduler {
        let c = Cluster::new(vec![
            NodeSpec::trace("a", 16000, 65536, 2, "T4"),
            NodeSpec::trace("b", 16000, 65536, 4, "V100"),
        ])
        .unwrap();
        let config = SchedulerConfig {
            policy,
            ..SchedulerConfig::default()
        };
        Scheduler::new(c, config, None)
    }

    #[test]
    fn pods_are_placed_until_full_with_reasons() {
        for policy in PolicyKind::ALL {
            let mut s = sched(policy);
            let mut placed = 0;
            for i in 0..7 {
                let w = Workload::Pod(pod(&format!("p{i}"), 1000, 1, 1000));
                match s.place(&w) {
                    Ok(_) => placed += 1,
                    Err(u) => assert_eq!(
                        u.reason,
                        Reason::Insufficient {
                            resource: Resource::Gpu
                        }
                    ),
                }
            }
            assert_eq!(placed, 6, "{policy}");
            assert_eq!(s.cluster().gpu_alloc_ratio(), 1.0);
        }
    }

    #[test]
    fn gpu_models_are_honoured() {
        let mut s = sched(PolicyKind::Weft);
        let mut p = pod("p", 1, 1, 500);
        p.gpu_spec = vec!["V100".into()];
        let id = s.place(&Workload::Pod(p.clone())).unwrap().allocations[0];
        assert_eq!(s.cluster().allocation(id).unwrap().node, 1);
        p.gpu_spec = vec!["A100".into()];
        assert_eq!(
            s.place(&Workload::Pod(p)).unwrap_err().reason,
            Reason::NoMatchingGpuModel
        );
        let too_big = pod("big", 1, 8, 1000);
        assert_eq!(
            s.place(&Workload::Pod(too_big)).unwrap_err().reason,
            Reason::TooLarge {
                resource: Resource::Gpu
            }
        );
    }

    #[test]
    fn pool_rules() {
        let mut spot = NodeSpec::trace("s", 1, 1, 1, "T4");
        spot.pool = Pool::Spot;
        spot.expected_uptime_hours = Some(6.0);
        let od = NodeSpec::trace("o", 1, 1, 1, "T4");
        assert!(!pool_allows(&spot, ServiceClass::Critical, 0.0));
        assert!(pool_allows(&spot, ServiceClass::BestEffort, 4.0));
        assert!(!pool_allows(&spot, ServiceClass::BestEffort, 8.0));
        assert!(pool_allows(&od, ServiceClass::Critical, 100.0));
        assert!(
            pool_rank(&spot, ServiceClass::BestEffort) < pool_rank(&od, ServiceClass::BestEffort)
        );
    }
}

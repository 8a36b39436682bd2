//! Sharing-aware placement of inference replicas.
//!
//! A replica needs a share of one GPU's compute and GPU memory for its base weights, its delta
//! and its working set. Where the base is already resident (loaded by another variant's
//! replica, CUDA IPC), the replica pays only delta + working set, so among the GPUs allowed by
//! the pool rules the scheduler takes, in order of preference:
//! 1. the pool the workload's class prefers (spot first for best-effort work);
//! 2. the fewest new bytes loaded (a GPU with the base resident wins by the base's size);
//! 3. a node where the base is already resident on another GPU (variants of one base are
//!    drawn together, so later replicas find it resident and routing stays local);
//! 4. the least GPU memory left after placement (best fit, keeping large holes for large
//!    bases), then the least compute left, then the cheaper node.
//!
//! Each GPU serves at most `max_variants_per_gpu` replicas at once: every active variant needs
//! its working set resident, and beyond a handful they thrash (seed 001), so the limit bounds
//! the working sets that must coexist even where memory would allow more.

use super::{Reason, Resource, Scheduler, pool_allows, pool_rank};
use crate::scheduler::inventory::{AllocId, Allocation, GpuGrant, NodeId, SharedBase};
use crate::scheduler::workload::InferenceReplica;

/// The key residency is tracked under: the base model when sharing, otherwise a key of the
/// replica's own so that no two replicas ever share a copy.
pub(crate) fn base_key(r: &InferenceReplica, sharing: bool) -> String {
    if sharing {
        r.base_model.clone()
    } else {
        format!("{}#{}", r.base_model, r.name)
    }
}

/// Preference key of a (node, GPU) for a replica, lower first: pool rank, bytes loaded, not
/// gathered with its base, GPU memory left, compute left, price.
type ReplicaKey = (u8, u64, u8, u64, u32, u64);

/// Blocking counts while scanning, to explain a failure.
#[derive(Default)]
struct Blocked {
    eligible: bool,
    model: bool,
    big_enough: bool,
    cpu: u32,
    memory: u32,
    gpu: u32,
    gpu_memory: u32,
    limit: u32,
}

impl Scheduler {
    pub(super) fn place_replica(&mut self, r: &InferenceReplica) -> Result<AllocId, Reason> {
        self.place_replica_on(r, None)
    }

    /// Places `r` on a node `allowed` accepts (any when `None`).
    pub(super) fn place_replica_on(
        &mut self,
        r: &InferenceReplica,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Result<AllocId, Reason> {
        if r.compute_milli == 0 || r.compute_milli > 1000 {
            return Err(Reason::Invalid {
                detail: format!("compute_milli {} is not in 1..=1000", r.compute_milli),
            });
        }
        let (node, gpu) = self.best_replica_gpu(r, allowed)?;
        let alloc = Allocation {
            owner: r.name.clone(),
            node,
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            gpus: vec![GpuGrant {
                gpu,
                milli: r.compute_milli,
                memory_bytes: r.own_bytes(),
            }],
            priority: r.priority,
            gang: None,
            shared_base: Some(SharedBase {
                base: base_key(r, self.config.sharing),
                bytes: r.base_bytes,
            }),
        };
        self.cluster
            .allocate(alloc)
            .map_err(|e| super::unreachable_shortfall(&e))
    }

    /// The best (node, GPU) for `r` by the preferences in the module doc, or why there is none.
    fn best_replica_gpu(
        &self,
        r: &InferenceReplica,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Result<(NodeId, u8), Reason> {
        let c = &self.cluster;
        let models = c.model_set(&r.gpu_spec);
        let key = base_key(r, self.config.sharing);
        let uptime = if r.min_uptime_hours > 0.0 {
            r.min_uptime_hours
        } else {
            self.config.spot_min_uptime_hours
        };
        let limit = self.config.max_variants_per_gpu;
        let mut why = Blocked::default();
        let mut best: Option<(ReplicaKey, NodeId, u8)> = None;
        for n in 0..c.len() as NodeId {
            let (spec, f) = (c.spec(n), c.node(n));
            if spec.gpu_count == 0 || !models.contains(f.model) {
                continue;
            }
            why.model = true;
            if !pool_allows(spec, r.class, uptime) || allowed.is_some_and(|a| !a(n)) {
                continue;
            }
            why.eligible = true;
            let modelled = c.models_gpu_memory(n);
            if spec.cpu_milli < r.cpu_milli
                || spec.memory_mib < r.memory_mib
                || (modelled && spec.gpu_memory_bytes < r.cold_bytes())
            {
                continue;
            }
            why.big_enough = true;
            if f.cpu_milli < r.cpu_milli {
                why.cpu += 1;
                continue;
            }
            if f.memory_mib < r.memory_mib {
                why.memory += 1;
                continue;
            }
            let gpus = c.gpus(n);
            let gathered = (0..gpus.len() as u8).any(|g| c.is_resident(n, g, &key, r.base_bytes));
            for (g, free) in gpus.iter().enumerate() {
                let g = g as u8;
                if free.milli < r.compute_milli {
                    why.gpu += 1;
                    continue;
                }
                let residents = c.residents(n, g);
                let active: u32 = residents.iter().map(|x| x.users).sum();
                if limit > 0 && active >= limit {
                    why.limit += 1;
                    continue;
                }
                let resident = residents
                    .iter()
                    .any(|x| x.base == key && x.bytes == r.base_bytes);
                let loaded = if resident {
                    r.own_bytes()
                } else {
                    r.cold_bytes()
                };
                if modelled && loaded > free.memory_bytes {
                    why.gpu_memory += 1;
                    continue;
                }
                let left = if modelled {
                    free.memory_bytes - loaded
                } else {
                    0
                };
                let score = (
                    pool_rank(spec, r.class),
                    if modelled {
                        loaded
                    } else {
                        u64::from(!resident)
                    },
                    u8::from(!gathered),
                    left,
                    free.milli - r.compute_milli,
                    spec.price_per_hour.max(0.0).to_bits(),
                );
                if best.as_ref().is_none_or(|(b, _, _)| score < *b) {
                    best = Some((score, n, g));
                }
            }
        }
        if let Some((_, n, g)) = best {
            return Ok((n, g));
        }
        Err(if !why.model {
            Reason::NoMatchingGpuModel
        } else if !why.eligible {
            Reason::NoEligibleNode
        } else if !why.big_enough {
            Reason::TooLarge {
                resource: Resource::GpuMemory,
            }
        } else if why.limit > 0 && why.gpu + why.gpu_memory == 0 && why.cpu + why.memory == 0 {
            Reason::VariantLimit { limit }
        } else {
            let counts = [
                (why.gpu_memory, Resource::GpuMemory),
                (why.gpu + why.limit, Resource::Gpu),
                (why.cpu, Resource::Cpu),
                (why.memory, Resource::Memory),
            ];
            let resource = counts
                .iter()
                .max_by_key(|(c, _)| *c)
                .map_or(Resource::Gpu, |x| x.1);
            Reason::Insufficient { resource }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{Cluster, NodeSpec, Pool};
    use crate::scheduler::place::SchedulerConfig;
    use crate::scheduler::workload::{ServiceClass, Workload};

    const GB: u64 = 1 << 30;

    pub(crate) fn replica(name: &str, base: &str, base_gb: u64) -> InferenceReplica {
        InferenceReplica {
            name: name.into(),
            variant: name.into(),
            base_model: base.into(),
            base_bytes: base_gb * GB,
            delta_bytes: GB / 4,
            working_set_bytes: GB,
            compute_milli: 200,
            cpu_milli: 1000,
            memory_mib: 4096,
            priority: 0,
            class: ServiceClass::Standard,
            min_uptime_hours: 0.0,
            gpu_spec: vec![],
            launch: None,
        }
    }

    fn node(name: &str, gpus: u8, gpu_gb: u64) -> NodeSpec {
        let mut n = NodeSpec::trace(name, 64000, 1 << 20, gpus, "A100");
        n.gpu_memory_bytes = gpu_gb * GB;
        n
    }

    fn sched(nodes: Vec<NodeSpec>, sharing: bool) -> Scheduler {
        let config = SchedulerConfig {
            sharing,
            ..SchedulerConfig::default()
        };
        Scheduler::new(Cluster::new(nodes).unwrap(), config, None)
    }

    fn where_is(s: &Scheduler, id: AllocId) -> (NodeId, u8) {
        let a = s.cluster().allocation(id).unwrap();
        (a.node, a.gpus[0].gpu)
    }

    #[test]
    fn variants_of_one_base_share_its_weights() {
        let mut s = sched(vec![node("a", 2, 40), node("b", 2, 40)], true);
        let ids: Vec<AllocId> = (0..3)
            .map(|i| {
                let w = Workload::Replica(replica(&format!("v{i}"), "llama-13b", 26));
                s.place(&w).unwrap().allocations[0]
            })
            .collect();
        let first = where_is(&s, ids[0]);
        assert!(
            ids.iter().all(|&id| where_is(&s, id) == first),
            "all on the GPU holding the base"
        );
        // 26 GB base once + 3 × (0.25 + 1) GB.
        assert_eq!(s.cluster().gpu_memory_used(), 26 * GB + 3 * (GB / 4 + GB));
        // Another base cannot squeeze in beside it (15.25 GB > 10.25 GB left): its own copy
        // goes to another GPU.
        let other = s
            .place(&Workload::Replica(replica("m0", "mistral-7b", 14)))
            .unwrap();
        assert_ne!(where_is(&s, other.allocations[0]), first);
    }

    #[test]
    fn without_sharing_every_replica_loads_the_base() {
        let mut s = sched(vec![node("a", 2, 40), node("b", 2, 40)], false);
        let mut placed = 0;
        for i in 0..6 {
            if s.place(&Workload::Replica(replica(
                &format!("v{i}"),
                "llama-13b",
                26,
            )))
            .is_ok()
            {
                placed += 1;
            }
        }
        assert_eq!(placed, 4, "one 26 GB copy per 40 GB GPU");
        let mut shared = sched(vec![node("a", 2, 40), node("b", 2, 40)], true);
        let at: Vec<(NodeId, u8)> = (0..6)
            .map(|i| {
                let w = Workload::Replica(replica(&format!("v{i}"), "llama-13b", 26));
                let id = shared.place(&w).unwrap().allocations[0];
                where_is(&shared, id)
            })
            .collect();
        // Five 0.2-GPU replicas fill GPU 0's compute; the sixth loads a second copy beside it,
        // on the same node.
        assert_eq!(at, [(0, 0), (0, 0), (0, 0), (0, 0), (0, 0), (0, 1)]);
        assert_eq!(
            shared.cluster().gpu_memory_used(),
            2 * 26 * GB + 6 * (GB / 4 + GB)
        );
    }

    #[test]
    fn per_gpu_variant_limit() {
        let mut s = sched(vec![node("a", 1, 80)], true);
        s.config.max_variants_per_gpu = 2;
        for i in 0..2 {
            s.place(&Workload::Replica(replica(&format!("v{i}"), "b", 10)))
                .unwrap();
        }
        let err = s
            .place(&Workload::Replica(replica("v2", "b", 10)))
            .unwrap_err();
        assert_eq!(err.reason, Reason::VariantLimit { limit: 2 });
    }

    #[test]
    fn critical_on_demand_best_effort_on_spot() {
        let mut spot = node("spot", 1, 80);
        spot.pool = Pool::Spot;
        spot.expected_uptime_hours = Some(10.0);
        let mut s = sched(vec![node("od", 1, 80), spot], true);
        let mut crit = replica("c", "b1", 10);
        crit.class = ServiceClass::Critical;
        let id = s.place(&Workload::Replica(crit)).unwrap().allocations[0];
        assert_eq!(where_is(&s, id).0, 0);
        let mut be = replica("e", "b2", 10);
        be.class = ServiceClass::BestEffort;
        let id = s.place(&Workload::Replica(be.clone())).unwrap().allocations[0];
        assert_eq!(where_is(&s, id).0, 1);
        // Needing more uptime than the spot node promises sends it to on-demand.
        be.name = "e2".into();
        be.min_uptime_hours = 24.0;
        let id = s.place(&Workload::Replica(be)).unwrap().allocations[0];
        assert_eq!(where_is(&s, id).0, 0);
        // Critical work with only spot nodes left is refused with a reason.
        let mut only_spot = node("s2", 1, 80);
        only_spot.pool = Pool::Spot;
        let mut s2 = sched(vec![only_spot], true);
        let mut crit = replica("c", "b1", 10);
        crit.class = ServiceClass::Critical;
        assert_eq!(
            s2.place(&Workload::Replica(crit)).unwrap_err().reason,
            Reason::NoEligibleNode
        );
    }

    #[test]
    fn reasons_for_replicas() {
        let mut s = sched(vec![node("a", 1, 16)], true);
        let big = replica("big", "llama-70b", 140);
        assert_eq!(
            s.place(&Workload::Replica(big)).unwrap_err().reason,
            Reason::TooLarge {
                resource: Resource::GpuMemory
            }
        );
        s.place(&Workload::Replica(replica("x", "m", 12))).unwrap();
        assert_eq!(
            s.place(&Workload::Replica(replica("y", "n", 12)))
                .unwrap_err()
                .reason,
            Reason::Insufficient {
                resource: Resource::GpuMemory
            }
        );
        let mut bad = replica("z", "m", 1);
        bad.compute_milli = 0;
        assert!(matches!(
            s.place(&Workload::Replica(bad)).unwrap_err().reason,
            Reason::Invalid { .. }
        ));
    }
}

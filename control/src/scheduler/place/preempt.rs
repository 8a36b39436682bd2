//! Preemption: when nothing fits, evict the cheapest set of strictly lower-priority work.
//!
//! Victims come in units: a single allocation, or a whole gang (every worker, on every node:
//! evicting part of a gang would leave the rest holding GPUs while doing nothing). Only units
//! of strictly lower priority than the incoming workload are candidates, so equal or higher
//! priority work is never touched.
//!
//! - A pod or replica needs one node. For each node the scheduler simulates evictions on a
//!   copy of that node's state: units on the node are added lowest priority first (ties:
//!   largest first) until the workload fits, then every unit that is not needed is dropped
//!   again; the same is tried largest first. The cheapest set over all nodes wins: fewest
//!   evicted allocations, then the lowest top priority, then the lowest priority sum.
//! - A gang needs many nodes. Units are evicted on a trial copy of the cluster, lowest priority
//!   first, until the gang's plan succeeds; then each evicted unit is restored (last evicted
//!   first) if the gang still fits without evicting it; the same is tried largest first, and
//!   the cheaper set wins.
//!
//! Either way the work happens on a copy of the cluster that replaces the real one only when
//! the workload is placed, so a failed attempt changes nothing.

use std::collections::BTreeMap;

use super::replica::base_key;
use super::{Evicted, Placement, Reason, Scheduler, Unplaced, pool_allows};
use crate::scheduler::inventory::{AllocId, Allocation, Cluster, MILLI, NodeId};
use crate::scheduler::policy::Shape;
use crate::scheduler::workload::{InferenceReplica, Priority, TrainingGang, Workload};

/// A set of allocations that is evicted together.
#[derive(Clone, Debug)]
struct Unit {
    owner: String,
    priority: Priority,
    ids: Vec<AllocId>,
}

/// Units of strictly lower priority than `p`, gangs grouped whole.
fn units_below(c: &Cluster, p: Priority) -> Vec<Unit> {
    let mut gangs: BTreeMap<u32, Unit> = BTreeMap::new();
    let mut out = Vec::new();
    for (id, a) in c.allocations() {
        match a.gang {
            Some(g) => {
                let u = gangs.entry(g).or_insert_with(|| Unit {
                    owner: a.owner.clone(),
                    priority: a.priority,
                    ids: Vec::new(),
                });
                u.ids.push(id);
                u.priority = u.priority.max(a.priority);
            }
            None if a.priority < p => out.push(Unit {
                owner: a.owner.clone(),
                priority: a.priority,
                ids: vec![id],
            }),
            None => {}
        }
    }
    out.extend(gangs.into_values().filter(|u| u.priority < p));
    out
}

/// What one node would look like after some evictions.
#[derive(Clone)]
struct NodeSim {
    cpu: u32,
    mem: u64,
    gpus: Vec<(u32, u64)>,
    residents: Vec<Vec<(String, u64, u32)>>,
    modelled: bool,
}

impl NodeSim {
    fn of(c: &Cluster, n: NodeId) -> Self {
        let f = c.node(n);
        let gpus = c.gpus(n);
        Self {
            cpu: f.cpu_milli,
            mem: f.memory_mib,
            gpus: gpus.iter().map(|g| (g.milli, g.memory_bytes)).collect(),
            residents: (0..gpus.len() as u8)
                .map(|g| {
                    c.residents(n, g)
                        .iter()
                        .map(|r| (r.base.clone(), r.bytes, r.users))
                        .collect()
                })
                .collect(),
            modelled: c.models_gpu_memory(n),
        }
    }

    /// Mirrors [`Cluster::release`] for an allocation on this node.
    fn remove(&mut self, a: &Allocation) {
        self.cpu += a.cpu_milli;
        self.mem += a.memory_mib;
        for g in &a.gpus {
            let i = usize::from(g.gpu);
            let mut freed = g.memory_bytes;
            if let Some(b) = &a.shared_base {
                let res = &mut self.residents[i];
                if let Some(pos) = res.iter().position(|r| r.0 == b.base && r.1 == b.bytes) {
                    res[pos].2 -= 1;
                    if res[pos].2 == 0 {
                        freed += res.swap_remove(pos).1;
                    }
                }
            }
            self.gpus[i].0 += g.milli;
            if self.modelled {
                self.gpus[i].1 += freed;
            }
        }
    }

    fn fits(&self, need: &Need) -> bool {
        match need {
            Need::Shape(s) => {
                self.cpu >= s.cpu_milli
                    && self.mem >= s.memory_mib
                    && match s.num_gpu {
                        0 => true,
                        1 if s.gpu_milli < MILLI => self.gpus.iter().any(|g| g.0 >= s.gpu_milli),
                        k => self.gpus.iter().filter(|g| g.0 == MILLI).count() >= usize::from(k),
                    }
            }
            Need::Replica { r, key, limit } => {
                self.cpu >= r.cpu_milli
                    && self.mem >= r.memory_mib
                    && self.gpus.iter().zip(&self.residents).any(|(g, res)| {
                        let active: u32 = res.iter().map(|x| x.2).sum();
                        let resident = res.iter().any(|x| x.0 == *key && x.1 == r.base_bytes);
                        let bytes = if resident {
                            r.own_bytes()
                        } else {
                            r.cold_bytes()
                        };
                        g.0 >= r.compute_milli
                            && (*limit == 0 || active < *limit)
                            && (!self.modelled || g.1 >= bytes)
                    })
            }
        }
    }
}

/// What a single-node workload needs from a node.
enum Need<'a> {
    Shape(Shape),
    Replica {
        r: &'a InferenceReplica,
        key: String,
        limit: u32,
    },
}

/// Cost of a victim set: (allocations evicted, top priority, priority sum); lower is cheaper.
type Cost = (usize, Priority, i64);

fn cost(units: &[Unit], chosen: &[usize]) -> Cost {
    let n = chosen.iter().map(|&u| units[u].ids.len()).sum();
    let top = chosen
        .iter()
        .map(|&u| units[u].priority)
        .max()
        .unwrap_or(Priority::MIN);
    let sum = chosen.iter().map(|&u| i64::from(units[u].priority)).sum();
    (n, top, sum)
}

impl Scheduler {
    /// Places `w`, evicting strictly lower-priority work when that is the only way.
    pub fn place_preempting(&mut self, w: &Workload) -> Result<Placement, Unplaced> {
        let first = match self.place(w) {
            Ok(p) => return Ok(p),
            Err(u) if !u.reason.capacity_bound() => return Err(u),
            Err(u) => u,
        };
        let units = units_below(&self.cluster, w.priority());
        if units.is_empty() {
            return Err(first);
        }
        let result = match w {
            Workload::Gang(_) => self.preempt_for_gang(w, &units),
            _ => self.preempt_for_single(w, &units),
        };
        result.map_err(|reason| Unplaced {
            workload: w.name().to_string(),
            reason,
        })
    }

    /// Evicts the cheapest sufficient unit set on one node and places `w` there.
    fn preempt_for_single(&mut self, w: &Workload, units: &[Unit]) -> Result<Placement, Reason> {
        let c = &self.cluster;
        let need = match w {
            Workload::Pod(p) => Need::Shape(Shape {
                cpu_milli: p.cpu_milli,
                memory_mib: p.memory_mib,
                num_gpu: p.num_gpu,
                gpu_milli: p.gpu_milli,
                models: c.model_set(&p.gpu_spec),
            }),
            Workload::Replica(r) => Need::Replica {
                r,
                key: base_key(r, self.config.sharing),
                limit: self.config.max_variants_per_gpu,
            },
            Workload::Gang(_) => return Err(Reason::NoVictims),
        };
        let static_ok = |n: NodeId| -> bool {
            let (s, f) = (c.spec(n), c.node(n));
            match w {
                Workload::Pod(p) => {
                    let models = c.model_set(&p.gpu_spec);
                    p.num_gpu == 0 || (models.contains(f.model) && s.gpu_count >= p.num_gpu)
                }
                Workload::Replica(r) => {
                    let up = if r.min_uptime_hours > 0.0 {
                        r.min_uptime_hours
                    } else {
                        self.config.spot_min_uptime_hours
                    };
                    s.gpu_count > 0
                        && c.model_set(&r.gpu_spec).contains(f.model)
                        && pool_allows(s, r.class, up)
                }
                Workload::Gang(_) => false,
            }
        };
        let mut on_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (i, u) in units.iter().enumerate() {
            for &id in &u.ids {
                if let Some(a) = c.allocation(id) {
                    let v = on_node.entry(a.node).or_default();
                    if v.last() != Some(&i) {
                        v.push(i);
                    }
                }
            }
        }
        let mut best: Option<(Cost, NodeId, Vec<usize>)> = None;
        for (&n, local) in &on_node {
            if !static_ok(n) {
                continue;
            }
            let base = NodeSim::of(c, n);
            let after = |chosen: &[usize]| {
                let mut sim = base.clone();
                for &u in chosen {
                    for &id in &units[u].ids {
                        if let Some(a) = c.allocation(id).filter(|a| a.node == n) {
                            sim.remove(a);
                        }
                    }
                }
                sim.fits(&need)
            };
            let freed_gpu = |u: usize| -> u32 {
                units[u]
                    .ids
                    .iter()
                    .filter_map(|&id| c.allocation(id))
                    .filter(|a| a.node == n)
                    .flat_map(|a| a.gpus.iter().map(|g| g.milli))
                    .sum()
            };
            let mut by_priority = local.clone();
            by_priority.sort_by_key(|&u| (units[u].priority, std::cmp::Reverse(freed_gpu(u))));
            let mut by_size = local.clone();
            by_size.sort_by_key(|&u| (std::cmp::Reverse(freed_gpu(u)), units[u].priority));
            for order in [by_priority, by_size] {
                let mut chosen = Vec::new();
                for u in order {
                    chosen.push(u);
                    if after(&chosen) {
                        break;
                    }
                }
                if !after(&chosen) {
                    continue;
                }
                for i in (0..chosen.len()).rev() {
                    let mut without = chosen.clone();
                    without.remove(i);
                    if after(&without) {
                        chosen = without;
                    }
                }
                let k = cost(units, &chosen);
                if best.as_ref().is_none_or(|b| k < b.0) {
                    best = Some((k, n, chosen));
                }
            }
        }
        let Some((_, node, chosen)) = best else {
            return Err(Reason::NoVictims);
        };
        let only = move |x: NodeId| x == node;
        self.in_trial(units, &chosen, |s| match w {
            Workload::Pod(p) => {
                let shape = match &need {
                    Need::Shape(sh) => *sh,
                    Need::Replica { .. } => unreachable!("a pod needs a shape"),
                };
                s.place_shape_on(&p.name, &shape, 0, Some(&only))
                    .map(|id| vec![id])
            }
            Workload::Replica(r) => s.place_replica_on(r, Some(&only)).map(|id| vec![id]),
            Workload::Gang(_) => Err(Reason::NoVictims),
        })
        .map(|(allocations, preempted)| Placement {
            workload: w.name().to_string(),
            allocations,
            preempted,
        })
    }

    /// Evicts units until the gang fits, restores the unneeded ones, places it; tried with the
    /// lowest priority first and with the largest first, keeping the cheaper victim set.
    fn preempt_for_gang(&mut self, w: &Workload, units: &[Unit]) -> Result<Placement, Reason> {
        let Workload::Gang(g) = w else {
            return Err(Reason::NoVictims);
        };
        let size = |u: usize| -> u32 {
            units[u]
                .ids
                .iter()
                .filter_map(|&id| self.cluster.allocation(id))
                .flat_map(|a| a.gpus.iter().map(|x| x.milli))
                .sum()
        };
        let mut by_priority: Vec<usize> = (0..units.len()).collect();
        by_priority.sort_by_key(|&u| (units[u].priority, std::cmp::Reverse(size(u))));
        let mut by_size: Vec<usize> = (0..units.len()).collect();
        by_size.sort_by_key(|&u| (std::cmp::Reverse(size(u)), units[u].priority));
        let mut best: Option<(Cost, Vec<usize>)> = None;
        for order in [by_priority, by_size] {
            if let Some(chosen) = self.gang_victims(g, units, &order) {
                let k = cost(units, &chosen);
                if best.as_ref().is_none_or(|b| k < b.0) {
                    best = Some((k, chosen));
                }
            }
        }
        let Some((_, chosen)) = best else {
            return Err(Reason::NoVictims);
        };
        self.in_trial(units, &chosen, |s| s.place_gang_on(g, None))
            .map(|(allocations, preempted)| Placement {
                workload: w.name().to_string(),
                allocations,
                preempted,
            })
    }

    /// Whether the gang's plan succeeds once `chosen` units are gone (on a copy).
    fn gang_fits_without(&mut self, g: &TrainingGang, units: &[Unit], chosen: &[usize]) -> bool {
        let mut trial = self.cluster.clone();
        for &u in chosen {
            for &id in &units[u].ids {
                trial.release(id);
            }
        }
        let saved = std::mem::replace(&mut self.cluster, trial);
        let ok = self.gang_plan(g, None).is_ok();
        self.cluster = saved;
        ok
    }

    /// Evicts along `order` until the gang fits, then restores (last evicted first) every unit
    /// it does not need gone; `None` if evicting everything in `order` is not enough.
    fn gang_victims(
        &mut self,
        g: &TrainingGang,
        units: &[Unit],
        order: &[usize],
    ) -> Option<Vec<usize>> {
        let mut chosen = Vec::new();
        let mut fit = false;
        for &u in order {
            chosen.push(u);
            if self.gang_fits_without(g, units, &chosen) {
                fit = true;
                break;
            }
        }
        if !fit {
            return None;
        }
        for i in (0..chosen.len()).rev() {
            let mut without = chosen.clone();
            without.remove(i);
            if self.gang_fits_without(g, units, &without) {
                chosen = without;
            }
        }
        Some(chosen)
    }

    /// On a copy of the cluster: evicts `chosen` units, runs `place`; adopts the copy on success.
    fn in_trial(
        &mut self,
        units: &[Unit],
        chosen: &[usize],
        place: impl FnOnce(&mut Scheduler) -> Result<Vec<AllocId>, Reason>,
    ) -> Result<(Vec<AllocId>, Vec<Evicted>), Reason> {
        let trial = self.cluster.clone();
        let original = std::mem::replace(&mut self.cluster, trial);
        let mut evicted = Vec::new();
        for &u in chosen {
            let allocations = units[u]
                .ids
                .iter()
                .filter_map(|&id| self.cluster.release(id))
                .collect();
            evicted.push(Evicted {
                owner: units[u].owner.clone(),
                priority: units[u].priority,
                allocations,
            });
        }
        match place(self) {
            Ok(ids) => Ok((ids, evicted)),
            Err(e) => {
                self.cluster = original;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::inventory::{Cluster, NodeSpec};
    use crate::scheduler::place::SchedulerConfig;
    use crate::scheduler::place::gang::tests::gang;
    use crate::scheduler::place::tests::pod;
    use crate::scheduler::policy::PolicyKind;

    fn sched(nodes: usize, gpus: u8) -> Scheduler {
        let specs = (0..nodes)
            .map(|i| NodeSpec::trace(&format!("n{i}"), 64000, 1 << 20, gpus, "A100"))
            .collect();
        let config = SchedulerConfig {
            policy: PolicyKind::BestFit,
            ..SchedulerConfig::default()
        };
        Scheduler::new(Cluster::new(specs).unwrap(), config, None)
    }

    fn prio_gang(name: &str, workers: u16, gpus: u8, priority: Priority) -> Workload {
        let mut g = gang(name, workers, gpus);
        g.priority = priority;
        Workload::Gang(g)
    }

    #[test]
    fn evicts_the_fewest_lowest_priority_and_never_equal_or_higher() {
        let mut s = sched(2, 2);
        // Node-filling gangs of 1 worker × 2 GPUs at priorities 5 and 1.
        s.place(&prio_gang("p5", 1, 2, 5)).unwrap();
        s.place(&prio_gang("p1", 1, 2, 1)).unwrap();
        // Priority 5 cannot evict priority 5; it takes the priority-1 node.
        let p = s.place_preempting(&prio_gang("new5", 1, 2, 5)).unwrap();
        assert_eq!(p.preempted.len(), 1);
        assert_eq!(p.preempted[0].owner, "p1");
        // Now everything is priority 5: a priority-5 request finds no victims.
        let err = s.place_preempting(&prio_gang("late", 1, 1, 5)).unwrap_err();
        assert_eq!(
            err.reason,
            Reason::GangIncomplete {
                placeable: 0,
                workers: 1
            }
        );
    }

    #[test]
    fn a_gang_is_evicted_whole() {
        let mut s = sched(2, 2);
        // A low-priority gang spanning both nodes (2 workers × 2 GPUs).
        s.place(&prio_gang("spread", 2, 2, 0)).unwrap();
        let p = s.place_preempting(&prio_gang("need2", 1, 2, 3)).unwrap();
        assert_eq!(p.preempted.len(), 1);
        assert_eq!(p.preempted[0].allocations.len(), 2, "both workers go");
        assert!(s.cluster().allocations().all(|(_, a)| a.owner != "spread"));
        // The freed second node stays free: exactly 2 of 4 GPUs are used.
        assert_eq!(s.cluster().gpu_milli_allocated(), 2000);
    }

    #[test]
    fn prefers_one_victim_over_two() {
        let mut s = sched(2, 2);
        // Node 0: two 1-GPU single-worker gangs at priority 0; node 1: a 2-GPU one at priority 1.
        s.place(&prio_gang("a", 1, 1, 0)).unwrap();
        s.place(&prio_gang("b", 1, 1, 0)).unwrap();
        s.place(&prio_gang("c", 1, 2, 1)).unwrap();
        let p = s.place_preempting(&prio_gang("d", 1, 2, 2)).unwrap();
        let owners: Vec<&str> = p.preempted.iter().map(|e| e.owner.as_str()).collect();
        // Two victims at priority 0, or one at priority 1: the fewest wins.
        assert_eq!(owners, ["c"]);
    }

    #[test]
    fn single_node_preemption_picks_the_cheapest_node() {
        let mut s = sched(2, 1);
        let mut low = pod("low", 1000, 1, 1000);
        low.name = "low".into();
        // Trace pods have priority 0: make victims with gangs at priorities −2 and −1.
        s.place(&prio_gang("m2", 1, 1, -2)).unwrap();
        s.place(&prio_gang("m1", 1, 1, -1)).unwrap();
        let p = s.place_preempting(&Workload::Pod(low)).unwrap();
        assert_eq!(p.preempted.len(), 1);
        assert_eq!(p.preempted[0].owner, "m2", "the lowest priority goes");
    }

    #[test]
    fn failed_preemption_changes_nothing() {
        let mut s = sched(1, 2);
        s.place(&prio_gang("keep", 1, 1, 9)).unwrap();
        s.place(&prio_gang("low", 1, 1, 0)).unwrap();
        let before: Vec<AllocId> = s.cluster().allocations().map(|(i, _)| i).collect();
        // Needs 2 GPUs on the node: evicting "low" frees only one.
        assert_eq!(
            s.place_preempting(&prio_gang("big", 1, 2, 5))
                .unwrap_err()
                .reason,
            Reason::NoVictims
        );
        let after: Vec<AllocId> = s.cluster().allocations().map(|(i, _)| i).collect();
        assert_eq!(before, after);
    }
}

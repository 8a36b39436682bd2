//! Training gangs: all workers or none, inside one topology domain when asked.
//!
//! A gang's workers are planned before anything is allocated. Each eligible node can host
//! `min(free whole GPUs / G, free CPU / cpu, free memory / mem)` workers; within a domain the
//! plan fills the largest hosts first and finishes on the smallest node that takes the rest
//! (best fit, so big empty nodes stay whole), and among domains the plan using the fewest
//! nodes wins (fewer hops for collectives), then the one leaving the fewest idle GPUs behind
//! on the nodes it touches. A `required` constraint fails with [`Reason::Topology`] when no
//! single domain suffices; a preferred one falls back to the whole cluster.
//!
//! Callers that wait for room use [`GangWait`]: retries back off exponentially and give up
//! after a timeout, so a gang that cannot fit does not starve everything behind it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Reason, Resource, Scheduler, pool_allows};
use crate::scheduler::inventory::{AllocId, Allocation, GpuGrant, MILLI, NodeId};
use crate::scheduler::workload::TrainingGang;

/// Retry schedule for a gang waiting for room.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    pub initial_s: f64,
    pub max_s: f64,
    pub timeout_s: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial_s: 5.0,
            max_s: 300.0,
            timeout_s: 3600.0,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum Retry {
    /// Try again at this time (seconds, the caller's clock).
    At(f64),
    GiveUp(Reason),
}

/// Attempts of one waiting gang (times are the caller's clock, in seconds: no IO here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GangWait {
    first_s: f64,
    attempts: u32,
}

impl GangWait {
    pub fn new(now_s: f64) -> Self {
        Self {
            first_s: now_s,
            attempts: 0,
        }
    }

    /// Records a failed attempt at `now_s`: retry after `initial × 2^(attempts−1)` (capped),
    /// or give up once the next try would fall past the timeout.
    pub fn failed(&mut self, now_s: f64, b: &Backoff) -> Retry {
        self.attempts += 1;
        let delay = (b.initial_s * 2f64.powi(self.attempts as i32 - 1)).min(b.max_s);
        let next = now_s + delay;
        if next - self.first_s > b.timeout_s {
            Retry::GiveUp(Reason::TimedOut {
                attempts: self.attempts,
            })
        } else {
            Retry::At(next)
        }
    }
}

/// A node that can host some workers: (node, workers it can host, its free whole GPUs).
#[derive(Clone, Copy, Debug)]
struct Host {
    node: NodeId,
    cap: u32,
    full: u8,
}

/// Plans `workers` over `hosts`: largest hosts first, the rest on the best-fitting node.
fn pack(mut hosts: Vec<Host>, workers: u32) -> Option<Vec<(NodeId, u32)>> {
    if hosts.iter().map(|h| h.cap).sum::<u32>() < workers {
        return None;
    }
    hosts.sort_by_key(|h| (std::cmp::Reverse(h.cap), h.full, h.node));
    let mut plan = Vec::new();
    let mut left = workers;
    while left > 0 {
        let fit = hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.cap >= left)
            .min_by_key(|(_, h)| (h.cap, h.full, h.node))
            .map(|(i, _)| i);
        let i = fit.unwrap_or(0);
        let h = hosts.remove(i);
        let take = h.cap.min(left);
        plan.push((h.node, take));
        left -= take;
    }
    Some(plan)
}

impl Scheduler {
    pub(super) fn place_gang(&mut self, g: &TrainingGang) -> Result<Vec<AllocId>, Reason> {
        self.place_gang_on(g, None)
    }

    /// Places the whole gang on nodes `allowed` accepts, or nothing.
    pub(super) fn place_gang_on(
        &mut self,
        g: &TrainingGang,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Result<Vec<AllocId>, Reason> {
        let plan = self.gang_plan(g, allowed)?;
        self.next_gang += 1;
        let gang = self.next_gang;
        let mut made = Vec::new();
        for (node, k) in plan {
            for _ in 0..k {
                let gpus: Vec<GpuGrant> = self
                    .cluster
                    .gpus(node)
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.milli == MILLI)
                    .take(usize::from(g.gpus_per_worker))
                    .map(|(i, _)| GpuGrant {
                        gpu: i as u8,
                        milli: MILLI,
                        memory_bytes: g.gpu_memory_bytes,
                    })
                    .collect();
                let a = Allocation {
                    owner: g.name.clone(),
                    node,
                    cpu_milli: g.cpu_milli,
                    memory_mib: g.memory_mib,
                    gpus,
                    priority: g.priority,
                    gang: Some(gang),
                    shared_base: None,
                };
                match self.cluster.allocate(a) {
                    Ok(id) => made.push(id),
                    Err(e) => {
                        for id in made {
                            self.cluster.release(id);
                        }
                        return Err(super::unreachable_shortfall(&e));
                    }
                }
            }
        }
        Ok(made)
    }

    /// Where each worker goes, decided before anything is allocated.
    pub(super) fn gang_plan(
        &self,
        g: &TrainingGang,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
    ) -> Result<Vec<(NodeId, u32)>, Reason> {
        if g.workers == 0 || g.gpus_per_worker == 0 {
            return Err(Reason::Invalid {
                detail: "a gang needs at least one worker with at least one GPU".into(),
            });
        }
        let c = &self.cluster;
        let models = c.model_set(&g.gpu_spec);
        let uptime = if g.min_uptime_hours > 0.0 {
            g.min_uptime_hours
        } else {
            self.config.spot_min_uptime_hours
        };
        let per = u32::from(g.gpus_per_worker);
        let (mut model_seen, mut eligible_seen, mut big_seen) = (false, false, false);
        let mut hosts = Vec::new();
        for n in 0..c.len() as NodeId {
            let (s, f) = (c.spec(n), c.node(n));
            if s.gpu_count == 0 || !models.contains(f.model) {
                continue;
            }
            model_seen = true;
            if !pool_allows(s, g.class, uptime) || allowed.is_some_and(|a| !a(n)) {
                continue;
            }
            eligible_seen = true;
            if u32::from(s.gpu_count) < per
                || s.cpu_milli < g.cpu_milli
                || s.memory_mib < g.memory_mib
                || (c.models_gpu_memory(n) && s.gpu_memory_bytes < g.gpu_memory_bytes)
            {
                continue;
            }
            big_seen = true;
            let by = |free: u64, need: u64| free.checked_div(need).map_or(u32::MAX, |k| k as u32);
            let cap = (u32::from(f.full_gpus) / per)
                .min(by(u64::from(f.cpu_milli), u64::from(g.cpu_milli)))
                .min(by(f.memory_mib, g.memory_mib));
            if cap > 0 {
                hosts.push(Host {
                    node: n,
                    cap,
                    full: f.full_gpus,
                });
            }
        }
        if !model_seen {
            return Err(Reason::NoMatchingGpuModel);
        }
        if !eligible_seen {
            return Err(Reason::NoEligibleNode);
        }
        if !big_seen {
            let resource = if models.is_empty() {
                Resource::Gpu
            } else {
                Resource::GpuMemory
            };
            return Err(Reason::TooLarge { resource });
        }
        let workers = u32::from(g.workers);
        let placeable: u32 = hosts
            .iter()
            .map(|h| h.cap.min(workers))
            .sum::<u32>()
            .min(workers);
        let incomplete = Reason::GangIncomplete { placeable, workers };
        let Some(t) = g.topology else {
            return pack(hosts, workers).ok_or(incomplete);
        };
        let mut domains: BTreeMap<u32, Vec<Host>> = BTreeMap::new();
        for h in &hosts {
            domains
                .entry(c.domain(h.node, t.level))
                .or_default()
                .push(*h);
        }
        let idle_left = |plan: &[(NodeId, u32)]| -> u32 {
            plan.iter()
                .map(|&(n, k)| u32::from(c.node(n).full_gpus) - k * per)
                .sum()
        };
        let best = domains
            .into_values()
            .filter_map(|hs| pack(hs, workers))
            .min_by_key(|plan| (plan.len(), idle_left(plan)));
        match best {
            Some(plan) => Ok(plan),
            None if placeable < workers => Err(incomplete),
            None if t.required => Err(Reason::Topology { level: t.level }),
            None => pack(hosts, workers).ok_or(incomplete),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::scheduler::inventory::{Cluster, Level, NodeSpec};
    use crate::scheduler::place::SchedulerConfig;
    use crate::scheduler::workload::{ServiceClass, TopologyConstraint, Workload};

    pub(crate) fn gang(name: &str, workers: u16, gpus: u8) -> TrainingGang {
        TrainingGang {
            name: name.into(),
            workers,
            gpus_per_worker: gpus,
            gpu_memory_bytes: 0,
            cpu_milli: 4000,
            memory_mib: 16384,
            priority: 0,
            class: ServiceClass::Standard,
            min_uptime_hours: 0.0,
            topology: None,
            gpu_spec: vec![],
        }
    }

    /// Two racks: r1 has two 8-GPU nodes, r2 one 8-GPU node and one 4-GPU node.
    fn racks() -> Scheduler {
        let node = |name: &str, rack: &str, gpus| {
            let mut n = NodeSpec::trace(name, 96000, 1 << 19, gpus, "H100");
            n.topology.rack = rack.into();
            n
        };
        let c = Cluster::new(vec![
            node("a", "r1", 8),
            node("b", "r1", 8),
            node("c", "r2", 8),
            node("d", "r2", 4),
        ])
        .unwrap();
        Scheduler::new(c, SchedulerConfig::default(), None)
    }

    fn nodes_of(s: &Scheduler, ids: &[AllocId]) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = ids
            .iter()
            .map(|&i| s.cluster().allocation(i).unwrap().node)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    #[test]
    fn gang_is_all_or_nothing() {
        let mut s = racks();
        let big = gang("big", 5, 8);
        let before = s.cluster().gpu_milli_allocated();
        assert_eq!(
            s.place(&Workload::Gang(big)).unwrap_err().reason,
            Reason::GangIncomplete {
                placeable: 3,
                workers: 5
            }
        );
        assert_eq!(s.cluster().gpu_milli_allocated(), before, "nothing held");
        let ok = s.place(&Workload::Gang(gang("ok", 3, 8))).unwrap();
        assert_eq!(ok.allocations.len(), 3);
    }

    #[test]
    fn required_topology_keeps_the_gang_in_one_rack() {
        let mut s = racks();
        let mut g = gang("g", 3, 4);
        g.topology = Some(TopologyConstraint {
            level: Level::Rack,
            required: true,
        });
        let p = s.place(&Workload::Gang(g.clone())).unwrap();
        // Both racks need two nodes for 12 GPUs; r2 (8 + 4) leaves no idle GPU on them, r1 4.
        assert_eq!(nodes_of(&s, &p.allocations), vec![2, 3]);
        // Now r2 is full: a 16-GPU gang fits r1 only.
        g.name = "g2".into();
        g.workers = 4;
        let p2 = s.place(&Workload::Gang(g.clone())).unwrap();
        assert_eq!(nodes_of(&s, &p2.allocations), vec![0, 1]);
        // Nothing left in any rack.
        g.name = "g3".into();
        g.workers = 1;
        assert!(s.place(&Workload::Gang(g)).is_err());
    }

    #[test]
    fn required_topology_fails_with_a_reason_preferred_falls_back() {
        let mut s = racks();
        let mut g = gang("g", 5, 4);
        g.topology = Some(TopologyConstraint {
            level: Level::Rack,
            required: true,
        });
        assert_eq!(
            s.place(&Workload::Gang(g.clone())).unwrap_err().reason,
            Reason::Topology { level: Level::Rack }
        );
        g.topology = Some(TopologyConstraint {
            level: Level::Rack,
            required: false,
        });
        assert_eq!(s.place(&Workload::Gang(g)).unwrap().allocations.len(), 5);
    }

    #[test]
    fn best_fit_keeps_big_nodes_whole() {
        let mut s = racks();
        let p = s.place(&Workload::Gang(gang("small", 1, 4))).unwrap();
        assert_eq!(nodes_of(&s, &p.allocations), vec![3], "the 4-GPU node");
    }

    #[test]
    fn backoff_doubles_and_times_out() {
        let b = Backoff {
            initial_s: 1.0,
            max_s: 4.0,
            timeout_s: 10.0,
        };
        let mut w = GangWait::new(0.0);
        assert_eq!(w.failed(0.0, &b), Retry::At(1.0));
        assert_eq!(w.failed(1.0, &b), Retry::At(3.0));
        assert_eq!(w.failed(3.0, &b), Retry::At(7.0));
        assert_eq!(
            w.failed(7.0, &b),
            Retry::GiveUp(Reason::TimedOut { attempts: 4 })
        );
    }
}

//! From a committed replica target to placements: which replicas of an autoscaler to add and
//! which to release so that its placements match its decision's on-demand and spot counts.
//!
//! Pure: the scaling loop (`crate::scaling`) reads the store, calls [`reconcile`], plans the
//! additions with the scheduler and writes the result through Raft. Placements an autoscaler
//! made carry its name as their owner (`autoscaler/<name>`), so its replicas are found again
//! whatever else is placed, and released when the autoscaler or its `placement` goes.
//!
//! Naming: replica `i` is `<autoscaler>-od-<i>` on on-demand capacity (scheduled as critical:
//! on-demand nodes only) or `<autoscaler>-spot-<i>` (best effort: spot nodes first, on-demand
//! when no spot node fits). Scale-in releases the highest indexes first, so the longest-lived
//! replicas, whose base weights other variants may share, stay.

use std::collections::BTreeSet;

use super::spec::ReplicaTemplate;
use crate::scheduler::workload::{InferenceReplica, ServiceClass, Workload};

/// The owner tag of an autoscaler's placements.
pub fn owner(autoscaler: &str) -> String {
    format!("autoscaler/{autoscaler}")
}

/// The autoscaler an owner tag names, if it is one.
pub fn owning_autoscaler(owner: &str) -> Option<&str> {
    owner.strip_prefix("autoscaler/")
}

/// The capacity pool of a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Lane {
    OnDemand,
    Spot,
}

impl Lane {
    fn infix(self) -> &'static str {
        match self {
            Lane::OnDemand => "od",
            Lane::Spot => "spot",
        }
    }

    fn class(self) -> ServiceClass {
        match self {
            Lane::OnDemand => ServiceClass::Critical,
            Lane::Spot => ServiceClass::BestEffort,
        }
    }
}

/// The placement name of replica `i` of `autoscaler` in `lane`.
pub fn replica_name(autoscaler: &str, lane: Lane, i: u32) -> String {
    format!("{autoscaler}-{}-{i}", lane.infix())
}

/// The pool of placement `name` if it is one of `autoscaler`'s replicas.
pub fn lane_of(autoscaler: &str, name: &str) -> Option<Lane> {
    parse(autoscaler, name).map(|(lane, _)| lane)
}

fn parse(autoscaler: &str, name: &str) -> Option<(Lane, u32)> {
    let rest = name.strip_prefix(autoscaler)?.strip_prefix('-')?;
    let (lane, i) = rest.split_once('-')?;
    let lane = match lane {
        "od" => Lane::OnDemand,
        "spot" => Lane::Spot,
        _ => return None,
    };
    Some((lane, i.parse().ok()?))
}

/// One placement an autoscaler owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Owned {
    pub name: String,
    /// Every node it sits on is still in the inventory (a lost node's replica is replaced).
    pub healthy: bool,
    /// It sits on a node under a preemption notice: released first when its pool shrinks
    /// (the notice's decision moved that many replicas to on-demand).
    pub doomed: bool,
}

/// What to change: replicas to place, placements to release.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub add: Vec<Workload>,
    pub remove: Vec<String>,
}

/// The target of one autoscaler: the variant, what a replica needs (`None`: place nothing,
/// release what it owns) and the decided `(on_demand, spot)` counts (`None`: no decision yet,
/// change nothing).
pub struct Target<'a> {
    pub autoscaler: &'a str,
    pub variant: &'a str,
    pub template: Option<&'a ReplicaTemplate>,
    pub want: Option<(u32, u32)>,
}

/// Adds and releases that bring `owned` to the target. A placement on a lost node, or one whose
/// name is not this autoscaler's (renamed by hand), is released and, if still wanted, replaced.
pub fn reconcile(t: &Target<'_>, owned: &[Owned]) -> Diff {
    let mut diff = Diff::default();
    let Some(template) = t.template else {
        diff.remove = owned.iter().map(|o| o.name.clone()).collect();
        return diff;
    };
    let Some((od, spot)) = t.want else { return diff };
    let parsed: Vec<(Option<(Lane, u32)>, &Owned)> = owned.iter().map(|o| (parse(t.autoscaler, &o.name), o)).collect();
    let taken: BTreeSet<(Lane, u32)> = parsed.iter().filter_map(|(p, _)| *p).collect();
    for (lane, want) in [(Lane::OnDemand, od), (Lane::Spot, spot)] {
        // Sorted so that what to release comes last: doomed replicas, then the newest.
        let mut keep: Vec<(bool, u32, &str)> = Vec::new();
        for (p, o) in &parsed {
            match p {
                Some((l, i)) if *l == lane && o.healthy => keep.push((o.doomed, *i, &o.name)),
                Some((l, _)) if *l == lane => diff.remove.push(o.name.clone()),
                _ => {}
            }
        }
        keep.sort_unstable();
        let want = want as usize;
        if keep.len() > want {
            diff.remove.extend(keep.drain(want..).rev().map(|(_, _, n)| n.to_string()));
        }
        // New replicas take the lowest indexes not in use (a name being released is still in
        // use until its delete commits).
        let mut next = (0..).filter(|i| !taken.contains(&(lane, *i)));
        for _ in keep.len()..want {
            let i = next.next().unwrap_or(u32::MAX);
            diff.add.push(Workload::Replica(replica(t, template, lane, i)));
        }
    }
    // Owned placements under names that are not this autoscaler's replicas.
    diff.remove.extend(parsed.iter().filter(|(p, _)| p.is_none()).map(|(_, o)| o.name.clone()));
    diff
}

fn replica(t: &Target<'_>, p: &ReplicaTemplate, lane: Lane, i: u32) -> InferenceReplica {
    InferenceReplica {
        name: replica_name(t.autoscaler, lane, i),
        variant: t.variant.to_string(),
        base_model: p.base_model.clone(),
        base_bytes: p.base_bytes,
        delta_bytes: p.delta_bytes,
        working_set_bytes: p.working_set_bytes,
        compute_milli: p.compute_milli,
        cpu_milli: p.cpu_milli,
        memory_mib: p.memory_mib,
        priority: p.priority,
        class: lane.class(),
        min_uptime_hours: 0.0,
        gpu_spec: p.gpu_spec.clone(),
        launch: p.launch.clone().map(Box::new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::spec::tests::template;

    fn owned(names: &[&str]) -> Vec<Owned> {
        names.iter().map(|n| Owned { name: n.to_string(), healthy: true, doomed: false }).collect()
    }

    fn names(d: &Diff) -> Vec<&str> {
        d.add.iter().map(Workload::name).collect()
    }

    fn target<'a>(t: &'a ReplicaTemplate, want: Option<(u32, u32)>) -> Target<'a> {
        Target { autoscaler: "chat", variant: "a", template: Some(t), want }
    }

    #[test]
    fn scale_out_adds_the_missing_replicas_per_pool_with_the_pools_class() {
        let t = template(500);
        let d = reconcile(&target(&t, Some((3, 2))), &owned(&["chat-od-0", "chat-spot-0"]));
        assert_eq!(names(&d), ["chat-od-1", "chat-od-2", "chat-spot-1"]);
        assert!(d.remove.is_empty());
        let Workload::Replica(r) = &d.add[0] else { panic!() };
        assert_eq!((r.class, r.variant.as_str(), r.base_model.as_str(), r.compute_milli), (ServiceClass::Critical, "a", "llama-8b", 500));
        let Workload::Replica(r) = &d.add[2] else { panic!() };
        assert_eq!(r.class, ServiceClass::BestEffort);
    }

    #[test]
    fn every_replica_carries_the_templates_launch() {
        let t = ReplicaTemplate { launch: Some(crate::launch::tests::reference()), ..template(500) };
        let d = reconcile(&target(&t, Some((1, 1))), &[]);
        assert_eq!(d.add.len(), 2);
        for w in &d.add {
            let Workload::Replica(r) = w else { panic!() };
            assert_eq!(r.launch.as_deref(), t.launch.as_ref(), "{}", r.name);
        }
    }

    #[test]
    fn scale_in_releases_the_newest_replicas_and_a_met_target_changes_nothing() {
        let t = template(500);
        let have = owned(&["chat-od-0", "chat-od-1", "chat-od-2", "chat-od-10", "chat-spot-0"]);
        let d = reconcile(&target(&t, Some((2, 1))), &have);
        assert!(d.add.is_empty());
        assert_eq!(d.remove, ["chat-od-10", "chat-od-2"]);
        assert_eq!(reconcile(&target(&t, Some((5, 1))), &have).add.len(), 1);
        assert_eq!(reconcile(&target(&t, Some((4, 1))), &have), Diff::default());
    }

    #[test]
    fn a_replica_on_a_lost_node_is_replaced_under_a_fresh_name() {
        let t = template(500);
        let mut have = owned(&["chat-od-0", "chat-od-1"]);
        have[0].healthy = false;
        let d = reconcile(&target(&t, Some((2, 0))), &have);
        assert_eq!(d.remove, ["chat-od-0"]);
        assert_eq!(names(&d), ["chat-od-2"], "the lost replica's name is in use until its delete commits");
    }

    #[test]
    fn a_shrinking_pool_releases_the_replicas_under_a_preemption_notice_first() {
        let t = template(500);
        let mut have = owned(&["chat-spot-0", "chat-spot-1", "chat-spot-2", "chat-spot-3"]);
        have[0].doomed = true;
        have[2].doomed = true;
        let d = reconcile(&target(&t, Some((0, 2))), &have);
        assert_eq!(d.remove, ["chat-spot-2", "chat-spot-0"]);
        assert!(d.add.is_empty());
    }

    #[test]
    fn no_decision_changes_nothing_and_no_template_releases_everything() {
        let t = template(500);
        let have = owned(&["chat-od-0", "chat-spot-3", "renamed"]);
        assert_eq!(reconcile(&target(&t, None), &have), Diff::default());
        let gone = Target { autoscaler: "chat", variant: "a", template: None, want: Some((1, 0)) };
        assert_eq!(reconcile(&gone, &have).remove, ["chat-od-0", "chat-spot-3", "renamed"]);
        assert_eq!(reconcile(&target(&t, Some((1, 1))), &have).remove, ["renamed"]);
    }

    #[test]
    fn names_parse_back_only_for_their_own_autoscaler() {
        assert_eq!(parse("chat", &replica_name("chat", Lane::Spot, 7)), Some((Lane::Spot, 7)));
        assert_eq!(parse("chat", "chat-b-od-1"), None);
        assert_eq!(parse("chat-b", "chat-b-od-1"), Some((Lane::OnDemand, 1)));
        assert_eq!(parse("chat", "chatty-od-1"), None);
        assert_eq!(owning_autoscaler(&owner("chat")), Some("chat"));
    }
}

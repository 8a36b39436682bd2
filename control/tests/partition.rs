//! Multi-node tests of the Raft config store under partitions and crashes, on a simulated
//! network with virtual time (`sim/mod.rs` explains the harness and why it is not turmoil;
//! `sim/linearizability.rs` the checker and why it is not stateright's).
//!
//! - `minority_cannot_commit`, `majority_continues`, `healed_converges`: the leader of three
//!   nodes is cut off; it must not commit, the other two must elect a leader and commit, and
//!   after healing all three must hold the same state.
//! - `linearizable_histories_under_partitions_and_leader_crashes`: concurrent clients against a
//!   nemesis that partitions nodes and crashes leaders; the recorded histories must be
//!   linearizable and every acknowledged write must survive.
//! - `acknowledged_writes_survive_crashes_and_snapshots`: the same with a write-heavy load and
//!   frequent snapshots, so restarted nodes often catch up through `install_snapshot`;
//!   `restarted_follower_catches_up_from_snapshot` forces that path, and
//!   `whole_cluster_restart_keeps_acknowledged_writes` restarts all nodes at once.
//! - `stale_local_reads_are_rejected`: reading followers' local state under the same faults
//!   must fail the checker (the whole pipeline can detect a real anomaly).
//!
//! Seeds are fixed (reproducible CI); `WEFT_SIM_SEED=7` or `WEFT_SIM_SEED=7,8,9` runs others.

mod sim;

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::ServerState;
use sim::linearizability::{self, NEVER};
use sim::workload::{self, NemesisSpec, ReadMode, Scenario, Workload};
use sim::{Cluster, NetFaults, member, run_seeded, seeds, sim_config};
use tokio::time::timeout;
use weft_control::store::{Command, NodeId, StoreError};

const KIND: &str = "service";
/// Real-time bound of one seed; a hang ends the test process with the seed printed.
const REAL_LIMIT: Duration = Duration::from_secs(150);

const PARTITION_SEEDS: &[u64] = &[1, 2, 3];
const HISTORY_SEEDS: &[u64] = &[101, 102, 103, 104, 105];
const DURABILITY_SEEDS: &[u64] = &[201, 202];

fn put(name: &str, value: u64) -> Command {
    Command::Put {
        kind: KIND.into(),
        name: name.into(),
        value_json: value.to_string(),
        expect_revision: None,
    }
}

/// A 3-node cluster whose leader acknowledged one write, then was cut off from the others.
struct Split {
    cluster: Cluster,
    old: NodeId,
    old_term: u64,
    majority: Vec<NodeId>,
    before_rev: u64,
    applied_before: u64,
}

async fn split(seed: u64) -> Split {
    let net = NetFaults {
        max_delay_ms: 5,
        drop_per_mille: 0,
    };
    let cluster = Cluster::start(seed, 3, sim_config(1000, 100), net)
        .await
        .expect("cluster starts");
    let (old, old_term) = cluster.leader_among(&cluster.ids).expect("a leader");
    let leader = cluster.node(old).expect("leader runs");
    let before_rev = leader.write(put("before", 1)).await.expect("healthy write");
    // Everyone has it before the split, so only the split decides what happens next.
    let names = vec!["before".to_string()];
    cluster
        .wait_converged(KIND, &names, Duration::from_secs(5))
        .await
        .expect("converged before the split");
    cluster.router.isolate(old, &cluster.ids);
    let applied_before = leader.local().last_applied_index().expect("applied index");
    let majority = cluster.ids.iter().copied().filter(|&i| i != old).collect();
    Split {
        cluster,
        old,
        old_term,
        majority,
        before_rev,
        applied_before,
    }
}

/// The isolated old leader accepts a write into its log but can neither commit it nor serve
/// a linearizable read; once the majority has moved on and the partition heals, the
/// unacknowledged write is gone from every node.
#[test]
fn minority_cannot_commit() {
    for seed in seeds(PARTITION_SEEDS) {
        run_seeded(
            "minority_cannot_commit",
            seed,
            REAL_LIMIT,
            |seed| async move {
                let s = split(seed).await;
                let c = &s.cluster;
                let old = c.node(s.old).expect("old leader runs");
                let w = timeout(Duration::from_secs(3), old.write(put("isolated", 2))).await;
                assert!(
                    !matches!(w, Ok(Ok(_))),
                    "the isolated leader acknowledged a write: {w:?}"
                );
                let r = timeout(Duration::from_secs(1), old.read(KIND, "before")).await;
                assert!(
                    !matches!(r, Ok(Ok(_))),
                    "the isolated leader served a linearizable read: {r:?}"
                );
                assert_eq!(
                    old.local().last_applied_index().unwrap(),
                    s.applied_before,
                    "the isolated leader applied something"
                );
                for &id in &c.ids {
                    let local = c.node(id).unwrap().local().get(KIND, "isolated").unwrap();
                    assert!(
                        local.is_none(),
                        "node {id} applied the isolated write: {local:?}"
                    );
                }
                let m = c.metrics(s.old).unwrap();
                assert!(
                    m.last_log_index > m.last_applied.map(|l| l.index),
                    "the write should sit uncommitted in the old leader's log: {m:?}"
                );
                drop(old);

                // The majority moves on; healing then replaces the old leader's uncommitted entry.
                let (new, _) = c
                    .wait_for_leader(&s.majority, s.old_term + 1, Duration::from_secs(5))
                    .await
                    .expect("the majority elects a leader");
                c.node(new)
                    .unwrap()
                    .write(put("after", 3))
                    .await
                    .expect("majority write");
                c.router.heal();
                let names = vec!["isolated".to_string(), "after".to_string()];
                let states = c
                    .wait_converged(KIND, &names, Duration::from_secs(10))
                    .await
                    .expect("converged after healing");
                for (id, st) in &states {
                    assert!(
                        st.history["isolated"].is_empty(),
                        "node {id}: unacknowledged write survived: {st:?}"
                    );
                    assert_eq!(st.history["after"].len(), 1, "node {id}: {st:?}");
                }
                c.shutdown().await.unwrap();
            },
        );
    }
}

/// The two connected nodes elect a new leader in a higher term and keep committing; their
/// follower points clients at the new leader; the old leader sees none of it meanwhile.
#[test]
fn majority_continues() {
    for seed in seeds(PARTITION_SEEDS) {
        run_seeded("majority_continues", seed, REAL_LIMIT, |seed| async move {
            let s = split(seed).await;
            let c = &s.cluster;
            let (new, term) = c
                .wait_for_leader(&s.majority, s.old_term + 1, Duration::from_secs(5))
                .await
                .expect("the majority elects a leader");
            assert_ne!(new, s.old);
            assert!(term > s.old_term);
            let leader = c.node(new).unwrap();
            let mut last = s.before_rev;
            let mut acked = Vec::new();
            for i in 0..10u64 {
                let name = format!("m{i}");
                let rev = timeout(Duration::from_secs(2), leader.write(put(&name, i)))
                    .await
                    .expect("majority write within 2 s")
                    .expect("majority write");
                assert!(rev > last, "revisions grow: {rev} after {last}");
                last = rev;
                acked.push((name, i, rev));
            }
            for (name, value, rev) in &acked {
                let r = leader.read(KIND, name).await.unwrap().expect("present");
                assert_eq!(
                    (r.value_json.as_str(), r.revision),
                    (value.to_string().as_str(), *rev)
                );
            }
            // The other majority node follows the new leader and redirects writes to it.
            let follower = *s.majority.iter().find(|&&i| i != new).unwrap();
            let f = c.node(follower).unwrap();
            f.raft()
                .wait(Some(Duration::from_secs(5)))
                .applied_index_at_least(Some(last), "follower catches up")
                .await
                .expect("follower applies the majority's writes");
            match f.write(put("via-follower", 99)).await {
                Err(StoreError::NotLeader {
                    leader: Some(l),
                    member: Some(m),
                }) => {
                    assert_eq!(l, new, "hint names the new leader");
                    assert_eq!(m, member(new), "hint carries the new leader's address");
                }
                other => panic!("a follower must refuse writes with a hint, got {other:?}"),
            }
            assert!(f.local().get(KIND, "via-follower").unwrap().is_none());
            // The old leader is still cut off and has none of it.
            let old = c.node(s.old).unwrap();
            assert!(old.local().get(KIND, "m0").unwrap().is_none());
            assert_eq!(old.local().last_applied_index().unwrap(), s.applied_before);
            drop((leader, f, old));
            c.shutdown().await.unwrap();
        });
    }
}

/// After healing, the old leader steps down and all three nodes hold the same resources,
/// histories and applied index: every acknowledged write with its revision, nothing of the
/// unacknowledged one. The healed node then takes part in new writes and survives a restart.
#[test]
fn healed_converges() {
    for seed in seeds(PARTITION_SEEDS) {
        run_seeded("healed_converges", seed, REAL_LIMIT, |seed| async move {
            let s = split(seed).await;
            let c = &s.cluster;
            let old = c.node(s.old).unwrap();
            let w = timeout(Duration::from_secs(2), old.write(put("lost", 7))).await;
            assert!(
                !matches!(w, Ok(Ok(_))),
                "isolated leader acknowledged: {w:?}"
            );
            drop(old);
            let (new, _) = c
                .wait_for_leader(&s.majority, s.old_term + 1, Duration::from_secs(5))
                .await
                .expect("the majority elects a leader");
            let leader = c.node(new).unwrap();
            let mut acked = BTreeMap::new();
            acked.insert("before".to_string(), (1u64, s.before_rev));
            for i in 0..10u64 {
                let name = format!("c{}", i % 4);
                let rev = leader
                    .write(put(&name, 100 + i))
                    .await
                    .expect("majority write");
                acked.insert(name, (100 + i, rev));
            }
            drop(leader);
            c.router.heal();
            let mut names: Vec<String> = acked.keys().cloned().collect();
            names.push("lost".into());
            let states = c
                .wait_converged(KIND, &names, Duration::from_secs(10))
                .await
                .expect("converged after healing");
            let m = c.metrics(s.old).unwrap();
            assert_eq!(
                m.state,
                ServerState::Follower,
                "old leader stepped down: {m:?}"
            );
            assert!(m.current_term > s.old_term);
            let last_rev = acked.values().map(|v| v.1).max().unwrap();
            for (id, st) in &states {
                assert!(
                    st.applied >= last_rev,
                    "node {id} applied {} < {last_rev}",
                    st.applied
                );
                assert!(
                    st.history["lost"].is_empty(),
                    "node {id} kept the lost write"
                );
                for (name, (value, rev)) in &acked {
                    let r = st
                        .resources
                        .iter()
                        .find(|r| &r.name == name)
                        .unwrap_or_else(|| panic!("node {id} lacks {name}"));
                    assert_eq!(
                        (r.value_json.clone(), r.revision),
                        (value.to_string(), *rev)
                    );
                }
            }

            // The healed node takes part: a new write reaches it, and a restart keeps it all.
            let (leader, _) = c.leader_among(&c.ids).unwrap();
            let rev = c
                .node(leader)
                .unwrap()
                .write(put("after-heal", 1))
                .await
                .unwrap();
            c.crash(s.old).await.unwrap();
            c.restart(s.old).await.unwrap();
            names.push("after-heal".into());
            let states = c
                .wait_converged(KIND, &names, Duration::from_secs(10))
                .await
                .expect("converged after restart");
            let st = &states[&s.old];
            let r = st
                .resources
                .iter()
                .find(|r| r.name == "after-heal")
                .unwrap();
            assert_eq!(r.revision, rev);
            c.shutdown().await.unwrap();
        });
    }
}

/// 12 clients, 4 keys, 45 % reads, 15 % compare-and-set, the rest plain puts; faults every
/// 0.2-0.6 s lasting 0.3-1.2 s (longer than the 0.8 s client deadline, so some writes end
/// with unknown outcome); 1 % message loss and up to 8 ms delay per direction.
fn history_scenario() -> Scenario {
    Scenario {
        nodes: 3,
        config: sim_config(100, 20),
        net: NetFaults {
            max_delay_ms: 8,
            drop_per_mille: 10,
        },
        workload: Workload {
            clients: 12,
            ops_per_client: 110,
            keys: 4,
            read_per_mille: 450,
            cas_per_mille: 150,
            op_timeout: Duration::from_millis(800),
            think_ms: (0, 40),
            read_mode: ReadMode::Linearizable,
        },
        nemesis: NemesisSpec {
            quiet_ms: (200, 600),
            fault_ms: (300, 1200),
        },
    }
}

/// Write-heavy, snapshot every 40 entries keeping 5: a node that was down for a while can
/// only catch up from a snapshot.
fn durability_scenario() -> Scenario {
    Scenario {
        nodes: 3,
        config: sim_config(40, 5),
        net: NetFaults {
            max_delay_ms: 5,
            drop_per_mille: 5,
        },
        workload: Workload {
            clients: 8,
            ops_per_client: 80,
            keys: 6,
            read_per_mille: 150,
            cas_per_mille: 150,
            op_timeout: Duration::from_millis(1500),
            think_ms: (0, 30),
            read_mode: ReadMode::Linearizable,
        },
        nemesis: NemesisSpec {
            quiet_ms: (150, 400),
            fault_ms: (400, 1200),
        },
    }
}

/// Runs `scenario` for one seed and applies every check; returns the report.
async fn run_and_check(seed: u64, scenario: Scenario, min_ops: usize) -> workload::RunReport {
    let report = workload::run(seed, &scenario)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: run failed: {e}"));
    let summary = report.summary();
    eprintln!("{summary}");
    assert!(
        report.ops.len() >= min_ops,
        "only {} operations recorded (want {min_ops}): {summary}",
        report.ops.len()
    );
    assert!(
        report.crashes() >= 1 && report.partitions() >= 1,
        "the nemesis must have crashed and partitioned: {summary}"
    );
    assert_eq!(
        report.stats.bad_hints, 0,
        "NotLeader hints with wrong address"
    );
    let lin = linearizability::check(&report.ops)
        .unwrap_or_else(|v| panic!("seed {seed}: history is not linearizable: {v}\n{summary}"));
    let dur = workload::check_durability(&report)
        .unwrap_or_else(|e| panic!("seed {seed}: durability: {e}\n{summary}"));
    let unknown = report.count(|o| o.ret == NEVER);
    assert_eq!(dur.unknown_applied + dur.unknown_lost, unknown);
    let line = format!("seed {seed}: {lin}; {dur:?}");
    eprintln!("{line}");
    report
}

#[test]
fn linearizable_histories_under_partitions_and_leader_crashes() {
    for seed in seeds(HISTORY_SEEDS) {
        run_seeded(
            "linearizable_histories_under_partitions_and_leader_crashes",
            seed,
            REAL_LIMIT,
            |seed| async move {
                run_and_check(seed, history_scenario(), 1000).await;
            },
        );
    }
}

#[test]
fn acknowledged_writes_survive_crashes_and_snapshots() {
    for seed in seeds(DURABILITY_SEEDS) {
        run_seeded(
            "acknowledged_writes_survive_crashes_and_snapshots",
            seed,
            REAL_LIMIT,
            |seed| async move {
                // Whether a restarted node needed a snapshot depends on the schedule; the
                // summary reports `snapshot_chunks`, and `restarted_follower_catches_up_from_snapshot`
                // forces that path.
                run_and_check(seed, durability_scenario(), 500).await;
            },
        );
    }
}

/// A follower that was down while the leader snapshotted and purged its log can only catch up
/// through `install_snapshot`; it then holds exactly the leader's state and every history
/// entry, and keeps them across another restart (recovered from its own file).
#[test]
fn restarted_follower_catches_up_from_snapshot() {
    for seed in seeds(PARTITION_SEEDS) {
        run_seeded(
            "restarted_follower_catches_up_from_snapshot",
            seed,
            REAL_LIMIT,
            |seed| async move {
                let net = NetFaults {
                    max_delay_ms: 5,
                    drop_per_mille: 0,
                };
                let c = Cluster::start(seed, 3, sim_config(20, 2), net)
                    .await
                    .expect("cluster starts");
                let (leader, _) = c.leader_among(&c.ids).unwrap();
                let follower = *c.ids.iter().find(|&&i| i != leader).unwrap();
                c.crash(follower).await.unwrap();
                let l = c.node(leader).unwrap();
                let mut acked = BTreeMap::new();
                for i in 0..100u64 {
                    let name = format!("s{}", i % 7);
                    let rev = l
                        .write(put(&name, i))
                        .await
                        .expect("write with one follower down");
                    acked.insert(name, (i, rev));
                }
                l.raft()
                    .wait(Some(Duration::from_secs(5)))
                    .metrics(
                        |m| m.purged.is_some_and(|p| p.index > 50),
                        "leader purges its log",
                    )
                    .await
                    .expect("the leader purged past what the follower has");
                drop(l);
                let before = c.router.stats().snapshot_chunks;
                c.restart(follower).await.unwrap();
                let names: Vec<String> = acked.keys().cloned().collect();
                let states = c
                    .wait_converged(KIND, &names, Duration::from_secs(10))
                    .await
                    .expect("the follower catches up");
                assert!(
                    c.router.stats().snapshot_chunks > before,
                    "the follower caught up without a snapshot"
                );
                let st = &states[&follower];
                let entries: usize = st.history.values().map(Vec::len).sum();
                assert_eq!(
                    entries, 100,
                    "history is complete after the snapshot: {st:?}"
                );
                for (name, (value, rev)) in &acked {
                    let r = st.resources.iter().find(|r| &r.name == name).unwrap();
                    assert_eq!(
                        (r.value_json.clone(), r.revision),
                        (value.to_string(), *rev)
                    );
                }
                c.crash(follower).await.unwrap();
                c.restart(follower).await.unwrap();
                let again = c
                    .wait_converged(KIND, &names, Duration::from_secs(10))
                    .await
                    .expect("converged after restarting the follower");
                assert_eq!(again[&follower].resources, st.resources);
                assert_eq!(again[&follower].history, st.history);
                c.shutdown().await.unwrap();
            },
        );
    }
}

/// All three nodes crash and restart from their files: the cluster elects a leader again from
/// the persisted votes and logs, and every acknowledged write is still there.
#[test]
fn whole_cluster_restart_keeps_acknowledged_writes() {
    for seed in seeds(PARTITION_SEEDS) {
        run_seeded(
            "whole_cluster_restart_keeps_acknowledged_writes",
            seed,
            REAL_LIMIT,
            |seed| async move {
                let net = NetFaults {
                    max_delay_ms: 5,
                    drop_per_mille: 0,
                };
                let c = Cluster::start(seed, 3, sim_config(25, 5), net)
                    .await
                    .expect("cluster starts");
                let (leader, _) = c.leader_among(&c.ids).unwrap();
                let l = c.node(leader).unwrap();
                let mut acked = BTreeMap::new();
                for i in 0..40u64 {
                    let name = format!("w{}", i % 5);
                    acked.insert(name.clone(), (i, l.write(put(&name, i)).await.unwrap()));
                }
                drop(l);
                let last = acked.values().map(|v| v.1).max().unwrap();
                for &id in &c.ids {
                    c.crash(id).await.unwrap();
                }
                for &id in &c.ids {
                    c.restart(id).await.unwrap();
                }
                let names: Vec<String> = acked.keys().cloned().collect();
                let states = c
                    .wait_converged(KIND, &names, Duration::from_secs(10))
                    .await
                    .expect("the restarted cluster converges");
                for (id, st) in &states {
                    for (name, (value, rev)) in &acked {
                        let r = st
                            .resources
                            .iter()
                            .find(|r| &r.name == name)
                            .unwrap_or_else(|| panic!("node {id} lost {name}"));
                        assert_eq!(
                            (r.value_json.clone(), r.revision),
                            (value.to_string(), *rev)
                        );
                    }
                }
                let (leader, _) = c.leader_among(&c.ids).unwrap();
                let rev = c.node(leader).unwrap().write(put("new", 1)).await.unwrap();
                assert!(
                    rev > last,
                    "revisions continue after a full restart: {rev} > {last}"
                );
                c.shutdown().await.unwrap();
            },
        );
    }
}

/// The pipeline catches a real anomaly end to end: the same run with clients reading each
/// node's local state (no `ensure_linearizable`) yields stale reads from followers and from
/// the isolated node, and the checker must reject that history while the durability checks
/// (which only look at writes) still pass.
#[test]
fn stale_local_reads_are_rejected() {
    for seed in seeds(&[301]) {
        run_seeded(
            "stale_local_reads_are_rejected",
            seed,
            REAL_LIMIT,
            |seed| async move {
                let mut sc = history_scenario();
                sc.workload.read_mode = ReadMode::LocalAnyNode;
                sc.workload.ops_per_client = 50;
                let report = workload::run(seed, &sc).await.expect("run");
                eprintln!("{}", report.summary());
                let v = linearizability::check(&report.ops)
                    .expect_err("local reads under partitions must not pass as linearizable");
                eprintln!("seed {seed}: rejected as expected: {v}");
                workload::check_durability(&report).expect("writes are still durable");
            },
        );
    }
}

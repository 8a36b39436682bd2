//! Concurrent clients, a nemesis, and the recorded history of one simulated run.
//!
//! Clients behave like the REST layer will: send to the node they believe leads, follow
//! `NotLeader` hints (a refusal that provably changed nothing, so the same operation is
//! retried), and give up at a deadline. A write that timed out or failed for any other reason
//! may or may not have been applied; it is recorded with an unknown outcome and never retried,
//! because a blind retry could apply it twice. Every value written is unique, so reads and the
//! final histories tell exactly which write they came from.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::Config;
use tokio::time::{Instant, sleep, timeout_at};
use weft_control::store::{Command, CommandError, NodeId, StoreError};

use super::linearizability::{NEVER, Op, Operation, Outcome};
use super::{Cluster, NetFaults, NetStats, NodeState, Rng, member};

/// The resource kind all simulated clients use.
pub const KIND: &str = "kv";

/// What the clients do.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub clients: usize,
    pub ops_per_client: usize,
    pub keys: usize,
    pub read_per_mille: u64,
    /// Puts guarded by the last revision the client saw of the key (compare-and-set).
    pub cas_per_mille: u64,
    /// Deadline of one operation, retries on `NotLeader` included.
    pub op_timeout: Duration,
    /// Pause before each operation, in virtual milliseconds (spreads the run over the faults).
    pub think_ms: (u64, u64),
    pub read_mode: ReadMode,
}

/// How clients read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// `Node::read` on the leader (ensure_linearizable, then the state machine).
    Linearizable,
    /// `Node::local()` on a random node: possibly stale, so histories are expected to fail
    /// the checker. Exists to prove the checker catches real anomalies end to end.
    LocalAnyNode,
}

/// How the nemesis paces faults (virtual milliseconds).
#[derive(Clone, Copy, Debug)]
pub struct NemesisSpec {
    /// Healthy time before each fault.
    pub quiet_ms: (u64, u64),
    /// How long a fault lasts (a crashed node stays down this long).
    pub fault_ms: (u64, u64),
}

/// The faults the nemesis injects; "leader" is whoever leads when the fault starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    IsolateLeader,
    IsolateOne,
    CrashLeader,
    CrashOne,
    /// Isolates a follower, then crashes the leader: no quorum until one of them is back.
    IsolateFollowerAndCrashLeader,
}

/// One simulated run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub nodes: u64,
    pub config: Config,
    pub net: NetFaults,
    pub workload: Workload,
    pub nemesis: NemesisSpec,
}

/// Client-side counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientStats {
    /// `NotLeader` answers followed.
    pub redirects: u64,
    /// Operations that hit their deadline while a call was in flight.
    pub timeouts: u64,
    /// Other errors (node crashed under the call, quorum lost for a read).
    pub errors: u64,
    /// Operations dropped because every attempt was refused with `NotLeader`.
    pub no_effect: u64,
    /// `NotLeader` hints whose member address did not match the hinted leader.
    pub bad_hints: u64,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct RunReport {
    pub seed: u64,
    pub ops: Vec<Operation>,
    pub stats: ClientStats,
    pub faults: Vec<(Fault, NodeId)>,
    pub net: NetStats,
    /// Each node's final state, after healing and convergence.
    pub states: BTreeMap<NodeId, NodeState>,
    pub virtual_time: Duration,
}

impl RunReport {
    pub fn count(&self, f: impl Fn(&Operation) -> bool) -> usize {
        self.ops.iter().filter(|o| f(o)).count()
    }

    pub fn crashes(&self) -> usize {
        self.faults
            .iter()
            .filter(|(f, _)| {
                matches!(
                    f,
                    Fault::CrashLeader | Fault::CrashOne | Fault::IsolateFollowerAndCrashLeader
                )
            })
            .count()
    }

    pub fn partitions(&self) -> usize {
        self.faults
            .iter()
            .filter(|(f, _)| {
                matches!(
                    f,
                    Fault::IsolateLeader | Fault::IsolateOne | Fault::IsolateFollowerAndCrashLeader
                )
            })
            .count()
    }

    /// One line for the test log.
    pub fn summary(&self) -> String {
        let reads = self.count(|o| matches!(o.op, Op::Read { .. }));
        let cas = self.count(|o| {
            matches!(
                o.op,
                Op::Write {
                    expect: Some(_),
                    ..
                }
            )
        });
        let unknown = self.count(|o| o.ret == NEVER);
        let acked = self.count(|o| {
            matches!(
                o.op,
                Op::Write {
                    outcome: Outcome::Written(_),
                    ..
                }
            )
        });
        format!(
            "seed {}: {} ops recorded ({reads} reads, {} writes of which {cas} CAS, {acked} \
             acknowledged, {unknown} unknown), {:?}, faults {:?}, {:?}, {:.1}s virtual, \
             final applied index {}",
            self.seed,
            self.ops.len(),
            self.ops.len() - reads,
            self.stats,
            self.faults,
            self.net,
            self.virtual_time.as_secs_f64(),
            self.states.values().next().map_or(0, |s| s.applied),
        )
    }
}

/// The history being recorded: one logical clock for all clients (ticks are strictly
/// increasing, and the runtime is single-threaded, so tick order is real-time order).
#[derive(Default)]
struct Recorder {
    clock: AtomicU64,
    ops: Mutex<Vec<Operation>>,
    stats: Mutex<ClientStats>,
}

impl Recorder {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn stat(&self, f: impl FnOnce(&mut ClientStats)) {
        f(&mut self.stats.lock().expect("stats lock"));
    }
}

enum Request {
    Read,
    Write { value: u64, expect: Option<u64> },
}

/// What one attempt against one node gave.
enum Attempt {
    Done(Option<Op>),
    /// `NotLeader`: nothing happened; try the hinted leader (or another node).
    Redirect(Option<NodeId>),
}

fn other_node(cluster: &Cluster, not: NodeId, rng: &mut Rng) -> NodeId {
    let others: Vec<NodeId> = cluster.ids.iter().copied().filter(|&i| i != not).collect();
    others[rng.below(others.len() as u64) as usize]
}

fn parse_value(json: &str) -> u64 {
    json.parse()
        .unwrap_or_else(|_| panic!("value {json:?} was not written by a simulated client"))
}

/// One simulated client: its identity, its guess of the leader, and a PRNG for retry
/// jitter (separate from the one choosing operations, so the operation schedule depends on
/// the seed alone, not on how many retries the run needed).
struct Client {
    cluster: Arc<Cluster>,
    rec: Arc<Recorder>,
    id: usize,
    timeout: Duration,
    read_mode: ReadMode,
    guess: NodeId,
    retry_rng: Rng,
}

impl Client {
    /// Runs one operation to completion (or its deadline) and records it. Returns `None` when
    /// it provably had no effect (only `NotLeader` answers) or was a read that got no answer;
    /// such operations constrain nothing and are left out of the history.
    async fn perform(&mut self, key: &str, req: Request) -> Option<Operation> {
        let Self {
            cluster,
            rec,
            id: client,
            timeout,
            read_mode,
            guess,
            retry_rng: rng,
        } = self;
        let (client, timeout) = (*client, *timeout);
        let cluster: &Cluster = cluster;
        let call = rec.tick();
        let deadline = Instant::now() + timeout;
        let op = loop {
            if Instant::now() >= deadline {
                rec.stat(|s| s.no_effect += 1);
                break None;
            }
            let Some(node) = cluster.node(*guess) else {
                *guess = other_node(cluster, *guess, rng);
                sleep(Duration::from_millis(5)).await;
                continue;
            };
            let attempt = match &req {
                Request::Read if *read_mode == ReadMode::LocalAnyNode => {
                    let id = cluster.ids[rng.below(cluster.ids.len() as u64) as usize];
                    let local = cluster.node(id).and_then(|n| n.local().get(KIND, key).ok());
                    Attempt::Done(local.map(|r| Op::Read {
                        seen: r.map(|r| (parse_value(&r.value_json), r.revision)),
                    }))
                }
                Request::Read => match timeout_at(deadline, node.read(KIND, key)).await {
                    Err(_) => {
                        rec.stat(|s| s.timeouts += 1);
                        Attempt::Done(None)
                    }
                    Ok(Ok(r)) => Attempt::Done(Some(Op::Read {
                        seen: r.map(|r| (parse_value(&r.value_json), r.revision)),
                    })),
                    Ok(Err(StoreError::NotLeader { leader, member: m })) => {
                        if leader.is_some_and(|l| m != Some(member(l))) {
                            rec.stat(|s| s.bad_hints += 1);
                        }
                        Attempt::Redirect(leader)
                    }
                    Ok(Err(_)) => {
                        rec.stat(|s| s.errors += 1);
                        Attempt::Done(None)
                    }
                },
                Request::Write { value, expect } => {
                    let cmd = Command::Put {
                        kind: KIND.into(),
                        name: key.into(),
                        value_json: value.to_string(),
                        expect_revision: *expect,
                    };
                    let done = |outcome| {
                        Attempt::Done(Some(Op::Write {
                            value: *value,
                            expect: *expect,
                            outcome,
                        }))
                    };
                    match timeout_at(deadline, node.write(cmd)).await {
                        Err(_) => {
                            rec.stat(|s| s.timeouts += 1);
                            done(Outcome::Unknown)
                        }
                        Ok(Ok(rev)) => done(Outcome::Written(rev)),
                        Ok(Err(StoreError::NotLeader { leader, member: m })) => {
                            if leader.is_some_and(|l| m != Some(member(l))) {
                                rec.stat(|s| s.bad_hints += 1);
                            }
                            Attempt::Redirect(leader)
                        }
                        Ok(Err(StoreError::Rejected(CommandError::Conflict {
                            actual, ..
                        }))) => done(Outcome::Conflict(actual)),
                        Ok(Err(StoreError::Rejected(e))) => {
                            panic!("client {client}: unexpected refusal of a valid put: {e}")
                        }
                        Ok(Err(_)) => {
                            rec.stat(|s| s.errors += 1);
                            done(Outcome::Unknown)
                        }
                    }
                }
            };
            drop(node);
            match attempt {
                Attempt::Done(op) => {
                    if op.is_none()
                        || matches!(
                            op,
                            Some(Op::Write {
                                outcome: Outcome::Unknown,
                                ..
                            })
                        )
                    {
                        // The node may be cut off or down: try another one next time.
                        *guess = other_node(cluster, *guess, rng);
                    }
                    break op;
                }
                Attempt::Redirect(hint) => {
                    rec.stat(|s| s.redirects += 1);
                    *guess = match hint {
                        Some(l) if l != *guess => l,
                        _ => other_node(cluster, *guess, rng),
                    };
                    sleep(Duration::from_millis(rng.range((2, 10)))).await;
                }
            }
        }?;
        let ret = match op {
            Op::Write {
                outcome: Outcome::Unknown,
                ..
            } => NEVER,
            _ => rec.tick(),
        };
        let o = Operation {
            client,
            key: key.to_string(),
            call,
            ret,
            op,
        };
        rec.ops.lock().expect("ops lock").push(o.clone());
        Some(o)
    }
}

/// A client's life: `ops_per_client` operations on random keys, chosen by its own PRNG.
async fn run_client(mut client: Client, seed: u64, w: Workload, keys: Arc<Vec<String>>) {
    let mut rng = Rng::derive(seed, 0x434c_4945_0000 + client.id as u64);
    // The last revision this client saw of each key: what its compare-and-sets expect.
    let mut last_rev: HashMap<usize, u64> = HashMap::new();
    for seq in 0..w.ops_per_client {
        let k = rng.below(keys.len() as u64) as usize;
        let roll = rng.below(1000);
        let think = rng.range(w.think_ms);
        let value = (client.id as u64 + 1) * 1_000_000 + seq as u64;
        let req = if roll < w.read_per_mille {
            Request::Read
        } else if roll < w.read_per_mille + w.cas_per_mille {
            Request::Write {
                value,
                expect: Some(last_rev.get(&k).copied().unwrap_or(0)),
            }
        } else {
            Request::Write {
                value,
                expect: None,
            }
        };
        sleep(Duration::from_millis(think)).await;
        let Some(op) = client.perform(&keys[k], req).await else {
            continue;
        };
        let seen = match op.op {
            Op::Read { seen } => Some(seen.map_or(0, |s| s.1)),
            Op::Write {
                outcome: Outcome::Written(r) | Outcome::Conflict(r),
                ..
            } => Some(r),
            _ => None,
        };
        if let Some(r) = seen {
            last_rev.insert(k, r);
        }
    }
}

/// Injects faults until `done`: a quiet period, a fault, its duration, then heal and restart.
/// The first three faults are one of each kind that matters most (leader isolated, leader
/// crashed, no quorum), in a seed-chosen order, so every seed exercises all of them.
async fn run_nemesis(
    cluster: Arc<Cluster>,
    spec: NemesisSpec,
    seed: u64,
    done: Arc<AtomicBool>,
) -> Result<Vec<(Fault, NodeId)>, String> {
    let mut rng = Rng::derive(seed, 0x4e45_4d45);
    let ids = cluster.ids.clone();
    let n = ids.len() as u64;
    let mut forced = [
        Fault::IsolateLeader,
        Fault::CrashLeader,
        Fault::IsolateFollowerAndCrashLeader,
    ];
    for i in (1..forced.len()).rev() {
        forced.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut log = Vec::new();
    for step in 0..10_000 {
        // Always the same draws per step: the schedule depends on the seed only.
        let quiet = rng.range(spec.quiet_ms);
        let hold = rng.range(spec.fault_ms);
        let pick = rng.below(100);
        let a = rng.below(n) as usize;
        let b = rng.below(n - 1) as usize;
        sleep(Duration::from_millis(quiet)).await;
        if done.load(Ordering::SeqCst) {
            break;
        }
        let fault = forced.get(step).copied().unwrap_or(match pick {
            0..35 => Fault::IsolateLeader,
            35..50 => Fault::IsolateOne,
            50..75 => Fault::CrashLeader,
            75..85 => Fault::CrashOne,
            _ => Fault::IsolateFollowerAndCrashLeader,
        });
        let leader = cluster.leader_among(&ids).map_or(ids[a], |(l, _)| l);
        let victim = match fault {
            Fault::IsolateOne | Fault::CrashOne => ids[a],
            _ => leader,
        };
        let others: Vec<NodeId> = ids.iter().copied().filter(|&i| i != victim).collect();
        let mut crashed = None;
        match fault {
            Fault::IsolateLeader | Fault::IsolateOne => cluster.router.isolate(victim, &ids),
            Fault::CrashLeader | Fault::CrashOne => {
                cluster.crash(victim).await?;
                crashed = Some(victim);
            }
            Fault::IsolateFollowerAndCrashLeader => {
                cluster.router.isolate(others[b], &ids);
                cluster.crash(victim).await?;
                crashed = Some(victim);
            }
        }
        log.push((fault, victim));
        sleep(Duration::from_millis(hold)).await;
        cluster.router.heal();
        if let Some(id) = crashed {
            cluster.restart(id).await?;
        }
    }
    Ok(log)
}

/// Runs one scenario: start a cluster, run the clients against the nemesis, heal, read every
/// key once more through the leader (recorded, so the checker also constrains the final
/// state), wait until all nodes agree, and collect what every node holds.
pub async fn run(seed: u64, sc: &Scenario) -> Result<RunReport, String> {
    let t0 = Instant::now();
    let cluster = Arc::new(Cluster::start(seed, sc.nodes, sc.config.clone(), sc.net).await?);
    let keys: Arc<Vec<String>> = Arc::new((0..sc.workload.keys).map(|i| format!("k{i}")).collect());
    let rec = Arc::new(Recorder::default());
    let done = Arc::new(AtomicBool::new(false));
    let nemesis = tokio::spawn(run_nemesis(cluster.clone(), sc.nemesis, seed, done.clone()));
    let client = |id: usize, guess: NodeId| Client {
        cluster: cluster.clone(),
        rec: rec.clone(),
        id,
        timeout: sc.workload.op_timeout,
        read_mode: sc.workload.read_mode,
        guess,
        retry_rng: Rng::derive(seed, 0x5245_5452_5900 + id as u64),
    };
    let clients: Vec<_> = (0..sc.workload.clients)
        .map(|id| {
            let c = client(id, cluster.ids[id % cluster.ids.len()]);
            tokio::spawn(run_client(c, seed, sc.workload, keys.clone()))
        })
        .collect();
    for c in clients {
        if let Err(e) = c.await {
            done.store(true, Ordering::SeqCst);
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
            return Err(format!("client task: {e}"));
        }
    }
    done.store(true, Ordering::SeqCst);
    let faults = nemesis.await.map_err(|e| format!("nemesis task: {e}"))??;

    // Healed and all nodes up (the nemesis restores both before it returns).
    let (leader, _) = cluster
        .wait_for_leader(&cluster.ids, 0, Duration::from_secs(10))
        .await?;
    let mut last = client(sc.workload.clients, leader);
    last.read_mode = ReadMode::Linearizable;
    for key in keys.iter() {
        let mut tries = 0;
        while last.perform(key, Request::Read).await.is_none() {
            tries += 1;
            if tries == 20 {
                return Err(format!("final read of {key} failed 20 times after healing"));
            }
        }
    }
    let states = cluster
        .wait_converged(KIND, &keys, Duration::from_secs(30))
        .await?;
    let net = cluster.router.stats();
    cluster.shutdown().await?;
    drop(last);
    let ops = std::mem::take(&mut *rec.ops.lock().expect("ops lock"));
    let stats = *rec.stats.lock().expect("stats lock");
    Ok(RunReport {
        seed,
        ops,
        stats,
        faults,
        net,
        states,
        virtual_time: t0.elapsed(),
    })
}

/// What [`check_durability`] counted.
#[derive(Debug, Default)]
pub struct Durability {
    pub acknowledged: usize,
    /// Writes with unknown outcome that turned out applied / not applied.
    pub unknown_applied: usize,
    pub unknown_lost: usize,
}

/// Checks every node's final state against what the clients were told:
/// - every acknowledged write is in the key's history, with its acknowledged revision;
/// - every history entry is a write some client issued with an acknowledged or unknown
///   outcome (nothing invented, no refused compare-and-set applied, nothing applied twice);
/// - each key's current value is the last entry of its history.
pub fn check_durability(report: &RunReport) -> Result<Durability, String> {
    let mut acked: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
    let mut unknown: BTreeMap<u64, &str> = BTreeMap::new();
    let mut refused: BTreeSet<u64> = BTreeSet::new();
    for o in &report.ops {
        if let Op::Write { value, outcome, .. } = o.op {
            match outcome {
                Outcome::Written(r) => {
                    acked.insert(value, (o.key.as_str(), r));
                }
                Outcome::Unknown => {
                    unknown.insert(value, o.key.as_str());
                }
                Outcome::Conflict(_) => {
                    refused.insert(value);
                }
            }
        }
    }
    let mut unknown_applied = BTreeSet::new();
    for (id, state) in &report.states {
        let mut applied: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
        for (key, entries) in &state.history {
            for e in entries {
                let Some(json) = &e.value_json else {
                    return Err(format!("node {id}: {key} has a delete, none was issued"));
                };
                let v = parse_value(json);
                if applied.insert(v, (key.as_str(), e.revision)).is_some() {
                    return Err(format!("node {id}: value {v} applied twice to {key}"));
                }
                if e.revision > state.applied {
                    return Err(format!(
                        "node {id}: {key} has revision {} beyond applied index {}",
                        e.revision, state.applied
                    ));
                }
                match (acked.get(&v), unknown.get(&v)) {
                    (Some(&(k, r)), _) if k == key.as_str() && r == e.revision => {}
                    (Some(&(k, r)), _) => {
                        return Err(format!(
                            "node {id}: value {v} acknowledged for {k} at revision {r} but \
                             stored in {key} at revision {}",
                            e.revision
                        ));
                    }
                    (None, Some(&k)) if k == key.as_str() => {
                        unknown_applied.insert(v);
                    }
                    _ if refused.contains(&v) => {
                        return Err(format!(
                            "node {id}: value {v} was refused with a conflict but is in {key}'s \
                             history"
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "node {id}: {key} holds value {v}, which no client wrote there"
                        ));
                    }
                }
            }
            // The current value is the newest history entry.
            let current = state.resources.iter().find(|r| &r.name == key);
            let newest = entries.last();
            match (current, newest) {
                (Some(c), Some(h))
                    if h.value_json.as_deref() == Some(c.value_json.as_str())
                        && h.revision == c.revision => {}
                (None, None) => {}
                (c, h) => {
                    return Err(format!(
                        "node {id}: {key} is {c:?} but its newest history entry is {h:?}"
                    ));
                }
            }
        }
        for (v, (key, rev)) in &acked {
            if applied.get(v) != Some(&(*key, *rev)) {
                return Err(format!(
                    "node {id}: acknowledged write of {v} to {key} at revision {rev} is missing \
                     (found {:?})",
                    applied.get(v)
                ));
            }
        }
    }
    Ok(Durability {
        acknowledged: acked.len(),
        unknown_applied: unknown_applied.len(),
        unknown_lost: unknown.len() - unknown_applied.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::store::{HistoryEntry, Resource};

    fn write(key: &str, value: u64, outcome: Outcome, call: u64) -> Operation {
        Operation {
            client: 0,
            key: key.into(),
            call,
            ret: if outcome == Outcome::Unknown {
                NEVER
            } else {
                call + 1
            },
            op: Op::Write {
                value,
                expect: None,
                outcome,
            },
        }
    }

    fn report(ops: Vec<Operation>, history: &[(u64, u64)]) -> RunReport {
        let entries: Vec<HistoryEntry> = history
            .iter()
            .map(|&(rev, v)| HistoryEntry {
                revision: rev,
                value_json: Some(v.to_string()),
            })
            .collect();
        let resources = history
            .last()
            .map(|&(rev, v)| Resource {
                kind: KIND.into(),
                name: "k0".into(),
                value_json: v.to_string(),
                revision: rev,
            })
            .into_iter()
            .collect();
        let state = NodeState {
            applied: 100,
            resources,
            history: BTreeMap::from([("k0".to_string(), entries)]),
        };
        RunReport {
            seed: 0,
            ops,
            stats: ClientStats::default(),
            faults: Vec::new(),
            net: NetStats::default(),
            states: BTreeMap::from([(1, state)]),
            virtual_time: Duration::ZERO,
        }
    }

    #[test]
    fn durability_check_accepts_and_rejects() {
        let ops = vec![
            write("k0", 1, Outcome::Written(5), 0),
            write("k0", 2, Outcome::Unknown, 2),
            write("k0", 3, Outcome::Unknown, 4),
            write("k0", 4, Outcome::Written(9), 6),
        ];
        let d = check_durability(&report(ops.clone(), &[(5, 1), (7, 2), (9, 4)])).unwrap();
        assert_eq!(
            (d.acknowledged, d.unknown_applied, d.unknown_lost),
            (2, 1, 1)
        );
        // An acknowledged write is missing.
        let e = check_durability(&report(ops.clone(), &[(5, 1), (7, 2)])).unwrap_err();
        assert!(e.contains("acknowledged write of 4"), "{e}");
        // An acknowledged write sits at another revision.
        assert!(check_durability(&report(ops.clone(), &[(5, 1), (10, 4)])).is_err());
        // A value nobody wrote.
        let e = check_durability(&report(ops.clone(), &[(5, 1), (7, 77), (9, 4)])).unwrap_err();
        assert!(e.contains("no client wrote"), "{e}");
        // A value applied twice.
        assert!(check_durability(&report(ops.clone(), &[(5, 1), (6, 2), (7, 2), (9, 4)])).is_err());
        // A refused compare-and-set applied anyway.
        let mut refused = ops.clone();
        refused.push(write("k0", 5, Outcome::Conflict(9), 8));
        let e = check_durability(&report(refused, &[(5, 1), (9, 4), (11, 5)])).unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }
}

//! A simulated network and cluster harness for multi-node tests of the Raft store.
//!
//! Why an in-process router and not turmoil: openraft's `Raft` is an in-process object whose
//! RPC entry points (`append_entries`, `vote`, `install_snapshot`) can be called directly, which
//! is how openraft's own test suite connects nodes. weft has no Raft transport yet
//! (`store::network` is a placeholder), so turmoil would need a throwaway TCP codec for every
//! RPC just to cross its simulated sockets, and would then test that codec rather than the
//! store. Neither approach makes openraft itself deterministic: it draws election timeouts
//! from `rand::thread_rng`, which no harness can seed. What the router does control is every
//! fault:
//!
//! - per-link delays and message loss drawn from a PRNG seeded by `(seed, from, to)`;
//! - an explicit partition table (`isolate`, `partition`, `heal`) checked when a message is
//!   sent, when it arrives, and when its response comes back;
//! - node crashes and restarts on the same redb file (deregistered nodes are unreachable).
//!
//! Time is tokio's paused clock on a single-threaded runtime ([`run_seeded`]): timers fire in
//! virtual time, which advances only when every task is idle. A slow debug build on a busy
//! machine therefore cannot cause spurious elections or client timeouts, and seconds of
//! simulated partitions cost milliseconds of real time. A real-time watchdog bounds the run.
//!
//! Every schedule (client operations, fault choices, delays) is derived from the seed, which
//! is printed when a test fails; `WEFT_SIM_SEED=<seed>` (or a comma-separated list) reruns
//! exactly those seeds. A rerun replays the same schedule; the interleaving of openraft's
//! internal tasks may still differ (see above), so a rare failure may need a few reruns.

pub mod linearizability;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{Config, ServerState};
use tokio::time::{Instant, sleep};
use weft_control::store::{
    ConfigRaft, HistoryEntry, Member, Node, NodeId, Resource, Store, TypeConfig,
};

/// A small, fully specified PRNG (SplitMix64): the same seed gives the same schedule on every
/// platform and with every version of every crate, which a general-purpose RNG does not
/// promise.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// An independent stream for one purpose (a client, a link, the nemesis) of one seed.
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut r = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias is irrelevant for test schedules).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// The seeds to run: `WEFT_SIM_SEED` (one seed or a comma-separated list) or `default`.
pub fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("WEFT_SIM_SEED") {
        Ok(s) if !s.trim().is_empty() => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("WEFT_SIM_SEED: {x:?} is not a u64"))
            })
            .collect(),
        _ => default.to_vec(),
    }
}

/// Prints how to rerun the failing seed when the test panics.
struct SeedGuard<'a> {
    test: &'a str,
    seed: u64,
}

impl Drop for SeedGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "\n*** {} failed with seed {}; rerun it alone with\n    \
                 WEFT_SIM_SEED={} cargo test -p weft-control --test partition {} -- --nocapture\n",
                self.test, self.seed, self.seed, self.test
            );
        }
    }
}

/// Runs `body(seed)` on a fresh single-threaded runtime with a paused clock (see the module
/// docs), under a real-time watchdog that ends the process with the seed if the run hangs:
/// virtual time cannot bound a busy loop, so something outside the runtime has to.
pub fn run_seeded<F, Fut>(test: &str, seed: u64, real_limit: Duration, body: F) -> Fut::Output
where
    F: FnOnce(u64) -> Fut,
    Fut: Future,
{
    let _guard = SeedGuard { test, seed };
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let name = test.to_string();
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(real_limit) {
            eprintln!(
                "\n*** {name}: seed {seed} still running after {real_limit:?} of real time; \
                 rerun it alone with WEFT_SIM_SEED={seed}\n"
            );
            std::process::exit(2);
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("tokio runtime");
    let out = rt.block_on(body(seed));
    drop(rt);
    drop(done_tx);
    let _ = watchdog.join();
    out
}

/// Raft timing for simulations: short timeouts (they are virtual, so short costs nothing in
/// stability) and frequent snapshots so that restarted nodes catch up through
/// `install_snapshot` as well as through the log.
pub fn sim_config(snapshot_every: u64, keep_logs: u64) -> Config {
    Config {
        cluster_name: "weft-sim".into(),
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: keep_logs,
        ..Default::default()
    }
    .validate()
    .expect("valid raft config")
}

/// Random network faults applied to every message.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetFaults {
    /// Each direction of an RPC is delayed by 0..=max_delay_ms (virtual) milliseconds.
    pub max_delay_ms: u64,
    /// Probability (per mille) that a request, and separately its response, is lost.
    pub drop_per_mille: u64,
}

/// Message counters, for reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    pub delivered: u64,
    pub dropped: u64,
    /// Refused at send time: partitioned or target down.
    pub refused: u64,
    /// `install_snapshot` calls answered successfully (a node caught up from a snapshot).
    pub snapshot_chunks: u64,
}

/// The in-process network: who is up, who can reach whom, and how messages misbehave.
pub struct Router {
    seed: u64,
    inner: Mutex<RouterState>,
}

#[derive(Default)]
struct RouterState {
    nodes: BTreeMap<NodeId, ConfigRaft>,
    /// Directed (from, to) pairs that cannot communicate.
    blocked: BTreeSet<(NodeId, NodeId)>,
    faults: NetFaults,
    links: BTreeMap<(NodeId, NodeId), Rng>,
    stats: NetStats,
}

/// The fate of one RPC, drawn before it is sent (always the same number of draws, so a link's
/// sequence of fates depends only on the seed and how many messages it carried).
struct Plan {
    request_delay: Duration,
    response_delay: Duration,
    drop_request: bool,
    drop_response: bool,
}

#[derive(Debug)]
struct SimNetError(&'static str);

impl std::fmt::Display for SimNetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for SimNetError {}

type RpcResult<T, E> = Result<T, RPCError<NodeId, Member, RaftError<NodeId, E>>>;

impl Router {
    pub fn new(seed: u64, faults: NetFaults) -> Self {
        Self {
            seed,
            inner: Mutex::new(RouterState {
                faults,
                ..Default::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RouterState> {
        self.inner.lock().expect("router lock")
    }

    pub fn register(&self, id: NodeId, raft: ConfigRaft) {
        self.state().nodes.insert(id, raft);
    }

    pub fn deregister(&self, id: NodeId) {
        self.state().nodes.remove(&id);
    }

    /// Cuts `id` off from every other node, both directions.
    pub fn isolate(&self, id: NodeId, all: &[NodeId]) {
        let mut s = self.state();
        for &other in all.iter().filter(|&&o| o != id) {
            s.blocked.insert((id, other));
            s.blocked.insert((other, id));
        }
    }

    /// Lets messages flow between every pair again.
    pub fn heal(&self) {
        self.state().blocked.clear();
    }

    pub fn stats(&self) -> NetStats {
        self.state().stats
    }

    /// The fate of the next message from `from` to `to`; `None` when the link is cut.
    fn plan(&self, from: NodeId, to: NodeId) -> Option<Plan> {
        let mut s = self.state();
        if s.blocked.contains(&(from, to)) {
            s.stats.refused += 1;
            return None;
        }
        let f = s.faults;
        let seed = self.seed;
        let rng = s
            .links
            .entry((from, to))
            .or_insert_with(|| Rng::derive(seed, 0x4c49_4e4b_0000 + from * 1000 + to));
        let d1 = rng.below(f.max_delay_ms + 1);
        let d2 = rng.below(f.max_delay_ms + 1);
        let l1 = rng.chance(f.drop_per_mille);
        let l2 = rng.chance(f.drop_per_mille);
        Some(Plan {
            request_delay: Duration::from_millis(d1),
            response_delay: Duration::from_millis(d2),
            drop_request: l1,
            drop_response: l2,
        })
    }

    /// Carries one RPC from `from` to `to`: delay, maybe lose it, check the partition table
    /// again on arrival, call the target's handler, then the same for the response. A lost
    /// response means the target did process the request, as on a real network.
    async fn deliver<Req, Resp, E, F, Fut>(
        &self,
        from: NodeId,
        to: NodeId,
        req: Req,
        call: F,
    ) -> RpcResult<Resp, E>
    where
        E: std::error::Error,
        F: FnOnce(ConfigRaft, Req) -> Fut,
        Fut: Future<Output = Result<Resp, RaftError<NodeId, E>>>,
    {
        let Some(plan) = self.plan(from, to) else {
            return Err(RPCError::Unreachable(Unreachable::new(&SimNetError(
                "partitioned",
            ))));
        };
        sleep(plan.request_delay).await;
        let target = {
            let mut s = self.state();
            if plan.drop_request || s.blocked.contains(&(from, to)) {
                s.stats.dropped += 1;
                return Err(RPCError::Network(NetworkError::new(&SimNetError(
                    "request lost",
                ))));
            }
            match s.nodes.get(&to) {
                Some(r) => r.clone(),
                None => {
                    s.stats.refused += 1;
                    return Err(RPCError::Unreachable(Unreachable::new(&SimNetError(
                        "target is down",
                    ))));
                }
            }
        };
        let res = call(target, req).await;
        sleep(plan.response_delay).await;
        {
            let mut s = self.state();
            if plan.drop_response || s.blocked.contains(&(to, from)) {
                s.stats.dropped += 1;
                return Err(RPCError::Network(NetworkError::new(&SimNetError(
                    "response lost",
                ))));
            }
            s.stats.delivered += 1;
        }
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
    }
}

/// The `RaftNetworkFactory` handed to `Node::start`: node `from`'s view of the router.
#[derive(Clone)]
pub struct RouterNetwork {
    from: NodeId,
    router: Arc<Router>,
}

/// One node's connection to one peer.
pub struct RouterConn {
    from: NodeId,
    target: NodeId,
    router: Arc<Router>,
}

impl RaftNetworkFactory<TypeConfig> for RouterNetwork {
    type Network = RouterConn;

    async fn new_client(&mut self, target: NodeId, _node: &Member) -> Self::Network {
        RouterConn {
            from: self.from,
            target,
            router: self.router.clone(),
        }
    }
}

impl RaftNetwork<TypeConfig> for RouterConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.router
            .deliver(self.from, self.target, rpc, |raft, rpc| async move {
                raft.append_entries(rpc).await
            })
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let res = self
            .router
            .deliver(self.from, self.target, rpc, |raft, rpc| async move {
                raft.install_snapshot(rpc).await
            })
            .await;
        if res.is_ok() {
            self.router.state().stats.snapshot_chunks += 1;
        }
        res
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.router
            .deliver(self.from, self.target, rpc, |raft, rpc| async move {
                raft.vote(rpc).await
            })
            .await
    }

    /// openraft waits this long after `Unreachable` before retrying a peer (500 ms by default);
    /// a shorter wait lets a healed cluster converge quickly without busy retries.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(100)))
    }
}

/// A member's addresses in the simulation (never dialed; kept for NotLeader hints).
pub fn member(id: NodeId) -> Member {
    Member {
        addr: format!("sim-node-{id}:7000"),
        xds_addr: format!("sim-node-{id}:7001"),
    }
}

/// Everything one node holds for `kind`, as read from its redb file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// The store's last applied log index.
    pub applied: u64,
    pub resources: Vec<Resource>,
    pub history: BTreeMap<String, Vec<HistoryEntry>>,
}

/// A cluster of nodes on one router, each over its own redb file in a temp dir.
pub struct Cluster {
    pub router: Arc<Router>,
    pub ids: Vec<NodeId>,
    config: Config,
    dir: tempfile::TempDir,
    nodes: Mutex<BTreeMap<NodeId, Arc<Node>>>,
}

impl Cluster {
    /// Starts nodes `1..=size`, initializes them as one cluster and waits for a leader.
    pub async fn start(
        seed: u64,
        size: u64,
        config: Config,
        faults: NetFaults,
    ) -> Result<Self, String> {
        let cluster = Self {
            router: Arc::new(Router::new(seed, faults)),
            ids: (1..=size).collect(),
            config,
            dir: tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?,
            nodes: Mutex::new(BTreeMap::new()),
        };
        for &id in &cluster.ids {
            cluster.boot(id).await?;
        }
        let members = cluster.ids.iter().map(|&id| (id, member(id))).collect();
        let first = cluster.node(1).ok_or("node 1 missing")?;
        let fresh = first
            .initialize(members)
            .await
            .map_err(|e| format!("initialize: {e}"))?;
        if !fresh {
            return Err("a fresh store claims to be initialized already".into());
        }
        cluster
            .wait_for_leader(&cluster.ids, 0, Duration::from_secs(10))
            .await?;
        Ok(cluster)
    }

    pub fn path(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("node-{id}.redb"))
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, BTreeMap<NodeId, Arc<Node>>> {
        self.nodes.lock().expect("cluster lock")
    }

    /// Opens `id`'s file, starts Raft on it and connects it to the router.
    async fn boot(&self, id: NodeId) -> Result<(), String> {
        let store = Store::open(self.path(id)).map_err(|e| format!("open node {id}: {e}"))?;
        let network = RouterNetwork {
            from: id,
            router: self.router.clone(),
        };
        let node = Node::start(id, &store, self.config.clone(), network)
            .await
            .map_err(|e| format!("start node {id}: {e}"))?;
        drop(store);
        self.router.register(id, node.raft().clone());
        self.nodes().insert(id, Arc::new(node));
        Ok(())
    }

    /// The running node `id`, if it is up.
    pub fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        self.nodes().get(&id).cloned()
    }

    pub fn running(&self) -> Vec<NodeId> {
        self.nodes().keys().copied().collect()
    }

    /// Crashes `id`: it vanishes from the network, its Raft stops (in-flight client calls fail
    /// as they would when the process dies), and its files are released for a restart. Raft
    /// stops before anyone can observe more, so this is a crash at an arbitrary point between
    /// two log transactions, each atomic and durable. One thing a real crash does that this
    /// cannot: lose the applied state written since the state file's last fsync (redb makes
    /// pending commits durable when a file is closed in-process). That path, re-applying from
    /// the log, is covered with SIGKILL in `tests/tests/control_plane.rs`.
    pub async fn crash(&self, id: NodeId) -> Result<(), String> {
        let mut node = self
            .nodes()
            .remove(&id)
            .ok_or_else(|| format!("crash: node {id} is not running"))?;
        self.router.deregister(id);
        let _ = node.raft().shutdown().await;
        // Clients may still hold the handle for a moment; their calls fail now.
        let deadline = Instant::now() + Duration::from_secs(10);
        let node = loop {
            match Arc::try_unwrap(node) {
                Ok(n) => break n,
                Err(shared) => {
                    if Instant::now() >= deadline {
                        return Err(format!("crash: node {id} still in use after 10 s"));
                    }
                    node = shared;
                    sleep(Duration::from_millis(1)).await;
                }
            }
        };
        node.shutdown()
            .await
            .map_err(|e| format!("crash: node {id} did not release its store: {e}"))
    }

    /// Restarts a crashed node from its file.
    pub async fn restart(&self, id: NodeId) -> Result<(), String> {
        if self.node(id).is_some() {
            return Err(format!("restart: node {id} is running"));
        }
        self.boot(id).await
    }

    /// Raft metrics of a running node.
    pub fn metrics(&self, id: NodeId) -> Option<openraft::RaftMetrics<NodeId, Member>> {
        self.node(id).map(|n| n.raft().metrics().borrow().clone())
    }

    /// The node among `among` that believes it leads, with the highest term, and that term.
    pub fn leader_among(&self, among: &[NodeId]) -> Option<(NodeId, u64)> {
        among
            .iter()
            .filter_map(|&id| self.metrics(id).map(|m| (id, m)))
            .filter(|(id, m)| m.state == ServerState::Leader && m.current_leader == Some(*id))
            .map(|(id, m)| (id, m.current_term))
            .max_by_key(|&(_, term)| term)
    }

    /// Waits until some node in `among` leads in a term ≥ `min_term`.
    pub async fn wait_for_leader(
        &self,
        among: &[NodeId],
        min_term: u64,
        timeout: Duration,
    ) -> Result<(NodeId, u64), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((id, term)) = self.leader_among(among)
                && term >= min_term
            {
                return Ok((id, term));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no leader among {among:?} with term >= {min_term} within {timeout:?}"
                ));
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// What node `id` holds for `kind` (plus the history of `names`, even if deleted).
    pub fn node_state(
        &self,
        id: NodeId,
        kind: &str,
        names: &[String],
    ) -> Result<NodeState, String> {
        let node = self.node(id).ok_or_else(|| format!("node {id} is down"))?;
        let sm = node.local();
        let e = |e| format!("node {id}: {e}");
        let applied = sm.last_applied_index().map_err(e)?;
        let resources = sm.list(kind).map_err(e)?;
        let mut history = BTreeMap::new();
        let all: BTreeSet<&String> = names
            .iter()
            .chain(resources.iter().map(|r| &r.name))
            .collect();
        for name in all {
            history.insert(name.clone(), sm.history(kind, name).map_err(e)?);
        }
        Ok(NodeState {
            applied,
            resources,
            history,
        })
    }

    /// Waits until every node is up, agrees on one leader, has applied the same index (in the
    /// store and in openraft's metrics) and holds the same resources and histories for `kind`.
    pub async fn wait_converged(
        &self,
        kind: &str,
        names: &[String],
        timeout: Duration,
    ) -> Result<BTreeMap<NodeId, NodeState>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut why = String::new();
            let mut states = BTreeMap::new();
            let mut leaders = BTreeSet::new();
            for &id in &self.ids {
                let Some(m) = self.metrics(id) else {
                    why = format!("node {id} is down");
                    break;
                };
                leaders.insert(m.current_leader);
                let s = self.node_state(id, kind, names)?;
                let raft_applied = m.last_applied.map(|l| l.index).unwrap_or(0);
                if raft_applied != s.applied {
                    why = format!(
                        "node {id}: openraft applied {raft_applied}, store applied {}",
                        s.applied
                    );
                }
                states.insert(id, s);
            }
            if why.is_empty() {
                let first = states.values().next();
                if leaders.len() != 1 || leaders.contains(&None) {
                    why = format!("leaders differ: {leaders:?}");
                } else if let Some(diff) = states.iter().find(|(_, s)| Some(*s) != first) {
                    why = format!(
                        "node {} differs: applied {} vs {}",
                        diff.0,
                        diff.1.applied,
                        first.map_or(0, |f| f.applied)
                    );
                } else {
                    return Ok(states);
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not converged within {timeout:?}: {why}; states: {states:#?}"
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every running node and releases the files.
    pub async fn shutdown(&self) -> Result<(), String> {
        for id in self.running() {
            self.crash(id).await?;
        }
        Ok(())
    }
}

//! The Raft-replicated config store: openraft over two redb files (the log; the state).
//!
//! - `types`: the Raft type config, the replicated `Command`s and their typed results.
//! - `db`: the redb tables: log and raft metadata in one file, state, history and snapshot in
//!   the other.
//! - `log`: `RaftLogStorage` (one fsynced transaction per append batch).
//! - `state`: `RaftStateMachine` (resources with revisions, history, snapshots).
//! - `network`: a placeholder transport for single-node clusters.
//! - `propose`: gathers concurrent writes into one log entry each round.
//!
//! A resource's revision is the log index of the entry that wrote it, so revisions grow
//! across restarts and can version xDS pushes on any node. Writes batched into one entry share
//! its index, like the keys of one etcd transaction (a batch never writes a key twice).

// openraft's trait methods return `StorageError` (about 224 bytes); the helpers here return the
// same type so errors pass through unchanged. Boxing would only add conversions at every trait
// boundary.
#![allow(clippy::result_large_err)]

mod db;
pub mod log;
mod log_writer;
pub mod network;
pub mod propose;
pub mod state;
pub mod types;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use openraft::{ChangeMembers, Config, StorageError};

pub use log::LogStore;
pub use network::NoNetwork;
pub use state::{DEFAULT_HISTORY_REVISIONS, SnapshotState, StateMachineStore};
pub use types::{
    Command, CommandError, CommandResult, ConfigRaft, HistoryEntry, Member, NodeId, Proposal,
    Resource, TypeConfig,
};

/// Everything that can go wrong using the store, as values a caller can match on.
#[derive(Debug)]
pub enum StoreError {
    /// The redb file could not be opened or created.
    Open(redb::Error),
    /// Reading or writing the local state failed (boxed: openraft's error is over 200 bytes,
    /// and every store call returns this type).
    Storage(Box<StorageError<NodeId>>),
    /// This node is not the leader; `leader` (at `member`) is the one it knows of, if any.
    NotLeader {
        leader: Option<NodeId>,
        member: Option<Member>,
    },
    /// The command was committed but the state machine refused it (e.g. revision conflict).
    Rejected(CommandError),
    /// Raft itself failed (fatal error, shutdown, quorum lost, timeout).
    Raft(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(e) => write!(f, "opening the store: {e}"),
            Self::Storage(e) => write!(f, "store IO: {e}"),
            Self::NotLeader {
                leader: Some(l), ..
            } => write!(f, "not the leader; leader is node {l}"),
            Self::NotLeader { leader: None, .. } => write!(f, "not the leader; no leader known"),
            Self::Rejected(e) => write!(f, "rejected: {e}"),
            Self::Raft(e) => write!(f, "raft: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<StorageError<NodeId>> for StoreError {
    fn from(e: StorageError<NodeId>) -> Self {
        Self::Storage(Box::new(e))
    }
}

/// The durable half of a node: the state-machine file and the log file beside it.
#[derive(Clone)]
pub struct Store {
    db: Arc<redb::Database>,
    log_db: Arc<redb::Database>,
    shared: Arc<state::Shared>,
}

impl Store {
    /// Opens or creates the store at `path` (the state file) and the log file beside it
    /// ([`Store::log_path`]); a store from before the split is split on the way.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let db = db::open_state(path).map_err(StoreError::Open)?;
        let log_db = db::open_log(&db, &db::log_path(path)).map_err(StoreError::Open)?;
        db::refuse_state_behind_log(&db, &log_db, path).map_err(StoreError::Open)?;
        state::upgrade_history(&db).map_err(StoreError::Open)?;
        let changes = state::Changes { everything: true, ..Default::default() };
        Ok(Self {
            db: Arc::new(db),
            log_db: Arc::new(log_db),
            shared: Arc::new(state::Shared::new(changes)),
        })
    }

    /// How many revisions back the resource history reaches (`--history-revisions`); older
    /// rows are compacted as entries are applied, except each resource's current one. 0 keeps
    /// everything. Default [`DEFAULT_HISTORY_REVISIONS`].
    ///
    /// The value is remembered in the state file; when it differs from the one the file was
    /// last opened with, that earlier value is returned, so the caller can warn: lowering it
    /// compacts history this node kept until now, raising it cannot bring compacted rows back,
    /// and the other members go on with their own value.
    pub fn keep_history(&self, revisions: u64) -> Result<Option<u64>, StoreError> {
        self.shared.history_revisions.store(revisions, std::sync::atomic::Ordering::Relaxed);
        let before: Option<u64> = db::read_meta(&self.db, db::SM_META, db::KEY_HISTORY_REVISIONS)?;
        if before != Some(revisions) {
            db::write_meta(&self.db, db::SM_META, db::KEY_HISTORY_REVISIONS, &revisions)?;
        }
        Ok(before.filter(|b| *b != revisions))
    }

    /// Where the log of the store whose state file is `path` lives.
    pub fn log_path(path: impl AsRef<Path>) -> std::path::PathBuf {
        db::log_path(path.as_ref())
    }

    /// The log store to hand to `Raft::new`.
    pub fn log_store(&self) -> LogStore {
        LogStore::new(self.log_db.clone(), self.db.clone(), self.shared.clone(), None, None)
    }

    /// The state machine to hand to `Raft::new` (clones read the same file).
    pub fn state_machine(&self) -> StateMachineStore {
        StateMachineStore::new(self.db.clone(), self.shared.clone(), None)
    }
}

/// Raft timing for the store. Snapshot every `snapshot_every` applied entries (the log is purged
/// up to the snapshot, keeping `keep_logs` entries for followers that lag a little).
pub fn raft_config(snapshot_every: u64, keep_logs: u64) -> Result<Config, StoreError> {
    let c = Config {
        cluster_name: "weft-control".to_string(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_every),
        max_in_snapshot_log_to_keep: keep_logs,
        ..Default::default()
    };
    c.validate().map_err(|e| StoreError::Raft(e.to_string()))
}

/// Who is who in the cluster, as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MembersView {
    pub leader: Option<NodeId>,
    pub term: u64,
    pub members: Vec<MemberView>,
}

/// One member of [`MembersView`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberView {
    pub id: NodeId,
    pub addr: String,
    pub xds_addr: String,
    /// False for a learner (receives the log, does not vote or count for quorum).
    pub voter: bool,
}

/// A running control-plane member: the Raft handle plus a read view of its state machine.
pub struct Node {
    id: NodeId,
    raft: ConfigRaft,
    state: StateMachineStore,
    proposer: propose::Proposer,
    /// Every write's latency, for `/metrics`.
    writes: crate::metrics::Histogram,
    /// Tracks the storage copies openraft owns: openraft's background tasks may outlive
    /// `Raft::shutdown` by a moment, and redb refuses a second open while they hold the file.
    lease: std::sync::Weak<()>,
}

fn raft_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Raft(e.to_string())
}

/// Turns an openraft error into `NotLeader` when it is a forward-to-leader, else `Raft`.
fn leader_or<E>(e: openraft::error::RaftError<NodeId, E>) -> StoreError
where
    E: std::error::Error + openraft::TryAsRef<openraft::error::ForwardToLeader<NodeId, Member>>,
{
    match e.forward_to_leader::<Member>() {
        Some(f) => StoreError::NotLeader {
            leader: f.leader_id,
            member: f.leader_node.clone(),
        },
        None => StoreError::Raft(e.to_string()),
    }
}

impl Node {
    /// Starts a member over `store`, talking to peers through `network`. A fresh store joins
    /// no cluster until [`Node::initialize`] (a new cluster) or a leader adds it; a store that
    /// already holds a log recovers its membership and state from the file.
    pub async fn start<N>(id: NodeId, store: &Store, config: Config, network: N) -> Result<Self, StoreError>
    where
        N: RaftNetworkFactory<TypeConfig>,
    {
        let lease = Arc::new(());
        let log = LogStore::new(store.log_db.clone(), store.db.clone(), store.shared.clone(), Some(id), Some(lease.clone()));
        let sm = StateMachineStore::new(store.db.clone(), store.shared.clone(), Some(lease.clone()));
        let weak = Arc::downgrade(&lease);
        drop(lease);
        let raft = ConfigRaft::new(id, Arc::new(config), network, log, sm)
            .await
            .map_err(raft_err)?;
        Ok(Self {
            id,
            proposer: propose::Proposer::start(raft.clone()),
            writes: crate::metrics::Histogram::default(),
            raft,
            state: store.state_machine(),
            lease: weak,
        })
    }

    /// Makes `members` a new cluster. Returns false (and changes nothing) when this node's
    /// store already belongs to a cluster, so `--init` is safe to pass on every start.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Member>) -> Result<bool, StoreError> {
        if self.raft.is_initialized().await.map_err(raft_err)? {
            return Ok(false);
        }
        self.raft.initialize(members).await.map_err(raft_err)?;
        Ok(true)
    }

    /// Starts a single-member cluster over `store` (initialized on first start, recovered on
    /// a restart) and returns once this node leads, i.e. can accept writes.
    pub async fn start_single(
        id: NodeId,
        member: Member,
        store: &Store,
        config: Config,
    ) -> Result<Self, StoreError> {
        let node = Self::start(id, store, config, NoNetwork).await?;
        node.initialize(BTreeMap::from([(id, member)])).await?;
        node.raft
            .wait(Some(Duration::from_secs(10)))
            .current_leader(id, "single node becomes leader")
            .await
            .map_err(raft_err)?;
        Ok(node)
    }

    /// The leader this node currently knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// How many revisions back this node's resource history reaches (`--history-revisions`).
    pub fn history_revisions(&self) -> u64 {
        self.state.history_revisions()
    }

    /// Members, their addresses and roles, from this node's latest membership config.
    pub fn members(&self) -> MembersView {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| MemberView {
                id: *id,
                addr: n.addr.clone(),
                xds_addr: n.xds_addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        MembersView {
            leader: m.current_leader,
            term: m.current_term,
            members,
        }
    }

    /// The addresses of member `id`, if it is one.
    pub fn member(&self, id: NodeId) -> Option<Member> {
        let m = self.raft.metrics().borrow().clone();
        m.membership_config.membership().get_node(&id).cloned()
    }

    /// Adds `id` as a learner, waits until it has caught up with the log, then (when `voter`)
    /// promotes it to a voter. Must run on the leader (`NotLeader` otherwise).
    pub async fn add_member(&self, id: NodeId, member: Member, voter: bool) -> Result<(), StoreError> {
        self.raft
            .add_learner(id, member, true)
            .await
            .map_err(leader_or)?;
        if voter {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                .await
                .map_err(leader_or)?;
        }
        Ok(())
    }

    /// Removes member `id` (voter or learner) from the cluster. Must run on the leader.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), StoreError> {
        let view = self.members();
        let Some(m) = view.members.iter().find(|m| m.id == id) else {
            return Err(StoreError::Rejected(CommandError::NotFound {
                kind: "members".into(),
                name: id.to_string(),
            }));
        };
        let change = if m.voter {
            ChangeMembers::RemoveVoters([id].into())
        } else {
            ChangeMembers::RemoveNodes([id].into())
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(leader_or)?;
        Ok(())
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The underlying Raft handle (membership, metrics, snapshot triggers).
    pub fn raft(&self) -> &ConfigRaft {
        &self.raft
    }

    /// Replicates `cmd` and returns the new revision (its entry's log index) once it is committed and
    /// applied; a refused command (conflict, not found, bad JSON) is `StoreError::Rejected`.
    pub async fn write(&self, cmd: Command) -> Result<u64, StoreError> {
        self.write_changed(cmd).await.map(|(revision, _)| revision)
    }

    /// Like [`Node::write`], also telling whether the write changed anything: a `Put` of the
    /// value already stored keeps the old revision (see the state machine).
    /// Concurrent writes share log entries (see `propose`).
    pub async fn write_changed(&self, cmd: Command) -> Result<(u64, bool), StoreError> {
        let start = std::time::Instant::now();
        let r = self.proposer.write(cmd).await;
        self.writes.record(start.elapsed());
        r
    }

    /// The latency of every write through this node (committed or not).
    pub fn write_latency(&self) -> &crate::metrics::Histogram {
        &self.writes
    }

    /// Waits until this node can serve a linearizable read (it is leader, confirmed by a
    /// quorum, and has applied everything committed before the call).
    pub async fn linearize(&self) -> Result<(), StoreError> {
        self.raft.ensure_linearizable().await.map_err(leader_or)?;
        Ok(())
    }

    /// Linearizable read of one resource.
    pub async fn read(&self, kind: &str, name: &str) -> Result<Option<Resource>, StoreError> {
        self.linearize().await?;
        Ok(self.state.get(kind, name)?)
    }

    /// Linearizable list of one kind.
    pub async fn list(&self, kind: &str) -> Result<Vec<Resource>, StoreError> {
        self.linearize().await?;
        Ok(self.state.list(kind)?)
    }

    /// Restores `kind/name` to the value it had at `revision` (a new write, so history only
    /// grows), guarded by the current revision so a concurrent change makes it a conflict
    /// instead of being overwritten. Rolling back to a tombstone deletes the resource.
    pub async fn rollback(&self, kind: &str, name: &str, revision: u64) -> Result<u64, StoreError> {
        self.linearize().await?;
        let history = self.state.history(kind, name)?;
        let Some(target) = history.iter().find(|h| h.revision == revision) else {
            return Err(StoreError::Rejected(CommandError::NotFound {
                kind: kind.to_string(),
                name: name.to_string(),
            }));
        };
        let current = self.state.get(kind, name)?.map(|r| r.revision).unwrap_or(0);
        let cmd = match &target.value_json {
            Some(v) => Command::Put {
                kind: kind.to_string(),
                name: name.to_string(),
                value_json: v.clone(),
                expect_revision: Some(current),
            },
            None => Command::Delete {
                kind: kind.to_string(),
                name: name.to_string(),
                expect_revision: Some(current),
            },
        };
        self.write(cmd).await
    }

    /// Local (possibly stale) view of the state, for reads that opt out of linearizability
    /// and for history.
    pub fn local(&self) -> &StateMachineStore {
        &self.state
    }

    /// Stops Raft and waits (up to 5 s) until openraft has released its storage handles, so
    /// the same file can be reopened in this process right after. The file is consistent at
    /// any point; this only matters for in-process restarts.
    pub async fn shutdown(self) -> Result<(), StoreError> {
        let Self { raft, lease, state, .. } = self;
        raft.shutdown()
            .await
            .map_err(|e| StoreError::Raft(e.to_string()))?;
        drop(raft);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while lease.strong_count() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Raft(
                    "storage still held by raft tasks after shutdown".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Applied state is fsynced only now and then; a clean stop leaves nothing to re-apply.
        state.sync()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

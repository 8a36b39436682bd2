//! The Raft-replicated config store: openraft over one redb file.
//!
//! - `types`: the Raft type config, the replicated `Command`s and their typed results.
//! - `db`: the redb tables (log, raft metadata, state, history, snapshot) in one file.
//! - `log`: `RaftLogStorage` (one fsynced transaction per append batch).
//! - `state`: `RaftStateMachine` (resources with revisions, history, snapshots).
//! - `network`: a placeholder transport for single-node clusters.
//!
//! A resource's revision is the log index of the write that produced it, so revisions grow
//! across restarts and can version xDS pushes on any node.

// openraft's trait methods return `StorageError` (about 224 bytes); the helpers here return the
// same type so errors pass through unchanged. Boxing would only add conversions at every trait
// boundary.
#![allow(clippy::result_large_err)]

mod db;
pub mod log;
pub mod network;
pub mod state;
pub mod types;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, Config, StorageError};

pub use log::LogStore;
pub use network::NoNetwork;
pub use state::{SnapshotState, StateMachineStore};
pub use types::{
    Command, CommandError, CommandResult, ConfigRaft, HistoryEntry, NodeId, Resource, TypeConfig,
};

/// Everything that can go wrong using the store, as values a caller can match on.
#[derive(Debug)]
pub enum StoreError {
    /// The redb file could not be opened or created.
    Open(redb::Error),
    /// Reading or writing the local state failed.
    Storage(StorageError<NodeId>),
    /// This node is not the leader; `leader` is the one it knows of, if any.
    NotLeader { leader: Option<NodeId> },
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
            Self::NotLeader { leader: Some(l) } => write!(f, "not the leader; leader is node {l}"),
            Self::NotLeader { leader: None } => write!(f, "not the leader; no leader known"),
            Self::Rejected(e) => write!(f, "rejected: {e}"),
            Self::Raft(e) => write!(f, "raft: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<StorageError<NodeId>> for StoreError {
    fn from(e: StorageError<NodeId>) -> Self {
        Self::Storage(e)
    }
}

/// The durable half of a node: one redb file shared by the log store and the state machine.
#[derive(Clone)]
pub struct Store {
    db: Arc<redb::Database>,
}

impl Store {
    /// Opens or creates the store file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let db = db::open(path.as_ref()).map_err(StoreError::Open)?;
        Ok(Self { db: Arc::new(db) })
    }

    /// The log store to hand to `Raft::new`.
    pub fn log_store(&self) -> LogStore {
        LogStore::new(self.db.clone(), None)
    }

    /// The state machine to hand to `Raft::new` (clones read the same file).
    pub fn state_machine(&self) -> StateMachineStore {
        StateMachineStore::new(self.db.clone(), None)
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

/// A running control-plane member: the Raft handle plus a read view of its state machine.
pub struct Node {
    id: NodeId,
    raft: ConfigRaft,
    state: StateMachineStore,
    /// Tracks the storage copies openraft owns: openraft's background tasks may outlive
    /// `Raft::shutdown` by a moment, and redb refuses a second open while they hold the file.
    lease: std::sync::Weak<()>,
}

impl Node {
    /// Starts a single-member cluster over `store`: initializes it on first start, and on a
    /// restart recovers from the file (initialize is skipped because the log already holds the
    /// membership). Returns once this node leads, i.e. can accept writes.
    pub async fn start_single(
        id: NodeId,
        addr: &str,
        store: &Store,
        config: Config,
    ) -> Result<Self, StoreError> {
        let lease = Arc::new(());
        let log = LogStore::new(store.db.clone(), Some(lease.clone()));
        let sm = StateMachineStore::new(store.db.clone(), Some(lease.clone()));
        let weak = Arc::downgrade(&lease);
        drop(lease);
        let raft = ConfigRaft::new(id, Arc::new(config), NoNetwork, log, sm)
            .await
            .map_err(|e| StoreError::Raft(e.to_string()))?;
        if !raft
            .is_initialized()
            .await
            .map_err(|e| StoreError::Raft(e.to_string()))?
        {
            let mut members = BTreeMap::new();
            members.insert(id, BasicNode::new(addr));
            raft.initialize(members)
                .await
                .map_err(|e| StoreError::Raft(e.to_string()))?;
        }
        raft.wait(Some(Duration::from_secs(10)))
            .current_leader(id, "single node becomes leader")
            .await
            .map_err(|e| StoreError::Raft(e.to_string()))?;
        Ok(Self {
            id,
            raft,
            state: store.state_machine(),
            lease: weak,
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The underlying Raft handle (membership, metrics, snapshot triggers).
    pub fn raft(&self) -> &ConfigRaft {
        &self.raft
    }

    /// Replicates `cmd` and returns the new revision (its log index) once it is committed and
    /// applied; a refused command (conflict, not found, bad JSON) is `StoreError::Rejected`.
    pub async fn write(&self, cmd: Command) -> Result<u64, StoreError> {
        match self.raft.client_write(cmd).await {
            Ok(resp) => resp.data.map_err(StoreError::Rejected),
            Err(e) => match e.forward_to_leader::<BasicNode>() {
                Some(f) => Err(StoreError::NotLeader {
                    leader: f.leader_id,
                }),
                None => Err(StoreError::Raft(e.to_string())),
            },
        }
    }

    /// Waits until this node can serve a linearizable read (it is leader, confirmed by a
    /// quorum, and has applied everything committed before the call).
    async fn linearize(&self) -> Result<(), StoreError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(e) => match e.forward_to_leader::<BasicNode>() {
                Some(f) => Err(StoreError::NotLeader {
                    leader: f.leader_id,
                }),
                None => Err(StoreError::Raft(e.to_string())),
            },
        }
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
        let Self { raft, lease, .. } = self;
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
        Ok(())
    }
}

#[cfg(test)]
mod tests;

//! The Raft type configuration and the commands the config store replicates.
//!
//! Commands carry the resource value as a JSON string (not a `serde_json::Value`) so the log
//! encoding stays independent of the value's shape and a later binary encoding of the log is
//! possible without touching the state machine.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// Type configuration of weft's config store.
    pub TypeConfig:
        D            = Proposal,
        R            = Vec<CommandResult>,
        NodeId       = u64,
        Node         = Member,
        Entry        = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Node id of a control-plane member.
pub type NodeId = u64;

/// How to reach a control-plane member, stored in the Raft membership so every node knows
/// every peer's addresses (to forward API calls and to tell sidecars where to fail over).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the REST API, which also carries the Raft RPCs.
    pub addr: String,
    /// `host:port` of the xDS (gRPC) listener.
    #[serde(default)]
    pub xds_addr: String,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "api={} xds={}", self.addr, self.xds_addr)
    }
}

/// The `Raft` handle specialised for the config store.
pub type ConfigRaft = openraft::Raft<TypeConfig>;

/// A replicated change to the config state.
///
/// `expect_revision` is an optimistic-concurrency precondition: `None` applies unconditionally,
/// `Some(0)` demands that the resource does not exist (create), `Some(r)` demands that its
/// current revision is `r`. Revision 0 is never a write: openraft's first client entry has
/// index ≥ 1 (index 0 holds the initial membership).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create or replace `kind/name` with `value_json`.
    Put {
        kind: String,
        name: String,
        value_json: String,
        expect_revision: Option<u64>,
    },
    /// Remove `kind/name`; its history is kept (a tombstone) so it can be rolled back.
    Delete {
        kind: String,
        name: String,
        expect_revision: Option<u64>,
    },
}

/// One Raft log entry's payload: a single command, or a batch of commands on distinct keys that
/// the proposer (`store::propose`) gathered from concurrent writers so they share one append,
/// one fsync and one replication round. Every command of a batch gets the entry's log index as
/// its revision, like the keys of one etcd transaction. Untagged so entries written before
/// batching (a bare `Command`) still decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Proposal {
    One(Command),
    Batch(Vec<Command>),
}

impl Proposal {
    /// The commands in order.
    pub fn commands(&self) -> &[Command] {
        match self {
            Self::One(c) => std::slice::from_ref(c),
            Self::Batch(v) => v,
        }
    }
}

impl Command {
    /// `(kind, name)` of the resource the command writes.
    pub fn key(&self) -> (&str, &str) {
        match self {
            Self::Put { kind, name, .. } | Self::Delete { kind, name, .. } => (kind, name),
        }
    }

    /// Bytes the command adds to a log entry, roughly (for bounding batches).
    pub fn size_hint(&self) -> usize {
        let (kind, name) = self.key();
        let value = match self {
            Self::Put { value_json, .. } => value_json.len(),
            Self::Delete { .. } => 0,
        };
        kind.len() + name.len() + value + 64
    }
}

/// Why the state machine refused a command. Refusals are committed log entries with a
/// deterministic outcome on every node, never panics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandError {
    /// The precondition did not hold; `actual` is the current revision (0 = absent).
    Conflict {
        kind: String,
        name: String,
        expected: u64,
        actual: u64,
    },
    /// Delete of a resource that does not exist.
    NotFound { kind: String, name: String },
    /// `value_json` is not valid JSON.
    InvalidJson {
        kind: String,
        name: String,
        error: String,
    },
    /// Kind or name is empty or contains '/' (the key separator).
    InvalidKey { kind: String, name: String },
    /// A batch wrote the same key twice (both would get one revision; the proposer never
    /// builds such a batch, so this only guards the log format).
    DuplicateInBatch { kind: String, name: String },
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Conflict {
                kind,
                name,
                expected,
                actual,
            } => {
                write!(
                    f,
                    "{kind}/{name}: expected revision {expected}, current is {actual}"
                )
            }
            Self::NotFound { kind, name } => write!(f, "{kind}/{name} does not exist"),
            Self::InvalidJson { kind, name, error } => {
                write!(f, "{kind}/{name}: invalid JSON: {error}")
            }
            Self::InvalidKey { kind, name } => write!(f, "invalid key {kind:?}/{name:?}"),
            Self::DuplicateInBatch { kind, name } => {
                write!(f, "{kind}/{name} written twice in one batch")
            }
        }
    }
}

impl std::error::Error for CommandError {}

/// What applying one command produced: the new revision (= the entry's log index) or a refusal.
/// An entry yields one result per command; blank and membership entries yield `[Ok(index)]`.
pub type CommandResult = Result<u64, CommandError>;

/// A resource as stored: its JSON value and the revision (log index) that last wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub kind: String,
    pub name: String,
    pub value_json: String,
    pub revision: u64,
}

/// One point in a resource's history: `value_json` is `None` for a delete (tombstone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub revision: u64,
    pub value_json: Option<String>,
}

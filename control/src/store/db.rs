//! The redb file layout shared by the log store and the state machine.
//!
//! One file holds everything so a node's durable state is one path to back up or wipe. Log
//! appends and votes commit with redb's default durability (fsync), which is what makes a Raft
//! acknowledgement mean "on disk"; applying to the state machine does not fsync (see
//! `state.rs`: it is rebuilt from the durable log after a crash).

use openraft::{AnyError, StorageError, StorageIOError};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::types::NodeId;

/// Raft log: index → JSON-encoded `Entry`.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: `vote`, `committed`, `last_purged` → JSON.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// State-machine metadata: `last_applied`, `membership` (JSON).
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
/// The current snapshot: `snapshot_meta` (JSON) and `snapshot_data`. A table of its own because
/// every apply rewrites `last_applied` in `SM_META`, and redb copies the whole leaf a changed key
/// lives in: beside it, the snapshot (every resource and all history) was rewritten per write.
pub(crate) const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
/// Current resources: `kind/name` → JSON `Resource`.
pub(crate) const RESOURCES: TableDefinition<&str, &[u8]> = TableDefinition::new("resources");
/// Every write ever applied: (revision, `kind/name`) → JSON `HistoryRow` (the value, None for a
/// delete, and the key's previous revision). Keyed by revision first so a batch of writes to
/// many keys appends at the table's tail (a few pages) instead of touching one leaf per key:
/// with (`kind/name`, revision) keys a 64-write batch rewrote ~64 pages, 8 KB per write. A
/// key's history is the chain of `prev` links from its current revision (see `state.rs`).
pub(crate) const HISTORY: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("history_by_revision");
/// The layout before `HISTORY`: (`kind/name`, revision) → JSON `Option<String>`; converted on
/// open (see `state::upgrade_history`).
pub(crate) const OLD_HISTORY: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("history");
/// Revision of the delete that removed `kind/name` (the head of a deleted key's history chain;
/// a current resource's head is its own revision).
pub(crate) const DELETED: TableDefinition<&str, u64> = TableDefinition::new("deleted");

pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_LAST_PURGED: &str = "last_purged";
pub(crate) const KEY_LAST_APPLIED: &str = "last_applied";
pub(crate) const KEY_MEMBERSHIP: &str = "membership";
pub(crate) const KEY_SNAPSHOT_META: &str = "snapshot_meta";
pub(crate) const KEY_SNAPSHOT_DATA: &str = "snapshot_data";

/// Opens (or creates) the file and makes sure every table exists, so readers never see
/// `TableDoesNotExist` on a fresh file.
pub(crate) fn open(path: &std::path::Path) -> Result<redb::Database, redb::Error> {
    let db = redb::Database::create(path)?;
    let tx = db.begin_write()?;
    tx.open_table(LOG)?;
    tx.open_table(RAFT_META)?;
    tx.open_table(SM_META)?;
    tx.open_table(SNAPSHOT)?;
    tx.open_table(RESOURCES)?;
    tx.open_table(HISTORY)?;
    tx.open_table(DELETED)?;
    move_snapshot_out_of_sm_meta(&tx)?;
    tx.commit()?;
    Ok(db)
}

/// Files written before the `SNAPSHOT` table kept the snapshot in `SM_META`: move it over (in
/// the same transaction that opens the file, so a crash leaves it in one place or the other).
fn move_snapshot_out_of_sm_meta(tx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let mut meta = tx.open_table(SM_META)?;
    let mut snap = tx.open_table(SNAPSHOT)?;
    for key in [KEY_SNAPSHOT_META, KEY_SNAPSHOT_DATA] {
        if let Some(v) = meta.remove(key)?
            && snap.get(key)?.is_none()
        {
            snap.insert(key, v.value())?;
        }
    }
    Ok(())
}

/// Key of a resource in `RESOURCES` and `HISTORY`. `/` cannot occur in kind or name (checked
/// before apply), so the key is unambiguous.
pub(crate) fn resource_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

pub(crate) fn to_json<T: Serialize>(v: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(v)
}

pub(crate) fn from_json<T: DeserializeOwned>(b: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(b)
}

pub(crate) fn any<E: std::error::Error + 'static>(e: E) -> AnyError {
    AnyError::new(&e)
}

/// Wraps any error as an openraft read error (the subject is refined by callers where useful).
pub(crate) fn read_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::read(any(e)).into()
}

/// Wraps any error as an openraft write error.
pub(crate) fn write_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::write(any(e)).into()
}

/// Reads one JSON value from a `&str`-keyed metadata table.
pub(crate) fn read_meta<T: DeserializeOwned>(
    db: &redb::Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
) -> Result<Option<T>, StorageError<NodeId>> {
    let tx = db.begin_read().map_err(read_err)?;
    let t = tx.open_table(table).map_err(read_err)?;
    match t.get(key).map_err(read_err)? {
        Some(v) => Ok(Some(from_json(v.value()).map_err(read_err)?)),
        None => Ok(None),
    }
}

/// Writes one JSON value to a `&str`-keyed metadata table in its own transaction; `durable`
/// chooses between an fsynced commit and redb's `Durability::None` (persisted by the next
/// durable commit), for values that may be lost in a crash.
pub(crate) fn write_meta<T: Serialize>(
    db: &redb::Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    value: &T,
    durable: bool,
) -> Result<(), StorageError<NodeId>> {
    let bytes = to_json(value).map_err(write_err)?;
    let mut tx = db.begin_write().map_err(write_err)?;
    if !durable {
        tx.set_durability(redb::Durability::None)
            .map_err(write_err)?;
    }
    {
        let mut t = tx.open_table(table).map_err(write_err)?;
        t.insert(key, bytes.as_slice()).map_err(write_err)?;
    }
    tx.commit().map_err(write_err)
}

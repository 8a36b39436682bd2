//! The redb files shared by the log store and the state machine.
//!
//! A node keeps two files in its data dir, like etcd's WAL beside its bbolt backend:
//! - `<name>.log.redb`: the Raft log, the vote and the committed/purged ids. Every append and
//!   vote commits with an fsync, which is what makes a Raft acknowledgement mean "on disk".
//! - `<name>.redb`: the state machine (resources, history, snapshot). Applying does not fsync;
//!   the file is made durable every [`super::state::SYNC_EVERY`] applied entries, with every
//!   snapshot and at shutdown, and after a crash openraft re-applies the rest from the log.
//!
//! Why two files: redb writes every page a transaction dirtied at the next durable commit. In
//! one file, each log append also flushed the pages of the previous apply (17 pages written
//! per append instead of 9 at one writer), on the critical path of every write.

use std::path::{Path, PathBuf};

use openraft::{AnyError, StorageError, StorageIOError};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::types::NodeId;

/// Raft log: index → JSON-encoded `Entry`.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: `vote`, `committed`, `last_purged` → JSON.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// State-machine metadata: `last_applied`, `membership`, `history_revisions` (JSON).
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
/// The `--history-revisions` this node last started with (a node-local setting, not Raft
/// state: kept so a restart with another value can say so).
pub(crate) const KEY_HISTORY_REVISIONS: &str = "history_revisions";

/// Opens (or creates) the state-machine file and makes sure its tables exist, so readers never
/// see `TableDoesNotExist` on a fresh file.
pub(crate) fn open_state(path: &Path) -> Result<redb::Database, redb::Error> {
    let db = redb::Database::create(path)?;
    let tx = db.begin_write()?;
    tx.open_table(SM_META)?;
    tx.open_table(SNAPSHOT)?;
    tx.open_table(RESOURCES)?;
    tx.open_table(HISTORY)?;
    tx.open_table(DELETED)?;
    move_snapshot_out_of_sm_meta(&tx)?;
    tx.commit()?;
    Ok(db)
}

/// The log file that belongs beside the state file at `state_path`.
pub(crate) fn log_path(state_path: &Path) -> PathBuf {
    state_path.with_extension("log.redb")
}

/// Opens the log file beside `state` (at `path`), creating it on first use. A state file from
/// before the split holds the log itself: its log tables are copied into a new file under a
/// temporary name, which is renamed into place only once complete, and then dropped from the
/// state file. A crash at any point leaves the log whole in exactly one authoritative place:
/// the log file once it exists, the state file until then.
pub(crate) fn open_log(state: &redb::Database, path: &Path) -> Result<redb::Database, redb::Error> {
    if !path.exists() {
        refuse_state_without_log(state, path)?;
        let tmp = path.with_extension("redb.partial");
        if tmp.exists() {
            std::fs::remove_file(&tmp)?;
        }
        {
            let log = create_log(&tmp)?;
            copy_log_tables(state, &log)?;
        }
        std::fs::rename(&tmp, path)?;
        // The rename must be durable before the state file forgets its copy.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()?;
    }
    let log = create_log(path)?;
    // Leftovers of the old layout (the rename above happened, the cleanup did not).
    let tx = state.begin_write()?;
    let dropped = tx.delete_table(LOG)? | tx.delete_table(RAFT_META)?;
    if dropped {
        tx.commit()?;
    }
    Ok(log)
}

/// A state file that has applied entries but no Raft metadata, with no log file beside it, lost
/// its log file (a restore that copied one file of two). Starting anyway would make an empty
/// log and forget the vote, which could let the node vote twice in one term.
fn refuse_state_without_log(state: &redb::Database, log_path: &Path) -> Result<(), redb::Error> {
    let tx = state.begin_read()?;
    // An old-layout file always has its vote here, even when snapshots purged the whole log.
    let holds_log = match tx.open_table(RAFT_META) {
        Ok(t) => !t.is_empty()?,
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => return Err(e.into()),
    };
    let applied = tx.open_table(SM_META)?.get(KEY_LAST_APPLIED)?.is_some();
    if applied && !holds_log {
        return Err(redb::Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "the log file {} is missing beside a state file that has applied entries; \
                 restore both files of the data dir together, or remove this node from the \
                 cluster (`weftctl members remove ID`), empty its data dir and let it join again",
                log_path.display()
            ),
        )));
    }
    Ok(())
}

/// The log id stored as JSON under `key` (`None` when absent or stored as `null`).
fn log_id_at(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<openraft::LogId<NodeId>>, redb::Error> {
    let Some(v) = t.get(key)? else { return Ok(None) };
    from_json(v.value()).map_err(|e| redb::Error::Corrupted(format!("{key}: {e}")))
}

/// The `last_applied` of the state file's latest commit.
pub(crate) fn applied(state: &redb::Database) -> Result<Option<openraft::LogId<NodeId>>, redb::Error> {
    log_id_at(&state.begin_read()?.open_table(SM_META)?, KEY_LAST_APPLIED)
}

/// Makes the state file durable: an empty fsynced commit carries every unsynced apply.
pub(crate) fn sync_state(state: &redb::Database) -> Result<(), redb::Error> {
    Ok(state.begin_write()?.commit()?)
}

/// The log starts after its purged prefix, which only a snapshot in the state file covers. A
/// state file applied to less than that (lost and recreated, or an older copy) would leave
/// entries that are in neither file; refuse it, naming both.
pub(crate) fn refuse_state_behind_log(
    state: &redb::Database,
    log: &redb::Database,
    state_path: &Path,
) -> Result<(), redb::Error> {
    let index = |db: &redb::Database, table: TableDefinition<&str, &[u8]>, key: &str| -> Result<u64, redb::Error> {
        let id = log_id_at(&db.begin_read()?.open_table(table)?, key)?;
        Ok(id.map_or(0, |id| id.index))
    };
    let purged = index(log, RAFT_META, KEY_LAST_PURGED)?;
    let applied = index(state, SM_META, KEY_LAST_APPLIED)?;
    if purged > applied {
        return Err(redb::Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the state file {} is applied to index {applied}, but the log beside it is purged \
                 up to {purged}: the entries between are in neither file (a state file lost or \
                 restored apart from its log); restore both files of the data dir together, or \
                 remove this node from the cluster (`weftctl members remove ID`), empty its data \
                 dir and let it join again",
                state_path.display()
            ),
        )));
    }
    Ok(())
}

fn create_log(path: &Path) -> Result<redb::Database, redb::Error> {
    let db = redb::Database::create(path)?;
    let tx = db.begin_write()?;
    tx.open_table(LOG)?;
    tx.open_table(RAFT_META)?;
    tx.commit()?;
    Ok(db)
}

/// Copies the log and Raft metadata rows of an old-layout state file into `log` (one durable
/// transaction; nothing to copy on a new file).
fn copy_log_tables(state: &redb::Database, log: &redb::Database) -> Result<(), redb::Error> {
    let src = state.begin_read()?;
    let tx = log.begin_write()?;
    copy_table(&src, &tx, LOG)?;
    copy_table(&src, &tx, RAFT_META)?;
    Ok(tx.commit()?)
}

pub(crate) fn copy_table<K: redb::Key + 'static>(
    src: &redb::ReadTransaction,
    dst: &redb::WriteTransaction,
    def: TableDefinition<K, &'static [u8]>,
) -> Result<(), redb::Error> {
    let old = match src.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut t = dst.open_table(def)?;
    for row in old.iter()? {
        let (k, v) = row?;
        t.insert(k.value(), v.value())?;
    }
    Ok(())
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

/// Writes one JSON value into a `&str`-keyed metadata table, durably, in a transaction of its
/// own (for settings written outside the apply path).
pub(crate) fn write_meta<T: Serialize>(
    db: &redb::Database,
    table: TableDefinition<&str, &[u8]>,
    key: &str,
    v: &T,
) -> Result<(), StorageError<NodeId>> {
    let bytes = to_json(v).map_err(write_err)?;
    let tx = db.begin_write().map_err(write_err)?;
    tx.open_table(table).map_err(write_err)?.insert(key, bytes.as_slice()).map_err(write_err)?;
    tx.commit().map_err(write_err)
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

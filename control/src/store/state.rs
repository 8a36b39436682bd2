//! `RaftStateMachine` on redb: the config state (resources keyed `kind/name`, each with the
//! revision that last wrote it), per-resource history, `last_applied`, membership, snapshots.
//!
//! Every applied batch is one write transaction that also records `last_applied`, so after a
//! crash the state and the applied index agree and openraft re-applies only what follows.
//! Those transactions are not fsynced one by one (the entries are durable in the log file):
//! the file is synced every [`SYNC_EVERY`] applied entries, with every snapshot (the log is
//! purged only up to a snapshot, so what a crash undoes is always still in the log) and at
//! shutdown.

use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, StorageError,
    StorageIOError, StoredMembership,
};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::db::{
    self, DELETED, HISTORY, KEY_LAST_APPLIED, OLD_HISTORY, KEY_MEMBERSHIP, KEY_SNAPSHOT_DATA, KEY_SNAPSHOT_META,
    RESOURCES, SM_META, SNAPSHOT,
};
use super::types::{
    Command, CommandError, CommandResult, HistoryEntry, Member, NodeId, Resource, TypeConfig,
};

type Membership = StoredMembership<NodeId, Member>;
type Meta = SnapshotMeta<NodeId, Member>;
/// Last applied id, membership and data: everything a snapshot captures.
type FullState = (Option<LogId<NodeId>>, Membership, SnapshotState);

/// The serialized form of a snapshot: the whole config state including history, so a node
/// that installs it can still list history and roll back.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotState {
    pub resources: Vec<Resource>,
    /// (`kind/name`, revision, value or None for a delete).
    pub history: Vec<(String, u64, Option<String>)>,
}

/// What changed since a consumer last asked (see [`StateMachineStore::take_changes`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// `(kind, name)` of every resource written or deleted.
    pub keys: std::collections::BTreeSet<(String, String)>,
    /// Everything may have changed (first call, or a snapshot was installed).
    pub everything: bool,
}

/// Applied entries between two fsyncs of the state file: the most a crash makes a node
/// re-apply from its log on restart. redb also reclaims the pages freed by unsynced commits
/// only at a synced one, so this bounds the file's growth between syncs too.
pub const SYNC_EVERY: u64 = 1024;

/// What the handles of one store share.
#[derive(Default)]
pub(crate) struct Shared {
    /// Locked across each apply's commit, so a reader of (`last_applied`, changes) under the
    /// lock sees a consistent pair.
    pub(crate) changes: std::sync::Mutex<Changes>,
    /// Entries applied since the last fsynced commit.
    pub(crate) unsynced: AtomicU64,
    /// When this node began receiving a snapshot it has not installed yet: the log store
    /// waits for that install before it purges (see `LogStore::purge`).
    pub(crate) receiving: std::sync::Mutex<Option<std::time::Instant>>,
    /// How far the log file is durable, set by the log's writer; apply waits for it.
    pub(crate) durable: tokio::sync::watch::Sender<super::log_writer::Durable>,
    /// History rows kept: revisions older than the applied index minus this are compacted
    /// (see [`compact_history`]); 0 keeps everything.
    pub(crate) history_revisions: AtomicU64,
}

impl Shared {
    pub(crate) fn new(changes: Changes) -> Self {
        Self {
            changes: std::sync::Mutex::new(changes),
            history_revisions: AtomicU64::new(DEFAULT_HISTORY_REVISIONS),
            ..Default::default()
        }
    }

    /// Whether a snapshot began arriving and is not installed yet (however long ago: a large
    /// snapshot on a slow link can take longer to arrive than the purge waits for its install).
    pub(crate) fn receiving(&self) -> bool {
        self.receiving.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

/// State-machine handle; clones share the same file (the store keeps one for reads).
#[derive(Clone)]
pub struct StateMachineStore {
    db: Arc<redb::Database>,
    /// Shared by every handle of one store (and its log store).
    shared: Arc<Shared>,
    /// Held by every copy openraft owns, so `Node::shutdown` can wait until they are gone.
    _lease: Option<Arc<()>>,
}

fn sm_read<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::read_state_machine(db::any(e)).into()
}

fn sm_write<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(db::any(e)).into()
}

impl StateMachineStore {
    pub(crate) fn new(
        db: Arc<redb::Database>,
        shared: Arc<Shared>,
        lease: Option<Arc<()>>,
    ) -> Self {
        Self { db, shared, _lease: lease }
    }

    /// `--history-revisions` of the store this handle belongs to.
    pub(crate) fn history_revisions(&self) -> u64 {
        self.shared.history_revisions.load(Ordering::Relaxed)
    }

    /// Makes every applied entry durable (an empty fsynced commit carries the unsynced ones).
    pub fn sync(&self) -> Result<(), StorageError<NodeId>> {
        db::sync_state(&self.db).map_err(sm_write)?;
        self.shared.unsynced.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// The applied index and every key changed up to it since the previous call (the first
    /// call says "everything"). A consumer that mirrors the state reads these keys again
    /// instead of the whole state: values read afterwards are at least this new.
    pub fn take_changes(&self) -> Result<(u64, Changes), StorageError<NodeId>> {
        let mut changes = self.shared.changes.lock().unwrap_or_else(|e| e.into_inner());
        let applied = self.last_applied_index()?;
        Ok((applied, std::mem::take(&mut *changes)))
    }

    /// The current value of `kind/name`, if it exists.
    pub fn get(&self, kind: &str, name: &str) -> Result<Option<Resource>, StorageError<NodeId>> {
        let tx = self.db.begin_read().map_err(sm_read)?;
        let t = tx.open_table(RESOURCES).map_err(sm_read)?;
        match t
            .get(db::resource_key(kind, name).as_str())
            .map_err(sm_read)?
        {
            Some(v) => Ok(Some(db::from_json(v.value()).map_err(sm_read)?)),
            None => Ok(None),
        }
    }

    /// Every resource of `kind`, ordered by name.
    pub fn list(&self, kind: &str) -> Result<Vec<Resource>, StorageError<NodeId>> {
        self.view()?.list(kind)
    }

    /// A consistent cut of the state: every read through it sees the same applied revision
    /// (each apply commits its resources and `last_applied` in one transaction), so a list
    /// answers with the revision its items are at, and reads of several kinds agree.
    pub fn view(&self) -> Result<View, StorageError<NodeId>> {
        Ok(View(self.db.begin_read().map_err(sm_read)?))
    }

    /// Every recorded revision of `kind/name`, oldest first (deletes appear as `None`).
    pub fn history(
        &self,
        kind: &str,
        name: &str,
    ) -> Result<Vec<HistoryEntry>, StorageError<NodeId>> {
        let key = db::resource_key(kind, name);
        let tx = self.db.begin_read().map_err(sm_read)?;
        let head = match tx.open_table(RESOURCES).map_err(sm_read)?.get(key.as_str()).map_err(sm_read)? {
            Some(v) => db::from_json::<Resource>(v.value()).map_err(sm_read)?.revision,
            None => match tx.open_table(DELETED).map_err(sm_read)?.get(key.as_str()).map_err(sm_read)? {
                Some(rev) => rev.value(),
                None => return Ok(Vec::new()),
            },
        };
        let t = tx.open_table(HISTORY).map_err(sm_read)?;
        let mut out = Vec::new();
        let mut revision = head;
        while revision != 0 {
            let Some(v) = t.get((revision, key.as_str())).map_err(sm_read)? else {
                break; // compacted away, or written before history was kept
            };
            let row: HistoryRow = db::from_json(v.value()).map_err(sm_read)?;
            out.push(HistoryEntry { revision, value_json: row.value });
            revision = row.prev;
        }
        out.reverse();
        Ok(out)
    }

    /// Index of the last applied log entry (0 before anything was applied).
    pub fn last_applied_index(&self) -> Result<u64, StorageError<NodeId>> {
        self.view()?.revision()
    }

    /// Reads the whole state in one read transaction (a consistent cut).
    fn read_state(&self) -> Result<FullState, StorageError<NodeId>> {
        let tx = self.db.begin_read().map_err(sm_read)?;
        let meta = tx.open_table(SM_META).map_err(sm_read)?;
        let last_applied: Option<LogId<NodeId>> =
            match meta.get(KEY_LAST_APPLIED).map_err(sm_read)? {
                Some(v) => db::from_json(v.value()).map_err(sm_read)?,
                None => None,
            };
        let membership: Membership = match meta.get(KEY_MEMBERSHIP).map_err(sm_read)? {
            Some(v) => db::from_json(v.value()).map_err(sm_read)?,
            None => Membership::default(),
        };
        let mut state = SnapshotState::default();
        let res = tx.open_table(RESOURCES).map_err(sm_read)?;
        for item in res.iter().map_err(sm_read)? {
            let (_k, v) = item.map_err(sm_read)?;
            state
                .resources
                .push(db::from_json(v.value()).map_err(sm_read)?);
        }
        let hist = tx.open_table(HISTORY).map_err(sm_read)?;
        for item in hist.iter().map_err(sm_read)? {
            let (k, v) = item.map_err(sm_read)?;
            let (rev, key) = k.value();
            let row: HistoryRow = db::from_json(v.value()).map_err(sm_read)?;
            state.history.push((key.to_string(), rev, row.value));
        }
        Ok((last_applied, membership, state))
    }
}

/// Applies one command inside `tx`. Refusals return `Ok(Err(..))`: they are results, and the
/// transaction stays usable for the rest of the batch.
fn apply_command(
    tx: &WriteTransaction,
    index: u64,
    cmd: &Command,
) -> Result<CommandResult, StorageError<NodeId>> {
    let (kind, name, expect) = match cmd {
        Command::Put {
            kind,
            name,
            expect_revision,
            ..
        } => (kind, name, *expect_revision),
        Command::Delete {
            kind,
            name,
            expect_revision,
        } => (kind, name, *expect_revision),
    };
    let bad = |s: &str| s.is_empty() || s.contains('/');
    if bad(kind) || bad(name) {
        return Ok(Err(CommandError::InvalidKey {
            kind: kind.clone(),
            name: name.clone(),
        }));
    }
    let key = db::resource_key(kind, name);
    let mut res = tx.open_table(RESOURCES).map_err(sm_write)?;
    let current: Option<Resource> = match res.get(key.as_str()).map_err(sm_write)? {
        Some(v) => Some(db::from_json(v.value()).map_err(sm_write)?),
        None => None,
    };
    let actual = current.as_ref().map(|r| r.revision).unwrap_or(0);
    if let Some(expected) = expect
        && expected != actual
    {
        return Ok(Err(CommandError::Conflict {
            kind: kind.clone(),
            name: name.clone(),
            expected,
            actual,
        }));
    }
    let mut hist = tx.open_table(HISTORY).map_err(sm_write)?;
    let mut deleted = tx.open_table(DELETED).map_err(sm_write)?;
    // The key's previous revision: its current one, or the delete that removed it.
    let prev = match &current {
        Some(c) => c.revision,
        None => deleted.get(key.as_str()).map_err(sm_write)?.map(|r| r.value()).unwrap_or(0),
    };
    match cmd {
        Command::Put { value_json, .. } => {
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(value_json) {
                return Ok(Err(CommandError::InvalidJson {
                    kind: kind.clone(),
                    name: name.clone(),
                    error: e.to_string(),
                }));
            }
            if current.as_ref().is_some_and(|c| &c.value_json == value_json) {
                // Idempotent: the same value again is no change (no new revision, no
                // history entry), so re-applying a config file is free and quiet.
                return Ok(Ok(actual));
            }
            let r = Resource {
                kind: kind.clone(),
                name: name.clone(),
                value_json: value_json.clone(),
                revision: index,
            };
            let bytes = db::to_json(&r).map_err(sm_write)?;
            res.insert(key.as_str(), bytes.as_slice())
                .map_err(sm_write)?;
            let hb = db::to_json(&HistoryRow { value: Some(value_json.clone()), prev }).map_err(sm_write)?;
            hist.insert((index, key.as_str()), hb.as_slice())
                .map_err(sm_write)?;
            if current.is_none() && prev != 0 {
                deleted.remove(key.as_str()).map_err(sm_write)?;
            }
        }
        Command::Delete { .. } => {
            if current.is_none() {
                return Ok(Err(CommandError::NotFound {
                    kind: kind.clone(),
                    name: name.clone(),
                }));
            }
            res.remove(key.as_str()).map_err(sm_write)?;
            let hb = db::to_json(&HistoryRow { value: None, prev }).map_err(sm_write)?;
            hist.insert((index, key.as_str()), hb.as_slice())
                .map_err(sm_write)?;
            deleted.insert(key.as_str(), index).map_err(sm_write)?;
        }
    }
    Ok(Ok(index))
}

/// Default of `--history-revisions`: how many revisions back the history reaches.
pub const DEFAULT_HISTORY_REVISIONS: u64 = 100_000;

/// Whether applying entry `index` ends with a compaction, and below which revision (the last
/// `keep` revisions stay): at every multiple of `keep / 10` (at most 1,000), so each pass scans
/// few rows. Decided per entry, after that entry and before the next, so every node compacts
/// the same state at the same index however its entries were batched.
fn compaction_at(index: u64, keep: u64) -> Option<u64> {
    if keep == 0 || index < keep {
        return None;
    }
    let every = (keep / 10).clamp(1, 1_000);
    index.is_multiple_of(every).then_some(index + 1 - keep)
}

/// Drops the history rows of revisions below `cutoff`, as etcd's compaction does, except each
/// existing resource's current revision (its history then starts there, and `history` stops at
/// the first missing row). A delete older than `cutoff` goes with its tombstone: the name's
/// history is gone and a new resource of that name starts afresh. Returns the rows dropped.
/// Runs inside an apply's transaction, right after the entry [`compaction_at`] names.
fn compact_history(tx: &WriteTransaction, cutoff: u64) -> Result<usize, redb::Error> {
    let res = tx.open_table(RESOURCES)?;
    let mut hist = tx.open_table(HISTORY)?;
    let mut deleted = tx.open_table(DELETED)?;
    let mut rows = Vec::new();
    let mut tombstones = Vec::new();
    for item in hist.range((0u64, "")..(cutoff, ""))? {
        let (k, _) = item?;
        let (revision, key) = k.value();
        let current = match res.get(key)? {
            Some(v) => db::from_json::<Resource>(v.value()).map_err(|e| redb::Error::Corrupted(e.to_string()))?.revision,
            None => 0,
        };
        if current == revision {
            continue;
        }
        if deleted.get(key)?.map(|d| d.value()) == Some(revision) {
            tombstones.push(key.to_string());
        }
        rows.push((revision, key.to_string()));
    }
    for (revision, key) in &rows {
        hist.remove((*revision, key.as_str()))?;
    }
    for key in tombstones {
        deleted.remove(key.as_str())?;
    }
    Ok(rows.len())
}

#[cfg(test)]
#[test]
fn compaction_points_depend_on_the_index_alone() {
    assert_eq!(compaction_at(100, 0), None, "0 keeps everything");
    assert_eq!(compaction_at(49, 50), None, "not before there are more than keep revisions");
    assert_eq!(compaction_at(50, 50), Some(1));
    assert_eq!(compaction_at(51, 50), None);
    assert_eq!(compaction_at(55, 50), Some(6), "every keep/10, keeping exactly keep revisions");
    assert_eq!(compaction_at(200_000, 100_000), Some(100_001));
    assert_eq!(compaction_at(101_000, 100_000), Some(1_001), "at most every 1,000 entries");
}

/// One write in `HISTORY`: the value (None for a delete) and the key's previous revision
/// (0 = none), which chains a key's history without a per-key index.
#[derive(Debug, Serialize, Deserialize)]
struct HistoryRow {
    #[serde(rename = "v")]
    value: Option<String>,
    #[serde(rename = "p")]
    prev: u64,
}

/// Replaces `HISTORY` and `DELETED` with `rows` (`kind/name`, revision, value), linking each
/// key's revisions in order; a key whose newest row is a delete gets a `DELETED` head.
fn write_history(tx: &WriteTransaction, rows: &[(String, u64, Option<String>)]) -> Result<(), redb::Error> {
    let mut by_key: std::collections::BTreeMap<&str, Vec<(u64, &Option<String>)>> = Default::default();
    for (key, rev, value) in rows {
        by_key.entry(key.as_str()).or_default().push((*rev, value));
    }
    let mut hist = tx.open_table(HISTORY)?;
    hist.retain(|_, _| false)?;
    let mut deleted = tx.open_table(DELETED)?;
    deleted.retain(|_, _| false)?;
    for (key, mut revs) in by_key {
        revs.sort_by_key(|(rev, _)| *rev);
        let mut prev = 0;
        for (rev, value) in &revs {
            let row = HistoryRow { value: (*value).clone(), prev };
            let bytes = serde_json::to_vec(&row).map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            hist.insert((*rev, key), bytes.as_slice())?;
            prev = *rev;
        }
        if let Some((rev, None)) = revs.last() {
            deleted.insert(key, *rev)?;
        }
    }
    Ok(())
}

/// Converts a file's history from the layout before `HISTORY` (keyed by `kind/name` first),
/// in one transaction; a no-op when there is nothing to convert.
pub(crate) fn upgrade_history(db: &redb::Database) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    let rows = {
        let old = tx.open_table(OLD_HISTORY)?;
        let mut rows = Vec::new();
        for item in old.iter()? {
            let (k, v) = item?;
            let (key, rev) = k.value();
            let value: Option<String> =
                serde_json::from_slice(v.value()).map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            rows.push((key.to_string(), rev, value));
        }
        rows
    };
    if rows.is_empty() {
        return Ok(());
    }
    write_history(&tx, &rows)?;
    tx.delete_table(OLD_HISTORY)?;
    tx.commit()?;
    Ok(())
}

fn put_meta<T: Serialize>(
    tx: &WriteTransaction,
    key: &str,
    v: &T,
) -> Result<(), StorageError<NodeId>> {
    let bytes = db::to_json(v).map_err(sm_write)?;
    let mut t = tx.open_table(SM_META).map_err(sm_write)?;
    t.insert(key, bytes.as_slice()).map_err(sm_write)?;
    Ok(())
}

fn put_snapshot(
    tx: &WriteTransaction,
    meta: &Meta,
    data: &[u8],
) -> Result<(), StorageError<NodeId>> {
    let meta = db::to_json(meta).map_err(sm_write)?;
    let mut t = tx.open_table(SNAPSHOT).map_err(sm_write)?;
    t.insert(KEY_SNAPSHOT_META, meta.as_slice()).map_err(sm_write)?;
    t.insert(KEY_SNAPSHOT_DATA, data).map_err(sm_write)?;
    Ok(())
}

/// See [`StateMachineStore::view`].
pub struct View(redb::ReadTransaction);

impl View {
    /// The log index of the last applied entry as of this view (0 before any).
    pub fn revision(&self) -> Result<u64, StorageError<NodeId>> {
        let meta = self.0.open_table(SM_META).map_err(sm_read)?;
        let last: Option<LogId<NodeId>> = match meta.get(KEY_LAST_APPLIED).map_err(sm_read)? {
            Some(v) => db::from_json(v.value()).map_err(sm_read)?,
            None => None,
        };
        Ok(last.map(|l| l.index).unwrap_or(0))
    }

    /// Every resource of `kind` as of this view, ordered by name.
    pub fn list(&self, kind: &str) -> Result<Vec<Resource>, StorageError<NodeId>> {
        let t = self.0.open_table(RESOURCES).map_err(sm_read)?;
        // Keys are `kind/name`; '0' is the byte after '/', so this range is exactly one kind.
        let lo = format!("{kind}/");
        let hi = format!("{kind}0");
        let mut out = Vec::new();
        for item in t.range::<&str>(lo.as_str()..hi.as_str()).map_err(sm_read)? {
            let (_k, v) = item.map_err(sm_read)?;
            out.push(db::from_json(v.value()).map_err(sm_read)?);
        }
        Ok(out)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (last_applied, membership, state) = self.read_state()?;
        let data = serde_json::to_vec(&state)
            .map_err(|e| StorageIOError::write_snapshot(None, db::any(e)))?;
        // A unique id per build: openraft compares ids to tell snapshots apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{nanos}", l.leader_id, l.index),
            None => format!("none-{nanos}"),
        };
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        self.keep_snapshot(meta, data)
    }
}

impl StateMachineStore {
    /// Waits until the log file holds entry `index` durably. Only a leader ever waits: the
    /// followers' acknowledgements can commit an entry before the leader's own fsync of it
    /// (which now runs beside replication), and a state that got ahead of the durable log
    /// could, after a crash, hold entries the log no longer has. Followers apply only entries
    /// they have flushed.
    async fn wait_durable(&self, index: u64) -> Result<(), StorageError<NodeId>> {
        let mut rx = self.shared.durable.subscribe();
        // An entry past `submitted` was never appended here (openraft's storage tests apply
        // entries directly); there is nothing to wait for.
        let done = |d: &super::log_writer::Durable| d.end >= index.min(d.submitted);
        let d = *rx.wait_for(|d| d.failed || done(d)).await.map_err(sm_write)?;
        if !done(&d) {
            return Err(sm_write(std::io::Error::other(format!(
                "entry {index} cannot become durable: the log writer has failed"
            ))));
        }
        Ok(())
    }

    /// Stores a freshly built snapshot as the current one, unless a newer one is already
    /// there (then that one is returned).
    pub(crate) fn keep_snapshot(&self, meta: Meta, data: Vec<u8>) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // Keep the snapshot so it survives a restart and can be sent to lagging followers.
        // openraft builds snapshots in a task of their own, concurrently with the state
        // machine: a newer snapshot may have been installed since `read_state`. Decide in the
        // write transaction (redb serializes them), and never replace a snapshot with an
        // older one.
        let tx = self.db.begin_write().map_err(sm_write)?;
        let stored = {
            let t = tx.open_table(SNAPSHOT).map_err(sm_write)?;
            let meta: Option<Meta> = match t.get(KEY_SNAPSHOT_META).map_err(sm_write)? {
                Some(v) => db::from_json(v.value()).map_err(sm_write)?,
                None => None,
            };
            let data = t.get(KEY_SNAPSHOT_DATA).map_err(sm_write)?.map(|v| v.value().to_vec());
            meta.zip(data)
        };
        if let Some((stored_meta, stored_data)) = stored
            && stored_meta.last_log_id >= meta.last_log_id
        {
            drop(tx);
            return Ok(Snapshot {
                meta: stored_meta,
                snapshot: Box::new(Cursor::new(stored_data)),
            });
        }
        put_snapshot(&tx, &meta, &data)?;
        tx.commit().map_err(sm_write)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let last: Option<Option<LogId<NodeId>>> =
            db::read_meta(&self.db, SM_META, KEY_LAST_APPLIED)?;
        let membership: Option<Membership> = db::read_meta(&self.db, SM_META, KEY_MEMBERSHIP)?;
        Ok((last.flatten(), membership.unwrap_or_default()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<CommandResult>>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let keep = self.shared.history_revisions.load(Ordering::Relaxed);
        if let Some(last) = entries.last() {
            self.wait_durable(last.log_id.index).await?;
        }
        let mut tx = self.db.begin_write().map_err(sm_write)?;
        // Applying needs no fsync of its own: the entries are already durable in the log, and
        // `last_applied` commits in this same transaction, so after a crash the state and
        // `last_applied` roll back together and openraft re-applies from the log. Every
        // `SYNC_EVERY` entries one apply is fsynced, which also persists the ones before it.
        let unsynced = self.shared.unsynced.fetch_add(entries.len() as u64, Ordering::Relaxed) + entries.len() as u64;
        let sync = unsynced >= SYNC_EVERY;
        if !sync {
            tx.set_durability(redb::Durability::None).map_err(sm_write)?;
        }
        let mut out = Vec::new();
        let mut last = None;
        let mut membership = None;
        let mut touched = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            last = Some(entry.log_id);
            match &entry.payload {
                EntryPayload::Blank => out.push(vec![Ok(index)]),
                EntryPayload::Normal(proposal) => {
                    let mut results = Vec::with_capacity(proposal.commands().len());
                    let mut seen = std::collections::HashSet::new();
                    for cmd in proposal.commands() {
                        let (kind, name) = cmd.key();
                        let result = if seen.insert((kind, name)) {
                            apply_command(&tx, index, cmd)?
                        } else {
                            Err(CommandError::DuplicateInBatch { kind: kind.into(), name: name.into() })
                        };
                        if result.is_ok() {
                            touched.push((kind.to_string(), name.to_string()));
                        }
                        results.push(result);
                    }
                    out.push(results);
                }
                EntryPayload::Membership(m) => {
                    membership = Some(Membership::new(Some(entry.log_id), m.clone()));
                    out.push(vec![Ok(index)]);
                }
            }
            if let Some(cutoff) = compaction_at(index, keep) {
                let dropped = compact_history(&tx, cutoff).map_err(sm_write)?;
                tracing::debug!(cutoff, dropped, "history compacted");
            }
        }
        if let Some(l) = last {
            put_meta(&tx, KEY_LAST_APPLIED, &Some(l))?;
        }
        if let Some(m) = membership {
            put_meta(&tx, KEY_MEMBERSHIP, &m)?;
        }
        let mut changes = self.shared.changes.lock().unwrap_or_else(|e| e.into_inner());
        tx.commit().map_err(sm_write)?;
        if sync {
            self.shared.unsynced.store(0, Ordering::Relaxed);
        }
        changes.keys.extend(touched);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        *self.shared.receiving.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let state: SnapshotState = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), db::any(e)))?;
        // Replace the whole state in one transaction: a crash leaves either the old or the new.
        let tx = self.db.begin_write().map_err(sm_write)?;
        {
            let mut res = tx.open_table(RESOURCES).map_err(sm_write)?;
            res.retain(|_, _| false).map_err(sm_write)?;
            for r in &state.resources {
                let bytes = db::to_json(r).map_err(sm_write)?;
                res.insert(
                    db::resource_key(&r.kind, &r.name).as_str(),
                    bytes.as_slice(),
                )
                .map_err(sm_write)?;
            }
        }
        write_history(&tx, &state.history).map_err(sm_write)?;
        put_meta(&tx, KEY_LAST_APPLIED, &meta.last_log_id)?;
        put_meta(&tx, KEY_MEMBERSHIP, &meta.last_membership)?;
        put_snapshot(&tx, meta, &data)?;
        let mut changes = self.shared.changes.lock().unwrap_or_else(|e| e.into_inner());
        tx.commit().map_err(sm_write)?;
        changes.everything = true;
        *self.shared.receiving.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        // Meta and data from one read transaction, so they always belong together.
        let tx = self.db.begin_read().map_err(sm_read)?;
        let t = tx.open_table(SNAPSHOT).map_err(sm_read)?;
        let meta: Meta = match t.get(KEY_SNAPSHOT_META).map_err(sm_read)? {
            Some(v) => db::from_json(v.value()).map_err(sm_read)?,
            None => return Ok(None),
        };
        let data = match t.get(KEY_SNAPSHOT_DATA).map_err(sm_read)? {
            Some(v) => v.value().to_vec(),
            None => return Ok(None),
        };
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

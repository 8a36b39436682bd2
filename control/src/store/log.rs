//! `RaftLogStorage` on redb: the log, the vote, and the committed/purged ids.
//!
//! Every write goes through one ordered writer thread (`log_writer`), which groups queued
//! appends into one fsynced redb transaction. `append` returns as soon as the entries are
//! queued and readable (from the in-memory tail), and tells openraft they are durable through
//! the callback once their transaction has committed. Since the patched openraft replicates a
//! leader's entries before its own flush (docs/openraft-leader-append.md), the leader's fsync
//! overlaps the round trip to the followers and their fsyncs, and appends submitted while one
//! is being flushed share the next transaction. Followers still wait for each flush before
//! they answer. Batching also happens above openraft (`propose`): one entry per batch of writes.
//!
//! A redb commit costs far more CPU than its fsync on a fast disk, so the store keeps their
//! number down: the committed id (a restart hint openraft may lose) is kept in memory and
//! written by the next append's transaction rather than in one of its own.
//!
//! A node that led before a restart does not resume leadership under its old vote
//! (`read_vote`): followers may hold entries of that term which never reached its disk, and
//! a resumed leader would give other entries the same log ids.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::db::{self, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, RAFT_META};
use super::log_writer::{Append, Committed, Tail, Writer};
use super::state::Shared;
use super::types::{NodeId, TypeConfig};

/// The longest a purge waits for a snapshot being installed to reach the state file.
const INSTALL_WAIT: Duration = Duration::from_secs(30);

/// Log store handle; cheap to clone (the reader openraft asks for is a clone).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<redb::Database>,
    /// The state-machine file and what its handles share, looked at before a purge.
    state: Arc<redb::Database>,
    shared: Arc<Shared>,
    committed: Arc<Mutex<Committed>>,
    /// Appended entries not yet durable; the writer removes them once they are.
    tail: Tail,
    writer: Writer,
    /// This node's id, when known: its own committed vote is not resumed after a restart.
    node_id: Option<NodeId>,
    /// Held by every copy openraft owns, so `Node::shutdown` can wait until they are gone.
    _lease: Option<Arc<()>>,
}

impl LogStore {
    pub(crate) fn new(
        db: Arc<redb::Database>,
        state: Arc<redb::Database>,
        shared: Arc<Shared>,
        node_id: Option<NodeId>,
        lease: Option<Arc<()>>,
    ) -> Self {
        let committed: Arc<Mutex<Committed>> = Arc::default();
        let tail: Tail = Arc::default();
        let durable_end = last_log_id(&db)
            .map(|l| l.map_or(0, |l| l.index))
            .map_err(|e| e.to_string());
        let writer = Writer::start(db.clone(), tail.clone(), committed.clone(), shared.clone(), durable_end, lease.clone());
        Self { db, state, shared, committed, tail, writer, node_id, _lease: lease }
    }

    fn last_purged(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        db::read_meta(&self.db, RAFT_META, KEY_LAST_PURGED)
    }

    /// The committed id to write with the next transaction, if the file lacks it.
    fn committed_to_save(&self) -> Option<Option<LogId<NodeId>>> {
        let c = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        c.unsaved.then_some(c.id)
    }

    /// Runs a write after every queued append and waits for it.
    async fn barrier(
        &self,
        run: impl FnOnce(&redb::Database) -> Result<(), redb::Error> + Send + 'static,
        lower_end_to: Option<u64>,
    ) -> Result<(), StorageError<NodeId>> {
        self.writer
            .job(Box::new(run), lower_end_to)
            .await
            .map_err(|e| StorageIOError::write_logs(openraft::AnyError::error(e)).into())
    }
}

/// The last log id in the file: its last entry, else (all purged) the purged id.
fn last_log_id(db: &redb::Database) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
    let last = {
        let tx = db.begin_read().map_err(db::read_err)?;
        let t = tx.open_table(LOG).map_err(db::read_err)?;
        match t.last().map_err(db::read_err)? {
            Some((_k, v)) => {
                let e: Entry<TypeConfig> = db::from_json(v.value()).map_err(db::read_err)?;
                Some(e.log_id)
            }
            None => None,
        }
    };
    match last {
        Some(l) => Ok(Some(l)),
        None => db::read_meta(db, RAFT_META, KEY_LAST_PURGED),
    }
}

fn bound(b: Bound<&u64>) -> Bound<u64> {
    match b {
        Bound::Included(s) => Bound::Included(*s),
        Bound::Excluded(s) => Bound::Excluded(*s),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Most bytes of log entries one AppendEntries carries (at least one entry always goes).
/// openraft sends up to 300 entries per request, and entries hold up to 1 MiB (a batch) or a
/// 4 MiB command: unbounded, a lagging follower's catch-up request could pass the 64 MiB body
/// limit of `/raft/append`, be refused, and be resent the same way for good.
pub const MAX_APPEND_BYTES: usize = 4 << 20;

/// The rough size of an entry not yet in the file (its row is serialized by the writer).
fn entry_size(e: &Entry<TypeConfig>) -> usize {
    match &e.payload {
        EntryPayload::Normal(p) => p.commands().iter().map(|c| c.size_hint()).sum(),
        _ => 64,
    }
}

impl LogStore {
    /// Entries of `start..end` in order, from the tail and then the file, stopping (after at
    /// least one) once `budget` bytes are passed.
    fn read_entries(&self, start: Bound<u64>, end: Bound<u64>, budget: usize) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let rerr = |e| -> StorageError<NodeId> { StorageIOError::read_logs(e).into() };
        // The tail first, then the file: the writer drops an entry from the tail only after
        // its commit, so an entry missing from this copy of the tail is in the file by the
        // time the read transaction below begins.
        let pending: std::collections::BTreeMap<u64, Entry<TypeConfig>> = {
            let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            tail.range((start, end)).map(|(i, e)| (*i, e.clone())).collect()
        };
        let file_end = match pending.first_key_value() {
            Some((first, _)) => Bound::Excluded(*first),
            None => end,
        };
        let mut out = Vec::new();
        let mut bytes = 0usize;
        if !matches!((start, file_end), (Bound::Included(s), Bound::Excluded(e)) if s >= e) {
            let tx = self.db.begin_read().map_err(|e| rerr(db::any(e)))?;
            let t = tx.open_table(LOG).map_err(|e| rerr(db::any(e)))?;
            for item in t.range::<u64>((start, file_end)).map_err(|e| rerr(db::any(e)))? {
                if bytes > budget {
                    return Ok(out);
                }
                let (_k, v) = item.map_err(|e| rerr(db::any(e)))?;
                bytes += v.value().len();
                out.push(db::from_json(v.value()).map_err(|e| rerr(db::any(e)))?);
            }
        }
        for entry in pending.into_values() {
            if bytes > budget {
                break;
            }
            bytes += entry_size(&entry);
            out.push(entry);
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        self.read_entries(bound(range.start_bound()), bound(range.end_bound()), usize::MAX)
    }

    /// What replication reads for one AppendEntries: bounded by [`MAX_APPEND_BYTES`].
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        self.read_entries(Bound::Included(start), Bound::Excluded(end), MAX_APPEND_BYTES)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id = self.last_purged()?;
        let pending = self.tail.lock().unwrap_or_else(|e| e.into_inner()).last_key_value().map(|(_, e)| e.log_id);
        let last_log_id = match pending {
            Some(l) => Some(l),
            None => last_log_id(&self.db)?,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        // Durable: a vote forgotten in a crash could let this node vote twice in one term.
        // A barrier like every log write, so it cannot overtake a queued append.
        let bytes = db::to_json(vote).map_err(db::write_err)?;
        self.barrier(move |db| put_meta(db, KEY_VOTE, &bytes), None).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        let vote: Option<Vote<NodeId>> = db::read_meta(&self.db, RAFT_META, KEY_VOTE)?;
        // A leader appends its entries without waiting for its own fsync, so followers may
        // hold entries of its term that a crash took from its disk. Resuming leadership
        // under the same vote would hand those log ids to other entries, and the followers
        // would take them as already present. So a node's own committed vote comes back
        // uncommitted: the node stands for election again, in a higher term, and wins only
        // with a log as complete as a majority's.
        Ok(vote.map(|v| match self.node_id {
            Some(id) if v.is_committed() && v.leader_id().voted_for() == Some(id) => Vote::new(v.leader_id().term, id),
            _ => v,
        }))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // The committed id is a hint that speeds up restart (openraft re-applies up to it); it
        // may be lost in a crash, so it rides on the next append or purge instead of paying a
        // transaction per commit round.
        let mut c = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        c.id = committed;
        c.unsaved = true;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        if let Some(id) = self.committed.lock().unwrap_or_else(|e| e.into_inner()).id {
            return Ok(Some(id));
        }
        Ok(db::read_meta::<Option<LogId<NodeId>>>(&self.db, RAFT_META, KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let werr = |e| -> StorageError<NodeId> { StorageIOError::write_logs(e).into() };
        let mut rows = Vec::new();
        let mut ids = Vec::new();
        let mut readable = Vec::new();
        for entry in entries {
            rows.push((entry.log_id.index, db::to_json(&entry).map_err(|e| werr(db::any(e)))?));
            ids.push(entry.log_id);
            readable.push(entry);
        }
        let committed = match self.committed_to_save() {
            Some(c) => Some((c, db::to_json(&c).map_err(|e| werr(db::any(e)))?)),
            None => None,
        };
        // Readable before this returns (openraft's storage contract), durable when the
        // callback fires.
        if let Some(last) = ids.last().map(|l| l.index) {
            let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            for entry in readable {
                tail.insert(entry.log_id.index, entry);
            }
            self.shared.durable.send_if_modified(|d| {
                d.submitted = d.submitted.max(last);
                false
            });
        }
        self.writer
            .append(Append { rows, ids, committed, callback })
            .map_err(|e| werr(openraft::AnyError::error(e)))
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let since = log_id.index;
        let run = move |db: &redb::Database| -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(LOG)?.retain_in(since.., |_, _| false)?;
            tx.commit()?;
            Ok(())
        };
        self.barrier(run, Some(since.saturating_sub(1))).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let werr = |e| -> StorageError<NodeId> { StorageIOError::write_logs(e).into() };
        // Purge only what the state file holds durably. A follower sent a snapshot is told to
        // purge up to it as soon as the install is queued (openraft 0.9's
        // `install_full_snapshot`), while its state machine may not have written it yet: a
        // crash in between would leave entries in neither file. So wait for that install
        // (bounded from now: a transfer abandoned half-way never installs; only a purge past
        // what is applied waits at all, which only a snapshot install can make true), then
        // fsync the state file.
        let deadline = tokio::time::Instant::now() + INSTALL_WAIT;
        while self.shared.receiving()
            && db::applied(&self.state).map_err(|e| werr(db::any(e)))?.is_none_or(|a| a.index < log_id.index)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        db::sync_state(&self.state).map_err(|e| werr(db::any(e)))?;
        let bytes = db::to_json(&log_id).map_err(|e| werr(db::any(e)))?;
        // The purged id and the deletion commit together, so a crash cannot leave a gap.
        let run = move |db: &redb::Database| -> Result<(), redb::Error> {
            let tx = db.begin_write()?;
            tx.open_table(RAFT_META)?.insert(KEY_LAST_PURGED, bytes.as_slice())?;
            tx.open_table(LOG)?.retain_in(..=log_id.index, |_, _| false)?;
            tx.commit()?;
            Ok(())
        };
        self.barrier(run, None).await
    }
}

/// Writes one metadata value in its own fsynced transaction (run by the writer).
fn put_meta(db: &redb::Database, key: &str, bytes: &[u8]) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    tx.open_table(RAFT_META)?.insert(key, bytes)?;
    tx.commit()?;
    Ok(())
}

//! `RaftLogStorage` on redb: the log, the vote, and the committed/purged ids.
//!
//! Each append is one fsynced redb transaction, run on Tokio's blocking pool; openraft is told
//! the entries are durable when it returns. openraft 0.9 waits for each append's flush before it
//! handles its next message, so several appends are never waiting at once and a log-level
//! group commit has nothing to group (it used to cost a second transaction per append).
//! Batching happens above openraft instead (`propose`): one entry per batch of writes.
//!
//! A redb commit costs far more CPU than its fsync on a fast disk, so the store keeps their
//! number down: the committed id (a restart hint openraft may lose) is kept in memory and
//! written by the next append's transaction rather than in one of its own.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::db::{self, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, RAFT_META};
use super::state::Shared;
use super::types::{NodeId, TypeConfig};

/// The committed id as openraft last reported it, and whether the file has it yet.
#[derive(Default)]
struct Committed {
    id: Option<LogId<NodeId>>,
    unsaved: bool,
}

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
    /// Held by every copy openraft owns, so `Node::shutdown` can wait until they are gone.
    _lease: Option<Arc<()>>,
}

impl LogStore {
    pub(crate) fn new(
        db: Arc<redb::Database>,
        state: Arc<redb::Database>,
        shared: Arc<Shared>,
        lease: Option<Arc<()>>,
    ) -> Self {
        Self { db, state, shared, committed: Arc::default(), _lease: lease }
    }

    fn last_purged(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        db::read_meta(&self.db, RAFT_META, KEY_LAST_PURGED)
    }

    /// The committed id to write with the next transaction, if the file lacks it.
    fn committed_to_save(&self) -> Option<Option<LogId<NodeId>>> {
        let c = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        c.unsaved.then_some(c.id)
    }

    /// Marks `saved` as in the file, unless a newer id arrived meanwhile.
    fn committed_saved(&self, saved: Option<Option<LogId<NodeId>>>) {
        if let Some(saved) = saved {
            let mut c = self.committed.lock().unwrap_or_else(|e| e.into_inner());
            if c.id == saved {
                c.unsaved = false;
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let rerr = |e| -> StorageError<NodeId> { StorageIOError::read_logs(e).into() };
        let tx = self.db.begin_read().map_err(|e| rerr(db::any(e)))?;
        let t = tx.open_table(LOG).map_err(|e| rerr(db::any(e)))?;
        let start = match range.start_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(s) => Bound::Included(*s),
            Bound::Excluded(s) => Bound::Excluded(*s),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for item in t.range::<u64>((start, end)).map_err(|e| rerr(db::any(e)))? {
            let (_k, v) = item.map_err(|e| rerr(db::any(e)))?;
            out.push(db::from_json(v.value()).map_err(|e| rerr(db::any(e)))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let last_purged_log_id = self.last_purged()?;
        let last = {
            let tx = self.db.begin_read().map_err(db::read_err)?;
            let t = tx.open_table(LOG).map_err(db::read_err)?;
            match t.last().map_err(db::read_err)? {
                Some((_k, v)) => {
                    let e: Entry<TypeConfig> = db::from_json(v.value()).map_err(db::read_err)?;
                    Some(e.log_id)
                }
                None => None,
            }
        };
        // After a purge of everything, the last log id is the purged one.
        let last_log_id = last.or(last_purged_log_id);
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
        db::write_meta(&self.db, RAFT_META, KEY_VOTE, vote, true)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        db::read_meta(&self.db, RAFT_META, KEY_VOTE)
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
        for entry in entries {
            rows.push((entry.log_id.index, db::to_json(&entry).map_err(|e| werr(db::any(e)))?));
        }
        let committed = self.committed_to_save();
        let committed_json = match committed {
            Some(c) => Some(db::to_json(&c).map_err(|e| werr(db::any(e)))?),
            None => None,
        };
        let database = self.db.clone();
        // The fsync blocks; keep it off the runtime's worker threads.
        let commit = move || -> Result<(), redb::Error> {
            let tx = database.begin_write()?;
            {
                let mut t = tx.open_table(LOG)?;
                for (index, bytes) in &rows {
                    t.insert(*index, bytes.as_slice())?;
                }
                if let Some(c) = &committed_json {
                    tx.open_table(RAFT_META)?.insert(KEY_COMMITTED, c.as_slice())?;
                }
            }
            tx.commit()?;
            Ok(())
        };
        let result = match tokio::task::spawn_blocking(commit).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("log append task failed: {e}")),
        };
        match result {
            Ok(()) => {
                self.committed_saved(committed);
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.clone())));
                Err(werr(openraft::AnyError::error(e)))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let werr = |e| -> StorageError<NodeId> { StorageIOError::write_logs(e).into() };
        let tx = self.db.begin_write().map_err(|e| werr(db::any(e)))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| werr(db::any(e)))?;
            t.retain_in(log_id.index.., |_, _| false)
                .map_err(|e| werr(db::any(e)))?;
        }
        tx.commit().map_err(|e| werr(db::any(e)))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let werr = |e| -> StorageError<NodeId> { StorageIOError::write_logs(e).into() };
        // Purge only what the state file holds durably. A follower sent a snapshot is told to
        // purge up to it as soon as the install is queued (openraft 0.9's
        // `install_full_snapshot`), while its state machine may not have written it yet: a
        // crash in between would leave entries in neither file. So wait for that install
        // (bounded: a transfer abandoned half-way never installs), then fsync the state file.
        let deadline = tokio::time::Instant::now() + INSTALL_WAIT;
        while self.shared.receiving_within(INSTALL_WAIT)
            && db::applied(&self.state).map_err(|e| werr(db::any(e)))?.is_none_or(|a| a.index < log_id.index)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        db::sync_state(&self.state).map_err(|e| werr(db::any(e)))?;
        let bytes = db::to_json(&log_id).map_err(|e| werr(db::any(e)))?;
        // The purged id and the deletion commit together, so a crash cannot leave a gap.
        let tx = self.db.begin_write().map_err(|e| werr(db::any(e)))?;
        {
            let mut meta = tx.open_table(RAFT_META).map_err(|e| werr(db::any(e)))?;
            meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                .map_err(|e| werr(db::any(e)))?;
            let mut t = tx.open_table(LOG).map_err(|e| werr(db::any(e)))?;
            t.retain_in(..=log_id.index, |_, _| false)
                .map_err(|e| werr(db::any(e)))?;
        }
        tx.commit().map_err(|e| werr(db::any(e)))
    }
}

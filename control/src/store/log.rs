//! `RaftLogStorage` on redb: the log, the vote, and the committed/purged ids.
//!
//! Group commit: `append` writes its entries in a redb transaction without an fsync (so they are
//! readable at once, as openraft requires) and hands the flush callback to a flusher thread.
//! The flusher takes every callback waiting, makes all those writes durable with one fsynced
//! commit, and only then tells openraft they are durable. openraft 0.9 appends each client
//! write on its own, so without this every write paid a sequential fsync on the leader; with
//! it, concurrent writes share one.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use tokio::sync::mpsc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::db::{self, KEY_COMMITTED, KEY_FLUSHES, KEY_LAST_PURGED, KEY_VOTE, LOG, RAFT_META};
use super::types::{NodeId, TypeConfig};

/// Log store handle; cheap to clone (the reader openraft asks for is a clone).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<redb::Database>,
    /// Where flush callbacks go; the flusher task ends when the last clone is dropped.
    flush: mpsc::UnboundedSender<LogFlushed<TypeConfig>>,
    /// Held by every copy openraft owns, so `Node::shutdown` can wait until they are gone.
    _lease: Option<Arc<()>>,
}

impl LogStore {
    pub(crate) fn new(db: Arc<redb::Database>, lease: Option<Arc<()>>) -> Self {
        let (flush, pending) = mpsc::unbounded_channel();
        tokio::spawn(flusher(Arc::downgrade(&db), pending, lease.clone()));
        Self { db, flush, _lease: lease }
    }

    fn last_purged(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        db::read_meta(&self.db, RAFT_META, KEY_LAST_PURGED)
    }
}

/// The flusher: one fsynced commit per batch of waiting appends, then their callbacks. An
/// fsync failure is reported to every waiting append (never a silent success). The commit runs
/// on tokio's blocking pool (which also keeps a paused test clock from jumping past it).
///
/// It holds the database weakly, so dropping the last store handle closes the file at once.
async fn flusher(
    db: std::sync::Weak<redb::Database>,
    mut pending: mpsc::UnboundedReceiver<LogFlushed<TypeConfig>>,
    _lease: Option<Arc<()>>,
) {
    let mut seq: u64 = 0;
    while let Some(first) = pending.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = pending.try_recv() {
            batch.push(more);
        }
        seq += 1;
        let db = db.clone();
        let commit = move || -> Result<(), String> {
            let db = db.upgrade().ok_or("the store was closed before the log was flushed")?;
            // A durable commit persists every earlier non-durable one; it must change
            // something, so it records how many flushes this process made.
            let tx = db.begin_write().map_err(|e| e.to_string())?;
            {
                let mut meta = tx.open_table(RAFT_META).map_err(|e| e.to_string())?;
                meta.insert(KEY_FLUSHES, seq.to_le_bytes().as_slice()).map_err(|e| e.to_string())?;
            }
            tx.commit().map_err(|e| e.to_string())
        };
        let durable = match tokio::task::spawn_blocking(commit).await {
            Ok(r) => r,
            Err(e) => Err(format!("log flush task failed: {e}")),
        };
        for callback in batch {
            callback.log_io_completed(durable.clone().map_err(std::io::Error::other));
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
        // may be lost in a crash, so it skips the fsync that every commit round would pay.
        db::write_meta(&self.db, RAFT_META, KEY_COMMITTED, &committed, false)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
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
        let mut tx = self.db.begin_write().map_err(|e| werr(db::any(e)))?;
        // Readable now, durable when the flusher's next fsynced commit lands.
        tx.set_durability(redb::Durability::None)
            .map_err(|e| werr(db::any(e)))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| werr(db::any(e)))?;
            for entry in entries {
                let bytes = db::to_json(&entry).map_err(|e| werr(db::any(e)))?;
                t.insert(entry.log_id.index, bytes.as_slice())
                    .map_err(|e| werr(db::any(e)))?;
            }
        }
        if let Err(e) = tx.commit() {
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(werr(db::any(e)));
        }
        if let Err(mpsc::error::SendError(callback)) = self.flush.send(callback) {
            callback.log_io_completed(Err(std::io::Error::other("the log flusher has stopped")));
        }
        Ok(())
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

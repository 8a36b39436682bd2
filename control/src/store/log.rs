//! `RaftLogStorage` on redb: the log, the vote, and the committed/purged ids.
//!
//! Each `append` call is one write transaction, so a batch of entries shares one fsync; the
//! flush callback fires only after the commit returned, which is when openraft may count the
//! entries as durable.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::db::{self, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, RAFT_META};
use super::types::{NodeId, TypeConfig};

/// Log store handle; cheap to clone (the reader openraft asks for is a clone).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<redb::Database>,
    /// Held by every copy openraft owns, so `Node::shutdown` can wait until they are gone.
    _lease: Option<Arc<()>>,
}

impl LogStore {
    pub(crate) fn new(db: Arc<redb::Database>, lease: Option<Arc<()>>) -> Self {
        Self { db, _lease: lease }
    }

    fn last_purged(&self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        db::read_meta(&self.db, RAFT_META, KEY_LAST_PURGED)
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
        let tx = self.db.begin_write().map_err(|e| werr(db::any(e)))?;
        {
            let mut t = tx.open_table(LOG).map_err(|e| werr(db::any(e)))?;
            for entry in entries {
                let bytes = db::to_json(&entry).map_err(|e| werr(db::any(e)))?;
                t.insert(entry.log_id.index, bytes.as_slice())
                    .map_err(|e| werr(db::any(e)))?;
            }
        }
        let res = tx.commit();
        // Tell openraft the outcome either way; an fsync failure must not look like success.
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                callback.log_io_completed(Err(std::io::Error::other(msg)));
                Err(werr(db::any(e)))
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

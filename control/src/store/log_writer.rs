//! The log file's one writer: a task that commits log operations in the order they were
//! submitted, grouping queued appends into one fsynced redb transaction. Each transaction runs
//! on Tokio's blocking pool (the fsync blocks), one at a time; being a task awaiting
//! `spawn_blocking`, it also keeps a paused test clock from jumping ahead during an fsync.
//!
//! Why a single ordered writer: the leader no longer waits for its own appends to be flushed
//! before it replicates them (the `weft patch` in `vendor/openraft`, see
//! docs/openraft-leader-append.md), so several appends can be waiting at once. Concurrent
//! commits would land in no particular order, and a crash between two of them could leave a
//! hole in the log, or a truncate could be undone by an earlier append landing after it. Here
//! every operation commits in submission order, an append's callback fires only after its
//! transaction is durable, and after the first failed write every later one fails too (a write
//! after a hole would be worse than a stopped node).
//!
//! Appended entries stay readable from [`Tail`] until their transaction has committed, so
//! replication and apply can read entries that are not on disk yet; [`Durable`] tells the state
//! machine how far the file reaches, and apply waits for it (`state.rs`), so the state never
//! runs ahead of the durable log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use openraft::storage::LogFlushed;
use openraft::{Entry, LogId};
use tokio::sync::mpsc;

use super::db::{KEY_COMMITTED, LOG, RAFT_META};
use super::state::Shared;
use super::types::{NodeId, TypeConfig};

/// Most appends grouped into one transaction.
const MAX_GROUP: usize = 64;

/// How far the log file is durable, as the state machine sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Durable {
    /// Every entry up to this index that the store holds is on disk.
    pub(crate) end: u64,
    /// The last index submitted to the writer: entries past `end` up to it are still pending.
    pub(crate) submitted: u64,
    /// The writer has failed (or is gone): nothing will become durable any more.
    pub(crate) failed: bool,
}

/// Entries appended but not yet durable, by index; read before the file (see `log.rs`).
pub(crate) type Tail = Arc<Mutex<BTreeMap<u64, Entry<TypeConfig>>>>;

/// The committed id as openraft last reported it, and whether the file has it yet.
#[derive(Default)]
pub(crate) struct Committed {
    pub(crate) id: Option<LogId<NodeId>>,
    pub(crate) unsaved: bool,
}

/// One append: rows already serialized, and the committed id captured when it was submitted
/// (never a later one, which could point past what this transaction makes durable).
pub(crate) struct Append {
    pub(crate) rows: Vec<(u64, Vec<u8>)>,
    pub(crate) ids: Vec<LogId<NodeId>>,
    pub(crate) committed: Option<(Option<LogId<NodeId>>, Vec<u8>)>,
    pub(crate) callback: LogFlushed<TypeConfig>,
}

type JobFn = Box<dyn FnOnce(&redb::Database) -> Result<(), redb::Error> + Send>;

/// Any other write (truncate, purge, vote): a barrier, run after every earlier append.
pub(crate) struct Job {
    pub(crate) run: JobFn,
    /// A truncate lowers the durable end to just below what it removed.
    pub(crate) lower_end_to: Option<u64>,
    pub(crate) done: tokio::sync::oneshot::Sender<Result<(), String>>,
}

enum Op {
    Append(Append),
    Job(Job),
}

/// The submitting end; the thread stops once every clone is dropped and the queue is empty.
#[derive(Clone)]
pub(crate) struct Writer {
    tx: mpsc::UnboundedSender<Op>,
}

/// What the writer thread owns.
struct Worker {
    db: Arc<redb::Database>,
    tail: Tail,
    committed: Arc<Mutex<Committed>>,
    shared: Arc<Shared>,
    poisoned: Option<String>,
    /// Held until the task ends, so `Node::shutdown` waits for the queue to drain.
    _lease: Option<Arc<()>>,
}

impl Writer {
    /// Starts the writer task for `db` (call inside a Tokio runtime); `durable_end` is how far
    /// the file reaches now.
    pub(crate) fn start(
        db: Arc<redb::Database>,
        tail: Tail,
        committed: Arc<Mutex<Committed>>,
        shared: Arc<Shared>,
        durable_end: Result<u64, String>,
        lease: Option<Arc<()>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let poisoned = durable_end.as_ref().err().cloned();
        let end = *durable_end.as_ref().unwrap_or(&0);
        shared.durable.send_replace(Durable { end, submitted: end, failed: poisoned.is_some() });
        let mut worker = Worker { db, tail, committed, shared, poisoned, _lease: lease };
        tokio::spawn(async move { worker.run(rx).await });
        Self { tx }
    }

    /// Queues an append; its callback fires once it is durable (or failed).
    pub(crate) fn append(&self, a: Append) -> Result<(), String> {
        self.tx.send(Op::Append(a)).map_err(|e| {
            let Op::Append(a) = e.0 else { unreachable!("sent an append") };
            a.callback.log_io_completed(Err(std::io::Error::other("the log writer has stopped")));
            "the log writer has stopped".to_string()
        })
    }

    /// Runs `run` after every earlier operation, and waits for it.
    pub(crate) async fn job(&self, run: JobFn, lower_end_to: Option<u64>) -> Result<(), String> {
        let (done, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Op::Job(Job { run, lower_end_to, done }))
            .map_err(|_| "the log writer has stopped".to_string())?;
        rx.await.unwrap_or_else(|_| Err("the log writer has stopped".into()))
    }
}

impl Worker {
    async fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        let mut next = None;
        loop {
            let op = match next.take() {
                Some(op) => op,
                None => match rx.recv().await {
                    Some(op) => op,
                    None => break,
                },
            };
            match op {
                Op::Job(job) => self.job(job).await,
                Op::Append(first) => {
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP {
                        match rx.try_recv() {
                            Ok(Op::Append(a)) => group.push(a),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.appends(group).await;
                }
            }
        }
        // Nothing will be written any more: apply must not wait for it.
        self.shared.durable.send_modify(|d| d.failed = true);
    }

    fn poison(&mut self, e: &str) {
        tracing::error!(error = %e, "log write failed; the log accepts no more writes");
        self.poisoned = Some(e.to_string());
        self.shared.durable.send_modify(|d| d.failed = true);
    }

    async fn job(&mut self, job: Job) {
        let result = match &self.poisoned {
            Some(p) => Err(format!("an earlier log write failed: {p}")),
            None => {
                let (db, run) = (self.db.clone(), job.run);
                blocking(move || run(&db)).await
            }
        };
        match &result {
            Ok(()) => {
                if let Some(end) = job.lower_end_to {
                    self.tail.lock().unwrap_or_else(|e| e.into_inner()).retain(|i, _| *i <= end);
                    self.shared.durable.send_if_modified(|d| {
                        let lower = d.end > end || d.submitted > end;
                        d.end = d.end.min(end);
                        d.submitted = d.submitted.min(end);
                        lower
                    });
                }
            }
            Err(e) => self.poison(e),
        }
        let _ = job.done.send(result);
    }

    async fn appends(&mut self, mut group: Vec<Append>) {
        let committed = group.iter().rev().find_map(|a| a.committed.clone());
        let saved = committed.as_ref().map(|c| c.0);
        let result = match &self.poisoned {
            Some(p) => Err(format!("an earlier log write failed: {p}")),
            None => {
                let rows: Vec<(u64, Vec<u8>)> = group.iter_mut().flat_map(|a| std::mem::take(&mut a.rows)).collect();
                let db = self.db.clone();
                blocking(move || commit(&db, &rows, committed.as_ref().map(|c| c.1.as_slice()))).await
            }
        };
        if let Err(e) = &result {
            self.poison(e);
        } else {
            if let Some(saved) = saved {
                let mut c = self.committed.lock().unwrap_or_else(|e| e.into_inner());
                if c.id == saved {
                    c.unsaved = false;
                }
            }
            let mut end = None;
            {
                let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
                for id in group.iter().flat_map(|a| &a.ids) {
                    if tail.get(&id.index).is_some_and(|e| e.log_id == *id) {
                        tail.remove(&id.index);
                    }
                    end = Some(id.index);
                }
            }
            if let Some(end) = end {
                self.shared.durable.send_modify(|d| d.end = end);
            }
        }
        for a in group {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::other(e.clone())),
            };
            a.callback.log_io_completed(r);
        }
    }
}

/// Runs a redb write on the blocking pool.
async fn blocking(f: impl FnOnce() -> Result<(), redb::Error> + Send + 'static) -> Result<(), String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("log write task failed: {e}")),
    }
}

/// One fsynced transaction for a group of appends (and the latest committed id among them).
fn commit(db: &redb::Database, rows: &[(u64, Vec<u8>)], committed: Option<&[u8]>) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    {
        let mut t = tx.open_table(LOG)?;
        for (index, bytes) in rows {
            t.insert(*index, bytes.as_slice())?;
        }
        if let Some(c) = committed {
            tx.open_table(RAFT_META)?.insert(KEY_COMMITTED, c)?;
        }
    }
    tx.commit()?;
    Ok(())
}

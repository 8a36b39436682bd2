//! The proposer: turns concurrent writes into few Raft log entries.
//!
//! openraft 0.9's core handles one client write at a time: each becomes its own log append and
//! its own replication round. Handing it every API write separately would cost one entry, one
//! log transaction and one AppendEntries per write, whatever the concurrency. The proposer
//! sits in front: writers queue their command here; while `IN_FLIGHT` batches are in flight,
//! the queue fills; when one is committed and applied, everything queued (up to [`MAX_BATCH`]
//! commands or [`MAX_BATCH_BYTES`]) goes out as the next entry. One writer alone gets its own
//! entry with no added wait; 64 concurrent writers share one entry and one replication round.
//! (The leader's own fsync no longer blocks the core, see `log_writer`; `IN_FLIGHT` was tuned
//! while it did.)
//!
//! A batch never holds the same key twice (both writes would get the same revision): a second
//! write of a key waits for the next batch, so writes of one key still apply in arrival order.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use openraft::error::ClientWriteError;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::types::{Command, ConfigRaft, Proposal};
use super::{StoreError, raft_err};

/// Most commands in one log entry.
pub const MAX_BATCH: usize = 1024;
/// Rough bound on one entry's size: it travels in one AppendEntries and lives in one log row.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Entries in flight at once. Two overlap the leader's append (and fsync) of one batch with the
/// replication and follower fsync of the previous one: on a disk whose fsync takes 3.9 ms,
/// 64 writers get 21-30% more writes/s than with one (bench/README.md, raft-write). On a fast
/// disk, where the store is CPU-bound, batches are half as large and cost ~2.5% of throughput.
const IN_FLIGHT: usize = 2;
/// Longest a writer waits for its entry to commit. openraft 0.9 keeps a leader that lost its
/// quorum in office, so without a bound its writers would wait for as long as the partition
/// lasts; they get a 503 instead. Below the 30 s a follower waits on a forwarded write, so
/// that caller sees this answer rather than the forwarder's timeout.
pub const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// What a writer gets back: the revision and whether the write changed anything.
pub type Reply = Result<(u64, bool), StoreError>;

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Reply>,
}

/// The writers' end of the proposer; dropping every clone stops its task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Proposer {
    /// Starts the proposer task for `raft` (call inside a Tokio runtime).
    pub fn start(raft: ConfigRaft) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
        Self { tx }
    }

    /// Queues `cmd` and waits until its entry is committed and applied (or refused), at most
    /// [`COMMIT_TIMEOUT`]. A write that times out while still queued is never proposed (its
    /// writer has left, see `take_batch`); one already proposed may still be applied.
    pub async fn write(&self, cmd: Command) -> Reply {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending { cmd, reply })
            .map_err(|_| StoreError::Raft("the store is shutting down".into()))?;
        match tokio::time::timeout(COMMIT_TIMEOUT, rx).await {
            Ok(r) => r.unwrap_or_else(|_| Err(StoreError::Raft("the store is shutting down".into()))),
            Err(_) => Err(StoreError::Raft(format!(
                "the write was not committed within {}s: this node may have lost its quorum (it may still be applied later)",
                COMMIT_TIMEOUT.as_secs()
            ))),
        }
    }
}

async fn run(raft: ConfigRaft, mut rx: mpsc::UnboundedReceiver<Pending>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        if waiting.is_empty() {
            match rx.recv().await {
                Some(p) => waiting.push_back(p),
                None => return,
            }
        }
        while let Ok(p) = rx.try_recv() {
            waiting.push_back(p);
        }
        let batch = take_batch(&mut waiting);
        if batch.is_empty() {
            continue; // every queued writer had left
        }
        let cmds: Vec<Command> = batch.iter().map(|p| p.cmd.clone()).collect();
        let proposal = if cmds.len() == 1 {
            Proposal::One(cmds.into_iter().next().expect("one command"))
        } else {
            Proposal::Batch(cmds)
        };
        // Submitted here, in queue order; only the wait for the outcome runs apart.
        let submitted = raft.client_write_ff(proposal).await;
        tokio::spawn(async move {
            let outcome = match submitted {
                Ok(rx) => match rx.await {
                    Ok(r) => r.map_err(write_err),
                    Err(_) => Err(StoreError::Raft("raft stopped before the write finished".into())),
                },
                Err(fatal) => Err(raft_err(fatal)),
            };
            deliver(batch, outcome);
            drop(permit);
        });
    }
}

/// Takes the next batch off the front of `waiting`: in order, skipping (and leaving queued)
/// any command whose key is already in the batch, up to the size bounds.
fn take_batch(waiting: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut keys: HashSet<(String, String)> = HashSet::new();
    let mut bytes = 0;
    let mut rest = VecDeque::new();
    while let Some(p) = waiting.pop_front() {
        // Its writer is gone (a client that gave up, a forwarder past its timeout): it was
        // never acknowledged, and proposing it now, maybe long after, would surprise everyone.
        if p.reply.is_closed() {
            continue;
        }
        let full = batch.len() >= MAX_BATCH || (!batch.is_empty() && bytes + p.cmd.size_hint() > MAX_BATCH_BYTES);
        if full {
            rest.push_back(p);
            rest.extend(waiting.drain(..));
            break;
        }
        let (kind, name) = p.cmd.key();
        if keys.insert((kind.to_string(), name.to_string())) {
            bytes += p.cmd.size_hint();
            batch.push(p);
        } else {
            rest.push_back(p);
        }
    }
    *waiting = rest;
    batch
}

fn write_err(e: ClientWriteError<u64, super::Member>) -> StoreError {
    match e {
        ClientWriteError::ForwardToLeader(f) => StoreError::NotLeader {
            leader: f.leader_id,
            member: f.leader_node,
        },
        other => StoreError::Raft(other.to_string()),
    }
}

/// Hands each writer its own result.
fn deliver(batch: Vec<Pending>, outcome: Result<openraft::raft::ClientWriteResponse<super::TypeConfig>, StoreError>) {
    match outcome {
        Ok(resp) => {
            let index = resp.log_id.index;
            let mut results = resp.data.into_iter();
            for p in batch {
                let r = match results.next() {
                    Some(Ok(revision)) => Ok((revision, revision == index)),
                    Some(Err(e)) => Err(StoreError::Rejected(e)),
                    None => Err(StoreError::Raft("the entry returned fewer results than commands".into())),
                };
                let _ = p.reply.send(r);
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(clone_err(&e)));
            }
        }
    }
}

/// One failure, repeated for every writer of the batch.
fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::NotLeader { leader, member } => StoreError::NotLeader {
            leader: *leader,
            member: member.clone(),
        },
        other => StoreError::Raft(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(kind: &str, name: &str, value: &str) -> Pending {
        let (reply, rx) = oneshot::channel();
        std::mem::forget(rx); // a writer still waiting
        Pending {
            cmd: Command::Put {
                kind: kind.into(),
                name: name.into(),
                value_json: value.into(),
                expect_revision: None,
            },
            reply,
        }
    }

    fn names(v: &[Pending]) -> Vec<String> {
        v.iter()
            .map(|p| match &p.cmd {
                Command::Put { name, value_json, .. } => format!("{name}={value_json}"),
                Command::Delete { name, .. } => format!("-{name}"),
            })
            .collect()
    }

    #[test]
    fn a_key_written_twice_waits_for_the_next_batch_and_order_is_kept() {
        let mut q: VecDeque<Pending> = [
            pending("s", "a", "1"),
            pending("s", "b", "1"),
            pending("s", "a", "2"),
            pending("c", "a", "1"),
            pending("s", "a", "3"),
        ]
        .into_iter()
        .collect();
        let first = take_batch(&mut q);
        assert_eq!(names(&first), ["a=1", "b=1", "a=1"], "s/a, s/b and c/a (another kind)");
        let second = take_batch(&mut q);
        assert_eq!(names(&second), ["a=2"]);
        let third = take_batch(&mut q);
        assert_eq!(names(&third), ["a=3"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_write_whose_writer_left_is_not_proposed() {
        let (reply, rx) = oneshot::channel();
        drop(rx);
        let gone = Pending { cmd: pending("s", "gone", "1").cmd, reply };
        let mut q: VecDeque<Pending> = [pending("s", "a", "1"), gone, pending("s", "b", "1")].into_iter().collect();
        assert_eq!(names(&take_batch(&mut q)), ["a=1", "b=1"]);
        assert!(q.is_empty());
    }

    #[test]
    fn batches_are_bounded_by_count_and_bytes() {
        let mut q: VecDeque<Pending> = (0..MAX_BATCH + 5).map(|i| pending("s", &i.to_string(), "1")).collect();
        assert_eq!(take_batch(&mut q).len(), MAX_BATCH);
        assert_eq!(take_batch(&mut q).len(), 5);
        let big = "x".repeat(MAX_BATCH_BYTES / 2);
        let mut q: VecDeque<Pending> = (0..3).map(|i| pending("s", &i.to_string(), &big)).collect();
        assert_eq!(take_batch(&mut q).len(), 1, "two halves plus overhead exceed the bound");
        let huge = "x".repeat(MAX_BATCH_BYTES * 2);
        let mut q: VecDeque<Pending> = [pending("s", "h", &huge)].into_iter().collect();
        assert_eq!(take_batch(&mut q).len(), 1, "one command always goes, however large");
    }
}

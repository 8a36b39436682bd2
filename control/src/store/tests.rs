//! Single-node tests of the store: writes, optimistic concurrency, restart recovery,
//! snapshot round trip and log purge. Each uses a temp file and finishes in well under a second.

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};

use super::*;
use std::sync::Arc;

fn put(kind: &str, name: &str, v: &str, expect: Option<u64>) -> Command {
    Command::Put {
        kind: kind.into(),
        name: name.into(),
        value_json: v.into(),
        expect_revision: expect,
    }
}

/// Opens the store at `path` once nothing holds it. A test that opened the file's log store by
/// hand and dropped it still has the log's writer task holding the file for a moment: the task
/// ends on its own once its queue closes, on another worker thread (a node's shutdown waits for
/// it; a bare `LogStore` cannot). Waits at most 10 s.
async fn open_when_free(path: &std::path::Path) -> Store {
    for _ in 0..1000 {
        match Store::open(path) {
            Err(StoreError::Open(redb::Error::DatabaseAlreadyOpen)) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await
            }
            other => return other.expect("open store"),
        }
    }
    panic!("{} is still held after 10 s", path.display());
}

fn del(kind: &str, name: &str, expect: Option<u64>) -> Command {
    Command::Delete {
        kind: kind.into(),
        name: name.into(),
        expect_revision: expect,
    }
}

async fn start(path: &std::path::Path, snapshot_every: u64) -> Node {
    let store = open_when_free(path).await;
    let cfg = raft_config(snapshot_every, 0).expect("config");
    Node::start_single(1, Member::default(), &store, cfg)
        .await
        .expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("s.redb"), 1000).await;
    let r1 = node
        .write(put("service", "chat", r#"{"port":8080}"#, None))
        .await
        .unwrap();
    let r2 = node
        .write(put("service", "embed", r#"{"port":9090}"#, None))
        .await
        .unwrap();
    assert!(r1 >= 1 && r2 > r1, "revisions increase: {r1} {r2}");
    let got = node.read("service", "chat").await.unwrap().unwrap();
    assert_eq!(got.value_json, r#"{"port":8080}"#);
    assert_eq!(got.revision, r1);
    let names: Vec<_> = node
        .list("service")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, vec!["chat", "embed"]);
    assert!(node.read("service", "missing").await.unwrap().is_none());
    assert!(node.list("cluster").await.unwrap().is_empty());
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_concurrency_and_bad_input_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("s.redb"), 1000).await;
    let r1 = node.write(put("route", "a", "1", Some(0))).await.unwrap();
    match node.write(put("route", "a", "2", Some(0))).await {
        Err(StoreError::Rejected(CommandError::Conflict {
            expected: 0,
            actual,
            ..
        })) => assert_eq!(actual, r1),
        other => panic!("want conflict, got {other:?}"),
    }
    let r2 = node.write(put("route", "a", "2", Some(r1))).await.unwrap();
    assert!(r2 > r1);
    assert!(matches!(
        node.write(del("route", "a", Some(r1))).await,
        Err(StoreError::Rejected(CommandError::Conflict { .. }))
    ));
    assert!(matches!(
        node.write(del("route", "nope", None)).await,
        Err(StoreError::Rejected(CommandError::NotFound { .. }))
    ));
    assert!(matches!(
        node.write(put("route", "b", "{not json", None)).await,
        Err(StoreError::Rejected(CommandError::InvalidJson { .. }))
    ));
    assert!(matches!(
        node.write(put("route", "x/y", "1", None)).await,
        Err(StoreError::Rejected(CommandError::InvalidKey { .. }))
    ));
    let r3 = node.write(del("route", "a", Some(r2))).await.unwrap();
    assert!(node.read("route", "a").await.unwrap().is_none());
    // History keeps every revision, including the tombstone, for rollback.
    let h = node.local().history("route", "a").unwrap();
    let revs: Vec<_> = h
        .iter()
        .map(|e| (e.revision, e.value_json.clone()))
        .collect();
    assert_eq!(
        revs,
        vec![(r1, Some("1".into())), (r2, Some("2".into())), (r3, None)]
    );
    // A create after delete is allowed again with expect 0.
    node.write(put("route", "a", "3", Some(0))).await.unwrap();
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovers_acknowledged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let mut acked = Vec::new();
    {
        let node = start(&path, 1000).await;
        for i in 0..20 {
            let rev = node
                .write(put("endpoint", &format!("e{i}"), &i.to_string(), None))
                .await
                .unwrap();
            acked.push((format!("e{i}"), rev));
        }
        node.shutdown().await.unwrap();
    }
    let node = start(&path, 1000).await;
    for (name, rev) in &acked {
        let r = node
            .read("endpoint", name)
            .await
            .unwrap()
            .expect("acked write survives restart");
        assert_eq!(r.revision, *rev);
    }
    let last = acked.last().unwrap().1;
    let next = node
        .write(put("endpoint", "after", "1", None))
        .await
        .unwrap();
    assert!(next > last, "revision continues: {next} > {last}");
    node.shutdown().await.unwrap();
}

/// A leader replicates before its own fsync, so after a restart it must not lead on under its
/// old vote (followers may hold entries of that term its disk lost): its own committed vote
/// reads back uncommitted, it stands again in a higher term, and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_stands_for_election_again_in_a_higher_term() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let node = start(&path, 1000).await;
    node.write(put("endpoint", "a", "1", None)).await.unwrap();
    node.shutdown().await.unwrap();

    let store = open_when_free(&path).await;
    let stored = store.log_store().read_vote().await.unwrap().expect("a vote on disk");
    assert!(stored.is_committed(), "the leader's vote is stored committed: {stored}");
    let term = stored.leader_id().term;
    let mut own = log::LogStore::new(store.log_db.clone(), store.db.clone(), store.shared.clone(), Some(1), None);
    let seen = own.read_vote().await.unwrap().unwrap();
    assert!(!seen.is_committed(), "its own committed vote comes back uncommitted: {seen}");
    assert_eq!((seen.leader_id().term, seen.leader_id().voted_for()), (term, Some(1)));
    let mut other = log::LogStore::new(store.log_db.clone(), store.db.clone(), store.shared.clone(), Some(2), None);
    assert_eq!(other.read_vote().await.unwrap(), Some(stored), "another node's vote is untouched");
    drop((own, other, store));

    let node = start(&path, 1000).await;
    let rev = node.write(put("endpoint", "b", "2", None)).await.unwrap();
    assert!(rev > 1);
    let m = node.raft.metrics().borrow().clone();
    assert!(m.vote.leader_id().term > term, "led again in a higher term: {} > {term}", m.vote);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_build_and_install_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let src = Store::open(dir.path().join("a.redb")).unwrap();
    {
        let node = Node::start_single(1, Member::default(), &src, raft_config(1000, 0).unwrap())
            .await
            .unwrap();
        node.write(put("service", "chat", r#"{"v":1}"#, None))
            .await
            .unwrap();
        node.write(put("service", "chat", r#"{"v":2}"#, None))
            .await
            .unwrap();
        node.write(put("cluster", "gpu", r#"{"n":4}"#, None))
            .await
            .unwrap();
        node.write(del("cluster", "gpu", None)).await.unwrap();
        node.shutdown().await.unwrap();
    }
    let mut sm = src.state_machine();
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let applied = sm.applied_state().await.unwrap();
    assert_eq!(snap.meta.last_log_id, applied.0);
    // The built snapshot is kept as the current one.
    let cur = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("current snapshot");
    assert_eq!(cur.meta, snap.meta);

    let dst = Store::open(dir.path().join("b.redb")).unwrap();
    let mut dsm = dst.state_machine();
    dsm.install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    let (last, membership) = dsm.applied_state().await.unwrap();
    assert_eq!(last, applied.0);
    assert_eq!(membership, applied.1);
    for (kind, name) in [("service", "chat"), ("cluster", "gpu")] {
        assert_eq!(dsm.get(kind, name).unwrap(), sm.get(kind, name).unwrap());
        assert_eq!(
            dsm.history(kind, name).unwrap(),
            sm.history(kind, name).unwrap()
        );
    }
    assert_eq!(dsm.history("service", "chat").unwrap().len(), 2);
    assert!(dsm.get("cluster", "gpu").unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_is_purged_after_snapshot_and_restart_still_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let mut last = 0;
    {
        // Snapshot every 10 entries and keep none: the purge follows each snapshot.
        let node = start(&path, 10).await;
        for i in 0..35 {
            last = node
                .write(put("variant", &format!("v{}", i % 5), &i.to_string(), None))
                .await
                .unwrap();
        }
        let m = node
            .raft()
            .wait(Some(std::time::Duration::from_secs(5)))
            .metrics(
                |m| m.purged.is_some() && m.snapshot.is_some(),
                "snapshot and purge",
            )
            .await
            .unwrap();
        let purged = m.purged.unwrap().index;
        assert!(purged >= 10, "purged up to {purged}");
        node.shutdown().await.unwrap();
    }
    // The file itself no longer holds the purged entries.
    let store = open_when_free(&path).await;
    let mut log = store.log_store();
    let state = log.get_log_state().await.unwrap();
    let purged = state.last_purged_log_id.expect("purged id persisted").index;
    let entries = log.try_get_log_entries(0..=purged).await.unwrap();
    assert!(
        entries.is_empty(),
        "{} purged entries remain",
        entries.len()
    );
    assert_eq!(state.last_log_id.map(|l| l.index), Some(last));
    drop(log);
    drop(store);
    // Restart from snapshot + remaining log.
    let node = start(&path, 10).await;
    for i in 30..35 {
        let r = node
            .read("variant", &format!("v{}", i % 5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.value_json, i.to_string());
    }
    assert!(node.write(put("variant", "new", "1", None)).await.unwrap() > last);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restores_an_old_revision_as_a_new_write() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("s.redb"), 1000).await;
    let r1 = node
        .write(put("experiment", "e", r#"{"w":[50,50]}"#, None))
        .await
        .unwrap();
    let r2 = node
        .write(put("experiment", "e", r#"{"w":[90,10]}"#, None))
        .await
        .unwrap();
    let r3 = node.rollback("experiment", "e", r1).await.unwrap();
    assert!(r3 > r2);
    let now = node.read("experiment", "e").await.unwrap().unwrap();
    assert_eq!(
        (now.value_json.as_str(), now.revision),
        (r#"{"w":[50,50]}"#, r3)
    );
    assert_eq!(node.local().history("experiment", "e").unwrap().len(), 3);
    assert!(matches!(
        node.rollback("experiment", "e", 9999).await,
        Err(StoreError::Rejected(CommandError::NotFound { .. }))
    ));
    node.shutdown().await.unwrap();
}

/// Builds a fresh store in a temp dir for openraft's storage conformance suite; the `TempDir`
/// is the guard that keeps the file alive for one suite case.
struct TempStoreBuilder;

impl openraft::testing::StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir>
    for TempStoreBuilder
{
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), openraft::StorageError<NodeId>>
    {
        let dir = tempfile::tempdir().map_err(|e| {
            openraft::StorageError::from_io_error(
                openraft::ErrorSubject::Store,
                openraft::ErrorVerb::Write,
                e,
            )
        })?;
        let store = match Store::open(dir.path().join("s.redb")) {
            Ok(s) => s,
            Err(StoreError::Storage(e)) => return Err(*e),
            Err(e) => {
                return Err(openraft::StorageIOError::write(openraft::AnyError::error(
                    e.to_string(),
                ))
                .into());
            }
        };
        Ok((dir, store.log_store(), store.state_machine()))
    }
}

/// openraft's own storage test suite (log state, vote, append/truncate/purge, applied state,
/// membership tracking) against the redb implementation.
#[test]
fn openraft_storage_suite() {
    openraft::testing::Suite::test_all(TempStoreBuilder).expect("storage suite");
}

/// openraft builds snapshots concurrently with installing them: a build that read the state
/// before an install of a newer snapshot must not overwrite it with its older one. The race
/// is replayed deterministically: the build's read (of the empty state) happens first, the
/// install second, the build's write last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_build_never_replaces_a_newer_installed_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let src = Store::open(dir.path().join("src.redb")).unwrap();
    {
        let node = Node::start_single(1, Member::default(), &src, raft_config(100_000, 0).unwrap())
            .await
            .unwrap();
        for i in 0..5 {
            node.write(put("service", &format!("s{i}"), r#"{"v":1}"#, None))
                .await
                .unwrap();
        }
        node.shutdown().await.unwrap();
    }
    let newer = src
        .state_machine()
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let dst = Store::open(dir.path().join("dst.redb")).unwrap();
    // The build reads the (empty) state...
    let scratch = Store::open(dir.path().join("scratch.redb")).unwrap();
    let stale = scratch
        .state_machine()
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    // ...the newer snapshot is installed...
    let mut sm = dst.state_machine();
    sm.install_snapshot(&newer.meta, Box::new(std::io::Cursor::new(newer.snapshot.get_ref().clone())))
        .await
        .unwrap();
    // ...and the build's write comes last.
    let kept = sm
        .keep_snapshot(stale.meta.clone(), stale.snapshot.get_ref().clone())
        .unwrap();
    assert_eq!(kept.meta, newer.meta, "the build hands back the newer snapshot");
    let current = sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(current.meta, newer.meta, "the newer snapshot stays current");
    assert_eq!(sm.applied_state().await.unwrap().0, newer.meta.last_log_id);
}

/// A file from before the snapshot had a table of its own keeps its snapshot after an upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_kept_in_the_old_layout_is_moved_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let snap = {
        let store = open_when_free(&path).await;
        let node = Node::start_single(1, Member::default(), &store, raft_config(1000, 0).unwrap())
            .await
            .unwrap();
        node.write(put("service", "chat", r#"{"v":1}"#, None)).await.unwrap();
        node.shutdown().await.unwrap();
        let mut sm = store.state_machine();
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        // Rewrite the file into the old layout: snapshot keys in `sm_meta`.
        let tx = store.db.begin_write().unwrap();
        {
            let mut snapshot = tx.open_table(super::db::SNAPSHOT).unwrap();
            let mut meta = tx.open_table(super::db::SM_META).unwrap();
            for key in [super::db::KEY_SNAPSHOT_META, super::db::KEY_SNAPSHOT_DATA] {
                let v = snapshot.remove(key).unwrap().expect("snapshot key").value().to_vec();
                meta.insert(key, v.as_slice()).unwrap();
            }
        }
        tx.commit().unwrap();
        snap
    };
    let store = open_when_free(&path).await;
    let mut sm = store.state_machine();
    let cur = sm.get_current_snapshot().await.unwrap().expect("snapshot survives the upgrade");
    assert_eq!(cur.meta, snap.meta);
    assert_eq!(cur.snapshot.get_ref(), snap.snapshot.get_ref());
    let tx = redb::ReadableDatabase::begin_read(&*store.db).unwrap();
    let meta = tx.open_table(super::db::SM_META).unwrap();
    assert!(meta.get(super::db::KEY_SNAPSHOT_DATA).unwrap().is_none(), "no second copy left behind");
}

fn values(h: &[HistoryEntry]) -> Vec<Option<&str>> {
    h.iter().map(|e| e.value_json.as_deref()).collect()
}

/// A key's history survives deletes and re-creates, and is the same after a snapshot install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_spans_deletes_and_recreates() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("h.redb")).unwrap();
    let node = Node::start_single(1, Member::default(), &store, raft_config(1000, 0).unwrap()).await.unwrap();
    node.write(put("s", "a", "1", None)).await.unwrap();
    node.write(put("s", "b", "1", None)).await.unwrap();
    node.write(put("s", "a", "2", None)).await.unwrap();
    node.write(del("s", "a", None)).await.unwrap();
    assert_eq!(values(&node.local().history("s", "a").unwrap()), [Some("1"), Some("2"), None]);
    node.write(put("s", "a", "3", None)).await.unwrap();
    let h = node.local().history("s", "a").unwrap();
    assert_eq!(values(&h), [Some("1"), Some("2"), None, Some("3")]);
    assert!(h.windows(2).all(|w| w[0].revision < w[1].revision));
    assert_eq!(values(&node.local().history("s", "b").unwrap()), [Some("1")]);
    assert!(node.local().history("s", "never").unwrap().is_empty());
    node.shutdown().await.unwrap();

    let mut sm = store.state_machine();
    let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let other = Store::open(dir.path().join("o.redb")).unwrap();
    other.state_machine().install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    assert_eq!(other.state_machine().history("s", "a").unwrap(), h);
}

/// A file written with history keyed by name first is converted on open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_in_the_old_layout_is_converted_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    {
        let store = open_when_free(&path).await;
        let tx = store.db.begin_write().unwrap();
        {
            let mut old = tx.open_table(super::db::OLD_HISTORY).unwrap();
            for (rev, v) in [(3u64, Some("1")), (5, Some("2")), (7, None)] {
                old.insert(("s/gone", rev), serde_json::to_vec(&v).unwrap().as_slice()).unwrap();
            }
            old.insert(("s/live", 4), serde_json::to_vec(&Some("x")).unwrap().as_slice()).unwrap();
            let r = Resource { kind: "s".into(), name: "live".into(), value_json: "x".into(), revision: 4 };
            tx.open_table(super::db::RESOURCES)
                .unwrap()
                .insert("s/live", serde_json::to_vec(&r).unwrap().as_slice())
                .unwrap();
        }
        tx.commit().unwrap();
    }
    let store = open_when_free(&path).await;
    let sm = store.state_machine();
    let gone = sm.history("s", "gone").unwrap();
    assert_eq!(values(&gone), [Some("1"), Some("2"), None]);
    assert_eq!(gone.iter().map(|h| h.revision).collect::<Vec<_>>(), [3, 5, 7]);
    assert_eq!(values(&sm.history("s", "live").unwrap()), [Some("x")]);
}

/// A store from before the log had a file of its own (log, vote and state in one file) is split
/// on open: the node comes back as the same cluster member with every write, and writes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_file_store_is_split_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let (rev, entries, vote) = {
        let node = start(&path, 1000).await;
        let rev = node.write(put("service", "chat", r#"{"v":1}"#, None)).await.unwrap();
        node.shutdown().await.unwrap();
        // Rewrite into the old layout: the log tables inside the state file, no log file.
        let store = open_when_free(&path).await;
        let mut log = store.log_store();
        let entries = log.try_get_log_entries(..).await.unwrap();
        let vote = log.read_vote().await.unwrap();
        let src = redb::ReadableDatabase::begin_read(&*store.log_db).unwrap();
        let tx = store.db.begin_write().unwrap();
        super::db::copy_table(&src, &tx, super::db::LOG).unwrap();
        super::db::copy_table(&src, &tx, super::db::RAFT_META).unwrap();
        tx.commit().unwrap();
        (rev, entries, vote)
    };
    std::fs::remove_file(Store::log_path(&path)).unwrap();

    {
        let store = open_when_free(&path).await;
        assert!(Store::log_path(&path).exists(), "the log has a file of its own");
        let mut log = store.log_store();
        assert!(entries.len() >= 3, "{entries:?}");
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries, "every entry moved");
        assert_eq!(log.read_vote().await.unwrap(), vote, "the vote moved with the log");
        let tx = redb::ReadableDatabase::begin_read(&*store.db).unwrap();
        assert!(tx.open_table(super::db::LOG).is_err(), "no second copy of the log left behind");
    }
    let node = start(&path, 1000).await;
    assert_eq!(node.read("service", "chat").await.unwrap().map(|r| r.revision), Some(rev));
    let next = node.write(put("service", "chat", r#"{"v":2}"#, Some(rev))).await.unwrap();
    assert!(next > rev, "the log continues where it was: {next} > {rev}");
    node.shutdown().await.unwrap();
}

/// Applying does not fsync each entry: the state file is synced once `SYNC_EVERY` entries have
/// gathered (and at shutdown), which is what bounds a restart's re-apply after a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_entries_are_synced_in_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.redb")).unwrap();
    let node = Node::start_single(1, Member::default(), &store, raft_config(100_000, 0).unwrap())
        .await
        .unwrap();
    let unsynced = || store.shared.unsynced.load(std::sync::atomic::Ordering::Relaxed);
    let mut peak = 0;
    for i in 0..state::SYNC_EVERY + 10 {
        node.write(put("endpoint", &format!("e{i}"), "1", None)).await.unwrap();
        peak = peak.max(unsynced());
    }
    assert!(peak >= state::SYNC_EVERY - 1, "entries gather unsynced (peak {peak})");
    assert!(unsynced() < 20, "a round was synced ({} left)", unsynced());
    node.shutdown().await.unwrap();
    assert_eq!(unsynced(), 0, "shutdown syncs the rest");
}

/// A state file whose log file is gone (one file of two restored) is refused, naming the
/// missing file, instead of starting with an empty log and no vote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_without_its_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let node = start(&path, 1000).await;
    node.write(put("service", "chat", "1", None)).await.unwrap();
    node.shutdown().await.unwrap();
    std::fs::remove_file(Store::log_path(&path)).unwrap();
    let err = Store::open(&path).err().expect("refused").to_string();
    assert!(err.contains("s.log.redb") && err.contains("missing"), "{err}");
    assert!(!Store::log_path(&path).exists(), "no empty log made in its place");
}

/// A log whose purged prefix the state file does not cover (the state file was lost or is an
/// older copy) is refused, naming both files, instead of starting with entries missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_purged_past_the_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let node = start(&path, 10).await;
    for i in 0..35 {
        node.write(put("variant", &format!("v{i}"), "1", None)).await.unwrap();
    }
    node.raft()
        .wait(Some(std::time::Duration::from_secs(5)))
        .metrics(|m| m.purged.is_some(), "purge")
        .await
        .unwrap();
    node.shutdown().await.unwrap();
    std::fs::remove_file(&path).unwrap();
    let err = Store::open(&path).err().expect("refused").to_string();
    assert!(err.contains("s.redb") && err.contains("purged"), "{err}");
}

/// openraft tells a follower to purge up to a snapshot as soon as its install is queued, while
/// the state machine may still be writing it. The purge waits for that install, so a crash in
/// between never leaves entries in neither file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_for_the_snapshot_being_installed() {
    let dir = tempfile::tempdir().unwrap();
    let src = Store::open(dir.path().join("src.redb")).unwrap();
    let node = Node::start_single(1, Member::default(), &src, raft_config(100_000, 0).unwrap()).await.unwrap();
    for i in 0..5 {
        node.write(put("variant", &format!("v{i}"), "1", None)).await.unwrap();
    }
    node.shutdown().await.unwrap();
    let snap = src.state_machine().get_snapshot_builder().await.build_snapshot().await.unwrap();
    let upto = snap.meta.last_log_id.expect("snapshot id");

    let dst = Store::open(dir.path().join("dst.redb")).unwrap();
    let mut sm = dst.state_machine();
    sm.begin_receiving_snapshot().await.unwrap();
    // The transfer began long ago (a large snapshot on a slow link): the purge still waits.
    *dst.shared.receiving.lock().unwrap() = Some(std::time::Instant::now() - std::time::Duration::from_secs(120));
    let mut log = dst.log_store();
    let purge = tokio::spawn(async move {
        log.purge(upto).await.unwrap();
        log.get_log_state().await.unwrap().last_purged_log_id
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!purge.is_finished(), "the purge waits while the snapshot is not installed");
    sm.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
    assert_eq!(purge.await.unwrap(), Some(upto));
    assert_eq!(sm.applied_state().await.unwrap().0, Some(upto));
}

/// A follower catching up gets the log in requests of bounded size: without the bound, one
/// AppendEntries of 300 large entries passed the peer's body limit and was refused, then
/// resent unchanged, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_reads_are_bounded_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let node = start(&path, 100_000).await;
    let big = format!("\"{}\"", "x".repeat(1 << 20));
    for i in 0..12 {
        node.write(put("service", &format!("s{i}"), &big, None)).await.unwrap();
    }
    node.shutdown().await.unwrap();
    let store = open_when_free(&path).await;
    let mut log = store.log_store();
    let all = log.try_get_log_entries(..).await.unwrap();
    let (first, end) = (all[0].log_id.index, all.last().unwrap().log_id.index + 1);
    let part = log.limited_get_log_entries(first, end).await.unwrap();
    assert!(part.len() < all.len(), "{} of {} entries in one request", part.len(), all.len());
    let bytes: usize = part.iter().map(|e| serde_json::to_vec(e).unwrap().len()).sum();
    assert!(bytes <= log::MAX_APPEND_BYTES + (1 << 20) + 4096, "{bytes} bytes in one request");
    assert_eq!(part[..], all[..part.len()], "a prefix of the range, in order");
    let one = log.limited_get_log_entries(end - 1, end).await.unwrap();
    assert_eq!(one.len(), 1, "one entry always goes, however large");
}

/// A list answers with the revision its items are at, even while writes land: no item is
/// newer than the list's revision, and the newest one is exactly it when it was the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_sees_one_revision_while_writes_land() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(start(&dir.path().join("s.redb"), 1000).await);
    let writer = {
        let node = node.clone();
        tokio::spawn(async move {
            let mut last = 0;
            for i in 0..150 {
                last = node.write(put("service", &format!("s{}", i % 7), &i.to_string(), None)).await.unwrap();
            }
            last
        })
    };
    let mut views = 0;
    while !writer.is_finished() {
        let view = node.local().view().unwrap();
        let revision = view.revision().unwrap();
        let items = view.list("service").unwrap();
        let newest = items.iter().map(|r| r.revision).max().unwrap_or(0);
        assert!(newest <= revision, "an item at {newest} in a list at {revision}");
        views += 1;
        tokio::task::yield_now().await;
    }
    let last = writer.await.unwrap();
    let view = node.local().view().unwrap();
    assert_eq!(view.list("service").unwrap().iter().map(|r| r.revision).max(), Some(last));
    assert_eq!(view.revision().unwrap(), last);
    assert!(views > 10, "the reader ran alongside the writes ({views} views)");
    Arc::into_inner(node).unwrap().shutdown().await.unwrap();
}

/// With `keep_history(50)`, history reaches 50 revisions back (plus at most one compaction
/// interval), a resource untouched since long ago keeps its current revision, an old delete
/// takes its name's history with it, and rollback to a compacted revision is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_compacted_to_the_kept_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.redb")).unwrap();
    assert_eq!(store.keep_history(50).unwrap(), None, "a new file has no earlier value");
    let node = Node::start_single(1, Member::default(), &store, raft_config(1000, 0).unwrap()).await.unwrap();
    let stable = node.write(put("service", "stable", "0", None)).await.unwrap();
    node.write(put("service", "gone", "0", None)).await.unwrap();
    node.write(del("service", "gone", None)).await.unwrap();
    let first = node.write(put("service", "busy", "0", None)).await.unwrap();
    let mut last = first;
    for i in 1..200 {
        last = node.write(put("service", "busy", &i.to_string(), None)).await.unwrap();
    }
    let h = node.local().history("service", "busy").unwrap();
    assert!((50..=56).contains(&h.len()), "kept {} revisions of busy", h.len());
    assert_eq!(h.last().unwrap().revision, last);
    assert!(h.first().unwrap().revision >= last - 55, "oldest kept {}", h.first().unwrap().revision);
    let s = node.local().history("service", "stable").unwrap();
    assert_eq!(s.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![stable], "the current revision stays");
    assert!(node.local().history("service", "gone").unwrap().is_empty(), "an old delete is compacted away");
    assert!(node.rollback("service", "busy", first).await.is_err(), "a compacted revision cannot be restored");
    let kept = h[h.len() - 2].revision;
    node.rollback("service", "busy", kept).await.unwrap();
    assert_eq!(node.read("service", "busy").await.unwrap().unwrap().value_json, h[h.len() - 2].value_json.clone().unwrap());
    // Recreating the deleted name starts a fresh history.
    let again = node.write(put("service", "gone", "1", Some(0))).await.unwrap();
    assert_eq!(node.local().history("service", "gone").unwrap().iter().map(|e| e.revision).collect::<Vec<_>>(), vec![again]);
    node.shutdown().await.unwrap();

    // Unlimited keeps everything.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s.redb")).unwrap();
    store.keep_history(0).unwrap();
    let node = Node::start_single(1, Member::default(), &store, raft_config(1000, 0).unwrap()).await.unwrap();
    for i in 0..120 {
        node.write(put("service", "busy", &i.to_string(), None)).await.unwrap();
    }
    assert_eq!(node.local().history("service", "busy").unwrap().len(), 120);
    node.shutdown().await.unwrap();
}

/// A node restarted with another `--history-revisions` learns the value it last ran with (so
/// `server::start` can warn), and the same value again reports nothing.
#[test]
fn a_changed_history_setting_is_reported_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.keep_history(500).unwrap(), None);
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.keep_history(500).unwrap(), None, "unchanged");
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.keep_history(20).unwrap(), Some(500), "lowered");
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.keep_history(20).unwrap(), None, "the new value is what is remembered");
}

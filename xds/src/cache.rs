//! The control plane's resource cache: one immutable [`Snapshot`] per revision, shared by every
//! sidecar stream, plus what each node last ACKed or NACKed.
//!
//! Versions are derived from the revision the caller passes in (a Raft log index), never from
//! a clock or a counter of this process: a type's version is the revision at which its content
//! last changed, and a resource's version is the revision at which its body last changed (or
//! the version the caller gives it, e.g. the resource's modification index in the store). Two
//! control nodes that applied the same revisions therefore label the same config the same way,
//! and a sidecar can fail over between them without a redundant push. A node that joined later
//! may label an unchanged type with a later revision; that costs one resend, never a wrong
//! config.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::resources::{self, Resource};
use crate::transport::Any;

/// One cached resource: its body and version.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub version: u64,
    pub body: Any,
}

/// All resources of one type at one revision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeResources {
    /// The revision at which this type's content last changed.
    pub version: u64,
    /// Resource name → entry.
    pub entries: BTreeMap<String, Entry>,
}

/// What a caller hands the cache for a revision: every resource, by type URL and name.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    types: BTreeMap<String, BTreeMap<String, (Option<u64>, Any)>>,
}

impl Resources {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a resource whose version the cache derives (the revision its body last changed).
    pub fn insert(&mut self, type_url: &str, name: &str, body: Any) -> &mut Self {
        self.put(type_url, name, None, body)
    }

    /// Adds a resource with a version the caller knows (e.g. its store modification index).
    pub fn insert_versioned(&mut self, type_url: &str, name: &str, version: u64, body: Any) -> &mut Self {
        self.put(type_url, name, Some(version), body)
    }

    /// Adds a weft resource under its own type URL and name.
    pub fn add<R: Resource>(&mut self, resource: &R) -> &mut Self {
        self.insert(R::TYPE_URL, resource.resource_name(), resources::to_any(resource))
    }

    fn put(&mut self, type_url: &str, name: &str, version: Option<u64>, body: Any) -> &mut Self {
        self.types.entry(type_url.to_owned()).or_default().insert(name.to_owned(), (version, body));
        self
    }
}

/// A revision that does not move forward: the cache never goes back in time, so a sidecar
/// never sees versions decrease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleRevision {
    pub current: u64,
    pub offered: u64,
}

impl fmt::Display for StaleRevision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "revision {} is not newer than the cached revision {}", self.offered, self.current)
    }
}

impl std::error::Error for StaleRevision {}

/// Every resource at one revision. Revision 0 means "nothing committed yet": streams wait
/// rather than tell a sidecar its config is empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    revision: u64,
    types: BTreeMap<String, TypeResources>,
}

impl Snapshot {
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The version of `type_url`'s content; 0 for a type that never had resources.
    pub fn type_version(&self, type_url: &str) -> u64 {
        self.types.get(type_url).map_or(0, |t| t.version)
    }

    /// The resources of `type_url` (name → entry), if it ever had any.
    pub fn entries(&self, type_url: &str) -> Option<&BTreeMap<String, Entry>> {
        self.types.get(type_url).map(|t| &t.entries)
    }

    /// The snapshot for `revision`: unchanged bodies keep their versions, changed ones take
    /// the new revision (unless the caller versioned them), and a type keeps its version while
    /// its content is unchanged. A type that loses all its resources stays, empty, with a new
    /// version, so State-of-the-World clients learn of the removal.
    pub fn next(&self, revision: u64, resources: Resources) -> Result<Snapshot, StaleRevision> {
        if revision <= self.revision {
            return Err(StaleRevision { current: self.revision, offered: revision });
        }
        let mut types = BTreeMap::new();
        let mut input = resources.types;
        let urls: Vec<String> = self.types.keys().chain(input.keys()).cloned().collect();
        for url in urls {
            if types.contains_key(&url) {
                continue;
            }
            let previous = self.types.get(&url);
            let entries: BTreeMap<String, Entry> = input
                .remove(&url)
                .unwrap_or_default()
                .into_iter()
                .map(|(name, (offered, body))| {
                    let before = previous.and_then(|p| p.entries.get(&name));
                    let version = entry_version(before, offered, &body, revision);
                    (name, Entry { version, body })
                })
                .collect();
            let version = match previous {
                Some(p) if p.entries == entries => p.version,
                None if entries.is_empty() => continue,
                _ => revision,
            };
            types.insert(url, TypeResources { version, entries });
        }
        Ok(Snapshot { revision, types })
    }
}

/// The version of one entry in the snapshot for `revision`. An unchanged body keeps the
/// version it had, whatever the caller offers (a resource rewritten with the same content,
/// or an aggregate such as a cluster's endpoints whose sources changed without changing the
/// result, is not pushed again). A changed body takes the caller's version when that moves
/// forward, else `revision`: an aggregate versioned by its newest source can otherwise fall
/// back to an old version with different content (a source older than the newest removed),
/// and a client that holds that version would never be sent the change.
fn entry_version(before: Option<&Entry>, offered: Option<u64>, body: &Any, revision: u64) -> u64 {
    match (before, offered) {
        (Some(e), _) if e.body == *body => e.version,
        (Some(e), Some(v)) if v <= e.version => revision,
        (_, Some(v)) => v,
        (_, None) => revision,
    }
}

/// A node's NACK: the type version it rejected and why. The cache never pushes that version
/// (or an older one) of that type to the node again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    pub version: u64,
    pub error: String,
}

/// What a node told this control node, per type URL (what `weftctl proxy-status` shows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// Streams of this node open now.
    pub streams: u32,
    /// Type URL → last ACKed version.
    pub acked: BTreeMap<String, String>,
    /// Type URL → last NACK.
    pub nacked: BTreeMap<String, Nack>,
    /// When its last stream closed, while none is open.
    pub disconnected_at: Option<Instant>,
}

/// How long a node with no stream open is still reported ([`Cache::node_statuses`]) and
/// remembered (a node back within it is not pushed a version it NACKed). Sidecars that went
/// away for good (scaled down, rescheduled under a new id) would otherwise stay forever.
pub const FORGET_DISCONNECTED: Duration = Duration::from_secs(600);

/// Drop the nodes disconnected for `after` or longer at `now`.
fn forget_disconnected(nodes: &mut BTreeMap<String, NodeStatus>, now: Instant, after: Duration) {
    nodes.retain(|_, s| s.streams > 0 || s.disconnected_at.is_none_or(|t| now.saturating_duration_since(t) < after));
}

/// A node's answer to a push, as the stream protocol reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feedback {
    Ack { type_url: String, version: String },
    Nack { type_url: String, nack: Nack },
}

/// Told about every push a stream sends and every ACK/NACK it receives (the control plane
/// turns them into trace spans: write → commit → push → ACK). Called on the stream's task:
/// keep it short.
pub trait Observer: Send + Sync {
    fn pushed(&self, node_id: &str, type_url: &str, version: &str);
    fn answered(&self, node_id: &str, feedback: &Feedback);
}

/// The shared cache: the latest snapshot behind a watch channel (each connected stream holds
/// a receiver and is woken when a new revision is set), per-node status, and the debounce
/// window streams wait after a wake-up so a burst of commits becomes one push.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

struct Inner {
    snapshot: watch::Sender<Arc<Snapshot>>,
    nodes: Mutex<BTreeMap<String, NodeStatus>>,
    debounce: Duration,
    observer: std::sync::OnceLock<Arc<dyn Observer>>,
    counters: AtomicCounters,
}

#[derive(Default)]
struct AtomicCounters {
    pushes: AtomicU64,
    acks: AtomicU64,
    nacks: AtomicU64,
    unknown_types: AtomicU64,
}

/// Totals since start, for the control plane's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Responses sent (one per type per push).
    pub pushes: u64,
    pub acks: u64,
    pub nacks: u64,
    /// Requests for a type URL this server does not serve (answered with an error).
    pub unknown_types: u64,
}

impl Cache {
    /// A cache whose streams coalesce revisions set within `debounce` of each other.
    pub fn new(debounce: Duration) -> Self {
        let (snapshot, _) = watch::channel(Arc::new(Snapshot::default()));
        let observer = std::sync::OnceLock::new();
        Cache { inner: Arc::new(Inner { snapshot, nodes: Mutex::default(), debounce, observer, counters: AtomicCounters::default() }) }
    }

    /// Publishes the resources of `revision` and wakes every stream.
    pub fn set(&self, revision: u64, resources: Resources) -> Result<(), StaleRevision> {
        let mut result = Ok(());
        self.inner.snapshot.send_if_modified(|current| match current.next(revision, resources) {
            Ok(next) => {
                *current = Arc::new(next);
                true
            }
            Err(stale) => {
                result = Err(stale);
                false
            }
        });
        result
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshot.borrow().clone()
    }

    /// A receiver that is woken whenever a new revision is set.
    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.inner.snapshot.subscribe()
    }

    pub fn debounce(&self) -> Duration {
        self.inner.debounce
    }

    pub fn node_status(&self, node_id: &str) -> Option<NodeStatus> {
        self.nodes().get(node_id).cloned()
    }

    /// Every node that ever connected, with its status.
    pub fn node_statuses(&self) -> BTreeMap<String, NodeStatus> {
        let mut nodes = self.nodes();
        forget_disconnected(&mut nodes, Instant::now(), FORGET_DISCONNECTED);
        nodes.clone()
    }

    /// Counts a new stream of `node_id`; returns what the node reported before, so a stream
    /// opened after a NACK does not push the rejected version again.
    pub(crate) fn connect(&self, node_id: &str) -> NodeStatus {
        let mut nodes = self.nodes();
        forget_disconnected(&mut nodes, Instant::now(), FORGET_DISCONNECTED);
        let status = nodes.entry(node_id.to_owned()).or_default();
        status.streams += 1;
        status.disconnected_at = None;
        status.clone()
    }

    pub(crate) fn disconnect(&self, node_id: &str) {
        if let Some(status) = self.nodes().get_mut(node_id) {
            status.streams = status.streams.saturating_sub(1);
            if status.streams == 0 {
                status.disconnected_at = Some(Instant::now());
            }
        }
    }

    /// Sets the observer of pushes and answers (once; false if one is set already).
    pub fn observe(&self, o: Arc<dyn Observer>) -> bool {
        self.inner.observer.set(o).is_ok()
    }

    /// Push, ACK and NACK totals since start.
    pub fn counters(&self) -> Counters {
        let c = &self.inner.counters;
        Counters {
            pushes: c.pushes.load(Ordering::Relaxed),
            acks: c.acks.load(Ordering::Relaxed),
            nacks: c.nacks.load(Ordering::Relaxed),
            unknown_types: c.unknown_types.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn unknown_type(&self) {
        self.inner.counters.unknown_types.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn pushed(&self, node_id: &str, type_url: &str, version: &str) {
        self.inner.counters.pushes.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = self.inner.observer.get() {
            o.pushed(node_id, type_url, version);
        }
    }

    pub(crate) fn record(&self, node_id: &str, feedback: Feedback) {
        if let Some(o) = self.inner.observer.get() {
            o.answered(node_id, &feedback);
        }
        let counter = match feedback {
            Feedback::Ack { .. } => &self.inner.counters.acks,
            Feedback::Nack { .. } => &self.inner.counters.nacks,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut nodes = self.nodes();
        let status = nodes.entry(node_id.to_owned()).or_default();
        match feedback {
            Feedback::Ack { type_url, version } => {
                status.acked.insert(type_url, version);
            }
            Feedback::Nack { type_url, nack } => {
                status.nacked.insert(type_url, nack);
            }
        }
    }

    fn nodes(&self) -> MutexGuard<'_, BTreeMap<String, NodeStatus>> {
        // A panic elsewhere while holding the lock leaves plain data behind; keep serving it.
        self.inner.nodes.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typeurl::{CLUSTER, LISTENER};

    #[test]
    fn nodes_disconnected_long_enough_are_forgotten_and_connected_ones_never() {
        let t0 = Instant::now();
        let status = |streams, gone: Option<u64>| NodeStatus { streams, disconnected_at: gone.map(|s| t0 + Duration::from_secs(s)), ..Default::default() };
        let mut nodes: BTreeMap<String, NodeStatus> =
            [("up", status(1, None)), ("left-recently", status(0, Some(500))), ("left-long-ago", status(0, Some(0)))]
                .into_iter()
                .map(|(n, s)| (n.to_string(), s))
                .collect();
        forget_disconnected(&mut nodes, t0 + Duration::from_secs(700), Duration::from_secs(600));
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["left-recently", "up"]);
        let cache = Cache::new(Duration::ZERO);
        cache.connect("a");
        cache.disconnect("a");
        let a = &cache.node_statuses()["a"];
        assert!(a.streams == 0 && a.disconnected_at.is_some(), "{a:?}");
        cache.connect("a");
        assert_eq!(cache.node_statuses()["a"].disconnected_at, None, "back: connected again");
    }

    fn body(text: &str) -> Any {
        Any { type_url: CLUSTER.into(), value: text.as_bytes().to_vec() }
    }

    fn clusters(items: &[(&str, &str)]) -> Resources {
        let mut r = Resources::new();
        for (name, text) in items {
            r.insert(CLUSTER, name, body(text));
        }
        r
    }

    fn versions(s: &Snapshot, url: &str) -> Vec<(String, u64)> {
        s.entries(url).unwrap().iter().map(|(n, e)| (n.clone(), e.version)).collect()
    }

    #[test]
    fn type_version_is_the_revision_of_the_last_content_change() {
        let s1 = Snapshot::default().next(5, clusters(&[("a", "1")])).unwrap();
        assert_eq!(s1.type_version(CLUSTER), 5);
        let mut same = clusters(&[("a", "1")]);
        same.insert(LISTENER, "l", body("l"));
        let s2 = s1.next(9, same).unwrap();
        assert_eq!(s2.type_version(CLUSTER), 5, "unchanged content keeps its version");
        assert_eq!(s2.type_version(LISTENER), 9);
        let s3 = s2.next(12, clusters(&[("a", "2")])).unwrap();
        assert_eq!(s3.type_version(CLUSTER), 12);
        assert_eq!(s3.type_version(LISTENER), 12, "a type that lost its resources changes version");
        assert_eq!(s3.entries(LISTENER).map(|e| e.len()), Some(0));
        assert_eq!(s3.type_version("type.googleapis.com/weft.v1.Placement"), 0);
    }

    #[test]
    fn removing_one_resource_changes_the_type_version() {
        let s1 = Snapshot::default().next(1, clusters(&[("a", "1"), ("b", "1")])).unwrap();
        let s2 = s1.next(2, clusters(&[("a", "1")])).unwrap();
        assert_eq!(s2.type_version(CLUSTER), 2);
    }

    #[test]
    fn resource_versions_follow_body_changes_or_the_callers_version() {
        let s1 = Snapshot::default().next(1, clusters(&[("a", "1"), ("b", "1")])).unwrap();
        let mut r = clusters(&[("a", "1"), ("b", "2")]);
        r.insert_versioned(CLUSTER, "c", 1, body("c"));
        let s2 = s1.next(3, r).unwrap();
        assert_eq!(versions(&s2, CLUSTER), vec![("a".into(), 1), ("b".into(), 3), ("c".into(), 1)]);
    }

    #[test]
    fn an_unchanged_body_keeps_its_version_whatever_the_caller_offers() {
        let mut r = Resources::new();
        r.insert_versioned(CLUSTER, "eps", 4, body("x"));
        let s1 = Snapshot::default().next(4, r).unwrap();
        // A source of the aggregate was rewritten at 9 without changing the merged body.
        let mut r = Resources::new();
        r.insert_versioned(CLUSTER, "eps", 9, body("x"));
        let s2 = s1.next(9, r).unwrap();
        assert_eq!(versions(&s2, CLUSTER), vec![("eps".into(), 4)]);
        assert_eq!(s2.type_version(CLUSTER), 4);
    }

    #[test]
    fn a_changed_body_never_reuses_an_old_version() {
        let mut r = Resources::new();
        r.insert_versioned(CLUSTER, "eps", 7, body("a+b"));
        let s1 = Snapshot::default().next(7, r).unwrap();
        // The newest source (7) went away; the rest is versioned 5, older than what the
        // client holds: the new content must get a version it has never seen.
        let mut r = Resources::new();
        r.insert_versioned(CLUSTER, "eps", 5, body("a"));
        let s2 = s1.next(10, r).unwrap();
        assert_eq!(versions(&s2, CLUSTER), vec![("eps".into(), 10)]);
    }

    #[test]
    fn same_history_gives_same_versions_on_any_node() {
        let build = || {
            let mut s = Snapshot::default();
            for (rev, text) in [(3, "x"), (4, "x"), (8, "y")] {
                s = s.next(rev, clusters(&[("a", text), ("b", "k")])).unwrap();
            }
            s
        };
        assert_eq!(build(), build());
        assert_eq!(build().type_version(CLUSTER), 8);
        assert_eq!(versions(&build(), CLUSTER), vec![("a".into(), 8), ("b".into(), 3)]);
    }

    #[test]
    fn revisions_never_go_back() {
        let cache = Cache::new(Duration::ZERO);
        cache.set(4, clusters(&[("a", "1")])).unwrap();
        assert_eq!(cache.set(4, clusters(&[])), Err(StaleRevision { current: 4, offered: 4 }));
        assert_eq!(cache.set(2, clusters(&[])).unwrap_err().offered, 2);
        assert_eq!(cache.snapshot().revision(), 4);
        assert_eq!(cache.snapshot().entries(CLUSTER).map(|e| e.len()), Some(1));
    }

    #[test]
    fn set_wakes_watchers_and_stale_sets_do_not() {
        let cache = Cache::new(Duration::ZERO);
        let mut rx = cache.watch();
        assert!(!rx.has_changed().unwrap());
        cache.set(1, clusters(&[("a", "1")])).unwrap();
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().revision(), 1);
        let _ = cache.set(1, clusters(&[]));
        assert!(!rx.has_changed().unwrap());
    }

    #[test]
    fn node_status_records_acks_nacks_and_streams() {
        let cache = Cache::new(Duration::ZERO);
        assert_eq!(cache.connect("n").streams, 1);
        cache.record("n", Feedback::Ack { type_url: CLUSTER.into(), version: "3".into() });
        let nack = Nack { version: 4, error: "bad".into() };
        cache.record("n", Feedback::Nack { type_url: CLUSTER.into(), nack: nack.clone() });
        let status = cache.node_status("n").unwrap();
        assert_eq!(status.acked.get(CLUSTER).map(String::as_str), Some("3"));
        assert_eq!(status.nacked.get(CLUSTER), Some(&nack));
        assert_eq!(cache.connect("n").streams, 2);
        cache.disconnect("n");
        cache.disconnect("n");
        assert_eq!(cache.node_status("n").unwrap().streams, 0);
    }
}

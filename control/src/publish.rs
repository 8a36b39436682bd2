//! Committed state → xDS: every time this node applies new log entries, the config is
//! rebuilt and handed to the xDS cache at the applied index. The cache compares bodies, so
//! only what changed gets a new version, and the debounce in the ADS streams turns a burst of
//! commits into one push per sidecar. Followers publish too, so a sidecar may connect to any
//! node.
//!
//! The publisher keeps a mirror of the stored resources and, after the first full read, reads
//! only the keys the state machine reports as changed, and converts only resources whose
//! revision moved: a write costs the publisher O(changed), not O(all resources).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::resources::{Kind, REGISTRATIONS, XdsBuilder};
use crate::store::{Node, Resource, StoreError};

/// The publisher's view of the stored resources, keyed `(kind, name)`.
#[derive(Default)]
pub struct Publisher {
    mirror: BTreeMap<(String, String), Resource>,
    builder: XdsBuilder,
    /// A refresh failed part way: the changed keys it had taken are gone, so the next one
    /// reads everything (otherwise those resources stayed stale until written again).
    resync: bool,
}

impl Publisher {
    /// A publisher whose Envoy listener binds `envoy_listener` (see [`crate::envoy`]).
    pub fn new(envoy_listener: std::net::SocketAddr) -> Self {
        Publisher { builder: XdsBuilder::new(envoy_listener), ..Default::default() }
    }

    /// Brings the mirror up to date and publishes it. Returns the revision published.
    #[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
    pub fn publish(&mut self, node: &Node, cache: &weft_xds::Cache) -> Result<u64, StoreError> {
        let sm = node.local();
        let (revision, changes) = sm.take_changes()?;
        let everything = changes.everything || std::mem::take(&mut self.resync);
        let refreshed = self.refresh(sm, everything, changes.keys);
        if refreshed.is_err() {
            self.resync = true;
        }
        refreshed?;
        let resources = self.builder.build(self.mirror.values());
        // A revision the cache already has (nothing new applied) is not an error.
        let _ = cache.set(revision, resources);
        Ok(revision)
    }

    /// Brings the mirror up to date: every resource, or only the `changed` keys.
    #[allow(clippy::result_large_err)]
    fn refresh(
        &mut self,
        sm: &crate::store::StateMachineStore,
        everything: bool,
        changed: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), StoreError> {
        let kinds = || Kind::ALL.iter().map(|k| k.as_str()).chain([REGISTRATIONS]);
        if everything {
            self.mirror.clear();
            for kind in kinds() {
                for r in sm.list(kind)? {
                    self.mirror.insert((r.kind.clone(), r.name.clone()), r);
                }
            }
        } else {
            for (kind, name) in changed {
                match sm.get(&kind, &name)? {
                    Some(r) => self.mirror.insert((kind, name), r),
                    None => self.mirror.remove(&(kind, name)),
                };
            }
        }
        Ok(())
    }
}

/// Shortest time between two rebuilds: under a write burst, the commits of this window are
/// published together (a rebuild still walks every resource once).
const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

/// Runs until the node shuts down: publishes whenever the applied index moves.
pub async fn run(node: Arc<Node>, cache: weft_xds::Cache, envoy_listener: std::net::SocketAddr) {
    let mut metrics = node.raft().metrics();
    let mut publisher = Publisher::new(envoy_listener);
    let mut published = 0;
    let mut last = tokio::time::Instant::now() - MIN_INTERVAL;
    loop {
        let applied = metrics.borrow_and_update().last_applied.map(|l| l.index).unwrap_or(0);
        if applied > published {
            tokio::time::sleep_until(last + MIN_INTERVAL).await;
            last = tokio::time::Instant::now();
            match publisher.publish(&node, &cache) {
                Ok(r) => published = r.max(applied),
                Err(e) => tracing::error!(error = %e, "publishing config to xDS failed"),
            }
            continue;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

//! Committed state → xDS: every time this node applies new log entries, the whole config is
//! rebuilt from its state machine and handed to the xDS cache at the applied index. The cache
//! compares bodies, so only what changed gets a new version, and the debounce in the ADS
//! streams turns a burst of commits into one push per sidecar. Followers publish too, so a
//! sidecar may connect to any node.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::resources::{Kind, REGISTRATIONS, xds_resources};
use crate::store::{Node, StoreError};

/// Rebuilds the cache once from the node's current state. Returns the revision published.
#[allow(clippy::result_large_err)] // StoreError wraps openraft's StorageError unchanged
pub fn publish_once(node: &Node, cache: &weft_xds::Cache) -> Result<u64, StoreError> {
    let sm = node.local();
    // Read the index first: the resources read after it are at least that new, and a later
    // round republishes under a larger revision, so versions only move forward.
    let revision = sm.last_applied_index()?;
    let mut state = BTreeMap::new();
    for kind in Kind::ALL.iter().map(|k| k.as_str()).chain([REGISTRATIONS]) {
        state.insert(kind.to_owned(), sm.list(kind)?);
    }
    // A revision the cache already has (nothing new applied) is not an error.
    let _ = cache.set(revision, xds_resources(&state));
    Ok(revision)
}

/// Runs until the node shuts down: publishes whenever the applied index moves.
pub async fn run(node: Arc<Node>, cache: weft_xds::Cache) {
    let mut metrics = node.raft().metrics();
    let mut published = 0;
    loop {
        let applied = metrics.borrow_and_update().last_applied.map(|l| l.index).unwrap_or(0);
        if applied > published {
            match publish_once(&node, &cache) {
                Ok(r) => published = r.max(applied),
                Err(e) => tracing::error!(error = %e, "publishing config to xDS failed"),
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

//! The loop the leader-only engines share (the autoscaler's decisions, the rollout engine):
//! tick every interval while this node leads; while it does not, let the engine forget its
//! in-memory state (a later term starts from what is stored).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::api::AppState;

/// Runs `tick` every `interval` while this node leads and `follow` on every interval it does
/// not, until `stop` turns true. A failed tick is logged and retried at the next interval.
pub async fn every<T, F>(
    st: Arc<AppState>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    what: &'static str,
    follow: impl Fn(&AppState),
    tick: T,
) where
    T: Fn(Arc<AppState>) -> F,
    F: Future<Output = Result<(), String>>,
{
    let mut timer = tokio::time::interval(interval);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        if st.node.leader() != Some(st.node.id()) {
            follow(&st);
            continue;
        }
        if let Err(e) = tick(st.clone()).await {
            tracing::warn!(error = %e, "{what} tick failed; retrying next interval");
        }
    }
}

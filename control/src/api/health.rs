//! What probes and scrapers read: `GET /metrics` (Prometheus text, see `crate::metrics`),
//! `GET /healthz` (the process serves) and `GET /readyz` (this node can answer the API: a
//! leader is known and it has applied what its log holds, within a bound). None needs a token
//! (probes and scrapers seldom carry one; nothing here names a resource).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::metrics::{self, RaftView, XdsView};

/// Paths answered without a token.
pub const OPEN_PATHS: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

/// A follower this far behind its own log is not ready: its local reads would be stale.
const READY_APPLY_LAG: u64 = 1000;

fn raft_view(st: &AppState) -> RaftView {
    let m = st.node.raft().metrics().borrow().clone();
    RaftView {
        id: st.node.id(),
        term: m.current_term,
        leader: m.current_leader.unwrap_or(0),
        last_log_index: m.last_log_index.unwrap_or(0),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        members: m.membership_config.membership().nodes().count() as u64,
    }
}

pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let statuses = st.cache.node_statuses();
    let xds = XdsView {
        connected: statuses.values().filter(|s| s.streams > 0).count() as u64,
        known: statuses.len() as u64,
        revision: st.cache.snapshot().revision(),
        counters: st.cache.counters(),
    };
    let text = metrics::render(&raft_view(&st), &xds, st.node.write_latency(), &st.requests);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let r = raft_view(&st);
    let lag = r.last_log_index.saturating_sub(r.applied_index);
    if r.leader == 0 {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: no leader is known (is a quorum of members up?)\n").into_response()
    } else if lag > READY_APPLY_LAG {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {lag} log entries not applied yet\n")).into_response()
    } else {
        (StatusCode::OK, format!("ready: leader {}, term {}\n", r.leader, r.term)).into_response()
    }
}

/// Counts every answered request by its route template (the outermost layer, so refusals by
/// `authorize` and `leader_gate` count too).
pub async fn count(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let method = req.method().as_str().to_owned();
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let resp = next.run(req).await;
    st.requests.count(&method, &route, resp.status().as_u16());
    resp
}

//! The REST control API (JSON over HTTP/1.1) and the Raft RPC endpoints, on one listener.
//! The contract is in `docs/control-api.md` and served as OpenAPI at `/openapi.json`.
//!
//! - `auth`: bearer tokens and roles (401/403).
//! - `forward`: followers forward writes and linearizable reads to the leader.
//! - `crud`: resources: list/get/put/delete, history, rollback, experiment weights.
//! - `cluster`: members, node status, proxy status, and the `/raft/*` RPCs.
//! - `schedule`: plan and apply placements on the GPU inventory.
//! - `autoscale`: the autoscaler's status and spot preemption notices.
//! - `rollout`: an experiment's per-variant numbers and its rollout; operator commands.
//! - `training`: a training job's shard map; scaling its workers.
//! - `openapi`: the OpenAPI document.
//! - `health`: `/metrics`, `/healthz`, `/readyz`, and the request counter layer.
//!
//! Requests pass two layers before a handler: `authorize` (role by method and path) and
//! `leader_gate` (forward to the leader when this node is not it). Every error is JSON,
//! `{"error": "...", "field": "..."}`, with the status that says who must act.

pub mod auth;
mod autoscale;
mod cluster;
mod crud;
pub mod forward;
mod health;
mod identity;
mod openapi;
mod rollout;
mod training;
pub(crate) mod schedule;

pub use schedule::PlanRequest;
pub(crate) use cluster::{every_nodes_loads, every_nodes_proxies, merge_loads};
pub(crate) use crud::{set_experiment_weights, write_spec};

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::store::{CommandError, Node, NodeId, StoreError};
use auth::{Denied, Role, Tokens};

/// Largest request body accepted by the resource API.
const MAX_BODY: usize = 4 << 20;
/// Largest Raft RPC body (a batch of entries or a snapshot chunk).
const MAX_RAFT_BODY: usize = 64 << 20;
/// How long a request waits for a leader to be elected before it gets a 503.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// What every handler can reach.
pub struct AppState {
    pub node: Arc<Node>,
    pub cache: weft_xds::Cache,
    pub tokens: Tokens,
    pub peers: Arc<forward::Peers>,
    pub reports: Arc<crate::reports::Tracker>,
    /// Held while a schedule apply plans and commits (see `schedule`).
    pub schedule: tokio::sync::Mutex<()>,
    /// The autoscaler's decision state (used while this node leads).
    pub autoscale: crate::scaling::Autoscale,
    /// The rollout engine's memory (used while this node leads).
    pub rollouts: crate::rollouts::Engine,
    /// The training loop's memory (used while this node leads).
    pub training: crate::training::Training,
    /// Trace spans of writes, commits, pushes and ACKs (`--otlp-endpoint`).
    pub spans: Arc<crate::spans::Spans>,
    /// API requests by route and status, for `/metrics`.
    pub requests: crate::metrics::Requests,
    /// The mesh CA and join tokens.
    pub identity: Arc<crate::identity::Authority>,
}

impl AppState {
    fn id(&self) -> NodeId {
        self.node.id()
    }
}

/// An error response: a status and a JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl std::fmt::Display) -> Self {
        Self { status, body: json!({ "error": error.to_string() }) }
    }

    pub fn field(status: StatusCode, field: &str, error: impl std::fmt::Display) -> Self {
        let mut e = Self::new(status, error);
        if !field.is_empty() {
            e.body["field"] = Value::String(field.to_owned());
        }
        e
    }

    pub(crate) fn with(mut self, key: &str, value: Value) -> Self {
        self.body[key] = value;
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.body["error"].as_str() {
            Some(e) => write!(f, "{e} ({})", self.status),
            None => write!(f, "{}", self.status),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Rejected(e @ CommandError::Conflict { .. }) => {
                let actual = match &e {
                    CommandError::Conflict { actual, .. } => *actual,
                    _ => 0,
                };
                ApiError::new(StatusCode::CONFLICT, &e).with("current_revision", json!(actual))
            }
            StoreError::Rejected(e @ CommandError::NotFound { .. }) => ApiError::new(StatusCode::NOT_FOUND, e),
            StoreError::Rejected(e) => ApiError::new(StatusCode::BAD_REQUEST, e),
            e @ StoreError::NotLeader { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{e}; leadership changed, retry"))
            }
            e @ StoreError::Raft(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e),
            e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The role a request needs, from its method and path.
fn needed_role(method: &Method, path: &str) -> Role {
    // Join tokens mint identities: listing them is an operator's, making or revoking one an
    // admin's.
    let admin_writes = path.starts_with("/v1/members") || path.starts_with("/v1/identity/");
    if path.starts_with("/v1/identity/tokens") && method == Method::GET {
        return Role::Operator;
    }
    if path.starts_with("/raft/") || path.starts_with("/internal/") || (admin_writes && method != Method::GET) {
        Role::Admin
    } else if method == Method::GET || method == Method::HEAD {
        Role::Viewer
    } else {
        Role::Operator
    }
}

async fn authorize(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/openapi.json" || health::OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let needed = needed_role(req.method(), req.uri().path());
    let header = req.headers().get(http::header::AUTHORIZATION).map(|v| v.as_bytes());
    match st.tokens.check(header, needed) {
        Ok(()) => next.run(req).await,
        Err(Denied::Unauthenticated(why)) => {
            let mut r = ApiError::new(StatusCode::UNAUTHORIZED, why).into_response();
            r.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
            r
        }
        Err(Denied::Forbidden { name, role, needed }) => ApiError::new(
            StatusCode::FORBIDDEN,
            format!("token {name:?} has role {role:?}; this needs {needed:?}"),
        )
        .into_response(),
    }
}

/// Whether the request must run on the leader: writes, and reads that did not opt out of
/// linearizability. Node-local views (status, members, proxies) answer anywhere.
fn needs_leader(req: &Request) -> bool {
    let path = req.uri().path();
    if path.starts_with("/internal/") {
        return true;
    }
    if !path.starts_with("/v1/") || path == "/v1/status" || path.starts_with("/v1/proxies") || path == "/v1/load" {
        return false;
    }
    if req.method() == Method::GET {
        let local = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "consistency=local"));
        return !local && !path.starts_with("/v1/members");
    }
    true
}

/// Waits (bounded) until some leader is known.
async fn current_leader(node: &Node) -> Option<NodeId> {
    let mut metrics = node.raft().metrics();
    let wait = async {
        loop {
            if let Some(l) = metrics.borrow_and_update().current_leader {
                return Some(l);
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    };
    tokio::time::timeout(LEADER_WAIT, wait).await.ok().flatten()
}

async fn leader_gate(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !needs_leader(&req) {
        return next.run(req).await;
    }
    let Some(leader) = current_leader(&st.node).await else {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no leader is known (is a quorum of members up?)")
            .into_response();
    };
    if leader == st.id() {
        return next.run(req).await;
    }
    if req.headers().contains_key(forward::FORWARDED_BY) {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("forwarded to node {} which is not the leader (node {leader} is); retry", st.id()),
        )
        .into_response();
    }
    let Some(member) = st.node.member(leader) else {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("leader {leader} has no known address"))
            .into_response();
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e).into_response(),
    };
    match st.peers.forward(&member.addr, Some(st.id()), &parts, body).await {
        Ok(r) => r,
        Err(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

async fn not_found(req: Request<Body>) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no such endpoint: {} {}", req.method(), req.uri().path()))
}

/// The whole HTTP surface of a control node.
pub fn router(state: Arc<AppState>) -> Router {
    let raft = Router::new()
        .route(crate::transport::APPEND_PATH, post(cluster::raft_append))
        .route(crate::transport::VOTE_PATH, post(cluster::raft_vote))
        .route(crate::transport::SNAPSHOT_PATH, post(cluster::raft_snapshot))
        .layer(DefaultBodyLimit::max(MAX_RAFT_BODY));
    let api = Router::new()
        .route("/openapi.json", get(openapi::document))
        .route("/metrics", get(health::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/v1/status", get(cluster::status))
        .route("/v1/members", get(cluster::members).post(cluster::add_member))
        .route("/v1/members/{id}", axum::routing::delete(cluster::remove_member))
        .route("/v1/proxies", get(cluster::proxies))
        .route("/v1/load", get(cluster::load))
        .route("/internal/write", post(cluster::internal_write))
        .route("/v1/experiments/{name}/weights", post(crud::set_weights))
        .route("/v1/schedule/plan", post(schedule::plan))
        .route("/v1/schedule/apply", post(schedule::apply))
        .route("/v1/autoscale/status", get(autoscale::status))
        .route("/v1/autoscale/preemption", post(autoscale::preemption))
        .route("/v1/rollout/{name}", get(rollout::status))
        .route("/v1/rollout/{name}/{action}", post(rollout::command))
        .route("/v1/training/{name}", get(training::status))
        .route("/v1/training/{name}/scale", post(training::scale))
        .route("/v1/training/{name}/checkpoint", post(training::checkpoint))
        .route("/v1/identity/ca", get(identity::ca))
        .route("/v1/identity/tokens", get(identity::list).post(identity::create))
        .route("/v1/identity/tokens/{id}", axum::routing::delete(identity::revoke))
        .route("/v1/{kind}", get(crud::list))
        .route("/v1/{kind}/{name}", get(crud::get).put(crud::put).delete(crud::delete))
        .route("/v1/{kind}/{name}/history", get(crud::history))
        .route("/v1/{kind}/{name}/rollback", post(crud::rollback))
        .layer(DefaultBodyLimit::max(MAX_BODY));
    raft.merge(api)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), leader_gate))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), health::count))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_by_route() {
        assert_eq!(needed_role(&Method::GET, "/v1/services"), Role::Viewer);
        assert_eq!(needed_role(&Method::PUT, "/v1/services/a"), Role::Operator);
        assert_eq!(needed_role(&Method::GET, "/v1/members"), Role::Viewer);
        assert_eq!(needed_role(&Method::POST, "/v1/members"), Role::Admin);
        assert_eq!(needed_role(&Method::POST, "/raft/append"), Role::Admin);
        assert_eq!(needed_role(&Method::POST, "/v1/identity/tokens"), Role::Admin);
        assert_eq!(needed_role(&Method::DELETE, "/v1/identity/tokens/abc"), Role::Admin);
        assert_eq!(needed_role(&Method::GET, "/v1/identity/tokens"), Role::Operator);
        assert_eq!(needed_role(&Method::GET, "/v1/identity/ca"), Role::Viewer);
    }

    #[test]
    fn which_requests_go_to_the_leader() {
        let r = |m: Method, uri: &str| Request::builder().method(m).uri(uri).body(Body::empty()).unwrap();
        assert!(needs_leader(&r(Method::GET, "/v1/services")));
        assert!(!needs_leader(&r(Method::GET, "/v1/services?consistency=local")));
        assert!(needs_leader(&r(Method::PUT, "/v1/services/a")));
        assert!(needs_leader(&r(Method::POST, "/v1/members")));
        assert!(!needs_leader(&r(Method::GET, "/v1/members")));
        assert!(!needs_leader(&r(Method::GET, "/v1/status")));
        assert!(!needs_leader(&r(Method::POST, "/raft/append")));
        assert!(needs_leader(&r(Method::POST, "/internal/write")));
    }
}

//! Raft RPCs between control nodes: HTTP/1.1 with JSON bodies, served on the same listener as
//! the REST API (`POST /raft/append`, `/raft/vote`, `/raft/snapshot`; see `api::raft`).
//!
//! Why HTTP and JSON rather than a gRPC service: the API listener already exists on every node,
//! the messages are openraft's own serde types (no second schema to keep in step), and a
//! replication stream to one peer is strictly sequential, so one keep-alive connection per peer
//! carries it without head-of-line cost. A batch of log entries is one request, so the per-RPC
//! overhead is paid per batch, not per write.
//!
//! Errors map onto openraft's retry semantics: no connection → `Unreachable` (openraft backs
//! off), a broken connection or an HTTP error → `Network` (retried at once on a new
//! connection), no answer within the RPC's TTL → `Timeout`, a Raft error on the peer →
//! `RemoteError`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::RPCTypes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::{Member, NodeId, TypeConfig};

/// Path of each RPC on the API listener.
pub const APPEND_PATH: &str = "/raft/append";
pub const VOTE_PATH: &str = "/raft/vote";
pub const SNAPSHOT_PATH: &str = "/raft/snapshot";
/// The node id an RPC is meant for. A node refuses RPCs for another id: a member registered
/// with a wrong address must not make a node take its own leader's messages (openraft
/// asserts on that).
pub const TARGET_HEADER: &str = "x-weft-raft-target";

/// Hands out one [`HttpPeer`] per target; `token` is sent as a bearer token when the cluster
/// runs with authentication (peers need the `admin` role).
#[derive(Clone, Default)]
pub struct HttpNetwork {
    token: Option<Arc<str>>,
    dialer: crate::tls::dial::Dialer,
}

impl HttpNetwork {
    /// `dialer` opens the connections (TLS when the cluster runs it).
    pub fn new(token: Option<String>, dialer: crate::tls::dial::Dialer) -> Self {
        Self {
            token: token.map(Arc::from),
            dialer,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetwork {
    type Network = HttpPeer;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> HttpPeer {
        HttpPeer {
            id: 0,
            target,
            addr: node.addr.clone(),
            token: self.token.clone(),
            dialer: self.dialer.clone(),
            conn: None,
            down: false,
        }
    }
}

/// The client side of the RPCs to one peer, over one reused connection.
pub struct HttpPeer {
    /// Unknown to the factory; only used to fill openraft's `Timeout` error.
    id: NodeId,
    target: NodeId,
    addr: String,
    token: Option<Arc<str>>,
    dialer: crate::tls::dial::Dialer,
    conn: Option<SendRequest<Full<Bytes>>>,
    /// Whether the last call failed, so a peer going down or coming back is logged once
    /// (openraft's own replication errors, logged on every retry, are filtered by default).
    down: bool,
}

/// How one call failed, before it is typed into openraft's error for that RPC.
enum CallError {
    Unreachable(std::io::Error),
    Network(String),
    Timeout(Duration),
}

impl HttpPeer {
    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, CallError> {
        if self.conn.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(self.conn.as_mut().expect("checked above"));
        }
        let stream = self.dialer.connect(&self.addr).await.map_err(|e| match e {
            crate::tls::dial::DialError::Connect(e) => CallError::Unreachable(e),
            // The peer is there but one side refused the other: retried like a broken
            // connection, and logged as such.
            crate::tls::dial::DialError::Tls(e) => CallError::Network(format!("{}: TLS: {e}", self.addr)),
        })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| CallError::Network(format!("handshake with {}: {e}", self.addr)))?;
        tokio::spawn(conn);
        Ok(self.conn.insert(sender))
    }

    /// POSTs `body` as JSON to `path` and decodes the peer's `Result<Resp, E>`.
    async fn call<Req, Resp>(&mut self, path: &str, body: &Req, ttl: Duration) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let json = serde_json::to_vec(body).map_err(|e| CallError::Network(format!("encoding: {e}")))?;
        let fut = async {
            let mut req = http::Request::post(path)
                .header(http::header::HOST, self.addr.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(TARGET_HEADER, self.target);
            if let Some(t) = &self.token {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = req
                .body(Full::new(Bytes::from(json)))
                .map_err(|e| CallError::Network(e.to_string()))?;
            let addr = self.addr.clone();
            let sender = self.connect().await?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| CallError::Network(format!("{addr}{path}: {e}")))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| CallError::Network(format!("{addr}{path}: reading body: {e}")))?
                .to_bytes();
            if !status.is_success() {
                let text = String::from_utf8_lossy(&bytes);
                return Err(CallError::Network(format!("{addr}{path}: HTTP {status}: {text}")));
            }
            serde_json::from_slice(&bytes)
                .map_err(|e| CallError::Network(format!("{addr}{path}: bad response: {e}")))
        };
        let out = match tokio::time::timeout(ttl, fut).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(ttl)),
        };
        match &out {
            Err(e) => {
                // The connection may hold a half-finished exchange: never reuse it.
                self.conn = None;
                if !self.down {
                    let why = match e {
                        CallError::Unreachable(io) => io.to_string(),
                        CallError::Network(m) => m.clone(),
                        CallError::Timeout(t) => format!("no answer within {t:?}"),
                    };
                    tracing::warn!(peer = self.target, addr = %self.addr, error = %why, "raft peer unreachable");
                    self.down = true;
                }
            }
            Ok(_) if self.down => {
                tracing::info!(peer = self.target, addr = %self.addr, "raft peer reachable again");
                self.down = false;
            }
            Ok(_) => {}
        }
        out
    }

    fn typed<E: std::error::Error>(&self, e: CallError, action: RPCTypes) -> RPCError<NodeId, Member, E> {
        match e {
            CallError::Unreachable(io) => RPCError::Unreachable(Unreachable::new(&io)),
            CallError::Network(msg) => RPCError::Network(NetworkError::new(&std::io::Error::other(msg))),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.id,
                target: self.target,
                timeout,
            }),
        }
    }

    async fn rpc<Req, Resp, E>(
        &mut self,
        path: &str,
        action: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        match self.call::<Req, Result<Resp, RaftError<NodeId, E>>>(path, req, option.hard_ttl()).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(self.target, remote))),
            Err(e) => Err(self.typed(e, action)),
        }
    }
}

impl RaftNetwork<TypeConfig> for HttpPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.id = rpc.vote.leader_id().voted_for().unwrap_or_default();
        self.rpc(APPEND_PATH, RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.id = rpc.vote.leader_id().voted_for().unwrap_or_default();
        self.rpc(SNAPSHOT_PATH, RPCTypes::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.id = rpc.vote.leader_id().voted_for().unwrap_or_default();
        self.rpc(VOTE_PATH, RPCTypes::Vote, &rpc, &option).await
    }

    /// A dead peer is retried every 200 ms: short enough that a restarted node catches up
    /// quickly, long enough not to spin on connection refusals.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

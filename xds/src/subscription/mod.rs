//! The sidecar's side of xDS as a pure state machine, one per stream mode. It tracks, per type
//! URL, what the client subscribed to, which version it last accepted and the nonce of the
//! last response, and turns each event (subscribe, response + verdict, reconnect) into the
//! request to send. The IO loop validates resources and sends what it is told, so every
//! protocol rule is testable without a socket (the openraft "engine returns commands" split).

mod delta;
mod sotw;

pub use delta::DeltaClient;
pub use sotw::SotwClient;

use std::fmt;

use crate::transport::{Node, RpcStatus};

/// The client's judgement of a response: `Ok` applies it (ACK), `Err` keeps the previous
/// config and reports why (NACK).
pub type Verdict = Result<(), String>;

/// A response for a type URL the client never subscribed to. The caller should ignore it:
/// answering would tell the server we accepted or rejected something we never asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsolicited(pub String);

impl fmt::Display for Unsolicited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "response for unsubscribed type {}", self.0)
    }
}

impl std::error::Error for Unsolicited {}

/// gRPC code INVALID_ARGUMENT: the pushed config is what was wrong.
const INVALID_ARGUMENT: i32 = 3;

/// The `error_detail` of a NACK.
fn nack_detail(message: String) -> RpcStatus {
    RpcStatus { code: INVALID_ARGUMENT, message, details: vec![] }
}

/// The node identity goes in the first request of a stream only: the server remembers it for
/// the stream's life, and repeating it on every ACK would only cost bytes.
#[derive(Debug, Clone)]
struct NodeOnce {
    node: Node,
    sent: bool,
}

impl NodeOnce {
    fn new(node: Node) -> Self {
        NodeOnce { node, sent: false }
    }

    fn take(&mut self) -> Option<Node> {
        (!std::mem::replace(&mut self.sent, true)).then(|| self.node.clone())
    }

    /// A new stream must identify itself again.
    fn reset(&mut self) {
        self.sent = false;
    }
}

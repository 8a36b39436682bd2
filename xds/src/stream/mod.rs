//! The server side of one ADS stream, as pure state: given a client request or a new snapshot,
//! what to send back and what the client just told us (ACK/NACK). The rules shared by both
//! modes:
//!
//! - At most one unanswered push per type: the next one waits for the ACK or NACK, so the
//!   client never has to reason about overlapping versions and a NACK maps to one push.
//! - A NACKed type version (or an older one) is never pushed to that node again; the next push
//!   waits for content with a newer version. The NACK is remembered per node across streams.
//! - A request whose nonce is not the one of the unanswered push is stale and ignored.
//! - Nothing is sent before the first revision is committed (revision 0).
//!
//! [`crate::ads_server`] runs these over gRPC; tests drive them directly.

mod delta;
mod sotw;

pub use delta::Delta;
pub use sotw::Sotw;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry as MapEntry;

use tonic::Status;

use crate::cache::{Feedback, Nack, NodeStatus, Snapshot};
use crate::transport::RpcStatus;

/// The server side of a State-of-the-World stream.
pub type SotwStream = AdsStream<Sotw>;
/// The server side of a Delta stream.
pub type DeltaStream = AdsStream<Delta>;

/// What a stream answers to one request.
#[derive(Debug)]
pub struct Reply<R> {
    /// The client's ACK or NACK of our last push, if the request carried one.
    pub feedback: Option<Feedback>,
    /// Responses to send, in order.
    pub responses: Vec<R>,
}

impl<R> Default for Reply<R> {
    fn default() -> Self {
        Reply { feedback: None, responses: Vec::new() }
    }
}

/// What differs between State-of-the-World and Delta: the messages, the per-type state and
/// the rules for reading a request and deciding a push. Everything else (type dispatch,
/// nonces, NACK memory across streams) is [`AdsStream`]'s.
pub trait Mode: Send + 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    type TypeState: Send + std::fmt::Debug;

    /// The node id a request carries (the first request of a stream must carry one).
    fn node_id(request: &Self::Request) -> Option<&str>;
    fn type_url(request: &Self::Request) -> &str;
    /// A response's type URL and version (for [`crate::cache::Observer`]).
    fn describe(response: &Self::Response) -> (&str, &str);
    /// State for the first request of a type on this stream. `nacked` is the type version
    /// the node NACKed before (on any stream), which is not to be pushed again.
    fn open(request: &mut Self::Request, nacked: Option<u64>) -> Self::TypeState;
    /// Applies a request to its type's state; returns the ACK or NACK it carried.
    fn on_request(state: &mut Self::TypeState, request: Self::Request) -> Option<Feedback>;
    /// The push `state` calls for at `snapshot`, if any.
    fn push(
        state: &mut Self::TypeState,
        type_url: &str,
        snapshot: &Snapshot,
        nonces: &mut Nonces,
    ) -> Option<Self::Response>;
}

/// One ADS stream's server state, free of IO: per type URL, what the client has and what was
/// pushed. [`crate::ads_server`] feeds it requests and snapshots; tests do the same directly.
#[derive(Debug)]
pub struct AdsStream<M: Mode> {
    types: BTreeMap<String, M::TypeState>,
    nonces: Nonces,
}

impl<M: Mode> Default for AdsStream<M> {
    fn default() -> Self {
        AdsStream { types: BTreeMap::new(), nonces: Nonces::default() }
    }
}

impl<M: Mode> AdsStream<M> {
    /// Handles a client request against the current snapshot. `prior` is what the node
    /// reported before this stream opened. A malformed request is an error that ends the
    /// stream with that status.
    pub fn on_request(
        &mut self,
        mut request: M::Request,
        snapshot: &Snapshot,
        prior: &NodeStatus,
    ) -> Result<Reply<M::Response>, Status> {
        let type_url = M::type_url(&request).to_owned();
        check_type(&type_url)?;
        let state = match self.types.entry(type_url.clone()) {
            MapEntry::Occupied(e) => e.into_mut(),
            MapEntry::Vacant(e) => e.insert(M::open(&mut request, prior.nacked.get(&type_url).map(|n| n.version))),
        };
        let feedback = M::on_request(state, request);
        let responses = M::push(state, &type_url, snapshot, &mut self.nonces).into_iter().collect();
        Ok(Reply { feedback, responses })
    }

    /// A new revision was published: the pushes it calls for.
    pub fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<M::Response> {
        let nonces = &mut self.nonces;
        self.types.iter_mut().filter_map(|(url, state)| M::push(state, url, snapshot, nonces)).collect()
    }
}

/// Refuses a request for a type URL this server does not serve (or none), naming the types it
/// does. The stream ends with this status, which an Envoy logs as a config stream error.
pub fn check_type(type_url: &str) -> Result<(), Status> {
    if type_url.is_empty() {
        return Err(Status::invalid_argument("request has no type_url"));
    }
    if !crate::typeurl::served(type_url) {
        return Err(Status::invalid_argument(format!(
            "type URL {type_url:?} is not served by this control plane; it serves: {}",
            crate::typeurl::ALL.iter().chain(crate::typeurl::envoy::ALL).copied().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

/// Nonces unique within a stream (a nonce only has to identify a response on its stream).
#[derive(Debug, Default)]
pub struct Nonces(u64);

impl Nonces {
    fn next(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

/// The push that is waiting for its ACK or NACK.
#[derive(Debug, Clone)]
struct InFlight<S> {
    nonce: String,
    /// Type version it carried.
    version: u64,
    /// Mode-specific state to restore on NACK.
    before: S,
}

/// How a request relates to the unanswered push of its type.
enum Answer<S> {
    /// No nonce: a subscription request, not an answer.
    Subscription,
    /// A nonce other than the unanswered push's: an answer to an older push, ignored.
    Stale,
    /// The ACK or NACK of the unanswered push, which is returned.
    Answered(Feedback, InFlight<S>),
}

/// Matches a request's nonce against the unanswered push and turns the answer into feedback.
/// The version reported is the one the server pushed, not what the client claims.
fn answer<S>(in_flight: &mut Option<InFlight<S>>, type_url: &str, nonce: &str, error: Option<&RpcStatus>) -> Answer<S> {
    if nonce.is_empty() {
        return Answer::Subscription;
    }
    let Some(push) = in_flight.take_if(|f| f.nonce == nonce) else {
        return Answer::Stale;
    };
    let type_url = type_url.to_owned();
    let feedback = match error {
        Some(status) => {
            Feedback::Nack { type_url, nack: Nack { version: push.version, error: status.message.clone() } }
        }
        None => Feedback::Ack { type_url, version: push.version.to_string() },
    };
    Answer::Answered(feedback, push)
}

/// Whether a push of `version` is allowed after a NACK of `nacked`.
fn past_nack(nacked: Option<u64>, version: u64) -> bool {
    nacked.is_none_or(|n| version > n)
}

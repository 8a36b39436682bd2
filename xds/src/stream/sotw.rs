//! State-of-the-World server stream: each push carries every subscribed resource of a type at
//! the type's version; the client's `version_info` says what it runs, so a reconnecting client
//! that already runs the current version gets nothing until the next change.

use std::time::{Duration, Instant};

use super::{Answer, InFlight, Mode, Nonces, answer, past_nack};
use crate::cache::{Feedback, Snapshot};
use crate::transport::{DiscoveryRequest, DiscoveryResponse};

/// The State-of-the-World [`Mode`].
#[derive(Debug)]
pub enum Sotw {}

#[derive(Debug, Default)]
pub struct TypeState {
    /// Subscribed names; empty = every resource of the type.
    names: Vec<String>,
    /// The version the client said it runs.
    client_version: String,
    in_flight: Option<InFlight<()>>,
    nacked: Option<u64>,
    /// The subscription changed: answer even if the version did not.
    names_changed: bool,
    /// Since when the client has run a newer version than this node has (see [`AHEAD_LIMIT`]).
    ahead_since: Option<Instant>,
}

/// How long a node that lags behind a client's version holds its older config back. Versions
/// are revisions of the one Raft log, so a client ahead of this node got them from a node
/// further along (it failed over from the leader to a follower still catching up): pushing
/// now would roll it back. Past this limit the node pushes anyway: a client ahead for that long
/// is taken to have known a control plane that was since rebuilt, whose revisions started over.
pub const AHEAD_LIMIT: Duration = Duration::from_secs(60);

/// Whether to hold back this node's `version` of a type from the client, which runs
/// `state.client_version`.
fn hold_back(state: &mut TypeState, version: u64, revision: u64) -> bool {
    let Ok(theirs) = state.client_version.parse::<u64>() else { return false };
    if theirs <= version {
        return false;
    }
    if revision >= theirs {
        // This node has seen the client's revision and the type has not changed since its own
        // `version`: the client already runs this content.
        return true;
    }
    let since = *state.ahead_since.get_or_insert_with(Instant::now);
    since.elapsed() < AHEAD_LIMIT
}

impl Mode for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    type TypeState = TypeState;

    fn node_id(request: &DiscoveryRequest) -> Option<&str> {
        request.node.as_ref().map(|n| n.id.as_str())
    }

    fn describe(response: &DiscoveryResponse) -> (&str, &str) {
        (&response.type_url, &response.version_info)
    }

    fn type_url(request: &DiscoveryRequest) -> &str {
        &request.type_url
    }

    fn open(request: &mut DiscoveryRequest, nacked: Option<u64>) -> TypeState {
        TypeState { names: request.resource_names.clone(), nacked, ..Default::default() }
    }

    fn on_request(state: &mut TypeState, request: DiscoveryRequest) -> Option<Feedback> {
        let error = request.error_detail.as_ref();
        let feedback = match answer(&mut state.in_flight, &request.type_url, &request.response_nonce, error) {
            Answer::Stale => return None,
            Answer::Subscription => None,
            Answer::Answered(feedback, push) => {
                if matches!(feedback, Feedback::Nack { .. }) {
                    state.nacked = Some(push.version);
                }
                Some(feedback)
            }
        };
        state.client_version = request.version_info;
        if state.names != request.resource_names {
            state.names = request.resource_names;
            state.names_changed = true;
        }
        feedback
    }

    fn push(
        state: &mut TypeState,
        type_url: &str,
        snapshot: &Snapshot,
        nonces: &mut Nonces,
    ) -> Option<DiscoveryResponse> {
        let version = snapshot.type_version(type_url);
        if snapshot.revision() == 0 || state.in_flight.is_some() || !past_nack(state.nacked, version) {
            return None;
        }
        let version_info = version.to_string();
        if !state.names_changed
            && (state.client_version == version_info
                || hold_back(state, version, snapshot.revision()))
        {
            return None;
        }
        state.names_changed = false;
        state.ahead_since = None;
        let resources = snapshot
            .entries(type_url)
            .into_iter()
            .flatten()
            .filter(|(name, _)| state.names.is_empty() || state.names.contains(name))
            .map(|(_, entry)| entry.body.clone())
            .collect();
        let nonce = nonces.next();
        state.in_flight = Some(InFlight { nonce: nonce.clone(), version, before: () });
        Some(DiscoveryResponse { version_info, resources, type_url: type_url.to_owned(), nonce, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Nack, NodeStatus, Resources};
    use crate::stream::{Reply, SotwStream};
    use crate::transport::{Any, RpcStatus, node};
    use crate::typeurl::{CLUSTER, LISTENER};

    fn snapshot(prev: &Snapshot, revision: u64, clusters: &[(&str, &str)], listeners: &[&str]) -> Snapshot {
        let mut r = Resources::new();
        for (name, text) in clusters {
            r.insert(CLUSTER, name, Any { type_url: CLUSTER.into(), value: text.as_bytes().to_vec() });
        }
        for name in listeners {
            r.insert(LISTENER, name, Any { type_url: LISTENER.into(), value: name.as_bytes().to_vec() });
        }
        prev.next(revision, r).unwrap()
    }

    fn request(type_url: &str, version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(node("n")),
            type_url: type_url.into(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn nack(version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            error_detail: Some(RpcStatus { code: 3, message: "rejected".into(), details: vec![] }),
            ..request(CLUSTER, version, nonce)
        }
    }

    fn one(reply: Reply<DiscoveryResponse>) -> DiscoveryResponse {
        assert_eq!(reply.responses.len(), 1, "expected one push: {reply:?}");
        reply.responses.into_iter().next().unwrap()
    }

    #[test]
    fn first_request_gets_the_current_version_then_ack_is_reported() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("b", "1")], &[]);
        let mut st = SotwStream::default();
        let push = one(st.on_request(request(CLUSTER, "", ""), &s1, &NodeStatus::default()).unwrap());
        assert_eq!((push.version_info.as_str(), push.resources.len()), ("1", 2));
        let ack = st.on_request(request(CLUSTER, "1", &push.nonce), &s1, &NodeStatus::default()).unwrap();
        assert_eq!(ack.feedback, Some(Feedback::Ack { type_url: CLUSTER.into(), version: "1".into() }));
        assert!(ack.responses.is_empty(), "nothing new to push after an ACK");
    }

    #[test]
    fn a_node_behind_the_client_does_not_roll_it_back() {
        // The client ran clusters at version 9 on another node; this one is still at revision 6.
        let s6 = snapshot(&Snapshot::default(), 6, &[("a", "old")], &[]);
        let mut st = SotwStream::default();
        let reply = st.on_request(request(CLUSTER, "9", ""), &s6, &NodeStatus::default()).unwrap();
        assert!(reply.responses.is_empty(), "version 6 would roll the client back: {reply:?}");
        // Caught up to revision 9, where clusters last changed at 9: the client runs that.
        let s9 = snapshot(&s6, 9, &[("a", "new")], &[]);
        assert!(st.on_snapshot(&s9).is_empty(), "the client already runs version 9");
        // Caught up past it without a cluster change (clusters stay at 9), then a new change.
        let s11 = snapshot(&s9, 11, &[("a", "new")], &["l"]);
        assert!(st.on_snapshot(&s11).is_empty());
        let s12 = snapshot(&s11, 12, &[("a", "newer")], &["l"]);
        assert_eq!(one(Reply { feedback: None, responses: st.on_snapshot(&s12) }).version_info, "12");
    }

    #[test]
    fn a_client_ahead_with_the_same_content_gets_nothing() {
        // Another node versioned the same clusters at 12 (its first snapshot after a restart);
        // this node has them at 5 and is at revision 14: nothing to send.
        let s14 = snapshot(&snapshot(&Snapshot::default(), 5, &[("a", "1")], &[]), 14, &[("a", "1")], &["l"]);
        let mut st = SotwStream::default();
        let reply = st.on_request(request(CLUSTER, "12", ""), &s14, &NodeStatus::default()).unwrap();
        assert!(reply.responses.is_empty(), "{reply:?}");
        // A client with no version, or an opaque one, gets the push as before.
        let mut fresh = SotwStream::default();
        assert_eq!(one(fresh.on_request(request(CLUSTER, "", ""), &s14, &NodeStatus::default()).unwrap()).version_info, "5");
    }

    #[test]
    fn subscribed_names_filter_resources() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("b", "1")], &[]);
        let mut st = SotwStream::default();
        let mut req = request(CLUSTER, "", "");
        req.resource_names = vec!["b".into()];
        let push = one(st.on_request(req, &s1, &NodeStatus::default()).unwrap());
        assert_eq!(push.resources, vec![Any { type_url: CLUSTER.into(), value: b"1".to_vec() }]);
    }

    #[test]
    fn nothing_is_sent_before_the_first_revision() {
        let mut st = SotwStream::default();
        let reply = st.on_request(request(CLUSTER, "", ""), &Snapshot::default(), &NodeStatus::default()).unwrap();
        assert!(reply.responses.is_empty());
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        assert_eq!(st.on_snapshot(&s1).len(), 1);
    }

    #[test]
    fn one_push_in_flight_per_type() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        let s2 = snapshot(&s1, 2, &[("a", "2")], &[]);
        let mut st = SotwStream::default();
        let p1 = one(st.on_request(request(CLUSTER, "", ""), &s1, &NodeStatus::default()).unwrap());
        assert!(st.on_snapshot(&s2).is_empty(), "the push of version 1 is unanswered");
        let p2 = one(st.on_request(request(CLUSTER, "1", &p1.nonce), &s2, &NodeStatus::default()).unwrap());
        assert_eq!(p2.version_info, "2");
        assert_ne!(p1.nonce, p2.nonce);
    }

    #[test]
    fn nacked_version_is_not_pushed_again_but_the_next_one_is() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        let s2 = snapshot(&s1, 2, &[("a", "bad")], &[]);
        let s3 = snapshot(&s2, 3, &[("a", "bad")], &["l"]);
        let s4 = snapshot(&s3, 4, &[("a", "good")], &["l"]);
        let prior = NodeStatus::default();
        let mut st = SotwStream::default();
        let p1 = one(st.on_request(request(CLUSTER, "", ""), &s1, &prior).unwrap());
        st.on_request(request(CLUSTER, "1", &p1.nonce), &s1, &prior).unwrap();
        let p2 = st.on_snapshot(&s2).pop().unwrap();
        let reply = st.on_request(nack("1", &p2.nonce), &s2, &prior).unwrap();
        let expected = Nack { version: 2, error: "rejected".into() };
        assert_eq!(reply.feedback, Some(Feedback::Nack { type_url: CLUSTER.into(), nack: expected }));
        assert!(reply.responses.is_empty(), "no immediate re-push of the rejected version");
        assert!(st.on_snapshot(&s3).is_empty(), "revision 3 leaves clusters at the NACKed version 2");
        let p4 = st.on_snapshot(&s4).pop().expect("newer content is pushed");
        assert_eq!(p4.version_info, "4");
    }

    #[test]
    fn a_nack_from_an_earlier_stream_is_honoured() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "bad")], &[]);
        let mut prior = NodeStatus::default();
        prior.nacked.insert(CLUSTER.into(), Nack { version: 1, error: "bad".into() });
        let mut st = SotwStream::default();
        let reply = st.on_request(request(CLUSTER, "", ""), &s1, &prior).unwrap();
        assert!(reply.responses.is_empty());
        let s2 = snapshot(&s1, 2, &[("a", "good")], &[]);
        assert_eq!(st.on_snapshot(&s2).len(), 1);
    }

    #[test]
    fn reconnect_at_the_current_version_gets_no_push() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        let s2 = snapshot(&s1, 2, &[("a", "1")], &["l"]);
        let mut st = SotwStream::default();
        let reply = st.on_request(request(CLUSTER, "1", ""), &s2, &NodeStatus::default()).unwrap();
        assert!(reply.responses.is_empty(), "the client already runs cluster version 1");
        let stale = st.on_request(request(LISTENER, "1", ""), &s2, &NodeStatus::default()).unwrap();
        assert_eq!(one(stale).version_info, "2", "a client behind gets the current version");
    }

    #[test]
    fn stale_nonces_are_ignored() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        let mut st = SotwStream::default();
        let p1 = one(st.on_request(request(CLUSTER, "", ""), &s1, &NodeStatus::default()).unwrap());
        let reply = st.on_request(nack("", "not-a-nonce"), &s1, &NodeStatus::default()).unwrap();
        assert!(reply.feedback.is_none() && reply.responses.is_empty());
        let ack = st.on_request(request(CLUSTER, "1", &p1.nonce), &s1, &NodeStatus::default()).unwrap();
        assert!(matches!(ack.feedback, Some(Feedback::Ack { .. })), "the real push is still answerable");
    }

    #[test]
    fn changing_names_is_answered_at_the_same_version() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("b", "1")], &[]);
        let mut st = SotwStream::default();
        let mut req = request(CLUSTER, "", "");
        req.resource_names = vec!["a".into()];
        let p1 = one(st.on_request(req.clone(), &s1, &NodeStatus::default()).unwrap());
        req.version_info = "1".into();
        req.response_nonce = p1.nonce;
        req.resource_names = vec!["a".into(), "b".into()];
        let p2 = one(st.on_request(req, &s1, &NodeStatus::default()).unwrap());
        assert_eq!((p2.version_info.as_str(), p2.resources.len()), ("1", 2));
    }

    #[test]
    fn a_request_without_type_url_is_an_error() {
        let mut st = SotwStream::default();
        let err = st.on_request(request("", "", ""), &Snapshot::default(), &NodeStatus::default()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    /// The fault Envoy users hit: a type this server does not serve was answered with an empty
    /// success at version "0", so the client looked healthy holding no config.
    #[test]
    fn a_type_this_server_does_not_serve_is_an_error_not_an_empty_success() {
        let mut st = SotwStream::default();
        let made_up = "type.googleapis.com/example.v1.Nothing";
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")], &[]);
        let err = st.on_request(request(made_up, "", ""), &s1, &NodeStatus::default()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(made_up) && err.message().contains(CLUSTER), "{}", err.message());
    }
}

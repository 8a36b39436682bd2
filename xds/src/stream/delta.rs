//! Delta server stream: the server tracks which resource versions the client holds and sends
//! only the resources that differ and the names that went away. A NACK restores the tracked
//! versions to what they were before the rejected push, so the next push (at a newer type
//! version) carries everything the client still lacks.

use std::collections::{BTreeMap, BTreeSet};

use super::{Answer, InFlight, Mode, Nonces, answer, past_nack};
use crate::cache::{Feedback, Snapshot};
use crate::transport::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DeltaResource};

/// The explicit wildcard name.
const WILDCARD: &str = "*";

/// The Delta [`Mode`].
#[derive(Debug)]
pub enum Delta {}

/// Resource name → version.
type Versions = BTreeMap<String, String>;

#[derive(Debug, Default)]
pub struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the client holds, as far as the server knows (pushes count once sent).
    client: Versions,
    in_flight: Option<InFlight<Versions>>,
    nacked: Option<u64>,
    /// The first request of a type is answered even when the client is up to date, so a
    /// starting sidecar learns that its (possibly empty) config is current.
    must_answer: bool,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

impl Mode for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    type TypeState = TypeState;

    fn node_id(request: &DeltaDiscoveryRequest) -> Option<&str> {
        request.node.as_ref().map(|n| n.id.as_str())
    }

    fn describe(response: &DeltaDiscoveryResponse) -> (&str, &str) {
        (&response.type_url, &response.system_version_info)
    }

    fn type_url(request: &DeltaDiscoveryRequest) -> &str {
        &request.type_url
    }

    fn open(request: &mut DeltaDiscoveryRequest, nacked: Option<u64>) -> TypeState {
        TypeState {
            // An empty first subscription is the legacy spelling of a wildcard.
            wildcard: request.resource_names_subscribe.is_empty(),
            client: std::mem::take(&mut request.initial_resource_versions).into_iter().collect(),
            nacked,
            must_answer: true,
            ..Default::default()
        }
    }

    /// Subscription changes apply even on a stale nonce; only the ACK/NACK is ignored then.
    fn on_request(state: &mut TypeState, request: DeltaDiscoveryRequest) -> Option<Feedback> {
        subscribe(state, request.resource_names_subscribe, request.resource_names_unsubscribe);
        let error = request.error_detail.as_ref();
        let Answer::Answered(feedback, push) =
            answer(&mut state.in_flight, &request.type_url, &request.response_nonce, error)
        else {
            return None;
        };
        if matches!(feedback, Feedback::Nack { .. }) {
            state.client = push.before;
            state.nacked = Some(push.version);
        }
        Some(feedback)
    }

    /// Sends the resources whose version the client lacks and the names it holds that are
    /// gone (or no longer subscribed).
    fn push(
        state: &mut TypeState,
        type_url: &str,
        snapshot: &Snapshot,
        nonces: &mut Nonces,
    ) -> Option<DeltaDiscoveryResponse> {
        let version = snapshot.type_version(type_url);
        if snapshot.revision() == 0 || state.in_flight.is_some() || !past_nack(state.nacked, version) {
            return None;
        }
        let entries = snapshot.entries(type_url);
        let resources: Vec<DeltaResource> = entries
            .into_iter()
            .flatten()
            .filter(|(name, entry)| {
                state.wants(name) && state.client.get(*name).is_none_or(|v| *v != entry.version.to_string())
            })
            .map(|(name, entry)| DeltaResource {
                name: name.clone(),
                version: entry.version.to_string(),
                resource: Some(entry.body.clone()),
                ..Default::default()
            })
            .collect();
        let removed: Vec<String> = state
            .client
            .keys()
            .filter(|name| !(state.wants(name) && entries.is_some_and(|e| e.contains_key(*name))))
            .cloned()
            .collect();
        if resources.is_empty() && removed.is_empty() && !state.must_answer {
            return None;
        }
        state.must_answer = false;
        let before = state.client.clone();
        for r in &resources {
            state.client.insert(r.name.clone(), r.version.clone());
        }
        for name in &removed {
            state.client.remove(name);
        }
        let nonce = nonces.next();
        state.in_flight = Some(InFlight { nonce: nonce.clone(), version, before });
        Some(DeltaDiscoveryResponse {
            system_version_info: version.to_string(),
            resources,
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }
}

/// Applies subscription changes. An unsubscribed name is forgotten at once (the client drops
/// it itself), including from the state a NACK would restore.
fn subscribe(state: &mut TypeState, add: Vec<String>, remove: Vec<String>) {
    for name in add {
        if name == WILDCARD {
            state.wildcard = true;
        } else {
            state.names.insert(name);
        }
    }
    for name in remove {
        if name == WILDCARD {
            state.wildcard = false;
            continue;
        }
        state.names.remove(&name);
        state.client.remove(&name);
        if let Some(push) = &mut state.in_flight {
            push.before.remove(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Nack, NodeStatus, Resources};
    use crate::stream::DeltaStream;
    use crate::transport::{Any, RpcStatus, node};
    use crate::typeurl::{CLUSTER, LISTENER};

    fn snapshot(prev: &Snapshot, revision: u64, clusters: &[(&str, &str)]) -> Snapshot {
        let mut r = Resources::new();
        for (name, text) in clusters {
            r.insert(CLUSTER, name, Any { type_url: CLUSTER.into(), value: text.as_bytes().to_vec() });
        }
        prev.next(revision, r).unwrap()
    }

    fn request(nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: Some(node("n")),
            type_url: CLUSTER.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn nack(nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            error_detail: Some(RpcStatus { code: 3, message: "rejected".into(), details: vec![] }),
            ..request(nonce)
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> (Vec<(String, String)>, Vec<String>) {
        let updated = r.resources.iter().map(|x| (x.name.clone(), x.version.clone())).collect();
        (updated, r.removed_resources.clone())
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    }

    fn first(st: &mut DeltaStream, req: DeltaDiscoveryRequest, snap: &Snapshot) -> DeltaDiscoveryResponse {
        let reply = st.on_request(req, snap, &NodeStatus::default()).unwrap();
        assert_eq!(reply.responses.len(), 1, "{reply:?}");
        reply.responses.into_iter().next().unwrap()
    }

    #[test]
    fn sends_only_changed_and_removed_resources() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("b", "1"), ("c", "1")]);
        let s2 = snapshot(&s1, 2, &[("a", "1"), ("b", "2"), ("d", "1")]);
        let mut st = DeltaStream::default();
        let p1 = first(&mut st, request(""), &s1);
        assert_eq!(names(&p1), (pairs(&[("a", "1"), ("b", "1"), ("c", "1")]), vec![]));
        st.on_request(request(&p1.nonce), &s1, &NodeStatus::default()).unwrap();
        let p2 = st.on_snapshot(&s2).pop().unwrap();
        assert_eq!(names(&p2), (pairs(&[("b", "2"), ("d", "2")]), vec!["c".to_string()]));
        assert_eq!(p2.system_version_info, "2");
    }

    #[test]
    fn initial_resource_versions_avoid_resending_what_the_client_has() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")]);
        let s2 = snapshot(&s1, 2, &[("a", "1"), ("b", "1")]);
        let mut st = DeltaStream::default();
        let mut req = request("");
        req.initial_resource_versions.insert("a".into(), "1".into());
        req.initial_resource_versions.insert("gone".into(), "1".into());
        let p = first(&mut st, req, &s2);
        assert_eq!(names(&p), (pairs(&[("b", "2")]), vec!["gone".to_string()]));
    }

    #[test]
    fn first_request_is_answered_even_when_up_to_date() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1")]);
        let mut st = DeltaStream::default();
        let mut req = request("");
        req.initial_resource_versions.insert("a".into(), "1".into());
        let p = first(&mut st, req, &s1);
        assert_eq!(names(&p), (vec![], vec![]));
        let ack = st.on_request(request(&p.nonce), &s1, &NodeStatus::default()).unwrap();
        assert!(ack.responses.is_empty(), "only the first request is answered unconditionally");
    }

    #[test]
    fn named_subscriptions_filter_and_unsubscribe_forgets() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("b", "1")]);
        let mut st = DeltaStream::default();
        let mut req = request("");
        req.resource_names_subscribe = vec!["b".into()];
        let p = first(&mut st, req, &s1);
        assert_eq!(names(&p), (pairs(&[("b", "1")]), vec![]));
        let mut change = request(&p.nonce);
        change.resource_names_subscribe = vec!["a".into()];
        change.resource_names_unsubscribe = vec!["b".into()];
        let p2 = first(&mut st, change, &s1);
        assert_eq!(names(&p2), (pairs(&[("a", "1")]), vec![]), "no removal is sent for an unsubscribed name");
    }

    #[test]
    fn nack_restores_client_versions_and_blocks_that_version() {
        let s1 = snapshot(&Snapshot::default(), 1, &[("a", "1"), ("c", "1")]);
        let s2 = snapshot(&s1, 2, &[("a", "1"), ("bad", "x")]);
        let s3 = s2
            .next(3, {
                let mut r = Resources::new();
                r.insert(CLUSTER, "a", Any { type_url: CLUSTER.into(), value: b"1".to_vec() });
                r.insert(CLUSTER, "bad", Any { type_url: CLUSTER.into(), value: b"x".to_vec() });
                r.insert(LISTENER, "l", Any::default());
                r
            })
            .unwrap();
        let s4 = snapshot(&s3, 4, &[("a", "2"), ("ok", "1")]);
        let mut st = DeltaStream::default();
        let p1 = first(&mut st, request(""), &s1);
        st.on_request(request(&p1.nonce), &s1, &NodeStatus::default()).unwrap();
        let p2 = st.on_snapshot(&s2).pop().unwrap();
        assert_eq!(names(&p2), (pairs(&[("bad", "2")]), vec!["c".to_string()]));
        let reply = st.on_request(nack(&p2.nonce), &s2, &NodeStatus::default()).unwrap();
        let expected = Nack { version: 2, error: "rejected".into() };
        assert_eq!(reply.feedback, Some(Feedback::Nack { type_url: CLUSTER.into(), nack: expected }));
        assert!(reply.responses.is_empty());
        assert!(st.on_snapshot(&s3).is_empty(), "clusters are still at the NACKed version");
        let p4 = st.on_snapshot(&s4).pop().unwrap();
        assert_eq!(
            names(&p4),
            (pairs(&[("a", "4"), ("ok", "4")]), vec!["c".to_string()]),
            "the client rejected the removal of c, so it is removed again"
        );
    }

    #[test]
    fn ack_reports_the_pushed_type_version() {
        let s1 = snapshot(&Snapshot::default(), 7, &[("a", "1")]);
        let mut st = DeltaStream::default();
        let p = first(&mut st, request(""), &s1);
        let ack = st.on_request(request(&p.nonce), &s1, &NodeStatus::default()).unwrap();
        assert_eq!(ack.feedback, Some(Feedback::Ack { type_url: CLUSTER.into(), version: "7".into() }));
    }
}

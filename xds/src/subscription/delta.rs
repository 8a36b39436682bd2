//! Delta (incremental) xDS: responses carry only the resources that changed and the names
//! that were removed, each resource with its own version. The client keeps the versions it
//! accepted so a new stream can tell the server what it already has
//! (`initial_resource_versions`) and receive only the difference.

use std::collections::{BTreeMap, BTreeSet};

use super::{NodeOnce, Unsolicited, Verdict, nack_detail};
use crate::transport::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};

/// Per-type client state for a Delta ADS stream.
#[derive(Debug, Clone)]
pub struct DeltaClient {
    node: NodeOnce,
    types: BTreeMap<String, TypeState>,
}

/// The explicit wildcard name of the xDS protocol.
const WILDCARD: &str = "*";

#[derive(Debug, Clone, Default)]
struct TypeState {
    /// Every resource of the type, besides `names`. Kept apart from `names`, since a
    /// subscription whose names were all unsubscribed wants nothing, not everything.
    wildcard: bool,
    /// Subscribed names.
    names: BTreeSet<String>,
    /// Resource name → version the client accepted.
    versions: BTreeMap<String, String>,
}

impl DeltaClient {
    pub fn new(node: Node) -> Self {
        DeltaClient { node: NodeOnce::new(node), types: BTreeMap::new() }
    }

    /// Subscribes to more names of `type_url`. The first call for a type with no names is a
    /// wildcard subscription (every resource of the type).
    /// Names added to a wildcard subscription carry `*` along: a server may end the legacy
    /// (empty-list) wildcard once names are subscribed.
    pub fn subscribe(&mut self, type_url: &str, names: Vec<String>) -> DeltaDiscoveryRequest {
        let fresh = !self.types.contains_key(type_url);
        let state = self.types.entry(type_url.to_owned()).or_default();
        let wants_all = names.iter().any(|n| n == WILDCARD);
        let newly_wild = wants_all && !state.wildcard;
        if (fresh && names.is_empty()) || wants_all {
            state.wildcard = true;
        }
        let mut added: Vec<String> = names.into_iter().filter(|n| n != WILDCARD && state.names.insert(n.clone())).collect();
        if state.wildcard && (newly_wild || !added.is_empty()) {
            added.push(WILDCARD.into());
        }
        DeltaDiscoveryRequest {
            node: self.node.take(),
            type_url: type_url.to_owned(),
            resource_names_subscribe: added,
            ..Default::default()
        }
    }

    /// Drops names from a subscription; the client forgets their versions at once (the
    /// server sends no removal for an unsubscribed name). `None` if the type is unknown.
    pub fn unsubscribe(&mut self, type_url: &str, names: Vec<String>) -> Option<DeltaDiscoveryRequest> {
        let state = self.types.get_mut(type_url)?;
        for name in &names {
            if name == WILDCARD {
                state.wildcard = false;
            }
            state.names.remove(name);
            state.versions.remove(name);
        }
        if !state.wildcard {
            // What came only through the wildcard is no longer subscribed: forget it too, or a
            // reconnect would claim versions of resources the server will never update.
            let TypeState { names: kept, versions, .. } = state;
            versions.retain(|name, _| kept.contains(name));
        }
        Some(DeltaDiscoveryRequest {
            node: self.node.take(),
            type_url: type_url.to_owned(),
            resource_names_unsubscribe: names,
            ..Default::default()
        })
    }

    /// Answers a response. On ACK the client's versions take the response's updates and
    /// removals; on NACK they stay as they were and the request carries the reason.
    pub fn on_response(
        &mut self,
        response: &DeltaDiscoveryResponse,
        verdict: Verdict,
    ) -> Result<DeltaDiscoveryRequest, Unsolicited> {
        let state = self.types.get_mut(&response.type_url).ok_or_else(|| Unsolicited(response.type_url.clone()))?;
        let error_detail = match verdict {
            Ok(()) => {
                for resource in &response.resources {
                    state.versions.insert(resource.name.clone(), resource.version.clone());
                }
                for name in &response.removed_resources {
                    state.versions.remove(name);
                }
                None
            }
            Err(reason) => Some(nack_detail(reason)),
        };
        Ok(DeltaDiscoveryRequest {
            node: self.node.take(),
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            error_detail,
            ..Default::default()
        })
    }

    /// The requests that open a new stream: every subscription again, with the versions the
    /// client holds so the server sends only what changed while it was away. A wildcard is
    /// sent as an explicit `*`; a type whose names were all unsubscribed is not sent at all (an
    /// empty first list would be read as the legacy wildcard: every resource of the type).
    pub fn reconnect(&mut self) -> Vec<DeltaDiscoveryRequest> {
        self.node.reset();
        let node = &mut self.node;
        self.types
            .iter()
            .filter(|(_, state)| state.wildcard || !state.names.is_empty())
            .map(|(url, state)| DeltaDiscoveryRequest {
                node: node.take(),
                type_url: url.clone(),
                resource_names_subscribe: state.wildcard.then(|| WILDCARD.to_string()).into_iter().chain(state.names.iter().cloned()).collect(),
                initial_resource_versions: state.versions.clone().into_iter().collect(),
                ..Default::default()
            })
            .collect()
    }

    /// Resource name → accepted version for `type_url`.
    pub fn versions(&self, type_url: &str) -> Option<&BTreeMap<String, String>> {
        self.types.get(type_url).map(|s| &s.versions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{DeltaResource, node};
    use crate::typeurl::{CLUSTER, ENDPOINTS};

    fn response(nonce: &str, updated: &[(&str, &str)], removed: &[&str]) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            type_url: CLUSTER.into(),
            nonce: nonce.into(),
            resources: updated
                .iter()
                .map(|(n, v)| DeltaResource { name: (*n).into(), version: (*v).into(), ..Default::default() })
                .collect(),
            removed_resources: removed.iter().map(|n| (*n).into()).collect(),
            ..Default::default()
        }
    }

    fn versions(c: &DeltaClient) -> Vec<(String, String)> {
        c.versions(CLUSTER).unwrap().clone().into_iter().collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    }

    #[test]
    fn subscribe_sends_only_new_names_and_the_node_once() {
        let mut c = DeltaClient::new(node("n1"));
        let first = c.subscribe(CLUSTER, vec!["a".into(), "b".into()]);
        assert_eq!(first.node.map(|n| n.id).as_deref(), Some("n1"));
        assert_eq!(first.resource_names_subscribe, vec!["a".to_string(), "b".to_string()]);
        let again = c.subscribe(CLUSTER, vec!["b".into(), "c".into()]);
        assert!(again.node.is_none());
        assert_eq!(again.resource_names_subscribe, vec!["c".to_string()]);
    }

    #[test]
    fn ack_applies_updates_and_removals_and_carries_only_the_nonce() {
        let mut c = DeltaClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        let ack = c.on_response(&response("1", &[("a", "1"), ("b", "1")], &[]), Ok(())).unwrap();
        assert_eq!(ack.response_nonce, "1");
        assert!(ack.error_detail.is_none());
        c.on_response(&response("2", &[("b", "2")], &["a"]), Ok(())).unwrap();
        assert_eq!(versions(&c), pairs(&[("b", "2")]));
    }

    #[test]
    fn nack_keeps_versions_and_carries_error_detail() {
        let mut c = DeltaClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        c.on_response(&response("1", &[("a", "1")], &[]), Ok(())).unwrap();
        let nack = c.on_response(&response("2", &[("a", "2"), ("bad", "2")], &["a"]), Err("bad".into())).unwrap();
        assert_eq!(nack.response_nonce, "2");
        assert_eq!(nack.error_detail.map(|e| e.message).as_deref(), Some("bad"));
        assert_eq!(versions(&c), pairs(&[("a", "1")]));
    }

    #[test]
    fn unsubscribe_forgets_versions_and_unknown_types_are_refused() {
        let mut c = DeltaClient::new(node("n1"));
        c.subscribe(CLUSTER, vec!["a".into(), "b".into()]);
        c.on_response(&response("1", &[("a", "1"), ("b", "1")], &[]), Ok(())).unwrap();
        let req = c.unsubscribe(CLUSTER, vec!["a".into()]).unwrap();
        assert_eq!(req.resource_names_unsubscribe, vec!["a".to_string()]);
        assert_eq!(versions(&c), pairs(&[("b", "1")]));
        assert!(c.unsubscribe(ENDPOINTS, vec![]).is_none());
        let mut other = response("2", &[], &[]);
        other.type_url = ENDPOINTS.into();
        assert_eq!(c.on_response(&other, Ok(())).unwrap_err(), Unsolicited(ENDPOINTS.into()));
    }

    #[test]
    fn reconnect_sends_initial_resource_versions_and_subscriptions() {
        let mut c = DeltaClient::new(node("n1"));
        c.subscribe(CLUSTER, vec!["a".into(), "b".into()]);
        c.subscribe(ENDPOINTS, vec![]);
        c.on_response(&response("1", &[("a", "3"), ("b", "4")], &[]), Ok(())).unwrap();
        c.on_response(&response("2", &[("a", "5")], &[]), Err("no".into())).unwrap();
        let reqs = c.reconnect();
        assert_eq!(reqs.len(), 2);
        assert!(reqs[0].node.is_some() && reqs[1].node.is_none());
        let cluster = reqs.iter().find(|r| r.type_url == CLUSTER).unwrap();
        let mut initial: Vec<_> = cluster.initial_resource_versions.clone().into_iter().collect();
        initial.sort();
        assert_eq!(initial, pairs(&[("a", "3"), ("b", "4")]));
        assert_eq!(cluster.resource_names_subscribe, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(cluster.response_nonce, "");
        let endpoints = reqs.iter().find(|r| r.type_url == ENDPOINTS).unwrap();
        assert_eq!(endpoints.resource_names_subscribe, vec!["*".to_string()], "wildcard stays wildcard, explicitly");
    }

    /// Unsubscribing every name leaves nothing subscribed: a reconnect must not send the
    /// empty list that a server reads as the legacy wildcard.
    #[test]
    fn a_subscription_emptied_by_unsubscribes_is_not_a_wildcard_after_reconnect() {
        let mut c = DeltaClient::new(node("n1"));
        c.subscribe(CLUSTER, vec!["a".into()]);
        c.subscribe(ENDPOINTS, vec!["e".into()]);
        c.unsubscribe(CLUSTER, vec!["a".into()]).unwrap();
        let reqs = c.reconnect();
        assert_eq!(reqs.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), vec![ENDPOINTS]);
        assert!(reqs[0].node.is_some(), "the first request still carries the node");
        // Subscribing again afterwards names what it wants.
        let again = c.subscribe(CLUSTER, vec!["b".into()]);
        assert_eq!(again.resource_names_subscribe, vec!["b".to_string()]);
    }

    /// Names added to a wildcard subscription carry `*` along; unsubscribing `*` ends it.
    #[test]
    fn names_added_to_a_wildcard_keep_the_wildcard() {
        let mut c = DeltaClient::new(node("n1"));
        assert!(c.subscribe(CLUSTER, vec![]).resource_names_subscribe.is_empty(), "the legacy spelling first");
        let more = c.subscribe(CLUSTER, vec!["a".into()]);
        assert_eq!(more.resource_names_subscribe, vec!["a".to_string(), "*".to_string()]);
        c.on_response(&response("1", &[("a", "1"), ("w", "1")], &[]), Ok(())).unwrap();
        c.unsubscribe(CLUSTER, vec!["*".into()]).unwrap();
        let reqs = c.reconnect();
        assert_eq!(reqs[0].resource_names_subscribe, vec!["a".to_string()]);
        let initial: Vec<_> = reqs[0].initial_resource_versions.keys().cloned().collect();
        assert_eq!(initial, vec!["a".to_string()], "w came only through the wildcard");
        let all = c.subscribe(CLUSTER, vec!["*".into()]);
        assert_eq!(all.resource_names_subscribe, vec!["*".to_string()], "an explicit * subscribes everything again");
        assert_eq!(c.reconnect()[0].resource_names_subscribe, vec!["*".to_string(), "a".to_string()]);
    }
}

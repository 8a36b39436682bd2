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

#[derive(Debug, Clone, Default)]
struct TypeState {
    /// Subscribed names; empty = every resource of the type (wildcard).
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
    pub fn subscribe(&mut self, type_url: &str, names: Vec<String>) -> DeltaDiscoveryRequest {
        let state = self.types.entry(type_url.to_owned()).or_default();
        let added: Vec<String> = names.into_iter().filter(|n| state.names.insert(n.clone())).collect();
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
            state.names.remove(name);
            state.versions.remove(name);
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
    /// client holds so the server sends only what changed while it was away.
    pub fn reconnect(&mut self) -> Vec<DeltaDiscoveryRequest> {
        self.node.reset();
        let node = &mut self.node;
        self.types
            .iter()
            .map(|(url, state)| DeltaDiscoveryRequest {
                node: node.take(),
                type_url: url.clone(),
                resource_names_subscribe: state.names.iter().cloned().collect(),
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
        assert!(endpoints.resource_names_subscribe.is_empty(), "wildcard stays wildcard");
    }
}

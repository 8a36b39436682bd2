//! State-of-the-World: every response carries the whole set of resources of its type, and the
//! client answers each with the version it now runs (ACK) or the one it kept (NACK).

use std::collections::BTreeMap;

use super::{NodeOnce, Unsolicited, Verdict, nack_detail};
use crate::transport::{DiscoveryRequest, DiscoveryResponse, Node, RpcStatus};

/// Per-type client state for a State-of-the-World ADS stream.
#[derive(Debug, Clone)]
pub struct SotwClient {
    node: NodeOnce,
    types: BTreeMap<String, TypeState>,
}

#[derive(Debug, Clone, Default)]
struct TypeState {
    /// Subscribed names; empty = every resource of the type (wildcard).
    names: Vec<String>,
    /// The version the client runs: empty until the first ACK.
    acked_version: String,
    /// Nonce of the last response on this stream; empty on a new stream.
    nonce: String,
}

impl SotwClient {
    pub fn new(node: Node) -> Self {
        SotwClient { node: NodeOnce::new(node), types: BTreeMap::new() }
    }

    /// Subscribes to `names` of `type_url` (empty = all), replacing any earlier list.
    pub fn subscribe(&mut self, type_url: &str, names: Vec<String>) -> DiscoveryRequest {
        self.types.entry(type_url.to_owned()).or_default().names = names;
        self.request(type_url, None)
    }

    /// Answers a response: ACK with its version, or NACK with the version still running and
    /// the reason. Both carry the response's nonce so the server knows which push they answer.
    pub fn on_response(
        &mut self,
        response: &DiscoveryResponse,
        verdict: Verdict,
    ) -> Result<DiscoveryRequest, Unsolicited> {
        let state = self.types.get_mut(&response.type_url).ok_or_else(|| Unsolicited(response.type_url.clone()))?;
        state.nonce.clone_from(&response.nonce);
        let error = match verdict {
            Ok(()) => {
                state.acked_version.clone_from(&response.version_info);
                None
            }
            Err(reason) => Some(nack_detail(reason)),
        };
        Ok(self.request(&response.type_url, error))
    }

    /// The requests that open a new stream: every subscription again, each with the version
    /// last ACKed (so the server need not resend what the client runs) and no nonce (nonces
    /// belong to the old stream).
    pub fn reconnect(&mut self) -> Vec<DiscoveryRequest> {
        self.node.reset();
        for state in self.types.values_mut() {
            state.nonce.clear();
        }
        let urls: Vec<String> = self.types.keys().cloned().collect();
        urls.iter().map(|url| self.request(url, None)).collect()
    }

    /// The version last ACKed for `type_url`; `None` if not subscribed, `""` before any ACK.
    pub fn acked_version(&self, type_url: &str) -> Option<&str> {
        self.types.get(type_url).map(|s| s.acked_version.as_str())
    }

    fn request(&mut self, type_url: &str, error_detail: Option<RpcStatus>) -> DiscoveryRequest {
        let node = self.node.take();
        let state = &self.types[type_url];
        DiscoveryRequest {
            version_info: state.acked_version.clone(),
            node,
            resource_names: state.names.clone(),
            type_url: type_url.to_owned(),
            response_nonce: state.nonce.clone(),
            error_detail,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::node;
    use crate::typeurl::{CLUSTER, LISTENER};

    fn response(type_url: &str, version: &str, nonce: &str) -> DiscoveryResponse {
        DiscoveryResponse {
            type_url: type_url.into(),
            version_info: version.into(),
            nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[test]
    fn first_request_carries_the_node_and_no_version_or_nonce() {
        let mut c = SotwClient::new(node("n1"));
        let r = c.subscribe(CLUSTER, vec![]);
        assert_eq!(r.node.map(|n| n.id).as_deref(), Some("n1"));
        assert_eq!((r.version_info.as_str(), r.response_nonce.as_str()), ("", ""));
        assert_eq!(r.type_url, CLUSTER);
        let r2 = c.subscribe(LISTENER, vec!["l1".into()]);
        assert!(r2.node.is_none(), "node is sent once per stream");
        assert_eq!(r2.resource_names, vec!["l1".to_string()]);
    }

    #[test]
    fn ack_carries_the_new_version_and_the_response_nonce() {
        let mut c = SotwClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        let ack = c.on_response(&response(CLUSTER, "7", "a"), Ok(())).unwrap();
        assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("7", "a"));
        assert!(ack.error_detail.is_none());
        assert_eq!(c.acked_version(CLUSTER), Some("7"));
    }

    #[test]
    fn nack_keeps_the_previous_version_and_explains_why() {
        let mut c = SotwClient::new(node("n1"));
        c.subscribe(CLUSTER, vec!["x".into()]);
        c.on_response(&response(CLUSTER, "7", "a"), Ok(())).unwrap();
        let nack = c.on_response(&response(CLUSTER, "8", "b"), Err("bad lb".into())).unwrap();
        assert_eq!(nack.version_info, "7", "a NACK reports the version still running");
        assert_eq!(nack.response_nonce, "b", "a NACK answers the rejected response");
        assert_eq!(nack.resource_names, vec!["x".to_string()]);
        let detail = nack.error_detail.expect("error_detail");
        assert_eq!(detail.message, "bad lb");
        assert_eq!(detail.code, 3);
        assert_eq!(c.acked_version(CLUSTER), Some("7"));
    }

    #[test]
    fn versions_are_tracked_per_type() {
        let mut c = SotwClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        c.subscribe(LISTENER, vec![]);
        c.on_response(&response(CLUSTER, "3", "a"), Ok(())).unwrap();
        let l = c.on_response(&response(LISTENER, "5", "b"), Err("no".into())).unwrap();
        assert_eq!(l.version_info, "", "the listener NACK must not borrow the cluster version");
        assert_eq!(c.acked_version(CLUSTER), Some("3"));
        assert_eq!(c.acked_version(LISTENER), Some(""));
    }

    #[test]
    fn unsolicited_responses_are_refused() {
        let mut c = SotwClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        let err = c.on_response(&response(LISTENER, "1", "a"), Ok(())).unwrap_err();
        assert_eq!(err, Unsolicited(LISTENER.into()));
        assert_eq!(c.acked_version(LISTENER), None);
    }

    #[test]
    fn reconnect_resends_last_acked_versions_with_node_and_without_nonce() {
        let mut c = SotwClient::new(node("n1"));
        c.subscribe(CLUSTER, vec![]);
        c.subscribe(LISTENER, vec!["l1".into()]);
        c.on_response(&response(CLUSTER, "4", "a"), Ok(())).unwrap();
        c.on_response(&response(CLUSTER, "5", "b"), Err("no".into())).unwrap();
        let reqs = c.reconnect();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[0].node.as_ref().map(|n| n.id.as_str()), Some("n1"));
        assert!(reqs[1].node.is_none());
        let cluster = reqs.iter().find(|r| r.type_url == CLUSTER).unwrap();
        assert_eq!(cluster.version_info, "4", "resume from the last ACKed version, not the NACKed one");
        assert_eq!(cluster.response_nonce, "");
        assert!(cluster.error_detail.is_none());
        let listener = reqs.iter().find(|r| r.type_url == LISTENER).unwrap();
        assert_eq!(listener.resource_names, vec!["l1".to_string()]);
    }
}

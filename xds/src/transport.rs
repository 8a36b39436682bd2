//! The xDS v3 transport, re-exported from `envoy-types` so callers depend on one path and one
//! version: discovery requests/responses (State-of-the-World and Delta), the node identity,
//! `google.protobuf.Any` (which carries weft's resources) and `google.rpc.Status` (which
//! carries a NACK's error).

pub use envoy_types::pb::envoy::config::core::v3::Node;
pub use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
pub use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
pub use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource as DeltaResource,
};
pub use envoy_types::pb::google::protobuf::Any;
pub use envoy_types::pb::google::rpc::Status as RpcStatus;

/// A node identity with just an id (what weft keys per-node status by).
pub fn node(id: impl Into<String>) -> Node {
    Node { id: id.into(), ..Default::default() }
}

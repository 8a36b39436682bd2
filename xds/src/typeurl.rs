//! Type URLs of weft's resources. A type URL names both the protobuf message inside an `Any`
//! and the xDS subscription that carries it, so each resource kind is one independent stream
//! of versions on the ADS connection.

/// The prefix every protobuf `Any` type URL conventionally carries.
pub const PREFIX: &str = "type.googleapis.com/";

macro_rules! type_urls {
    ($($(#[$doc:meta])* $konst:ident => $message:literal,)*) => {
        $($(#[$doc])* pub const $konst: &str = concat!("type.googleapis.com/weft.v1.", $message);)*
        /// Every weft type URL, in the order a sidecar should apply them: what is referenced
        /// (clusters, endpoints, experiments) before what refers to it (services, listeners).
        pub const ALL: &[&str] = &[$($konst),*];
    };
}

type_urls! {
    /// `weft.v1.Cluster`.
    CLUSTER => "Cluster",
    /// `weft.v1.Endpoints`, one per cluster.
    ENDPOINTS => "Endpoints",
    /// `weft.v1.Experiment`.
    EXPERIMENT => "Experiment",
    /// `weft.v1.Service`.
    SERVICE => "Service",
    /// `weft.v1.AuthorizationPolicy`.
    AUTHORIZATION_POLICY => "AuthorizationPolicy",
    /// `weft.v1.Revocation`.
    REVOCATION => "Revocation",
    /// `weft.v1.Listener`.
    LISTENER => "Listener",
    /// `weft.v1.ShardMap` (reserved for the scheduler).
    SHARD_MAP => "ShardMap",
    /// `weft.v1.ScalingDecision` (reserved for the autoscaler).
    SCALING_DECISION => "ScalingDecision",
    /// `weft.v1.Placement` (reserved for the scheduler).
    PLACEMENT => "Placement",
}

/// The standard Envoy v3 resources weft-control generates from weft's own, for stock Envoy
/// clients (LDS, RDS, CDS, EDS over ADS).
pub mod envoy {
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    pub const ROUTE_CONFIGURATION: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    pub const CLUSTER_LOAD_ASSIGNMENT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    /// In the order Envoy warms them: clusters and their endpoints before the listeners
    /// and routes that use them.
    pub const ALL: &[&str] = &[CLUSTER, CLUSTER_LOAD_ASSIGNMENT, LISTENER, ROUTE_CONFIGURATION];
}

/// Whether this server serves `type_url`: a subscription to anything else is refused with an
/// error the client sees, rather than answered with nothing (which looks like an empty,
/// healthy config).
pub fn served(type_url: &str) -> bool {
    ALL.contains(&type_url) || envoy::ALL.contains(&type_url)
}

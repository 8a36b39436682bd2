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
    /// `weft.v1.Listener`.
    LISTENER => "Listener",
    /// `weft.v1.ShardMap` (reserved for the scheduler).
    SHARD_MAP => "ShardMap",
    /// `weft.v1.ScalingDecision` (reserved for the autoscaler).
    SCALING_DECISION => "ScalingDecision",
    /// `weft.v1.Placement` (reserved for the scheduler).
    PLACEMENT => "Placement",
}

/// Whether this server serves `type_url`: a subscription to anything else is refused with an
/// error the client sees, rather than answered with nothing (which looks like an empty,
/// healthy config).
pub fn served(type_url: &str) -> bool {
    ALL.contains(&type_url)
}

//! weft-xds: the wire contract between weft's control plane and its sidecars.
//!
//! - [`resources`]: weft's own resources (`weft.v1.*`), compiled from `proto/weft/v1` at build
//!   time by a pure-Rust protobuf compiler, and how they are packed into `google.protobuf.Any`.
//! - [`typeurl`]: the type URL of each resource, which keys every xDS subscription.
//! - [`transport`]: the xDS v3 messages and the ADS gRPC service (from `envoy-types`), so
//!   standard xDS tooling can talk to weft.
//! - [`subscription`]: the sidecar side: a pure state machine for versions, nonces, ACK/NACK
//!   and reconnects; it returns the requests to send and never touches a socket.
//! - [`cache`]: the control-plane side: one snapshot per revision (a Raft log index), per-type
//!   and per-resource versions derived from it, and per-node ACK/NACK status.
//! - [`stream`]: the pure per-stream server protocol (what to push, when, and what not to
//!   re-push), for State-of-the-World and Delta.
//! - [`ads_server`]: the tonic service that wires a [`cache::Cache`] to client streams.
//!
//! No business logic lives here: what a resource means is up to weft-proxy and weft-control.

pub mod ads_server;
pub mod cache;
pub mod resources;
pub mod stream;
pub mod subscription;
pub mod transport;
pub mod typeurl;

/// Encoded `google.protobuf.FileDescriptorSet`s of the gRPC services weft-control serves, for
/// gRPC server reflection (`grpcurl list`, `describe`).
pub mod descriptors {
    /// `weft.v1`: weft's resources and the sidecar report stream.
    pub const WEFT_V1: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/weft_v1_fds.bin"));
    /// `envoy.service.discovery.v3.AggregatedDiscoveryService` and what it imports.
    pub const ADS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ads_fds.bin"));
}

pub use ads_server::AdsServer;
pub use cache::{Cache, Counters, Resources, Snapshot};

//! weft on Kubernetes. The pure parts (what to inject, how a CR or an EndpointSlice becomes a
//! weft resource) are apart from the IO that serves the webhook and watches the API server.
//!
//! - [`inject`]: the mutating admission webhook's decision and JSONPatch; [`webhook`] serves it.
//! - [`crds`]: weft's resources as custom resources, schemas from the same Rust types.
//! - [`endpoints`]: EndpointSlice watch events → weft endpoint sets.
//! - [`sync`]: the watches on the API server and the writes to weft-control; [`status`] is
//!   what it writes back.

pub mod crds;
pub mod endpoints;
pub mod inject;
pub mod status;
pub mod sync;
pub mod webhook;

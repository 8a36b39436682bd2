//! weft on Kubernetes. The pure parts (what to inject, how a CR or an EndpointSlice becomes a
//! weft resource) are apart from the IO that serves the webhook and watches the API server.
//!
//! - [`inject`]: the mutating admission webhook's decision and JSONPatch.
pub mod inject;

//! weft-agent: what runs on a node beside the sidecars.
//!
//! - [`weights`]: model weights in safetensors files, packed for computing; a base loaded once
//!   per node and shared read-only by every variant replica through a sealed memfd
//!   ([`weights::share`]); a variant's delta (LoRA per layer, or its own head) checked against
//!   the base's shapes; and the forward step the reference server answers with.
//! - [`server`]: `weft-model-server`, the reference model server built on them.
//!
//! The placement-reconciling agent loop (issue 40, item 1) is not built yet; the weight holder
//! is started by hand or by the bench (`weft-agent hold`).

pub mod server;
pub mod weights;

//! weft-agent: what runs on a node beside the sidecars.
//!
//! - [`weights`]: model weights in safetensors files, packed for computing; a base loaded once
//!   per node and shared read-only by every variant replica through a sealed memfd
//!   ([`weights::share`]); a variant's delta (LoRA per layer, or its own head) checked against
//!   the base's shapes; and the forward step the reference server answers with.
//! - [`server`]: `weft-model-server`, the reference model server built on them.
//! - [`node`]: `weft-agent run`, the loop that carries out the placements on this node (holders,
//!   replicas, their sidecars), adopts what an earlier agent left running, and reports.

pub mod node;
pub mod server;
pub mod weights;

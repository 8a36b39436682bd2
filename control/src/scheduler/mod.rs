//! The GPU scheduler: where model variants, training gangs and GPU-sharing pods run.
//!
//! Pure logic, no IO and no async: the control plane (API, Raft, xDS) calls it with an
//! inventory and workloads and gets placements or reasons back, and the benchmarks replay
//! traces through the very same code.
//!
//! # Model
//! - [`inventory`]: nodes (CPU, memory, GPUs of one model with a memory size, topology labels
//!   zone/rack/switch, spot or on-demand pool, price, expected spot uptime) and what is free:
//!   per node a small aggregate record read by every decision, per GPU free milli-GPU and
//!   free memory, and the base models resident on each GPU. A GPU is 1000 milli-GPU; a task
//!   asks for a fraction of one GPU or for whole GPUs, as in the Alibaba trace.
//! - [`workload`]: trace pods, inference replicas of a variant (base model + delta + working
//!   set), training gangs (N workers × G GPUs, topology constraint).
//! - [`memory`]: a training worker's GPU memory from the model's shape (seed 001).
//!
//! # Decisions
//! - [`policy`]: which node and GPUs a task of a given shape takes. Baselines from the FGD
//!   paper (Random, Best-fit, Dot-product, GPU Packing, FGD) and weft's own policy: FGD's
//!   fragmentation-gradient score over a capacity-aware fragmentation measure that also keeps
//!   rare large shapes in view (why, and the measurements: [`policy::weft`]). Every policy
//!   but Random breaks ties by a seeded node order, so plans are reproducible and tied
//!   decisions pack.
//! - [`place`]: one workload or a plan at a time: pods by policy; replicas sharing-aware (a GPU
//!   already holding the base costs only delta + working set, variants of a base gather, a
//!   per-GPU limit on active variants); gangs all-or-nothing inside a topology domain with
//!   retry back-off; preemption of the cheapest strictly-lower-priority victim set that never
//!   splits a gang; critical work on on-demand nodes, best-effort work on spot nodes whose
//!   expected uptime clears its threshold. A workload that cannot be placed comes back as
//!   [`Unplaced`] with a [`Reason`] an operator can act on.
//!
//! # Invariants (property-tested in `proptests`)
//! No GPU (compute or memory), node CPU or node memory is ever over-committed; a gang is
//! placed whole or not at all and evicted whole; preemption never evicts equal or higher
//! priority work; a failed placement changes nothing.
//!
//! # Speed
//! A decision scans the nodes' aggregates once; fragmentation results are cached per node and
//! per task shape, keyed on a per-node version, so only nodes that changed since the shape
//! was last seen are rescored. The whole Alibaba default trace (≈10.8k pods on 1,213 nodes)
//! places in about a third of a second on one core (`sched-openb` reports µs per pod).

pub mod inventory;
pub mod memory;
pub mod place;
pub mod policy;
pub mod rng;
pub mod workload;

pub use place::{Placement, Plan, Reason, Scheduler, SchedulerConfig, Unplaced};

#[cfg(test)]
mod proptests;

//! GPU scheduler (pure logic: no IO, no async).

pub mod inventory;
pub mod memory;
pub mod policy;
pub mod rng;
pub mod workload;
pub mod place;

pub use place::{Placement, Plan, Reason, Scheduler, SchedulerConfig, Unplaced};

#[cfg(test)]
mod proptests;

//! Judging experiments, as pure logic (no clocks, sockets or tasks): the statistics the A/B
//! report and the rollout engine share, an always-valid sequential test, and the verdict of a
//! progressive rollout.
//!
//! - [`stats`]: percentiles with distribution-free intervals, Wilson intervals, the
//!   sample-ratio-mismatch chi-square (against any weights), Mann-Whitney U, two-proportion z.
//! - [`sequential`]: the mixture SPRT (mSPRT) on a difference of proportions, its always-valid
//!   p-value and confidence sequence, and a monitor that may be read after every request.
//! - [`judge`]: guardrails as non-inferiority margins on those sequences, and the verdict of a
//!   rollout step: continue, step up, promote, roll back, or hold on a broken split.
//!
//! `experiment-sim` (weft-bench) measures the false-positive rate, power and SRM detection by
//! simulation.

pub mod judge;
pub mod rollout;
pub mod sequential;
pub mod stats;

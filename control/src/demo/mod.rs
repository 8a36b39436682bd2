//! `weft demo`: the first-run tour. A real mesh on loopback (an in-process control node, two
//! simulated model variants behind inbound sidecars, an outbound sidecar for the client), an
//! A/B experiment split 50/50 sticky by user id, live traffic, and the A/B report in the
//! terminal and as HTML.
//!
//! - `report`: the statistics, pure (percentile intervals, SRM check, variant comparison);
//! - `html`: the HTML page with its SVG latency chart;
//! - `run`: the processes, the config, the traffic (the IO).

pub mod html;
pub mod report;
pub mod run;

pub use run::{DemoOptions, main};

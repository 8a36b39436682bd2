//! sched-openb's pieces: the trace and its replay protocol, the sharing experiment, the plot.

pub mod openb;
pub mod plot;
pub mod sharing;

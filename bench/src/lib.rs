//! weft's benchmarks: shared pieces for driving real processes on loopback and measuring them.
//!
//! Each bench binary in `src/bin/` prints a table and writes JSON under `bench/results/`.
//! `proxy-load` compares weft-proxy with Envoy, nginx and HAProxy (plaintext, and with mTLS); `xds-fanout` times a config
//! change reaching thousands of sidecars (see `bench/README.md`).

pub mod agent_run;
pub mod autoscale;
pub mod csv;
pub mod fsync_delay;
pub mod guard;
pub mod install;
pub mod load;
pub mod mtls;
pub mod net;
pub mod netns;
pub mod peers;
pub mod phase;
pub mod procfs;
pub mod raft_clusters;
pub mod report;
pub mod sched;
pub mod stats;
pub mod upstream;
pub mod workspace;
pub mod write_load;
pub mod xds_clients;

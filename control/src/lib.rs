//! weft-control: the control plane.
//!
//! - `store`: the Raft-replicated config store (openraft, log and state persisted in redb).
//! - `transport`: Raft RPCs between nodes (HTTP + JSON on the API listener).
//! - `resources`: resource kinds, spec validation (the proxy's own rules), state → xDS (pure).
//! - `api`: the REST API (auth, leader forwarding, CRUD, members, proxy status, OpenAPI).
//! - `envoy`: weft's resources as Envoy v3 Listener/RouteConfiguration/Cluster/ClusterLoadAssignment (pure).
//! - `publish`: committed state → the xDS cache, on every apply.
//! - `server`: a running node (listeners, Raft, publisher, join); the binary wraps it.
//! - `reports`: sidecar registrations, heartbeats (→ fault detection) and load reports.
//! - `fault`: phi-accrual failure detection over sidecar heartbeats.
//! - `launch`: how a node agent starts a replica (carried by replica workloads and placements).
//! - `nodes`: what node agents report (`nodestatuses`): GPUs, replicas and their state, weight holders.

pub mod api;
pub mod autoscaler;
pub mod ca;
pub mod cli;
pub mod demo;
pub mod envoy;
pub mod experiments;
pub mod fault;
pub mod identity;
pub mod launch;
pub mod leader_loop;
pub mod metrics;
pub mod nodes;
pub mod placements;
pub mod publish;
pub mod reports;
pub mod resources;
pub mod rollouts;
pub mod scaling;
pub mod scheduler;
pub mod server;
pub mod shards;
pub mod spans;
pub mod store;
pub mod training;
pub mod tls;
pub mod transport;

//! weft-control: the control plane. This crate grows with issue 3 (Raft store, REST API, xDS
//! server glue, weftctl); today it holds the pure decision logic that needs no IO yet.
//!
//! - `fault`: phi-accrual failure detection over sidecar heartbeats.
//! - `store`: the Raft-replicated config store (openraft, log and state persisted in redb).

pub mod fault;
pub mod resources;
pub mod store;
pub mod transport;

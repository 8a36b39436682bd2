//! Shard maps for training jobs, as pure logic (issue 8's planner): which data shards each
//! rank reads (`data`: rendezvous hashing with a size cap, moving about 1/N of the shards per
//! worker joined or lost), the global batch split exactly over the data-parallel ranks
//! (`batch`), the model layout with ZeRO partition ownership (`layout`), and coordinated
//! checkpoints plus the training fault detector (`checkpoint`).
//!
//! `shard-rescale` (weft-bench) measures the movement on rescales against a modulo
//! reassignment.

pub mod batch;
pub mod checkpoint;
pub mod data;
pub mod job;
pub mod layout;

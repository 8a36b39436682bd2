//! autoscale-replay's pieces: the Azure LLM traces as arrivals per bin, and the replay of a
//! trace under an autoscaling policy (queue, cold starts, pools, budget). The policies
//! themselves are `weft_control::autoscaler`; the clairvoyant controls they are measured against
//! are here.

pub mod oracle;
pub mod repeats;
pub mod sim;
pub mod trace;

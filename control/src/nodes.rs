//! What each node's agent reports about its node: the GPUs it found, the replicas it runs for
//! placements and their state, the weight holders that keep base weights resident, and its
//! own problems. Stored as `nodestatuses/<node>`, written by the agent through
//! `PUT /v1/nodestatuses/<node>` (it is an API client like `weftctl`), read by
//! `weftctl node list|describe` and `weftctl schedule status`. Not pushed over xDS: the
//! agents write it, nothing downstream runs it.
//!
//! A report is a whole snapshot, replaced by the next one; [`NodeStatus::stale`] says when its
//! agent has gone quiet. Pure: no IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resources::FieldError;

/// A report older than this (30 s) says nothing about the node now: its agent stopped, or
/// cannot reach the control plane.
pub const STALE_AFTER_MS: u64 = 30_000;

/// Where an agent's GPU inventory came from.
pub const INVENTORY_SOURCES: [&str; 2] = ["nvml", "declared"];

/// How a weight holder shares its resident base weights with the replicas.
pub const HOLDER_MECHANISMS: [&str; 2] = ["memfd", "cuda-ipc"];

/// One node agent's report (`nodestatuses/<node>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeStatus {
    /// The node's name: the resource's name (filled in from the URL when absent).
    pub node: String,
    #[serde(default)]
    pub agent_version: String,
    /// Unix milliseconds of the report.
    pub reported_at_ms: u64,
    /// "nvml" (the agent asked the driver) or "declared" (from its configuration).
    pub inventory_source: String,
    #[serde(default)]
    pub gpus: Vec<GpuStatus>,
    #[serde(default)]
    pub replicas: Vec<ReplicaStatus>,
    #[serde(default)]
    pub holders: Vec<HolderStatus>,
    /// The agent's own problems ("control plane unreachable since ..."); a replica's problem
    /// (a placement naming a GPU the node lacks) is that replica's `reason`.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// One GPU of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStatus {
    pub index: u32,
    #[serde(default)]
    pub name: String,
    pub memory_bytes: u64,
    #[serde(default)]
    pub used_bytes: u64,
}

/// Where a replica's model server is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Started, not yet healthy.
    #[default]
    Starting,
    /// Healthy, its endpoint registered.
    Ready,
    /// Gave up on it (see `reason`).
    Failed,
    /// Waiting before the next start after a failure (see `reason`).
    Backoff,
    /// Its placement went: finishing in-flight requests before it stops.
    Draining,
    Stopped,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Starting => "starting",
            ReplicaState::Ready => "ready",
            ReplicaState::Failed => "failed",
            ReplicaState::Backoff => "backoff",
            ReplicaState::Draining => "draining",
            ReplicaState::Stopped => "stopped",
        }
    }

    /// States an operator must be told the cause of.
    pub fn needs_reason(self) -> bool {
        matches!(self, ReplicaState::Failed | ReplicaState::Backoff)
    }
}

/// One replica the agent runs (or tried to) for a placement on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaStatus {
    /// The placement's name (`placements/<name>`).
    pub placement: String,
    pub variant: String,
    pub base_model: String,
    pub state: ReplicaState,
    /// Why it failed or backs off (`base_path /x.safetensors: No such file`); required then.
    #[serde(default)]
    pub reason: String,
    /// The model server's process (0: none).
    #[serde(default)]
    pub pid: u32,
    /// Its sidecar's process (0: none).
    #[serde(default)]
    pub sidecar_pid: u32,
    /// The sidecar's inbound `host:port` (empty until it listens).
    #[serde(default)]
    pub endpoint: String,
    #[serde(default)]
    pub restarts: u32,
    /// Unix milliseconds the state began.
    #[serde(default)]
    pub since_ms: u64,
    #[serde(default)]
    pub gpu: Option<u32>,
    /// Taken over from a previous agent process (which left the server running).
    #[serde(default)]
    pub adopted: bool,
}

/// A process holding one base model's weights resident on a GPU (or in host memory) for the
/// replicas that share them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderStatus {
    pub base_model: String,
    /// The GPU it holds the weights on (none: host memory).
    #[serde(default)]
    pub gpu: Option<u32>,
    pub pid: u32,
    /// Replicas mapping its weights.
    pub users: u32,
    pub bytes: u64,
    /// "memfd" or "cuda-ipc".
    pub mechanism: String,
}

/// Whether a report made at `reported_at_ms` is stale at `now_ms` (a report from the future,
/// a clock ahead of ours, is not).
pub fn is_stale(reported_at_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(reported_at_ms) > STALE_AFTER_MS
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), message: message.into() }
}

/// `value` must be one of `allowed`.
fn one_of(field: &str, value: &str, allowed: &[&str]) -> Result<(), FieldError> {
    if allowed.contains(&value) { Ok(()) } else { Err(field_err(field, format!("{value:?} is not one of {}", allowed.join(", ")))) }
}

/// The first value of `keys` seen before, with both positions.
fn repeated<K: Ord>(keys: impl IntoIterator<Item = K>) -> Option<(usize, usize)> {
    let mut seen = BTreeMap::new();
    keys.into_iter().enumerate().find_map(|(i, k)| seen.insert(k, i).map(|first| (first, i)))
}

impl NodeStatus {
    /// Whether the report is older than [`STALE_AFTER_MS`] at `now_ms`.
    pub fn stale(&self, now_ms: u64) -> bool {
        is_stale(self.reported_at_ms, now_ms)
    }

    /// Replicas in [`ReplicaState::Ready`].
    pub fn ready_replicas(&self) -> usize {
        self.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count()
    }

    /// The replica the agent runs for `placement`.
    pub fn replica(&self, placement: &str) -> Option<&ReplicaStatus> {
        self.replicas.iter().find(|r| r.placement == placement)
    }

    /// Checks what the types alone do not; the error names the field (`replicas[1].reason`).
    /// The node's name against the URL is checked by `resources::validate`.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.reported_at_ms == 0 {
            return Err(field_err("reported_at_ms", "must be the report's time, in Unix milliseconds"));
        }
        one_of("inventory_source", &self.inventory_source, &INVENTORY_SOURCES)?;
        for (i, g) in self.gpus.iter().enumerate() {
            if g.used_bytes > g.memory_bytes {
                return Err(field_err(
                    format!("gpus[{i}].used_bytes"),
                    format!("{} is more than the GPU's memory_bytes {}", g.used_bytes, g.memory_bytes),
                ));
            }
        }
        if let Some((first, i)) = repeated(self.gpus.iter().map(|g| g.index)) {
            return Err(field_err(format!("gpus[{i}].index"), format!("GPU {} is listed twice (gpus[{first}])", self.gpus[i].index)));
        }
        for (i, r) in self.replicas.iter().enumerate() {
            crate::resources::check_name(&r.placement)
                .map_err(|e| field_err(format!("replicas[{i}].placement"), format!("{} (a placement's name)", e.message)))?;
            if r.state.needs_reason() && r.reason.trim().is_empty() {
                return Err(field_err(format!("replicas[{i}].reason"), format!("a {} replica must say why", r.state.as_str())));
            }
            if !r.endpoint.is_empty() {
                crate::resources::check_address(&format!("replicas[{i}].endpoint"), &r.endpoint)?;
            }
        }
        // One entry per placement, so `weftctl schedule status` can say which state it is in.
        if let Some((first, i)) = repeated(self.replicas.iter().map(|r| r.placement.as_str())) {
            return Err(field_err(
                format!("replicas[{i}].placement"),
                format!("{:?} is listed twice (replicas[{first}]): report one state per placement", self.replicas[i].placement),
            ));
        }
        for (i, h) in self.holders.iter().enumerate() {
            if h.base_model.trim().is_empty() {
                return Err(field_err(format!("holders[{i}].base_model"), "must name the base model it holds"));
            }
            one_of(&format!("holders[{i}].mechanism"), &h.mechanism, &HOLDER_MECHANISMS)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn report() -> serde_json::Value {
        json!({
            "node": "gpu-1", "agent_version": "0.1.0", "reported_at_ms": 1_000_000, "inventory_source": "nvml",
            "gpus": [{"index": 0, "name": "H100", "memory_bytes": 80, "used_bytes": 20}, {"index": 1, "memory_bytes": 80}],
            "replicas": [
                {"placement": "chat-a-od-0", "variant": "a", "base_model": "llama-8b", "state": "ready",
                 "pid": 10, "sidecar_pid": 11, "endpoint": "10.0.0.1:15011", "gpu": 0, "since_ms": 999_000},
                {"placement": "chat-b-od-0", "variant": "b", "base_model": "llama-8b", "state": "backoff",
                 "reason": "base_path /x.safetensors: No such file", "restarts": 3}
            ],
            "holders": [{"base_model": "llama-8b", "gpu": 0, "pid": 9, "users": 1, "bytes": 16, "mechanism": "cuda-ipc"}],
            "warnings": []
        })
    }

    #[test]
    fn a_report_reads_validates_and_answers_questions() {
        let s: NodeStatus = serde_json::from_value(report()).unwrap();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.ready_replicas(), 1);
        assert_eq!(s.replica("chat-b-od-0").map(|r| (r.state, r.restarts)), Some((ReplicaState::Backoff, 3)));
        assert_eq!(s.replica("nope"), None);
        assert_eq!(s.gpus[1].used_bytes, 0, "defaults");
    }

    #[test]
    fn stale_after_thirty_seconds_not_before_and_not_from_the_future() {
        let s = NodeStatus { reported_at_ms: 100_000, ..NodeStatus::default() };
        assert!(!s.stale(100_000 + STALE_AFTER_MS));
        assert!(s.stale(100_001 + STALE_AFTER_MS));
        assert!(!s.stale(50_000), "a clock behind the agent's");
    }

    #[test]
    fn each_bad_field_is_named() {
        type Case = (fn(&mut NodeStatus), &'static str);
        let cases: [Case; 9] = [
            (|s| s.reported_at_ms = 0, "reported_at_ms"),
            (|s| s.inventory_source = "guess".into(), "inventory_source"),
            (|s| s.gpus[1].used_bytes = 81, "gpus[1].used_bytes"),
            (|s| s.gpus[1].index = 0, "gpus[1].index"),
            (|s| s.replicas[1].placement = "a/b".into(), "replicas[1].placement"),
            (|s| s.replicas[1].placement = "chat-a-od-0".into(), "replicas[1].placement"),
            (|s| s.replicas[1].reason = " ".into(), "replicas[1].reason"),
            (|s| s.replicas[0].endpoint = "10.0.0.1".into(), "replicas[0].endpoint"),
            (|s| s.holders[0].mechanism = "shm".into(), "holders[0].mechanism"),
        ];
        for (break_it, field) in cases {
            let mut s: NodeStatus = serde_json::from_value(report()).unwrap();
            break_it(&mut s);
            let e = s.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }
}

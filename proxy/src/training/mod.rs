//! A training worker's sidecar (config `training`): the job's shard map arrives over xDS
//! (`weft.v1.ShardMap`, subscribed by name); the trainer reads it, acknowledges it and reports
//! its checkpoints on loopback (the admin address); every sidecar report carries that state
//! to the control plane, which turns the ranks' checkpoints into complete ones and silent
//! trainers into dead ranks. On drain the trainer's checkpoint hook is called first.
//!
//! - [`state`]: the map, the trainer's progress and the report (pure);
//! - [`api`]: the loopback HTTP API the trainer calls;
//! - [`hook`]: the checkpoint hook call on drain.

pub mod api;
pub mod hook;
pub mod state;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config;
use state::State;

/// The sidecar's training side, shared by the xDS client, the report stream and the admin API.
pub struct Trainer {
    state: Mutex<State>,
    /// The map revision, for long polls.
    changed: tokio::sync::watch::Sender<u64>,
    hook: Option<hook::Hook>,
    hook_deadline: Duration,
}

impl Trainer {
    /// From the `training` section (`node_id` is the default worker name); errors name the field.
    pub fn from_config(t: &config::Training, node_id: &str) -> Result<Trainer, String> {
        if t.job.trim().is_empty() {
            return Err("training.job: required (the trainingjobs/<job> this worker belongs to)".into());
        }
        let worker = if t.worker.is_empty() { node_id.to_owned() } else { t.worker.clone() };
        if worker.is_empty() {
            return Err("training.worker: required when node.id is empty".into());
        }
        let hook = match t.checkpoint_hook.as_str() {
            "" => None,
            url => Some(hook::Hook::parse(url).map_err(|e| format!("training.checkpoint_hook: {e}"))?),
        };
        if t.hook_deadline.is_zero() || t.hook_deadline.0 > Duration::from_secs(3600) {
            return Err("training.hook_deadline: must be above 0 and at most 1h".into());
        }
        let host = if !t.host.is_empty() {
            t.host.clone()
        } else {
            std::env::var("NODE_NAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| node_id.to_owned())
        };
        let mut state = State::new(t.job.clone(), worker);
        state.host = host;
        Ok(Trainer {
            state: Mutex::new(state),
            changed: tokio::sync::watch::Sender::new(0),
            hook,
            hook_deadline: t.hook_deadline.0,
        })
    }

    pub fn job(&self) -> String {
        self.state.lock().unwrap().job.clone()
    }

    /// A State-of-the-World push of shard maps (the xDS client's verdict). A map that names
    /// this worker as draining (its node got a preemption notice) starts the drain: the
    /// checkpoint hook is called in the background, within the notice's deadline.
    pub fn absorb(self: &Arc<Self>, resources: &[weft_xds::transport::Any]) -> Result<(), String> {
        let notice = {
            let mut s = self.state.lock().unwrap();
            if s.absorb(resources)? {
                tracing::info!(job = %s.job, revision = s.revision(), "shard map updated");
                self.changed.send_replace(s.revision());
            }
            s.take_notice()
        };
        if let Some(deadline) = notice {
            let t = self.clone();
            tracing::warn!("preemption notice for this worker: calling the trainer's checkpoint hook");
            tokio::spawn(async move {
                t.drain_within("preemption", deadline).await;
            });
        }
        Ok(())
    }

    pub fn report(&self) -> weft_xds::resources::v1::TrainingReport {
        self.state.lock().unwrap().report(Instant::now())
    }

    /// Calls the checkpoint hook (if any) and waits for it, at most the hook deadline; the
    /// reports say `draining` meanwhile and `ready_to_stop` after. Returns what happened,
    /// for the drain's answer and the log.
    pub async fn drain(&self, reason: &str) -> serde_json::Value {
        self.drain_within(reason, Duration::ZERO).await
    }

    /// [`drain`](Self::drain) with a deadline of its own (zero = the configured one; a
    /// shorter one wins).
    pub async fn drain_within(&self, reason: &str, deadline: Duration) -> serde_json::Value {
        let hook_deadline = if deadline.is_zero() { self.hook_deadline } else { deadline.min(self.hook_deadline) };
        let (before, body) = {
            let mut s = self.state.lock().unwrap();
            s.set_draining(false);
            let body = serde_json::json!({
                "job": s.job, "worker": s.worker, "reason": reason,
                "deadline_ms": hook_deadline.as_millis() as u64,
                "step": s.report(Instant::now()).step,
            });
            (s.last_checkpoint(), body)
        };
        let outcome = match &self.hook {
            None => "no checkpoint hook configured".to_string(),
            Some(h) => match tokio::time::timeout(hook_deadline, h.call(body)).await {
                Ok(Ok(())) => "ok".into(),
                Ok(Err(e)) => format!("hook failed: {e}"),
                Err(_) => format!("hook did not answer within {hook_deadline:?}"),
            },
        };
        let mut s = self.state.lock().unwrap();
        s.set_draining(true);
        // Reported during the hook: a new report, even at the step of the one before it (a
        // drain right after a periodic checkpoint checkpoints the same step again).
        let (reports, step) = s.last_checkpoint();
        let checkpoint = step.filter(|_| reports != before.0);
        tracing::info!(job = %s.job, worker = %s.worker, hook = %outcome, ?checkpoint, "training drain: ready to stop");
        serde_json::json!({"hook": outcome, "checkpoint_step": checkpoint, "ready_to_stop": true})
    }
}

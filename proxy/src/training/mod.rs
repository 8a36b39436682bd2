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

use std::sync::Mutex;
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
        Ok(Trainer {
            state: Mutex::new(State::new(t.job.clone(), worker)),
            changed: tokio::sync::watch::Sender::new(0),
            hook,
            hook_deadline: t.hook_deadline.0,
        })
    }

    pub fn job(&self) -> String {
        self.state.lock().unwrap().job.clone()
    }

    /// A State-of-the-World push of shard maps (the xDS client's verdict).
    pub fn absorb(&self, resources: &[weft_xds::transport::Any]) -> Result<(), String> {
        let mut s = self.state.lock().unwrap();
        if s.absorb(resources)? {
            tracing::info!(job = %s.job, revision = s.revision(), "shard map updated");
            self.changed.send_replace(s.revision());
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
        let (before, body) = {
            let mut s = self.state.lock().unwrap();
            s.set_draining(false);
            let body = serde_json::json!({
                "job": s.job, "worker": s.worker, "reason": reason,
                "deadline_ms": self.hook_deadline.as_millis() as u64,
                "step": s.report(Instant::now()).step,
            });
            (s.last_checkpoint(), body)
        };
        let outcome = match &self.hook {
            None => "no checkpoint hook configured".to_string(),
            Some(h) => match tokio::time::timeout(self.hook_deadline, h.call(body)).await {
                Ok(Ok(())) => "ok".into(),
                Ok(Err(e)) => format!("hook failed: {e}"),
                Err(_) => format!("hook did not answer within {:?}", self.hook_deadline),
            },
        };
        let mut s = self.state.lock().unwrap();
        s.set_draining(true);
        let after = s.last_checkpoint();
        let checkpoint = after.filter(|a| before.is_none_or(|b| *a != b));
        tracing::info!(job = %s.job, worker = %s.worker, hook = %outcome, ?checkpoint, "training drain: ready to stop");
        serde_json::json!({"hook": outcome, "checkpoint_step": checkpoint, "ready_to_stop": true})
    }
}

//! What a training sidecar knows, free of IO: the job's pushed shard map, what the trainer
//! told it (the map in effect, its step, its checkpoints, when it last called), and the
//! report of all that for the control plane.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};
use weft_xds::resources::v1;

/// Checkpoints repeated in every report (the control plane needs the newest few only: a
/// checkpoint counts when every rank reported the same step).
pub const KEPT_CHECKPOINTS: usize = 16;

/// The sidecar's state for its trainer.
#[derive(Debug)]
pub struct State {
    pub job: String,
    pub worker: String,
    /// The machine it runs on (what preemption notices name).
    pub host: String,
    /// A preemption notice for this worker was acted on.
    noticed: bool,
    map: Option<v1::ShardMap>,
    /// Increases with every push that changed the map (what `/training/map?after=` compares).
    revision: u64,
    acked: u64,
    step: u64,
    last_call: Option<Instant>,
    /// Long polls the trainer has open: it is alive while it waits on one.
    polls: u32,
    checkpoints: VecDeque<v1::CheckpointReport>,
    /// Checkpoint reports accepted so far: a checkpoint taken again at the step of the last
    /// one (a drain right after a periodic checkpoint) is still a new report.
    reports: u64,
    draining: bool,
    ready_to_stop: bool,
}

/// `POST /training/ack`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub version: u64,
    #[serde(default)]
    pub step: u64,
}

/// `POST /training/checkpoint`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u64,
    pub step: u64,
    pub location: String,
    #[serde(default)]
    pub r#final: bool,
}

/// A trainer request refused: the field and why.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub field: &'static str,
    pub message: String,
}

fn refuse(field: &'static str, message: impl Into<String>) -> Refused {
    Refused { field, message: message.into() }
}

impl State {
    pub fn new(job: String, worker: String) -> State {
        State {
            job,
            worker,
            host: String::new(),
            noticed: false,
            map: None,
            revision: 0,
            acked: 0,
            step: 0,
            last_call: None,
            polls: 0,
            checkpoints: VecDeque::new(),
            reports: 0,
            draining: false,
            ready_to_stop: false,
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Takes a State-of-the-World push of shard maps: this job's map, if present, must be
    /// well formed (else the push is NACKed and the old map stays). Returns whether the map
    /// changed.
    pub fn absorb(&mut self, resources: &[weft_xds::transport::Any]) -> Result<bool, String> {
        let mut mine = None;
        for any in resources {
            let m = v1::ShardMap::decode(any.value.as_slice()).map_err(|e| format!("shard map: {e}"))?;
            if m.name == self.job {
                check(&m)?;
                mine = Some(m);
            }
        }
        if mine == self.map {
            return Ok(false);
        }
        self.map = mine;
        self.revision += 1;
        Ok(true)
    }

    /// A preemption notice the pushed map carries for this worker, not acted on yet: its
    /// deadline (zero = none given). Marks it acted on.
    pub fn take_notice(&mut self) -> Option<std::time::Duration> {
        let m = self.map.as_ref()?;
        if self.noticed || !m.draining.iter().any(|w| w == &self.worker) {
            return None;
        }
        self.noticed = true;
        Some(std::time::Duration::from_millis(m.drain_deadline_ms))
    }

    /// A call from the trainer: it is alive.
    pub fn touch(&mut self, now: Instant) {
        self.last_call = Some(now);
    }

    /// A long poll opens (`true`) or ends (`false`).
    pub fn polling(&mut self, open: bool, now: Instant) {
        self.polls = if open { self.polls + 1 } else { self.polls.saturating_sub(1) };
        self.last_call = Some(now);
    }

    pub fn ack(&mut self, a: &Ack) -> Result<(), Refused> {
        let current = self.map.as_ref().map_or(0, |m| m.version);
        if a.version != current {
            return Err(refuse("version", format!("map version {} is not the current one ({current})", a.version)));
        }
        (self.acked, self.step) = (a.version, a.step);
        Ok(())
    }

    pub fn checkpoint(&mut self, c: Checkpoint) -> Result<(), Refused> {
        if c.location.trim().is_empty() {
            return Err(refuse("location", "empty: say where the checkpoint was written"));
        }
        if c.location.len() > 4096 {
            return Err(refuse("location", "longer than 4096 bytes"));
        }
        let known = self.map.as_ref().map_or(0, |m| m.version);
        if c.version == 0 || c.version > known {
            return Err(refuse("version", format!("map version {} was never pushed here (current {known})", c.version)));
        }
        self.step = self.step.max(c.step);
        self.checkpoints.retain(|k| !(k.map_version == c.version && k.step == c.step));
        self.checkpoints.push_back(v1::CheckpointReport { map_version: c.version, step: c.step, location: c.location, r#final: c.r#final });
        while self.checkpoints.len() > KEPT_CHECKPOINTS {
            self.checkpoints.pop_front();
        }
        self.reports += 1;
        Ok(())
    }

    /// The newest checkpoint step reported (any map), with the number of reports so far (so
    /// a caller can tell a new report from the same one).
    pub fn last_checkpoint(&self) -> (u64, Option<u64>) {
        (self.reports, self.checkpoints.back().map(|c| c.step))
    }

    pub fn set_draining(&mut self, ready: bool) {
        self.draining = true;
        self.ready_to_stop = ready;
    }

    /// What goes into every report.
    pub fn report(&self, now: Instant) -> v1::TrainingReport {
        v1::TrainingReport {
            job: self.job.clone(),
            worker: self.worker.clone(),
            map_version: self.acked,
            step: self.step,
            trainer_idle_ms: match self.last_call {
                Some(t) if self.polls == 0 => now.saturating_duration_since(t).as_millis() as u64,
                _ => 0,
            },
            trainer_seen: self.last_call.is_some(),
            checkpoints: self.checkpoints.iter().cloned().collect(),
            draining: self.draining,
            ready_to_stop: self.ready_to_stop,
            host: self.host.clone(),
        }
    }

    /// The trainer's view of the map (`GET /training/map`), if there is one.
    pub fn view(&self) -> Option<Value> {
        let m = self.map.as_ref()?;
        let rank = m.ranks.iter().find(|r| r.worker == self.worker).map(|r| r.rank);
        Some(json!({
            "revision": self.revision,
            "job": m.name,
            "worker": self.worker,
            // Absent: this worker is not in the map (scaled away or declared dead): stop.
            "rank": rank,
            "version": m.version,
            "workers": m.workers,
            "global_batch": m.global_batch,
            "checkpoint_every": m.checkpoint_every,
            "checkpoint_at": (m.checkpoint_at > 0).then_some(m.checkpoint_at),
            "resume": m.resume.as_ref().map(manifest),
            "completed": m.completed.as_ref().map(manifest),
            "ranks": m.ranks.iter().map(rank_json).collect::<Vec<_>>(),
        }))
    }

    /// For `GET /training/status`.
    pub fn status(&self, now: Instant) -> Value {
        let r = self.report(now);
        json!({
            "job": r.job, "worker": r.worker, "revision": self.revision,
            "map_version": self.map.as_ref().map(|m| m.version), "acked_version": r.map_version, "step": r.step,
            "trainer_seen": r.trainer_seen, "trainer_idle_ms": r.trainer_idle_ms,
            "checkpoints": r.checkpoints.iter().map(|c| json!({"version": c.map_version, "step": c.step, "location": c.location, "final": c.r#final})).collect::<Vec<_>>(),
            "draining": r.draining, "ready_to_stop": r.ready_to_stop,
        })
    }
}

/// How long a long poll may be asked to wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Rejects a map the trainer could not use.
fn check(m: &v1::ShardMap) -> Result<(), String> {
    if m.version == 0 {
        return Err(format!("shard map {}: version 0", m.name));
    }
    if m.ranks.len() != m.workers as usize {
        return Err(format!("shard map {}: {} ranks for {} workers", m.name, m.ranks.len(), m.workers));
    }
    for (i, r) in m.ranks.iter().enumerate() {
        if r.rank as usize != i || r.worker.is_empty() {
            return Err(format!("shard map {}: rank {i} is numbered {} for worker {:?}", m.name, r.rank, r.worker));
        }
        if r.shard_sizes.len() != r.shards.len() {
            return Err(format!("shard map {}: rank {i} has {} shards but {} sizes", m.name, r.shards.len(), r.shard_sizes.len()));
        }
    }
    Ok(())
}

fn manifest(m: &v1::CheckpointManifest) -> Value {
    json!({
        "step": m.step,
        "map_version": m.map_version,
        "final": m.r#final,
        "parts": m.parts.iter().map(|p| json!({"rank": p.rank, "worker": p.worker, "location": p.location})).collect::<Vec<_>>(),
    })
}

fn rank_json(r: &v1::RankShards) -> Value {
    json!({
        "rank": r.rank, "worker": r.worker, "shards": r.shards, "shard_sizes": r.shard_sizes,
        "samples": r.samples, "accumulation_steps": r.accumulation_steps, "micro_batches": r.micro_batches,
        "tp_index": r.tp_index, "stage": r.stage, "dp_index": r.dp_index,
        "layers": [r.first_layer, r.end_layer], "partition": [r.partition_start, r.partition_end], "owns": r.owns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(version: u64, workers: &[&str]) -> weft_xds::transport::Any {
        let m = v1::ShardMap {
            name: "job".into(),
            version,
            workers: workers.len() as u32,
            global_batch: 8,
            checkpoint_every: 10,
            ranks: workers
                .iter()
                .enumerate()
                .map(|(i, w)| v1::RankShards {
                    rank: i as u32,
                    worker: w.to_string(),
                    shards: vec![format!("shard-{i}")],
                    shard_sizes: vec![100],
                    samples: 8 / workers.len() as u64,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        weft_xds::transport::Any { type_url: weft_xds::typeurl::SHARD_MAP.into(), value: m.encode_to_vec() }
    }

    #[test]
    fn only_this_jobs_well_formed_map_is_taken() {
        let mut s = State::new("job".into(), "job-1".into());
        assert!(s.view().is_none());
        assert!(s.absorb(&[map(1, &["job-0", "job-1"])]).unwrap());
        let v = s.view().unwrap();
        assert_eq!((v["rank"].as_u64(), v["version"].as_u64(), v["revision"].as_u64()), (Some(1), Some(1), Some(1)));
        assert!(!s.absorb(&[map(1, &["job-0", "job-1"])]).unwrap(), "the same map again is no change");
        let mut broken = v1::ShardMap::decode(map(2, &["job-0", "job-1"]).value.as_slice()).unwrap();
        broken.ranks[1].shard_sizes.clear();
        let any = weft_xds::transport::Any { type_url: String::new(), value: broken.encode_to_vec() };
        assert!(s.absorb(&[any]).unwrap_err().contains("rank 1 has 1 shards but 0 sizes"));
        assert_eq!(s.view().unwrap()["version"], 1, "the old map stays");
        // Scaled away: the map no longer names this worker.
        assert!(s.absorb(&[map(3, &["job-0"])]).unwrap());
        assert_eq!(s.view().unwrap()["rank"], Value::Null);
        assert_eq!(s.revision(), 2);
    }

    #[test]
    fn acks_and_checkpoints_are_checked_and_reported() {
        let mut s = State::new("job".into(), "job-0".into());
        s.absorb(&[map(4, &["job-0"])]).unwrap();
        assert_eq!(s.ack(&Ack { version: 3, step: 0 }).unwrap_err().field, "version");
        s.ack(&Ack { version: 4, step: 7 }).unwrap();
        let bad = Checkpoint { version: 4, step: 10, location: " ".into(), r#final: false };
        assert_eq!(s.checkpoint(bad).unwrap_err().field, "location");
        let future = Checkpoint { version: 9, step: 10, location: "/ck".into(), r#final: false };
        assert_eq!(s.checkpoint(future).unwrap_err().field, "version");
        for step in (10..=200).step_by(10) {
            s.checkpoint(Checkpoint { version: 4, step, location: format!("/ck/{step}"), r#final: false }).unwrap();
        }
        let t0 = Instant::now();
        s.touch(t0);
        let r = s.report(t0 + Duration::from_millis(1500));
        assert_eq!((r.map_version, r.step, r.trainer_seen, r.trainer_idle_ms), (4, 200, true, 1500));
        assert_eq!(r.checkpoints.len(), KEPT_CHECKPOINTS, "the newest few only");
        assert_eq!(r.checkpoints.last().unwrap().location, "/ck/200");
        s.polling(true, t0);
        assert_eq!(s.report(t0 + Duration::from_secs(20)).trainer_idle_ms, 0, "waiting on a long poll is alive");
        s.polling(false, t0 + Duration::from_secs(20));
        assert_eq!(s.report(t0 + Duration::from_secs(21)).trainer_idle_ms, 1000);
        assert_eq!(s.last_checkpoint().1, Some(200));
        // The same step checkpointed again (a drain right after a periodic checkpoint) is a
        // new report: a drain waiting on its hook must see it.
        let (reports, _) = s.last_checkpoint();
        s.checkpoint(Checkpoint { version: 4, step: 200, location: "/ck/200-again".into(), r#final: false }).unwrap();
        assert_eq!(s.last_checkpoint(), (reports + 1, Some(200)));
    }
}

//! Training jobs end to end, with the real binaries on loopback: one `weft-control`, and per
//! worker a `weft-proxy` training sidecar plus a `weft-toy-trainer` (see its doc: each rank
//! folds the records of its shards into a sum, checkpoints to files at the barrier steps, and
//! restarts from the last complete checkpoint on every new map). The test is the launcher: it
//! starts a sidecar and a trainer for every worker a map names, once.
//!
//! The job is scaled 4 → 6, one rank's trainer is killed (the fault detector drops it: 5), a
//! coordinated checkpoint is asked for at a step the control plane picks, then it is scaled to 3; the final result must equal the single-process fold over the whole
//! dataset (no shard lost or counted twice), and the map after the kill must have restarted
//! every rank from the last complete checkpoint while the survivors had run past it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::*;
use weft_tests::toy::{restore, whole};
use weft_tests::*;

const JOB: &str = "toy";

fn sizes() -> Vec<u64> {
    (0..64).map(|i| 700 + (i * 37) % 200).collect()
}

/// Sidecar + trainer per worker, each started once.
struct Launcher {
    dir: std::path::PathBuf,
    step_ms: u64,
    workers: BTreeMap<String, (SidecarProc, TrainerProc)>,
}

impl Launcher {
    /// Starts what `map` names and is not started yet; stops the sidecars of exited trainers.
    /// A sidecar that died on its own (a free port taken by a parallel test before it bound
    /// it) is started again on new ports, with a new trainer.
    fn sync(&mut self, control: &ControlProc, map: &Value) {
        for r in map["ranks"].as_array().into_iter().flatten() {
            let w = r["worker"].as_str().unwrap().to_owned();
            let died = self.workers.get_mut(&w).is_some_and(|(side, trainer)| !side.running() && trainer.running());
            if died || !self.workers.contains_key(&w) {
                let side = SidecarProc::training(&w, &self.dir, &[control], JOB, None);
                let trainer = TrainerProc::start(&w, side.admin, &self.dir, self.step_ms, None);
                self.workers.insert(w, (side, trainer));
            }
        }
        for (side, trainer) in self.workers.values_mut() {
            if !trainer.running() {
                side.kill();
            }
        }
    }

    fn logs(&self) -> String {
        self.workers.values().map(|(_, t)| format!("--- {}\n{}", t.worker, t.log_text())).collect()
    }
}

async fn status(c: &HttpClient, node: &ControlProc) -> Value {
    let (s, v) = api(c, Method::GET, node.api, &format!("/v1/training/{JOB}"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// Polls the job's status (keeping the launcher in step) until `done` holds.
async fn until(c: &HttpClient, node: &ControlProc, l: &mut Launcher, what: &str, limit: Duration, mut done: impl FnMut(&Value) -> bool) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let st = status(c, node).await;
        l.sync(node, &st["map"]);
        if done(&st) {
            return st;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting until {what}\nstatus: {st:#}\n{}", l.logs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn workers_of(map: &Value) -> Vec<String> {
    map["ranks"].as_array().into_iter().flatten().map(|r| r["worker"].as_str().unwrap().to_owned()).collect()
}

fn last_step(st: &Value) -> Option<u64> {
    st["checkpoints"]["last"]["step"].as_u64()
}

async fn create_job(c: &HttpClient, node: &ControlProc, workers: u32, sizes: &[u64]) {
    let job = json!({"workers": workers, "shard_sizes": sizes, "global_batch": 32, "max_micro_batch": 4,
        "checkpoint_every": 10, "dead_after_s": 3, "start_grace_s": 60, "rescale_wait_s": 10});
    let (s, v) = api(c, Method::PUT, node.api, &format!("/v1/trainingjobs/{JOB}"), Some(job)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// A single-node control plane, leading, with the test job of `workers` over `sizes`.
async fn control_with_job(c: &HttpClient, root: &std::path::Path, workers: u32, sizes: &[u64]) -> ControlProc {
    let node = ControlProc::start(1, root, true, None);
    wait_for("the control node leads", Duration::from_secs(20), || async { node.status(c).await.filter(|s| s["leader"] == json!(1)) }).await;
    create_job(c, &node, workers, sizes).await;
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_scaled_4_6_3_with_a_rank_killed_trains_every_record_exactly_once() {
    let root = tempfile::tempdir().unwrap();
    let c = client();
    let sizes = sizes();
    let node = control_with_job(&c, root.path(), 4, &sizes).await;
    let mut l = Launcher { dir: root.path().join("workers"), step_ms: 10, workers: BTreeMap::new() };
    let limit = Duration::from_secs(60);

    // 4 workers train; checkpoints complete.
    let st = until(&c, &node, &mut l, "4 ranks checkpointed step 30", limit, |s| last_step(s).is_some_and(|k| k >= 30)).await;
    assert_eq!((st["map"]["version"].as_u64(), st["map"]["workers"].as_u64()), (Some(1), Some(4)));
    let before = last_step(&st).unwrap();

    // Scale to 6: the switch waits for a checkpoint newer than the request.
    weftctl(&node, &["training", "scale", JOB, "--workers", "6"]);
    let st = until(&c, &node, &mut l, "map v2 for 6 workers", limit, |s| s["map"]["version"] == 2).await;
    let v2 = st["map"].clone();
    assert_eq!(v2["workers"], 6);
    let resume2 = v2["resume"]["step"].as_u64().expect("v2 resumes from a checkpoint");
    assert!(resume2 > before, "the rescale waited for a fresh checkpoint: {resume2} > {before}");
    let moved = v2["moved"].as_f64().unwrap();
    assert!((0.2..0.5).contains(&moved), "about 1/3 of the shards moved 4 → 6: {moved}");
    let st = until(&c, &node, &mut l, "6 ranks completed a checkpoint", limit, |s| s["checkpoints"]["last"]["map_version"] == 2).await;
    assert_eq!(st["completed"], false, "the job must still be running for the rest of the test");

    // Kill one rank's trainer (rank 2): the fault detector drops it; every rank restarts from
    // the last complete checkpoint, though the survivors had trained past it.
    let victim = v2["ranks"][2]["worker"].as_str().unwrap().to_owned();
    l.workers.get_mut(&victim).unwrap().1.child.kill();
    let survivors: Vec<String> = workers_of(&v2).into_iter().filter(|w| *w != victim).collect();
    let mut ran_to = 0;
    let st = until(&c, &node, &mut l, "map v3 without the killed rank", limit, |s| {
        if s["map"]["version"] == 2 {
            for w in &survivors {
                ran_to = ran_to.max(s["trainers"][w]["step"].as_u64().unwrap_or(0));
            }
        }
        s["map"]["version"] == 3
    })
    .await;
    let v3 = st["map"].clone();
    assert_eq!(workers_of(&v3), survivors, "the dead rank left; the others kept their order");
    assert_eq!(st["workers"], 5, "the job's worker count follows (history shows the fault detector's write)");
    let resume3 = &v3["resume"];
    assert_eq!(resume3["map_version"], 2, "resumed from a checkpoint all six ranks took");
    let resume3_step = resume3["step"].as_u64().unwrap();
    assert!(ran_to > resume3_step, "survivors had reached step {ran_to}, beyond the checkpoint ({resume3_step}) they restart from");
    let (_, hist) = api(&c, Method::GET, node.api, &format!("/v1/trainingjobs/{JOB}/history"), None).await;
    assert!(hist.to_string().contains("\"workers\":5"), "the drop to 5 workers is in the job's history: {hist}");

    // Scale to 3, then run to the end.
    let st = until(&c, &node, &mut l, "a checkpoint under map v3", limit, |s| s["checkpoints"]["last"]["map_version"] == 3).await;
    assert_eq!(st["completed"], false, "the job must still be running");
    // A coordinated checkpoint on request: the control plane picks the step, every rank takes it.
    // 100 steps (1 s) ahead: the toy's ranks step independently (real data-parallel ranks move
    // in lockstep), so the map must reach every one before it passes the step, also on a
    // loaded CI machine (23 steps once fell short there).
    let (s, asked) = api(&c, Method::POST, node.api, &format!("/v1/training/{JOB}/checkpoint"), Some(json!({"after_steps": 100}))).await;
    assert_eq!(s, StatusCode::OK, "{asked}");
    let k = asked["step"].as_u64().unwrap();
    assert_eq!(k, asked["furthest_rank_step"].as_u64().unwrap() + 100);
    let st = until(&c, &node, &mut l, "a complete checkpoint at or after the requested step", limit, |s| last_step(s).is_some_and(|x| x >= k)).await;
    let files: Vec<String> = std::fs::read_dir(l.dir.join("ckpt").join(JOB)).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for rank in 0..5 {
        assert!(files.iter().any(|f| f.starts_with(&format!("m3-s{k}-r{rank}-"))), "rank {rank} checkpointed at the requested step {k}");
    }
    assert_eq!(st["completed"], false, "the job must still be running to scale it to 3");
    weftctl(&node, &["training", "scale", JOB, "--workers", "3"]);
    let st = until(&c, &node, &mut l, "map v4 for 3 workers", limit, |s| s["map"]["version"] == 4).await;
    assert_eq!(st["map"]["workers"], 3);
    let st = until(&c, &node, &mut l, "the job completed", Duration::from_secs(180), |s| s["completed"] == true).await;
    let last = &st["checkpoints"]["last"];
    assert_eq!((last["final"].as_bool(), last["map_version"].as_u64()), (Some(true), Some(4)));

    // The result equals the single-process one: every record trained on exactly once.
    let (model, offsets) = restore(last["parts"].as_array().unwrap()).unwrap();
    let expected = whole(&sizes);
    assert_eq!(model.count, sizes.iter().sum::<u64>(), "records trained on");
    assert_eq!(model, expected, "distributed result = single-process result");
    assert_eq!(offsets.len(), sizes.len(), "every shard read to its end by exactly one rank");
    for (i, s) in sizes.iter().enumerate() {
        assert_eq!(offsets[&weft_tests::toy::shard_id(i)], *s);
    }
    // The survivors' logs show the restart from that checkpoint.
    let log = l.workers[&survivors[0]].1.log_text();
    assert!(log.contains(&format!("map version=3 rank=0 resume_step={resume3_step} ")), "{log}");
    eprintln!(
        "training e2e: v2 resume step {resume2} (asked after {before}), moved {moved:.3}; killed {victim}, survivors ran to {ran_to}, \
         v3 resumed from step {resume3_step}; final step {} over {} records = single-process result",
        last["step"], model.count
    );
    let text = weftctl(&node, &["training", "status", JOB]);
    eprintln!("{text}");
    assert!(text.contains("final, the job is completed") && text.contains("map version 4 for 3 workers"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_calls_the_trainers_checkpoint_hook_before_ready_to_stop() {
    let root = tempfile::tempdir().unwrap();
    let c = client();
    let node = control_with_job(&c, root.path(), 1, &[1_000_000]).await;
    let dir = root.path().join("w");
    let hook = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let side = SidecarProc::training(&format!("{JOB}-0"), &dir, &[&node], JOB, Some(hook));
    let trainer = TrainerProc::start(&format!("{JOB}-0"), side.admin, &dir, 10, Some(hook));
    let w = format!("{JOB}-0");
    wait_for("the trainer runs", Duration::from_secs(30), || async {
        status(&c, &node).await["trainers"][&w]["step"].as_u64().filter(|s| *s > 3)
    })
    .await;

    let (s, body) = api(&c, Method::POST, side.admin, "/drain", None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["training"]["hook"], "ok", "{body}");
    let step = body["training"]["checkpoint_step"].as_u64().expect("the hook's checkpoint was reported before the answer");
    assert!(std::fs::read_dir(dir.join("ckpt").join(JOB)).unwrap().any(|e| {
        e.unwrap().file_name().to_string_lossy().starts_with(&format!("m1-s{step}-r0-"))
    }), "the checkpoint file of step {step} exists");
    // The hook's checkpoint, or one the trainer reported after it before the sidecar answered
    // (a drained worker keeps training until it is stopped: its gang may need a later step).
    let log = trainer.log_text();
    let hooked: Option<u64> = log.lines().find_map(|l| l.strip_prefix("hook checkpoint step=")?.trim().parse().ok());
    assert!(hooked.is_some_and(|h| h <= step), "the hook checkpointed at or before step {step}: {log}");
    wait_for("the control plane sees the worker ready to stop", Duration::from_secs(10), || async {
        (status(&c, &node).await["trainers"][&w]["ready_to_stop"] == true).then_some(())
    })
    .await;
    let (s, body) = api(&c, Method::POST, side.admin, "/training/checkpoint", Some(json!({"version": 1, "step": 5, "location": ""}))).await;
    assert_eq!((s, body["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("location")), "{body}");
}

/// A spot preemption notice for a training worker's node: its sidecar calls the trainer's
/// checkpoint hook, and the whole gang checkpoints at a step the control plane picks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_notice_drains_the_workers_on_that_node_and_checkpoints_the_gang() {
    let root = tempfile::tempdir().unwrap();
    let c = client();
    let node = control_with_job(&c, root.path(), 2, &[1_000_000, 1_000_000]).await;
    let dir = root.path().join("w");
    let mut procs = Vec::new();
    for i in 0..2 {
        let w = format!("{JOB}-{i}");
        let hook = SocketAddr::from(([127, 0, 0, 1], free_port()));
        // The sidecar's host defaults to its node id: the worker name here.
        let side = SidecarProc::training(&w, &dir, &[&node], JOB, Some(hook));
        let trainer = TrainerProc::start(&w, side.admin, &dir, 10, Some(hook));
        procs.push((side, trainer));
    }
    wait_for("both trainers run", Duration::from_secs(30), || async {
        let st = status(&c, &node).await;
        (0..2).all(|i| st["trainers"][format!("{JOB}-{i}")]["step"].as_u64().is_some_and(|s| s > 3)).then_some(())
    })
    .await;
    let (s, body) = api(&c, Method::POST, node.api, "/v1/autoscale/preemption", Some(json!({"node": format!("{JOB}-1"), "notice_s": 20, "checkpoint_after_steps": 60}))).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let t = &body["training"][0];
    assert_eq!((t["job"].as_str(), t["draining"].clone()), (Some(JOB), json!([format!("{JOB}-1")])), "{body}");
    let k = t["checkpoint_at"].as_u64().expect("a gang checkpoint step");
    let st = wait_for("the preempted worker is ready to stop and the gang checkpointed at the chosen step", Duration::from_secs(30), || async {
        let st = status(&c, &node).await;
        (st["trainers"][format!("{JOB}-1")]["ready_to_stop"] == true && last_step(&st).is_some_and(|x| x >= k)).then_some(st)
    })
    .await;
    assert!(procs[1].1.log_text().contains("hook checkpoint step="), "the hook ran on the preempted worker");
    assert_ne!(st["trainers"][format!("{JOB}-0")]["draining"], true, "the other node's worker is not drained");
    assert!(!procs[0].1.log_text().contains("hook checkpoint"), "nor its hook called");
    let files: Vec<String> = std::fs::read_dir(dir.join("ckpt").join(JOB)).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for rank in 0..2 {
        assert!(files.iter().any(|f| f.starts_with(&format!("m1-s{k}-r{rank}-"))), "rank {rank} checkpointed at step {k}: {files:?}");
    }
}

//! A toy data-parallel trainer for the training end-to-end test: it gets its rank's shards from
//! its weft sidecar, "trains" by folding its shards' records into `weft_tests::toy::Model`,
//! checkpoints to files at the map's barrier steps, and restarts from the last complete
//! checkpoint whenever the control plane pushes a new map (a rescale, a dead rank).
//!
//! Each step a rank reads its batch share (`samples`) from its shards in map order. Every rank
//! computes the same last step from the map and the checkpoint it resumed from (the longest
//! rank's remaining work), checkpoints there with `final`, and exits once the control plane
//! marks the job completed, or when the map no longer names it.
//!
//! `weft-toy-trainer --sidecar 127.0.0.1:9901 --dir /ckpt [--step-ms 10] [--hook 127.0.0.1:7070]`
//! (`--hook`: serve the checkpoint hook the sidecar calls on drain: checkpoint now, then 200).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::api;
use weft_tests::toy::{Model, Snapshot, record, restore};
use weft_tests::{HttpClient, client};

struct Args {
    sidecar: SocketAddr,
    dir: PathBuf,
    step: Duration,
    hook: Option<SocketAddr>,
}

fn args() -> Result<Args, String> {
    let mut a = std::env::args().skip(1);
    let (mut sidecar, mut dir, mut step, mut hook) = (None, None, Duration::from_millis(10), None);
    while let Some(k) = a.next() {
        let v = a.next().ok_or(format!("{k}: needs a value"))?;
        match k.as_str() {
            "--sidecar" => sidecar = Some(v.parse().map_err(|e| format!("--sidecar {v}: {e}"))?),
            "--dir" => dir = Some(PathBuf::from(v)),
            "--step-ms" => step = Duration::from_millis(v.parse().map_err(|e| format!("--step-ms {v}: {e}"))?),
            "--hook" => hook = Some(v.parse().map_err(|e| format!("--hook {v}: {e}"))?),
            _ => return Err(format!("unknown flag {k}")),
        }
    }
    Ok(Args { sidecar: sidecar.ok_or("--sidecar is required")?, dir: dir.ok_or("--dir is required")?, step, hook })
}

/// Training under one map.
struct Run {
    job: String,
    worker: String,
    version: u64,
    rank: u32,
    samples: u64,
    every: u64,
    /// An extra barrier step the control plane asked for.
    at: Option<u64>,
    step: u64,
    end: u64,
    model: Model,
    /// This rank's shards and sizes, in map order, and their read offsets.
    mine: Vec<(String, u64)>,
    offsets: BTreeMap<String, u64>,
}

fn u(v: &Value, k: &str) -> Result<u64, String> {
    v[k].as_u64().ok_or_else(|| format!("map: {k} missing"))
}

impl Run {
    fn start(view: &Value) -> Result<Run, String> {
        let rank = u(view, "rank")? as u32;
        let ranks = view["ranks"].as_array().ok_or("map: ranks missing")?;
        let (model, offsets, step) = match &view["resume"] {
            Value::Null => (Model::default(), BTreeMap::new(), 0),
            m => {
                let (model, offsets) = restore(m["parts"].as_array().ok_or("resume: parts missing")?)?;
                (model, offsets, u(m, "step")?)
            }
        };
        let shards = |r: &Value| -> Vec<(String, u64)> {
            let ids = r["shards"].as_array().cloned().unwrap_or_default();
            let sizes = r["shard_sizes"].as_array().cloned().unwrap_or_default();
            ids.iter().zip(&sizes).map(|(i, s)| (i.as_str().unwrap_or_default().to_owned(), s.as_u64().unwrap_or(0))).collect()
        };
        let mut longest = 0;
        for r in ranks {
            let left: u64 = shards(r).iter().map(|(id, size)| size - offsets.get(id).copied().unwrap_or(0).min(*size)).sum();
            longest = longest.max(left.div_ceil(u(r, "samples")?.max(1)));
        }
        let me = &ranks[rank as usize];
        let mine = shards(me);
        Ok(Run {
            job: view["job"].as_str().unwrap_or_default().to_owned(),
            worker: view["worker"].as_str().unwrap_or_default().to_owned(),
            version: u(view, "version")?,
            rank,
            samples: u(me, "samples")?,
            every: u(view, "checkpoint_every")?.max(1),
            at: view["checkpoint_at"].as_u64(),
            step,
            end: step + longest,
            // The resumed model is carried by rank 0 (the others start from zero), so the sum
            // of the ranks' models stays the model of everything trained on.
            model: if rank == 0 { model } else { Model::default() },
            offsets: mine.iter().map(|(id, _)| (id.clone(), offsets.get(id).copied().unwrap_or(0))).collect(),
            mine,
        })
    }

    fn train_step(&mut self) {
        let mut need = self.samples;
        for (id, size) in &self.mine {
            let off = self.offsets.get_mut(id).expect("own shard");
            while need > 0 && *off < *size {
                self.model.train(record(id, *off));
                *off += 1;
                need -= 1;
            }
        }
        self.step += 1;
    }

    /// Writes this rank's checkpoint file (atomically) and returns its path.
    fn save(&self, dir: &std::path::Path) -> Result<String, String> {
        let dir = dir.join(&self.job);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let snap = Snapshot { rank: self.rank, step: self.step, map_version: self.version, model: self.model, offsets: self.offsets.clone() };
        let path = dir.join(format!("m{}-s{}-r{}-{}.json", self.version, self.step, self.rank, self.worker));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, snap.to_json().to_string()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
        Ok(path.display().to_string())
    }
}

/// A checkpoint the hook asked for: the hook handler waits for `done` to move.
#[derive(Default)]
struct HookState {
    asked: bool,
    done: Option<u64>,
}

async fn checkpoint(c: &HttpClient, a: &Args, run: &Run) -> Result<u64, String> {
    let location = run.save(&a.dir)?;
    let body = json!({"version": run.version, "step": run.step, "location": location, "final": run.step == run.end});
    let (s, v) = api(c, Method::POST, a.sidecar, "/training/checkpoint", Some(body)).await;
    if s != StatusCode::OK {
        return Err(format!("checkpoint report refused: {s} {v}"));
    }
    Ok(run.step)
}

async fn serve_hook(addr: SocketAddr, state: Arc<Mutex<HookState>>) {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind(addr).await.expect("hook address");
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |_req| {
                let state = state.clone();
                async move {
                    let before = {
                        let mut s = state.lock().unwrap();
                        s.asked = true;
                        s.done
                    };
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let mut step = None;
                    while Instant::now() < deadline {
                        let now = state.lock().unwrap().done;
                        if now != before || !state.lock().unwrap().asked {
                            step = now;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let status = if step.is_some() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    let mut r = http::Response::new(weft_tests::full(json!({"step": step}).to_string()));
                    *r.status_mut() = status;
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("weft-toy-trainer: {e}");
            std::process::exit(2);
        }
    };
    let hook = Arc::new(Mutex::new(HookState::default()));
    if let Some(addr) = a.hook {
        tokio::spawn(serve_hook(addr, hook.clone()));
    }
    let c = client();
    let (mut revision, mut run, mut down_since): (u64, Option<Run>, Option<Instant>) = (0, None, None);
    let mut last_ack = Instant::now();
    loop {
        let busy = run.as_ref().is_some_and(|r| r.step < r.end);
        let path = format!("/training/map?after={revision}&wait={}", if busy { "0s" } else { "2s" });
        let (s, view) = api(&c, Method::GET, a.sidecar, &path, None).await;
        match s {
            StatusCode::OK => {
                down_since = None;
                revision = view["revision"].as_u64().unwrap_or(revision);
                if !view["completed"].is_null() {
                    let m = &view["completed"];
                    eprintln!("completed step={} map={}", m["step"], m["map_version"]);
                    return;
                }
                if view["rank"].is_null() {
                    eprintln!("not in map version {}: stopping", view["version"]);
                    return;
                }
                if let Some(r) = run.as_mut().filter(|r| r.version == view["version"].as_u64().unwrap_or(0)) {
                    // The same map with a new requested barrier step.
                    r.at = view["checkpoint_at"].as_u64();
                } else {
                    match Run::start(&view) {
                        Ok(r) => {
                            eprintln!("map version={} rank={} resume_step={} end={} shards={}", r.version, r.rank, r.step, r.end, r.mine.len());
                            let _ = api(&c, Method::POST, a.sidecar, "/training/ack", Some(json!({"version": r.version, "step": r.step}))).await;
                            run = Some(r);
                        }
                        Err(e) => eprintln!("cannot start map version {}: {e}", view["version"]),
                    }
                }
            }
            StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => down_since = None,
            _ => {
                // The sidecar is gone (or restarting): give it a while, then stop.
                let since = *down_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(30) {
                    eprintln!("sidecar unreachable for 30 s: stopping");
                    std::process::exit(1);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let Some(r) = run.as_mut() else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let asked = hook.lock().unwrap().asked;
        if asked {
            let done = checkpoint(&c, &a, r).await.map_err(|e| eprintln!("hook checkpoint: {e}")).ok();
            // Logged before the hook answers, so the log is complete when the drain returns.
            eprintln!("hook checkpoint step={}", r.step);
            let mut h = hook.lock().unwrap();
            (h.asked, h.done) = (false, done.or(h.done));
        }
        if r.step < r.end {
            r.train_step();
            if (r.step.is_multiple_of(r.every) || r.step == r.end || Some(r.step) == r.at)
                && let Err(e) = checkpoint(&c, &a, r).await
            {
                eprintln!("step {}: {e}", r.step);
            }
            tokio::time::sleep(a.step).await;
        }
        if last_ack.elapsed() > Duration::from_millis(100) {
            last_ack = Instant::now();
            let _ = api(&c, Method::POST, a.sidecar, "/training/ack", Some(json!({"version": r.version, "step": r.step}))).await;
        }
    }
}

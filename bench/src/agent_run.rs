//! weight-share's run through the node agent: one weft-control node and one `weft-agent run`
//! on loopback, N replica placements applied with `POST /v1/schedule/apply`, each timed from
//! the apply to its first answer through its sidecar (the endpoint the agent's NodeStatus
//! reports). So the time holds everything a user waits for after placing a variant: the ADS
//! push of the placement, the weight holder's load, the server's start, the sidecar's start
//! and registration, and the status report that tells where it serves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::guard::Spawned;
use crate::net::{http_get, http_request};
use crate::raft_clusters::Cluster;

/// The binaries the run starts.
pub struct Bins {
    pub control: PathBuf,
    pub agent: PathBuf,
    pub server: PathBuf,
    pub proxy: PathBuf,
}

/// What one run measured.
pub struct Placed {
    /// From the apply to the first answer of the first and of the last replica, ms.
    pub first_ms: f64,
    pub nth_ms: f64,
    /// Each replica's answer, in variant order (`v0`, `v1`, …).
    pub answers: Vec<Value>,
    /// PSS of the weight holder and the model servers, MiB (what the direct runs measure).
    pub holder_and_servers_mib: f64,
    /// PSS of the sidecars, MiB (what the agent adds beside each replica).
    pub sidecars_mib: f64,
}

/// The node's name, and how long everything may take.
const NODE: &str = "bench";
const WITHIN: Duration = Duration::from_secs(300);

/// The agent, stopped on drop with everything it started (`weft-agent stop`): its replicas
/// run in their own process groups, so stopping the agent alone would leave them running.
struct Agent {
    process: Spawned,
    bin: PathBuf,
    state: PathBuf,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.process.stop();
        let _ = Command::new(&self.bin)
            .args(["stop", "--grace", "2s", "--state-dir"])
            .arg(&self.state)
            .stderr(Stdio::null())
            .status();
    }
}

impl Agent {
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

fn api(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
    let text = body.map(Value::to_string);
    let (status, body) = http_request(addr, method, path, text.as_deref())?;
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
}

/// One inference answer from `addr`, or None while nothing answers there with JSON.
pub fn ask(addr: SocketAddr) -> Option<Value> {
    let (status, body) = http_request(addr, "POST", "/v1/infer", Some("")).ok()?;
    (status == 200).then(|| serde_json::from_str(&body).ok()).flatten()
}

/// Starts the control node and the agent, places one replica per delta (variant `v{i}`), and
/// waits for each replica's first answer.
pub fn run(bins: &Bins, base: &Path, deltas: &[PathBuf], dir: &Path) -> Result<Placed> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let control = rt
        .block_on(Cluster::start_weft_nodes(&bins.control, &[], false, &[], dir, 1))
        .context("starting weft-control")?;
    let api_addr = control.leader_api();
    let (_, members) = api(api_addr, "GET", "/v1/members", None)?;
    let xds = members["members"][0]["xds_addr"]
        .as_str()
        .with_context(|| format!("no xDS address in /v1/members: {members}"))?;

    // One declared GPU slot, big enough for every replica, so they all share one holder
    // (the replicas compute on the CPU; the agent only passes the slot on).
    let inventory = dir.join("inventory.yaml");
    std::fs::write(
        &inventory,
        "cpu_milli: 256000\nmemory_mib: 1048576\ngpu_model: declared\ngpu_count: 1\ngpu_memory_bytes: 1099511627776\n",
    )?;
    let state = dir.join("agent-state");
    let log = dir.join("agent.log");
    let mut cmd = Command::new(&bins.agent);
    cmd.args(["run", "--node", NODE, "--control", &format!("http://{api_addr}"), "--xds", xds])
        .arg("--inventory")
        .arg(&inventory)
        .arg("--state-dir")
        .arg(&state)
        .args(["--report-interval", "1s", "--sidecar-report-interval", "200ms"])
        .arg("--model-server-bin")
        .arg(&bins.server)
        .arg("--proxy-bin")
        .arg(&bins.proxy)
        .stderr(std::fs::File::create(&log)?);
    let agent = Agent { process: Spawned::start("weft-agent", &mut cmd)?, bin: bins.agent.clone(), state, log };
    let registered = Instant::now() + Duration::from_secs(30);
    while http_get(api_addr, &format!("/v1/nodes/{NODE}")).map_or(true, |(s, _)| s != 200) {
        ensure!(Instant::now() < registered, "the agent did not register its node within 30 s:\n{}", agent.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }

    let bytes = |p: &Path| std::fs::metadata(p).map(|m| m.len()).with_context(|| p.display().to_string());
    let mut workloads = Vec::new();
    for (i, delta) in deltas.iter().enumerate() {
        let cluster = format!("v-v{i}");
        let (s, body) = api(api_addr, "PUT", &format!("/v1/clusters/{cluster}"), Some(&json!({"endpoints": [], "lb": "round_robin"})))?;
        ensure!(s / 100 == 2, "PUT cluster {cluster}: {s} {body}");
        workloads.push(json!({
            "kind": "replica", "name": format!("v{i}-0"), "variant": format!("v{i}"), "base_model": "base",
            "base_bytes": bytes(base)?, "delta_bytes": bytes(delta)?, "working_set_bytes": 1 << 20,
            "compute_milli": 100, "cpu_milli": 500, "memory_mib": 256,
            "launch": {"cluster": cluster, "base_path": base, "delta_path": delta},
        }));
    }

    let applied = Instant::now();
    let (s, body) = api(api_addr, "POST", "/v1/schedule/apply", Some(&json!({"workloads": workloads})))?;
    ensure!(s == 200, "schedule apply: {s} {body}");
    ensure!(body["placed"].as_array().map(Vec::len) == Some(deltas.len()), "not every replica was placed: {body}");

    let mut answered: Vec<Option<f64>> = vec![None; deltas.len()];
    let mut answers = vec![Value::Null; deltas.len()];
    let mut status = Value::Null;
    while answered.iter().any(Option::is_none) {
        if applied.elapsed() > WITHIN {
            bail!("replicas did not answer within {WITHIN:?}; last status {status}\n{}", agent.log_tail());
        }
        if let Ok((200, v)) = api(api_addr, "GET", &format!("/v1/nodestatuses/{NODE}"), None) {
            status = v;
        }
        for r in status["spec"]["replicas"].as_array().into_iter().flatten() {
            let index = r["variant"].as_str().and_then(|v| v.strip_prefix('v')).and_then(|i| i.parse::<usize>().ok());
            let endpoint = r["endpoint"].as_str().and_then(|e| e.parse::<SocketAddr>().ok());
            if let (Some(i), Some(endpoint)) = (index, endpoint)
                && i < answered.len()
                && answered[i].is_none()
                && let Some(a) = ask(endpoint)
            {
                answered[i] = Some(applied.elapsed().as_secs_f64() * 1e3);
                answers[i] = a;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut times: Vec<f64> = answered.into_iter().flatten().collect();
    times.sort_by(f64::total_cmp);

    // Memory once every replica answered, from the pids the agent reports.
    let (_, v) = api(api_addr, "GET", &format!("/v1/nodestatuses/{NODE}"), None)?;
    let pids = |list: &str, key: &str| -> Vec<u32> {
        v["spec"][list].as_array().into_iter().flatten().filter_map(|r| r[key].as_u64()).map(|p| p as u32).filter(|&p| p > 0).collect()
    };
    let mut core = pids("holders", "pid");
    ensure!(core.len() == 1, "expected one weight holder for the shared base, the agent reports {}: {v}", core.len());
    core.extend(pids("replicas", "pid"));
    let sidecars = pids("replicas", "sidecar_pid");
    let mib = |pids: &[u32]| -> Result<f64> { pids.iter().map(|&p| crate::procfs::pss_kib(p).map(|k| k as f64 / 1024.0)).sum() };
    Ok(Placed {
        first_ms: times[0],
        nth_ms: times[times.len() - 1],
        answers,
        holder_and_servers_mib: mib(&core)?,
        sidecars_mib: mib(&sidecars)?,
    })
}

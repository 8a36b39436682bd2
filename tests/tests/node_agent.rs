//! The node agent end to end, with the real binaries on loopback: a control plane, three
//! `weft-agent run` processes with declared inventories, two base models with three variants
//! each (safetensors files made by `weft-agent make-base|make-delta`), placed by
//! `schedule apply`. Replicas start beside their sidecars, register, and an A/B route reaches
//! each variant's distinct answer; bad placements (a missing file, a delta of another shape)
//! are reported with the reason and disturb nothing; the autoscaler raises a replica count
//! and the new replica serves; kill -9 of a server gets it restarted; a killed agent's replicas
//! keep serving and the restarted agent adopts them; with the control plane down nothing stops.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::*;
use weft_tests::{HttpClient, body_if_ok, client, workspace_bin};

const NODES: [&str; 3] = ["n1", "n2", "n3"];
const LIMIT: Duration = Duration::from_secs(90);

/// A running `weft-agent run`; its replicas are stopped (`weft-agent stop`) on drop.
struct AgentProc {
    node: String,
    args: Vec<String>,
    state: PathBuf,
    child: Option<Child>,
}

impl AgentProc {
    fn start(node: &str, dir: &Path, control: &ControlProc, ports: (u16, u16)) -> AgentProc {
        let state = dir.join(format!("agent-{node}"));
        let inventory = dir.join(format!("{node}.yaml"));
        std::fs::write(&inventory, "cpu_milli: 16000\nmemory_mib: 65536\ngpu_model: L4\ngpu_count: 2\ngpu_memory_bytes: 25769803776\n").unwrap();
        let args = [
            "run", "--node", node, "--control", &format!("http://{}", control.api), "--xds", &control.xds.to_string(),
            "--inventory", &inventory.display().to_string(), "--state-dir", &state.display().to_string(),
            "--ports", &format!("{}-{}", ports.0, ports.1), "--report-interval", "1s", "--drain-timeout", "2s",
            "--sidecar-report-interval", "200ms", "--start-timeout", "60s",
        ]
        .map(String::from)
        .to_vec();
        let mut a = AgentProc { node: node.into(), args, state, child: None };
        a.spawn();
        a
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.state.with_extension("log")).unwrap();
        let child = Command::new(workspace_bin("weft-agent")).args(&self.args).stdin(Stdio::null()).stderr(log).spawn().expect("spawn weft-agent");
        self.child = Some(Child(child));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.state.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
        let _ = Command::new(workspace_bin("weft-agent")).args(["stop", "--grace", "2s", "--state-dir"]).arg(&self.state).status();
    }
}

fn make(args: &[&str]) {
    let o = Command::new(workspace_bin("weft-agent")).args(args).output().unwrap();
    assert!(o.status.success(), "weft-agent {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A replica workload of `variant` on `base`, started by the agent from those files.
fn replica(name: &str, variant: &str, base: &str, base_path: &Path, delta_path: &Path) -> Value {
    json!({
        "kind": "replica", "name": name, "variant": variant, "base_model": base,
        "base_bytes": 1 << 20, "delta_bytes": 1 << 16, "working_set_bytes": 1 << 20,
        "compute_milli": 100, "cpu_milli": 500, "memory_mib": 256,
        "launch": {"cluster": format!("v-{variant}"), "base_path": base_path, "delta_path": delta_path},
    })
}

/// Every replica the agents report, by placement.
async fn replicas(c: &HttpClient, control: SocketAddr) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    for node in NODES {
        let (s, v) = api(c, Method::GET, control, &format!("/v1/nodestatuses/{node}"), None).await;
        if s == StatusCode::OK {
            for r in v["spec"]["replicas"].as_array().cloned().unwrap_or_default() {
                all.insert(r["placement"].as_str().unwrap().to_string(), json!({"node": node, "status": r}));
            }
        }
    }
    all
}

/// What a replica answers at `endpoint` (through its sidecar): its variant and logits; `None`
/// when nothing answers with a 200 within 5 s.
async fn answer(c: &HttpClient, endpoint: &str, host: &str) -> Option<(String, Vec<f64>)> {
    let body = body_if_ok(c, endpoint.parse().ok()?, host, "/v1/answer").await;
    let v: Value = serde_json::from_str(&body).ok()?;
    let logits = v["logits"].as_array()?.iter().filter_map(Value::as_f64).collect();
    Some((v["variant"].as_str()?.to_string(), logits))
}

async fn ready(c: &HttpClient, control: SocketAddr, placement: &str) -> Option<Value> {
    let r = replicas(c, control).await.remove(placement)?;
    (r["status"]["state"] == "ready").then_some(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_carry_out_placements_share_bases_recover_and_outlive_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut control = ControlProc::start_with(1, root, true, None, &["--autoscale-interval-s", "0.5"]);
    let c = client();
    wait_for("the control node leads", Duration::from_secs(20), || async { control.status(&c).await.filter(|s| s["leader"] == 1).map(|_| ()) }).await;

    // Two bases of one shape, three variants each (two LoRA-only, one with its own head), and a
    // delta made for another shape.
    let models = root.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let shape = ["--layers", "2", "--d", "64", "--classes", "8"];
    let file = |n: &str| models.join(format!("{n}.safetensors"));
    for (i, base) in ["m1", "m2"].iter().enumerate() {
        let out = file(base).display().to_string();
        make(&[&["make-base", "--out", &out, "--seed", &(i + 1).to_string()][..], &shape].concat());
    }
    let variants = [("a", "m1"), ("b", "m1"), ("c", "m1"), ("d", "m2"), ("e", "m2"), ("f", "m2"), ("g", "m2")];
    for (i, (v, _)) in variants.iter().enumerate() {
        let out = file(v).display().to_string();
        let head: &[&str] = if i % 3 == 2 { &["--head"] } else { &[] };
        make(&[&["make-delta", "--out", &out, "--rank", "4", "--seed", &(10 + i).to_string()][..], &shape, head].concat());
    }
    let wrong = file("wrong").display().to_string();
    make(&["make-delta", "--out", &wrong, "--layers", "2", "--d", "32", "--classes", "8"]);

    let mut agents: Vec<AgentProc> =
        NODES.iter().enumerate().map(|(i, n)| AgentProc::start(n, root, &control, (21_000 + 3000 * i as u16, 23_900 + 3000 * i as u16))).collect();
    wait_for("every agent registered its node", LIMIT, || async {
        let (_, v) = api(&c, Method::GET, control.api, "/v1/nodes", None).await;
        (v["items"].as_array().map_or(0, Vec::len) == 3).then_some(())
    })
    .await;

    for (v, _) in variants {
        let (s, body) = api(&c, Method::PUT, control.api, &format!("/v1/clusters/v-{v}"), Some(json!({"endpoints": [], "lb": "round_robin"}))).await;
        assert!(s.is_success(), "{body}");
    }
    let mut workloads: Vec<Value> = variants[..6].iter().map(|(v, b)| replica(&format!("{v}-0"), v, b, &file(b), &file(v))).collect();
    workloads.push(replica("missing-0", "a", "m1", &file("m1"), &models.join("nowhere.safetensors")));
    workloads.push(replica("wrong-0", "a", "m1", &file("m1"), Path::new(&wrong)));
    let (s, applied) = api(&c, Method::POST, control.api, "/v1/schedule/apply", Some(json!({"workloads": workloads}))).await;
    assert_eq!(s, StatusCode::OK, "{applied}");
    assert_eq!(applied["placed"].as_array().map(Vec::len), Some(8), "{applied}");

    // Every good replica becomes ready behind its sidecar; the bad ones say why, and back off.
    let all = wait_for("the six replicas are ready", LIMIT, || async {
        let all = replicas(&c, control.api).await;
        let good = variants[..6].iter().all(|(v, _)| all.get(&format!("{v}-0")).is_some_and(|r| r["status"]["state"] == "ready"));
        good.then_some(all)
    })
    .await;
    let bad = wait_for("the bad placements are reported with their reason", LIMIT, || async {
        let all = replicas(&c, control.api).await;
        let (m, w) = (all.get("missing-0")?.clone(), all.get("wrong-0")?.clone());
        let explained = m["status"]["reason"].as_str()?.contains("nowhere.safetensors: no such file")
            && w["status"]["reason"].as_str()?.contains("lora")
            && w["status"]["restarts"].as_u64()? >= 1;
        explained.then_some((m, w))
    })
    .await;
    assert_eq!(bad.0["status"]["state"], "failed", "{:?}", bad.0);
    assert!(["backoff", "starting"].contains(&bad.1["status"]["state"].as_str().unwrap()), "{:?}", bad.1);

    // Each variant answers with its own delta applied; the two bases' holders serve them.
    let mut logits: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (v, _) in &variants[..6] {
        let endpoint = all[&format!("{v}-0")]["status"]["endpoint"].as_str().unwrap().to_string();
        let (variant, l) = answer(&c, &endpoint, "x").await.unwrap_or_else(|| panic!("{v}-0 answers at {endpoint}"));
        assert_eq!(&variant, v);
        logits.insert(variant, l);
    }
    let distinct: BTreeSet<String> = logits.values().map(|l| format!("{l:?}")).collect();
    assert_eq!(distinct.len(), 6, "every variant computes something else: {logits:?}");
    let (_, v) = api(&c, Method::GET, control.api, &format!("/v1/nodestatuses/{}", all["a-0"]["node"].as_str().unwrap()), None).await;
    let holder = v["spec"]["holders"].as_array().unwrap().iter().find(|h| h["base_model"] == "m1").cloned().unwrap();
    assert!(holder["users"].as_u64().unwrap() >= 1 && holder["mechanism"] == "memfd", "{holder}");

    // The A/B route over the registered endpoints reaches all three variants of m1, each
    // answering what it answers directly.
    let ab = json!([{"name": "a", "cluster": "v-a", "weight": 34}, {"name": "b", "cluster": "v-b", "weight": 33}, {"name": "c", "cluster": "v-c", "weight": 33}]);
    api(&c, Method::PUT, control.api, "/v1/experiments/ab", Some(json!({"variants": ab}))).await;
    api(&c, Method::PUT, control.api, "/v1/services/chat", Some(json!({"hosts": ["chat"], "routes": [{"name": "r", "experiment": "ab"}]}))).await;
    api(&c, Method::PUT, control.api, "/v1/services/g", Some(json!({"hosts": ["g"], "routes": [{"name": "r", "cluster": "v-g"}]}))).await;
    let app = SidecarProc::start("app", &root.join("app"), &[&control]);
    let listen = app.listen.to_string();
    wait_for("the A/B route reaches a, b and c", LIMIT, || async {
        let mut seen = BTreeSet::new();
        for _ in 0..30 {
            if let Some((v, l)) = answer(&c, &listen, "chat").await {
                assert_eq!(logits[&v], l, "variant {v} through the route answers what it answers directly");
                seen.insert(v);
            }
        }
        (seen.len() == 3).then_some(())
    })
    .await;

    // The autoscaler places variant g; raising its floor places a second replica, which serves.
    let template = json!({"base_model": "m2", "base_bytes": 1 << 20, "delta_bytes": 1 << 16, "compute_milli": 100, "cpu_milli": 500, "memory_mib": 256,
        "launch": {"cluster": "v-g", "base_path": file("m2"), "delta_path": file("g")}});
    let scaler = |min: u32| json!({"variant": "g", "policy": "reactive", "capacity_rps": 100.0, "min_replicas": min, "max_replicas": 4, "placement": template.clone()});
    let (s, body) = api(&c, Method::PUT, control.api, "/v1/autoscalers/g", Some(scaler(1))).await;
    assert!(s.is_success(), "{body}");
    wait_for("the autoscaler's first replica of g is ready", LIMIT, || ready(&c, control.api, "g-od-0")).await;
    api(&c, Method::PUT, control.api, "/v1/autoscalers/g", Some(scaler(2))).await;
    let second = wait_for("the autoscaler's second replica of g is ready", LIMIT, || ready(&c, control.api, "g-od-1")).await;
    let endpoint = second["status"]["endpoint"].as_str().unwrap().to_string();
    assert_eq!(answer(&c, &endpoint, "x").await.map(|a| a.0).as_deref(), Some("g"));
    wait_for("the route to g answers", LIMIT, || async { answer(&c, &listen, "g").await.filter(|a| a.0 == "g") }).await;

    // kill -9 of a model server: restarted, ready again, serving.
    let before = replicas(&c, control.api).await["b-0"].clone();
    let pid = before["status"]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let after = wait_for("the killed replica is restarted and ready", LIMIT, || async {
        ready(&c, control.api, "b-0").await.filter(|r| r["status"]["pid"].as_u64() != Some(pid))
    })
    .await;
    assert!(after["status"]["restarts"].as_u64().unwrap() > before["status"]["restarts"].as_u64().unwrap(), "{after}");
    assert_eq!(answer(&c, after["status"]["endpoint"].as_str().unwrap(), "x").await.unwrap().1, logits["b"]);

    // kill -9 of the agent of the busiest node: its replicas keep serving; the restarted agent
    // adopts them (same processes, no restart).
    let all = replicas(&c, control.api).await;
    let busiest = NODES.iter().max_by_key(|n| all.values().filter(|r| r["node"] == **n && r["status"]["state"] == "ready").count()).unwrap();
    let mine: Vec<(String, Value)> = all.into_iter().filter(|(_, r)| r["node"] == *busiest && r["status"]["state"] == "ready").collect();
    assert!(!mine.is_empty());
    let agent = agents.iter_mut().find(|a| a.node == *busiest).unwrap();
    agent.child.take().unwrap().kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, r) in &mine {
        assert!(answer(&c, r["status"]["endpoint"].as_str().unwrap(), "x").await.is_some(), "{name} serves while its agent is dead");
    }
    agent.spawn();
    wait_for("the restarted agent adopted its replicas", LIMIT, || async {
        let now = replicas(&c, control.api).await;
        let adopted = mine.iter().all(|(name, r)| {
            now.get(name).is_some_and(|n| n["status"]["adopted"] == true && n["status"]["state"] == "ready" && n["status"]["pid"] == r["status"]["pid"])
        });
        adopted.then_some(())
    })
    .await;
    assert!(agent.log().contains("adopted"), "{}", agent.log());

    // The control plane goes down: every replica, its sidecar and the routes keep serving.
    let serving = replicas(&c, control.api).await;
    control.kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, r) in serving.iter().filter(|(_, r)| r["status"]["state"] == "ready") {
        assert!(answer(&c, r["status"]["endpoint"].as_str().unwrap(), "x").await.is_some(), "{name} serves with the control plane down");
    }
    assert!(answer(&c, &listen, "chat").await.is_some(), "the A/B route still answers");
    for a in &mut agents {
        assert!(a.child.as_mut().is_some_and(|c| matches!(c.0.try_wait(), Ok(None))), "agent {} runs on: {}", a.node, a.log());
    }
    drop(app);
}

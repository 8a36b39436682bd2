//! Real weft binaries as child processes: control nodes (`weft-control`) and sidecars
//! (`weft-proxy --xds`), with the small JSON client the tests talk to the control API with.
//! Every child is killed when its handle drops, so a failing test leaves nothing behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::{HttpClient, client, full, workspace_bin};

/// A port nothing listens on right now, for a child process to bind. Picked at random below
/// the kernel's ephemeral range (32768+ by default): a port from that range, released and bound
/// again later, can meanwhile become the source port of some outgoing connection of a parallel
/// test, and the child then fails to bind it.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = rand::random_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills the child on drop.
pub struct Child(pub std::process::Child);

impl Child {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL and reap: a crash, not a shutdown.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `HUP`).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.0.id().to_string()]).status();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` every 50 ms until it returns `Some`, panicking with `what` after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One JSON request to a control node. Connection errors come back as status 0, so tests can
/// poll nodes that are down.
pub async fn api(c: &HttpClient, method: Method, addr: SocketAddr, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(full(body.map(|b| b.to_string()).unwrap_or_default()))
        .unwrap();
    let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(15), c.request(req)).await else {
        return (StatusCode::from_u16(599).unwrap(), Value::Null);
    };
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A `weft-control` process with its ports and data dir (kept across restarts).
pub struct ControlProc {
    pub id: u64,
    pub api: SocketAddr,
    pub xds: SocketAddr,
    pub dir: PathBuf,
    /// Extra command-line arguments.
    pub extra: Vec<String>,
    child: Option<Child>,
}

impl ControlProc {
    /// Starts node `id` in `dir`; `init` bootstraps a cluster, `join` asks that member.
    pub fn start(id: u64, root: &Path, init: bool, join: Option<SocketAddr>) -> ControlProc {
        Self::start_with(id, root, init, join, &[])
    }

    /// [`ControlProc::start`] with extra arguments (e.g. `--rollout-interval-s 0.5`).
    pub fn start_with(id: u64, root: &Path, init: bool, join: Option<SocketAddr>, extra: &[&str]) -> ControlProc {
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let xds = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut p = ControlProc { id, api, xds, dir: root.join(format!("node{id}")), extra, child: None };
        p.spawn(init, join);
        p
    }

    fn spawn(&mut self, init: bool, join: Option<SocketAddr>) {
        let mut cmd = Command::new(workspace_bin("weft-control"));
        cmd.args(["--id", &self.id.to_string(), "--listen", &self.api.to_string()])
            .args(["--xds-listen", &self.xds.to_string(), "--data-dir"])
            .arg(&self.dir)
            .args(["--log", "warn", "--snapshot-every", "50"])
            .args(&self.extra)
            .stdin(Stdio::null());
        if init {
            cmd.arg("--init");
        }
        if let Some(j) = join {
            cmd.args(["--join", &j.to_string()]);
        }
        self.child = Some(Child(cmd.spawn().expect("spawn weft-control")));
    }

    /// Restarts on the same ports and data dir (recovers from disk).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(false, None);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Waits up to `limit` for the process to exit by itself; its status, or `None` if it runs on.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.0.try_wait().ok().flatten() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    pub async fn status(&self, c: &HttpClient) -> Option<Value> {
        let (s, v) = api(c, Method::GET, self.api, "/v1/status", None).await;
        (s == StatusCode::OK).then_some(v)
    }
}

/// A cluster of `n` control nodes: node 1 initializes, the others join it. Returns once
/// every node lists `n` voters.
pub async fn control_cluster(n: u64, root: &Path) -> Vec<ControlProc> {
    let c = client();
    let first = ControlProc::start(1, root, true, None);
    wait_for("node 1 leads", Duration::from_secs(20), || async {
        first.status(&c).await.filter(|s| s["leader"] == 1).map(|_| ())
    })
    .await;
    let join = first.api;
    let mut nodes = vec![first];
    for id in 2..=n {
        nodes.push(ControlProc::start(id, root, false, Some(join)));
    }
    for node in &nodes {
        wait_for(&format!("node {} sees {n} voters", node.id), Duration::from_secs(30), || async {
            let (s, v) = api(&c, Method::GET, node.api, "/v1/members", None).await;
            let voters = v["members"].as_array().map(|m| m.iter().filter(|m| m["voter"] == true).count());
            (s == StatusCode::OK && voters == Some(n as usize) && v["leader"].is_u64()).then_some(())
        })
        .await;
    }
    nodes
}

/// The id of the leader, as the first live node that knows one reports it.
pub async fn leader_of(c: &HttpClient, nodes: &[ControlProc]) -> Option<u64> {
    for n in nodes.iter().filter(|n| n.is_up()) {
        if let Some(s) = n.status(c).await
            && let Some(l) = s["leader"].as_u64()
        {
            return Some(l);
        }
    }
    None
}

/// Runs `weftctl --server http://<node> ARGS` and returns its stdout; panics if it fails.
pub fn weftctl(node: &ControlProc, args: &[&str]) -> String {
    let o = Command::new(workspace_bin("weftctl"))
        .arg("--server")
        .arg(format!("http://{}", node.api))
        .args(args)
        .output()
        .expect("weftctl runs");
    assert!(o.status.success(), "weftctl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A `weft-toy-trainer` process beside a training sidecar; its log goes to `<dir>/<worker>.log`.
pub struct TrainerProc {
    pub worker: String,
    pub log: PathBuf,
    pub child: Child,
}

impl TrainerProc {
    pub fn start(worker: &str, sidecar_admin: SocketAddr, dir: &Path, step_ms: u64, hook: Option<SocketAddr>) -> TrainerProc {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join(format!("{worker}.log"));
        let mut cmd = Command::new(workspace_bin("weft-toy-trainer"));
        cmd.arg("--sidecar").arg(sidecar_admin.to_string()).arg("--dir").arg(dir.join("ckpt")).args(["--step-ms", &step_ms.to_string()]);
        if let Some(h) = hook {
            cmd.args(["--hook", &h.to_string()]);
        }
        let child = cmd.stdin(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().expect("spawn weft-toy-trainer");
        TrainerProc { worker: worker.into(), log, child: Child(child) }
    }

    /// Whether it is still running (reaps it if not).
    pub fn running(&mut self) -> bool {
        matches!(self.child.0.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A `weft-proxy` process whose bootstrap has only node id, admin and one outbound listener;
/// everything it routes comes from the control plane (or its saved snapshot).
pub struct SidecarProc {
    pub node: String,
    pub admin: SocketAddr,
    pub listen: SocketAddr,
    pub cache: PathBuf,
    config: PathBuf,
    servers: String,
    extra: Vec<String>,
    child: Option<Child>,
}

impl SidecarProc {
    /// An outbound sidecar (listener `out`) for an app.
    pub fn start(node: &str, dir: &Path, control: &[&ControlProc]) -> SidecarProc {
        Self::start_with(node, dir, control, &[])
    }

    /// [`SidecarProc::start`] with extra arguments (e.g. `--report-interval 200ms`).
    pub fn start_with(node: &str, dir: &Path, control: &[&ControlProc], extra: &[&str]) -> SidecarProc {
        Self::launch(node, dir, control, |admin, listen| {
            format!("node: {{id: {node}}}\nadmin: {{address: \"{admin}\"}}\nlisteners: [{{name: out, address: \"{listen}\"}}]\n")
        }, extra.iter().map(|s| s.to_string()).collect())
    }

    /// An inbound sidecar (listener `in`) in front of `model`, registering itself as an
    /// endpoint of `cluster` and heartbeating every 200 ms.
    pub fn inbound(node: &str, dir: &Path, control: &[&ControlProc], model: SocketAddr, cluster: &str) -> SidecarProc {
        let extra = ["--register-cluster", cluster, "--report-interval", "200ms"].map(String::from).to_vec();
        Self::launch(node, dir, control, |admin, listen| {
            format!(
                "node: {{id: {node}, team: t1}}\nadmin: {{address: \"{admin}\"}}\n\
                 listeners: [{{name: in, address: \"{listen}\", direction: inbound}}]\n\
                 services: [{{name: local, hosts: [\"*\"], listeners: [in], routes: [{{name: r, cluster: local}}]}}]\n\
                 clusters: [{{name: local, endpoints: [\"{model}\"]}}]\n"
            )
        }, extra)
    }

    /// A training worker's sidecar: subscribes to `job`'s shard map and serves the trainer
    /// API on its admin address; reports every 200 ms; `hook` = the trainer's checkpoint hook.
    pub fn training(worker: &str, dir: &Path, control: &[&ControlProc], job: &str, hook: Option<SocketAddr>) -> SidecarProc {
        let extra = ["--report-interval", "200ms"].map(String::from).to_vec();
        let hook = hook.map(|h| format!(", checkpoint_hook: \"http://{h}/checkpoint\", hook_deadline: 10s")).unwrap_or_default();
        Self::launch(worker, dir, control, |admin, listen| {
            format!(
                "node: {{id: {worker}, job_type: training}}\nadmin: {{address: \"{admin}\"}}\n\
                 listeners: [{{name: out, address: \"{listen}\"}}]\ntraining: {{job: {job}{hook}}}\n"
            )
        }, extra)
    }

    /// A sidecar with the bootstrap `yaml(admin, listen)` makes (its two addresses picked free).
    pub fn launch(
        node: &str,
        dir: &Path,
        control: &[&ControlProc],
        yaml: impl FnOnce(SocketAddr, SocketAddr) -> String,
        extra: Vec<String>,
    ) -> SidecarProc {
        std::fs::create_dir_all(dir).unwrap();
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = dir.join(format!("{node}.yaml"));
        std::fs::write(&config, yaml(admin, listen)).unwrap();
        let servers = control.iter().map(|c| c.xds.to_string()).collect::<Vec<_>>().join(",");
        let cache = dir.join(format!("{node}.xds.json"));
        let mut s = SidecarProc { node: node.into(), admin, listen, cache, config, servers, extra, child: None };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new(workspace_bin("weft-proxy"))
            .arg("--config")
            .arg(&self.config)
            .args(["--xds", &self.servers, "--xds-cache"])
            .arg(&self.cache)
            .args(["--log", "warn", "--workers", "1"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn weft-proxy");
        self.child = Some(Child(child));
    }

    /// Sends a signal (`STOP` freezes it: no traffic, no heartbeats; `CONT` resumes).
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            c.signal(sig);
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Whether the process is running (false after `kill`, or when it exited, e.g. because
    /// a port it was given was taken meanwhile).
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.0.try_wait(), Ok(None)))
    }
}

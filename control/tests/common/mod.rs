//! What the control-plane integration tests share: an in-process single-node control plane
//! and the built `weftctl` run as a user runs it.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_control::server::{self, Options, Running};

/// Everything a test needs: the node (kept running) and its data directory.
pub struct Node {
    pub running: Running,
    pub url: String,
    _dir: tempfile::TempDir,
}

pub async fn start() -> Node {
    start_with(|_| {}).await
}

/// A node with `tweak` applied to its options.
pub async fn start_with(tweak: impl FnOnce(&mut Options)) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = Options::new(1, "127.0.0.1:0".parse().unwrap(), "127.0.0.1:0".parse().unwrap(), dir.path().into());
    opts.init = true;
    tweak(&mut opts);
    let running = server::start(opts).await.expect("node starts");
    let url = format!("http://{}", running.api_addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = ctl(&url, &["status", "-o", "json"], None).await;
        if o.code == 0 && serde_json::from_str::<Value>(&o.stdout).is_ok_and(|s| s["leader"] == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "no leader within 10 s: {o:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Node { running, url, _dir: dir }
}

#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the weftctl binary (off the runtime's threads, so the in-process server keeps serving).
pub async fn ctl(server: &str, args: &[&str], stdin: Option<&str>) -> Out {
    let server = server.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weftctl"));
        cmd.arg("--server").arg(&server).args(&args);
        cmd.env_remove("WEFT_SERVER").env_remove("WEFT_TOKEN");
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("weftctl runs");
        if let Some(text) = stdin {
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

/// `weftctl` that must succeed.
pub async fn ok(server: &str, args: &[&str]) -> String {
    let o = ctl(server, args, None).await;
    assert_eq!(o.code, 0, "weftctl {args:?}: {o:?}");
    o.stdout
}

pub async fn json(server: &str, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = ok(server, &a).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("weftctl {a:?} is not JSON ({e}): {out}"))
}

/// `kind/name → revision` of everything stored: equal before and after = nothing written.
pub async fn revisions(server: &str) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for kind in weft_control::resources::Kind::ALL.map(|k| k.as_str()) {
        for it in json(server, &["get", kind]).await.as_array().unwrap() {
            all.insert(format!("{kind}/{}", it["name"].as_str().unwrap()), it["revision"].as_u64().unwrap());
        }
    }
    all
}

pub fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// The resources of `type_url` in the first State-of-the-World ADS response of control node
/// `xds` to a new subscriber `node_id`.
pub async fn ads_first(xds: std::net::SocketAddr, node_id: &str, type_url: &str) -> Vec<weft_xds::transport::Any> {
    use weft_xds::transport::{AggregatedDiscoveryServiceClient, DiscoveryRequest, Node as XdsNode};
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{xds}")).await.unwrap();
    let mut responses = ads.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let node = XdsNode { id: node_id.into(), ..Default::default() };
    tx.send(DiscoveryRequest { node: Some(node), type_url: type_url.into(), ..Default::default() }).await.unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), responses.message()).await.unwrap().unwrap().unwrap();
    resp.resources
}

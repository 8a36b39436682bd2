//! The control plane end to end, with the real binaries on loopback: three `weft-control`
//! nodes and `weft-proxy` sidecars connected with `--xds`. Each test is a story a user relies
//! on: the cluster keeps every acknowledged write through a leader crash and a restart; a
//! config change reaches the sidecars; a broken config is NACKed and shown; traffic survives
//! the loss of the whole control plane, even across a sidecar restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::*;
use weft_tests::*;

/// Body of a GET to service `s` through a sidecar; "" when it is not a 200 or the sidecar
/// does not answer (e.g. while it restarts).
async fn upstream_of(c: &HttpClient, addr: SocketAddr) -> String {
    body_if_ok(c, addr, "s", "/").await
}

/// Waits until traffic reaches `name`, then checks that 20 requests in a row do.
async fn traffic_goes_to(c: &HttpClient, addr: SocketAddr, name: &str) {
    wait_for(&format!("traffic reaches {name}"), Duration::from_secs(20), || async {
        (upstream_of(c, addr).await == name).then_some(())
    })
    .await;
    for _ in 0..20 {
        assert_eq!(upstream_of(c, addr).await, name, "every request goes to {name}");
    }
}

async fn put(c: &HttpClient, node: SocketAddr, path: &str, spec: Value) -> Value {
    let (s, v) = api(c, Method::PUT, node, path, Some(spec)).await;
    assert_eq!(s, StatusCode::OK, "PUT {path}: {v}");
    v
}

/// Every `clusters` resource as name → `max_idle_per_endpoint` (the value the tests write).
async fn cluster_values(c: &HttpClient, node: SocketAddr, consistency: &str) -> Option<BTreeMap<String, u64>> {
    let (s, v) = api(c, Method::GET, node, &format!("/v1/clusters?consistency={consistency}"), None).await;
    if s != StatusCode::OK {
        return None;
    }
    let items = v["items"].as_array()?;
    Some(
        items
            .iter()
            .map(|i| (i["name"].as_str().unwrap().to_owned(), i["spec"]["max_idle_per_endpoint"].as_u64().unwrap()))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_keep_every_acknowledged_write_through_a_leader_crash_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = control_cluster(3, dir.path()).await;
    let c = client();

    // Writes through every node (followers forward to the leader).
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    for n in &nodes {
        for j in 1..=5u64 {
            let name = format!("k{}-{j}", n.id);
            put(&c, n.api, &format!("/v1/clusters/{name}"), json!({"max_idle_per_endpoint": j})).await;
            acked.lock().unwrap().insert(name, j);
        }
    }

    // A writer keeps going through the followers while the leader is killed.
    let leader = leader_of(&c, &nodes).await.expect("a leader");
    let followers: Vec<SocketAddr> = nodes.iter().filter(|n| n.id != leader).map(|n| n.api).collect();
    let writer = {
        let (c, acked, followers) = (c.clone(), acked.clone(), followers.clone());
        tokio::spawn(async move {
            let mut after_crash = 0;
            for k in 1..=60u64 {
                let node = followers[k as usize % followers.len()];
                let name = format!("w-{k}");
                let (s, _) = api(&c, Method::PUT, node, &format!("/v1/clusters/{name}"), Some(json!({"max_idle_per_endpoint": k}))).await;
                if s == StatusCode::OK {
                    acked.lock().unwrap().insert(name, k);
                    if k > 20 {
                        after_crash += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            after_crash
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crashed = nodes.iter_mut().find(|n| n.id == leader).unwrap();
    crashed.kill();
    let new_leader = wait_for("a new leader is elected", Duration::from_secs(20), || async {
        leader_of(&c, &nodes).await.filter(|l| *l != leader)
    })
    .await;
    let after_crash = writer.await.unwrap();
    assert!(after_crash > 10, "writes continue after the leader crash ({after_crash} acknowledged)");

    // Every acknowledged write is there, on a linearizable read.
    let want = acked.lock().unwrap().clone();
    let new_leader_api = nodes.iter().find(|n| n.id == new_leader).unwrap().api;
    let got = cluster_values(&c, new_leader_api, "linearizable").await.expect("read from the new leader");
    for (k, v) in &want {
        assert_eq!(got.get(k), Some(v), "acknowledged write {k}={v} survived");
    }

    // The crashed node restarts from its file and catches up, including writes it missed.
    let crashed = nodes.iter_mut().find(|n| n.id == leader).unwrap();
    crashed.restart();
    let restarted = crashed.api;
    put(&c, new_leader_api, "/v1/clusters/after-restart", json!({"max_idle_per_endpoint": 7})).await;
    let mut want = want;
    want.insert("after-restart".into(), 7);
    wait_for("the restarted node has every write", Duration::from_secs(30), || async {
        let local = cluster_values(&c, restarted, "local").await?;
        want.iter().all(|(k, v)| local.get(k) == Some(v)).then_some(())
    })
    .await;
}

/// A node fsyncs its applied state only every 1,024 entries (the log is fsynced per append):
/// killed with SIGKILL after acknowledged writes, it rebuilds them from its log on restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_rebuilds_its_unsynced_state_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = control_cluster(1, dir.path()).await;
    let c = client();
    let mut want = BTreeMap::new();
    for j in 1..=200u64 {
        put(&c, nodes[0].api, &format!("/v1/clusters/k{j}"), json!({"max_idle_per_endpoint": j})).await;
        want.insert(format!("k{j}"), j);
    }
    nodes[0].kill();
    nodes[0].restart();
    wait_for("the restarted node has every acknowledged write", Duration::from_secs(30), || async {
        let local = cluster_values(&c, nodes[0].api, "local").await?;
        (local == want).then_some(())
    })
    .await;
    put(&c, nodes[0].api, "/v1/clusters/k1", json!({"max_idle_per_endpoint": 1000})).await;
}

/// Clusters a and b (one upstream each), experiment e split a:b by `wa:wb`, service s → e.
async fn apply_ab(c: &HttpClient, node: SocketAddr, a: &Upstream, b: &Upstream, wa: u32, wb: u32) {
    put(c, node, "/v1/clusters/a", json!({"endpoints": [a.addr.to_string()]})).await;
    put(c, node, "/v1/clusters/b", json!({"endpoints": [b.addr.to_string()]})).await;
    let variants = json!([{"name": "a", "cluster": "a", "weight": wa}, {"name": "b", "cluster": "b", "weight": wb}]);
    put(c, node, "/v1/experiments/e", json!({"variants": variants})).await;
    put(c, node, "/v1/services/s", json!({"hosts": ["s"], "routes": [{"name": "r", "experiment": "e"}]})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_follow_changes_nack_broken_config_and_outlive_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = control_cluster(3, dir.path()).await;
    let c = client();
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    apply_ab(&c, nodes[1].api, &a, &b, 100, 0).await;

    let refs: Vec<&ControlProc> = nodes.iter().collect();
    let mut sidecar = SidecarProc::start("side-1", &dir.path().join("side"), &refs);
    traffic_goes_to(&c, sidecar.listen, "a").await;

    // A config change through weftctl (talking to a follower or the leader) moves the traffic.
    let servers = nodes.iter().map(|n| format!("http://{}", n.api)).collect::<Vec<_>>().join(",");
    let out = std::process::Command::new(workspace_bin("weftctl"))
        .args(["--server", &servers, "experiment", "set-weights", "e", "a=0", "b=100"])
        .output()
        .unwrap();
    assert!(out.status.success(), "weftctl: {}", String::from_utf8_lossy(&out.stderr));
    traffic_goes_to(&c, sidecar.listen, "b").await;

    // A route to an experiment that does not exist: refused by the API (422 naming the
    // field); stored anyway when the write says so, with a warning, and NACKed by the sidecar,
    // which keeps serving that service's last good version; proxy-status shows the error.
    let dangling = json!({"hosts": ["s"], "routes": [{"name": "r", "experiment": "missing"}]});
    let (status, v) = api(&c, Method::PUT, nodes[0].api, "/v1/services/s", Some(dangling.clone())).await;
    assert_eq!((status, v["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("routes.r.experiment")), "{v}");
    let v = put(&c, nodes[0].api, "/v1/services/s?allow_dangling=true", dangling).await;
    assert!(v["warnings"][0].as_str().unwrap().contains("missing"), "{v}");
    let nack = wait_for("proxy-status shows the NACK", Duration::from_secs(20), || async {
        let (_, v) = api(&c, Method::GET, nodes[0].api, "/v1/proxies", None).await;
        let item = v["items"].as_array()?.iter().find(|i| i["node_id"] == "side-1")?.clone();
        let shows = item["nack"]["error"].as_str().is_some_and(|e| e.contains("missing"));
        shows.then_some(item)
    })
    .await;
    assert_eq!(nack["connected"], true, "{nack}");
    traffic_goes_to(&c, sidecar.listen, "b").await;

    // The fault users hit: one bad service froze the whole services type at the sidecar, so a
    // good service added afterwards was never served (404). Now it is, beside the bad one.
    let broken = json!({"hosts": ["broken"], "routes": [{"name": "r", "cluster": "nope"}]});
    put(&c, nodes[0].api, "/v1/services/broken?allow_dangling=true", broken).await;
    put(&c, nodes[0].api, "/v1/services/later", json!({"hosts": ["later"], "routes": [{"name": "r", "cluster": "a"}]})).await;
    wait_for("the service added after the bad ones is served", Duration::from_secs(20), || async {
        let (status, _, body) = get(&c, sidecar.listen, "later", "/", &[]).await;
        (status == StatusCode::OK && body == "a").then_some(())
    })
    .await;
    let (status, _, _) = get(&c, sidecar.listen, "broken", "/", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the bad service is not served");
    traffic_goes_to(&c, sidecar.listen, "b").await;
    let (_, v) = api(&c, Method::DELETE, nodes[0].api, "/v1/services/broken", None).await;
    assert!(v["revision"].is_u64(), "{v}");
    put(&c, nodes[0].api, "/v1/services/s", json!({"hosts": ["s"], "routes": [{"name": "r", "experiment": "e"}]})).await;

    // Every control node down: the sidecar keeps routing.
    for n in &mut nodes {
        n.kill();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    traffic_goes_to(&c, sidecar.listen, "b").await;

    // Restarted while the control plane is still down: it serves its saved snapshot.
    sidecar.restart();
    traffic_goes_to(&c, sidecar.listen, "b").await;
    assert!(a.hits() > 0 && b.hits() > 0);
}

/// Which upstreams answered `n` requests through the sidecar at `addr`.
async fn answered_by(c: &HttpClient, addr: SocketAddr, n: usize) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..n {
        seen.insert(upstream_of(c, addr).await);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sidecar_is_marked_unhealthy_and_returns_with_its_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = control_cluster(1, dir.path()).await;
    let c = client();
    let (m1, m2) = (Upstream::start("m1").await, Upstream::start("m2").await);
    // Cluster m has no static endpoints: they come from the inbound sidecars' registrations.
    // Round robin: this test is about health, and with two endpoints p2c compares both and
    // keeps sending sequential requests to the one whose EWMA happens to be lower (seen to take
    // over 20 s to reach both under CI load).
    put(&c, nodes[0].api, "/v1/clusters/m", json!({"endpoints": [], "lb": "round_robin"})).await;
    let route = json!({"name": "r", "cluster": "m", "timeout": "2s"});
    put(&c, nodes[0].api, "/v1/services/s", json!({"hosts": ["s"], "listeners": ["out"], "routes": [route]})).await;

    let refs: Vec<&ControlProc> = nodes.iter().collect();
    let side = dir.path().join("side");
    let in1 = SidecarProc::inbound("in-1", &side, &refs, m1.addr, "m");
    let _in2 = SidecarProc::inbound("in-2", &side, &refs, m2.addr, "m");
    let out = SidecarProc::start("out-1", &side, &refs);
    let both: std::collections::BTreeSet<String> = ["m1", "m2"].map(String::from).into();
    wait_for("traffic reaches both registered endpoints", Duration::from_secs(20), || async {
        (answered_by(&c, out.listen, 20).await == both).then_some(())
    })
    .await;

    let health = |node: &'static str| {
        let c = c.clone();
        let api = nodes[0].api;
        async move {
            let (_, v) = api_get_proxies(&c, api).await;
            v["items"].as_array()?.iter().find(|i| i["node_id"] == node)?["registration"]["healthy"].as_bool()
        }
    };
    assert_eq!(health("in-1").await, Some(true));

    // Frozen: no heartbeats. The detector marks it down, every sidecar stops routing to it.
    in1.signal("STOP");
    wait_for("in-1 is marked unhealthy", Duration::from_secs(20), || async {
        (health("in-1").await == Some(false)).then_some(())
    })
    .await;
    wait_for("traffic avoids the frozen endpoint", Duration::from_secs(20), || async {
        (answered_by(&c, out.listen, 20).await == ["m2".to_string()].into()).then_some(())
    })
    .await;

    // Heartbeats return: healthy again, traffic returns.
    in1.signal("CONT");
    wait_for("in-1 is healthy again", Duration::from_secs(20), || async {
        (health("in-1").await == Some(true)).then_some(())
    })
    .await;
    wait_for("traffic reaches in-1 again", Duration::from_secs(20), || async {
        (answered_by(&c, out.listen, 20).await == both).then_some(())
    })
    .await;
}

async fn api_get_proxies(c: &HttpClient, api_addr: SocketAddr) -> (StatusCode, Value) {
    api(c, Method::GET, api_addr, "/v1/proxies", None).await
}

fn weftctl(servers: &[&ControlProc], args: &[&str]) -> (bool, String) {
    let servers = servers.iter().map(|n| format!("http://{}", n.api)).collect::<Vec<_>>().join(",");
    let out = std::process::Command::new(workspace_bin("weftctl"))
        .args(["--server", &servers, "-o", "json"])
        .args(args)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

async fn voters(c: &HttpClient, node: &ControlProc) -> Vec<u64> {
    let (_, v) = api(c, Method::GET, node.api, "/v1/members", None).await;
    let mut ids: Vec<u64> = v["members"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["voter"] == true).filter_map(|m| m["id"].as_u64()).collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_removed_and_added_through_weftctl() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = control_cluster(3, dir.path()).await;
    let c = client();

    // Remove node 3 (through any node: the request is forwarded to the leader).
    let (ok, out) = weftctl(&[&nodes[1]], &["members", "remove", "3"]);
    assert!(ok, "{out}");
    wait_for("node 3 is gone from the membership", Duration::from_secs(20), || async {
        (voters(&c, &nodes[0]).await == vec![1, 2]).then_some(())
    })
    .await;
    nodes[2].kill();
    put(&c, nodes[0].api, "/v1/clusters/two-nodes", json!({"max_idle_per_endpoint": 2})).await;

    // A new node joins (learner, catches up, voter) and has every write.
    let n4 = ControlProc::start(4, dir.path(), false, Some(nodes[1].api));
    wait_for("node 4 is a voter", Duration::from_secs(30), || async {
        (voters(&c, &nodes[0]).await == vec![1, 2, 4]).then_some(())
    })
    .await;
    wait_for("node 4 has the writes made before it joined", Duration::from_secs(20), || async {
        cluster_values(&c, n4.api, "local").await?.contains_key("two-nodes").then_some(())
    })
    .await;
    // Its own view of the membership can trail its data by a moment (the membership entry is
    // applied with the log; the data may have come in a snapshot first).
    wait_for("weftctl on node 4 lists node 4", Duration::from_secs(20), || async {
        let (ok, out) = weftctl(&[&n4], &["members"]);
        let listed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert!(ok, "{out}");
        listed["members"].as_array().unwrap().iter().any(|m| m["id"] == 4).then_some(())
    })
    .await;

    let (_, st) = api(&c, Method::GET, n4.api, "/v1/status", None).await;
    assert_eq!(st["history_revisions"], 100000, "status shows the node's history setting: {st}");

    // A node whose history would be compacted differently is refused, with the field named,
    // and exits instead of serving as a member.
    let body = json!({"id": 5, "addr": "127.0.0.1:1", "history_revisions": 7});
    let (s, v) = api(&c, Method::POST, nodes[1].api, "/v1/members", Some(body)).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let msg = v.to_string();
    assert!(msg.contains("history_revisions") && msg.contains("--history-revisions 7") && msg.contains("100000"), "{msg}");
    let mut n5 = ControlProc::start_with(5, dir.path(), false, Some(nodes[0].api), &["--history-revisions", "7"]);
    let status = n5.exited_within(Duration::from_secs(30)).await.expect("a refused join ends the process");
    assert!(!status.success());
    assert_eq!(voters(&c, &nodes[0]).await, vec![1, 2, 4], "node 5 never became a member");
}

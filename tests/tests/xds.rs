//! The sidecar as an xDS client: a real ADS server (`weft_xds::AdsServer` + `Cache`) on
//! loopback pushes resources to an in-process weft-proxy started with `--xds`, and real
//! upstreams show where traffic goes. Each test tells one story a user relies on: a change
//! pushed through the control plane moves traffic; an invalid push is NACKed and changes
//! nothing; losing the control plane loses no traffic; a restart without a control plane
//! serves the config saved on disk.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use weft_proxy::xds::XdsOptions;
use weft_tests::*;
use weft_xds::cache::NodeStatus;
use weft_xds::resources::v1;
use weft_xds::typeurl::{CLUSTER, SERVICE};
use weft_xds::{AdsServer, Cache, Resources};

/// Generous bound on any wait; each step normally takes milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

/// A control node on a runtime of its own, so stopping it really drops every stream (tonic
/// serves each connection on its own task, which outlives an aborted accept loop).
struct ControlNode {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl ControlNode {
    fn start(cache: &Cache) -> ControlNode {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let service = AdsServer::new(cache.clone()).into_service();
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            Server::builder().add_service(service).serve_with_incoming(TcpIncoming::from(listener)).await
        });
        ControlNode { addr, rt: Some(rt) }
    }

    fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for ControlNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An address nothing listens on (a control node that is down).
fn dead_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

/// A proxy whose bootstrap has only node, admin and one listener: everything it routes
/// comes from xDS (or the disk cache).
fn start_xds_proxy(node: &str, servers: Vec<String>, cache_path: Option<PathBuf>) -> weft_proxy::Proxy {
    let yaml = format!(
        r#"
node: {{id: {node}}}
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
"#
    );
    let cfg = weft_proxy::Config::from_yaml(&yaml).unwrap();
    let xds = XdsOptions {
        cache_path,
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        ..XdsOptions::new(servers)
    };
    weft_proxy::Proxy::start(cfg, weft_proxy::Options { xds: Some(xds), ..Default::default() }).unwrap()
}

fn cluster_with_endpoints(r: &mut Resources, name: &str, up: &Upstream) {
    r.add(&v1::Cluster { name: name.into(), ..Default::default() });
    r.add(&v1::Endpoints {
        cluster_name: name.into(),
        endpoints: vec![v1::Endpoint { address: up.addr.to_string(), healthy: true, ..Default::default() }],
    });
}

fn service(target: v1::route::Target) -> v1::Service {
    v1::Service {
        name: "s".into(),
        hosts: vec!["s".into()],
        routes: vec![v1::Route { name: "r".into(), target: Some(target), ..Default::default() }],
        ..Default::default()
    }
}

/// Service `s` split by experiment `e` between clusters a and b with the given weights.
fn ab(a: &Upstream, b: &Upstream, wa: u32, wb: u32) -> Resources {
    let mut r = Resources::new();
    cluster_with_endpoints(&mut r, "a", a);
    cluster_with_endpoints(&mut r, "b", b);
    let variant =
        |name: &str, weight| v1::Variant { name: name.into(), cluster: name.into(), weight, ..Default::default() };
    r.add(&v1::Experiment {
        name: "e".into(),
        variants: vec![variant("a", wa), variant("b", wb)],
        ..Default::default()
    });
    r.add(&service(v1::route::Target::Experiment("e".into())));
    r
}

/// Polls `check` until it holds, failing the test after [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Body of a GET to service `s` through the proxy ("" unless 200).
async fn upstream_of(c: &HttpClient, addr: SocketAddr) -> String {
    let (status, _, body) = get(c, addr, "s", "/", &[]).await;
    if status == 200 { String::from_utf8_lossy(&body).into_owned() } else { String::new() }
}

/// Waits until traffic reaches `name`, then checks that 20 requests in a row do.
async fn traffic_goes_to(c: &HttpClient, addr: SocketAddr, name: &str) {
    eventually(&format!("traffic reaches {name}"), || async move { upstream_of(c, addr).await == name }).await;
    for _ in 0..20 {
        assert_eq!(upstream_of(c, addr).await, name);
    }
}

async fn wait_status(cache: &Cache, node: &str, done: impl Fn(&NodeStatus) -> bool) -> NodeStatus {
    let done = &done;
    eventually(&format!("node {node} reaches the expected status"), || async move {
        cache.node_status(node).is_some_and(|s| done(&s))
    })
    .await;
    cache.node_status(node).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_config_routes_traffic_and_new_revisions_move_it() {
    let (a, b, c) = (Upstream::start("a").await, Upstream::start("b").await, Upstream::start("c").await);
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 1, 0)).unwrap();
    let control = ControlNode::start(&cache);
    // The first control node is down: the sidecar fails over to the second.
    let p = start_xds_proxy("sidecar-a", vec![dead_addr(), control.addr.to_string()], None);
    let http = client();
    let addr = p.listener_addrs[0];
    traffic_goes_to(&http, addr, "a").await;

    // New weights: everything to b.
    cache.set(2, ab(&a, &b, 0, 1)).unwrap();
    traffic_goes_to(&http, addr, "b").await;

    // A new cluster, its endpoints and the route to it, in one revision: applied together.
    let mut r = ab(&a, &b, 0, 1);
    cluster_with_endpoints(&mut r, "c", &c);
    r.add(&service(v1::route::Target::Cluster("c".into())));
    cache.set(3, r).unwrap();
    traffic_goes_to(&http, addr, "c").await;
    let status = wait_status(&cache, "sidecar-a", |s| s.acked.get(SERVICE).map(String::as_str) == Some("3")).await;
    assert!(status.nacked.is_empty(), "nothing was rejected: {:?}", status.nacked);
    assert_eq!(status.acked.get(CLUSTER).map(String::as_str), Some("3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_push_is_nacked_and_the_old_config_keeps_serving() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 1, 0)).unwrap();
    let control = ControlNode::start(&cache);
    let p = start_xds_proxy("sidecar-b", vec![control.addr.to_string()], None);
    let http = client();
    let addr = p.listener_addrs[0];
    traffic_goes_to(&http, addr, "a").await;
    let version = p.shared.snapshot.load().version;

    // The route now names a cluster that does not exist.
    let mut bad = ab(&a, &b, 1, 0);
    bad.add(&service(v1::route::Target::Cluster("nope".into())));
    cache.set(2, bad).unwrap();
    let status = wait_status(&cache, "sidecar-b", |s| s.nacked.contains_key(SERVICE)).await;
    let nack = &status.nacked[SERVICE];
    assert_eq!(nack.version, 2);
    assert!(nack.error.contains("services.s.routes.r.cluster: unknown cluster \"nope\""), "{}", nack.error);
    assert_eq!(status.acked.get(SERVICE).map(String::as_str), Some("1"), "still on the old version");
    traffic_goes_to(&http, addr, "a").await;
    assert_eq!(p.shared.snapshot.load().version, version, "nothing was swapped in");
    let dump: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["config"]["services"][0]["routes"][0]["experiment"], "e", "{dump}");

    // The next valid revision is accepted again.
    cache.set(3, ab(&a, &b, 0, 1)).unwrap();
    traffic_goes_to(&http, addr, "b").await;
    wait_status(&cache, "sidecar-b", |s| s.acked.get(SERVICE).map(String::as_str) == Some("3")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_endpoints_come_one_revision_later_is_not_nacked() {
    let (a, b, c) = (Upstream::start("a").await, Upstream::start("b").await, Upstream::start("c").await);
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 1, 0)).unwrap();
    let control = ControlNode::start(&cache);
    let p = start_xds_proxy("sidecar-e", vec![control.addr.to_string()], None);
    let http = client();
    let addr = p.listener_addrs[0];
    traffic_goes_to(&http, addr, "a").await;

    // Revision 2: cluster c and a route to it, but no endpoints yet (not servable alone).
    let mut r = ab(&a, &b, 1, 0);
    r.add(&v1::Cluster { name: "c".into(), ..Default::default() });
    r.add(&service(v1::route::Target::Cluster("c".into())));
    cache.set(2, r).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Revision 3: its endpoints. Had revision 2 been NACKed, it would never be pushed again.
    let mut r = ab(&a, &b, 1, 0);
    cluster_with_endpoints(&mut r, "c", &c);
    r.add(&service(v1::route::Target::Cluster("c".into())));
    cache.set(3, r).unwrap();
    traffic_goes_to(&http, addr, "c").await;
    let status = wait_status(&cache, "sidecar-e", |s| s.acked.get(CLUSTER).map(String::as_str) == Some("2")).await;
    assert!(status.nacked.is_empty(), "{:?}", status.nacked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_continues_when_every_control_node_is_down() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 0, 1)).unwrap();
    let (mut first, mut second) = (ControlNode::start(&cache), ControlNode::start(&cache));
    let p = start_xds_proxy("sidecar-c", vec![first.addr.to_string(), second.addr.to_string()], None);
    let http = client();
    let addr = p.listener_addrs[0];
    traffic_goes_to(&http, addr, "b").await;
    wait_status(&cache, "sidecar-c", |s| s.streams == 1).await;

    first.stop();
    second.stop();
    // Long enough for the sidecar to notice and go through several reconnect rounds.
    let until = Instant::now() + Duration::from_millis(1500);
    let mut served = 0;
    while Instant::now() < until {
        assert_eq!(upstream_of(&http, addr).await, "b", "request {served} after the control plane went away");
        served += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served > 20, "{served}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_control_plane_serves_the_saved_config() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let dir = std::env::temp_dir().join(format!("weft-xds-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sidecar-d.json");
    let _ = std::fs::remove_file(&path);

    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 0, 1)).unwrap();
    let mut control = ControlNode::start(&cache);
    let p = start_xds_proxy("sidecar-d", vec![control.addr.to_string()], Some(path.clone()));
    let http = client();
    traffic_goes_to(&http, p.listener_addrs[0], "b").await;
    let saved_path = &path;
    eventually("the pushed config is saved", || async move { std::fs::metadata(saved_path).is_ok() }).await;
    p.shutdown(Duration::from_secs(1));
    control.stop();

    // A new sidecar process (same node, same cache file), control plane unreachable.
    let p = start_xds_proxy("sidecar-d", vec![control.addr.to_string()], Some(path.clone()));
    traffic_goes_to(&http, p.listener_addrs[0], "b").await;

    // The saved file is readable config, not an opaque blob.
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved["node"], "sidecar-d");
    assert_eq!(saved["resources"]["endpoints"]["b"][0], b.addr.to_string());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills the child on drop so a failing test leaves no process behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_listening(addr: SocketAddr) {
    eventually(
        &format!("{addr} accepts connections"),
        || async move { tokio::net::TcpStream::connect(addr).await.is_ok() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_with_xds_flags_routes_by_pushes_and_restarts_from_its_cache() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let dir = std::env::temp_dir().join(format!("weft-xds-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (bootstrap, saved) = (dir.join("bootstrap.yaml"), dir.join("xds-cache.json"));
    let _ = std::fs::remove_file(&saved);
    let (admin, listen): (SocketAddr, SocketAddr) = (dead_addr().parse().unwrap(), dead_addr().parse().unwrap());
    std::fs::write(&bootstrap, format!("node: {{id: sidecar-bin}}\nadmin: {{address: \"{admin}\"}}\nlisteners: [{{name: out, address: \"{listen}\"}}]\n"))
        .unwrap();

    let cache = Cache::new(Duration::from_millis(5));
    cache.set(1, ab(&a, &b, 1, 0)).unwrap();
    let mut control = ControlNode::start(&cache);
    let servers = format!("{},{}", dead_addr(), control.addr);
    let run = || {
        let child = std::process::Command::new(workspace_bin("weft-proxy"))
            .args(["--config", bootstrap.to_str().unwrap(), "--xds", &servers])
            .args(["--xds-cache", saved.to_str().unwrap(), "--log", "warn"])
            .spawn()
            .unwrap();
        Child(child)
    };
    let http = client();
    let child = run();
    wait_listening(admin).await;
    traffic_goes_to(&http, listen, "a").await;
    wait_status(&cache, "sidecar-bin", |s| s.acked.get(SERVICE).map(String::as_str) == Some("1")).await;
    let saved_ref = &saved;
    eventually("the pushed config is saved", || async move { std::fs::metadata(saved_ref).is_ok() }).await;

    // Restart with the whole control plane down: the saved config serves.
    drop(child);
    control.stop();
    let _child = run();
    wait_listening(admin).await;
    // A fresh client: the old one's pooled connections died with the first process.
    traffic_goes_to(&client(), listen, "a").await;
    let _ = std::fs::remove_dir_all(&dir);
}

//! The sync's writes against a real weft-control node (in process, its Raft store on disk):
//! the example's custom resources become weft resources with the status a user would read, a
//! refused one says why, a deleted one goes, and the recorded EndpointSlice watch leaves the
//! right endpoints in weft's store. (No API server runs here: the watches are fed the recorded
//! events kube's watcher would yield.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use http::Method;
use serde_json::Value;
use weft_control::cli::client::{Client, Server};
use weft_control::server::{self, Options, Running};
use weft_k8s::crds;
use weft_k8s::sync::{self, Weft};

struct Node {
    _running: Running,
    url: String,
    _dir: tempfile::TempDir,
}

async fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = Options::new(1, "127.0.0.1:0".parse().unwrap(), "127.0.0.1:0".parse().unwrap(), dir.path().into());
    opts.init = true;
    // The rollout engine's first reading comes at once, not after the default interval.
    opts.rollout_interval = Duration::from_millis(100);
    let running = server::start(opts).await.unwrap();
    let url = format!("http://{}", running.api_addr);
    let mut c = client(&url);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.request(Method::GET, "/v1/status", None, None).await.is_ok_and(|r| r.body["leader"] == 1) {
        assert!(Instant::now() < deadline, "no leader within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Node { _running: running, url, _dir: dir }
}

fn client(url: &str) -> Client {
    Client::new(vec![Server::parse(url, false).unwrap()], None)
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    let r = client(url).request(Method::GET, path, None, None).await.unwrap();
    (r.status.as_u16(), r.body)
}

fn example() -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/example/mesh.yaml")).unwrap();
    serde_norway::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_become_weft_resources_with_a_status() {
    let n = node().await;
    let weft = Weft::new(client(&n.url));
    let docs = example();
    let experiment: crds::Experiment = serde_json::from_value(docs[0].clone()).unwrap();
    let mut route: crds::Route = serde_json::from_value(docs[1].clone()).unwrap();
    let rollout: crds::Rollout = serde_json::from_value(docs[2].clone()).unwrap();
    route.metadata.generation = Some(4);

    // kubectl sends the Route before the Experiment it names: accepted, with the warning.
    let st = sync::write(&weft, &route).await.unwrap();
    assert_eq!(st.phase, "Accepted", "{st:?}");
    assert!(st.message.contains("ranker-ab"), "the dangling experiment is named: {}", st.message);
    assert_eq!(st.observed_generation, Some(4));
    let first = st.revision.expect("a revision");
    let st = sync::write(&weft, &experiment).await.unwrap();
    assert_eq!(st.phase, "Accepted", "{st:?}");
    assert!(st.revision.unwrap() > first);
    let st = sync::write(&weft, &rollout).await.unwrap();
    assert_eq!(st.phase, "Accepted", "{st:?}");
    // The engine picks it up on its next reading; the sync's next pass reports its step.
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = sync::write(&weft, &rollout).await.unwrap();
        if st.rollout_phase.is_some() || Instant::now() > deadline {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((st.rollout_step, st.rollout_weight), (Some(0), Some(10)), "the rollout starts at its first step: {st:?}");

    let (code, body) = get(&n.url, "/v1/services/ranker").await;
    assert_eq!(code, 200);
    assert_eq!(body["spec"]["hosts"], serde_json::json!(["ranker", "ranker.models.svc"]));
    assert_eq!(body["spec"]["name"], "ranker", "named after metadata.name");

    // A spec weft-control refuses: the status says which field.
    let mut bad = route.clone();
    bad.metadata.name = Some("broken".into());
    bad.spec.service.name = String::new();
    bad.spec.service.routes[0].experiment = None;
    bad.spec.service.routes[0].cluster = None;
    let st = sync::write(&weft, &bad).await.unwrap();
    assert_eq!(st.phase, "Refused", "{st:?}");
    assert!(st.message.contains("field: routes.infer"), "names the field: {}", st.message);
    assert_eq!(get(&n.url, "/v1/services/broken").await.0, 404, "nothing stored");

    // Deleting the object (the finalizer's cleanup) deletes the weft resource; twice is fine.
    sync::delete(&weft, &route).await.unwrap();
    sync::delete(&weft, &route).await.unwrap();
    assert_eq!(get(&n.url, "/v1/services/ranker").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_endpointslice_watch_leaves_the_right_endpoints_in_weft() {
    let n = node().await;
    let weft = Weft::new(client(&n.url));
    let events: Vec<_> = common::recorded().iter().flat_map(common::events).map(Ok).collect();
    sync::endpoints(&weft, futures_util::stream::iter(events)).await;

    let (code, body) = get(&n.url, "/v1/endpoints/ranker").await;
    assert_eq!(code, 200, "{body}");
    let addrs: Vec<&str> = body["spec"]["endpoints"].as_array().unwrap().iter().map(|e| e["address"].as_str().unwrap()).collect();
    assert_eq!(addrs, ["10.1.0.11:15006", "10.1.0.13:15006", "10.1.1.22:15006", "10.1.1.23:15006"]);
    assert_eq!(body["spec"]["endpoints"][2]["variant"], "b");
    // The cluster it feeds was created, with weft's defaults.
    assert_eq!(get(&n.url, "/v1/clusters/ranker").await.0, 200);
    // The embedder Service was deleted during the watch.
    assert_eq!(get(&n.url, "/v1/endpoints/embedder").await.0, 404);
}

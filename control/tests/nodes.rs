//! The node-agent side of the control plane on a real single-node control plane: a replica
//! workload with a `launch` placed by `schedule apply` and pushed over ADS with its launch; a
//! node agent's report (`PUT /v1/nodestatuses/<node>`, as the agent sends it) stored and read
//! back; bad reports and bad launches refused naming the field, nothing written; and
//! `weftctl node list|describe` and `weftctl schedule status` joining the inventory, the
//! placements and the reports.

mod common;

use std::time::{Duration, Instant};

use common::*;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_control::cli::client::{Client, Server};
use weft_xds::resources::{from_any, v1};

/// Two nodes; only gpu-1's agent reports.
const NODES: &str = "\
kind: Node
name: gpu-1
spec: {cpu_milli: 64000, memory_mib: 512000, gpu_model: A100, gpu_count: 2, gpu_memory_bytes: 85899345920}
---
kind: Node
name: gpu-2
spec: {cpu_milli: 64000, memory_mib: 512000, gpu_model: A100, gpu_count: 2, gpu_memory_bytes: 85899345920}
";

/// A variant of a 16 GiB base started by weft's reference server.
const WORKLOADS: &str = "\
workloads:
  - kind: replica
    name: chat-a-0
    variant: a
    base_model: llama-8b
    base_bytes: 17179869184
    delta_bytes: 536870912
    working_set_bytes: 4294967296
    compute_milli: 500
    cpu_milli: 1000
    memory_mib: 4096
    launch:
      cluster: chat-a
      base_path: /models/llama-8b.safetensors
      delta_path: /models/chat-a.safetensors
      labels: {tier: gold}
";

fn report(node: &str, placement: &str, reported_at_ms: u64) -> Value {
    json!({
        "node": node, "agent_version": "0.1.0", "reported_at_ms": reported_at_ms, "inventory_source": "nvml",
        "gpus": [{"index": 0, "name": "A100", "memory_bytes": 85899345920_u64, "used_bytes": 22548578304_u64},
                 {"index": 1, "name": "A100", "memory_bytes": 85899345920_u64}],
        "replicas": [{"placement": placement, "variant": "a", "base_model": "llama-8b", "state": "ready",
                      "pid": 4242, "sidecar_pid": 4243, "endpoint": "127.0.0.1:15011", "gpu": 0}],
        "holders": [{"base_model": "llama-8b", "gpu": 0, "pid": 4200, "users": 1, "bytes": 17179869184_u64, "mechanism": "cuda-ipc"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_are_pushed_and_agents_reports_are_stored_validated_and_shown() {
    let n = start().await;
    let url = n.url.as_str();
    let dir = tempfile::tempdir().unwrap();
    let mut client = Client::new(vec![Server::parse(url, false).unwrap()], None);

    ok(url, &["apply", "-f", &write(&dir, "nodes.yaml", NODES)]).await;
    let applied = json(url, &["schedule", "apply", "-f", &write(&dir, "w.yaml", WORKLOADS)]).await;
    assert_eq!(applied["placed"][0]["workload"], "chat-a-0", "{applied}");
    let placed_on = applied["placed"][0]["allocations"][0]["node"].as_str().unwrap().to_string();

    // The placement reaches node agents with its launch (once the commit is published).
    let deadline = Instant::now() + Duration::from_secs(10);
    let pushed = loop {
        let pushed = ads_first(n.running.xds_addr, "agent-1", weft_xds::typeurl::PLACEMENT).await;
        if !pushed.is_empty() || Instant::now() > deadline {
            break pushed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let p: v1::Placement = from_any(pushed.first().expect("the placement is published within 10 s")).unwrap();
    let launch = p.launch.expect("the launch is pushed with the placement");
    assert_eq!((launch.cluster.as_str(), launch.delta_path.as_str()), ("chat-a", "/models/chat-a.safetensors"));
    assert_eq!(launch.labels["tier"], "gold");

    // A bad launch: 422 naming the field, nothing placed; weftctl refuses it before sending.
    let before = revisions(url).await;
    let mut bad: Value = serde_json::to_value(serde_norway::from_str::<serde_norway::Value>(WORKLOADS).unwrap()).unwrap();
    bad["workloads"][0]["name"] = json!("chat-b-0");
    bad["workloads"][0]["launch"]["command"] = json!(["vllm", "serve", "--port", "{port}"]);
    let r = client.request(Method::POST, "/v1/schedule/apply", Some(&bad), None).await.unwrap();
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", r.body);
    assert_eq!(r.body["field"], "workloads[0].launch.command", "{:?}", r.body);
    assert!(r.body["error"].as_str().unwrap().contains("/models/llama-8b.safetensors"), "names the value: {:?}", r.body);
    let o = ctl(url, &["schedule", "plan", "-f", &write(&dir, "bad.yaml", &bad.to_string())], None).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("workloads[0].launch.command"), "{o:?}");
    assert_eq!(revisions(url).await, before);

    // The agent's report, as it sends it: stored and read back as sent.
    let now = weft_control::cli::node::now_ms();
    let sent = report(&placed_on, "chat-a-0", now);
    let r = client.request(Method::PUT, &format!("/v1/nodestatuses/{placed_on}"), Some(&sent), None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let back = client.request(Method::GET, &format!("/v1/nodestatuses/{placed_on}"), None, None).await.unwrap();
    let got: weft_control::nodes::NodeStatus = serde_json::from_value(back.body["spec"].clone()).unwrap();
    assert_eq!(got, serde_json::from_value(sent.clone()).unwrap());

    // Bad reports: 422 naming the field, nothing written.
    let before = revisions(url).await;
    let mut bad_state = sent.clone();
    bad_state["replicas"][0]["state"] = json!("running");
    let mut other_node = sent.clone();
    other_node["node"] = json!("gpu-9");
    let mut unknown = sent.clone();
    unknown["gpus"][1]["temperature"] = json!(40);
    for (body, field) in [(bad_state, "replicas[0].state"), (other_node, "node"), (unknown, "gpus[1].temperature")] {
        let r = client.request(Method::PUT, &format!("/v1/nodestatuses/{placed_on}"), Some(&body), None).await.unwrap();
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {:?}", r.body);
        assert_eq!(r.body["field"], field, "{:?}", r.body);
    }
    assert_eq!(revisions(url).await, before, "a refused report writes nothing");

    // weftctl joins the inventory, the placements and the reports.
    let other = if placed_on == "gpu-1" { "gpu-2" } else { "gpu-1" };
    let list = ok(url, &["node", "list"]).await;
    let row = |node: &str| list.lines().find(|l| l.starts_with(node)).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    assert_eq!(row(&placed_on)[1..5], ["nvml", "2×A100", "1/1", "1"], "{list}");
    assert!(row(&placed_on).join(" ").ends_with(" ago"), "{list}");
    assert_eq!(row(other)[1..], ["-", "2×A100", "-", "-", "no", "agent"], "{list}");
    let listed = json(url, &["node", "list"]).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");

    let described = ok(url, &["node", "describe", &placed_on]).await;
    assert!(described.contains("chat-a-0") && described.contains("127.0.0.1:15011") && described.contains("cuda-ipc"), "{described}");
    let o = ctl(url, &["node", "describe", "gpu-9"], None).await;
    assert_eq!(o.code, 1, "{o:?}");
    assert!(o.stderr.contains("neither in the inventory"), "{o:?}");

    let status = ok(url, &["schedule", "status"]).await;
    let line = status.lines().find(|l| l.starts_with("chat-a-0")).unwrap_or_default();
    assert!(line.contains(&placed_on) && line.contains(" ready ") && line.contains("127.0.0.1:15011"), "{status}");
    assert_eq!(json(url, &["schedule", "status"]).await["items"][0]["state"], "ready");

    // An agent that stops reporting goes stale.
    let old = report(&placed_on, "chat-a-0", now - 120_000);
    let r = client.request(Method::PUT, &format!("/v1/nodestatuses/{placed_on}"), Some(&old), None).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    let status = ok(url, &["schedule", "status"]).await;
    assert!(status.contains("ready (stale 2m"), "{status}");
    n.running.shutdown().await.unwrap();
}

//! Progressive delivery end to end, with the real binaries on loopback and a shortened
//! timescale: one `weft-control` (rollout engine reading every 300 ms), an outbound
//! `weft-proxy` sidecar reporting load every 200 ms, and three model-server stand-ins. Two
//! rollouts run at once:
//!
//! - `bad`: candidate `b` has +2 points of errors (every 50th request fails) against baseline
//!   `a` (none): the engine rolls it back to 0% on the error-rate guardrail, with confidence;
//! - `good`: candidate `g` is as good as `a`: it is promoted step by step (10% → 50% → 100%).
//!
//! Each decision is in the rollout's history and `weftctl experiment status` shows the verdict.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::*;
use weft_tests::*;

async fn put(c: &HttpClient, node: &ControlProc, path: &str, body: Value) {
    let (s, v) = api(c, Method::PUT, node.api, path, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "PUT {path}: {v}");
}

async fn rollout(c: &HttpClient, node: &ControlProc, name: &str) -> Value {
    api(c, Method::GET, node.api, &format!("/v1/rollout/{name}"), None).await.1
}

/// The status of a GET to `host` through the sidecar; `None` when it does not answer (yet).
async fn status_of(c: &HttpClient, addr: std::net::SocketAddr, host: &str) -> Option<StatusCode> {
    let req = http::Request::get(format!("http://{addr}/")).header("host", host).body(full("")).unwrap();
    match tokio::time::timeout(Duration::from_secs(5), c.request(req)).await {
        Ok(Ok(resp)) => {
            let status = resp.status();
            use http_body_util::BodyExt;
            let _ = resp.into_body().collect().await;
            Some(status)
        }
        _ => None,
    }
}


#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worse_candidate_is_rolled_back_and_a_good_one_promoted_step_by_step() {
    let root = tempfile::tempdir().unwrap();
    let c = client();
    let node = ControlProc::start_with(1, root.path(), true, None, &["--rollout-interval-s", "0.3"]);
    wait_for("the node leads", Duration::from_secs(20), || async { node.status(&c).await.filter(|s| s["leader"] == 1).map(|_| ()) }).await;

    let (a, b, g) = (Upstream::start("a").await, Upstream::start("b").await, Upstream::start("g").await);
    b.fail_every.store(50, SeqCst);
    for (name, up) in [("ca", &a), ("cb", &b), ("cg", &g)] {
        put(&c, &node, &format!("/v1/clusters/{name}"), json!({"endpoints": [up.addr.to_string()]})).await;
    }
    for (exp, cand, cluster) in [("bad", "b", "cb"), ("good", "g", "cg")] {
        let variants = json!([{"name": "a", "cluster": "ca", "weight": 100}, {"name": cand, "cluster": cluster, "weight": 0}]);
        put(&c, &node, &format!("/v1/experiments/{exp}"), json!({"variants": variants})).await;
        put(&c, &node, &format!("/v1/services/s-{exp}"), json!({"hosts": [format!("s-{exp}")], "routes": [{"name": "r", "experiment": exp}]})).await;
    }
    let side = SidecarProc::start_with("client", &root.path().join("side"), &[&node], &["--report-interval", "200ms"]);
    wait_for("routing through the sidecar", Duration::from_secs(20), || async {
        let s1 = status_of(&c, side.listen, "s-bad").await;
        let s2 = status_of(&c, side.listen, "s-good").await;
        (s1 == Some(StatusCode::OK) && s2 == Some(StatusCode::OK)).then_some(())
    })
    .await;

    // The latency guardrail is left loose: both arms share one latency distribution, and this
    // test is about errors (the latency guardrail has its own unit tests).
    let spec = |cand: &str, min_per_step: u64| {
        json!({"baseline": "a", "candidate": cand, "steps": [10, 50, 100], "min_per_step": min_per_step,
               "warmup_s": 1.0, "max_slow_increase": 0.5})
    };
    put(&c, &node, "/v1/rollouts/bad", spec("b", 1500)).await;
    put(&c, &node, "/v1/rollouts/good", spec("g", 200)).await;

    // Traffic until both rollouts finish (bounded).
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for i in 0..6 {
        let (stop, addr) = (stop.clone(), side.listen);
        let host = if i % 2 == 0 { "s-bad" } else { "s-good" };
        load.push(tokio::spawn(async move {
            let c = client();
            while !stop.load(SeqCst) {
                status_of(&c, addr, host).await;
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(150);
    let (bad, good) = loop {
        let (bad, good) = (rollout(&c, &node, "bad").await, rollout(&c, &node, "good").await);
        let phase = |v: &Value| v["rollout"]["state"]["phase"].as_str().unwrap_or("").to_string();
        let done = |p: &str| p == "promoted" || p == "rolled_back";
        if done(&phase(&bad)) && done(&phase(&good)) {
            break (bad, good);
        }
        assert!(Instant::now() < deadline, "rollouts not finished in 150 s:\nbad: {bad}\ngood: {good}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    stop.store(true, SeqCst);
    for l in load {
        let _ = l.await;
    }

    let bad_state = &bad["rollout"]["state"];
    assert_eq!(bad_state["phase"], "rolled_back", "{bad}");
    assert_eq!(bad_state["weight"], 0);
    assert_eq!(bad_state["last"]["verdict"]["guardrail"], "error_rate", "{bad}");
    assert!(bad_state["last"]["errors"]["lo"].as_f64().unwrap() > 0.0, "the increase is bounded away from 0: {bad}");
    let good_state = &good["rollout"]["state"];
    assert_eq!(good_state["phase"], "promoted", "{good}");
    assert_eq!(good_state["weight"], 100);

    // The experiments' weights followed the decisions.
    let weights = |v: Value| -> Vec<(String, u64)> {
        v["spec"]["variants"].as_array().unwrap().iter().map(|x| (x["name"].as_str().unwrap().to_string(), x["weight"].as_u64().unwrap())).collect()
    };
    let (_, e) = api(&c, Method::GET, node.api, "/v1/experiments/bad", None).await;
    assert_eq!(weights(e), vec![("a".into(), 100), ("b".into(), 0)]);
    let (_, e) = api(&c, Method::GET, node.api, "/v1/experiments/good", None).await;
    assert_eq!(weights(e), vec![("a".into(), 0), ("g".into(), 100)]);

    // Every step is in the history of the rollout's state, with its evidence.
    let (_, h) = api(&c, Method::GET, node.api, "/v1/rolloutstates/good/history", None).await;
    let mut steps: Vec<u64> = h["items"].as_array().unwrap().iter().filter_map(|i| i["spec"]["weight"].as_u64()).collect();
    steps.dedup();
    assert_eq!(steps, vec![10, 50, 100], "{h}");
    let reasons: Vec<&str> = h["items"].as_array().unwrap().iter().filter_map(|i| i["spec"]["reason"].as_str()).collect();
    assert!(reasons.iter().any(|r| r.starts_with("step 1 passed") && r.contains("SRM p")), "{reasons:?}");

    // What an operator sees.
    let status = weftctl(&node, &["experiment", "status", "bad"]);
    assert!(status.contains("rolled_back at 0%") && status.contains("error_rate"), "{status}");
    assert!(status.contains("VARIANT") && status.contains("P95"), "{status}");
    let history = weftctl(&node, &["history", "rolloutstates", "good"]);
    assert!(history.contains("promoted"), "{history}");
    let stat = weftctl(&node, &["stat", "--window", "60"]);
    let row = stat.lines().find(|l| l.starts_with("s-bad") && l.contains(" b ")).unwrap_or_else(|| panic!("{stat}"));
    assert!(row.contains('%') && row.contains("ms"), "success rate and latency per variant: {stat}");
    // A finished rollout can still be reverted by hand.
    let out = weftctl(&node, &["experiment", "rollback", "good"]);
    assert!(out.contains("rolled_back at 0%"), "{out}");
}

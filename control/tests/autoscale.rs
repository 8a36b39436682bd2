//! The autoscaler end to end on a real single-node control plane: an `Autoscaler` applied
//! with weftctl, a sidecar's load reports on the gRPC report stream, the leader's decision
//! committed as a `scalingdecisions` resource and pushed over ADS as `weft.v1.ScalingDecision`,
//! `weftctl autoscale status`, and a spot preemption notice replacing critical replicas on
//! on-demand. Bad input (an invalid spec, a hand-written decision, a notice for an unknown
//! autoscaler) is refused with the field named and nothing written. An autoscaler with a
//! `placement` gets its decided replicas placed on the GPU inventory by the scheduler, per
//! pool, replaced when released and released when it goes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use weft_xds::resources::{from_any, v1};
use weft_xds::typeurl::SCALING_DECISION;

const AUTOSCALER: &str = "\
kind: Autoscaler
name: chat-a
spec:
  variant: a
  policy: hybrid
  capacity_rps: 10
  cold_start_s: 30
  min_replicas: 1
  max_replicas: 20
  spot: { price_per_hour: 1.0, preemptions_per_hour: 0.01 }
";

/// Reports `rps` for variant `a` every 100 ms until the returned sender is dropped.
async fn sidecar(xds: std::net::SocketAddr, rps: u64) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<v1::SidecarReport>(16);
    let channel = tonic::transport::Channel::from_shared(format!("http://{xds}")).unwrap().connect().await.unwrap();
    let mut client = v1::sidecar_reports_client::SidecarReportsClient::new(channel);
    let registration = v1::Registration {
        cluster: "chat-a".into(),
        address: "127.0.0.1:9".into(),
        variant: "a".into(),
        ..Default::default()
    };
    tx.send(v1::SidecarReport { node_id: "side-a".into(), registration: Some(registration), seq: 1, load: vec![], training: None, identity: None })
        .await
        .unwrap();
    let mut acks = client.report(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let (stop, mut stopped) = mpsc::channel::<()>(1);
    tokio::spawn(async move {
        let mut seq = 1;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = stopped.recv() => return,
            }
            seq += 1;
            let load = vec![v1::VariantLoad {
                variant: "a".into(),
                requests: rps / 10,
                latency_ms_sum: (rps / 10) as f64 * 40.0,
                in_flight: 8,
                ..Default::default()
            }];
            if tx.send(v1::SidecarReport { node_id: "side-a".into(), registration: None, seq, load, training: None, identity: None }).await.is_err() {
                return;
            }
            let _ = acks.message().await;
        }
    });
    stop
}

/// Polls the stored decision of `chat-a` until `done` holds.
async fn decision_until(url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    decision_until_named(url, "chat-a", what, done).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reports_become_committed_pushed_decisions_and_preemption_replaces_on_demand() {
    let node = start_with(|o| o.autoscale_interval = Duration::from_millis(250)).await;
    let url = node.url.clone();
    let dir = tempfile::tempdir().unwrap();

    // An invalid spec is refused, naming the field; nothing is written.
    let bad = write(&dir, "bad.yaml", &AUTOSCALER.replace("capacity_rps: 10", "capacity_rps: 0"));
    let before = revisions(&url).await;
    let o = ctl(&url, &["apply", "-f", &bad], None).await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("capacity_rps"), "{o:?}");
    assert_eq!(revisions(&url).await, before);

    ok(&url, &["apply", "-f", &write(&dir, "as.yaml", AUTOSCALER)]).await;
    // Idle: the floor, all on on-demand or split by risk.
    let idle = decision_until(&url, "the first decision is committed", |d| d["replicas"] == 1).await;
    assert_eq!(idle["spec"]["variant"], "a");

    // 500 rps against 10 rps per replica: the decision hits max_replicas.
    let stop = sidecar(node.running.xds_addr, 500).await;
    let busy = decision_until(&url, "replicas reach max_replicas", |d| d["replicas"] == 20).await;
    let d = &busy["spec"];
    assert_eq!(d["on_demand"].as_u64().unwrap() + d["spot"].as_u64().unwrap(), 20);
    assert!(d["spot"].as_u64().unwrap() > 0, "cheap, reliable spot is used: {d}");
    assert!(d["on_demand"].as_u64().unwrap() >= 10, "a critical variant keeps half on on-demand: {d}");

    // Pushed over ADS to any subscriber.
    let resources = ads_first(node.running.xds_addr, "scheduler-agent", SCALING_DECISION).await;
    let pushed: v1::ScalingDecision = from_any(&resources[0]).unwrap();
    assert_eq!((pushed.name.as_str(), pushed.variant.as_str(), pushed.policy.as_str()), ("chat-a", "a", "hybrid"));
    assert!(pushed.replicas >= 1 && pushed.demand_rps >= 0.0, "{pushed:?}");

    // The status: demand, forecast, ready, decision and why.
    let table = ok(&url, &["autoscale", "status"]).await;
    assert!(table.contains("chat-a") && table.contains("hybrid") && table.contains("20 ("), "{table}");
    let status = json(&url, &["autoscale", "status"]).await;
    let s = &status["items"][0]["status"];
    assert!(s["demand_rps"].as_f64().unwrap() > 300.0, "{s}");
    assert_eq!(s["ready"], 1, "one healthy registered endpoint of variant a");
    assert!(!s["why"].as_str().unwrap().is_empty());

    // A preemption notice: the critical variant's lost spot replicas come back on on-demand.
    let now = decision_until(&url, "the target is steady", |d| d["replicas"] == 20).await;
    let (od, spot) = (now["spec"]["on_demand"].as_u64().unwrap(), now["spec"]["spot"].as_u64().unwrap());
    let out = ok(&url, &["autoscale", "preempt", "--autoscaler", "chat-a", "--replicas", "4", "-o", "json"]).await;
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["replaced"][0]["on_demand_started"], 4, "{out}");
    let after = decision_until(&url, "the replacements are committed", |d| d["on_demand"] == od + 4).await;
    assert_eq!(after["spec"]["spot"], spot - 4);
    // Held on on-demand by the next decisions (the spot pool is being taken away).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let held = json(&url, &["get", "scalingdecisions", "chat-a"]).await;
    assert!(held["spec"]["on_demand"].as_u64().unwrap() >= od + 4, "{held}");

    // Bad notices and hand-written decisions are refused, naming the problem.
    let o = ctl(&url, &["autoscale", "preempt", "--autoscaler", "nope", "--replicas", "1"], None).await;
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("autoscaler") && o.stderr.contains("nope"), "{o:?}");
    let o = ctl(&url, &["autoscale", "preempt", "--node", "gpu-404"], None).await;
    assert!(o.code != 0 && o.stderr.contains("gpu-404"), "{o:?}");
    let hand = write(&dir, "hand.yaml", "kind: ScalingDecision\nname: chat-a\nspec: {replicas: 99}\n");
    let o = ctl(&url, &["apply", "-f", &hand], None).await;
    assert!(o.code != 0, "{o:?}");
    assert!(json(&url, &["get", "scalingdecisions", "chat-a"]).await["spec"]["replicas"] != 99);

    // Deleting the autoscaler retires its decision.
    ok(&url, &["delete", "autoscaler", "chat-a"]).await;
    poll("retirement of the deleted autoscaler's decision", Duration::from_secs(10), async || {
        let o = ctl(&url, &["get", "scalingdecisions", "chat-a"], None).await;
        if o.code != 0 { Ok(()) } else { Err(o.stdout) }
    })
    .await;
    drop(stop);
}

const INVENTORY: [&str; 2] = [
    "kind: Node\nname: od-1\nspec: {cpu_milli: 64000, memory_mib: 512000, gpu_model: A100, gpu_count: 8, gpu_memory_bytes: 85899345920}\n",
    "kind: Node\nname: spot-1\nspec: {cpu_milli: 64000, memory_mib: 512000, gpu_model: A100, gpu_count: 4, gpu_memory_bytes: 85899345920, pool: spot, expected_uptime_hours: 20}\n",
];

/// The same variant, now placing its replicas: half a GPU each, variants of one 16 GiB base.
const PLACING: &str = "\
kind: Autoscaler
name: chat-p
spec:
  variant: a
  capacity_rps: 10
  cold_start_s: 30
  min_replicas: 1
  max_replicas: 12
  spot: { price_per_hour: 1.0, preemptions_per_hour: 0.01 }
  placement: { base_model: llama-8b, base_bytes: 17179869184, delta_bytes: 1073741824,
               working_set_bytes: 4294967296, compute_milli: 500, cpu_milli: 1000, memory_mib: 4096 }
";

/// The autoscaler's placements (`chat-p-*`): names and stored specs.
async fn owned_placements(url: &str) -> Vec<Value> {
    let all = json(url, &["get", "placements"]).await;
    all.as_array().unwrap().iter().filter(|p| p["name"].as_str().unwrap().starts_with("chat-p-")).cloned().collect()
}

/// Polls until `done` holds for the autoscaler's placements.
async fn placements_until(url: &str, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    poll(&format!("placements where {what}"), Duration::from_secs(20), async || {
        let p = owned_placements(url).await;
        if done(&p) { Ok(p) } else { Err(format!("{p:?}")) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_replicas_are_placed_on_the_inventory_per_pool_replaced_and_released() {
    let node = start_with(|o| o.autoscale_interval = Duration::from_millis(250)).await;
    let url = node.url.clone();
    let dir = tempfile::tempdir().unwrap();

    // A placement without a base model is refused, naming the field.
    let bad = write(&dir, "bad.yaml", &PLACING.replace("base_model: llama-8b", "base_model: ''"));
    let o = ctl(&url, &["apply", "-f", &bad], None).await;
    assert!(o.code != 0 && o.stderr.contains("placement.base_model"), "{o:?}");

    // No inventory yet: the decision is made, nothing is placed, and the status says why.
    ok(&url, &["apply", "-f", &write(&dir, "as.yaml", PLACING)]).await;
    decision_until_named(&url, "chat-p", "the floor is decided", |d| d["replicas"] == 1).await;
    poll("status saying why nothing is placed", Duration::from_secs(10), async || {
        let status = json(&url, &["autoscale", "status"]).await;
        let said = status["items"][0]["placement"]["unplaced"].to_string().contains("no GPU inventory");
        if said { Ok(()) } else { Err(status.to_string()) }
    })
    .await;
    for (i, n) in INVENTORY.iter().enumerate() {
        ok(&url, &["apply", "-f", &write(&dir, &format!("node{i}.yaml"), n)]).await;
    }
    placements_until(&url, "the floor's one replica is placed", |p| p.len() == 1).await;

    // 500 rps against 10 rps per replica: 12 replicas decided, 12 placed, each pool on its nodes.
    let stop = sidecar(node.running.xds_addr, 500).await;
    let d = decision_until_named(&url, "chat-p", "replicas reach max_replicas", |d| d["replicas"] == 12).await;
    let (od, spot) = (d["spec"]["on_demand"].as_u64().unwrap(), d["spec"]["spot"].as_u64().unwrap());
    assert!(od >= 6 && spot > 0, "{d}");
    let placed = placements_until(&url, "12 replicas placed", |p| p.len() == 12).await;
    for p in &placed {
        let name = p["name"].as_str().unwrap();
        let node = p["spec"]["allocations"][0]["node"].as_str().unwrap();
        assert_eq!(p["spec"]["owner"], "autoscaler/chat-p");
        assert_eq!(p["spec"]["workload"]["variant"], "a");
        if name.starts_with("chat-p-od-") {
            assert_eq!(node, "od-1", "on-demand replicas stay on on-demand nodes: {p}");
        } else {
            assert_eq!(node, "spot-1", "spot replicas go to the spot node while it fits: {p}");
        }
    }
    let on_od = placed.iter().filter(|p| p["name"].as_str().unwrap().starts_with("chat-p-od-")).count() as u64;
    assert_eq!(on_od, od, "as many on-demand placements as the decision's on-demand replicas");
    assert!(
        placed.iter().any(|p| p["spec"]["allocations"][0]["shared_base"]["base"] == "llama-8b"),
        "two replicas on one GPU map one copy of the base: {placed:?}"
    );
    let table = ok(&url, &["autoscale", "status"]).await;
    assert!(table.contains("PLACED") && table.contains(&format!("{od} od + {spot} spot")), "{table}");

    // A placement released by hand is placed again on a following pass (it is still wanted).
    let before = json(&url, &["get", "placement", "chat-p-od-0"]).await["revision"].clone();
    ok(&url, &["delete", "placement", "chat-p-od-0"]).await;
    placements_until(&url, "the released replica is placed again", |p| {
        p.len() == 12 && p.iter().any(|x| x["name"] == "chat-p-od-0" && x["revision"] != before)
    })
    .await;

    // Someone else's work on the spot node (placed by hand through the scheduler).
    let batch = "workloads:\n  - {kind: replica, name: batch-0, variant: batch, base_model: other, base_bytes: 1073741824, delta_bytes: 0, working_set_bytes: 0, \
                 compute_milli: 100, cpu_milli: 100, memory_mib: 100, class: best_effort}\n";
    ok(&url, &["schedule", "apply", "-f", &write(&dir, "batch.yaml", batch)]).await;
    assert_eq!(json(&url, &["get", "placement", "batch-0"]).await["spec"]["allocations"][0]["node"], "spot-1");

    // A preemption notice for the spot node: its replicas move to on-demand placements (the
    // decision's replacements), and nothing new goes to the doomed node.
    ok(&url, &["autoscale", "preempt", "--node", "spot-1"]).await;
    let moved = placements_until(&url, "the spot node's replicas are on on-demand", |p| {
        p.len() == 12 && p.iter().all(|x| x["spec"]["allocations"][0]["node"] == "od-1")
    })
    .await;
    assert!(moved.iter().all(|x| x["name"].as_str().unwrap().starts_with("chat-p-od-")), "{moved:?}");
    // The autoscaler releases only its own: other work on the doomed node stays until it goes.
    assert_eq!(json(&url, &["get", "placement", "batch-0"]).await["spec"]["allocations"][0]["node"], "spot-1");

    // Deleting the autoscaler releases every replica it placed, and nothing else.
    drop(stop);
    ok(&url, &["delete", "autoscaler", "chat-p"]).await;
    placements_until(&url, "the deleted autoscaler's replicas are released", |p| p.is_empty()).await;
    assert_eq!(json(&url, &["get", "placement", "batch-0"]).await["name"], "batch-0");
    assert_eq!(json(&url, &["get", "nodes"]).await.as_array().unwrap().len(), 2);
}

/// Polls the stored decision of autoscaler `name` until `done` holds.
async fn decision_until_named(url: &str, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    poll(&format!("a decision of {name} where {what}"), Duration::from_secs(20), async || {
        let o = ctl(url, &["get", "scalingdecisions", name, "-o", "json"], None).await;
        if o.code == 0 {
            let v: Value = serde_json::from_str(&o.stdout).unwrap();
            if done(&v["spec"]) {
                return Ok(v);
            }
        }
        Err(format!("{o:?}"))
    })
    .await
}

/// Runs `probe` every 100 ms until it returns `Ok`; fails naming `what` and the last `Err`
/// (what was seen instead) once `limit` has passed.
async fn poll<T>(what: &str, limit: Duration, mut probe: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(seen) => assert!(Instant::now() < deadline, "no {what} within {limit:?}; last seen: {seen}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

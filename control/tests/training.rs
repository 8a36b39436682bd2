//! Training jobs on a real single-node control plane, through weftctl: a job applied with 4
//! workers gets a shard map; `training scale` to 6 then 3 gives maps 2 and 3 that keep the
//! global batch exactly, own every shard once, and move about the ideal share of shards; the
//! map is pushed over ADS as `weft.v1.ShardMap`; a layout that cannot fit is refused naming
//! the field, and nothing changes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use weft_xds::resources::{from_any, v1};
use weft_xds::typeurl::SHARD_MAP;

fn job_yaml() -> String {
    let sizes: Vec<String> = (0..1200).map(|i| (1_000_000 + (i * 7919) % 3_000_000).to_string()).collect();
    format!("kind: TrainingJob\nname: llm\nspec:\n  workers: 4\n  shard_sizes: [{}]\n  global_batch: 1000\n  max_micro_batch: 16\n", sizes.join(", "))
}

async fn map_version(url: &str, want: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = json(url, &["training", "status", "llm"]).await;
        if v["map"]["version"].as_u64() == Some(want) && v["map_current"] == Value::Bool(true) {
            return v;
        }
        assert!(Instant::now() < deadline, "no map version {want} within 15 s: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn check(map: &Value, workers: usize) {
    let ranks = map["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), workers);
    let samples: u64 = ranks.iter().map(|r| r["batch"]["samples"].as_u64().unwrap()).sum();
    assert_eq!(samples, 1000, "global batch exact");
    let mut shards: Vec<&str> = ranks.iter().flat_map(|r| r["shards"].as_array().unwrap()).map(|s| s.as_str().unwrap()).collect();
    let n = shards.len();
    shards.sort_unstable();
    shards.dedup();
    assert_eq!((shards.len(), n), (1200, 1200), "every shard owned by exactly one rank");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_a_job_recomputes_its_shard_map_moving_few_shards() {
    let node = start().await;
    let url = node.url.clone();
    let dir = tempfile::tempdir().unwrap();
    ok(&url, &["apply", "-f", &write(&dir, "job.yaml", &job_yaml())]).await;
    let m1 = map_version(&url, 1).await;
    check(&m1["map"], 4);

    ok(&url, &["training", "scale", "llm", "--workers", "6"]).await;
    let m2 = map_version(&url, 2).await;
    check(&m2["map"], 6);
    let moved = m2["map"]["moved"].as_f64().unwrap();
    assert!((moved - 1.0 / 3.0).abs() < 0.08, "4 → 6 moved {moved}");

    ok(&url, &["training", "scale", "llm", "--workers", "3"]).await;
    let m3 = map_version(&url, 3).await;
    check(&m3["map"], 3);
    let moved = m3["map"]["moved"].as_f64().unwrap();
    assert!((moved - 0.5).abs() < 0.08, "6 → 3 moved {moved}");
    let table = ok(&url, &["training", "status", "llm"]).await;
    assert!(table.contains("llm-2") && table.contains("map version 3"), "{table}");

    // A layout that cannot fit: refused, naming the field; the job keeps its 3 workers.
    let before = revisions(&url).await;
    let bad = write(&dir, "bad.yaml", &job_yaml().replace("max_micro_batch: 16", "max_micro_batch: 16\n  model: {tensor_parallel: 3}"));
    let o = ctl(&url, &["apply", "-f", &bad], None).await;
    assert!(o.code != 0 && o.stderr.contains("tensor_parallel"), "{o:?}");
    let o = ctl(&url, &["training", "scale", "llm", "--workers", "0"], None).await;
    assert!(o.code != 0 && o.stderr.contains("workers"), "{o:?}");
    assert_eq!(revisions(&url).await, before);

    // Pushed over ADS.
    let resources = ads_first(node.running.xds_addr, "trainer-sidecar", SHARD_MAP).await;
    let pushed: v1::ShardMap = from_any(&resources[0]).unwrap();
    assert_eq!((pushed.name.as_str(), pushed.version, pushed.ranks.len()), ("llm", 3, 3));
    assert_eq!(pushed.ranks.iter().map(|r| r.samples).sum::<u64>(), 1000);
}

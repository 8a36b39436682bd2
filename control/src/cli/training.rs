//! `weftctl training status JOB` (ranks, shards per rank, batch share, layout, each rank's
//! trainer as its sidecar reports it, map version, last complete checkpoint) and the line `weftctl training scale JOB --workers N` prints.

use serde_json::Value;

use super::output::{cell, table};

/// The human view of `GET /v1/training/JOB`.
pub fn status_table(body: &Value) -> String {
    let map = &body["map"];
    if map.is_null() {
        return format!("job {}: {} workers, no shard map yet (the leader computes it within a second)\n", cell(&body["job"]), cell(&body["workers"]));
    }
    let rows: Vec<Vec<String>> = map["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let l = &r["layout"];
            let t = &body["trainers"][r["worker"].as_str().unwrap_or_default()];
            let trainer = if t.is_null() {
                "no report".to_string()
            } else if t["trainer_seen"] != Value::Bool(true) {
                "not started".to_string()
            } else {
                let idle = t["trainer_idle_ms"].as_u64().unwrap_or(0) + t["age_ms"].as_u64().unwrap_or(0);
                let state = if t["ready_to_stop"] == Value::Bool(true) {
                    " ready to stop"
                } else if t["draining"] == Value::Bool(true) {
                    " draining"
                } else {
                    ""
                };
                format!("step {} map v{} (seen {:.1}s ago){state}", cell(&t["step"]), cell(&t["map_version"]), idle as f64 / 1000.0)
            };
            vec![
                cell(&r["rank"]),
                cell(&r["worker"]),
                r["shards"].as_array().map_or(0, Vec::len).to_string(),
                format!("{:.1} MiB", r["shard_bytes"].as_f64().unwrap_or(0.0) / 1_048_576.0),
                format!("{} ({}×{})", cell(&r["batch"]["samples"]), cell(&r["batch"]["accumulation_steps"]), cell(&r["batch"]["micro_batches"][0])),
                format!("tp{} pp{} dp{}", cell(&l["tp_index"]), cell(&l["stage"]), cell(&l["dp_index"])),
                format!("{}..{}", cell(&l["layers"][0]), cell(&l["layers"][1])),
                format!("{}..{}", cell(&l["partition"][0]), cell(&l["partition"][1])),
                trainer,
            ]
        })
        .collect();
    let mut out = table(&["RANK", "WORKER", "SHARDS", "DATA", "SAMPLES (STEPS×MICRO)", "PLACE", "LAYERS", "PARTITION", "TRAINER"], &rows);
    out.push_str(&format!(
        "\njob {}: map version {} for {} workers{}, global batch {} (sum of SAMPLES over data-parallel replicas), {:.1}% of shards moved from the previous map\n",
        cell(&body["job"]),
        cell(&map["version"]),
        cell(&map["workers"]),
        if body["map_current"] == Value::Bool(false) { " (a newer job revision is being planned)" } else { "" },
        cell(&map["global_batch"]),
        map["moved"].as_f64().unwrap_or(0.0) * 100.0
    ));
    let resume = &map["resume"];
    if !resume.is_null() {
        out.push_str(&format!("this map started every rank from the checkpoint of step {} (map v{})\n", cell(&resume["step"]), cell(&resume["map_version"])));
    }
    let last = &body["checkpoints"]["last"];
    if last.is_null() {
        out.push_str(&format!("last complete checkpoint: none yet (every rank checkpoints at multiples of step {})\n", cell(&map["checkpoint_every"])));
    } else {
        out.push_str(&format!(
            "last complete checkpoint: step {} (map v{}, {} ranks){}\n",
            cell(&last["step"]),
            cell(&last["map_version"]),
            last["parts"].as_array().map_or(0, Vec::len),
            if last["final"] == Value::Bool(true) { ": final, the job is completed" } else { "" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranks_and_map_summary() {
        let body = json!({"job": "j", "workers": 2, "map_current": true, "map": {"version": 3, "workers": 2, "global_batch": 64, "moved": 0.25,
            "ranks": [{"rank": 0, "worker": "j-0", "shards": ["a", "b"], "shard_bytes": 2097152,
                "batch": {"samples": 32, "accumulation_steps": 2, "micro_batches": [16, 16]},
                "layout": {"tp_index": 0, "stage": 0, "dp_index": 0, "layers": [0, 32], "partition": [0, 100]}}]}});
        let t = status_table(&body);
        assert!(t.contains("j-0") && t.contains("2.0 MiB") && t.contains("32 (2×16)") && t.contains("map version 3") && t.contains("25.0%"), "{t}");
        assert!(t.contains("no report") && t.contains("last complete checkpoint: none yet"), "{t}");
        let mut body = body;
        body["trainers"] = json!({"j-0": {"trainer_seen": true, "trainer_idle_ms": 200, "age_ms": 300, "step": 120, "map_version": 3}});
        body["checkpoints"] = json!({"last": {"step": 100, "map_version": 3, "parts": [{}, {}], "final": false}});
        body["map"]["resume"] = json!({"step": 40, "map_version": 2});
        let t = status_table(&body);
        assert!(t.contains("step 120 map v3 (seen 0.5s ago)"), "{t}");
        assert!(t.contains("last complete checkpoint: step 100 (map v3, 2 ranks)") && t.contains("from the checkpoint of step 40 (map v2)"), "{t}");
    }
}

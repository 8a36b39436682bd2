//! `weftctl training status JOB` (ranks, shards per rank, batch share, layout, map version)
//! and the line `weftctl training scale JOB --workers N` prints.

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
            vec![
                cell(&r["rank"]),
                cell(&r["worker"]),
                r["shards"].as_array().map_or(0, Vec::len).to_string(),
                format!("{:.1} MiB", r["shard_bytes"].as_f64().unwrap_or(0.0) / 1_048_576.0),
                format!("{} ({}×{})", cell(&r["batch"]["samples"]), cell(&r["batch"]["accumulation_steps"]), cell(&r["batch"]["micro_batches"][0])),
                format!("tp{} pp{} dp{}", cell(&l["tp_index"]), cell(&l["stage"]), cell(&l["dp_index"])),
                format!("{}..{}", cell(&l["layers"][0]), cell(&l["layers"][1])),
                format!("{}..{}", cell(&l["partition"][0]), cell(&l["partition"][1])),
            ]
        })
        .collect();
    let mut out = table(&["RANK", "WORKER", "SHARDS", "DATA", "SAMPLES (STEPS×MICRO)", "PLACE", "LAYERS", "PARTITION"], &rows);
    out.push_str(&format!(
        "\njob {}: map version {} for {} workers{}, global batch {} (sum of SAMPLES over data-parallel replicas), {:.1}% of shards moved from the previous map\n",
        cell(&body["job"]),
        cell(&map["version"]),
        cell(&map["workers"]),
        if body["map_current"] == Value::Bool(false) { " (a newer job revision is being planned)" } else { "" },
        cell(&map["global_batch"]),
        map["moved"].as_f64().unwrap_or(0.0) * 100.0
    ));
    out.push_str("checkpoints: none recorded (coordinated checkpoints are not built yet)\n");
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
    }
}

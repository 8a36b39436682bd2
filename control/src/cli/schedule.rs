//! `weftctl schedule plan|apply -f workloads.yaml`: the workloads file is checked here first (a
//! bad file never reaches a server), then sent to `/v1/schedule/plan` or `/v1/schedule/apply`.
//!
//! The file is YAML: the API's request body (`workloads: [...]`, optional `preempt`), a bare
//! list of workloads, or one workload per document. A workload is a mapping with `kind`
//! (`replica`, `gang` or `pod`), `name` and the fields of that kind (see docs/control-api.md).

use serde::Deserialize;
use serde_json::{Value, json};

use super::output::{self, cell};

/// The request body for `text`, or every problem found.
pub fn parse_request(text: &str, preempt: bool) -> Result<Value, String> {
    let mut workloads = Vec::new();
    let mut preempt_in_file = false;
    for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
        let doc = serde_norway::Value::deserialize(de).map_err(|e| format!("document {}: invalid YAML: {e}", i + 1))?;
        let doc: Value = serde_json::to_value(&doc).map_err(|e| format!("document {}: {e}", i + 1))?;
        match doc {
            Value::Null => {}
            Value::Object(mut m) if m.contains_key("workloads") => {
                preempt_in_file |= m.get("preempt").and_then(Value::as_bool).unwrap_or(false);
                match m.remove("workloads") {
                    Some(Value::Array(ws)) => workloads.extend(ws),
                    _ => return Err(format!("document {}: `workloads` must be a list", i + 1)),
                }
                if let Some(k) = m.keys().find(|k| *k != "preempt") {
                    return Err(format!("document {}: unknown field {k:?} (expected workloads, preempt)", i + 1));
                }
            }
            Value::Array(ws) => workloads.extend(ws),
            w @ Value::Object(_) => workloads.push(w),
            other => return Err(format!("document {}: expected a workload or a list of them, found {other}", i + 1)),
        }
    }
    if workloads.is_empty() {
        return Err("no workloads in the file".into());
    }
    let body = json!({ "workloads": workloads, "preempt": preempt || preempt_in_file });
    // The server's own types check every field, so errors show before any request.
    let de = serde_path_to_error::deserialize::<_, crate::api::PlanRequest>(&body);
    de.map(|_| body.clone()).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

/// The human view of a plan: placed workloads, then unplaced ones with their reasons.
pub fn plan_table(plan: &Value) -> String {
    let mut rows = Vec::new();
    for p in plan["placed"].as_array().into_iter().flatten() {
        for a in p["allocations"].as_array().into_iter().flatten() {
            let gpus: Vec<String> = a["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| format!("{}:{}m/{:.1}GiB", cell(&g["gpu"]), cell(&g["milli"]), g["memory_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 30) as f64))
                .collect();
            rows.push(vec![
                cell(&p["workload"]),
                cell(&p["kind"]),
                cell(&a["node"]),
                gpus.join(" "),
                a["shared_base"]["base"].as_str().unwrap_or("-").to_string(),
            ]);
        }
    }
    let mut out = output::table(&["WORKLOAD", "KIND", "NODE", "GPUS (index:milli/own memory)", "SHARED BASE"], &rows);
    let unplaced: Vec<Vec<String>> = plan["unplaced"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| vec![cell(&u["workload"]), cell(&u["message"])])
        .collect();
    if !unplaced.is_empty() {
        out.push('\n');
        out.push_str(&output::table(&["UNPLACED", "REASON"], &unplaced));
    }
    let evicted: Vec<String> = plan["evicted"].as_array().into_iter().flatten().map(cell).collect();
    if !evicted.is_empty() {
        out.push_str(&format!("\nevicts: {}\n", evicted.join(", ")));
    }
    out.push_str(&format!(
        "\n{} placed, {} unplaced{}\n",
        plan["placed"].as_array().map_or(0, Vec::len),
        unplaced.len(),
        if plan["committed"] == true { format!(", committed at revision {}", cell(&plan["revision"])) } else { " (dry run)".into() }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_file_shapes_and_clear_errors() {
        let one = "kind: pod\nname: p\ncpu_milli: 1000\nmemory_mib: 10\nnum_gpu: 1\ngpu_milli: 500\n";
        let body = parse_request(one, false).unwrap();
        assert_eq!(body["workloads"][0]["name"], "p");
        let list = format!("- {}", one.replace('\n', "\n  "));
        assert_eq!(parse_request(&list, true).unwrap()["preempt"], true);
        let wrapped = format!("preempt: true\nworkloads:\n{}", list.lines().map(|l| format!("  {l}\n")).collect::<String>());
        assert_eq!(parse_request(&wrapped, false).unwrap()["preempt"], true);
        let two = format!("{one}---\n{}", one.replace("name: p", "name: q"));
        assert_eq!(parse_request(&two, false).unwrap()["workloads"].as_array().unwrap().len(), 2);

        let bad = one.replace("num_gpu: 1", "num_gpu: lots");
        assert!(parse_request(&bad, false).unwrap_err().contains("workloads[0]"), "names the workload");
        assert!(parse_request("kind: bogus\nname: x\n", false).unwrap_err().contains("bogus"));
        assert!(parse_request("a: [", false).unwrap_err().contains("invalid YAML"));
        assert!(parse_request("", false).unwrap_err().contains("no workloads"));
    }
}

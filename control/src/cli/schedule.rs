//! `weftctl schedule plan|apply -f workloads.yaml`: the workloads file is checked here first (a
//! bad file never reaches a server), then sent to `/v1/schedule/plan` or `/v1/schedule/apply`.
//! `weftctl schedule status`: every placement with the state its node's agent reports for it.
//!
//! The file is YAML: the API's request body (`workloads: [...]`, optional `preempt`), a bare
//! list of workloads, or one workload per document. A workload is a mapping with `kind`
//! (`replica`, `gang` or `pod`), `name` and the fields of that kind (see docs/control-api.md).

use http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::node::{self, now_ms};
use super::output::{self, cell};
use super::{CliError, Client};
use crate::resources::Kind;

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
    // The server's own types and checks, so errors show before any request.
    let req = serde_path_to_error::deserialize::<_, crate::api::PlanRequest>(&body).map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    req.validate().map_err(|(field, message)| format!("{field}: {message}"))?;
    Ok(body)
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
                .map(|g| format!("{}:{}m/{}", cell(&g["gpu"]), cell(&g["milli"]), output::gib(&g["memory_bytes"])))
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

/// Every placement (`GET /v1/placements`) with what the agents report for it
/// (`GET /v1/nodestatuses`): `{"items": [{placement, kind, nodes, variant, base_model, state,
/// reason, endpoint, adopted, reported_by, age_ms, stale}]}`, state `pending` while no agent
/// on its nodes reports it. Only the agents of the placement's own nodes count: a replica
/// another node claims is not where the scheduler put it.
pub fn status_join(placements: &Value, statuses: &Value, now_ms: u64) -> Value {
    let reports: Vec<&Value> = statuses["items"].as_array().into_iter().flatten().map(|it| &it["spec"]).collect();
    let joined: Vec<Value> = placements["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default();
            let w = &p["spec"]["workload"];
            let nodes: Vec<&str> = p["spec"]["allocations"].as_array().into_iter().flatten().filter_map(|a| a["node"].as_str()).collect();
            let found = reports.iter().filter(|r| r["node"].as_str().is_some_and(|n| nodes.contains(&n))).find_map(|r| {
                let replica = r["replicas"].as_array()?.iter().find(|x| x["placement"] == name)?;
                Some((*r, replica))
            });
            let mut item = json!({
                "placement": name, "kind": w["kind"], "nodes": nodes, "variant": w["variant"], "base_model": w["base_model"],
                "state": "pending", "reason": "", "endpoint": "", "reported_by": null, "age_ms": null, "stale": null,
            });
            if let Some((report, replica)) = found {
                for key in ["state", "reason", "endpoint", "adopted"] {
                    item[key] = replica[key].clone();
                }
                item["reported_by"] = report["node"].clone();
                (item["age_ms"], item["stale"]) = node::freshness(report, now_ms);
            }
            item
        })
        .collect();
    json!({ "items": joined })
}

/// The human view of [`status_join`], with a count per state.
pub fn status_table(joined: &Value) -> String {
    let items = joined["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    if items.is_empty() {
        return "no placements (weftctl schedule apply, or an autoscaler with a placement)\n".into();
    }
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| {
            *states.entry(cell(&it["state"])).or_default() += 1;
            let mut state = node::state_cell(it);
            if it["stale"] == true {
                state.push_str(&format!(" ({})", node::reported(it)));
            }
            let nodes: Vec<String> = it["nodes"].as_array().into_iter().flatten().map(cell).collect();
            let text = output::or_dash;
            vec![cell(&it["placement"]), nodes.join(","), text(&it["variant"]), text(&it["base_model"]), state, text(&it["endpoint"]), text(&it["reason"])]
        })
        .collect();
    let mut out = output::table(&["PLACEMENT", "NODE", "VARIANT", "BASE MODEL", "STATE", "ENDPOINT", "REASON"], &rows);
    let counts: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    out.push_str(&format!("\n{} placements: {}\n", items.len(), counts.join(", ")));
    out
}

/// `schedule status`: the placements and the agents' reports, joined.
pub async fn gather_status(c: &mut Client) -> Result<Value, CliError> {
    let placements = super::call(c, Method::GET, &format!("/v1/{}", Kind::Placements), None).await?;
    let statuses = super::call(c, Method::GET, &format!("/v1/{}", Kind::NodeStatuses), None).await?;
    Ok(status_join(&placements, &statuses, now_ms()))
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
        let no_cluster = "kind: replica\nname: r\nvariant: a\nbase_model: m\nbase_bytes: 1\ndelta_bytes: 0\nworking_set_bytes: 0\n\
            compute_milli: 100\ncpu_milli: 0\nmemory_mib: 0\nlaunch: {cluster: '', base_path: /m.safetensors}\n";
        let e = parse_request(no_cluster, false).unwrap_err();
        assert!(e.starts_with("workloads[0].launch.cluster: "), "the launch is checked before any request: {e}");
    }

    #[test]
    fn status_joins_each_placement_with_its_nodes_report_pending_and_stale() {
        let (_, mut statuses) = node::tests::lists();
        // gpu-3's stale report also claims chat-a-od-0, which is not placed there: ignored.
        statuses["items"][1]["spec"]["replicas"] = json!([{"placement": "chat-a-od-0", "state": "failed", "reason": "x"},
            {"placement": "old-0", "state": "ready", "endpoint": "10.0.0.3:1"}]);
        let placement = |name: &str, node: &str, variant: &str| {
            json!({"kind": "placements", "name": name, "revision": 1, "spec": {
                "workload": {"kind": "replica", "name": name, "variant": variant, "base_model": "llama-8b"},
                "allocations": [{"node": node}]}})
        };
        let placements = json!({"items": [
            placement("chat-a-od-0", "gpu-1", "a"), placement("chat-b-od-0", "gpu-1", "b"),
            placement("chat-c-od-0", "gpu-2", "c"), placement("old-0", "gpu-3", "a"),
            {"kind": "placements", "name": "train", "revision": 1, "spec": {"workload": {"kind": "gang", "name": "train"},
             "allocations": [{"node": "gpu-2"}, {"node": "gpu-3"}]}}
        ]});
        let joined = status_join(&placements, &statuses, node::tests::NOW);
        assert_eq!(joined["items"][0]["reported_by"], "gpu-1");
        let t = status_table(&joined);
        let rows: Vec<Vec<&str>> = t.lines().map(|l| l.split("   ").map(str::trim).filter(|c| !c.is_empty()).collect()).collect();
        assert_eq!(rows[0], ["PLACEMENT", "NODE", "VARIANT", "BASE MODEL", "STATE", "ENDPOINT", "REASON"]);
        assert_eq!(rows[1], ["chat-a-od-0", "gpu-1", "a", "llama-8b", "ready (adopted)", "10.0.0.1:15011", "-"], "{t}");
        assert_eq!(rows[2], ["chat-b-od-0", "gpu-1", "b", "llama-8b", "backoff", "-", "base_path /x.safetensors: No such file"], "{t}");
        assert_eq!(rows[3], ["chat-c-od-0", "gpu-2", "c", "llama-8b", "pending", "-", "-"], "no agent reports it: {t}");
        assert_eq!(rows[4], ["old-0", "gpu-3", "a", "llama-8b", "ready (stale 2m0s)", "10.0.0.3:1", "-"], "{t}");
        assert_eq!(rows[5], ["train", "gpu-2,gpu-3", "-", "-", "pending", "-", "-"], "{t}");
        assert!(t.ends_with("\n5 placements: 1 backoff, 2 pending, 2 ready\n"), "{t}");
        assert!(status_table(&json!({"items": []})).starts_with("no placements"));
    }
}

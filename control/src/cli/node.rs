//! `weftctl node list` and `weftctl node describe NAME`: each GPU node as the scheduler knows
//! it (its `nodes` inventory entry) beside what its agent last reported (its `nodestatuses`
//! entry): the GPUs found, the replicas run for placements and their state, the weight
//! holders. Gathering is IO ([`gather_list`], [`gather_one`]); the joins and the text are pure,
//! rendered from JSON alone, so `-o json` prints exactly what the tables show.
//!
//! A node in the inventory whose agent never reported shows `no agent`; a report older than
//! `nodes::STALE_AFTER_MS` shows `stale` with its age, since what it says may no longer hold.

use std::collections::BTreeMap;

use http::Method;
use serde_json::{Value, json};

use super::output::{cell, gib, indent, or_dash, short_duration, summary, table};
use super::{CliError, Client};
use crate::nodes;
use crate::resources::Kind;

/// Now, in Unix milliseconds (what reports are stamped with).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The items of a `GET /v1/{kind}` answer.
fn items(list: &Value) -> &[Value] {
    list["items"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A report's `(age_ms, stale)` at `now_ms`, both `null` without one.
pub fn freshness(status: &Value, now_ms: u64) -> (Value, Value) {
    let reported = status["reported_at_ms"].as_u64();
    (json!(reported.map(|at| now_ms.saturating_sub(at))), json!(reported.map(|at| nodes::is_stale(at, now_ms))))
}

/// One node: `{node, inventory, status, age_ms, stale}`, the inventory and status specs as
/// stored (`null` when absent), with the report's [`freshness`].
pub fn entry(node: &str, inventory: &Value, status: &Value, now_ms: u64) -> Value {
    let (age_ms, stale) = freshness(status, now_ms);
    json!({ "node": node, "inventory": inventory, "status": status, "age_ms": age_ms, "stale": stale })
}

/// `GET /v1/nodes` and `GET /v1/nodestatuses` joined by node name, in name order:
/// `{"items": [entry...]}` with every node either knows of.
pub fn join(inventory: &Value, statuses: &Value, now_ms: u64) -> Value {
    static NONE: Value = Value::Null;
    let mut by_node: BTreeMap<&str, (&Value, &Value)> = BTreeMap::new();
    for it in items(inventory) {
        by_node.entry(it["name"].as_str().unwrap_or_default()).or_insert((&NONE, &NONE)).0 = &it["spec"];
    }
    for it in items(statuses) {
        by_node.entry(it["name"].as_str().unwrap_or_default()).or_insert((&NONE, &NONE)).1 = &it["spec"];
    }
    let all: Vec<Value> = by_node.into_iter().map(|(node, (inv, st))| entry(node, inv, st, now_ms)).collect();
    json!({ "items": all })
}

/// The age of an entry's report (`3s`, `2m0s`), if it has one.
fn age(e: &Value) -> Option<String> {
    e["age_ms"].as_u64().map(|ms| short_duration(ms / 1000))
}

/// How recent an entry's report is: `3s ago`, `stale 2m0s`, or `no agent`.
pub fn reported(e: &Value) -> String {
    match (age(e), e["stale"] == true) {
        (Some(age), true) => format!("stale {age}"),
        (Some(age), false) => format!("{age} ago"),
        (None, _) => "no agent".into(),
    }
}

/// The GPUs of a node: what its agent found (`2×H100`), saying so when the inventory
/// declares another count; the inventory's alone without a report.
fn gpus_cell(inventory: &Value, status: &Value) -> String {
    let declared = inventory["gpu_count"].as_u64();
    let Some(found) = status["gpus"].as_array() else {
        return match declared {
            Some(n) => format!("{n}×{}", cell(&inventory["gpu_model"])),
            None => "-".into(),
        };
    };
    let model = found.first().and_then(|g| g["name"].as_str()).filter(|n| !n.is_empty());
    let mut s = match model {
        Some(m) => format!("{}×{m}", found.len()),
        None => found.len().to_string(),
    };
    if let Some(n) = declared.filter(|n| *n != found.len() as u64) {
        s.push_str(&format!(" (inventory: {n})"));
    }
    s
}

/// `ready/total` replicas of a report (`-` without one).
fn replicas_cell(status: &Value) -> String {
    match status["replicas"].as_array() {
        Some(rs) => format!("{}/{}", rs.iter().filter(|r| r["state"] == nodes::ReplicaState::Ready.as_str()).count(), rs.len()),
        None => "-".into(),
    }
}

fn count_cell(v: &Value) -> String {
    v.as_array().map_or_else(|| "-".into(), |a| a.len().to_string())
}

/// The human view of [`join`]: a row per node, then what an operator should look into.
pub fn list_table(joined: &Value) -> String {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for e in items(joined) {
        let (node, inv, st) = (cell(&e["node"]), &e["inventory"], &e["status"]);
        rows.push(vec![
            node.clone(),
            cell(&st["inventory_source"]),
            gpus_cell(inv, st),
            replicas_cell(st),
            count_cell(&st["holders"]),
            reported(e),
        ]);
        if inv.is_null() {
            notes.push(format!("{node}: reports, but is not in the inventory (nodes): nothing is placed on it"));
        }
        if let Some(n) = st["warnings"].as_array().map(Vec::len).filter(|n| *n > 0) {
            notes.push(format!("{node}: {n} agent warning(s) (weftctl node describe {node})"));
        }
    }
    if rows.is_empty() {
        return "no nodes: none in the inventory (apply `kind: Node` documents) and no agent has reported\n".into();
    }
    let mut out = table(&["NODE", "SOURCE", "GPUS", "REPLICAS", "HOLDERS", "REPORTED"], &rows);
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    out
}

/// A pid cell: `-` for none (0).
fn pid(v: &Value) -> String {
    match v.as_u64() {
        None | Some(0) => "-".into(),
        Some(p) => p.to_string(),
    }
}

/// A replica's state as shown: `ready`, `ready (adopted)`.
pub fn state_cell(replica: &Value) -> String {
    let state = cell(&replica["state"]);
    if replica["adopted"] == true { format!("{state} (adopted)") } else { state }
}

fn section(title: &str, body: String) -> String {
    format!("\n{title}:\n{}", indent(&body))
}

/// The text `node describe` prints for one [`entry`].
pub fn describe_text(e: &Value) -> String {
    let (node, inv, st) = (cell(&e["node"]), &e["inventory"], &e["status"]);
    let inventory = if inv.is_null() {
        "not in the inventory (nodes): nothing is placed on it".to_string()
    } else {
        summary(Kind::Nodes, inv)
    };
    let mut s = format!("Node:       {node}\nInventory:  {inventory}\n");
    if st.is_null() {
        s += &format!("Agent:      no agent has reported (nodestatuses/{node})\n");
        return s;
    }
    let version = st["agent_version"].as_str().filter(|v| !v.is_empty()).map(|v| format!("{v}, ")).unwrap_or_default();
    let stale = if e["stale"] == true {
        format!(": stale (older than {}s: the agent is down or cannot reach the control plane)", nodes::STALE_AFTER_MS / 1000)
    } else {
        String::new()
    };
    let age = age(e).unwrap_or_else(|| "?".into());
    s += &format!("Agent:      {version}GPUs from {}, reported {age} ago{stale}\n", cell(&st["inventory_source"]));
    let list = |key: &str| st[key].as_array().cloned().unwrap_or_default();
    let gpus: Vec<Vec<String>> =
        list("gpus").iter().map(|g| vec![cell(&g["index"]), or_dash(&g["name"]), gib(&g["memory_bytes"]), gib(&g["used_bytes"])]).collect();
    s += &section("GPUs", table(&["INDEX", "NAME", "MEMORY", "USED"], &gpus));
    let replicas: Vec<Vec<String>> = list("replicas")
        .iter()
        .map(|r| {
            vec![cell(&r["placement"]), cell(&r["variant"]), state_cell(r), pid(&r["pid"]), or_dash(&r["endpoint"]), cell(&r["restarts"]), or_dash(&r["reason"])]
        })
        .collect();
    s += &section("Replicas", table(&["PLACEMENT", "VARIANT", "STATE", "PID", "ENDPOINT", "RESTARTS", "REASON"], &replicas));
    let holders: Vec<Vec<String>> = list("holders")
        .iter()
        .map(|h| vec![cell(&h["base_model"]), cell(&h["gpu"]), pid(&h["pid"]), cell(&h["users"]), gib(&h["bytes"]), cell(&h["mechanism"])])
        .collect();
    s += &section("Holders", table(&["BASE MODEL", "GPU", "PID", "USERS", "SIZE", "MECHANISM"], &holders));
    let warnings = list("warnings");
    if !warnings.is_empty() {
        s += &section("Warnings", warnings.iter().map(|w| format!("- {}\n", cell(w))).collect());
    }
    s
}

/// `node list`: both lists, joined.
pub async fn gather_list(c: &mut Client) -> Result<Value, CliError> {
    let inventory = super::call(c, Method::GET, &format!("/v1/{}", Kind::Nodes), None).await?;
    let statuses = super::call(c, Method::GET, &format!("/v1/{}", Kind::NodeStatuses), None).await?;
    Ok(join(&inventory, &statuses, now_ms()))
}

/// `node describe NAME`: its inventory entry and its report, either of which may be missing
/// (not both).
pub async fn gather_one(c: &mut Client, name: &str) -> Result<Value, CliError> {
    let inventory = super::get_optional(c, &format!("/v1/{}/{name}", Kind::Nodes)).await?;
    let status = super::get_optional(c, &format!("/v1/{}/{name}", Kind::NodeStatuses)).await?;
    if inventory.is_null() && status.is_null() {
        return Err(CliError::Request(format!(
            "node {name:?} is neither in the inventory (nodes/{name}) nor reported by an agent (nodestatuses/{name})"
        )));
    }
    Ok(entry(name, &inventory["spec"], &status["spec"], now_ms()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const NOW: u64 = 10_000_000;

    /// Three nodes: `gpu-1` reported 3 s ago, `gpu-2` in the inventory without an agent,
    /// `gpu-3` reported 2 minutes ago and not in the inventory.
    pub(crate) fn lists() -> (Value, Value) {
        let inventory = json!({"revision": 5, "items": [
            {"kind": "nodes", "name": "gpu-1", "revision": 2, "spec": {"gpu_count": 2, "gpu_model": "H100", "cpu_milli": 64000, "memory_mib": 512000, "pool": "on_demand"}},
            {"kind": "nodes", "name": "gpu-2", "revision": 3, "spec": {"gpu_count": 8, "gpu_model": "A100", "cpu_milli": 1, "memory_mib": 1, "pool": "spot"}}
        ]});
        let statuses = json!({"revision": 9, "items": [
            {"kind": "nodestatuses", "name": "gpu-1", "revision": 8, "spec": {
                "node": "gpu-1", "agent_version": "0.1.0", "reported_at_ms": NOW - 3_000, "inventory_source": "nvml",
                "gpus": [{"index": 0, "name": "H100", "memory_bytes": 85_899_345_920_u64, "used_bytes": 21_474_836_480_u64},
                         {"index": 1, "name": "H100", "memory_bytes": 85_899_345_920_u64, "used_bytes": 0}],
                "replicas": [
                    {"placement": "chat-a-od-0", "variant": "a", "base_model": "llama-8b", "state": "ready", "pid": 4242,
                     "sidecar_pid": 4243, "endpoint": "10.0.0.1:15011", "restarts": 0, "since_ms": 0, "gpu": 0, "adopted": true},
                    {"placement": "chat-b-od-0", "variant": "b", "base_model": "llama-8b", "state": "backoff",
                     "reason": "base_path /x.safetensors: No such file", "pid": 0, "sidecar_pid": 0, "endpoint": "", "restarts": 3,
                     "since_ms": 0, "gpu": null, "adopted": false}],
                "holders": [{"base_model": "llama-8b", "gpu": 0, "pid": 4200, "users": 1, "bytes": 17_179_869_184_u64, "mechanism": "cuda-ipc"}],
                "warnings": ["control plane unreachable for 12s"]}},
            {"kind": "nodestatuses", "name": "gpu-3", "revision": 9, "spec": {
                "node": "gpu-3", "agent_version": "", "reported_at_ms": NOW - 120_000, "inventory_source": "declared",
                "gpus": [{"index": 0, "name": "", "memory_bytes": 1, "used_bytes": 0}], "replicas": [], "holders": [], "warnings": []}}
        ]});
        (inventory, statuses)
    }

    fn rows(t: &str) -> Vec<Vec<String>> {
        t.lines().map(|l| l.split("   ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect()).collect()
    }

    #[test]
    fn list_shows_every_node_with_its_agents_report_no_agent_and_stale() {
        let (inv, st) = lists();
        let t = list_table(&join(&inv, &st, NOW));
        let r = rows(&t);
        assert_eq!(r[0], ["NODE", "SOURCE", "GPUS", "REPLICAS", "HOLDERS", "REPORTED"]);
        assert_eq!(r[1], ["gpu-1", "nvml", "2×H100", "1/2", "1", "3s ago"], "{t}");
        assert_eq!(r[2], ["gpu-2", "-", "8×A100", "-", "-", "no agent"], "{t}");
        assert_eq!(r[3], ["gpu-3", "declared", "1", "0/0", "0", "stale 2m0s"], "{t}");
        assert!(t.contains("gpu-3: reports, but is not in the inventory"), "{t}");
        assert!(t.contains("gpu-1: 1 agent warning(s)"), "{t}");
        let empty = json!({"items": []});
        assert!(list_table(&join(&empty, &empty, NOW)).starts_with("no nodes"));
    }

    #[test]
    fn the_gpus_found_are_compared_with_the_inventory() {
        let inv = json!({"gpu_count": 8, "gpu_model": "A100"});
        let st = json!({"gpus": [{"index": 0, "name": "A100"}]});
        assert_eq!(gpus_cell(&inv, &st), "1×A100 (inventory: 8)");
        assert_eq!(gpus_cell(&Value::Null, &Value::Null), "-");
    }

    #[test]
    fn describe_shows_inventory_gpus_replicas_holders_and_warnings() {
        let (inv, st) = lists();
        let joined = join(&inv, &st, NOW);
        let t = describe_text(&joined["items"][0]);
        assert!(t.starts_with("Node:       gpu-1\nInventory:  gpus=2×H100 cpu=64000m mem=512000Mi pool=on_demand\n"), "{t}");
        assert!(t.contains("Agent:      0.1.0, GPUs from nvml, reported 3s ago\n"), "{t}");
        let r = rows(&t);
        let find = |first: &str| r.iter().find(|row| row.first().map(String::as_str) == Some(first)).cloned().unwrap_or_default();
        assert_eq!(find("0"), ["0", "H100", "80.0GiB", "20.0GiB"], "{t}");
        assert_eq!(find("PLACEMENT"), ["PLACEMENT", "VARIANT", "STATE", "PID", "ENDPOINT", "RESTARTS", "REASON"]);
        assert_eq!(find("chat-a-od-0"), ["chat-a-od-0", "a", "ready (adopted)", "4242", "10.0.0.1:15011", "0", "-"], "{t}");
        assert_eq!(find("chat-b-od-0"), ["chat-b-od-0", "b", "backoff", "-", "-", "3", "base_path /x.safetensors: No such file"], "{t}");
        assert_eq!(find("llama-8b"), ["llama-8b", "0", "4200", "1", "16.0GiB", "cuda-ipc"], "{t}");
        assert!(t.ends_with("\nWarnings:\n  - control plane unreachable for 12s\n"), "{t}");

        let no_agent = describe_text(&joined["items"][1]);
        assert!(no_agent.ends_with("Agent:      no agent has reported (nodestatuses/gpu-2)\n") && !no_agent.contains("GPUs:"), "{no_agent}");
        let stale = describe_text(&joined["items"][2]);
        assert!(stale.contains("Inventory:  not in the inventory") && stale.contains("reported 2m0s ago: stale (older than 30s"), "{stale}");
        assert!(stale.contains("the agent is down or cannot reach the control plane") && !stale.contains("Warnings"), "{stale}");
    }
}

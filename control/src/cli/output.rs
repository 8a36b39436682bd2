//! How `weftctl` prints: aligned tables for people, JSON or YAML for scripts. Everything here
//! turns server JSON into a `String` (pure), so the layouts are unit-tested without a server.


use serde_json::Value;

use crate::resources::Kind;

/// `-o`: the output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// `value` as pretty JSON or YAML (each ending in a newline); `None` for `Table`, whose layout
/// depends on the command.
pub fn structured(format: Format, value: &Value) -> Option<String> {
    match format {
        Format::Table => None,
        Format::Json => Some(serde_json::to_string_pretty(value).unwrap_or_default() + "\n"),
        Format::Yaml => Some(to_yaml(value)),
    }
}

/// `value` as YAML. Serializing a `serde_json::Value` cannot fail (its map keys are strings).
pub fn to_yaml(value: &Value) -> String {
    serde_norway::to_string(value).unwrap_or_default()
}

/// Left-aligned columns separated by three spaces, headers as given. Cells are padded by
/// character count, so non-ASCII names stay aligned in a monospace terminal.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, cell) in cells.enumerate().take(widths.len()) {
            if i > 0 {
                l.push_str("   ");
            }
            l.push_str(cell);
            if i + 1 < widths.len() {
                l.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count()));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `kind/name` as `weftctl` prints it: the singular, lower-case YAML kind (`service/chat`).
pub fn object(kind: Kind, name: &str) -> String {
    format!("{}/{name}", kind.yaml_kind().to_ascii_lowercase())
}

/// A byte count as GiB with one decimal (`16.0GiB`); `-` when it is not a number.
pub fn gib(bytes: &Value) -> String {
    bytes.as_f64().map_or_else(|| "-".into(), |b| format!("{:.1}GiB", b / (1u64 << 30) as f64))
}

/// Every line of `text` indented by two spaces (a section's body).
pub fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// A string as a table cell, `-` when empty or absent.
pub fn or_dash(v: &Value) -> String {
    match v.as_str() {
        Some("") | None => "-".into(),
        Some(s) => s.to_string(),
    }
}

/// A scalar as a table cell: strings bare, null as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Each variant's weight with its share, `150 (93.8%)`, in order. Weights are relative
/// shares (90/10 and 9/1 split alike), so the share is what tells a reader the split; `-`
/// when all are 0 (which the API refuses).
pub fn weight_shares(variants: &Value) -> Vec<String> {
    let items = variants.as_array().map(Vec::as_slice).unwrap_or_default();
    let total: u64 = items.iter().filter_map(|v| v["weight"].as_u64()).sum();
    items
        .iter()
        .map(|v| {
            let share = v["weight"].as_u64().filter(|_| total > 0).map(|w| w as f64 * 100.0 / total as f64);
            let share = share.map_or_else(|| "-".into(), |p| format!("{}%", round_share(p)));
            format!("{} ({share})", cell(&v["weight"]))
        })
        .collect()
}

/// `a=150 (93.8%) b=10 (6.3%)`: each variant (items with `name` and `weight`) and its share.
pub fn variant_weights(variants: &Value) -> String {
    let names = variants.as_array().map(Vec::as_slice).unwrap_or_default().iter().map(|v| cell(&v["name"]));
    let all: Vec<String> = names.zip(weight_shares(variants)).map(|(n, w)| format!("{n}={w}")).collect();
    all.join(" ")
}

/// A percentage with as few decimals as it needs (50, 93.8, 0.1).
fn round_share(p: f64) -> String {
    let r = (p * 10.0).round() / 10.0;
    if r.fract() == 0.0 { format!("{r:.0}") } else { format!("{r:.1}") }
}

/// Longest summary cell, so a table row stays on one line.
const SUMMARY_MAX: usize = 72;

fn shorten(s: String) -> String {
    if s.chars().count() <= SUMMARY_MAX {
        return s;
    }
    let mut t: String = s.chars().take(SUMMARY_MAX - 1).collect();
    t.push('…');
    t
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().map(cell).collect()).unwrap_or_default()
}

/// A one-line description of a spec: what a person scans a list for.
pub fn summary(kind: Kind, spec: &Value) -> String {
    let s = match kind {
        Kind::Services => {
            let routes: Vec<String> = spec["routes"]
                .as_array()
                .map(|rs| {
                    rs.iter()
                        .map(|r| {
                            let to = match (&r["cluster"], &r["experiment"]) {
                                (Value::String(c), _) => c.clone(),
                                (_, Value::String(e)) => format!("experiment/{e}"),
                                _ => "?".into(),
                            };
                            format!("{}→{to}", cell(&r["name"]))
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!("hosts={} routes={}", strings(&spec["hosts"]).join(","), routes.join(","))
        }
        Kind::Revocations => format!("{} issued before {}", cell(&spec["identity"]), cell(&spec["issued_before"])),
        Kind::AuthorizationPolicies => format!(
            "{} services={} namespace={} rules={}",
            spec["action"].as_str().unwrap_or("allow"),
            match strings(&spec["services"]).join(",") {
                s if s.is_empty() => "*".to_string(),
                s => s,
            },
            match cell(&spec["namespace"]) {
                n if n.is_empty() => "*".to_string(),
                n => n,
            },
            spec["rules"].as_array().map_or(0, Vec::len)
        ),
        Kind::Nodes => format!(
            "gpus={}×{} cpu={}m mem={}Mi pool={}",
            cell(&spec["gpu_count"]),
            cell(&spec["gpu_model"]),
            cell(&spec["cpu_milli"]),
            cell(&spec["memory_mib"]),
            cell(&spec["pool"])
        ),
        Kind::Autoscalers => format!(
            "variant={} policy={} capacity={}rps replicas={}..{} cold_start={}s",
            cell(&spec["variant"]),
            cell(&spec["policy"]),
            cell(&spec["capacity_rps"]),
            cell(&spec["min_replicas"]),
            cell(&spec["max_replicas"]),
            cell(&spec["cold_start_s"])
        ),
        Kind::ScalingDecisions => format!(
            "variant={} replicas={} (on_demand={} spot={}) reason={}",
            cell(&spec["variant"]),
            cell(&spec["replicas"]),
            cell(&spec["on_demand"]),
            cell(&spec["spot"]),
            cell(&spec["reason"])
        ),
        Kind::Rollouts => format!(
            "{} → {} steps={} min_per_step={}",
            cell(&spec["baseline"]),
            cell(&spec["candidate"]),
            spec["steps"].as_array().map(|a| a.iter().map(cell).collect::<Vec<_>>().join(",")).unwrap_or_default(),
            cell(&spec["min_per_step"])
        ),
        Kind::RolloutStates => format!("{} at {}%: {}", cell(&spec["phase"]), cell(&spec["weight"]), cell(&spec["reason"])),
        Kind::TrainingJobs => format!(
            "workers={} shards={} global_batch={}",
            cell(&spec["workers"]),
            spec["shard_sizes"].as_array().map_or(0, Vec::len),
            cell(&spec["global_batch"])
        ),
        Kind::ShardMaps => format!("version={} workers={} moved={}", cell(&spec["version"]), cell(&spec["workers"]), cell(&spec["moved"])),
        Kind::Checkpoints => format!(
            "last step={} map={} ranks={}{}",
            cell(&spec["last"]["step"]),
            cell(&spec["last"]["map_version"]),
            spec["last"]["parts"].as_array().map_or(0, Vec::len),
            if spec["last"]["final"] == serde_json::Value::Bool(true) { " (final)" } else { "" }
        ),
        Kind::NodeStatuses => {
            let replicas = spec["replicas"].as_array().map(Vec::as_slice).unwrap_or_default();
            let ready = replicas.iter().filter(|r| r["state"] == crate::nodes::ReplicaState::Ready.as_str()).count();
            format!(
                "source={} gpus={} replicas={ready}/{} ready holders={} reported_at_ms={}",
                cell(&spec["inventory_source"]),
                spec["gpus"].as_array().map_or(0, Vec::len),
                replicas.len(),
                spec["holders"].as_array().map_or(0, Vec::len),
                cell(&spec["reported_at_ms"])
            )
        }
        Kind::Placements => {
            let nodes: Vec<String> = spec["allocations"]
                .as_array()
                .map(|a| a.iter().map(|x| cell(&x["node"])).collect())
                .unwrap_or_default();
            let mut s = format!("{} on {}", cell(&spec["workload"]["kind"]), nodes.join(","));
            if let Value::String(o) = &spec["owner"] {
                s.push_str(&format!(" by {o}"));
            }
            s
        }
        Kind::Experiments => {
            let mut s = variant_weights(&spec["variants"]);
            if let Value::String(c) = &spec["shadow"]["cluster"] {
                s.push_str(&format!(" shadow→{c}"));
            }
            s
        }
        Kind::Clusters => {
            let mut parts = Vec::new();
            for key in ["lb", "protocol"] {
                if let Value::String(v) = &spec[key] {
                    parts.push(format!("{key}={v}"));
                }
            }
            parts.push(format!("endpoints={}", strings(&spec["endpoints"]).join(",")));
            parts.join(" ")
        }
        Kind::Endpoints => {
            let eps: Vec<String> = spec["endpoints"]
                .as_array()
                .map(|es| {
                    es.iter()
                        .map(|e| match &e["variant"] {
                            Value::String(v) if !v.is_empty() => format!("{}({v})", cell(&e["address"])),
                            _ => cell(&e["address"]),
                        })
                        .collect()
                })
                .unwrap_or_default();
            format!("endpoints={}", eps.join(","))
        }
    };
    shorten(s)
}

/// `GET /v1/{kind}` items (or one item) as KIND NAME REVISION SUMMARY.
pub fn items_table(kind: Kind, items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| {
            vec![
                kind.yaml_kind().to_ascii_lowercase(),
                cell(&it["name"]),
                cell(&it["revision"]),
                summary(kind, &it["spec"]),
            ]
        })
        .collect();
    table(&["KIND", "NAME", "REVISION", "SUMMARY"], &rows)
}

/// `weftctl get` without a kind: every kind, how many resources it holds, and who writes it.
pub fn kinds_table(counts: &Value) -> String {
    let rows: Vec<Vec<String>> = Kind::ALL
        .iter()
        .map(|k| {
            let by = if k.user_writable() { "weftctl apply" } else { "the control plane" };
            vec![k.as_str().to_string(), cell(&counts[k.as_str()]), by.to_string()]
        })
        .collect();
    table(&["KIND", "COUNT", "WRITTEN BY"], &rows)
}

/// History items (oldest first) as REVISION SUMMARY; a `null` spec is a deletion.
pub fn history_table(kind: Kind, items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| {
            let what = if it["spec"].is_null() { "deleted".to_string() } else { summary(kind, &it["spec"]) };
            vec![cell(&it["revision"]), what]
        })
        .collect();
    table(&["REVISION", "SUMMARY"], &rows)
}

/// The members view as ID ADDR XDS_ADDR ROLE.
pub fn members_table(view: &Value) -> String {
    let leader = view["leader"].as_u64();
    let rows: Vec<Vec<String>> = view["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    let mut role = if m["voter"] == Value::Bool(true) { "voter" } else { "learner" }.to_string();
                    if m["id"].as_u64().is_some_and(|id| Some(id) == leader) {
                        role.push_str(" (leader)");
                    }
                    let xds = match &m["xds_addr"] {
                        Value::String(s) if !s.is_empty() => s.clone(),
                        _ => "-".into(),
                    };
                    vec![cell(&m["id"]), cell(&m["addr"]), xds, role]
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = table(&["ID", "ADDR", "XDS_ADDR", "ROLE"], &rows);
    out.push_str(&format!("term {}, leader {}\n", cell(&view["term"]), cell(&view["leader"])));
    out
}

/// The short name of an xDS type URL: its last segment, lower-case, plural
/// (`type.googleapis.com/weft.v1.Cluster` → `clusters`).
pub fn short_type(type_url: &str) -> String {
    let last = type_url.rsplit(['/', '.']).next().unwrap_or(type_url).to_ascii_lowercase();
    match last.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None if last.ends_with('s') => last,
        None => last + "s",
    }
}

/// The sidecar config types, in apply order: a column each, even before any sidecar ACKed one.
const PROXY_TYPES: [&str; 5] = ["clusters", "endpoints", "experiments", "services", "authorizationpolicies"];

/// `GET /v1/proxies` as NODE CONTROL CONNECTED, the last ACKed version (a control-plane
/// revision) per sidecar config type, how many other types it ACKed (an Envoy's LDS/CDS/RDS/EDS,
/// a training sidecar's shard maps: the JSON output names them), LAST NACK. The columns are
/// fixed: what a client subscribes to never adds one.
pub fn proxies_table(view: &Value) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let items = view["items"].as_array().cloned().unwrap_or_default();
    let mut headers: Vec<String> = vec!["NODE".into(), "CONTROL".into(), "CONNECTED".into()];
    // `AUTHZ@REV` for authorization policies: a column name that fits.
    headers.extend(PROXY_TYPES.iter().map(|t| format!("{}@REV", if *t == "authorizationpolicies" { "AUTHZ" } else { t }.to_ascii_uppercase())));
    headers.push("OTHER".into());
    headers.push("CERT EXPIRES".into());
    headers.push("LAST NACK".into());
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| {
            let connected = match (&it["connected"], it["disconnected_s"].as_u64()) {
                (Value::Bool(true), _) => "yes".to_string(),
                (_, Some(s)) => format!("no ({} ago)", short_duration(s)),
                _ => "no".to_string(),
            };
            let mut row = vec![cell(&it["node_id"]), cell(&it["control_node"]), connected];
            let acked = it["acked"].as_object().cloned().unwrap_or_default();
            let is_config = |url: &str| url.starts_with("type.googleapis.com/weft.v1.") && PROXY_TYPES.contains(&short_type(url).as_str());
            for t in PROXY_TYPES {
                let v = acked.iter().find(|(url, _)| is_config(url) && short_type(url) == t).map(|(_, v)| cell(v));
                row.push(v.unwrap_or_else(|| "-".into()));
            }
            // Revocations are config too, without a column of their own.
            let other = acked.keys().filter(|url| !is_config(url) && !url.ends_with("weft.v1.Revocation")).count();
            row.push(if other == 0 { "-".into() } else { other.to_string() });
            row.push(cert_expiry(&it["identity"], now));
            row.push(match &it["nack"] {
                Value::Object(n) => format!(
                    "{} {}: {}",
                    short_type(n.get("type_url").and_then(Value::as_str).unwrap_or("?")),
                    cell(n.get("version").unwrap_or(&Value::Null)),
                    cell(n.get("error").unwrap_or(&Value::Null))
                ),
                _ => "-".into(),
            });
            row
        })
        .collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    table(&headers, &rows)
}

/// A sidecar's certificate expiry for `proxy-status`: `in 15h59m`, `EXPIRED 3m0s ago`,
/// `none yet`, or `-` without mTLS.
fn cert_expiry(identity: &Value, now: i64) -> String {
    match identity["not_after"].as_i64() {
        None => "-".into(),
        Some(0) => "none yet".into(),
        Some(t) if t > now => format!("in {}", short_duration((t - now) as u64)),
        Some(t) => format!("EXPIRED {} ago", short_duration((now - t) as u64)),
    }
}

/// `90` → `1m30s`, `7200` → `2h0m`: an age at a glance.
pub fn short_duration(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// `GET /v1/status` as FIELD VALUE lines, in the documented order, then any others.
pub fn status_table(status: &Value) -> String {
    const ORDER: [&str; 9] = [
        "id", "role", "leader", "term", "last_log_index", "last_applied", "snapshot", "xds_revision",
        "history_revisions",
    ];
    let mut rows: Vec<Vec<String>> = ORDER.iter().map(|k| vec![k.to_string(), cell(&status[*k])]).collect();
    if let Some(obj) = status.as_object() {
        for (k, v) in obj.iter().filter(|(k, _)| !ORDER.contains(&k.as_str())) {
            rows.push(vec![k.clone(), cell(v)]);
        }
    }
    table(&["FIELD", "VALUE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_and_trim() {
        let t = table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()], vec!["é".into(), "".into()]]);
        assert_eq!(t, "A     LONGER\nxyz   1\né\n");
    }

    #[test]
    fn summaries_per_kind() {
        let svc = json!({"hosts": ["chat", "chat.svc"], "routes": [
            {"name": "infer", "experiment": "ab"}, {"name": "default", "cluster": "c1"}]});
        assert_eq!(summary(Kind::Services, &svc), "hosts=chat,chat.svc routes=infer→experiment/ab,default→c1");
        let exp = json!({"variants": [{"name": "a", "weight": 90}, {"name": "b", "weight": 10}], "shadow": null});
        assert_eq!(summary(Kind::Experiments, &exp), "a=90 (90%) b=10 (10%)");
        let relative = json!({"variants": [{"name": "a", "weight": 150}, {"name": "b", "weight": 10}, {"name": "c", "weight": 0}]});
        assert_eq!(summary(Kind::Experiments, &relative), "a=150 (93.8%) b=10 (6.3%) c=0 (0%)");
        let cl = json!({"lb": "p2c_ewma", "protocol": "http1", "endpoints": ["10.0.0.1:80", "10.0.0.2:80"]});
        assert_eq!(summary(Kind::Clusters, &cl), "lb=p2c_ewma protocol=http1 endpoints=10.0.0.1:80,10.0.0.2:80");
        let eps = json!({"endpoints": [{"address": "h:1", "variant": "a"}, {"address": "h:2", "variant": ""}]});
        assert_eq!(summary(Kind::Endpoints, &eps), "endpoints=h:1(a),h:2");
        let p = json!({"workload": {"kind": "replica"}, "allocations": [{"node": "gpu-1"}], "owner": "autoscaler/chat"});
        assert_eq!(summary(Kind::Placements, &p), "replica on gpu-1 by autoscaler/chat");
        // Malformed specs still summarize without panicking.
        assert_eq!(summary(Kind::Services, &json!(null)), "hosts= routes=");
        let long = json!({"endpoints": (0..40).map(|i| format!("10.0.0.{i}:8080")).collect::<Vec<_>>()});
        let s = summary(Kind::Clusters, &long);
        assert_eq!(s.chars().count(), SUMMARY_MAX);
        assert!(s.ends_with('…'));
    }

    #[test]
    fn items_and_history() {
        let items = [json!({"kind": "clusters", "name": "c1", "revision": 7, "spec": {"endpoints": ["h:1"]}})];
        assert_eq!(
            items_table(Kind::Clusters, &items),
            "KIND      NAME   REVISION   SUMMARY\ncluster   c1     7          endpoints=h:1\n"
        );
        let hist = [json!({"revision": 3, "spec": {"endpoints": []}}), json!({"revision": 5, "spec": null})];
        assert_eq!(
            history_table(Kind::Clusters, &hist),
            "REVISION   SUMMARY\n3          endpoints=\n5          deleted\n"
        );
    }

    #[test]
    fn type_urls_shorten() {
        assert_eq!(short_type("type.googleapis.com/weft.v1.Cluster"), "clusters");
        assert_eq!(short_type("type.googleapis.com/weft.v1.Endpoints"), "endpoints");
        assert_eq!(short_type("type.googleapis.com/weft.v1.Service"), "services");
        assert_eq!(short_type("Experiment"), "experiments");
    }

    #[test]
    fn kinds_are_listed_with_counts_and_who_writes_them() {
        let t = kinds_table(&json!({"clusters": 2, "services": 1}));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1 + Kind::ALL.len(), "{t}");
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["clusters", "2", "weftctl", "apply"]);
        let maps = lines.iter().find(|l| l.starts_with("shardmaps")).unwrap();
        assert!(maps.contains("-") && maps.ends_with("the control plane"), "{t}");
    }

    #[test]
    fn proxy_status_columns() {
        let v = json!({"items": [
            {"node_id": "side-1", "control_node": 1, "connected": true,
             "acked": {"type.googleapis.com/weft.v1.Cluster": "12", "type.googleapis.com/weft.v1.Listener": "3", "type.googleapis.com/weft.v1.AuthorizationPolicy": "14"},
             "identity": {"spiffe_id": "spiffe://td/service/a", "not_before": 0, "not_after": 4102444800_i64},
             "nack": {"type_url": "type.googleapis.com/weft.v1.Service", "version": "13", "error": "unknown cluster x"}},
            {"node_id": "side-2", "control_node": 2, "connected": false, "disconnected_s": 95, "acked": {}, "nack": null,
             "identity": {"spiffe_id": "spiffe://td/service/b", "not_before": 0, "not_after": 1000}},
            {"node_id": "envoy-1", "control_node": 1, "connected": true, "nack": null, "acked": {
                "type.googleapis.com/envoy.config.cluster.v3.Cluster": "12",
                "type.googleapis.com/envoy.config.listener.v3.Listener": "12",
                "type.googleapis.com/made.up.Thing": "1"}}
        ]});
        let t = proxies_table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NODE", "CONTROL", "CONNECTED", "CLUSTERS@REV", "ENDPOINTS@REV", "EXPERIMENTS@REV", "SERVICES@REV", "AUTHZ@REV", "OTHER", "CERT", "EXPIRES", "LAST", "NACK"],
            "fixed columns, saying they hold revisions"
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["side-1", "1", "yes", "12", "-", "-", "-", "14", "1", "in", lines[1].split_whitespace().nth(10).unwrap(), "services", "13:", "unknown", "cluster", "x"]
        );
        assert!(lines[1].split_whitespace().nth(10).unwrap().ends_with('m'), "hours and minutes left: {}", lines[1]);
        let two: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(two[..10], ["side-2", "2", "no", "(1m35s", "ago)", "-", "-", "-", "-", "-"]);
        assert_eq!((two[10], two[11]), ("-", "EXPIRED"), "an expired certificate says so: {}", lines[2]);
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["envoy-1", "1", "yes", "-", "-", "-", "-", "-", "3", "-", "-"],
            "an Envoy's types (and one no one serves) are counted, not columns"
        );
        assert_eq!(proxies_table(&json!({"items": []})).lines().count(), 1);
    }

    #[test]
    fn members_and_status() {
        let v = json!({"leader": 1, "term": 4, "members": [
            {"id": 1, "addr": "a:1", "xds_addr": "a:2", "voter": true},
            {"id": 2, "addr": "b:1", "xds_addr": "", "voter": false}]});
        let t = members_table(&v);
        assert!(t.contains("voter (leader)"), "{t}");
        assert!(t.lines().nth(2).unwrap().ends_with("-          learner"), "{t}");
        assert!(t.ends_with("term 4, leader 1\n"));
        let s = status_table(&json!({"id": 1, "role": "leader", "leader": 1, "snapshot": null, "extra": true}));
        let row = |k: &str| s.lines().find(|l| l.split_whitespace().next() == Some(k)).map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string());
        assert_eq!(row("snapshot").as_deref(), Some("-"), "{s}");
        assert_eq!(row("history_revisions").as_deref(), Some("-"), "a documented field missing from the answer: {s}");
        assert!(s.lines().last().unwrap().starts_with("extra ") && s.ends_with(" true\n"), "undocumented fields come last: {s}");
    }

    #[test]
    fn structured_formats() {
        let v = json!({"a": [1, "x"]});
        assert_eq!(structured(Format::Json, &v).unwrap(), "{\n  \"a\": [\n    1,\n    \"x\"\n  ]\n}\n");
        assert_eq!(structured(Format::Yaml, &v).unwrap(), "a:\n- 1\n- x\n");
        assert!(structured(Format::Table, &v).is_none());
    }
}

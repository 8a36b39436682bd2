//! `weftctl describe KIND NAME`: one resource whole, as an operator asks about it: its spec,
//! what the control plane derived from it (a rollout's state, a job's shard map, an
//! autoscaler's decision), its history, and which sidecars run its revision. Gathering is IO
//! ([`gather`]); the text is rendered from the gathered JSON alone ([`render`]).

use serde_json::{Value, json};
use weft_xds::typeurl;

use super::output::{cell, indent, summary, table, to_yaml};
use crate::resources::Kind;

/// The resource the control plane writes from this one, shown as its status.
fn status_kind(kind: Kind) -> Option<Kind> {
    match kind {
        Kind::Rollouts => Some(Kind::RolloutStates),
        Kind::TrainingJobs => Some(Kind::ShardMaps),
        Kind::Autoscalers => Some(Kind::ScalingDecisions),
        _ => None,
    }
}

/// The xDS types a sidecar (weft's, or a stock Envoy) receives this kind in.
fn carried_in(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Clusters => &[typeurl::CLUSTER, typeurl::envoy::CLUSTER],
        Kind::Endpoints => &[typeurl::ENDPOINTS, typeurl::envoy::CLUSTER_LOAD_ASSIGNMENT],
        Kind::Experiments => &[typeurl::EXPERIMENT, typeurl::envoy::ROUTE_CONFIGURATION],
        Kind::Services => &[typeurl::SERVICE, typeurl::envoy::ROUTE_CONFIGURATION],
        Kind::AuthorizationPolicies => &[typeurl::AUTHORIZATION_POLICY],
        Kind::Revocations => &[typeurl::REVOCATION],
        _ => &[],
    }
}

/// Everything `describe` shows, as one JSON value (`-o json` prints it as is).
pub async fn gather(c: &mut super::Client, kind: Kind, name: &str) -> Result<Value, super::CliError> {
    use http::Method;
    let item = super::call(c, Method::GET, &format!("/v1/{kind}/{name}"), None).await?;
    let history = super::call(c, Method::GET, &format!("/v1/{kind}/{name}/history"), None).await?;
    // Derived state may not exist yet (a rollout before its first reading): shown as none.
    let status = match status_kind(kind) {
        Some(k) => super::call(c, Method::GET, &format!("/v1/{k}/{name}"), None).await.ok(),
        None => None,
    };
    let sidecars = if carried_in(kind).is_empty() {
        Value::Null
    } else {
        let proxies = super::call(c, Method::GET, "/v1/proxies", None).await?;
        sidecars(kind, item["revision"].as_u64().unwrap_or(0), &proxies)
    };
    Ok(json!({"item": item, "history": history["items"], "status": status, "sidecars": sidecars}))
}

/// Per connected sidecar that subscribes to a type carrying `kind`: whether it runs
/// `revision` (ACKed a version at or past it), NACKed it, or is behind.
pub fn sidecars(kind: Kind, revision: u64, proxies: &Value) -> Value {
    let types = carried_in(kind);
    let mut out = Vec::new();
    for p in proxies["items"].as_array().into_iter().flatten() {
        let Some((type_url, version)) = types.iter().find_map(|t| p["acked"][t].as_str().map(|v| (*t, v))) else { continue };
        let acked: u64 = version.parse().unwrap_or(0);
        let nacked = &p["nacks"][type_url];
        let state = if acked >= revision {
            "running"
        } else if nacked["version"].as_u64().is_some_and(|v| v >= revision) {
            "nacked"
        } else {
            "behind"
        };
        out.push(json!({
            "node_id": p["node_id"], "connected": p["connected"], "type_url": type_url,
            "acked": version, "state": state, "error": if state == "nacked" { nacked["error"].clone() } else { Value::Null },
        }));
    }
    Value::Array(out)
}

/// The text `describe` prints.
pub fn render(kind: Kind, d: &Value) -> String {
    let item = &d["item"];
    let mut s = format!("Kind:      {}\nName:      {}\nRevision:  {}\n", kind.yaml_kind(), cell(&item["name"]), cell(&item["revision"]));
    s += "\nSpec:\n";
    s += &indent(&to_yaml(&item["spec"]));
    if let Some(k) = status_kind(kind) {
        s += &format!("\nStatus ({k}):\n");
        s += &match &d["status"] {
            Value::Null => "  none yet\n".to_string(),
            st => indent(&to_yaml(&st["spec"])),
        };
    }
    let history = d["history"].as_array().cloned().unwrap_or_default();
    s += &format!("\nHistory ({} revisions, newest first):\n", history.len());
    let rows: Vec<Vec<String>> = history
        .iter()
        .rev()
        .take(10)
        .map(|h| vec![cell(&h["revision"]), if h["spec"].is_null() { "deleted".into() } else { summary(kind, &h["spec"]) }])
        .collect();
    s += &indent(&table(&["REVISION", "SUMMARY"], &rows));
    if let Some(list) = d["sidecars"].as_array() {
        s += "\nSidecars:\n";
        if list.is_empty() {
            s += "  none subscribes to it\n";
        } else {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|p| {
                    let connected = if p["connected"] == Value::Bool(true) { "yes" } else { "no" };
                    let state = match &p["error"] {
                        Value::String(e) => format!("nacked: {e}"),
                        _ => cell(&p["state"]),
                    };
                    vec![cell(&p["node_id"]), connected.into(), cell(&p["acked"]), state]
                })
                .collect();
            s += &indent(&table(&["NODE", "CONNECTED", "ACKED@REV", "STATE"], &rows));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies() -> Value {
        json!({"items": [
            {"node_id": "a", "connected": true, "acked": {(typeurl::SERVICE): "12"}, "nacks": {}},
            {"node_id": "b", "connected": true, "acked": {(typeurl::SERVICE): "9"},
             "nacks": {(typeurl::SERVICE): {"version": 12, "error": "unknown cluster x"}}},
            {"node_id": "c", "connected": false, "acked": {(typeurl::SERVICE): "9"}, "nacks": {}},
            {"node_id": "envoy-1", "connected": true, "acked": {(typeurl::envoy::ROUTE_CONFIGURATION): "13"}, "nacks": {}},
            {"node_id": "trainer", "connected": true, "acked": {(typeurl::SHARD_MAP): "20"}, "nacks": {}}
        ]})
    }

    #[test]
    fn each_subscribed_sidecar_runs_nacked_or_is_behind_the_revision() {
        let got = sidecars(Kind::Services, 12, &proxies());
        let states: Vec<(&str, &str)> = got.as_array().unwrap().iter().map(|p| (p["node_id"].as_str().unwrap(), p["state"].as_str().unwrap())).collect();
        assert_eq!(states, [("a", "running"), ("b", "nacked"), ("c", "behind"), ("envoy-1", "running")], "the trainer does not subscribe to services");
        assert_eq!(got[1]["error"], "unknown cluster x");
        assert_eq!(sidecars(Kind::Clusters, 1, &proxies()), json!([]));
    }

    #[test]
    fn the_text_has_spec_status_history_and_sidecars() {
        let d = json!({
            "item": {"name": "chat", "revision": 12, "spec": {"hosts": ["chat"]}},
            "history": [{"revision": 3, "spec": {}}, {"revision": 12, "spec": {}}],
            "status": null,
            "sidecars": sidecars(Kind::Services, 12, &proxies()),
        });
        let t = render(Kind::Services, &d);
        assert!(t.starts_with("Kind:      Service\nName:      chat\nRevision:  12\n"), "{t}");
        assert!(t.contains("\nSpec:\n  hosts:\n  - chat\n"), "{t}");
        assert!(!t.contains("Status"), "services have no derived status: {t}");
        let history = t.split("History (2 revisions, newest first):\n").nth(1).unwrap();
        assert!(history.lines().nth(1).unwrap().trim_start().starts_with("12"), "{t}");
        assert!(t.contains("nacked: unknown cluster x"), "{t}");
        let rollout = render(Kind::Rollouts, &json!({"item": {"name": "e", "revision": 1, "spec": {}}, "history": [], "status": null}));
        assert!(rollout.contains("Status (rolloutstates):\n  none yet\n") && !rollout.contains("Sidecars"), "{rollout}");
    }
}

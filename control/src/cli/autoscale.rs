//! `weftctl autoscale status` (per autoscaler: demand, forecast, ready, decision and why, from
//! the leader's decision loop, and the replicas placed when it places them) and `weftctl autoscale preempt` (a spot preemption notice).

use serde_json::{Value, json};

use super::output::{cell, table};

fn rps(v: &Value) -> String {
    v.as_f64().map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

/// The human view of `GET /v1/autoscale/status`.
pub fn status_table(body: &Value) -> String {
    let mut rows = Vec::new();
    let mut whys = Vec::new();
    let mut budgets = std::collections::BTreeMap::new();
    for it in body["items"].as_array().into_iter().flatten() {
        let s = &it["status"];
        let b = &s["budget"];
        if !b.is_null() {
            let state = if b["over_cap"] == Value::Bool(true) {
                "OVER CAP even at min_replicas"
            } else if b["limited"] == Value::Bool(true) {
                "limiting (replicas cut, least critical first)"
            } else {
                "within"
            };
            budgets.insert(
                cell(&b["name"]),
                format!(
                    "budget {}: ${:.2} spent this month, ${:.2} projected of ${:.2}: {state}",
                    cell(&b["name"]),
                    b["spent_usd"].as_f64().unwrap_or(0.0),
                    b["projected_usd"].as_f64().unwrap_or(0.0),
                    b["monthly_usd"].as_f64().unwrap_or(0.0)
                ),
            );
        }
        let d = if s.is_null() { &it["committed"]["decision"] } else { &s["decision"] };
        let p = &it["placement"];
        let placed = if p.is_null() {
            "-".to_string()
        } else {
            for u in p["unplaced"].as_array().into_iter().flatten() {
                whys.push(format!("{}: not placed: {}", cell(&it["name"]), cell(u)));
            }
            format!("{} od + {} spot", cell(&p["on_demand"]), cell(&p["spot"]))
        };
        let target = if d.is_null() {
            "-".to_string()
        } else {
            format!("{} ({} od + {} spot)", cell(&d["replicas"]), cell(&d["on_demand"]), cell(&d["spot"]))
        };
        rows.push(vec![
            cell(&it["name"]),
            cell(&it["variant"]),
            cell(&it["policy"]),
            rps(&s["demand_rps"]),
            rps(&s["forecast_rps"]),
            if s.is_null() { "-".into() } else { cell(&s["ready"]) },
            target,
            placed,
            if d.is_null() { "-".into() } else { cell(&d["reason"]) },
        ]);
        let why = if s.is_null() { "no decision yet on this leader (it needs two load readings)".into() } else { cell(&s["why"]) };
        whys.push(format!("{}: {why}", cell(&it["name"])));
    }
    if rows.is_empty() {
        return "no autoscalers (apply a `kind: Autoscaler` document)\n".into();
    }
    let mut out = table(&["NAME", "VARIANT", "POLICY", "DEMAND/s", "FORECAST/s", "READY", "TARGET", "PLACED", "REASON"], &rows);
    out.push('\n');
    for w in whys.into_iter().chain(budgets.into_values()) {
        out.push_str(&w);
        out.push('\n');
    }
    out
}

/// The body of `POST /v1/autoscale/preemption`.
pub fn notice(node: Option<String>, autoscaler: Option<String>, replicas: Option<u32>, notice_s: f64) -> Value {
    let mut b = json!({ "notice_s": notice_s });
    if let Some(n) = node {
        b["node"] = json!(n);
    }
    if let Some(a) = autoscaler {
        b["autoscaler"] = json!(a);
    }
    if let Some(r) = replicas {
        b["replicas"] = json!(r);
    }
    b
}

/// The human view of a preemption's outcome.
pub fn preemption_table(body: &Value) -> String {
    let rows: Vec<Vec<String>> = body["replaced"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            vec![
                cell(&r["autoscaler"]),
                cell(&r["variant"]),
                cell(&r["lost"]),
                cell(&r["on_demand_started"]),
                format!("{} ({} od + {} spot)", cell(&r["decision"]["replicas"]), cell(&r["decision"]["on_demand"]), cell(&r["decision"]["spot"])),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no autoscaled spot replicas affected\n".to_string()
    } else {
        table(&["AUTOSCALER", "VARIANT", "SPOT LOST", "ON-DEMAND STARTED", "TARGET"], &rows)
    };
    for t in body["training"].as_array().into_iter().flatten() {
        let workers: Vec<String> = t["draining"].as_array().into_iter().flatten().map(cell).collect();
        out.push_str(&format!(
            "training job {}: {} draining (their checkpoint hooks are called); the gang checkpoints at step {}\n",
            cell(&t["job"]),
            workers.join(", "),
            cell(&t["checkpoint_at"])
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemption_lists_replacements_and_draining_training_workers() {
        let body = json!({"replaced": [], "training": [{"job": "llm", "draining": ["llm-3"], "checkpoint_at": 1205}]});
        let t = preemption_table(&body);
        assert!(t.contains("no autoscaled spot replicas affected"), "{t}");
        assert!(t.contains("training job llm: llm-3 draining") && t.contains("checkpoints at step 1205"), "{t}");
    }

    #[test]
    fn status_shows_demand_forecast_decision_and_why() {
        let body = json!({"items": [
            {"name": "chat-a", "variant": "a", "policy": "hybrid",
             "status": {"demand_rps": 42.25, "forecast_rps": 50.0, "ready": 4, "why": "ahead of the forecast",
                        "decision": {"replicas": 6, "on_demand": 3, "spot": 3, "reason": "forecast"}}},
            {"name": "chat-b", "variant": "b", "policy": "reactive", "status": null, "committed": null}
        ]});
        let t = status_table(&body);
        assert!(t.contains("chat-a") && t.contains("42.2") && t.contains("50.0") && t.contains("6 (3 od + 3 spot)"), "{t}");
        assert!(t.contains("forecast") && t.contains("chat-a: ahead of the forecast"), "{t}");
        assert!(t.contains("chat-b: no decision yet"), "{t}");
        let mut body = body;
        body["items"][0]["status"]["budget"] =
            json!({"name": "team", "spent_usd": 10.0, "projected_usd": 95.5, "monthly_usd": 100.0, "limited": true, "over_cap": false});
        let t = status_table(&body);
        assert!(t.contains("budget team: $10.00 spent this month, $95.50 projected of $100.00: limiting"), "{t}");
        body["items"][0]["placement"] =
            json!({"on_demand": 3, "spot": 1, "want_on_demand": 3, "want_spot": 3, "unplaced": ["chat-a-spot-2: no node fits"]});
        let t = status_table(&body);
        assert!(t.contains("3 od + 1 spot") && t.contains("chat-a: not placed: chat-a-spot-2: no node fits"), "{t}");
    }
}

//! `weftctl experiment status NAME` (per variant: requests, error rate and p50/p95/p99 with
//! 95% intervals, the SRM p-value, and the rollout's phase, verdict, confidence and why) and
//! the tables of the rollout commands.

use serde_json::Value;

use super::output::{cell, table, weight_shares};

fn ms(v: &Value) -> String {
    match v["ms"].as_f64() {
        None => "-".into(),
        Some(x) => format!("{x:.1} [{:.1}, {:.1}]", v["lo"].as_f64().unwrap_or(x), v["hi"].as_f64().unwrap_or(x)),
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("{:.2}%", x * 100.0))
}

/// The human view of `GET /v1/rollout/NAME`.
pub fn status_table(body: &Value) -> String {
    let weights = weight_shares(&body["variants"]);
    let rows: Vec<Vec<String>> = body["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(weights)
        .map(|(v, weight)| {
            let ci = &v["error_rate_ci"];
            vec![
                cell(&v["variant"]),
                weight,
                cell(&v["requests"]),
                format!("{} [{}, {}]", pct(v["error_rate"].as_f64()), pct(ci[0].as_f64()), pct(ci[1].as_f64())),
                ms(&v["p50"]),
                ms(&v["p95"]),
                ms(&v["p99"]),
            ]
        })
        .collect();
    let mut out = table(&["VARIANT", "WEIGHT (SHARE)", "REQUESTS", "ERRORS [95% CI]", "P50 ms [CI]", "P95 ms [CI]", "P99 ms [CI]"], &rows);
    let srm = &body["srm"];
    out.push_str(&format!(
        "\nsample ratio vs weights: chi2 {:.2}, p {:.3e}{}\n",
        srm["chi2"].as_f64().unwrap_or(0.0),
        srm["p"].as_f64().unwrap_or(1.0),
        if srm["ok"] == Value::Bool(false) { "  MISMATCH: the split is broken, no comparison is trusted" } else { "" }
    ));
    let r = &body["rollout"];
    if r.is_null() {
        out.push_str("rollout: none (apply a `kind: Rollout` named after the experiment to automate it)\n");
        return out;
    }
    let s = &r["state"];
    if s.is_null() {
        out.push_str("rollout: starting\n");
        return out;
    }
    out.push_str(&format!("rollout: {} at {}% (step {})\n", cell(&s["phase"]), cell(&s["weight"]), cell(&s["step"])));
    if let Some(j) = s.get("last").filter(|j| !j.is_null()) {
        out.push_str(&format!(
            "verdict: {} (confidence {:.1}%); candidate − baseline: errors {} [{}, {}], slow share {} [{}, {}]\n",
            cell(&j["verdict"]["action"]),
            j["confidence"].as_f64().unwrap_or(0.0) * 100.0,
            pct(j["errors"]["diff"].as_f64()),
            pct(j["errors"]["lo"].as_f64()),
            pct(j["errors"]["hi"].as_f64()),
            pct(j["slow"]["diff"].as_f64()),
            pct(j["slow"]["lo"].as_f64()),
            pct(j["slow"]["hi"].as_f64()),
        ));
    }
    out.push_str(&format!("why: {}\n", cell(&s["reason"])));
    out
}

/// The human view of a rollout command's answer.
pub fn command_line(body: &Value) -> String {
    let s = &body["state"];
    format!("rollout {}: {} at {}% — {}\n", cell(&body["experiment"]), cell(&s["phase"]), cell(&s["weight"]), cell(&s["reason"]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_shows_variants_srm_verdict_and_why() {
        let body = json!({
            "experiment": "chat-ab",
            "variants": [
                {"variant": "a", "weight": 75, "requests": 3000, "errors": 30, "error_rate": 0.01, "error_rate_ci": [0.007, 0.014],
                 "p50": {"ms": 40.0, "lo": 39.0, "hi": 41.0}, "p95": {"ms": 80.0, "lo": 78.0, "hi": 83.0}, "p99": null},
                {"variant": "b", "weight": 25, "requests": 1000, "errors": 30, "error_rate": 0.03, "error_rate_ci": [0.021, 0.042],
                 "p50": null, "p95": null, "p99": null}],
            "srm": {"chi2": 0.0, "p": 1.0, "ok": true},
            "rollout": {"state": {"phase": "rolled_back", "weight": 0, "step": 2, "reason": "rolled back: the error_rate guardrail failed",
                "last": {"verdict": {"action": "rollback", "guardrail": "error_rate"}, "confidence": 0.999,
                    "errors": {"diff": 0.02, "lo": 0.01, "hi": 0.03}, "slow": {"diff": 0.0, "lo": -0.01, "hi": 0.01}}}}
        });
        let t = status_table(&body);
        assert!(t.contains("75 (75%)") && t.contains("25 (25%)"), "{t}");
        assert!(t.contains("1.00% [0.70%, 1.40%]") && t.contains("80.0 [78.0, 83.0]"), "{t}");
        assert!(t.contains("rolled_back at 0%") && t.contains("rollback (confidence 99.9%)") && t.contains("why: rolled back"), "{t}");
    }
}

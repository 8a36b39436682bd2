//! `weftctl stat [--window S]`: golden metrics per service, experiment and variant over the
//! last S seconds (success rate, requests/s, p50/p95/p99, time to first byte, tokens/s), like `linkerd viz stat`, from the
//! sidecars' load reports as the control nodes hold them (`GET /v1/load?window=S`). A variant
//! is listed under every service whose routes lead to its experiment.

use std::collections::BTreeMap;

use serde_json::Value;

use super::output::{cell, table};
use crate::reports::ExperimentLoad;

/// Experiment name → the services routing to it, from `GET /v1/services` items.
pub fn services_by_experiment(services: &Value) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in services["items"].as_array().into_iter().flatten() {
        for r in s["spec"]["routes"].as_array().into_iter().flatten() {
            if let Some(e) = r["experiment"].as_str() {
                let list = out.entry(e.to_string()).or_default();
                let name = cell(&s["name"]);
                if !list.contains(&name) {
                    list.push(name);
                }
            }
        }
    }
    out
}

fn ms(l: &ExperimentLoad, q: f64) -> String {
    l.latency.quantile(q).map_or_else(|| "-".into(), |v| format!("{v:.1}ms"))
}

/// The table, from `GET /v1/load?window=S` and the services map.
pub fn stat_table(load: &Value, services: &BTreeMap<String, Vec<String>>) -> String {
    let window = load["window_s"].as_f64().unwrap_or(0.0).max(1e-3);
    let mut rows = Vec::new();
    for item in load["items"].as_array().into_iter().flatten() {
        let Ok(l) = serde_json::from_value::<ExperimentLoad>(item.clone()) else { continue };
        let success = if l.requests == 0 { "-".to_string() } else { format!("{:.2}%", 100.0 * (1.0 - l.errors as f64 / l.requests as f64)) };
        let svc = services.get(&l.experiment).map(|s| s.join(",")).unwrap_or_else(|| "-".into());
        rows.push(vec![
            svc,
            l.experiment.clone(),
            l.variant.clone(),
            success,
            format!("{:.1}", l.requests as f64 / window),
            ms(&l, 0.5),
            ms(&l, 0.95),
            ms(&l, 0.99),
            l.ttfb.quantile(0.5).map_or_else(|| "-".into(), |v| format!("{v:.1}ms")),
            if l.input_tokens + l.output_tokens == 0 {
                "-".into()
            } else {
                format!("{:.1}/{:.1}", l.input_tokens as f64 / window, l.output_tokens as f64 / window)
            },
        ]);
    }
    if rows.is_empty() {
        return format!("no experiment traffic reported in the last {window:.0} s\n");
    }
    let mut out = table(&["SERVICE", "EXPERIMENT", "VARIANT", "SUCCESS", "RPS", "LATENCY_P50", "LATENCY_P95", "LATENCY_P99", "TTFB_P50", "TOKENS/S IN/OUT"], &rows);
    out.push_str(&format!("(last {window:.0} s; latency percentiles within 1%)\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weft_proxy::sketch::LogSketch;

    #[test]
    fn golden_metrics_per_service_and_variant() {
        let mut latency = LogSketch::new();
        for i in 0..100 {
            latency.add(10.0 + i as f64);
        }
        let mut ttfb = LogSketch::new();
        ttfb.add(4.0);
        let a = ExperimentLoad { experiment: "ab".into(), variant: "a".into(), requests: 600, errors: 6, latency, input_tokens: 1200, output_tokens: 6000, ttfb };
        let load = json!({"window_s": 60.0, "items": [serde_json::to_value(&a).unwrap()]});
        let services = services_by_experiment(&json!({"items": [
            {"name": "chat", "spec": {"routes": [{"name": "r", "experiment": "ab"}, {"name": "d", "cluster": "c"}]}}]}));
        let t = stat_table(&load, &services);
        assert!(t.contains("chat") && t.contains("99.00%") && t.contains("10.0"), "{t}");
        assert!(t.contains("LATENCY_P95"), "{t}");
        assert!(t.contains("4.0ms") && t.contains("20.0/100.0"), "time to first byte and tokens per second: {t}");
    }
}

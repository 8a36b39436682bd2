//! The observability files shipped in deploy/ stay consistent with what the sidecars export:
//! every metric a recording rule reads is one weft-proxy exports (histograms through their
//! `_bucket` series), every recorded name is unique, and every Grafana panel reads only
//! recorded series that the rules define.

use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Identifiers in `text` that start with `prefix` and go on with `[a-z0-9_:]`.
fn names(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn recording_rules_read_exported_metrics_and_the_dashboard_reads_recorded_ones() {
    let described: BTreeSet<String> = weft_proxy::telemetry::exported_families().map(str::to_string).collect();
    assert!(described.contains("weft_requests_total"), "{described:?}");

    let rules_text = std::fs::read_to_string(root().join("deploy/config/weft-rules.yml")).unwrap();
    let rules: serde_json::Value = serde_norway::from_str(&rules_text).expect("rules are YAML");
    let mut recorded = BTreeSet::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let record = rule["record"].as_str().expect("a recording rule");
            assert!(record.starts_with("weft:"), "{record}");
            assert!(recorded.insert(record.to_string()), "{record} recorded twice");
            for metric in names(rule["expr"].as_str().unwrap(), "weft_") {
                let base = metric.strip_suffix("_bucket").unwrap_or(&metric);
                assert!(described.contains(base), "rule {record} reads {metric}, which weft-proxy does not export");
            }
        }
    }

    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("deploy/grafana/weft-variants.json")).unwrap()).unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().unwrap();
            let used = names(expr, "weft:");
            assert!(!used.is_empty(), "panel {} reads no recorded series: {expr}", p["title"]);
            for u in used {
                assert!(recorded.contains(&u), "panel {} reads {u}, which no rule records", p["title"]);
            }
        }
    }
}

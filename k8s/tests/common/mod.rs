//! What the k8s tests share: `kubernetes-validate --strict` against the Kubernetes 1.34 schema.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use serde_json::Value;

/// The Kubernetes version manifests and patched pods are checked against (k8s-openapi's
/// feature in the workspace Cargo.toml).
pub const KUBERNETES: &str = "1.34.0";

/// Whether kubernetes-validate is installed (.ci/run installs it; without it the check is
/// skipped, saying so).
pub fn have_validator() -> bool {
    let ok = Command::new("kubernetes-validate").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP kubernetes-validate: not installed (pip install kubernetes-validate)");
    }
    ok
}

/// Run `kubernetes-validate --strict` on `files`; panics with its report when any fails.
pub fn validate_files(files: &[&Path]) {
    let out = Command::new("kubernetes-validate").args(["--strict", "-k", KUBERNETES]).args(files).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !text.contains("ERROR"), "kubernetes-validate refuses:\n{text}");
}

/// Turn one recorded line into the events kube's watcher yields for it: a LIST is a (re)start
/// (Init, InitApply per item, InitDone); ADDED/MODIFIED are Apply; DELETED is Delete; BOOKMARK
/// and ERROR (the watcher relists after a 410) yield nothing themselves.
pub fn events(line: &Value) -> Vec<Event<EndpointSlice>> {
    let slice = |v: &Value| serde_json::from_value::<EndpointSlice>(v.clone()).unwrap();
    if let Some(list) = line.get("list") {
        let items = list["items"].as_array().unwrap().iter().map(|i| Event::InitApply(slice(i)));
        return std::iter::once(Event::Init).chain(items).chain([Event::InitDone]).collect();
    }
    match line["type"].as_str().unwrap() {
        "ADDED" | "MODIFIED" => vec![Event::Apply(slice(&line["object"]))],
        "DELETED" => vec![Event::Delete(slice(&line["object"]))],
        "BOOKMARK" | "ERROR" => vec![],
        t => panic!("unknown watch event type {t}"),
    }
}

pub fn recorded() -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/endpointslice-watch.jsonl"))
        .unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}


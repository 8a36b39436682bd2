//! deploy/kubernetes: the CRDs are what the Rust types generate, every manifest passes
//! `kubernetes-validate --strict`, and the example's weft custom resources become writes that
//! weft-control's own validation accepts.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft_k8s::crds;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The YAML documents of one file.
fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The files a kustomization lists under `resources`.
fn kustomized(dir: &Path) -> Vec<PathBuf> {
    let k = &docs(&dir.join("kustomization.yaml"))[0];
    k["resources"].as_array().unwrap().iter().map(|r| dir.join(r.as_str().unwrap())).collect()
}

#[test]
fn the_committed_crds_are_what_the_types_generate() {
    let committed = std::fs::read_to_string(deploy().join("crds.yaml")).unwrap();
    assert!(
        committed == crds::yaml(),
        "deploy/kubernetes/crds.yaml is stale: run `cargo run -p weft-k8s --bin weft-k8s -- crds > deploy/kubernetes/crds.yaml`"
    );
    let all = docs(&deploy().join("crds.yaml"));
    let kinds: Vec<&str> = all.iter().map(|d| d["spec"]["names"]["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Route", "Experiment", "Rollout", "Autoscaler", "TrainingJob"]);
    for d in &all {
        let v = &d["spec"]["versions"][0];
        assert_eq!(d["spec"]["scope"], "Cluster", "weft's names are global");
        assert_eq!(v["subresources"]["status"], serde_json::json!({}), "status is a subresource the sync writes");
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["type"], "object", "{}", d["metadata"]["name"]);
    }
    // The schema is weft's own: the Route's retry policy and the Experiment's variants.
    let route = &all[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let route_item = &route["properties"]["routes"]["items"]["properties"];
    assert!(route_item["retry"]["properties"]["attempts"].is_object(), "{route_item}");
    assert_eq!(route_item["timeout"]["x-kubernetes-int-or-string"], true, "durations are \"2s\" or 0");
}

#[test]
fn every_manifest_passes_kubernetes_validate() {
    let mut files = kustomized(&deploy());
    files.push(deploy().join("crds.yaml"));
    files.extend(kustomized(&deploy().join("example")));
    let mut checked = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    for f in &files {
        for (i, d) in docs(f).into_iter().enumerate() {
            let api = d["apiVersion"].as_str().unwrap_or_default();
            // cert-manager's and weft's own kinds have no schema in kubernetes-validate; weft's
            // are checked against their CRD below.
            if api.starts_with("cert-manager.io/") || api.starts_with("weft.dev/") {
                continue;
            }
            assert!(d["metadata"]["name"].is_string(), "{}: document {i} has no name", f.display());
            let out = dir.path().join(format!("{}-{i}.json", f.file_stem().unwrap().to_string_lossy()));
            std::fs::write(&out, serde_json::to_vec(&d).unwrap()).unwrap();
            checked.push((d["kind"].as_str().unwrap().to_string(), out));
        }
    }
    let kinds: Vec<&str> = checked.iter().map(|(k, _)| k.as_str()).collect();
    for want in [
        "StatefulSet",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "Deployment",
        "CustomResourceDefinition",
        "Service",
        "ServiceAccount",
    ] {
        assert!(kinds.contains(&want), "no {want} among {kinds:?}");
    }
    if common::have_validator() {
        let paths: Vec<&Path> = checked.iter().map(|(_, p)| p.as_path()).collect();
        common::validate_files(&paths);
    }
}

#[test]
fn the_examples_custom_resources_are_weft_writes_the_api_accepts() {
    let mesh = docs(&deploy().join("example/mesh.yaml"));
    assert_eq!(mesh.len(), 3);
    for d in mesh {
        let (kind, name, spec) = match d["kind"].as_str().unwrap() {
            "Experiment" => {
                let cr: crds::Experiment = serde_json::from_value(d.clone()).unwrap();
                crds::to_weft(&cr, &cr.spec).unwrap()
            }
            "Route" => {
                let cr: crds::Route = serde_json::from_value(d.clone()).unwrap();
                crds::to_weft(&cr, &cr.spec).unwrap()
            }
            "Rollout" => {
                let cr: crds::Rollout = serde_json::from_value(d.clone()).unwrap();
                crds::to_weft(&cr, &cr.spec).unwrap()
            }
            other => panic!("unexpected kind {other}"),
        };
        weft_control::resources::validate(kind, &name, &spec)
            .unwrap_or_else(|e| panic!("weft-control refuses {kind} {name}: {e:?}\n{spec}"));
    }
}

#[test]
fn a_spec_name_other_than_the_objects_is_refused() {
    let mut cr: crds::Route = serde_json::from_value(docs(&deploy().join("example/mesh.yaml"))[1].clone()).unwrap();
    cr.spec.service.name = "other".into();
    let e = crds::to_weft(&cr, &cr.spec).unwrap_err();
    assert!(e.contains("spec.name") && e.contains("\"other\"") && e.contains("\"ranker\""), "{e}");
}

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

/// Write the built-in kinds among `docs` to files and check them with kubernetes-validate;
/// returns their kinds. cert-manager's and weft's own kinds have no schema there (weft's are
/// checked against their types in the test below).
fn validate_docs(docs: Vec<(String, Value)>) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for (i, (from, d)) in docs.into_iter().enumerate() {
        let api = d["apiVersion"].as_str().unwrap_or_default();
        if api.starts_with("cert-manager.io/") || api.starts_with("weft.dev/") {
            continue;
        }
        assert!(d["metadata"]["name"].is_string(), "{from}: document {i} has no name");
        let out = dir.path().join(format!("{i}.json"));
        std::fs::write(&out, serde_json::to_vec(&d).unwrap()).unwrap();
        checked.push((d["kind"].as_str().unwrap().to_string(), out));
    }
    if common::have_validator() {
        let paths: Vec<&Path> = checked.iter().map(|(_, p)| p.as_path()).collect();
        common::validate_files(&paths);
    }
    checked.into_iter().map(|(k, _)| k).collect()
}

#[test]
fn every_manifest_passes_kubernetes_validate() {
    let mut files = kustomized(&deploy());
    files.push(deploy().join("crds.yaml"));
    files.extend(kustomized(&deploy().join("example")));
    let all = files.iter().flat_map(|f| docs(f).into_iter().map(|d| (f.display().to_string(), d))).collect();
    let kinds = validate_docs(all);
    for want in [
        "StatefulSet",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "Deployment",
        "CustomResourceDefinition",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        assert!(kinds.iter().any(|k| k == want), "no {want} among {kinds:?}");
    }
}

/// What `kubectl apply -k` sends, rendered by kubectl's own kustomize (when kubectl is here).
#[test]
fn the_kustomize_output_passes_kubernetes_validate() {
    for dir in [deploy(), deploy().join("example")] {
        let Ok(out) = std::process::Command::new("kubectl").arg("kustomize").arg(&dir).output() else {
            eprintln!("SKIP kubectl kustomize: kubectl not installed");
            return;
        };
        assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let rendered: Vec<(String, Value)> = serde_norway::Deserializer::from_str(&text)
            .map(|d| ("kustomize".to_string(), serde::Deserialize::deserialize(d).unwrap()))
            .collect();
        assert!(rendered.len() >= 6, "{}: {} documents", dir.display(), rendered.len());
        validate_docs(rendered);
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
                crds::to_weft(&cr).unwrap()
            }
            "Route" => {
                let cr: crds::Route = serde_json::from_value(d.clone()).unwrap();
                crds::to_weft(&cr).unwrap()
            }
            "Rollout" => {
                let cr: crds::Rollout = serde_json::from_value(d.clone()).unwrap();
                crds::to_weft(&cr).unwrap()
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
    let e = crds::to_weft(&cr).unwrap_err();
    assert!(e.contains("spec.name") && e.contains("\"other\"") && e.contains("\"ranker\""), "{e}");
}

/// The API server refuses a CRD whose schema is not *structural* (apiextensions' rules, which
/// kubernetes-validate does not check): every node says its type (or is int-or-string), no
/// `$ref`, and inside `anyOf`/`allOf`/`oneOf`/`not` no type, default, description, nullable
/// or additionalProperties.
fn structural(path: &str, node: &Value, in_junctor: bool, errors: &mut Vec<String>) {
    let Some(obj) = node.as_object() else { return };
    if obj.contains_key("$ref") || obj.contains_key("$defs") || obj.contains_key("definitions") {
        errors.push(format!("{path}: $ref/definitions"));
    }
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if in_junctor {
        for k in ["type", "default", "description", "nullable", "additionalProperties"] {
            if obj.contains_key(k) {
                errors.push(format!("{path}: {k} inside anyOf/allOf/oneOf/not"));
            }
        }
    } else if !obj.contains_key("type") && !int_or_string && !preserve {
        errors.push(format!("{path}: no type"));
    }
    if obj.contains_key("nullable") && !obj.contains_key("type") && !int_or_string {
        errors.push(format!("{path}: nullable without a type"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            structural(&format!("{path}.{k}"), v, in_junctor, errors);
        }
    }
    for k in ["items", "additionalProperties"] {
        if let Some(v) = obj.get(k).filter(|v| v.is_object()) {
            structural(&format!("{path}[{k}]"), v, in_junctor, errors);
        }
    }
    for k in ["anyOf", "allOf", "oneOf"] {
        for (i, v) in obj.get(k).and_then(Value::as_array).into_iter().flatten().enumerate() {
            structural(&format!("{path}.{k}[{i}]"), v, true, errors);
        }
    }
    if let Some(v) = obj.get("not") {
        structural(&format!("{path}.not"), v, true, errors);
    }
}

#[test]
fn the_crd_schemas_are_structural() {
    for crd in crds::all() {
        let v = serde_json::to_value(&crd).unwrap();
        let schema = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut errors = Vec::new();
        structural(&crd.spec.names.kind, schema, false, &mut errors);
        assert!(errors.is_empty(), "{}: not structural:\n{}", crd.spec.names.kind, errors.join("\n"));
    }
}

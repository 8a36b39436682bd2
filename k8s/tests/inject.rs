//! The injector against real AdmissionReview v1 request bodies (tests/fixtures): the JSONPatch
//! it answers with is applied to the request's pod the way the API server applies it, and the
//! patched pod is checked field by field, by weft-proxy's own config compiler (the bootstrap),
//! and by `kubernetes-validate --strict` against the Kubernetes 1.34 schema.

mod common;

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;
use weft_k8s::inject::{self, Decision, Settings, sidecar};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)).unwrap()
}

/// What the API server does with the webhook's answer: check the uid, apply the patch.
struct Outcome {
    response: Value,
    patched: Option<Value>,
}

fn run(settings: &Settings, body: &[u8]) -> Outcome {
    let (_, out) = inject::review(settings, body);
    let review: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    let response = review["response"].clone();
    let request: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(response["uid"], request["request"]["uid"], "the API server matches answers by uid");
    let patched = response.get("patch").map(|p| {
        assert_eq!(response["patchType"], "JSONPatch");
        // kube-core sends the patch bytes as a JSON array of numbers (Go's []byte accepts it).
        let bytes: Vec<u8> = serde_json::from_value(p.clone()).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut pod = request["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        pod
    });
    Outcome { response, patched }
}

fn pod(v: &Value) -> Pod {
    serde_json::from_value(v.clone()).unwrap()
}

fn init_names(p: &Pod) -> Vec<String> {
    p.spec.as_ref().unwrap().init_containers.iter().flatten().map(|c| c.name.clone()).collect()
}

fn proxy_of(p: &Pod) -> Container {
    p.spec.as_ref().unwrap().init_containers.iter().flatten().find(|c| c.name == sidecar::CONTAINER).unwrap().clone()
}

fn arg_after(c: &Container, flag: &str) -> Option<String> {
    let args = c.args.as_ref().unwrap();
    args.iter().position(|a| a == flag).map(|i| args[i + 1].clone())
}

/// The bootstrap YAML the sidecar reads from its env, compiled by weft-proxy itself.
fn bootstrap_of(c: &Container) -> weft_proxy::Config {
    let env = c.env.as_ref().unwrap();
    let yaml = env.iter().find(|e| e.name == sidecar::BOOTSTRAP_ENV).and_then(|e| e.value.clone()).unwrap();
    let cfg = weft_proxy::Config::from_yaml(&yaml).unwrap();
    let tel = weft_proxy::telemetry::Telemetry::new(&cfg.node);
    weft_proxy::snapshot::Snapshot::compile(cfg.clone(), None, 1, &tel, &weft_proxy::mtls::TlsContext::none())
        .unwrap_or_else(|e| panic!("weft-proxy refuses the injected bootstrap: {e}\n{yaml}"));
    cfg
}

#[test]
fn a_deployments_pod_gets_a_native_sidecar_in_front_of_its_model_port() {
    let out = run(&Settings::default(), &fixture("deployment-pod.json"));
    assert_eq!(out.response["allowed"], true);
    let patched = pod(out.patched.as_ref().expect("a patch"));
    let original = pod(&serde_json::from_slice::<Value>(&fixture("deployment-pod.json")).unwrap()["request"]["object"]);

    assert_eq!(init_names(&patched), ["weft-proxy"]);
    let proxy = proxy_of(&patched);
    assert_eq!(proxy.restart_policy.as_deref(), Some("Always"), "a native sidecar");
    assert_eq!(arg_after(&proxy, "--register-cluster").as_deref(), Some("ranker-a"), "from app.kubernetes.io/name");
    assert_eq!(arg_after(&proxy, "--register-variant").as_deref(), Some("a"));
    assert_eq!(arg_after(&proxy, "--register-label").as_deref(), Some("model=ranker-v3"));
    assert_eq!(arg_after(&proxy, "--register-address").as_deref(), Some("$(POD_IP):15006"));
    assert_eq!(arg_after(&proxy, "--xds").as_deref(), Some("weft-control.weft-system.svc:7701"));
    assert!(arg_after(&proxy, "--xds-ca").is_none(), "no CA configured, plaintext xDS");
    let sc = proxy.security_context.as_ref().unwrap();
    assert_eq!((sc.run_as_non_root, sc.read_only_root_filesystem), (Some(true), Some(true)));

    let cfg = bootstrap_of(&proxy);
    let local = cfg.clusters.iter().find(|c| c.name == "ranker-a-local").unwrap();
    assert_eq!(local.endpoints, ["127.0.0.1:8000"], "weft.dev/port: http names container port 8000");
    assert_eq!(cfg.admin.metrics_address.as_deref(), Some("0.0.0.0:15090"));
    assert_eq!(cfg.node.team, "models");

    // Everything else is as it was: the model container, volumes, the rest of the metadata.
    let (ps, os) = (patched.spec.as_ref().unwrap(), original.spec.as_ref().unwrap());
    assert_eq!(ps.containers, os.containers);
    assert_eq!(ps.volumes, os.volumes);
    let ann = patched.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann.get("weft.dev/injected").map(String::as_str), Some(inject::VERSION));
    assert_eq!(ann.len(), original.metadata.annotations.as_ref().unwrap().len() + 1);
    validate("deployment-pod", out.patched.as_ref().unwrap());
}

#[test]
fn an_existing_init_container_runs_after_the_sidecar_and_the_redirect_step() {
    // weft.dev/redirect: iptables needs an image with iptables; without one the pod is denied.
    let out = run(&Settings::default(), &fixture("with-init-container.json"));
    assert_eq!(out.response["allowed"], false);
    let msg = out.response["status"]["message"].as_str().unwrap();
    assert!(msg.contains("weft.dev/redirect") && msg.contains("--redirect-image"), "{msg}");
    let settings = Settings { redirect_image: Some("registry.example.com/iptables:1.8".into()), ..Settings::default() };
    let out = run(&settings, &fixture("with-init-container.json"));
    let patched = pod(out.patched.as_ref().expect("a patch"));
    assert_eq!(init_names(&patched), ["weft-redirect", "weft-proxy", "fetch-weights"]);
    let init = patched.spec.as_ref().unwrap().init_containers.as_ref().unwrap();
    let redirect = init[0].command.as_ref().unwrap().join(" ");
    assert!(redirect.ends_with("PREROUTING -p tcp --dport 8000 -j REDIRECT --to-ports 15006"), "{redirect}");
    assert_eq!(init[0].image.as_deref(), Some("registry.example.com/iptables:1.8"));
    assert_eq!(init[2].image.as_deref(), Some("registry.example.com/fetch:1.2"), "the pod's own step is kept");
    let res = proxy_of(&patched).resources.unwrap();
    let req = res.requests.unwrap();
    assert_eq!((req["cpu"].0.as_str(), req["memory"].0.as_str()), ("250m", "256Mi"));
    assert_eq!(res.limits.unwrap()["memory"].0, "256Mi");
    validate("with-init-container", out.patched.as_ref().unwrap());
}

#[test]
fn an_injected_pod_sent_again_is_admitted_unchanged() {
    let first = run(&Settings::default(), &fixture("deployment-pod.json"));
    let mut again: Value = serde_json::from_slice(&fixture("deployment-pod.json")).unwrap();
    again["request"]["object"] = first.patched.unwrap();
    let body = serde_json::to_vec(&again).unwrap();
    let (decision, _) = inject::review(&Settings::default(), &body);
    assert_eq!(decision, Decision::Unchanged("already injected"));
    let out = run(&Settings::default(), &body);
    assert_eq!(out.response["allowed"], true);
    assert!(out.patched.is_none(), "no patch the second time");

    // A sidecar added by hand (no marker annotation) is not doubled either.
    let mut by_hand: Value = serde_json::from_slice(&fixture("deployment-pod.json")).unwrap();
    by_hand["request"]["object"]["spec"]["containers"][0]["name"] = "weft-proxy".into();
    assert!(run(&Settings::default(), &serde_json::to_vec(&by_hand).unwrap()).patched.is_none());
}

#[test]
fn an_opted_out_pod_is_admitted_unchanged() {
    let out = run(&Settings::default(), &fixture("opt-out.json"));
    assert_eq!(out.response["allowed"], true);
    assert!(out.patched.is_none());
}

#[test]
fn a_bad_annotation_denies_the_pod_naming_it_and_its_value() {
    let out = run(&Settings::default(), &fixture("bad-port.json"));
    assert_eq!(out.response["allowed"], false);
    assert!(out.patched.is_none(), "never a half-patched pod");
    let status = &out.response["status"];
    assert_eq!(status["code"], 400);
    let msg = status["message"].as_str().unwrap();
    assert!(msg.contains("weft.dev/port") && msg.contains("\"grpc\""), "{msg}");
}

#[test]
fn an_unreadable_pod_is_denied_under_its_uid() {
    let mut body: Value = serde_json::from_slice(&fixture("deployment-pod.json")).unwrap();
    body["request"]["object"]["spec"]["containers"] = "not a list".into();
    let out = run(&Settings::default(), &serde_json::to_vec(&body).unwrap());
    assert_eq!(out.response["allowed"], false);
    let msg = out.response["status"]["message"].as_str().unwrap();
    assert!(msg.contains("cannot be read"), "{msg}");

    // Not even a uid: still an AdmissionReview answer, denied.
    let (decision, out) = inject::review(&Settings::default(), b"{\"kind\": 3}");
    assert!(matches!(decision, Decision::Denied(_)));
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["response"]["allowed"], false);
}

#[test]
fn a_mesh_ca_is_mounted_and_xds_goes_over_tls() {
    let settings = Settings { xds_ca_config_map: Some("weft-mesh-ca".into()), ..Settings::default() };
    let out = run(&settings, &fixture("deployment-pod.json"));
    let patched = pod(out.patched.as_ref().unwrap());
    let proxy = proxy_of(&patched);
    assert_eq!(arg_after(&proxy, "--xds-ca").as_deref(), Some("/etc/weft/ca/ca.crt"));
    let vols = patched.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    assert_eq!(vols.last().unwrap().config_map.as_ref().unwrap().name, "weft-mesh-ca");
    assert_eq!(vols.len(), 2, "the service account volume is kept");
    validate("with-ca", out.patched.as_ref().unwrap());
}

/// `kubernetes-validate --strict` on a patched pod, as the API server's schema would check it.
fn validate(name: &str, pod: &Value) {
    if !common::have_validator() {
        return;
    }
    // A ReplicaSet's pod reaches admission with only a generateName; the API server names it
    // afterwards, and the validator needs the name.
    let mut pod = pod.clone();
    if pod["metadata"].get("name").is_none() {
        pod["metadata"]["name"] = format!("{}x7k2p", pod["metadata"]["generateName"].as_str().unwrap_or("pod-")).into();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{name}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(&pod).unwrap()).unwrap();
    common::validate_files(&[&file]);
}

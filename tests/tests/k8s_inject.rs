//! An injected pod's sidecar, run for real: the injector patches a real AdmissionReview pod,
//! and the weft-proxy container it added is started the way the kubelet would start it (its
//! command, args with `$(VAR)` expanded from its env, its env with the downward-API fields
//! filled in) beside a model server, against a real weft-control. The container's own probes
//! pass, inbound traffic reaches the model server on loopback, and the control plane lists the
//! pod's registration with the variant and model from its annotations.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::Value;
use weft_k8s::inject::{self, Settings, sidecar};
use weft_tests::procs::{Child, ControlProc, api, free_port, wait_for};
use weft_tests::{client, workspace_bin};

const POD_NAME: &str = "ranker-a-6d8f9c7b54-x7k2p";

/// What the kubelet does with `$(VAR)` in args: the container's env values substituted.
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    env.iter().fold(arg.to_string(), |a, (k, v)| a.replace(&format!("$({k})"), v))
}

/// The container's env as the kubelet would set it: literal values, and the downward-API
/// fields this pod would have.
fn env_of(c: &Container) -> BTreeMap<String, String> {
    let fields = BTreeMap::from([("metadata.name", POD_NAME), ("metadata.namespace", "models"), ("status.podIP", "127.0.0.1")]);
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(src)) => fields[src.field_ref.as_ref().unwrap().field_path.as_str()].to_string(),
                _ => String::new(),
            };
            (e.name.clone(), v)
        })
        .collect()
}

fn probe_url(c: &Container, which: &str) -> String {
    let p = match which {
        "startup" => c.startup_probe.as_ref(),
        _ => c.readiness_probe.as_ref(),
    }
    .and_then(|p| p.http_get.as_ref())
    .unwrap();
    let port = match &p.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => *n,
        other => panic!("a named probe port {other:?}"),
    };
    format!("http://127.0.0.1:{port}{}", p.path.as_deref().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_sidecar_starts_serves_and_registers() {
    let root = tempfile::tempdir().unwrap();
    let control = ControlProc::start(1, root.path(), true, None);
    let c = client();
    wait_for("a leader", Duration::from_secs(20), || async {
        control.status(&c).await.filter(|s| s["leader"] == 1).map(|_| ())
    })
    .await;

    let model = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _model = Child(
        Command::new(workspace_bin("weft-model-sim"))
            .args(["--listen", &model.to_string(), "--model", "ranker", "--latency-ms", "1"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The real fixture's pod, its model port moved to where the simulator listens; the
    // sidecar's ports picked free so tests can run side by side.
    let mut review: Value =
        serde_json::from_slice(&std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../k8s/tests/fixtures/deployment-pod.json")).unwrap())
            .unwrap();
    review["request"]["object"]["spec"]["containers"][0]["ports"][0]["containerPort"] = model.port().into();
    let settings = Settings {
        xds: vec![control.xds.to_string()],
        inbound_port: free_port(),
        outbound_port: free_port(),
        metrics_port: free_port(),
        admin_port: free_port(),
        ..Settings::default()
    };
    let (_, out) = inject::review(&settings, &serde_json::to_vec(&review).unwrap());
    let resp: Value = serde_json::from_slice(&out).unwrap();
    let bytes: Vec<u8> = serde_json::from_value(resp["response"]["patch"].clone()).expect("a patch");
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let proxy = pod.spec.unwrap().init_containers.unwrap().into_iter().find(|c| c.name == sidecar::CONTAINER).unwrap();

    let env = env_of(&proxy);
    let command = proxy.command.clone().unwrap();
    assert_eq!(command, ["weft-proxy"]);
    let args: Vec<String> = proxy.args.iter().flatten().map(|a| expand(a, &env)).collect();
    let _sidecar = Child(
        Command::new(workspace_bin("weft-proxy"))
            .args(&args)
            .args(["--report-interval", "200ms", "--log", "warn"])
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The container's own probes, as the kubelet would call them.
    for which in ["startup", "readiness"] {
        let url = probe_url(&proxy, which);
        wait_for(&format!("the {which} probe {url} passes"), Duration::from_secs(20), || async {
            let req = http::Request::get(url.as_str()).body(weft_tests::full("")).unwrap();
            c.request(req).await.ok().filter(|r| r.status() == 200).map(|_| ())
        })
        .await;
    }

    // Inbound: the sidecar's port reaches the model server on loopback.
    let inbound = SocketAddr::from(([127, 0, 0, 1], settings.inbound_port));
    let (st, body) = api(&c, Method::GET, inbound, "/v2/models/ranker", None).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["platform"], "weft-model-sim");

    // The control plane lists the pod, registered as the annotations asked.
    let node_id = format!("{POD_NAME}.models");
    let reg = wait_for("the sidecar's registration", Duration::from_secs(20), || async {
        let (_, v) = api(&c, Method::GET, control.api, "/v1/proxies", None).await;
        v["items"].as_array()?.iter().find(|p| p["node_id"] == node_id.as_str()).and_then(|p| {
            let r = p["registration"].clone();
            (!r.is_null()).then_some(r)
        })
    })
    .await;
    assert_eq!(reg["cluster"], "ranker-a");
    assert_eq!(reg["variant"], "a");
    assert_eq!(reg["address"], inbound.to_string());
    assert_eq!(reg["labels"]["model"], "ranker-v3");
    assert_eq!(reg["labels"]["team"], "models", "the namespace, from the bootstrap's node");
}

/// The flags the injected containers and the StatefulSet use refuse bad values by name.
#[test]
fn the_kubernetes_flags_name_what_is_wrong() {
    let run = |bin: &str, args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(workspace_bin(bin)).args(args).envs(env.iter().copied()).stdin(Stdio::null()).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run("weft-proxy", &[], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--config") && err.contains("--config-env"), "{err}");
    let (code, err) = run("weft-proxy", &["--config-env", "WEFT_TEST_NO_SUCH_VAR"], &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--config-env WEFT_TEST_NO_SUCH_VAR"), "{err}");
    let yaml = "listeners: [{name: in, address: \"127.0.0.1:15006\", direction: inbound}]\n";
    let (code, err) = run("weft-proxy", &["--config-env", "B", "--config", "x.yaml"], &[("B", yaml)]);
    assert_ne!(code, Some(0), "both at once is refused: {err}");
    let (code, err) = run(
        "weft-proxy",
        &["--config-env", "B", "--xds", "127.0.0.1:1", "--register-cluster", "c", "--register-label", "model"],
        &[("B", yaml)],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("--register-label") && err.contains("\"model\""), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = run("weft-control", &["--pod-index", "1", "--data-dir", dir.path().to_str().unwrap()], &[]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--pod-index 1") && err.contains("--join"), "{err}");
}

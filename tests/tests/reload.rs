//! Hot reload (in-process and through the real binary: file change, SIGHUP), invalid configs
//! rejected while the old one keeps serving, the admin API, drain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use weft_tests::procs::{Child, free_port};
use weft_tests::*;

fn config(admin: &str, listen: &str, a: &Upstream, b: &Upstream, wa: u32, wb: u32) -> String {
    format!(
        r#"
admin: {{address: "{admin}"}}
listeners: [{{name: out, address: "{listen}"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, experiment: e}}]}}]
experiments:
  - name: e
    variants: [{{name: a, cluster: a, weight: {wa}}}, {{name: b, cluster: b, weight: {wb}}}]
clusters: [{{name: a, endpoints: ["{}"]}}, {{name: b, endpoints: ["{}"]}}]
"#,
        a.addr, b.addr
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_reloads_during_steady_traffic_lose_nothing() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&config("127.0.0.1:0", "127.0.0.1:0", &a, &b, 1, 0));
    let addr = p.listener_addrs[0];
    let (admin, listen) = (p.admin_addr.to_string(), addr.to_string());
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        load.spawn(async move {
            let c = client();
            while !stop.load(SeqCst) {
                let (s, _, _) = get(&c, addr, "s", "/", &[]).await;
                sent.fetch_add(1, SeqCst);
                if s != 200 {
                    failed.fetch_add(1, SeqCst);
                }
            }
        });
    }
    for i in 0..50u32 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let v = p.reload(weft_proxy::Config::from_yaml(&config(&admin, &listen, &a, &b, 50 - i, i + 1)).unwrap()).unwrap();
        assert_eq!(v, 2 + i as u64);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, SeqCst);
    while load.join_next().await.is_some() {}
    let n = sent.load(SeqCst);
    assert!(n > 200, "traffic kept flowing: {n}");
    assert_eq!(failed.load(SeqCst), 0, "{} of {n} requests failed across 50 reloads", failed.load(SeqCst));
    assert_eq!(a.hits() + b.hits(), n);
    assert!(b.hits() > 0 && a.hits() > 0, "the changing weights took effect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_reload_is_rejected_and_old_config_serves() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&config("127.0.0.1:0", "127.0.0.1:0", &a, &b, 1, 0));
    let (admin, listen) = (p.admin_addr.to_string(), p.listener_addrs[0].to_string());
    // The same file as at start (":0" ports) is "unchanged listeners", not a move.
    assert_eq!(p.reload(weft_proxy::Config::from_yaml(&config("127.0.0.1:0", "127.0.0.1:0", &a, &b, 1, 0)).unwrap()), Ok(2));
    let moved = config(&admin, "127.0.0.1:1", &a, &b, 1, 0);
    let err = p.reload(weft_proxy::Config::from_yaml(&moved).unwrap()).unwrap_err();
    assert!(err.contains("listeners"), "{err}");
    let bad = config(&admin, &listen, &a, &b, 1, 0).replace("cluster: b, weight", "cluster: nope, weight");
    let err = p.reload(weft_proxy::Config::from_yaml(&bad).unwrap()).unwrap_err();
    assert!(err.contains("unknown cluster \"nope\""), "{err}");
    let (s, h, _) = get(&client(), p.listener_addrs[0], "s", "/", &[]).await;
    assert_eq!((s.as_u16(), h["x-weft-variant"].to_str().unwrap()), (200, "a"));
    let dump: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["version"], 2);
    assert_eq!(dump["config"]["listeners"][0]["address"], listen.as_str(), "config_dump shows the bound address");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_config_reloads_total", &[("result", "rejected")]), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_serves_probes_and_the_scrape_but_not_the_admin_api() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let yaml = config("127.0.0.1:0", "127.0.0.1:0", &a, &b, 1, 0).replace(
        r#"admin: {address: "127.0.0.1:0"}"#,
        r#"admin: {address: "127.0.0.1:0", metrics_address: "127.0.0.1:0"}"#,
    );
    let p = start_proxy(&yaml);
    let m = p.metrics_addr.expect("metrics listener bound");
    assert_ne!(m, p.admin_addr);
    assert_eq!(get(&client(), p.listener_addrs[0], "s", "/", &[]).await.0, 200);
    let (s, text) = admin_get(m, "/metrics").await;
    assert_eq!(s, 200);
    assert_eq!(metric_sum(&text, "weft_requests_total", &[("variant", "a")]), 1.0, "{text}");
    assert_eq!(admin_get(m, "/ready").await.0, 200);
    assert_eq!(admin_get(m, "/live").await.0, 200);
    // Nothing that reveals config or changes state.
    for path in ["/config_dump", "/clusters", "/drain"] {
        let (s, body) = admin_get(m, path).await;
        assert_eq!(s, 404, "{path}: {body}");
        assert!(body.contains("admin.address"), "the 404 points at the admin API: {body}");
    }
    let post = http::Request::post(format!("http://{m}/drain")).body(full(bytes::Bytes::new())).unwrap();
    assert_eq!(client().request(post).await.unwrap().status(), 404);
    assert_eq!(admin_get(m, "/ready").await.0, 200, "a POST /drain to the metrics listener does not drain");
    let post = http::Request::post(format!("http://{m}/metrics")).body(full(bytes::Bytes::new())).unwrap();
    let refused = client().request(post).await.unwrap();
    assert_eq!(refused.status(), 405);
    assert_eq!(refused.headers()["allow"], "GET, HEAD");
    // HEAD (uptime checkers, Prometheus' own probes) answers as GET would, without the body;
    // on both listeners.
    for at in [m, p.admin_addr] {
        for path in ["/metrics", "/ready", "/live"] {
            let head = http::Request::head(format!("http://{at}{path}")).body(full(bytes::Bytes::new())).unwrap();
            let resp = client().request(head).await.unwrap();
            assert_eq!(resp.status(), 200, "HEAD {path} on {at}");
            use http_body_util::BodyExt;
            assert!(resp.into_body().collect().await.unwrap().to_bytes().is_empty());
        }
    }
    // The admin API shows the bound address; a reload may not move it.
    let dump: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["config"]["admin"]["metrics_address"], m.to_string().as_str());
    assert_eq!(p.reload(weft_proxy::Config::from_yaml(&yaml).unwrap()), Ok(2), "the same file (:0) is unchanged");
    let moved = yaml.replace(r#"metrics_address: "127.0.0.1:0""#, r#"metrics_address: "127.0.0.1:1""#);
    let err = p.reload(weft_proxy::Config::from_yaml(&moved).unwrap()).unwrap_err();
    assert!(err.contains("admin.metrics_address"), "{err}");
    assert_eq!(admin_get(m, "/metrics").await.0, 200, "still served after the rejected reload");
}

async fn wait_ready(admin: &str) {
    for _ in 0..100 {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(admin)).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("proxy admin {admin} never came up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_reloads_on_file_change_and_sighup_and_drains() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let dir = std::env::temp_dir().join(format!("weft-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("proxy.yaml");
    let (admin, listen) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    std::fs::write(&path, config(&admin, &listen, &a, &b, 1, 0)).unwrap();
    let child = std::process::Command::new(workspace_bin("weft-proxy"))
        .args(["--config", path.to_str().unwrap(), "--watch-interval", "100ms", "--log", "warn"])
        .spawn()
        .unwrap();
    let mut child = Child(child);
    wait_ready(&admin).await;
    let admin_addr: std::net::SocketAddr = admin.parse().unwrap();
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let variant = || async { get(&client(), addr, "s", "/", &[]).await.1["x-weft-variant"].to_str().unwrap().to_string() };
    assert_eq!(variant().await, "a");

    // File change → picked up by polling.
    std::fs::write(&path, config(&admin, &listen, &a, &b, 0, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(variant().await, "b");

    // An invalid file is rejected; the running config keeps serving.
    std::fs::write(&path, "listeners: [ this is not valid").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(variant().await, "b");

    // SIGHUP rereads (same content as a previous version, so polling alone would not notice).
    std::fs::write(&path, config(&admin, &listen, &a, &b, 1, 0)).unwrap();
    let _ = std::process::Command::new("kill").args(["-HUP", &child.0.id().to_string()]).status();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(variant().await, "a");
    let dump: serde_json::Value = serde_json::from_str(&admin_get(admin_addr, "/config_dump").await.1).unwrap();
    assert!(dump["version"].as_u64().unwrap() >= 3, "{dump}");

    // Admin API and drain.
    assert_eq!(admin_get(admin_addr, "/live").await.0, 200);
    assert_eq!(admin_get(admin_addr, "/ready").await.0, 200);
    let clusters = admin_get(admin_addr, "/clusters").await.1;
    assert!(clusters.contains(&a.addr.to_string()), "{clusters}");
    let post = http::Request::post(format!("http://{admin}/drain")).body(full(bytes::Bytes::new())).unwrap();
    assert_eq!(client().request(post).await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(admin_get(admin_addr, "/ready").await.0, 503, "not ready once draining");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "listener closed");

    // SIGTERM exits cleanly.
    let _ = std::process::Command::new("kill").arg(child.0.id().to_string()).status();
    let status = tokio::task::spawn_blocking(move || child.0.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A telemetry section that cannot be set up again (the access log's directory is gone) does
/// not block unrelated changes while it is unchanged: over xDS that would NACK every push.
/// Changing the section to something that cannot be set up is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_telemetry_section_that_cannot_be_reopened_does_not_block_reloads() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("logs");
    std::fs::create_dir(&log).unwrap();
    let with_log = |wa, wb, sample: &str| {
        config("127.0.0.1:0", "127.0.0.1:0", &a, &b, wa, wb)
            + &format!("telemetry: {{access_log: {{enabled: true, sample: {sample}, path: \"{}\"}}}}\n", log.join("access.log").display())
    };
    let p = start_proxy(&with_log(1, 0, "1.0"));
    std::fs::remove_dir_all(&log).unwrap();
    let v = p.reload(weft_proxy::Config::from_yaml(&with_log(0, 1, "1.0")).unwrap());
    assert_eq!(v, Ok(2), "only the weights changed");
    let (s, h, _) = get(&client(), p.listener_addrs[0], "s", "/", &[]).await;
    assert_eq!((s.as_u16(), h["x-weft-variant"].to_str().unwrap()), (200, "b"));
    let err = p.reload(weft_proxy::Config::from_yaml(&with_log(0, 1, "0.5")).unwrap()).unwrap_err();
    assert!(err.contains("telemetry.access_log.path"), "{err}");
}

/// An endpoint's and a cluster's metrics leave `/metrics` with them: once a reload removes one
/// (and no request holds it), its gauges and counters are gone, not frozen at their last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_endpoints_and_clusters_leave_the_metrics() {
    let (a, b, c) = (Upstream::start("a").await, Upstream::start("b").await, Upstream::start("c").await);
    let p = start_proxy(&config("127.0.0.1:0", "127.0.0.1:0", &a, &b, 1, 0));
    let ejected = |m: &str, up: &Upstream| m.lines().any(|l| l.starts_with("weft_endpoint_ejected{") && l.contains(&format!("endpoint=\"{}\"", up.addr)));
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(ejected(&m, &a) && ejected(&m, &b), "{m}");
    assert_eq!(metric_sum(&m, "weft_outlier_ejections_total", &[("endpoint", &a.addr.to_string())]), 0.0);
    // Cluster b now points at c.
    let (admin, listen) = (p.admin_addr.to_string(), p.listener_addrs[0].to_string());
    let cfg = config(&admin, &listen, &a, &b, 1, 0).replace(&format!("\"{}\"", b.addr), &format!("\"{}\"", c.addr));
    p.reload(weft_proxy::Config::from_yaml(&cfg).unwrap()).unwrap();
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(ejected(&m, &a) && ejected(&m, &c), "{m}");
    assert!(!m.contains(&format!("endpoint=\"{}\"", b.addr)), "b is gone from the metrics: {m}");
    assert_eq!(m.matches("# TYPE weft_endpoint_ejected gauge").count(), 1);
    // A cluster removed (b renamed b2) takes its breaker, overflow and in-flight series along.
    let state = |m: &str, cluster: &str| m.lines().any(|l| l.starts_with("weft_circuit_breaker_state{") && l.contains(&format!("cluster=\"{cluster}\"")));
    assert!(state(&m, "b"), "{m}");
    // So does a variant (b renamed b2): its in-flight and shed series.
    assert!(m.contains("weft_variant_requests_in_flight{") && m.contains("variant=\"b\""), "{m}");
    let renamed = cfg.replace("{name: b, cluster: b,", "{name: b2, cluster: b2,").replace("{name: b, endpoints", "{name: b2, endpoints");
    p.reload(weft_proxy::Config::from_yaml(&renamed).unwrap()).unwrap();
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(state(&m, "a") && state(&m, "b2"), "{m}");
    assert!(!m.contains("cluster=\"b\""), "cluster b is gone from the metrics: {m}");
    assert!(!m.contains("variant=\"b\"") && m.contains("variant=\"b2\""), "variant b is gone from the metrics: {m}");
}

//! Routing and A/B assignment through a real proxy to real upstreams on loopback.

use std::collections::HashMap;
use weft_tests::*;

fn ab_config(a: &Upstream, b: &Upstream, experiment_extra: &str, weights: (u32, u32)) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - name: ranker
    hosts: [ranker]
    routes:
      - {{name: infer, match: {{path_prefix: /v2/models/}}, experiment: ab}}
      - {{name: other, match: {{path_prefix: /}}, cluster: a}}
experiments:
  - name: ab
    salt: s1
    variants:
      - {{name: a, cluster: a, weight: {wa}}}
      - {{name: b, cluster: b, weight: {wb}}}
{experiment_extra}
clusters:
  - {{name: a, endpoints: ["{}"]}}
  - {{name: b, endpoints: ["{}"]}}
"#,
        a.addr,
        b.addr,
        wa = weights.0,
        wb = weights.1
    )
}

/// Send `n` requests with up to 32 in flight; count the variant each got.
async fn split(addr: std::net::SocketAddr, n: usize, headers: impl Fn(usize) -> Vec<(String, String)>) -> HashMap<String, usize> {
    let c = client();
    let mut counts = HashMap::new();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        if set.len() >= 32 {
            let v: String = set.join_next().await.unwrap().unwrap();
            *counts.entry(v).or_default() += 1;
        }
        let c = c.clone();
        let h = headers(i);
        set.spawn(async move {
            let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let (s, headers, _) = get(&c, addr, "ranker", "/v2/models/m/infer", &hs).await;
            assert_eq!(s, 200);
            headers["x-weft-variant"].to_str().unwrap().to_string()
        });
    }
    while let Some(v) = set.join_next().await {
        *counts.entry(v.unwrap()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_hold_within_chi_square_over_10000_requests() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (70, 30)));
    let n = 10_000;
    let counts = split(p.listener_addrs[0], n, |_| vec![]).await;
    let (oa, ob) = (counts["a"] as f64, counts["b"] as f64);
    let (ea, eb) = (0.7 * n as f64, 0.3 * n as f64);
    let chi2 = (oa - ea).powi(2) / ea + (ob - eb).powi(2) / eb;
    // 1 degree of freedom: P(chi2 > 10.83) = 0.001.
    assert!(chi2 < 10.83, "a={oa} b={ob} chi2={chi2}");
    assert_eq!(a.hits() + b.hits(), n as u64, "every request reached exactly one upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_id_always_gets_the_same_variant() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "    unit_header: x-user-id", (50, 50)));
    let c = client();
    let mut seen: HashMap<String, String> = HashMap::new();
    for round in 0..5 {
        for u in 0..100 {
            let user = format!("user-{u}");
            let (_, h, _) = get(&c, p.listener_addrs[0], "ranker", "/v2/models/m/infer", &[("x-user-id", &user)]).await;
            let v = h["x-weft-variant"].to_str().unwrap().to_string();
            if round == 0 {
                seen.insert(user, v);
            } else {
                assert_eq!(seen[&user], v, "{user} switched variant in round {round}");
            }
        }
    }
    let bs = seen.values().filter(|v| *v == "b").count();
    assert!((25..=75).contains(&bs), "sticky split is still ~50/50: b={bs}/100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strata_override_and_disabled_override() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let extra = "    stratify: {header: x-tenant-id, weights: {gold: {b: 1}}}";
    let p = start_proxy(&ab_config(&a, &b, extra, (100, 0)));
    let addr = p.listener_addrs[0];
    let gold = split(addr, 200, |_| vec![("x-tenant-id".into(), "gold".into())]).await;
    assert_eq!(gold.get("b"), Some(&200), "the gold stratum uses its own weights");
    let plain = split(addr, 200, |_| vec![]).await;
    assert_eq!(plain.get("a"), Some(&200));
    let forced = split(addr, 20, |_| vec![("x-weft-variant".into(), "b".into())]).await;
    assert_eq!(forced.get("b"), Some(&20), "override header forces the variant");

    let locked = start_proxy(&ab_config(&a, &b, "    allow_override: false", (100, 0)));
    let ignored = split(locked.listener_addrs[0], 20, |_| vec![("x-weft-variant".into(), "b".into())]).await;
    assert_eq!(ignored.get("a"), Some(&20), "override ignored when disabled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_host_and_route_get_json_404_naming_them() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (1, 1)));
    let c = client();
    let (s, h, body) = get(&c, p.listener_addrs[0], "nosuch.svc", "/", &[]).await;
    assert_eq!(s, 404);
    assert_eq!(h["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"], "unknown_host");
    assert_eq!(v["host"], "nosuch.svc");
    assert_eq!(a.hits() + b.hits(), 0);
}

/// A client that writes its whole request before reading (Python's http.client, urllib3) must
/// still read a local answer given before its body ended: the proxy closes its side and keeps
/// reading, instead of closing with the body unread, which resets the connection under the
/// client's write and loses the 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_uploading_reads_the_early_404() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (1, 1)));
    let body = vec![b'x'; 16 << 20];
    let mut s = tokio::net::TcpStream::connect(p.listener_addrs[0]).await.unwrap();
    let head = format!("POST /upload HTTP/1.1\r\nHost: nosuch.svc\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.unwrap();
    let wrote = s.write_all(&body).await;
    assert!(wrote.is_ok(), "the upload was cut by a reset: {wrote:?}");
    let mut resp = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut resp)).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(matches!(read, Ok(Ok(_))), "reading the answer: {read:?} after {text:?}");
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    assert!(text.contains("unknown_host"), "{text}");
    assert_eq!(a.hits() + b.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_http_400_and_oversized_headers_431() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (1, 1)));
    let addr = p.listener_addrs[0];
    let garbage = raw(addr, b"GET / HTTP/1.1\r\nHost ranker\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    let big = format!("GET / HTTP/1.1\r\nHost: ranker\r\nx-big: {}\r\n\r\n", "a".repeat(100_000));
    let resp = raw(addr, big.as_bytes()).await;
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
    let no_host = raw(addr, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(no_host.starts_with("HTTP/1.0 400") || no_host.starts_with("HTTP/1.1 400"), "{no_host}");
    assert!(no_host.contains("missing_host"), "{no_host}");
    // The proxy still serves after all that.
    let (s, _, _) = get(&client(), addr, "ranker", "/x", &[]).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_model_name_and_traceparent() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let extra = "";
    let mut cfg = ab_config(&a, &b, extra, (1, 0));
    cfg = cfg.replace("match: {path_prefix: /v2/models/}", "match: {path_prefix: /v2/models/, model: resnet}");
    let p = start_proxy(&cfg);
    let c = client();
    let addr = p.listener_addrs[0];
    let (_, h, _) = get(&c, addr, "ranker", "/v2/models/resnet/infer", &[]).await;
    assert_eq!(h["x-weft-variant"], "a", "the model route matched");
    let (_, h, _) = get(&c, addr, "ranker", "/v2/models/bert/infer", &[]).await;
    assert!(h.get("x-weft-variant").is_none(), "another model falls through to the default route");

    // traceparent: created when absent, continued (same trace id, new span) when present.
    let (_, _, body) = get(&c, addr, "ranker", "/headers", &[]).await;
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let tp = seen["traceparent"].as_str().unwrap();
    assert_eq!(tp.len(), 55, "{tp}");
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (_, _, body) = get(&c, addr, "ranker", "/headers", &[("traceparent", incoming)]).await;
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let tp = seen["traceparent"].as_str().unwrap();
    assert!(tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && !tp.contains("00f067aa0ba902b7"), "{tp}");
    let metrics = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(metric_sum(&metrics, "weft_requests_total", &[("model_name", "resnet"), ("variant", "a")]) >= 1.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_and_tenant_cardinality_cap() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let log = std::env::temp_dir().join(format!("weft-access-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let extra = format!("telemetry: {{tenant_top_n: 2, access_log: {{enabled: true, sample: 1.0, path: \"{}\"}}}}", log.display());
    let cfg = format!("{}\n{extra}\n", ab_config(&a, &b, "", (1, 0)));
    let p = start_proxy(&cfg);
    let c = client();
    for t in ["t1", "t2", "t3", "t4", "t1"] {
        let (s, _, _) = get(&c, p.listener_addrs[0], "ranker", "/v2/models/m/infer", &[("x-tenant-id", t)]).await;
        assert_eq!(s, 200);
    }
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "t1")]), 2.0, "{m}");
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "other")]), 2.0, "t3 and t4 are over the cap");
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "t3")]), 0.0);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["variant"], "a");
    assert_eq!(lines[0]["model_name"], "m");
    assert_eq!(lines[0]["status_class"], "2xx");
    assert_eq!(lines[0]["trace_id"].as_str().unwrap().len(), 32);
    let _ = std::fs::remove_file(&log);
}

/// A request series idle for `retain_idle` leaves `/metrics`; a busy one stays; an idle one
/// that sees traffic again starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_request_series_leave_the_metrics() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let cfg = format!("{}\ntelemetry: {{retain_idle: 1s}}\n", ab_config(&a, &b, "", (1, 0)));
    let p = start_proxy(&cfg);
    let c = client();
    let send = |tenant: &'static str| {
        let c = c.clone();
        let addr = p.listener_addrs[0];
        async move { assert_eq!(get(&c, addr, "ranker", "/v2/models/m/infer", &[("x-tenant-id", tenant)]).await.0, 200) }
    };
    send("t1").await;
    send("t1").await;
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "t1")]), 2.0, "{m}");
    for _ in 0..16 {
        send("t2").await;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(!m.contains("tenant_id=\"t1\""), "t1's series, idle for 4 s, is gone: {m}");
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "t2")]), 16.0, "the busy series stays");
    send("t1").await;
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("tenant_id", "t1")]), 1.0, "a fresh series: {m}");
    assert_eq!(metric_sum(&m, "weft_request_duration_seconds_count", &[("tenant_id", "t1")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_read_timeout_closes_slow_clients_when_set() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let cfg = ab_config(&a, &b, "", (1, 0)).replace(
        "listeners: [{name: out, address: \"127.0.0.1:0\"}]",
        "listeners: [{name: out, address: \"127.0.0.1:0\", header_read_timeout: 300ms}]",
    );
    let p = start_proxy(&cfg);
    let mut s = tokio::net::TcpStream::connect(p.listener_addrs[0]).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: ranker\r\n").await.unwrap(); // never finishes the head
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(3), s.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "the slow connection was closed by the header read timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_never_take_the_proxy_down() {
    use rand::{Rng, SeedableRng};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (1, 0)));
    let addr = p.listener_addrs[0];
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pieces: [&[u8]; 8] = [b"GET ", b"POST ", b"/v2/models/m/infer", b" HTTP/1.1\r\n", b"Host: ranker\r\n", b"Content-Length: 5\r\n", b"\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"];
    for _ in 0..300 {
        // Mix protocol fragments with random bytes: closer to real garbage than pure noise.
        let mut input = Vec::new();
        for _ in 0..rng.random_range(1..8) {
            if rng.random_bool(0.5) {
                input.extend_from_slice(pieces[rng.random_range(0..pieces.len())]);
            } else {
                let n = rng.random_range(0..64);
                input.extend((0..n).map(|_| rng.random::<u8>()));
            }
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&input).await;
        let _ = s.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_millis(300), s.read_to_end(&mut out)).await;
    }
    let (s, _, _) = get(&client(), addr, "ranker", "/v2/models/m/infer", &[]).await;
    assert_eq!(s, 200, "still serving after 300 garbage connections");
    assert_eq!(admin_get(p.admin_addr, "/live").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_an_authority_gets_400() {
    // A catch-all service: without the check, any Host would reach a route, and one holding
    // `/` or `?` would choose the path an HTTP/2 upstream sees (the upstream URI is built from
    // the Host and the routed path).
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    let p = start_proxy(&ab_config(&a, &b, "", (1, 1)).replace("hosts: [ranker]", "hosts: [\"*\"]"));
    let c = client();
    for bad in ["svc/admin?", "svc#frag", "user@svc", "a b", "svc:port:80"] {
        let (s, _, body) = get(&c, p.listener_addrs[0], bad, "/public", &[]).await;
        assert_eq!(s, 400, "Host {bad:?}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"], "invalid_host", "Host {bad:?}: {v}");
    }
    assert_eq!(a.hits() + b.hits(), 0, "nothing invalid went upstream");
    for good in ["ranker", "ranker.ns.svc:8080", "127.0.0.1:80", "[::1]:8080", "xn--bcher-kva.example"] {
        let (s, _, _) = get(&c, p.listener_addrs[0], good, "/public", &[]).await;
        assert_eq!(s, 200, "Host {good:?}");
    }
}

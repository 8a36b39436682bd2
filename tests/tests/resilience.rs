//! Retries, retry budget, circuit breaker, outlier ejection, timeouts, overload shedding —
//! against real upstreams that a test can make fail, slow down or vanish.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};
use weft_tests::*;

fn cluster_config(eps: &[&Upstream], route_extra: &str, cluster_extra: &str) -> String {
    let eps: Vec<String> = eps.iter().map(|u| format!("\"{}\"", u.addr)).collect();
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - name: svc
    hosts: [svc]
    routes:
      - name: r
        match: {{path_prefix: /}}
        cluster: c
{route_extra}
clusters:
  - name: c
    endpoints: [{}]
{cluster_extra}
"#,
        eps.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_moves_to_another_endpoint() {
    let (bad, good) = (Upstream::start("bad").await, Upstream::start("good").await);
    bad.status.store(503, SeqCst);
    let retry = "        retry: {attempts: 3, backoff_base: 1ms, backoff_max: 5ms, budget_ratio: 1.0}";
    let p = start_proxy(&cluster_config(&[&bad, &good], retry, "    lb: round_robin"));
    let c = client();
    for _ in 0..20 {
        let (s, h, _) = get(&c, p.listener_addrs[0], "svc", "/", &[]).await;
        assert_eq!(s, 200);
        assert_eq!(h["x-upstream"], "good");
    }
    assert!(bad.hits() >= 5, "round robin sent first tries to the bad endpoint: {}", bad.hits());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_budget_caps_attempts_near_one_plus_ratio() {
    let up = Upstream::start("down").await;
    up.status.store(503, SeqCst);
    let retry = "        retry: {attempts: 5, backoff_base: 0ms, backoff_max: 0ms, budget_ratio: 0.2, budget_min_per_sec: 0}";
    let p = start_proxy(&cluster_config(&[&up], retry, ""));
    let c = client();
    let n = 1000;
    for _ in 0..n {
        let (s, _, _) = get(&c, p.listener_addrs[0], "svc", "/", &[]).await;
        assert_eq!(s, 503, "the upstream's 503 is passed on");
    }
    let per_request = up.hits() as f64 / n as f64;
    // Without a budget this would be 5.0 attempts per request.
    assert!((1.15..=1.25).contains(&per_request), "attempts per request {per_request}");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(metric_sum(&m, "weft_retry_budget_exhausted_total", &[("cluster", "c")]) > 0.0);
    assert!(metric_sum(&m, "weft_retries_total", &[("cluster", "c")]) >= 190.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_half_opens_and_closes() {
    let up = Upstream::start("flaky").await;
    let breaker = "    circuit_breaker: {error_rate: {threshold_pct: 50, min_requests: 10, window: 10s, open_duration: 500ms, half_open_probes: 2}}";
    let p = start_proxy(&cluster_config(&[&up], "", breaker));
    let c = client();
    let addr = p.listener_addrs[0];
    up.status.store(500, SeqCst);
    for _ in 0..10 {
        get(&c, addr, "svc", "/", &[]).await;
    }
    let (s, h, _) = get(&c, addr, "svc", "/", &[]).await;
    assert_eq!(s, 503);
    assert_eq!(h["x-weft-overflow"], "breaker_open");
    let hits_open = up.hits();
    for _ in 0..5 {
        get(&c, addr, "svc", "/", &[]).await;
    }
    assert_eq!(up.hits(), hits_open, "an open breaker sends nothing upstream");
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"circuit_breaker\": \"open\""), "{clusters}");

    // Upstream recovers; after open_duration the breaker half-opens and two good probes close it.
    up.status.store(0, SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"circuit_breaker\": \"half_open\""), "{clusters}");
    for _ in 0..2 {
        let (s, _, _) = get(&c, addr, "svc", "/", &[]).await;
        assert_eq!(s, 200);
    }
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"circuit_breaker\": \"closed\""), "{clusters}");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    for state in ["open", "half_open", "closed"] {
        assert!(metric_sum(&m, "weft_circuit_breaker_transitions_total", &[("state", state)]) >= 1.0, "{state}: {m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejected_endpoint_returns_after_its_ejection_time() {
    let (bad, good) = (Upstream::start("bad").await, Upstream::start("good").await);
    bad.status.store(502, SeqCst);
    let outlier = "    lb: round_robin\n    outlier: {consecutive_gateway_errors: 3, base_ejection_time: 700ms, max_ejection_pct: 50}";
    let p = start_proxy(&cluster_config(&[&bad, &good], "", outlier));
    let c = client();
    let addr = p.listener_addrs[0];
    for _ in 0..6 {
        get(&c, addr, "svc", "/", &[]).await;
    }
    assert_eq!(bad.hits(), 3, "ejected after 3 consecutive gateway errors");
    for _ in 0..20 {
        let (s, _, _) = get(&c, addr, "svc", "/", &[]).await;
        assert_eq!(s, 200, "only the healthy endpoint serves while the other is ejected");
    }
    assert_eq!(bad.hits(), 3);
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"healthy\": false"), "{clusters}");

    bad.status.store(0, SeqCst);
    tokio::time::sleep(Duration::from_millis(800)).await;
    for _ in 0..10 {
        get(&c, addr, "svc", "/", &[]).await;
    }
    assert!(bad.hits() > 3, "the endpoint returned after its ejection time");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_outlier_ejections_total", &[("cluster", "c")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_endpoint_503_and_timeouts_504() {
    let up = Upstream::start("slow").await;
    let p = start_proxy(&cluster_config(&[&up], "        timeout: 300ms", ""));
    let c = client();
    let addr = p.listener_addrs[0];
    up.delay_ms.store(2000, SeqCst);
    let t = Instant::now();
    let (s, h, body) = get(&c, addr, "svc", "/", &[]).await;
    assert_eq!(s, 504, "{body:?}");
    assert_eq!(h["x-weft-error"], "upstream_timeout");
    assert!(t.elapsed() < Duration::from_millis(1500));

    // A cluster whose only endpoint refuses connections: port 1 (tcpmux) is privileged and never
    // listened on here, so unlike a freed ephemeral port no parallel test can grab it.
    let addr_gone = "127.0.0.1:1";
    let cfg = format!(
        "admin: {{address: \"127.0.0.1:0\"}}\nlisteners: [{{name: out, address: \"127.0.0.1:0\"}}]\nservices: [{{name: s, hosts: [\"*\"], routes: [{{name: r, cluster: c}}]}}]\nclusters: [{{name: c, endpoints: [\"{addr_gone}\"], outlier: {{consecutive_gateway_errors: 1, max_ejection_pct: 100}}}}]\n"
    );
    let p2 = start_proxy(&cfg);
    let (s, _, body) = get(&c, p2.listener_addrs[0], "any", "/", &[]).await;
    assert_eq!(s, 503);
    assert!(String::from_utf8_lossy(&body).contains("upstream_connect_failure"), "{body:?}");
    let (s, _, body) = get(&c, p2.listener_addrs[0], "any", "/", &[]).await;
    assert_eq!(s, 503);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"], "no_healthy_endpoint", "{v}");
    assert!(v["message"].as_str().unwrap().contains("\"c\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variant_limit_sheds_excess_at_once() {
    let (a, b) = (Upstream::start("a").await, Upstream::start("b").await);
    a.delay_ms.store(500, SeqCst);
    let cfg = format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, experiment: e}}]}}]
experiments:
  - name: e
    variants:
      - {{name: a, cluster: a, weight: 1, max_concurrency: 2, max_pending: 2}}
      - {{name: b, cluster: b, weight: 0}}
clusters: [{{name: a, endpoints: ["{}"]}}, {{name: b, endpoints: ["{}"]}}]
"#,
        a.addr, b.addr
    );
    let p = start_proxy(&cfg);
    let addr = p.listener_addrs[0];
    let mut set = tokio::task::JoinSet::new();
    let admin = p.admin_addr;
    let watcher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        admin_get(admin, "/metrics").await.1
    });
    for _ in 0..10 {
        set.spawn(async move {
            let t = Instant::now();
            let (s, h, _) = get(&client(), addr, "s", "/", &[]).await;
            (s.as_u16(), h.get("x-weft-shed").map(|v| v.to_str().unwrap().to_string()), t.elapsed())
        });
    }
    let mut ok = 0;
    let mut shed = 0;
    while let Some(r) = set.join_next().await {
        let (s, why, took) = r.unwrap();
        match s {
            200 => ok += 1,
            503 => {
                shed += 1;
                assert_eq!(why.as_deref(), Some("variant_pending_full"));
                assert!(took < Duration::from_millis(400), "shed at once, not queued: {took:?}");
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, shed), (4, 6), "2 in flight + 2 pending served, the rest shed");
    let during = watcher.await.unwrap();
    assert_eq!(metric_sum(&during, "weft_variant_requests_in_flight", &[("variant", "a")]), 2.0, "{during}");
    let after = admin_get(admin, "/metrics").await.1;
    assert_eq!(metric_sum(&after, "weft_shed_total", &[("experiment", "e"), ("variant", "a")]), 6.0, "{after}");
    // Sibling variant unaffected: force b.
    let (s, _, _) = get(&client(), addr, "s", "/", &[("x-weft-variant", "b")]).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_body_is_replayed_on_retry_but_never_past_the_buffer() {
    let (bad, good) = (Upstream::start("bad").await, Upstream::start("good").await);
    bad.status.store(503, SeqCst);
    let retry = "        retry: {attempts: 2, backoff_base: 1ms, backoff_max: 1ms, budget_ratio: 1.0, buffer_bytes: 1024}";
    let p = start_proxy(&cluster_config(&[&bad, &good], retry, "    lb: round_robin"));
    let c = client();
    let post = |len: usize| {
        let req = http::Request::post(format!("http://{}/echo", p.listener_addrs[0]))
            .header("host", "svc")
            .body(full(vec![b'x'; len]))
            .unwrap();
        c.request(req)
    };
    // Small bodies: whichever endpoint comes first, the answer comes from `good` with the whole body.
    for _ in 0..6 {
        let r = post(512).await.unwrap();
        assert_eq!((r.status().as_u16(), r.headers()["x-body-len"].to_str().unwrap()), (200, "512"));
        assert_eq!(r.headers()["x-upstream"], "good");
    }
    // A body over buffer_bytes is not replayable: a 503 from `bad` is passed on, not retried.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(post(4096).await.unwrap().status().as_u16());
    }
    assert!(statuses.contains(&503) && statuses.contains(&200), "{statuses:?}");
}

/// A client that gives up (an HTTP/2 stream reset) while its request waits on the upstream
/// must not stay counted against the cluster: `max_requests` and the load balancer's in-flight
/// figures would otherwise drift up until the cluster refuses everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_releases_its_cluster_counts() {
    let up = Upstream::start("slow").await;
    up.delay_ms.store(1500, SeqCst);
    // Any host: over HTTP/2 the client's :authority is the proxy's address.
    let p = start_proxy(&cluster_config(&[&up], "", "").replace("hosts: [svc]", "hosts: [\"*\"]"));
    let c = h2_client();
    let req = http::Request::get(format!("http://{}/", p.listener_addrs[0])).body(full("")).unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), c.request(req)).await;
    assert!(gave_up.is_err(), "the upstream answers only after 1.5 s: {:?}", gave_up.map(|r| r.map(|r| r.status())));
    let counts = || async {
        let (_, text) = admin_get(p.admin_addr, "/clusters").await;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let c = &v["clusters"][0];
        (c["active_requests"].as_u64().unwrap(), c["endpoints"][0]["in_flight"].as_f64().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut last = counts().await;
    while last != (0, 0.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = counts().await;
    }
    assert_eq!(last, (0, 0.0), "(active requests, endpoint in-flight) after the client went away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_probe_whose_client_leaves_frees_its_slot() {
    let up = Upstream::start("flaky").await;
    let breaker = "    circuit_breaker: {error_rate: {threshold_pct: 50, min_requests: 5, window: 10s, open_duration: 300ms, half_open_probes: 1}}";
    let p = start_proxy(&cluster_config(&[&up], "", breaker).replace("hosts: [svc]", "hosts: [\"*\"]"));
    let c = client();
    let addr = p.listener_addrs[0];
    up.status.store(500, SeqCst);
    for _ in 0..5 {
        get(&c, addr, "svc", "/", &[]).await;
    }
    assert_eq!(get(&c, addr, "svc", "/", &[]).await.1["x-weft-overflow"], "breaker_open");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Half-open: the one probe goes to an upstream that answers only after 1.5 s, and its
    // client resets the stream after 200 ms. The probe never gets a verdict.
    up.status.store(0, SeqCst);
    up.delay_ms.store(1500, SeqCst);
    let req = http::Request::get(format!("http://{addr}/")).body(full("")).unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(200), h2_client().request(req)).await;
    assert!(gave_up.is_err(), "the probe should still be waiting on the upstream");
    up.delay_ms.store(0, SeqCst);
    // Its slot came back: the next request probes, succeeds and closes the breaker. Before the
    // fix every request got `breaker_open` for good.
    let deadline = Instant::now() + Duration::from_secs(3);
    let (mut s, mut h, _) = get(&c, addr, "svc", "/", &[]).await;
    while s != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        (s, h, _) = get(&c, addr, "svc", "/", &[]).await;
    }
    assert_eq!(s, 200, "still refused: {:?}", h.get("x-weft-overflow"));
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"circuit_breaker\": \"closed\""), "{clusters}");
}

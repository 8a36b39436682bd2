//! Shadow copies are measured but can never slow down or fail the primary request.

use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};
use weft_tests::*;

fn shadow_config(primary: &Upstream, shadow: std::net::SocketAddr, fraction: f64) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, experiment: e}}]}}]
experiments:
  - name: e
    variants: [{{name: a, cluster: a, weight: 1}}]
    shadow: {{cluster: shadow, variant: candidate, fraction: {fraction}, timeout: 3s, max_body_bytes: 1024}}
clusters:
  - {{name: a, endpoints: ["{}"]}}
  - {{name: shadow, endpoints: ["{shadow}"]}}
"#,
        primary.addr
    )
}

async fn timed_gets(addr: std::net::SocketAddr, n: usize, body: Option<usize>) -> Duration {
    let c = client();
    let mut worst = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        let mut req = http::Request::post(format!("http://{addr}/echo")).header("host", "s");
        let b = vec![1u8; body.unwrap_or(0)];
        req = req.header("content-length", b.len());
        let resp = c.request(req.body(full(b)).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 200, "the primary always succeeds");
        http_body_util::BodyExt::collect(resp.into_body()).await.unwrap();
        worst = worst.max(t.elapsed());
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_shadow_does_not_slow_the_primary() {
    let (primary, shadow) = (Upstream::start("a").await, Upstream::start("shadow").await);
    shadow.delay_ms.store(1500, SeqCst);
    let p = start_proxy(&shadow_config(&primary, shadow.addr, 1.0));
    let worst = timed_gets(p.listener_addrs[0], 20, Some(100)).await;
    assert!(worst < Duration::from_millis(500), "slowest primary {worst:?} with a 1.5 s shadow");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(shadow.hits(), 20, "every request was copied");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("shadow", "true"), ("variant", "candidate"), ("status_class", "2xx")]), 20.0, "{m}");
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("shadow", "false"), ("variant", "a")]), 20.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_shadow_does_not_fail_the_primary() {
    let primary = Upstream::start("a").await;
    // Port 1 is never listened on (a freed ephemeral port could be reused by a parallel test).
    let dead_addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let p = start_proxy(&shadow_config(&primary, dead_addr, 1.0));
    timed_gets(p.listener_addrs[0], 20, Some(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("shadow", "true"), ("status_class", "5xx")]), 20.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_respects_fraction_and_body_bound() {
    let (primary, shadow) = (Upstream::start("a").await, Upstream::start("shadow").await);
    let p = start_proxy(&shadow_config(&primary, shadow.addr, 0.25));
    timed_gets(p.listener_addrs[0], 400, Some(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let copied = shadow.hits();
    assert!((60..=140).contains(&copied), "25% of 400 copied: {copied}");
    // Bodies above max_body_bytes (1 KiB) are not shadowed, but the primary still succeeds.
    let before = shadow.hits();
    timed_gets(p.listener_addrs[0], 40, Some(4096)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(shadow.hits(), before);
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert!(metric_sum(&m, "weft_shadow_skipped_total", &[("reason", "body_too_large")]) >= 1.0, "{m}");
}

/// The body recorder serves retries and the shadow with the larger of their limits; each must
/// still hold its own. A body over the shadow's `max_body_bytes` but within the retry buffer
/// is not copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_holds_its_own_body_limit_beside_a_larger_retry_buffer() {
    let (primary, shadow) = (Upstream::start("a").await, Upstream::start("shadow").await);
    let cfg = shadow_config(&primary, shadow.addr, 1.0)
        .replace("routes: [{name: r, experiment: e}]", "routes: [{name: r, experiment: e, retry: {buffer_bytes: 65536}}]");
    let p = start_proxy(&cfg);
    timed_gets(p.listener_addrs[0], 3, Some(4096)).await;
    timed_gets(p.listener_addrs[0], 2, Some(512)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(shadow.hits(), 2, "only the bodies within the shadow's 1 KiB were copied");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_shadow_skipped_total", &[("reason", "body_too_large")]), 3.0, "{m}");
}

async fn concurrent_posts(addr: std::net::SocketAddr, n: usize) {
    let c = client();
    let posts: Vec<_> = (0..n)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let req = http::Request::post(format!("http://{addr}/echo")).header("host", "s").header("content-length", 1);
                let resp = c.request(req.body(full(vec![1u8])).unwrap()).await.unwrap();
                assert_eq!(resp.status(), 200, "the primary always succeeds");
            })
        })
        .collect();
    for p in posts {
        p.await.unwrap();
    }
}

/// [`shadow_config`] with a fraction of 1 and `circuit_breaker` set on the shadow cluster.
fn with_shadow_breaker(primary: &Upstream, shadow: &Upstream, breaker: &str) -> String {
    let plain = format!(r#"{{name: shadow, endpoints: ["{}"]}}"#, shadow.addr);
    let set = format!(r#"{{name: shadow, endpoints: ["{}"], circuit_breaker: {breaker}}}"#, shadow.addr);
    shadow_config(primary, shadow.addr, 1.0).replace(&plain, &set)
}

/// Copies count against the shadow cluster's thresholds: with `max_requests: 1` and a slow
/// candidate, one copy is in flight and the others are skipped, not piled onto the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_cluster_max_requests_holds_for_copies() {
    let (primary, shadow) = (Upstream::start("a").await, Upstream::start("shadow").await);
    shadow.delay_ms.store(1500, SeqCst);
    let cfg = with_shadow_breaker(&primary, &shadow, "{max_requests: 1}");
    let p = start_proxy(&cfg);
    concurrent_posts(p.listener_addrs[0], 6).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(shadow.hits(), 1, "one copy at a time reaches the candidate");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_shadow_skipped_total", &[("reason", "max_requests")]), 5.0, "{m}");
    assert_eq!(metric_sum(&m, "weft_requests_total", &[("shadow", "true")]), 1.0, "skipped copies are not requests: {m}");
}

/// A failing candidate opens its cluster's error-rate breaker, and copies then stop reaching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_candidate_opens_the_shadow_cluster_breaker() {
    let (primary, shadow) = (Upstream::start("a").await, Upstream::start("shadow").await);
    shadow.status.store(503, SeqCst);
    let cfg = with_shadow_breaker(
        &primary,
        &shadow,
        "{error_rate: {threshold_pct: 50, min_requests: 5, window: 10s, open_duration: 60s}}",
    );
    let p = start_proxy(&cfg);
    timed_gets(p.listener_addrs[0], 30, Some(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hits = shadow.hits();
    assert!((5..30).contains(&hits), "the breaker opened after its minimum of requests: {hits} copies sent");
    let m = admin_get(p.admin_addr, "/metrics").await.1;
    assert_eq!(metric_sum(&m, "weft_shadow_skipped_total", &[("reason", "breaker_open")]), (30 - hits) as f64, "{m}");
    let clusters = admin_get(p.admin_addr, "/clusters").await.1;
    assert!(clusters.contains("\"circuit_breaker\": \"open\""), "{clusters}");
}

/// What a shadow copy carries: the client's own fields (an HTTP/1.1 client's, which weft keeps
/// unparsed), the proxy's `x-weft-shadow: true` in place of any the client sent (an upstream
/// that tells copies apart by it must not be fooled), and no `x-weft-variant` of the primary's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_copy_carries_the_clients_fields_and_the_proxys_marker() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let primary = Upstream::start("a").await;
    let recorder = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shadow_addr = recorder.local_addr().unwrap();
    let (tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = recorder.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&got).into_owned());
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            });
        }
    });
    let p = start_proxy(&shadow_config(&primary, shadow_addr, 1.0));
    let out = raw(
        p.listener_addrs[0],
        b"GET /copied HTTP/1.1\r\nHost: s\r\nX-Tenant: t1\r\nX-Weft-Shadow: false\r\nUser-Agent: test/1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("\r\nx-weft-variant: a\r\n"), "{out}");
    let head = tokio::time::timeout(Duration::from_secs(5), heads.recv()).await.expect("the copy reached the shadow").unwrap();
    assert!(head.starts_with("GET /copied HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("\r\nX-Tenant: t1\r\n") && head.contains("\r\nUser-Agent: test/1\r\n") && head.contains("\r\nHost: s\r\n"), "{head}");
    assert!(head.contains("\r\nx-weft-shadow: true\r\n") && !head.contains("false"), "the proxy's marker replaces the client's: {head}");
    assert!(!head.to_ascii_lowercase().contains("x-weft-variant"), "{head}");
}

//! Streams pass through without buffering: SSE, gRPC streaming over h2c, large uploads.

use bytes::Bytes;
use http_body_util::BodyExt;
use std::time::{Duration, Instant};
use weft_tests::*;

fn single(up: std::net::SocketAddr, protocol: &str) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, cluster: c, retry: {{attempts: 2}}}}]}}]
clusters: [{{name: c, endpoints: ["{up}"], protocol: {protocol}}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_chunks_arrive_before_the_upstream_finishes() {
    let up = Upstream::start("llm").await;
    let p = start_proxy(&single(up.addr, "http1"));
    let c = client();
    let req = http::Request::get(format!("http://{}/sse?n=5&gap_ms=300", p.listener_addrs[0]))
        .header("host", "llm")
        .body(full(Bytes::new()))
        .unwrap();
    let start = Instant::now();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first_at = start.elapsed();
    assert!(String::from_utf8_lossy(&first).contains("token-0"));
    assert!(first_at < Duration::from_millis(1000), "first token after {first_at:?}; stream takes ≥1.2 s in all");
    let mut rest = Vec::new();
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            rest.extend_from_slice(&d);
        }
    }
    assert!(String::from_utf8_lossy(&rest).contains("token-4"));
    assert!(start.elapsed() >= Duration::from_millis(1200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_cuts_a_silent_stream_but_not_a_slow_one() {
    let up = Upstream::start("llm").await;
    let cfg = single(up.addr, "http1").replace("cluster: c, retry", "cluster: c, idle_timeout: 400ms, retry");
    let p = start_proxy(&cfg);
    let c = client();
    let fetch = |path: &str| {
        let req = http::Request::get(format!("http://{}{path}", p.listener_addrs[0])).header("host", "llm").body(full(Bytes::new())).unwrap();
        c.request(req)
    };
    // 6 events 200 ms apart: 1.2 s in all, longer than the idle timeout, never silent that long.
    let body = fetch("/sse?n=6&gap_ms=200").await.unwrap().into_body().collect().await;
    assert!(String::from_utf8_lossy(&body.unwrap().to_bytes()).contains("token-5"));
    // 1 s between events: cut after 400 ms of silence.
    let body = fetch("/sse?n=3&gap_ms=1000").await.unwrap().into_body().collect().await;
    assert!(body.is_err(), "a silent stream ends with an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_upload_streams_through() {
    let up = Upstream::start("sink").await;
    let p = start_proxy(&single(up.addr, "http1"));
    let c = client();
    // 32 MiB, streamed in 64 KiB chunks: far beyond the 64 KiB retry buffer.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![7u8; 64 * 1024]);
        for _ in 0..512 {
            tx.send(Ok(hyper::body::Frame::data(chunk.clone()))).await.unwrap();
        }
    });
    let body = http_body_util::combinators::BoxBody::new(http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)));
    let req = http::Request::post(format!("http://{}/echo", p.listener_addrs[0])).header("host", "sink").body(body).unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-body-len"], (32 * 1024 * 1024).to_string());
}

/// POST `body` to the `sink` upstream's `/echo` through the proxy at `addr`; the echoed bytes.
async fn echo(c: &HttpClient, addr: std::net::SocketAddr, body: &[u8]) -> Bytes {
    let req = http::Request::post(format!("http://{addr}/echo")).header("host", "sink").body(full(body.to_vec())).unwrap();
    c.request(req).await.unwrap().into_body().collect().await.unwrap().to_bytes()
}

/// HTTP/1.1 keep-alive on both hops, small requests and 1 MiB bodies mixed on the same
/// connections. The vendored hyper (vendor/README.md) reads small messages into the room left
/// in its read buffer instead of reserving a fresh one each time, and switches back to growing
/// it for large bodies; every byte of every message must still arrive, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_keep_alive_mixes_small_and_large_bodies_byte_for_byte() {
    let up = Upstream::start("sink").await;
    let p = start_proxy(&single(up.addr, "http1"));
    let c = client();
    let large: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 % 253) as u8).collect();
    for round in 0..4 {
        for i in 0..60 {
            // 0..~3 KiB: many messages per buffer, so the reads wrap around its end.
            let small: Vec<u8> = (0..i * 53).map(|j| (j + i + round) as u8).collect();
            let got = echo(&c, p.listener_addrs[0], &small).await;
            assert!(got[..] == small[..], "round {round}, small body {i}: echoed bytes differ");
        }
        let got = echo(&c, p.listener_addrs[0], &large).await;
        assert_eq!(got.len(), large.len(), "round {round}: large body length");
        assert!(got[..] == large[..], "round {round}: the large body's echoed bytes differ");
    }
}

/// HTTP/2 on both sides, with the connections going idle in the middle of each body and
/// between requests. The vendored h2 (vendor/README.md) gives a connection's read and write
/// buffers back whenever it waits; every byte must still arrive, in order, on reused
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_bodies_survive_idle_gaps_byte_for_byte() {
    let up = Upstream::start("sink").await;
    let p = start_proxy(&single(up.addr, "http2"));
    let c = h2_client();
    // 1 MiB (what /echo sends back), in 16 KiB chunks of a pattern that shifts with the offset.
    let sent: Vec<u8> = (0..1usize << 20).map(|i| (i * 31 % 251) as u8).collect();
    for round in 0..3 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>(2);
        let chunks: Vec<Bytes> = sent.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
        tokio::spawn(async move {
            for (i, chunk) in chunks.into_iter().enumerate() {
                if i % 16 == 15 {
                    tokio::time::sleep(Duration::from_millis(30)).await; // both hops go idle
                }
                tx.send(Ok(hyper::body::Frame::data(chunk))).await.unwrap();
            }
        });
        let body = http_body_util::combinators::BoxBody::new(http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)));
        let req = http::Request::post(format!("http://{}/echo", p.listener_addrs[0])).header("host", "sink").body(body).unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "round {round}");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), sent.len(), "round {round}: echoed length");
        assert!(got[..] == sent[..], "round {round}: the echoed bytes differ from the upload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_downstream_to_http1_upstream() {
    let up = Upstream::start("a").await;
    let p = start_proxy(&single(up.addr, "http1"));
    let (s, _, body) = get(&h2_client(), p.listener_addrs[0], "a", "/hello", &[]).await;
    assert_eq!(s, 200);
    assert_eq!(&body[..], b"a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_and_server_streaming_pass() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let (reporter, svc) = tonic_health::server::health_reporter();
    reporter.set_service_status("model", tonic_health::ServingStatus::Serving).await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = l.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    let p = start_proxy(&single(grpc_addr, "http2"));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", p.listener_addrs[0])).unwrap().connect().await.unwrap();
    let mut client = HealthClient::new(channel);
    let unary = client.check(HealthCheckRequest { service: "model".into() }).await.unwrap();
    assert_eq!(unary.into_inner().status, ServingStatus::Serving as i32);
    let missing = client.check(HealthCheckRequest { service: "nope".into() }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "gRPC status in trailers passes through");

    let mut stream = client.watch(HealthCheckRequest { service: "model".into() }).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    reporter.set_service_status("model", tonic_health::ServingStatus::NotServing).await;
    let second = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(second.status, ServingStatus::NotServing as i32, "a later stream message arrives while the stream stays open");
}

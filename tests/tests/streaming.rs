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


type FrameTx = tokio::sync::mpsc::Sender<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>;

/// A request body fed through a channel: frames go out as the test sends them.
fn channel_body(depth: usize) -> (FrameTx, http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>) {
    let (tx, rx) = tokio::sync::mpsc::channel(depth);
    (tx, http_body_util::combinators::BoxBody::new(http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))))
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
    let (tx, body) = channel_body(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![7u8; 64 * 1024]);
        for _ in 0..512 {
            tx.send(Ok(hyper::body::Frame::data(chunk.clone()))).await.unwrap();
        }
    });
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
        let (tx, body) = channel_body(2);
        let chunks: Vec<Bytes> = sent.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
        tokio::spawn(async move {
            for (i, chunk) in chunks.into_iter().enumerate() {
                if i % 16 == 15 {
                    tokio::time::sleep(Duration::from_millis(30)).await; // both hops go idle
                }
                tx.send(Ok(hyper::body::Frame::data(chunk))).await.unwrap();
            }
        });
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

/// An HTTP/1.1 client's header fields reach an HTTP/2 upstream in its header block (weft's
/// server reads them without a map; one is built for HTTP/2), on a first try that a retry
/// could follow: repeats all there, hop-by-hop ones gone but `te: trailers`, no Host (it is
/// the :authority), and the proxy's traceparent in place of the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_downstream_fields_reach_an_http2_upstream() {
    let up = Upstream::start("a").await;
    let p = start_proxy(&single(up.addr, "http2"));
    let out = raw(
        p.listener_addrs[0],
        b"GET /headers HTTP/1.1\r\nHost: a\r\nX-Tag: 1\r\nTE: trailers\r\nConnection: close, X-Hop\r\nX-Hop: gone\r\nKeep-Alive: 5\r\nTraceparent: junk\r\n\r\n",
    )
    .await;
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let seen: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!((seen["x-tag"].as_str(), seen["te"].as_str()), (Some("1"), Some("trailers")), "{seen}");
    for gone in ["x-hop", "keep-alive", "connection", "host"] {
        assert!(seen.get(gone).is_none(), "{gone} is not forwarded: {seen}");
    }
    assert_eq!(seen["traceparent"].as_str().map(str::len), Some(55), "{seen}");
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

/// Errors the sidecar answers itself, to a real gRPC client: HTTP 200 with the gRPC status in
/// a trailers-only response (clients saw a 404/503 JSON body as UNIMPLEMENTED / UNKNOWN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replies_to_grpc_requests_carry_a_grpc_status() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let yaml = format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - {{name: s, hosts: ["*"], routes: [{{name: down, match: {{path_prefix: /grpc.health.v1.Health/}}, cluster: c}}, {{name: only, match: {{path_prefix: /only/}}, cluster: c}}]}}
clusters: [{{name: c, endpoints: ["{dead}"], protocol: http2}}]
"#
    );
    let p = start_proxy(&yaml);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", p.listener_addrs[0])).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel.clone());
    let down = health.check(HealthCheckRequest { service: "model".into() }).await.unwrap_err();
    assert_eq!(down.code(), tonic::Code::Unavailable, "upstream down: {down:?}");
    assert!(down.message().contains("cannot connect"), "the sidecar's reason is the grpc-message: {down:?}");
    assert_eq!(down.metadata().get("x-weft-error").and_then(|v| v.to_str().ok()), Some("upstream_connect_failure"));

    // No route for the method: NOT_FOUND, not the UNIMPLEMENTED a 404 maps to.
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/other.Service/Method");
    let codec = tonic_prost::ProstCodec::<HealthCheckRequest, tonic_health::pb::HealthCheckResponse>::default();
    let r = grpc.unary(tonic::Request::new(HealthCheckRequest::default()), path, codec).await.unwrap_err();
    assert_eq!(r.code(), tonic::Code::NotFound, "{r:?}");
    assert!(r.message().contains("has no route"), "{r:?}");

    // The raw response: 200, application/grpc, grpc-status in the headers, no body.
    let c = h2_client();
    let req = http::Request::post(format!("http://{}/other.Service/Method", p.listener_addrs[0]))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(full(""))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    assert_eq!(resp.headers()["grpc-status"], "5");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty(), "trailers-only: {body:?}");

    // A plain HTTP request to the same place still gets the JSON error.
    let (status, _, body) = get(&client(), p.listener_addrs[0], "s", "/other.Service/Method", &[]).await;
    assert_eq!(status, http::StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("\"no_route\""));
}

/// An upstream that answers before it has read the request (a 401 or 413 on a large upload)
/// leaves the client still uploading: that connection must not be reused, or the next
/// request waits behind the upload (here stalled, so it would wait for the route timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_still_uploading_is_not_reused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A raw upstream: 413 to a POST as soon as its head is in (the body is then read and
    // dropped), 200 to a GET, keep-alive.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut buf, mut head, mut draining) = (vec![0u8; 65536], Vec::new(), false);
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    if draining {
                        continue;
                    }
                    head.extend_from_slice(&buf[..n]);
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        let post = head.starts_with(b"POST");
                        head.drain(..end + 4);
                        let answer: &[u8] = if post {
                            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        };
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                        if post {
                            draining = true;
                            break;
                        }
                    }
                }
            });
        }
    });
    let p = start_proxy(&single(up, "http1"));
    let addr = p.listener_addrs[0];
    let (tx, body) = channel_body(1);
    tx.send(Ok(hyper::body::Frame::data(Bytes::from(vec![b'x'; 1024])))).await.unwrap();
    let post = http::Request::post(format!("http://{addr}/upload")).header("host", "s").body(body).unwrap();
    let c = client();
    let resp = c.request(post).await.unwrap();
    assert_eq!(resp.status(), 413, "answered before the upload ended");
    resp.into_body().collect().await.unwrap();
    // The upload is still open (`tx` is alive). A GET must not queue behind it.
    let get = tokio::time::timeout(Duration::from_secs(5), get(&client(), addr, "s", "/", &[])).await;
    let (status, _, body) = get.expect("the GET waited behind the stalled upload");
    assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
    drop(tx);
}

/// The other side of the rule above: a request whose body was all sent leaves its connection
/// for the next request, over HTTP/1 and HTTP/2 downstreams, with or without a length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_uploads_keep_their_connection() {
    let up = Upstream::start("sink").await;
    let p = start_proxy(&single(up.addr, "http1"));
    let addr = p.listener_addrs[0];
    for c in [client(), h2_client()] {
        for i in 0..10 {
            let body = Bytes::from(vec![b'y'; 100 + i * 1000]);
            let req = http::Request::post(format!("http://{addr}/echo")).header("host", "s").body(full(body)).unwrap();
            let resp = c.request(req).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
        let (tx, body) = channel_body(2);
        tokio::spawn(async move {
            for _ in 0..3 {
                tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"chunk")))).await.unwrap();
            }
        });
        let req = http::Request::post(format!("http://{addr}/echo")).header("host", "s").body(body).unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.headers()["x-body-len"], "15");
        resp.into_body().collect().await.unwrap();
    }
    let v: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/clusters").await.1).unwrap();
    assert_eq!(v["clusters"][0]["open_connections"], 1, "one upstream connection served all 22 sequential uploads: {v}");
}

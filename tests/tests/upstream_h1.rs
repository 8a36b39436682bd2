//! weft's HTTP/1.1 upstream client (proxy/src/h1) against a scripted upstream that writes raw
//! bytes: every way a response can be delimited, informational heads, bodiless answers,
//! malformed and truncated answers, and the rules for reusing a connection.

use bytes::Bytes;
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_tests::*;

/// What the scripted upstream sends for a path, and whether it then closes the connection.
fn script(path: &str) -> (&'static [u8], bool) {
    match path {
        "/length" => (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", false),
        "/chunked" => (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: abc\r\n\r\n",
            false,
        ),
        "/close" => (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the close", true),
        "/http10" => (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", true),
        "/continue" => (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
        "/empty" => (b"HTTP/1.1 204 No Content\r\n\r\n", false),
        "/two-lengths" => (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello", true),
        "/truncated" => (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", true),
        "/extra" => (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", false),
        // A keep-alive answer, after which the upstream closes the idle connection anyway (as
        // an upstream's keep-alive timeout does).
        "/then-idle-close" => (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true),
        _ => (b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", false),
    }
}

struct Scripted {
    addr: SocketAddr,
    connections: AtomicU64,
}

/// A raw upstream: reads request heads (the requests here have no bodies) and answers each
/// by its path per [`script`]; HEAD gets the head only.
async fn scripted() -> Arc<Scripted> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = Arc::new(Scripted { addr: listener.local_addr().unwrap(), connections: AtomicU64::new(0) });
    let u = up.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            u.connections.fetch_add(1, SeqCst);
            tokio::spawn(async move {
                let (mut buf, mut pending) = (vec![0u8; 65536], Vec::new());
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                        pending.drain(..end + 4);
                        let mut line = head.split(' ');
                        let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
                        let (answer, close) = script(path);
                        let answer = if method == "HEAD" { &answer[..answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4] } else { answer };
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                        if close {
                            return;
                        }
                    }
                }
            });
        }
    });
    up
}

fn proxy_to(up: SocketAddr) -> weft_proxy::Proxy {
    start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, cluster: c}}]}}]
clusters: [{{name: c, endpoints: ["{up}"]}}]
"#
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_passes_and_reuse_follows_the_upstream() {
    let up = scripted().await;
    let p = proxy_to(up.addr);
    let addr = p.listener_addrs[0];
    let c = client();
    // (path, status, body, whether the connection was kept for the next request)
    let cases: [(&str, u16, &[u8], bool); 6] = [
        ("/length", 200, b"hello", true),
        ("/chunked", 200, b"hello world", true),
        ("/continue", 200, b"ok", true),
        ("/empty", 204, b"", true),
        ("/close", 200, b"until the close", false),
        ("/http10", 200, b"ok", false),
    ];
    for (path, status, body, kept) in cases {
        let before = up.connections.load(SeqCst);
        let (s, _, b) = get(&c, addr, "s", path, &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (status, body), "{path}");
        // The next request shows whether this one's connection went back to the pool.
        let (s, _, b) = get(&c, addr, "s", "/length", &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (200, &b"hello"[..]), "after {path}");
        let opened = up.connections.load(SeqCst) - before;
        let expected = if kept { 0 } else { 1 };
        assert!(opened <= 1, "{path}: {opened} connections for two requests");
        if before > 0 {
            assert_eq!(opened, expected, "{path}: a new connection was opened after it: {opened}");
        }
    }
    // HEAD: the head's content-length announces a body that never comes.
    let req = http::Request::head(format!("http://{addr}/length")).header("host", "s").body(full(Bytes::new())).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), c.request(req)).await.expect("HEAD does not wait for a body").unwrap();
    assert_eq!((resp.status().as_u16(), resp.headers()["content-length"].to_str().unwrap()), (200, "5"));
    assert!(resp.into_body().collect().await.unwrap().to_bytes().is_empty());
    // Trailers of a chunked answer reach an HTTP/2 client.
    let req = http::Request::get(format!("http://{addr}/chunked")).header("host", "s").body(full(Bytes::new())).unwrap();
    let collected = h2_client().request(req).await.unwrap().into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().and_then(|t| t.get("x-checksum")).map(|v| v.to_str().unwrap()), Some("abc"));
    assert_eq!(&collected.to_bytes()[..], b"hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_truncated_answers_fail_clearly() {
    let up = scripted().await;
    let p = proxy_to(up.addr);
    let addr = p.listener_addrs[0];
    let c = client();
    let (s, h, b) = get(&c, addr, "s", "/two-lengths", &[]).await;
    assert_eq!((s.as_u16(), h["x-weft-error"].to_str().unwrap()), (502, "upstream_reset"));
    let text = String::from_utf8_lossy(&b);
    assert!(text.contains("invalid response from upstream: invalid content-length"), "{text}");
    // The head was fine and went downstream; the body then ended early: the client must see
    // the stream fail, not a short body that looks complete.
    let req = http::Request::get(format!("http://{addr}/truncated")).header("host", "s").body(full(Bytes::new())).unwrap();
    // (Whether the client fails the body or, reading it all at once, the whole message, is its
    // own timing.)
    if let Ok(resp) = c.request(req).await {
        assert_eq!(resp.status(), 200);
        assert!(resp.into_body().collect().await.is_err(), "a truncated body is an error downstream");
    }
    // Bytes after a complete answer: the answer passes, the connection is not reused. (A
    // first request leaves one pooled connection for `/extra` to take.)
    assert_eq!(get(&c, addr, "s", "/length", &[]).await.0, 200);
    let before = up.connections.load(SeqCst);
    let (s, _, b) = get(&c, addr, "s", "/extra", &[]).await;
    assert_eq!((s.as_u16(), &b[..]), (200, &b"ok"[..]));
    let (s, _, _) = get(&c, addr, "s", "/length", &[]).await;
    assert_eq!(s, 200);
    assert_eq!(up.connections.load(SeqCst) - before, 1, "the connection with unasked bytes was not reused");
}

/// An idle pooled connection that the upstream closed is noticed before use: the next request
/// goes out on a fresh connection and succeeds, with no retry policy to fall back on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_the_upstream_closed_is_not_used() {
    let up = scripted().await;
    let p = proxy_to(up.addr);
    let addr = p.listener_addrs[0];
    let c = client();
    for i in 0..5 {
        let (s, _, b) = get(&c, addr, "s", "/then-idle-close", &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (200, &b"ok"[..]), "request {i}");
        // Let the upstream's close reach the proxy's idle connection.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(up.connections.load(SeqCst), 5);
    let v: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/clusters").await.1).unwrap();
    assert!(v["clusters"][0]["open_connections"].as_u64().unwrap() <= 1, "closed idle connections give their places back: {v}");
}

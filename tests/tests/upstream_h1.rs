//! weft's HTTP/1.1 upstream client (proxy/src/h1) against raw upstreams that write bytes by
//! hand: every way a response can be delimited, informational heads, bodiless answers,
//! malformed and truncated answers, the rules for reusing a connection, idle connections the
//! upstream closed, and uploads that outlive the response head.

use bytes::Bytes;
use http_body_util::BodyExt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_tests::*;

struct RawUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
}

/// An upstream that hands each accepted connection to `handler`.
async fn raw_upstream<F, Fut>(handler: F) -> RawUpstream
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = RawUpstream { addr: listener.local_addr().unwrap(), connections: Arc::default() };
    let (count, handler) = (up.connections.clone(), Arc::new(handler));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, SeqCst);
            let h = handler.clone();
            tokio::spawn(async move { h(s).await });
        }
    });
    up
}

/// The next request head on `s` (bytes read past it stay in `pending`).
async fn read_head(s: &mut TcpStream, pending: &mut Vec<u8>) -> Option<String> {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            pending.drain(..end + 4);
            return Some(head);
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// An upstream that reads each connection's first request head, then hands the socket, the
/// bytes read past the head, and `state` (the test's record of what it saw) to `then`.
async fn after_first_head<S, F, Fut>(state: Arc<S>, then: F) -> RawUpstream
where
    S: Send + Sync + 'static,
    F: Fn(TcpStream, Vec<u8>, Arc<S>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let then = Arc::new(then);
    raw_upstream(move |mut s| {
        let (state, then) = (state.clone(), then.clone());
        async move {
            let mut pending = Vec::new();
            if read_head(&mut s, &mut pending).await.is_some() {
                then(s, pending, state).await;
            }
        }
    })
    .await
}

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
        // Asks to be kept and closed at once: close wins. (The upstream goes on reading, so a
        // proxy that kept the connection would be seen reusing it.)
        "/http10-both" => (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\nconnection: close\r\n\r\nok", false),
        "/both-framings" => (b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\nb\r\nhello world\r\n0\r\n\r\n", false),
        "/continue" => (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
        "/empty" => (b"HTTP/1.1 204 No Content\r\n\r\n", false),
        "/not-modified" => (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: \"v1\"\r\n\r\n", false),
        "/reason" => (b"HTTP/1.1 499 Client Closed Request\r\ncontent-length: 0\r\n\r\n", false),
        "/two-lengths" => (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello", true),
        // Equal lengths, listed: valid, but a proxy passes on one value (RFC 9110 §8.6).
        "/listed-length" => (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello", false),
        // gzip under the chunks: decoding only the chunks would hand on gzip unlabelled.
        "/gzip-chunked" => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true),
        "/chunked-twice" => (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true),
        "/truncated" => (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", true),
        "/extra" => (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", false),
        // A keep-alive answer, after which the upstream closes the idle connection anyway (as
        // an upstream's keep-alive timeout does).
        "/then-idle-close" => (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true),
        // Fields of every sort: mixed case, hop-by-hop ones, one `Connection` names, repeats,
        // and a variant header of the upstream's own.
        "/fields" => (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Model-Id: llama\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=5\r\nX-Private: secret\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Weft-Variant: upstream-says\r\n\r\nhello",
            false,
        ),
        _ => (b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", false),
    }
}

/// Answers each request head (no request bodies) by its path per [`script`]; HEAD gets the
/// head only.
async fn scripted() -> RawUpstream {
    raw_upstream(|mut s| async move {
        let mut pending = Vec::new();
        while let Some(head) = read_head(&mut s, &mut pending).await {
            let mut line = head.split(' ');
            let (method, path) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
            let (answer, close) = script(path);
            let answer = if method == "HEAD" { &answer[..answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4] } else { answer };
            if s.write_all(answer).await.is_err() || close {
                return;
            }
        }
    })
    .await
}

fn config(up: SocketAddr, cluster_extra: &str) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, cluster: c}}]}}]
clusters: [{{name: c, endpoints: ["{up}"]{cluster_extra}}}]
"#
    )
}

/// [`config`], routed through a one-variant experiment (so the proxy sets `x-weft-variant: a`).
fn one_variant_config(up: SocketAddr) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, experiment: e}}]}}]
experiments: [{{name: e, salt: x, variants: [{{name: a, cluster: c, weight: 100}}]}}]
clusters: [{{name: c, endpoints: ["{up}"]}}]
"#
    )
}

async fn open_connections(p: &weft_proxy::Proxy) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&admin_get(p.admin_addr, "/clusters").await.1).unwrap();
    v["clusters"][0]["open_connections"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_passes_and_reuse_follows_the_upstream() {
    let up = scripted().await;
    let p = start_proxy(&config(up.addr, ""));
    let addr = p.listener_addrs[0];
    let c = client();
    // (path, status, body, whether the connection was kept for the next request)
    let cases: [(&str, u16, &[u8], bool); 8] = [
        ("/length", 200, b"hello", true),
        ("/chunked", 200, b"hello world", true),
        ("/continue", 200, b"ok", true),
        ("/empty", 204, b"", true),
        ("/close", 200, b"until the close", false),
        ("/http10", 200, b"ok", false),
        ("/http10-both", 200, b"ok", false),
        ("/both-framings", 200, b"hello world", false),
    ];
    for (path, status, body, kept) in cases {
        let before = up.connections.load(SeqCst);
        let (s, h, b) = get(&c, addr, "s", path, &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (status, body), "{path}");
        assert!(path != "/both-framings" || h.get("content-length").is_none(), "a length beside a coding is not forwarded: {h:?}");
        // The next request shows whether this one's connection went back to the pool.
        let (s, _, b) = get(&c, addr, "s", "/length", &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (200, &b"hello"[..]), "after {path}");
        let opened = up.connections.load(SeqCst) - before;
        assert!(opened <= 1, "{path}: {opened} connections for two requests");
        if before > 0 {
            assert_eq!(opened, u64::from(!kept), "{path}: connections opened for the request after it");
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
    // A reason phrase of the upstream's own goes on downstream.
    let out = raw(addr, b"GET /reason HTTP/1.1\r\nhost: s\r\nconnection: close\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 499 Client Closed Request\r\n"), "{out}");
    // A 304 keeps the length of the representation it stands for and carries no body: the
    // next answer on the same client connection follows its head at once.
    let out = raw(addr, b"GET /not-modified HTTP/1.1\r\nhost: s\r\n\r\nGET /length HTTP/1.1\r\nhost: s\r\nconnection: close\r\n\r\n").await;
    let (first, rest) = out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{out}"));
    assert!(first.starts_with("HTTP/1.1 304 Not Modified\r\n") && first.contains("\r\nContent-Length: 1234") && first.contains("\r\nETag: \"v1\""), "{out}");
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n") && rest.ends_with("\r\n\r\nhello"), "{out}");
}

/// An HTTP/1.1 upstream's header fields reach an HTTP/1.1 client as they came (weft copies
/// them without building a header map) and an HTTP/2 client in a map; either way hop-by-hop
/// fields and the ones `Connection` names are left out, repeated fields all arrive, and the
/// proxy's `x-weft-variant` replaces the upstream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_fields_reach_both_kinds_of_client_without_hop_by_hop_ones() {
    let up = scripted().await;
    let p = start_proxy(&one_variant_config(up.addr));
    let addr = p.listener_addrs[0];
    let out = raw(addr, b"GET /fields HTTP/1.1\r\nhost: s\r\nconnection: close\r\n\r\n").await;
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert_eq!(body, "hello");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("\r\nX-Model-Id: llama\r\n") && head.contains("\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"), "{head}");
    assert!(head.contains("\r\nx-weft-variant: a\r\n") && !head.contains("upstream-says"), "{head}");
    assert!(head.contains("\r\ncontent-length: 5\r\n") && !head.contains("Content-Length"), "weft frames the body itself: {head}");
    for gone in ["Keep-Alive", "X-Private", "Upgrade", "Proxy-Connection", "keep-alive"] {
        assert!(!head.contains(gone), "{gone} is not forwarded: {head}");
    }

    let req = http::Request::get(format!("http://{addr}/fields")).header("host", "s").body(full(Bytes::new())).unwrap();
    let resp = h2_client().request(req).await.unwrap();
    let h = resp.headers().clone();
    assert_eq!(h["x-model-id"], "llama");
    assert_eq!(h.get_all("set-cookie").iter().collect::<Vec<_>>(), ["a=1", "b=2"]);
    assert_eq!(h.get_all("x-weft-variant").iter().collect::<Vec<_>>(), ["a"]);
    for gone in ["connection", "keep-alive", "x-private", "upgrade", "proxy-connection"] {
        assert!(!h.contains_key(gone), "{gone} is not forwarded: {h:?}");
    }
    assert_eq!(&resp.into_body().collect().await.unwrap().to_bytes()[..], b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_truncated_answers_fail_clearly() {
    let up = scripted().await;
    let p = start_proxy(&config(up.addr, ""));
    let addr = p.listener_addrs[0];
    let c = client();
    for (path, why) in [
        ("/two-lengths", "invalid content-length"),
        ("/gzip-chunked", "transfer-encoding lists a coding other than chunked"),
        ("/chunked-twice", "transfer-encoding applies chunked more than once"),
    ] {
        let (s, h, b) = get(&c, addr, "s", path, &[]).await;
        assert_eq!((s.as_u16(), h["x-weft-error"].to_str().unwrap()), (502, "upstream_reset"), "{path}");
        let text = String::from_utf8_lossy(&b);
        assert!(text.contains(&format!("invalid response from upstream: {why}")), "{path}: {text}");
    }
    // A listed length reaches the client as one value the proxy writes.
    let out = raw(addr, b"GET /listed-length HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\nhello"), "{out}");
    assert!(out.contains("\r\ncontent-length: 5\r\n") && !out.contains("5, 5"), "{out}");
    // ...and so does the one a HEAD answer announces, which the proxy does not rewrite.
    let out = raw(addr, b"HEAD /listed-length HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n") && out.ends_with("\r\n\r\n") && out.contains("\r\nContent-Length: 5\r\n"), "{out}");
    assert_eq!(out.to_ascii_lowercase().matches("content-length").count(), 1, "{out}");
    // The head was fine and went downstream; the body then ended early: the client must see
    // the stream fail, not a short body that looks complete. (Whether the client fails the
    // body or, reading it all at once, the whole message, is its own timing.)
    let req = http::Request::get(format!("http://{addr}/truncated")).header("host", "s").body(full(Bytes::new())).unwrap();
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
    let p = start_proxy(&config(up.addr, ""));
    let addr = p.listener_addrs[0];
    let c = client();
    for i in 0..5 {
        let (s, _, b) = get(&c, addr, "s", "/then-idle-close", &[]).await;
        assert_eq!((s.as_u16(), &b[..]), (200, &b"ok"[..]), "request {i}");
        // Let the upstream's close reach the proxy's idle connection.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(up.connections.load(SeqCst), 5);
}

/// Idle connections the upstream closed give back their sockets and `max_connections` places
/// without any request coming to find them: with all four places held by dead connections,
/// a request would otherwise be refused with 503 `overflow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_idle_connections_give_their_places_back() {
    let up = raw_upstream(|mut s| async move {
        let mut pending = Vec::new();
        while let Some(head) = read_head(&mut s, &mut pending).await {
            let first_round = head.contains(" /first-");
            if first_round {
                tokio::time::sleep(Duration::from_millis(100)).await; // so four are open at once
            }
            if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() || first_round {
                return; // the upstream's keep-alive timeout closes these once idle
            }
        }
    })
    .await;
    let p = start_proxy(&config(up.addr, ", circuit_breaker: {max_connections: 4}"));
    let addr = p.listener_addrs[0];
    // Four concurrent streams on one downstream HTTP/2 connection: one worker's pool.
    let h2 = h2_client();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let h2 = h2.clone();
            tokio::spawn(async move { get(&h2, addr, "s", &format!("/first-{i}"), &[]).await.0 })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    // The sweep runs once a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while open_connections(&p).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(open_connections(&p).await, 0, "closed idle connections were let go");
    let (s, h, _) = get(&client(), addr, "s", "/next", &[]).await;
    assert_eq!(s, 200, "{h:?}");
}

/// The response head comes while the client still uploads, and then the client's body fails:
/// the upstream sees the request end (EOF) instead of waiting for the rest, and the response
/// ends instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_body_that_fails_after_the_response_head_ends_both_sides() {
    let saw_eof = Arc::new(AtomicBool::new(false));
    let up = after_first_head(saw_eof.clone(), |mut s, mut pending, eof| async move {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
        let mut buf = [0u8; 8192];
        while !pending.windows(5).any(|w| w == b"0\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return eof.store(true, SeqCst),
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
        }
        let _ = s.write_all(b"4\r\ndone\r\n0\r\n\r\n").await;
    })
    .await;
    let p = start_proxy(&config(up.addr, ""));
    let mut d = TcpStream::connect(p.listener_addrs[0]).await.unwrap();
    d.write_all(b"POST /up HTTP/1.1\r\nhost: s\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.write_all(b"zz\r\n").await.unwrap(); // not a chunk size: the request body fails
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while let Ok(1..) = d.read(&mut buf).await {}
    })
    .await;
    assert!(ended.is_ok(), "the downstream response ended");
    assert!(saw_eof.load(SeqCst), "the upstream saw the request end");
}

/// An upstream that answers 413 and closes without reading the upload: the client, still
/// sending 8 MiB, gets the 413 rather than a reset (the proxy reads and drops the rest of the
/// body for a while, as nginx's lingering close does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_reaches_a_client_still_uploading() {
    let up = raw_upstream(|mut s| async move {
        let mut pending = Vec::new();
        if read_head(&mut s, &mut pending).await.is_some() {
            let _ = s.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbig").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let p = start_proxy(&config(up.addr, ""));
    let addr = p.listener_addrs[0];
    for i in 0..3 {
        let req = http::Request::post(format!("http://{addr}/u")).header("host", "s").body(full(vec![b'x'; 8 << 20])).unwrap();
        let resp = client().request(req).await.unwrap_or_else(|e| panic!("round {i}: {e:?}"));
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!((status.as_u16(), &body[..]), (413, &b"big"[..]), "round {i}");
    }
}

/// Request trailers go upstream only when the request declared them (`Trailer`), and never
/// fields that must not be trailers (as hyper's client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_declared_request_trailers_go_upstream() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let up = after_first_head(seen.clone(), |mut s, mut pending, sn| async move {
        let mut buf = [0u8; 8192];
        // The chunked body ends with a blank line after the last chunk and its trailers.
        while !(pending.windows(3).any(|w| w == b"\n0\r" || w == b"0\r\n") && pending.ends_with(b"\r\n\r\n")) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
        }
        sn.lock().unwrap().extend_from_slice(&pending);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
    })
    .await;
    let p = start_proxy(&config(up.addr, ""));
    let out = raw(
        p.listener_addrs[0],
        b"POST /t HTTP/1.1\r\nhost: s\r\ntrailer: x-t, host\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\ncontent-length: 99\r\nhost: other\r\nx-t: 1\r\nx-undeclared: 2\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let body = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert_eq!(body, "5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n");
}

/// A client's header fields reach an HTTP/1.1 upstream as they came (weft's server does not
/// parse them into a map on this path): case kept, repeats all there, hop-by-hop ones and the
/// ones `Connection` names left out, and the proxy's own `x-weft-variant` and `traceparent`
/// in place of the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_fields_reach_the_upstream_without_hop_by_hop_ones() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sn = seen.clone();
    let up = raw_upstream(move |mut s| {
        let sn = sn.clone();
        async move {
            let mut pending = Vec::new();
            while let Some(head) = read_head(&mut s, &mut pending).await {
                sn.lock().unwrap().push(head);
                if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let p = start_proxy(&one_variant_config(up.addr));
    let out = raw(
        p.listener_addrs[0],
        b"GET /f?q=1 HTTP/1.1\r\nHost: s\r\nX-Tag: 1\r\nx-tag: 2\r\nConnection: close, X-Hop\r\nX-Hop: gone\r\nKeep-Alive: 5\r\nTE: gzip\r\nUpgrade: foo\r\nX-Weft-Variant: zzz\r\nTraceparent: junk\r\nUser-Agent: test/1\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("ok"), "{out}");
    let head = seen.lock().unwrap().pop().expect("the request reached the upstream");
    assert!(head.starts_with("GET /f?q=1 HTTP/1.1\r\nHost: s\r\nX-Tag: 1\r\nx-tag: 2\r\nUser-Agent: test/1\r\n"), "{head}");
    assert!(head.contains("\r\nx-weft-variant: a") && !head.contains("zzz"), "{head}");
    let tp = head.lines().find_map(|l| l.strip_prefix("traceparent: ")).unwrap_or_else(|| panic!("{head}"));
    assert_eq!((tp.len(), head.contains("junk")), (55, false), "a fresh trace replaces an invalid one: {head}");
    for gone in ["X-Hop", "Keep-Alive", "TE:", "Upgrade", "Connection", "connection"] {
        assert!(!head.contains(gone), "{gone} is not forwarded: {head}");
    }
    // A field `Connection` names is not forwarded, yet the proxy still reads it: here the
    // Host, which routes the request (and is sent again from the authority).
    let out = raw(p.listener_addrs[0], b"GET /g HTTP/1.1\r\nHost: s\r\nConnection: close, Host\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let head = seen.lock().unwrap().pop().expect("the request reached the upstream");
    assert!(head.contains("\r\nhost: s\r\n") && !head.contains("Host: s"), "{head}");
}

/// An upstream that answers at once and only then reads the upload (an accepted job, a
/// streaming ingest): the body must still reach it whole, though the downstream response ended
/// first. The proxy's connection then ends without reading from the client itself, since the
/// upload's own task still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_outlives_its_answer_reaches_the_upstream_whole() {
    const LEN: usize = 4 << 20;
    let got = Arc::new(Mutex::new(Vec::<u8>::new()));
    let up = after_first_head(got.clone(), |mut s, pending, seen| async move {
        let _ = s.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\nok").await;
        let mut body = pending;
        let mut buf = vec![0u8; 64 * 1024];
        while body.len() < LEN {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => body.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        *seen.lock().unwrap() = body;
    })
    .await;
    let p = start_proxy(&config(up.addr, ""));
    // A body with a pattern, so a missing or reordered piece shows.
    let body: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let mut c = TcpStream::connect(p.listener_addrs[0]).await.unwrap();
    let head = format!("POST /u HTTP/1.1\r\nHost: s\r\nContent-Length: {LEN}\r\n\r\n");
    c.write_all(head.as_bytes()).await.unwrap();
    let (mut r, mut w) = c.into_split();
    let writer = tokio::spawn(async move {
        // Slowly enough that the answer comes while most of the body is still to send.
        for piece in body.chunks(256 * 1024) {
            if w.write_all(piece).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), r.read_to_end(&mut answer)).await;
    let _ = tokio::time::timeout(Duration::from_secs(15), writer).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 202"), "{text}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().len() < LEN && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = got.lock().unwrap();
    assert_eq!(got.len(), LEN, "the upstream got every byte");
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "and in order");
}

/// Framing and routing fields that two hops could read two ways (the ground of request
/// smuggling, and of routing by one Host while the upstream reads another) are refused, or
/// sent on in the one form every reader agrees on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_two_hops_could_read_two_ways_are_refused_or_sent_as_one() {
    // Records each request head and the five bytes after it (a POST's body), then answers
    // and closes.
    let seen = Arc::new(Mutex::new(Vec::<(String, Vec<u8>)>::new()));
    let sn = seen.clone();
    let up = raw_upstream(move |mut s| {
        let sn = sn.clone();
        async move {
            let mut pending = Vec::new();
            let Some(head) = read_head(&mut s, &mut pending).await else { return };
            let mut buf = [0u8; 64];
            let chunked = head.contains("\r\ntransfer-encoding: chunked");
            while (head.starts_with("POST") && pending.len() < 5) || (chunked && !pending.ends_with(b"0\r\n\r\n")) {
                match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => pending.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            sn.lock().unwrap().push((head, pending));
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
        }
    })
    .await;
    let p = start_proxy(&config(up.addr, ""));
    let addr = p.listener_addrs[0];
    let last = || seen.lock().unwrap().pop().expect("the request reached the upstream");

    // Equal lengths, listed: the body is framed by them and the upstream gets one value.
    let out = raw(addr, b"POST /listed HTTP/1.1\r\nHost: s\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nhello").await;
    assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("ok"), "{out}");
    let (head, body) = last();
    assert!(head.contains("\r\nContent-Length: 5\r\n") && !head.contains("5, 5"), "{head}");
    assert_eq!((head.to_ascii_lowercase().matches("content-length").count(), &body[..]), (1, &b"hello"[..]), "{head}");

    // A GET's chunked body (a search query) goes on with it, chunked.
    let out = raw(addr, b"GET /search HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nquery\r\n0\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (head, body) = last();
    assert!(head.starts_with("GET /search HTTP/1.1\r\n"), "{head}");
    assert_eq!(String::from_utf8_lossy(&body), "5\r\nquery\r\n0\r\n\r\n", "{head}");

    // An absolute-form target names the authority: it routes the request, and it is the Host
    // the upstream gets, not the client's own Host line (RFC 9112 §3.2.2).
    let out = raw(addr, b"GET http://s:80/abs?q=1 HTTP/1.1\r\nHost: elsewhere\r\nConnection: close\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (head, _) = last();
    assert!(head.starts_with("GET /abs?q=1 HTTP/1.1\r\n") && head.contains("\r\nhost: s:80") && !head.contains("elsewhere"), "{head}");

    // `TE: Trailers` (a gRPC client that capitalises) still goes end to end.
    let out = raw(addr, b"GET /te HTTP/1.1\r\nHost: s\r\nTE: Trailers\r\nConnection: close\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(last().0.contains("\r\nTE: Trailers"));

    // Refused before anything is sent upstream: two Hosts (400), chunked twice (400), a coding
    // weft does not decode (501); each names the problem and closes the connection.
    for (req, status, why) in [
        (&b"GET /two HTTP/1.1\r\nHost: s\r\nHost: t\r\n\r\n"[..], "400", "2 Host headers"),
        (b"POST /twice HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "400", "chunked more than once"),
        (b"POST /gz HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "501", "other than chunked"),
    ] {
        let out = raw(addr, req).await;
        assert!(out.starts_with(&format!("HTTP/1.1 {status} ")), "{out}");
        assert!(out.contains("\r\nconnection: close\r\n") && out.contains(why), "{out}");
    }
    assert!(seen.lock().unwrap().is_empty(), "no refused request reached the upstream");
}

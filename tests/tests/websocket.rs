//! WebSocket (HTTP/1.1 Upgrade) through the sidecar, with a real client and a real server
//! (tokio-tungstenite): the handshake reaches the upstream with its Upgrade and Connection,
//! frames travel both ways, a silent tunnel ends at the route's idle timeout, an upstream that
//! refuses the upgrade is answered as it answered, and the tunnel shows in /metrics.

use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use weft_tests::procs::wait_for;
use weft_tests::*;

type Seen = Arc<Mutex<Vec<http::HeaderMap>>>;

/// Send each text or binary message back as it came, until the peer closes.
async fn echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(ws: tokio_tungstenite::WebSocketStream<S>) {
    let (mut tx, mut rx) = ws.split();
    while let Some(Ok(m)) = rx.next().await {
        if (m.is_text() || m.is_binary()) && tx.send(m).await.is_err() {
            return;
        }
    }
}

/// A WebSocket echo server: each text or binary message comes back as it came. Records each
/// handshake's request headers.
#[allow(clippy::result_large_err)] // the callback's type is tungstenite's
async fn echo_server() -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let on_handshake = |req: &Request, resp: Response| {
                    record.lock().unwrap().push(req.headers().clone());
                    Ok(resp)
                };
                if let Ok(ws) = tokio_tungstenite::accept_hdr_async(s, on_handshake).await {
                    echo(ws).await;
                }
            });
        }
    });
    (addr, seen)
}

fn config(up: SocketAddr, route_extra: &str) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["chat"], routes: [{{name: r, cluster: c{route_extra}}}]}}]
clusters: [{{name: c, endpoints: ["{up}"]}}]
"#
    )
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

async fn connect(proxy: SocketAddr) -> Result<(Ws, http::Response<Option<Vec<u8>>>), WsError> {
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let req = "ws://chat/v1/stream".into_client_request().unwrap();
    tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::client_async(req, tcp)).await.expect("handshake within 10 s")
}

async fn next_message(ws: &mut Ws) -> Option<Result<Message, WsError>> {
    tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame or the end within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_echoes_through_the_sidecar_both_ways() {
    let (up, seen) = echo_server().await;
    let p = start_proxy(&config(up, ""));
    let (mut ws, resp) = connect(p.listener_addrs[0]).await.expect("the handshake goes through the sidecar");
    assert_eq!(resp.status(), 101);

    // The upstream got the client's handshake, Upgrade and Connection included, from weft.
    let h = seen.lock().unwrap()[0].clone();
    assert_eq!(h["upgrade"], "websocket");
    assert!(h["connection"].to_str().unwrap().to_ascii_lowercase().contains("upgrade"));
    assert!(h.contains_key("sec-websocket-key") && h.contains_key("traceparent"), "{h:?}");

    // Small messages pipelined, then one of 1 MiB each way (several reads and writes).
    for i in 0..50 {
        ws.send(Message::text(format!("token-{i}"))).await.unwrap();
    }
    for i in 0..50 {
        let m = next_message(&mut ws).await.unwrap().unwrap();
        assert_eq!(m.into_text().unwrap().as_str(), format!("token-{i}"));
    }
    let big: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    let m = next_message(&mut ws).await.unwrap().unwrap();
    assert_eq!(m.into_data().as_ref(), &big[..]);
    ws.close(None).await.unwrap();
    while let Some(Ok(_)) = next_message(&mut ws).await {}
    drop(ws);

    // The handshake counts as a request (1xx), and the tunnel's bytes are counted.
    let metrics = wait_for("the tunnel to be counted closed", Duration::from_secs(5), || async {
        let (_, text) = admin_get(p.admin_addr, "/metrics").await;
        (metric_sum(&text, "weft_tunnels_closed_total", &[("cluster", "c")]) >= 1.0).then_some(text)
    })
    .await;
    assert_eq!(metric_sum(&metrics, "weft_requests_total", &[("cluster", "c"), ("status_class", "1xx")]), 1.0);
    assert!(metric_sum(&metrics, "weft_tunnel_bytes_total", &[("cluster", "c"), ("direction", "upstream")]) > (1 << 20) as f64);
    assert!(metric_sum(&metrics, "weft_tunnel_bytes_total", &[("cluster", "c"), ("direction", "downstream")]) > (1 << 20) as f64);
    assert_eq!(metric_sum(&metrics, "weft_tunnels_active", &[("cluster", "c")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tunnel_ends_at_the_idle_timeout_and_a_slow_one_does_not() {
    let (up, _) = echo_server().await;
    let p = start_proxy(&config(up, ", idle_timeout: 400ms"));
    let (mut ws, _) = connect(p.listener_addrs[0]).await.expect("handshake");
    // A message every 150 ms for 1.2 s: never 400 ms of silence.
    for i in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        ws.send(Message::text(format!("{i}"))).await.unwrap();
        assert_eq!(next_message(&mut ws).await.unwrap().unwrap().into_text().unwrap().as_str(), format!("{i}"));
    }
    // Then silence: the sidecar closes the tunnel.
    let start = std::time::Instant::now();
    match next_message(&mut ws).await {
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {}
        Some(Ok(m)) => panic!("a message after silence: {m:?}"),
    }
    let after = start.elapsed();
    assert!(after >= Duration::from_millis(300), "closed after {after:?}, before the idle timeout");
    let (_, text) = admin_get(p.admin_addr, "/metrics").await;
    assert_eq!(metric_sum(&text, "weft_tunnels_closed_total", &[("cluster", "c"), ("reason", "idle_timeout")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_does_not_upgrade_is_answered_as_it_answered() {
    // An HTTP server that does not speak WebSocket answers the handshake with a 200.
    let up = Upstream::start("plain").await;
    let p = start_proxy(&config(up.addr, ""));
    match connect(p.listener_addrs[0]).await {
        Err(WsError::Http(resp)) => assert_eq!(resp.status(), 200, "the upstream's own answer, not the sidecar's"),
        other => panic!("expected the upstream's HTTP answer, got {:?}", other.map(|(_, r)| r.status())),
    }
    // And the sidecar still serves plain requests on a new connection.
    let (status, _, _) = get(&client(), p.listener_addrs[0], "chat", "/", &[]).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_crosses_two_sidecars() {
    // Outbound sidecar -> inbound sidecar -> server, as in the mesh.
    let (up, seen) = echo_server().await;
    let inbound = start_proxy(&config(up, ""));
    let outbound = start_proxy(&config(inbound.listener_addrs[0], ""));
    let (mut ws, _) = connect(outbound.listener_addrs[0]).await.expect("handshake across both sidecars");
    ws.send(Message::text("across")).await.unwrap();
    assert_eq!(next_message(&mut ws).await.unwrap().unwrap().into_text().unwrap().as_str(), "across");
    assert_eq!(seen.lock().unwrap()[0]["upgrade"], "websocket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_to_an_http2_cluster_is_refused_naming_it() {
    let up = Upstream::start("h2").await;
    let p = start_proxy(&config(up.addr, "").replace(r#"endpoints: ["#, "protocol: http2, endpoints: ["));
    match connect(p.listener_addrs[0]).await {
        Err(WsError::Http(resp)) => {
            assert_eq!(resp.status(), 501);
            let body = String::from_utf8(resp.into_body().unwrap_or_default()).unwrap();
            assert!(body.contains("upgrade_unsupported") && body.contains(r#"cluster \"c\" speaks HTTP/2"#), "{body}");
        }
        other => panic!("expected a 501, got {:?}", other.map(|(_, r)| r.status())),
    }
}

/// A WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with `:protocol websocket` on an h2c
/// connection to the sidecar (hyper's client), then WebSocket frames on that stream.
async fn connect_h2(proxy: SocketAddr) -> Result<Ws2, String> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    // The server's SETTINGS (which enable extended CONNECT) arrive with its first frames.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut req = http::Request::connect("http://chat/v1/stream")
        .header("sec-websocket-version", "13")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    req.extensions_mut().insert(hyper::ext::Protocol::from_static("websocket"));
    let resp = send.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()));
    }
    let upgraded = hyper::upgrade::on(resp).await.map_err(|e| format!("upgrade: {e}"))?;
    use tokio_tungstenite::tungstenite::protocol::Role;
    Ok(tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await)
}

type Ws2 = tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_http2_reaches_an_http1_server() {
    let (up, seen) = echo_server().await;
    let p = start_proxy(&config(up, ""));
    let mut ws = connect_h2(p.listener_addrs[0]).await.expect("extended CONNECT accepted");
    // The HTTP/1.1 server got a complete handshake (the sidecar made its Sec-WebSocket-Key).
    let h = seen.lock().unwrap()[0].clone();
    assert_eq!(h["upgrade"], "websocket");
    assert_eq!(h["sec-websocket-version"], "13");
    assert!(h.contains_key("sec-websocket-key"), "{h:?}");
    for i in 0..20 {
        ws.send(Message::text(format!("h2-{i}"))).await.unwrap();
    }
    for i in 0..20 {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(m.into_text().unwrap().as_str(), format!("h2-{i}"));
    }
    let big = vec![7u8; 300_000];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(m.into_data().len(), big.len());
    ws.close(None).await.unwrap();
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(10), ws.next()).await {}
    drop(ws);
    let metrics = wait_for("the h2 tunnel to be counted closed", Duration::from_secs(5), || async {
        let (_, text) = admin_get(p.admin_addr, "/metrics").await;
        (metric_sum(&text, "weft_tunnels_closed_total", &[("cluster", "c")]) >= 1.0).then_some(text)
    })
    .await;
    assert!(metric_sum(&metrics, "weft_tunnel_bytes_total", &[("cluster", "c"), ("direction", "upstream")]) > 300_000.0);
}

/// A WebSocket echo server over HTTP/2 only (RFC 8441), as an h2 model server would run one.
async fn h2_echo_server() -> SocketAddr {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let svc = hyper::service::service_fn(|mut req: http::Request<hyper::body::Incoming>| async move {
                let ws = req.method() == http::Method::CONNECT && req.extensions().get::<hyper::ext::Protocol>().is_some_and(|p| p.as_str() == "websocket");
                let status = if ws { 200 } else { 400 };
                if ws {
                    let on = hyper::upgrade::on(&mut req);
                    tokio::spawn(async move {
                        let Ok(stream) = on.await else { return };
                        use tokio_tungstenite::tungstenite::protocol::Role;
                        echo(tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(stream), Role::Server, None).await).await;
                    });
                }
                let resp = http::Response::builder().status(status).body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
                Ok::<_, std::convert::Infallible>(resp)
            });
            tokio::spawn(async move {
                let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                b.enable_connect_protocol();
                let _ = b.serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_http2_reaches_an_http2_server() {
    let up = h2_echo_server().await;
    let p = start_proxy(&config(up, "").replace(r#"endpoints: ["#, "protocol: http2, endpoints: ["));
    let mut ws = connect_h2(p.listener_addrs[0]).await.expect("extended CONNECT carried to the h2 upstream");
    ws.send(Message::text("both h2")).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(m.into_text().unwrap().as_str(), "both h2");
    let (_, text) = admin_get(p.admin_addr, "/metrics").await;
    assert_eq!(metric_sum(&text, "weft_tunnels_active", &[("cluster", "c")]), 1.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_websocket_to_a_server_that_does_not_upgrade_is_a_502_not_a_dead_tunnel() {
    // A 200 to an extended CONNECT means "tunnel open": passing the plain server's 200 on would
    // leave the client writing frames into nothing.
    let up = Upstream::start("plain").await;
    let p = start_proxy(&config(up.addr, ""));
    assert_eq!(connect_h2(p.listener_addrs[0]).await.err().as_deref(), Some("status 502 Bad Gateway"));
}

//! The proxy's downstream (client-facing) HTTP/1.1 server, as a client on the wire sees it:
//! raw bytes over one TCP connection to the listener, a real upstream behind it. Keep-alive,
//! pipelining, request bodies by length and by chunks, `Expect: 100-continue`, HTTP/1.0 and
//! `Connection: close`, HEAD, streamed answers, garbage after a request, a head that trickles
//! in byte by byte. Every read is bounded, so a server that stalls fails the test, not hangs it.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weft_tests::*;

/// The bound on any single wait for the proxy: a read, a write, a connect.
const WAIT: Duration = Duration::from_secs(5);

/// One service for every host: `/v2/models/...` through an experiment (variant `a` always),
/// anything else straight to cluster `a`. Both clusters are the one upstream.
fn config(up: SocketAddr) -> String {
    format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - name: s
    hosts: ["*"]
    routes:
      - {{name: infer, match: {{path_prefix: /v2/models/}}, experiment: ab}}
      - {{name: other, match: {{path_prefix: /}}, cluster: a}}
experiments:
  - name: ab
    salt: s1
    variants:
      - {{name: a, cluster: a, weight: 1}}
      - {{name: b, cluster: b, weight: 0}}
clusters:
  - {{name: a, endpoints: ["{up}"]}}
  - {{name: b, endpoints: ["{up}"]}}
"#
    )
}

/// A proxy in front of an [`Upstream`] named `up` (whose plain answer is the body `up`).
async fn setup() -> (std::sync::Arc<Upstream>, weft_proxy::Proxy) {
    let up = Upstream::start("up").await;
    let p = start_proxy(&config(up.addr));
    (up, p)
}

/// How a response's body was delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length,
    Chunked,
    Close,
}

#[derive(Debug)]
struct Resp {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    framing: Framing,
}

impl Resp {
    fn status(&self) -> u16 {
        self.status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("status line {:?}", self.status_line))
    }

    /// Every value of header `name` (case-insensitive), in order.
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.all(name).first().copied()
    }

    /// Whether a comma-separated header (`connection`, `transfer-encoding`) lists `token`.
    fn lists(&self, name: &str, token: &str) -> bool {
        self.all(name).iter().flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection that writes raw bytes and parses the responses itself.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        let s = tokio::time::timeout(WAIT, TcpStream::connect(addr)).await.expect("connect in time").expect("connect");
        Conn { s, buf: Vec::new() }
    }

    async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(WAIT, self.s.write_all(bytes)).await.expect("write in time").expect("write");
    }

    /// Read more bytes into the buffer; false at EOF. Panics on a stall or an error.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(WAIT, self.s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no bytes within {WAIT:?}; have {:?}", String::from_utf8_lossy(&self.buf)))
            .unwrap_or_else(|e| panic!("read failed: {e}; have {:?}", String::from_utf8_lossy(&self.buf)));
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// One CRLF-terminated line (without the CRLF).
    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return l;
            }
            assert!(self.fill().await, "EOF inside a line; have {:?}", String::from_utf8_lossy(&self.buf));
        }
    }

    async fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill().await, "EOF with {} of {n} body bytes", self.buf.len());
        }
        self.buf.drain(..n).collect()
    }

    /// A status line and its header section.
    async fn head(&mut self) -> (String, Vec<(String, String)>) {
        let status_line = self.line().await;
        assert!(status_line.starts_with("HTTP/1."), "not a status line: {status_line:?}");
        let mut headers = Vec::new();
        loop {
            let l = self.line().await;
            if l.is_empty() {
                return (status_line, headers);
            }
            let (k, v) = l.split_once(':').unwrap_or_else(|| panic!("not a header line: {l:?}"));
            headers.push((k.to_string(), v.trim().to_string()));
        }
    }

    /// The next final response (1xx heads are skipped); `bodiless` for an answer to HEAD.
    async fn response(&mut self, bodiless: bool) -> Resp {
        loop {
            let (status_line, headers) = self.head().await;
            let mut r = Resp { status_line, headers, body: Vec::new(), framing: Framing::None };
            let status = r.status();
            if (100..200).contains(&status) {
                continue;
            }
            if bodiless || status == 204 || status == 304 {
                return r;
            }
            if r.lists("transfer-encoding", "chunked") {
                r.framing = Framing::Chunked;
                r.body = self.chunked_body().await;
            } else if let Some(len) = r.header("content-length") {
                let len: usize = len.parse().unwrap_or_else(|_| panic!("content-length {len:?}"));
                r.framing = Framing::Length;
                r.body = self.exact(len).await;
            } else {
                r.framing = Framing::Close;
                while self.fill().await {}
                r.body = std::mem::take(&mut self.buf);
            }
            return r;
        }
    }

    async fn chunked_body(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let size_line = self.line().await;
            let hex = size_line.split(';').next().unwrap().trim();
            let n = usize::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("chunk size line {size_line:?}"));
            if n == 0 {
                // Trailers, then the blank line.
                while !self.line().await.is_empty() {}
                return body;
            }
            body.extend(self.exact(n).await);
            assert_eq!(self.line().await, "", "CRLF after a chunk's data");
        }
    }

    /// Wait for the peer to close: EOF with nothing more sent.
    async fn expect_eof(&mut self) {
        let got_eof = !self.fill().await;
        assert!(got_eof && self.buf.is_empty(), "expected the proxy to close; got more bytes {:?}", String::from_utf8_lossy(&self.buf));
    }
}

fn get_req(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: s\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_serves_three_requests_on_one_connection() {
    let (up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    for i in 0..3 {
        c.send(get_req(&format!("/ka/{i}")).as_bytes()).await;
        let r = c.response(false).await;
        assert_eq!((r.status(), r.text().as_str()), (200, "up"), "request {i}: {r:?}");
        assert!(!r.lists("connection", "close"), "request {i} kept the connection: {r:?}");
    }
    assert_eq!(up.hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    // Two requests in one write; `/echo` answers with its (empty) body and `x-body-len`, the
    // other path with the upstream's name, so the order shows.
    c.send(format!("{}{}", get_req("/echo"), get_req("/plain")).as_bytes()).await;
    let first = c.response(false).await;
    assert_eq!((first.status(), first.header("x-body-len"), first.text().as_str()), (200, Some("0"), ""), "{first:?}");
    let second = c.response(false).await;
    assert_eq!((second.status(), second.header("x-body-len"), second.text().as_str()), (200, None, "up"), "{second:?}");
    // Still open for a third.
    c.send(get_req("/third").as_bytes()).await;
    assert_eq!(c.response(false).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_and_chunked_request_bodies_reach_the_upstream_intact() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    let body: Vec<u8> = (0..10 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let mut req = format!("POST /echo HTTP/1.1\r\nHost: s\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    req.extend_from_slice(&body);
    c.send(&req).await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.header("x-body-len")), (200, Some("10240")), "{:?}", r.status_line);
    assert!(r.body == body, "the length-delimited body came back changed");

    // Several chunks, one with an extension, written one at a time, then an empty trailer.
    c.send(b"POST /echo HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n").await;
    let chunks: [&[u8]; 4] = [b"hello", b", ", b"chunked world", &[b'z'; 3000]];
    let mut want = Vec::new();
    for (i, ch) in chunks.iter().enumerate() {
        let ext = if i == 1 { ";name=value" } else { "" };
        let mut frame = format!("{:x}{ext}\r\n", ch.len()).into_bytes();
        frame.extend_from_slice(ch);
        frame.extend_from_slice(b"\r\n");
        c.send(&frame).await;
        want.extend_from_slice(ch);
    }
    c.send(b"0\r\n\r\n").await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.header("x-body-len")), (200, Some(want.len().to_string().as_str())), "{:?}", r.status_line);
    assert!(r.body == want, "the chunked body came back changed: {:?}", r.text());

    // The connection is still in step for a request after both bodies.
    c.send(get_req("/after").as_bytes()).await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "up"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_gets_the_interim_answer_before_the_body() {
    let (up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(b"POST /echo HTTP/1.1\r\nHost: s\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").await;
    // Nothing of the body is sent until the proxy says to go on.
    let (interim, _) = c.head().await;
    assert_eq!(interim, "HTTP/1.1 100 Continue");
    c.send(b"hello").await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.header("x-body-len"), r.text().as_str()), (200, Some("5"), "hello"), "{r:?}");
    assert_eq!(up.hits(), 1);
    c.send(get_req("/after").as_bytes()).await;
    assert_eq!(c.response(false).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_request_is_answered_then_the_connection_closes() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(b"GET /old HTTP/1.0\r\nHost: s\r\n\r\n").await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "up"), "{r:?}");
    assert!(r.status_line.starts_with("HTTP/1.0 ") || r.status_line.starts_with("HTTP/1.1 "), "{:?}", r.status_line);
    assert!(!r.lists("connection", "keep-alive"), "no keep-alive offered to a 1.0 client that did not ask: {r:?}");
    if r.framing != Framing::Close {
        c.expect_eof().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_is_echoed_and_the_connection_closes() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(b"GET /bye HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n").await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "up"), "{r:?}");
    assert!(r.lists("connection", "close"), "the answer says the connection closes: {r:?}");
    c.expect_eof().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_response_has_no_body_and_the_next_request_parses() {
    let (up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    // Pipelined: a body after the HEAD answer would be read as the GET's status line.
    c.send(format!("HEAD /h HTTP/1.1\r\nHost: s\r\n\r\n{}", get_req("/g")).as_bytes()).await;
    let head = c.response(true).await;
    assert_eq!(head.status(), 200, "{head:?}");
    if let Some(len) = head.header("content-length") {
        assert_eq!(len, "2", "a length given for HEAD is the GET's: {head:?}");
    }
    let get = c.response(false).await;
    assert_eq!((get.status(), get.text().as_str()), (200, "up"), "{get:?}");
    // And on keep-alive (not pipelined): HEAD, then GET once its answer is in.
    c.send(b"HEAD /h2 HTTP/1.1\r\nHost: s\r\n\r\n").await;
    assert_eq!(c.response(true).await.status(), 200);
    c.send(get_req("/g2").as_bytes()).await;
    let get = c.response(false).await;
    assert_eq!((get.status(), get.text().as_str()), (200, "up"), "{get:?}");
    assert_eq!(up.hits(), 4);
}

const SSE_BODY: &str = "data: token-0\n\ndata: token-1\n\ndata: token-2\n\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answer_is_chunked_for_http11_clients() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(get_req("/sse?n=3&gap_ms=20").as_bytes()).await;
    let r = c.response(false).await;
    assert_eq!(r.status(), 200, "{r:?}");
    assert_eq!(r.framing, Framing::Chunked, "{r:?}");
    assert!(r.header("content-length").is_none(), "{r:?}");
    assert_eq!(r.text(), SSE_BODY);
    // The chunked end kept the connection in step.
    c.send(get_req("/after").as_bytes()).await;
    assert_eq!(c.response(false).await.text(), "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answer_to_http10_client_ends_with_the_close() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(b"GET /sse?n=3&gap_ms=20 HTTP/1.0\r\nHost: s\r\n\r\n").await;
    let r = c.response(false).await;
    assert_eq!(r.status(), 200, "{r:?}");
    assert!(!r.lists("transfer-encoding", "chunked"), "no chunked coding for HTTP/1.0: {r:?}");
    assert_eq!(r.framing, Framing::Close, "{r:?}");
    assert_eq!(r.text(), SSE_BODY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_a_request_gets_400_and_a_close() {
    let (up, p) = setup().await;
    let addr = p.listener_addrs[0];
    let mut c = Conn::open(addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01garbage\r\n\r\n").await;
    let r = c.response(false).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "up"), "{r:?}");
    let bad = c.response(false).await;
    assert_eq!(bad.status(), 400, "{bad:?}");
    c.expect_eof().await;
    assert_eq!(up.hits(), 1, "the garbage went nowhere");
    // A new connection is served as before.
    let mut c = Conn::open(addr).await;
    c.send(get_req("/next").as_bytes()).await;
    assert_eq!(c.response(false).await.text(), "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_written_one_byte_at_a_time_is_served() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    let req = b"POST /echo HTTP/1.1\r\nHost: s\r\nX-Slow: yes\r\nContent-Length: 3\r\n\r\nabc";
    for b in req {
        c.send(&[*b]).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let r = c.response(false).await;
    assert_eq!((r.status(), r.text().as_str()), (200, "abc"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_line_is_http11_ok_and_the_experiment_variant_is_named() {
    let (_up, p) = setup().await;
    let mut c = Conn::open(p.listener_addrs[0]).await;
    c.send(get_req("/v2/models/m/infer").as_bytes()).await;
    let r = c.response(false).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.header("x-weft-variant"), Some("a"), "{r:?}");
    assert_eq!(r.text(), "up");
    // A route without an experiment names no variant.
    c.send(get_req("/plain").as_bytes()).await;
    let r = c.response(false).await;
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.header("x-weft-variant"), None, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_keepalive_timeout_and_a_busy_one_is_not() {
    let up = Upstream::start("up").await;
    let cfg = config(up.addr).replace(
        r#"listeners: [{name: out, address: "127.0.0.1:0"}]"#,
        r#"listeners: [{name: out, address: "127.0.0.1:0", keepalive_timeout: 1s}]"#,
    );
    let p = start_proxy(&cfg);
    let addr = p.listener_addrs[0];
    // Busy: a request every 200 ms for well past the timeout (1.6 s) keeps the connection.
    let mut busy = Conn::open(addr).await;
    for _ in 0..8 {
        busy.send(get_req("/plain").as_bytes()).await;
        assert_eq!(busy.response(false).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Idle: after one exchange the proxy closes it (EOF within the bounded wait).
    let mut idle = Conn::open(addr).await;
    idle.send(get_req("/plain").as_bytes()).await;
    assert_eq!(idle.response(false).await.status(), 200);
    idle.expect_eof().await;
    // A connection that never sends anything is closed too.
    let mut silent = Conn::open(addr).await;
    silent.expect_eof().await;
}

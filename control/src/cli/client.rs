//! `weftctl`'s HTTP client: HTTP/1.1 on hyper over TCP, or TLS for `https://` nodes (checked
//! against `--ca`, the mesh root, by the name they are addressed by), trying the configured
//! control nodes in order.
//!
//! Any node can serve any request (followers forward to the leader), so the client only needs
//! *one* that answers: a node that refuses the connection or does not answer in time is
//! skipped for the next. A `503` means the cluster has no leader right now (an election is
//! in progress), so it is retried a few times with a short backoff, moving on to the next node
//! each time. Every other answer, success or error, is final.
//!
//! One connection per request: a CLI sends a handful of requests, and a fresh connection can
//! never be a stale keep-alive one whose failure would leave a write's outcome unknown.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// A control node to talk to: `host:port`, from `http(s)://host:port` or `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub authority: String,
    /// Spoken to over TLS (`https://`).
    pub tls: bool,
}

impl Server {
    /// Parses one `--server` entry; a bare `host:port` is https when `tls` (a `--ca` was
    /// given), else http. A path is refused rather than silently dropped.
    pub fn parse(url: &str, tls: bool) -> Result<Server, String> {
        let u = url.trim();
        let (tls, rest) = match (u.strip_prefix("https://"), u.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => (tls, u),
        };
        if rest.contains("://") {
            return Err(format!("{u}: only http:// and https:// URLs are supported"));
        }
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') || authority.contains('?') {
            return Err(format!("{u}: expected http://HOST:PORT"));
        }
        // A bare host (or [v6]) gets HTTP's default port.
        let has_port = match authority.rfind(']') {
            Some(i) => authority[i..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = match (has_port, tls) {
            (true, _) => authority.to_string(),
            (false, false) => format!("{authority}:80"),
            (false, true) => format!("{authority}:443"),
        };
        let port_ok = authority.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!("{u}: expected http://HOST:PORT"));
        }
        Ok(Server { authority, tls })
    }

    /// Parses a comma-separated `--server` / `WEFT_SERVER` list.
    pub fn parse_list(list: &str, tls: bool) -> Result<Vec<Server>, String> {
        let servers =
            list.split(',').filter(|s| !s.trim().is_empty()).map(|s| Server::parse(s, tls)).collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err("--server: no server given".into());
        }
        Ok(servers)
    }
}

/// An answer from some node: its status and JSON body (a non-JSON body as a JSON string).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub body: Value,
    /// The node that answered.
    pub server: String,
}

impl Response {
    /// The server's error as one line: `message (field: f)`, plus the current revision a
    /// failed precondition reports.
    pub fn error_line(&self) -> String {
        let msg = match &self.body["error"] {
            Value::String(e) => e.clone(),
            _ => match &self.body {
                Value::String(s) if !s.trim().is_empty() => {
                    let s: String = s.trim().chars().take(200).collect();
                    format!("HTTP {} from {}: {s}", self.status, self.server)
                }
                _ => format!("HTTP {} from {}", self.status, self.server),
            },
        };
        let mut line = msg;
        if let Value::String(f) = &self.body["field"] {
            line.push_str(&format!(" (field: {f})"));
        }
        if let Some(r) = self.body["current_revision"].as_u64() {
            line.push_str(&format!(" (current revision: {r})"));
        }
        line
    }
}

/// Why a request got no usable answer.
#[derive(Debug)]
pub enum ClientError {
    /// No node answered (each entry: `host:port: why`).
    Unreachable(Vec<String>),
    /// A write was sent but its answer did not arrive: it may or may not have happened.
    Unknown(String),
    /// The request cannot be sent at all (not a valid URI path).
    Invalid(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Unreachable(why) => write!(f, "no control node answered: {}", why.join("; ")),
            ClientError::Unknown(why) => write!(f, "{why}; the request may or may not have taken effect"),
            ClientError::Invalid(why) => f.write_str(why),
        }
    }
}

/// How one attempt at one node ended.
enum Attempt {
    Answer(Response),
    /// Nothing happened at that node (no connection), or the request is safe to repeat.
    Skip(String),
    /// A non-idempotent request went out and its answer was lost.
    Unknown(String),
}

pub struct Client {
    servers: Vec<Server>,
    /// How `https://` nodes are dialed (`--ca`, `--cert`).
    tls: crate::tls::dial::Dialer,
    token: Option<String>,
    /// The node that answered last; later requests start there.
    preferred: usize,
    /// Bound on the whole request (connect, send, read the body).
    pub timeout: Duration,
    /// Bound on connecting alone, so a dead node (dropped SYNs) fails over quickly.
    pub connect_timeout: Duration,
    /// How many `503`s are retried, and the first backoff (doubled each time).
    pub retries_503: u32,
    pub backoff: Duration,
}

impl Client {
    pub fn new(servers: Vec<Server>, token: Option<String>) -> Client {
        Client {
            servers,
            tls: crate::tls::dial::Dialer::default(),
            token,
            preferred: 0,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            retries_503: 3,
            backoff: Duration::from_millis(250),
        }
    }

    /// Dial `https://` nodes with `dialer`.
    pub fn with_tls(mut self, dialer: crate::tls::dial::Dialer) -> Client {
        self.tls = dialer;
        self
    }

    /// Sends `method path` with an optional JSON body and `If-Match` revision, failing over
    /// between nodes as described in the module doc.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<u64>,
    ) -> Result<Response, ClientError> {
        if path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(ClientError::Invalid(format!("{path:?} cannot be sent as a request path")));
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let n = self.servers.len();
        let mut skipped: Vec<String> = Vec::new();
        let mut tries_503 = 0;
        let mut delay = self.backoff;
        let mut i = self.preferred;
        loop {
            let idx = i % n;
            match self.attempt(idx, &method, path, body.clone(), if_match).await {
                Attempt::Answer(r) if r.status == StatusCode::SERVICE_UNAVAILABLE && tries_503 < self.retries_503 => {
                    tries_503 += 1;
                    skipped.clear();
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Attempt::Answer(r) => {
                    self.preferred = idx;
                    return Ok(r);
                }
                Attempt::Skip(why) => {
                    skipped.push(why);
                    if skipped.len() >= n {
                        return Err(ClientError::Unreachable(skipped));
                    }
                }
                Attempt::Unknown(why) => return Err(ClientError::Unknown(why)),
            }
            i += 1;
        }
    }

    async fn attempt(&self, idx: usize, method: &Method, path: &str, body: Bytes, if_match: Option<u64>) -> Attempt {
        let server = &self.servers[idx];
        let addr = server.authority.as_str();
        let plain = crate::tls::dial::Dialer::default();
        let dialer = if server.tls { &self.tls } else { &plain };
        if server.tls && !dialer.is_tls() {
            return Attempt::Skip(format!("{addr}: https needs the roots to check the node against (--ca FILE)"));
        }
        let connect = tokio::time::timeout(self.connect_timeout, dialer.connect(addr));
        let stream = match connect.await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Attempt::Skip(format!("{addr}: {e}")),
            Err(_) => return Attempt::Skip(format!("{addr}: no connection within {:?}", self.connect_timeout)),
        };
        // GET is safe to repeat elsewhere; so is PUT of a spec (the same spec again is
        // `changed: false`). POST and DELETE are not: a second try could do something else.
        let repeatable = *method == Method::GET || *method == Method::PUT;
        let fut = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| (false, format!("{addr}: handshake: {e}")))?;
            tokio::spawn(conn);
            let mut req = http::Request::builder()
                .method(method.clone())
                .uri(path)
                .header(http::header::HOST, addr)
                .header(http::header::ACCEPT, "application/json")
                .header(http::header::USER_AGENT, concat!("weftctl/", env!("CARGO_PKG_VERSION")));
            if !body.is_empty() {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
            }
            if let Some(t) = &self.token {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            if let Some(r) = if_match {
                req = req.header(http::header::IF_MATCH, r.to_string());
            }
            let req = req.body(Full::new(body)).map_err(|e| (false, format!("building the request: {e}")))?;
            // With the causes: a TLS refusal after the handshake (no client certificate) is an
            // alert under hyper's "connection error".
            let resp = sender.send_request(req).await.map_err(|e| (true, format!("{addr}: {}", weft_proxy::xds::dial::causes(&e))))?;
            let status = resp.status();
            let bytes =
                resp.into_body().collect().await.map_err(|e| (true, format!("{addr}: reading the answer: {e}")))?;
            Ok::<_, (bool, String)>((status, bytes.to_bytes()))
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok((status, bytes))) => {
                let body = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
                Attempt::Answer(Response { status, body, server: addr.to_string() })
            }
            Ok(Err((sent, why))) if sent && !repeatable => Attempt::Unknown(why),
            Ok(Err((_, why))) => Attempt::Skip(why),
            Err(_) if repeatable => Attempt::Skip(format!("{addr}: no answer within {:?}", self.timeout)),
            Err(_) => Attempt::Unknown(format!("{addr}: no answer within {:?}", self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn server_urls() {
        let a = |s: &str| Server::parse(s, false).map(|s| s.authority);
        assert_eq!(a("http://127.0.0.1:7700").unwrap(), "127.0.0.1:7700");
        assert_eq!(a("http://ctl.example:7700/").unwrap(), "ctl.example:7700");
        assert_eq!(a("10.0.0.1:7700").unwrap(), "10.0.0.1:7700");
        assert_eq!(a("http://ctl").unwrap(), "ctl:80");
        assert_eq!(a("http://[::1]:7700").unwrap(), "[::1]:7700");
        assert_eq!(a("http://[::1]").unwrap(), "[::1]:80");
        assert_eq!(Server::parse("https://ctl:7700", false).unwrap(), Server { authority: "ctl:7700".into(), tls: true });
        assert_eq!(Server::parse("ctl", true).unwrap(), Server { authority: "ctl:443".into(), tls: true });
        assert_eq!(Server::parse("http://ctl:1", true).unwrap(), Server { authority: "ctl:1".into(), tls: false });
        assert!(a("http://ctl:7700/v1").is_err());
        assert!(a("http://ctl:port").is_err());
        assert!(a("ftp://x:1").is_err());
        let l = Server::parse_list("http://a:1, b:2,", false).unwrap();
        assert_eq!(l.iter().map(|s| s.authority.as_str()).collect::<Vec<_>>(), ["a:1", "b:2"]);
        assert!(Server::parse_list(" , ", false).is_err());
    }

    #[test]
    fn error_lines() {
        let r = |status: u16, body: Value| Response {
            status: StatusCode::from_u16(status).unwrap(),
            body,
            server: "h:1".into(),
        };
        let e = r(422, serde_json::json!({"error": "must start with '/'", "field": "routes[0].match.path_prefix"}));
        assert_eq!(e.error_line(), "must start with '/' (field: routes[0].match.path_prefix)");
        let e = r(409, serde_json::json!({"error": "revision mismatch", "current_revision": 9}));
        assert_eq!(e.error_line(), "revision mismatch (current revision: 9)");
        assert_eq!(
            r(502, Value::String("bad gateway\n".into())).error_line(),
            "HTTP 502 Bad Gateway from h:1: bad gateway"
        );
        assert_eq!(r(500, Value::String(String::new())).error_line(), "HTTP 500 Internal Server Error from h:1");
    }

    /// A server answering each connection with the next canned status (then 200 forever),
    /// and what it saw.
    async fn canned(statuses: Vec<u16>) -> (String, Arc<Mutex<Vec<test_server::Seen>>>) {
        test_server::start(statuses.into_iter().map(|st| (st, "{}".to_string())).collect()).await
    }

    /// A port nothing listens on.
    async fn closed_port() -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().to_string()
    }

    fn client(addrs: &[&str]) -> Client {
        let servers = addrs.iter().map(|a| Server::parse(a, false).unwrap()).collect();
        let mut c = Client::new(servers, Some("t".into()));
        c.backoff = Duration::from_millis(1);
        c
    }

    #[tokio::test]
    async fn skips_refusing_nodes_and_remembers_the_one_that_answered() {
        let dead = closed_port().await;
        let (live, hits) = canned(vec![]).await;
        let mut c = client(&[&dead, &live]);
        let r = c.request(Method::GET, "/v1/status", None, None).await.unwrap();
        assert_eq!((r.status, r.server.as_str()), (StatusCode::OK, live.as_str()));
        c.request(Method::GET, "/v1/status", None, None).await.unwrap();
        assert_eq!(hits.lock().unwrap().len(), 2);
        assert_eq!(c.preferred, 1, "the live node is tried first now");
    }

    #[tokio::test]
    async fn retries_503_then_gives_up_with_the_last_answer() {
        let (live, hits) = canned(vec![503, 503]).await;
        let mut c = client(&[&live]);
        let r = c.request(Method::PUT, "/v1/clusters/c", Some(&serde_json::json!({})), None).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(hits.lock().unwrap().len(), 3);

        let (busy, hits) = canned(vec![503; 10]).await;
        let mut c = client(&[&busy]);
        let r = c.request(Method::GET, "/v1/status", None, None).await.unwrap();
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(hits.lock().unwrap().len(), 4, "one try plus three retries");
    }

    #[tokio::test]
    async fn other_errors_are_final_and_no_answer_at_all_names_every_node() {
        let (live, hits) = canned(vec![422]).await;
        let mut c = client(&[&live]);
        let r = c.request(Method::PUT, "/v1/clusters/c", Some(&serde_json::json!({"lb": "x"})), Some(7)).await.unwrap();
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
        let seen = hits.lock().unwrap().clone();
        assert_eq!(
            seen,
            [test_server::Seen {
                line: "PUT /v1/clusters/c".into(),
                if_match: Some("7".into()),
                body: r#"{"lb":"x"}"#.into()
            }]
        );

        let (a, b) = (closed_port().await, closed_port().await);
        let e = client(&[&a, &b]).request(Method::GET, "/v1/status", None, None).await.unwrap_err();
        let bad = client(&[&a]).request(Method::GET, "/v1/a b", None, None).await.unwrap_err();
        assert!(matches!(bad, ClientError::Invalid(_)), "{bad}");
        let msg = e.to_string();
        assert!(matches!(e, ClientError::Unreachable(ref v) if v.len() == 2), "{msg}");
        assert!(msg.contains(&a) && msg.contains(&b), "{msg}");
    }

    #[tokio::test]
    async fn a_lost_answer_to_a_post_is_not_repeated() {
        // Accepts, reads, never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        let (live, hits) = canned(vec![]).await;
        let mut c = client(&[&silent, &live]);
        c.timeout = Duration::from_millis(200);
        let e =
            c.request(Method::POST, "/v1/services/s/rollback", Some(&serde_json::json!({"revision": 1})), None).await;
        assert!(matches!(e, Err(ClientError::Unknown(_))), "{e:?}");
        assert_eq!(hits.lock().unwrap().len(), 0);
        // A GET moves on.
        let r = c.request(Method::GET, "/v1/services", None, None).await.unwrap();
        assert_eq!(r.server, live);
    }
}

/// A scripted HTTP/1.1 server for the client's and apply's tests.
#[cfg(test)]
pub(crate) mod test_server {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request as the server saw it: `METHOD /path`, its `if-match` header, its body.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Seen {
        pub line: String,
        pub if_match: Option<String>,
        pub body: String,
    }

    /// Serves one request per connection, answering the n-th with `answers[n]` (status, JSON
    /// body), then `200 {}`. Returns its address and what it has seen so far.
    pub async fn start(answers: Vec<(u16, String)>) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut s, _)) = l.accept().await {
                // The whole request (head and body) is read before answering: closing a socket
                // with unread input resets the connection, and the client could see that
                // instead of the answer.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body) = loop {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break (String::from_utf8_lossy(&buf).into_owned(), String::new()),
                        Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    }
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                            })
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if body.len() >= len {
                            break (head.to_string(), body.to_string());
                        }
                    }
                };
                let line = head.lines().next().unwrap_or_default().rsplit_once(' ').map(|(l, _)| l.to_string());
                let if_match = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("if-match:").map(|v| v.trim().to_string()));
                s2.lock().unwrap().push(Seen { line: line.unwrap_or_default(), if_match, body });
                let (status, body) = answers.get(n).cloned().unwrap_or((200, "{}".into()));
                n += 1;
                let resp =
                    format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        (addr, seen)
    }
}

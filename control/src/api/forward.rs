//! Forwarding to the leader: a follower that receives a write (or a linearizable read) sends
//! it on to the leader and relays the answer, so clients may talk to any node and never see a
//! redirect. A forwarded request carries `x-weft-forwarded-by`; a node never forwards such a
//! request again (it answers 503 and the client retries), so a leader change in flight cannot
//! make requests loop.
//!
//! Connections to peers are kept in a small per-address idle stack and reused.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// Marks a request a node forwarded (the value is its id).
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("x-weft-forwarded-by");

/// Longest time a forwarded request may take (a write waits for a quorum fsync).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 64;

/// The headers a forwarded request keeps (hop-by-hop ones and `host` are dropped).
const KEPT: [HeaderName; 4] = [
    http::header::AUTHORIZATION,
    http::header::CONTENT_TYPE,
    http::header::IF_MATCH,
    http::header::ACCEPT,
];

/// Connections to peers' API ports, dialed by `dialer` (TLS when the cluster runs it).
#[derive(Default)]
pub struct Peers {
    dialer: crate::tls::dial::Dialer,
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl Peers {
    pub fn new(dialer: crate::tls::dial::Dialer) -> Peers {
        Peers { dialer, idle: Mutex::default() }
    }

    async fn connection(&self, addr: &str) -> Result<SendRequest<Full<Bytes>>, String> {
        loop {
            let c = self.idle.lock().unwrap().get_mut(addr).and_then(Vec::pop);
            match c {
                Some(c) if !c.is_closed() => return Ok(c),
                Some(_) => continue,
                None => break,
            }
        }
        let stream = self.dialer.connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        tokio::spawn(conn);
        Ok(sender)
    }

    fn put_back(&self, addr: &str, c: SendRequest<Full<Bytes>>) {
        let mut idle = self.idle.lock().unwrap();
        let stack = idle.entry(addr.to_owned()).or_default();
        if stack.len() < IDLE_PER_PEER {
            stack.push(c);
        }
    }

    /// Sends `req` (whose body is already collected into `body`) to `addr` and returns the
    /// peer's response with its body collected. `forwarded_by` marks a request relayed for a
    /// client (the peer will not relay it again); `None` for this node's own calls.
    pub async fn forward(
        &self,
        addr: &str,
        forwarded_by: Option<u64>,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response<Body>, String> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut b = Request::builder().method(parts.method.clone()).uri(path).header(http::header::HOST, addr);
        for name in KEPT {
            for v in parts.headers.get_all(&name) {
                b = b.header(name.clone(), v.clone());
            }
        }
        if let Some(me) = forwarded_by {
            b = b.header(FORWARDED_BY, HeaderValue::from(me));
        }
        let req = b.body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let fut = async {
            let mut c = self.connection(addr).await?;
            let resp = c.send_request(req).await.map_err(|e| format!("forwarding to {addr}: {e}"))?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(|e| format!("reading from {addr}: {e}"))?.to_bytes();
            self.put_back(addr, c);
            Ok::<_, String>(Response::from_parts(parts, Body::from(bytes)))
        };
        tokio::time::timeout(FORWARD_TIMEOUT, fut)
            .await
            .unwrap_or_else(|_| Err(format!("the leader at {addr} did not answer within {FORWARD_TIMEOUT:?}")))
    }
}

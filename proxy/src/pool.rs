//! Upstream connections. HTTP/1.1: a stack of idle keep-alive connections per endpoint and
//! worker (weft's own client, [`crate::h1`]), a connection going back on the stack when its
//! response body ends. HTTP/2: one multiplexed hyper connection per endpoint and worker. Each
//! worker thread has its own pools so a connection is only ever driven by the runtime that
//! uses it.

use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;
use tokio::net::TcpStream;

use crate::body::ReqBody;
use crate::config::UpstreamProtocol;
use crate::h1;
use crate::stream::Stream;

pub type H2 = http2::SendRequest<ReqBody>;

/// A connection ready to carry one request.
pub enum Conn {
    /// `reused` = it came from the idle stack (so it may have been closed by the peer meanwhile).
    H1 { conn: h1::Conn, reused: bool },
    H2(H2),
}

#[derive(Debug)]
pub enum ConnectError {
    /// `max_connections` reached for the cluster.
    Overflow,
    Failed(String),
    Timeout,
}

/// How many sweeps (one a second, see [`Pool::sweep`]) an HTTP/1.1 connection may stay idle
/// before it is closed: hyper-util's 90 s.
pub const MAX_IDLE_SWEEPS: u32 = 90;

#[derive(Default)]
pub struct Pool {
    idle: Mutex<Idle>,
    h2: Mutex<Option<H2>>,
}

/// Idle HTTP/1.1 connections, each with the sweep count at which it went idle.
#[derive(Default)]
struct Idle {
    conns: Vec<(h1::Conn, u32)>,
    sweeps: u32,
}

/// Connection-level settings shared by the endpoints of a cluster.
pub struct Dial<'a> {
    /// The endpoint's `host:port` as configured (the TLS server name when none is set).
    pub label: &'a str,
    /// TLS origination, if the cluster has it.
    pub origin: Option<&'a crate::mtls::Origin>,
    pub protocol: UpstreamProtocol,
    pub connect_timeout: Duration,
    pub max_connections: u32,
    /// Open connections of the whole cluster.
    pub open: &'a Arc<AtomicU32>,
}

impl Pool {
    pub async fn checkout(&self, addr: SocketAddr, dial: &Dial<'_>) -> Result<Conn, ConnectError> {
        match dial.protocol {
            UpstreamProtocol::Http1 => {
                loop {
                    let popped = self.idle.lock().unwrap().conns.pop();
                    let Some((mut conn, _)) = popped else { break };
                    if conn.is_usable() {
                        return Ok(Conn::H1 { conn, reused: true });
                    }
                }
                // Dialing is boxed: a cold path whose connect future would otherwise size
                // every request's future (each try's future is copied into its caller's),
                // making the hot path copy kilobytes per request.
                Ok(Conn::H1 { conn: Box::pin(dial_h1(addr, dial)).await?, reused: false })
            }
            UpstreamProtocol::Http2 => {
                let current = self.h2.lock().unwrap().clone();
                if let Some(s) = current.filter(|s| !s.is_closed()) {
                    return Ok(Conn::H2(s));
                }
                let sender = Box::pin(dial_h2(addr, dial)).await?;
                *self.h2.lock().unwrap() = Some(sender.clone());
                Ok(Conn::H2(sender))
            }
        }
    }

    /// Return an HTTP/1.1 connection whose exchange ended cleanly.
    pub fn checkin(&self, conn: h1::Conn, max_idle: usize) {
        let mut idle = self.idle.lock().unwrap();
        if idle.conns.len() < max_idle {
            let at = idle.sweeps;
            idle.conns.push((conn, at));
        }
    }

    /// Close the idle HTTP/1.1 connections that the upstream closed meanwhile, or that sat idle
    /// past [`MAX_IDLE_SWEEPS`]. Nothing watches an idle connection (no task per connection),
    /// so without this a closed one would keep its socket and its place in the cluster's
    /// `max_connections` until a request on this worker happened to pick it. Each worker
    /// sweeps its own pools once a second (`server::sweep_idle`); no system call is made for
    /// a connection whose socket has not become readable.
    pub fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap();
        idle.sweeps = idle.sweeps.wrapping_add(1);
        let now = idle.sweeps;
        idle.conns.retain_mut(|(c, at)| now.wrapping_sub(*at) < MAX_IDLE_SWEEPS && c.is_usable());
    }

    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().conns.len() + usize::from(self.h2.lock().unwrap().is_some())
    }
}

/// A fresh HTTP/1.1 connection, outside any pool (its response body checks it in when done).
pub async fn dial_h1(addr: SocketAddr, dial: &Dial<'_>) -> Result<h1::Conn, ConnectError> {
    let (stream, slot) = connect(addr, dial).await?;
    Ok(h1::Conn::new(stream, slot))
}

/// A fresh HTTP/2 connection (the caller keeps it as the endpoint's shared one).
async fn dial_h2(addr: SocketAddr, dial: &Dial<'_>) -> Result<H2, ConnectError> {
    let (stream, slot) = connect(addr, dial).await?;
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .map_err(handshake_failed)?;
    spawn_conn(conn, slot);
    Ok(sender)
}

/// One of the cluster's `max_connections`, held from the dial until the connection closes.
/// Released on drop, so a dial abandoned midway (its request was cancelled) gives it back.
pub struct ConnSlot(Arc<AtomicU32>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A TCP connection, with its TLS handshake done if the cluster has TLS; `connect_timeout`
/// bounds both.
async fn connect(addr: SocketAddr, dial: &Dial<'_>) -> Result<(Stream, ConnSlot), ConnectError> {
    if dial.open.fetch_add(1, Relaxed) >= dial.max_connections {
        dial.open.fetch_sub(1, Relaxed);
        return Err(ConnectError::Overflow);
    }
    let slot = ConnSlot(dial.open.clone());
    let tls = dial.origin.map(|o| o.dial(dial.label, dial.protocol)).transpose().map_err(ConnectError::Failed)?;
    let open = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let Some(t) = tls else { return Ok(Stream::Tcp(tcp)) };
        match tokio_rustls::TlsConnector::from(t.config).connect(t.name, tcp).await {
            Ok(s) => {
                t.stats.handshake("client", Ok(()));
                Ok(Stream::Tls(Box::new(s)))
            }
            Err(e) => {
                let reason = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).map_or("error", crate::tls::failure_reason);
                t.stats.handshake("client", Err(reason));
                tracing::warn!(upstream = %addr, reason, error = %e, "TLS handshake with the upstream failed");
                Err(format!("TLS handshake with {addr} failed: {e}"))
            }
        }
    };
    match tokio::time::timeout(dial.connect_timeout, open).await {
        Ok(Ok(s)) => Ok((s, slot)),
        Ok(Err(e)) => Err(ConnectError::Failed(e)),
        Err(_) => Err(ConnectError::Timeout),
    }
}

fn handshake_failed(e: hyper::Error) -> ConnectError {
    ConnectError::Failed(e.to_string())
}

/// Drive an HTTP/2 connection until it closes, then release its slot in the cluster's count.
fn spawn_conn<F>(conn: F, slot: ConnSlot)
where
    F: std::future::Future + Send + 'static,
{
    tokio::spawn(async move {
        let _ = conn.await;
        drop(slot);
    });
}

//! Upgraded connections: once an HTTP/1.1 upstream answers a client's `Upgrade` (a WebSocket
//! handshake) with `101 Switching Protocols`, the proxy writes the `101` downstream and then
//! joins the two sockets, copying bytes each way as they come, without reading them. An
//! HTTP/2 client's WebSocket (RFC 8441 extended CONNECT) is the same tunnel with an h2 stream
//! on the client's side, and an HTTP/1.1 connection or an h2 stream on the upstream's.
//!
//! The tunnel ends when both sides have closed their sending direction (each half-close is
//! passed on, so a client's close handshake still reaches the server), when either side fails,
//! when nothing has moved either way for the route's `idle_timeout` (default 5 min, as for a
//! stream), or when the listener drains. Its bytes and ends are counted per cluster
//! (`weft_tunnel_bytes_total`, `weft_tunnels_active`, `weft_tunnels_closed_total`).
//!
//! Each direction is its own copy loop over split halves, so a side that stops reading only
//! stalls the direction towards it (its socket buffer fills), never the other.

use bytes::BytesMut;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::cluster::Cluster;

/// A response extension set by the proxy beside [`crate::h1::Upgraded`]: what the tunnel
/// counts against and how long it may stay silent.
#[derive(Clone)]
pub struct Settings {
    pub cluster: Arc<Cluster>,
    pub idle: Option<Duration>,
}

/// Why a tunnel ended (the `reason` label of `weft_tunnels_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    /// Both sides closed their direction.
    Closed = 0,
    IdleTimeout = 1,
    /// A read or write failed (a reset).
    Error = 2,
    /// The listener drained (reload, shutdown).
    Drain = 3,
}

impl Close {
    pub const ALL: [Close; 4] = [Close::Closed, Close::IdleTimeout, Close::Error, Close::Drain];

    pub fn as_str(self) -> &'static str {
        match self {
            Close::Closed => "closed",
            Close::IdleTimeout => "idle_timeout",
            Close::Error => "error",
            Close::Drain => "drain",
        }
    }
}

/// When bytes last moved either way (milliseconds since the tunnel opened: both copy loops
/// mark it, the idle timer reads it).
struct Activity {
    since: Instant,
    at_ms: AtomicU64,
}

impl Activity {
    fn mark(&self) {
        self.at_ms.store(self.since.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.at_ms.load(Ordering::Relaxed))
    }
}

/// The upstream's answer to a handshake the proxy carried (an HTTP/1.1 Upgrade, or an HTTP/2
/// client's extended CONNECT, `h2_stream` its stream to be), made into what the client is
/// owed: an HTTP/1.1 client gets the `101` with the protocol the upstream chose, and its
/// connection is joined by weft's server once written ([`Settings`] tells it how); an HTTP/2
/// client gets 200 and its stream is joined here, to the upstream's connection (after a `101`)
/// or stream (an HTTP/2 upstream's 200). Any other answer goes back as it came, except a 2xx
/// to an HTTP/2 client, which would take it for an open tunnel: that is a 502.
pub(crate) fn on_response(
    rparts: &mut http::response::Parts,
    incoming: &crate::body::UpBody,
    h2_stream: Option<hyper::upgrade::OnUpgrade>,
    h2_cluster: bool,
    settings: Settings,
) -> Result<(), crate::proxy::Local> {
    use http::{StatusCode, header};
    match (h2_stream, rparts.status) {
        (None, StatusCode::SWITCHING_PROTOCOLS) => {
            let protocol = incoming.fields().and_then(|f| f.get_shared("upgrade")).and_then(|p| http::HeaderValue::from_maybe_shared(p).ok());
            if let Some(p) = protocol {
                rparts.headers.insert(header::UPGRADE, p);
            }
            rparts.extensions.insert(settings);
        }
        (Some(stream), StatusCode::SWITCHING_PROTOCOLS) => {
            rparts.status = StatusCode::OK;
            if let Some((up, up_buf, place)) = rparts.extensions.remove::<crate::h1::Upgraded>().and_then(|u| u.take()) {
                tokio::spawn(run_h2(stream, Upstream::H1(up, up_buf, place), settings));
            }
        }
        (Some(stream), StatusCode::OK) if h2_cluster => {
            if let Some(up) = rparts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
                tokio::spawn(run_h2(stream, Upstream::H2(up), settings));
            }
        }
        (Some(_), status) if status.is_success() => {
            return Err(crate::proxy::Local::new(
                StatusCode::BAD_GATEWAY,
                "upgrade_refused",
                format!("cluster {:?} answered the WebSocket handshake with {status}, not 101 Switching Protocols", &*settings.cluster.name),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// The upstream side of an HTTP/2 client's tunnel.
pub enum Upstream {
    /// An HTTP/1.1 connection after its `101`: the socket, what followed the head, and the
    /// cluster's `max_connections` place it holds.
    H1(crate::stream::Stream, BytesMut, crate::pool::ConnSlot),
    /// An HTTP/2 upstream's stream after its 200 to the extended CONNECT.
    H2(hyper::upgrade::OnUpgrade),
}

/// An HTTP/2 client's WebSocket (RFC 8441): once the proxy answered its extended CONNECT with
/// 200, hyper hands over the stream, which is joined to the upstream. The stream is not the
/// connection's, so a drain does not end it (the client's connection ends at the drain
/// timeout).
pub async fn run_h2(down: hyper::upgrade::OnUpgrade, up: Upstream, s: Settings) {
    use hyper_util::rt::TokioIo;
    static NEVER: AtomicBool = AtomicBool::new(false);
    let down = match down.await {
        Ok(stream) => TokioIo::new(stream),
        Err(e) => return tracing::debug!(error = %e, "client stream not upgraded; tunnel not opened"),
    };
    match up {
        Upstream::H1(tcp, buf, _place) => {
            run(down, BytesMut::new(), tcp, buf, &s, &NEVER).await;
        }
        Upstream::H2(up) => match up.await {
            Ok(stream) => {
                run(down, BytesMut::new(), TokioIo::new(stream), BytesMut::new(), &s, &NEVER).await;
            }
            Err(e) => tracing::debug!(error = %e, "upstream stream not upgraded; tunnel not opened"),
        },
    }
}

/// A fresh `Sec-WebSocket-Key` (16 random bytes, base64: RFC 6455 §4.1): an HTTP/2 client's
/// WebSocket has none (RFC 8441 §5), but the HTTP/1.1 handshake the proxy makes for it needs one.
pub fn websocket_key() -> http::HeaderValue {
    use base64::Engine;
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
    http::HeaderValue::try_from(key).expect("base64 is a valid header value")
}

/// Bytes read from one side and not yet written to the other, copied in pieces of this size.
const CHUNK: usize = 16 * 1024;

/// Join `down` (with `down_buf`, bytes the client sent after its handshake) and `up` (with
/// `up_buf`, bytes the upstream sent after its `101`) until the tunnel ends; returns why.
pub async fn run<D, U>(down: D, down_buf: BytesMut, up: U, up_buf: BytesMut, s: &Settings, closing: &AtomicBool) -> Close
where
    D: AsyncRead + AsyncWrite + Send,
    U: AsyncRead + AsyncWrite + Send,
{
    let stats = &s.cluster.stats;
    stats.tunnels_active.fetch_add(1, Ordering::Relaxed);
    let (down_r, down_w) = tokio::io::split(down);
    let (up_r, up_w) = tokio::io::split(up);
    let last = Activity { since: Instant::now(), at_ms: AtomicU64::new(0) };
    let to_up = copy(down_r, down_buf, up_w, &last, &stats.tunnel_bytes[0]);
    let to_down = copy(up_r, up_buf, down_w, &last, &stats.tunnel_bytes[1]);
    let both = async {
        // A failure either way ends both at once.
        tokio::try_join!(to_up, to_down).map_or(Close::Error, |_| Close::Closed)
    };
    let idle = async {
        let Some(idle) = s.idle else { return std::future::pending().await };
        loop {
            let deadline = last.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    // The connection's task is woken when the listener drains (`crate::drain`).
    let drained = poll_fn(|_| if closing.load(Ordering::Acquire) { Poll::Ready(()) } else { Poll::Pending });
    let how = tokio::select! {
        how = both => how,
        () = idle => Close::IdleTimeout,
        () = drained => Close::Drain,
    };
    stats.tunnels_active.fetch_sub(1, Ordering::Relaxed);
    stats.tunnels_closed[how as usize].fetch_add(1, Ordering::Relaxed);
    tracing::debug!(cluster = %s.cluster.name, reason = how.as_str(), "tunnel ended");
    how
}

/// Copy one direction: `first`, then whatever `from` sends, until it closes (the close is
/// passed on as a half-close of `to`). Each move of bytes marks `last`.
async fn copy<R: AsyncRead, W: AsyncWrite>(from: R, first: BytesMut, to: W, last: &Activity, counted: &AtomicU64) -> std::io::Result<()> {
    tokio::pin!(from, to);
    if !first.is_empty() {
        to.write_all(&first).await?;
        counted.fetch_add(first.len() as u64, Ordering::Relaxed);
    }
    drop(first);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        last.mark();
        to.write_all(&buf[..n]).await?;
        counted.fetch_add(n as u64, Ordering::Relaxed);
        last.mark();
    }
}

//! Upgraded connections: once an HTTP/1.1 upstream answers a client's `Upgrade` (a WebSocket
//! handshake) with `101 Switching Protocols`, the proxy writes the `101` downstream and then
//! joins the two sockets, copying bytes each way as they come, without reading them.
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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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

/// Bytes read from one side and not yet written to the other, copied in pieces of this size.
const CHUNK: usize = 16 * 1024;

/// Join `down` (with `down_buf`, bytes the client sent after its handshake) and `up` (with
/// `up_buf`, bytes the upstream sent after its `101`) until the tunnel ends; returns why.
pub async fn run(down: TcpStream, down_buf: BytesMut, up: TcpStream, up_buf: BytesMut, s: &Settings, closing: &AtomicBool) -> Close {
    let stats = &s.cluster.stats;
    stats.tunnels_active.fetch_add(1, Ordering::Relaxed);
    let (down_r, down_w) = down.into_split();
    let (up_r, up_w) = up.into_split();
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
async fn copy(mut from: OwnedReadHalf, first: BytesMut, mut to: OwnedWriteHalf, last: &Activity, counted: &AtomicU64) -> std::io::Result<()> {
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

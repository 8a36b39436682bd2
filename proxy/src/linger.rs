//! Lingering close of downstream connections.
//!
//! When the proxy answers before the request body has arrived (a 404 for an unknown host, a 503
//! shed, a 413 from the upstream), the connection closes with the rest of the body unread,
//! and closing a socket whose receive queue holds data makes the kernel send a reset instead of
//! a FIN. A client that writes its whole request before reading (Python's `http.client` and
//! urllib3 do) then fails in the middle of its write and never sees the answer (RFC 9112 §9.6).
//! nginx (`lingering_close`) and Envoy (`delayed_close_timeout`) avoid it the same way as here:
//! on close, shut down the write side (the client reads the answer, then EOF), read and drop
//! whatever the client still sends until it closes too, and give up after [`LINGER_CLOSE`].
//!
//! Only the close path differs; reads and writes pass straight through.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The longest a closing connection keeps reading what its client still sends.
pub const LINGER_CLOSE: Duration = Duration::from_secs(2);

pub struct Lingering {
    tcp: TcpStream,
    /// Set once the write side is shut down: when lingering gives up.
    until: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Lingering {
    pub fn new(tcp: TcpStream) -> Lingering {
        Lingering { tcp, until: None }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    /// Shut down the write side, then read and drop until the client's EOF, an error, or
    /// [`LINGER_CLOSE`]; the caller drops (closes) the socket after.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.until.is_none() {
            ready!(Pin::new(&mut this.tcp).poll_shutdown(cx))?;
        }
        let until = this.until.get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER_CLOSE)));
        poll_drop_input(&this.tcp, until.as_mut(), cx).map(Ok)
    }
}

/// Close `tcp` lingering, as [`Lingering`]'s shutdown does, for a socket shared with others
/// (weft's HTTP/1.1 server: a request body may still hold it). The socket closes once the
/// last holder drops it.
pub async fn close(tcp: &TcpStream) {
    if socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let mut until = Box::pin(tokio::time::sleep(LINGER_CLOSE));
    std::future::poll_fn(|cx| poll_drop_input(tcp, until.as_mut(), cx)).await;
}

/// Write `answer` (bounded by a second) and close lingering: the refusals sent to a client
/// that spoke plaintext to a TLS port, before the request it is still sending was read.
pub async fn answer_and_close(tcp: &mut TcpStream, answer: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.write_all(answer)).await;
    close(tcp).await;
}

/// Read and drop what the client sends until its EOF, an error, or `until`.
fn poll_drop_input(tcp: &TcpStream, until: Pin<&mut tokio::time::Sleep>, cx: &mut Context<'_>) -> Poll<()> {
    let mut scratch = [0u8; 16 * 1024];
    // At most 1 MiB per poll, so a client that keeps sending cannot hold the worker.
    let mut budget_spent = true;
    for _ in 0..64 {
        match tcp.poll_read_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Pending => {
                budget_spent = false;
                break;
            }
        }
        match tcp.try_read(&mut scratch) {
            // EOF; a reset from the client ends it as well as a FIN.
            Ok(0) => return Poll::Ready(()),
            Ok(_) => {}
            // Readiness is cleared: the next round waits for more.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(()),
        }
    }
    if until.poll(cx).is_ready() {
        return Poll::Ready(());
    }
    if budget_spent {
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

//! An upstream connection's byte stream: plain TCP, or TLS over TCP (mTLS to another sidecar,
//! TLS to an external upstream). weft's HTTP/1.1 client ([`crate::h1`]) and the tunnels run on
//! either; a plaintext connection pays one branch per read or write, nothing else.
//!
//! A TLS stream may keep written bytes in rustls' buffer when the socket is full (its
//! `poll_write` reports them written), so whoever finishes a write sequence polls
//! [`AsyncWrite::poll_flush`]: a no-op on TCP.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

pub enum Stream {
    Tcp(TcpStream),
    /// Boxed: rustls' connection state is large, and a plaintext stream should not carry its size.
    Tls(Box<Tls>),
}

/// The read half after a split (see [`Stream::into_split`]).
pub enum ReadHalf {
    Tcp(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<Box<Tls>>),
}

/// The write half after a split.
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Box<Tls>>),
}

impl Stream {
    /// The TCP socket under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Tcp(t) => t,
            Stream::Tls(t) => t.get_ref().0,
        }
    }

    /// Whether an idle connection can carry a request: the peer has neither closed it nor sent
    /// anything unasked. Costs no system call unless the socket became readable. A TLS peer may
    /// have sent records that are not data (TLS 1.3 session tickets, which arrive after the
    /// handshake): they are read and taken in here, and the connection stays usable.
    pub fn is_idle_usable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.tcp().poll_read_ready(&mut cx) {
            Poll::Pending => return true,
            Poll::Ready(Err(_)) => return false,
            Poll::Ready(Ok(())) => {}
        }
        let mut probe = [0u8; 1];
        match self {
            Stream::Tcp(t) => matches!(t.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            Stream::Tls(t) => {
                let mut buf = ReadBuf::new(&mut probe);
                matches!(Pin::new(t).poll_read(&mut cx, &mut buf), Poll::Pending)
            }
        }
    }

    /// Write all of `buf` from `done` on (counting in `done`), then flush.
    pub fn poll_write_all(&mut self, cx: &mut Context<'_>, buf: &[u8], done: &mut usize) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(t) => crate::h1::poll_write_all(t, cx, buf, done),
            Stream::Tls(t) => {
                while *done < buf.len() {
                    match std::task::ready!(Pin::new(&mut *t).poll_write(cx, &buf[*done..]))? {
                        0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                        n => *done += n,
                    }
                }
                Pin::new(t).poll_flush(cx)
            }
        }
    }

    /// Split into halves that can be driven from two tasks (an upload in its own task while the
    /// response is read).
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(t) => {
                let (r, w) = t.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Tls(t) => {
                let (r, w) = tokio::io::split(t);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

/// Delegates each `AsyncRead`/`AsyncWrite` call to whichever variant is there.
macro_rules! delegate_io {
    ($ty:ty, $($v:ident),+) => {
        impl AsyncRead for $ty {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_read(cx, buf),)+ }
            }
        }
    };
    (write $ty:ty, $($v:ident),+) => {
        impl AsyncWrite for $ty {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_write(cx, buf),)+ }
            }
            fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+ }
            }
            fn is_write_vectored(&self) -> bool {
                match self { $(Self::$v(s) => s.is_write_vectored(),)+ }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_flush(cx),)+ }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() { $(Self::$v(s) => Pin::new(s).poll_shutdown(cx),)+ }
            }
        }
    };
}

delegate_io!(Stream, Tcp, Tls);
delegate_io!(write Stream, Tcp, Tls);
delegate_io!(ReadHalf, Tcp, Tls);
delegate_io!(write WriteHalf, Tcp, Tls);

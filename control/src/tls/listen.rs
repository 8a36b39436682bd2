//! Accepting TLS connections on a control port. The accept loop only accepts: each handshake
//! runs in its own task (bounded in number and time), so a client that connects and stalls
//! cannot hold up the sidecars behind it. Finished connections are handed to the server
//! (axum through [`axum::serve::Listener`], tonic through [`Accepted::into_incoming`]).
//!
//! A client that speaks plaintext to a TLS port is told so: on the API port an HTTP/1.1 400
//! naming `https://` (what curl or an old `weftctl` shows), on the xDS port a logged refusal.
//! Every refused handshake is logged with the port, the peer and the reason; the port goes
//! on serving everyone else.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// Longest a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; more wait in the kernel's accept queue.
const MAX_HANDSHAKES: usize = 1024;
/// A TLS record of type handshake opens every TLS connection.
const TLS_HANDSHAKE: u8 = 0x16;

/// A TLS connection on a control port (tonic needs its own trait on it).
pub struct Conn(TlsStream<TcpStream>);

/// Connections whose handshake succeeded; dropping it stops accepting.
pub struct Accepted {
    rx: mpsc::Receiver<(Conn, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Accepted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accept on `listener` with `config`; `port` names it in logs (`api`, `xds`).
pub fn accept(listener: TcpListener, config: Arc<ServerConfig>, port: &'static str) -> std::io::Result<Accepted> {
    let local = listener.local_addr()?;
    let (tx, rx) = mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let task = tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(port, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, tcp, port)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send((Conn(conn), peer)).await;
                    }
                    Ok(Err(why)) => tracing::warn!(port, %peer, reason = why, "TLS connection refused"),
                    Err(_) => tracing::warn!(port, %peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Ok(Accepted { rx, local, task })
}

/// The handshake, after checking that the client speaks TLS at all.
async fn handshake(acceptor: &tokio_rustls::TlsAcceptor, mut tcp: TcpStream, port: &str) -> Result<TlsStream<TcpStream>, String> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) | Err(_) => return Err("closed before the handshake".into()),
        Ok(_) if first[0] != TLS_HANDSHAKE => {
            // xDS clients speak gRPC (HTTP/2): an HTTP/1.1 answer would mean nothing to them.
            if port != "xds" {
                refuse_plaintext(&mut tcp).await;
            }
            return Err("plaintext: this port takes TLS only".into());
        }
        Ok(_) => {}
    }
    acceptor.accept(tcp).await.map_err(|e| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(r) => format!("{} ({r})", weft_proxy::tls::failure_reason(r)),
        None => e.to_string(),
    })
}

/// An HTTP/1.1 400 a person with curl can read, then a lingering close (so the answer is not
/// lost to a reset while the request is still unread).
async fn refuse_plaintext(tcp: &mut TcpStream) {
    let body = "this port takes TLS only: use https:// (weftctl --ca FILE trusts the mesh root)\n";
    weft_proxy::linger::answer_and_close(tcp, weft_proxy::tls::tls_required_response(body).as_bytes()).await;
}

impl Accepted {
    /// For tonic's `serve_with_incoming`.
    pub fn into_incoming(self) -> impl tokio_stream::Stream<Item = std::io::Result<Conn>> + Send + 'static {
        futures_util::stream::unfold(self, |mut a| async move {
            let (conn, _) = a.rx.recv().await?;
            Some((Ok(conn), a))
        })
    }
}

impl axum::serve::Listener for Accepted {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ended (only when dropped): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

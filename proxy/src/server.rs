//! Sockets and threads. Each worker is one thread with a current-thread tokio runtime and its
//! own listening socket per listener (SO_REUSEPORT: the kernel spreads connections), which
//! measured faster than one multi-thread runtime. A separate control thread runs the admin
//! API, the reloader and periodic upkeep, so they never compete with the data path's runtime.

use bytes::{Bytes, BytesMut};
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::Config;
use crate::body::DownBody;
use crate::drain::{Closable, Drain};
use crate::snapshot::Snapshot;
use crate::telemetry::Telemetry;
use crate::Shared;

#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads (one runtime each). Default 1: a sidecar shares the node with its model.
    pub workers: usize,
    /// Config file to watch and reread on SIGHUP; None for an in-process proxy.
    pub config_path: Option<PathBuf>,
    /// How often the config file is checked for changes.
    pub watch_interval: Duration,
    /// Handle SIGHUP (only a binary should).
    pub signals: bool,
    /// Take services, experiments, clusters and endpoints from these xDS control nodes.
    pub xds: Option<crate::xds::XdsOptions>,
}

impl Default for Options {
    fn default() -> Self {
        Options { workers: 1, config_path: None, watch_interval: Duration::from_secs(1), signals: false, xds: None }
    }
}

/// A running proxy.
pub struct Proxy {
    pub shared: Arc<Shared>,
    /// Bound address of each listener, in config order (useful with port 0).
    pub listener_addrs: Vec<SocketAddr>,
    pub admin_addr: SocketAddr,
    /// Bound address of the read-only metrics listener (`admin.metrics_address`), if any.
    pub metrics_addr: Option<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Proxy {
    /// Validate `cfg`, bind every socket, and start the workers and the control thread.
    /// Errors (bad config, busy port) are returned before anything runs.
    pub fn start(mut cfg: Config, opts: Options) -> Result<Proxy, String> {
        let workers = opts.workers.max(1);
        if let Some(x) = &opts.xds {
            x.check(&cfg)?;
        }
        let training = match &cfg.training {
            None => None,
            Some(t) => Some(Arc::new(crate::training::Trainer::from_config(t, &cfg.node.id)?)),
        };
        let telemetry = Telemetry::new(&cfg.node);
        let tls = crate::mtls::TlsContext::new(cfg.identity.as_ref())?;
        crate::mtls::check(&cfg, tls.mesh.is_some())?;
        if tls.mesh.as_ref().is_some_and(|m| m.issued.is_some()) && opts.xds.is_none() {
            return Err("identity.token_file: certificates are issued by weft-control; run with --xds".into());
        }
        telemetry.track(Arc::downgrade(&(tls.clone() as Arc<dyn crate::series::Live>)));
        let snap = Snapshot::compile(cfg.clone(), None, workers, &telemetry, &tls)?;
        if let Some(m) = &tls.mesh {
            m.set_revocations(&cfg.revocations);
        }
        telemetry.configure(&cfg.telemetry)?;

        // Bind everything up front so a busy port is an error now, not a log line later.
        let mut sockets: Vec<Vec<std::net::TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
        let mut listener_addrs = Vec::new();
        for l in &snap.listeners {
            let first = bind(l.address, workers > 1).map_err(|e| format!("listeners.{}: cannot listen on {}: {e}", l.name, l.address))?;
            let actual = first.local_addr().map_err(|e| e.to_string())?;
            sockets[0].push(first);
            for w in sockets.iter_mut().skip(1) {
                w.push(bind(actual, true).map_err(|e| format!("listeners.{}: {e}", l.name))?);
            }
            listener_addrs.push(actual);
        }
        let admin_addr: SocketAddr = cfg.admin.address.parse().map_err(|_| format!("admin.address: {:?}", cfg.admin.address))?;
        let admin = bind(admin_addr, false).map_err(|e| format!("admin.address: cannot listen on {admin_addr}: {e}"))?;
        let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
        let metrics = match &cfg.admin.metrics_address {
            None => None,
            Some(m) => {
                let addr: SocketAddr = m.parse().map_err(|_| format!("admin.metrics_address: {m:?}"))?;
                Some(bind(addr, false).map_err(|e| format!("admin.metrics_address: cannot listen on {addr}: {e}"))?)
            }
        };
        let metrics_addr = metrics.as_ref().map(|l| l.local_addr()).transpose().map_err(|e| e.to_string())?;

        let configured = (cfg.listeners.iter().map(|l| l.address.clone()).collect(), cfg.admin.clone());
        // Record the bound addresses so /config_dump and reloads see what is really served.
        for (l, a) in cfg.listeners.iter_mut().zip(&listener_addrs) {
            l.address = a.to_string();
        }
        cfg.admin.address = admin_addr.to_string();
        cfg.admin.metrics_address = metrics_addr.map(|a| a.to_string());
        let mut snap = snap;
        snap.config = cfg;

        let shared = Arc::new(Shared::new(snap, telemetry, tls, workers, configured, training));
        let (stop, _) = tokio::sync::watch::channel(false);
        let mut threads = Vec::new();
        for (id, socks) in sockets.into_iter().enumerate() {
            let sh = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("weft-worker-{id}"))
                    .spawn(move || run_worker(id, sh, socks))
                    .map_err(|e| e.to_string())?,
            );
        }
        if let Some(x) = opts.xds.clone() {
            crate::xds::spawn(shared.clone(), x, stop.subscribe()).map_err(|e| e.to_string())?;
        }
        let sh = shared.clone();
        let stop_rx = stop.subscribe();
        threads.push(
            std::thread::Builder::new()
                .name("weft-control".into())
                .spawn(move || crate::admin::run_control(sh, admin, metrics, opts, stop_rx))
                .map_err(|e| e.to_string())?,
        );
        Ok(Proxy { shared, listener_addrs, admin_addr, metrics_addr, threads, stop })
    }

    /// Swap in a new config (validated first). See [`Shared::apply`].
    pub fn reload(&self, cfg: Config) -> Result<u64, String> {
        self.shared.apply(cfg)
    }

    /// Stop accepting; connections close once their in-flight requests finish.
    pub fn drain(&self) {
        self.shared.draining.send_replace(true);
    }

    /// Drain, wait for the workers (at most `grace`), and stop the control thread.
    pub fn shutdown(self, grace: Duration) {
        self.drain();
        let deadline = std::time::Instant::now() + grace;
        let (control, workers) = {
            let mut t = self.threads;
            let c = t.pop();
            (c, t)
        };
        for t in workers {
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        self.stop.send_replace(true);
        if let Some(c) = control {
            let _ = c.join();
        }
    }
}

fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// Sweep the calling worker's upstream pools: see [`crate::pool::Pool::sweep`].
async fn sweep_idle(sh: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let snap = sh.snapshot.load();
        for ep in snap.clusters.iter().flat_map(|c| c.endpoints.iter()) {
            ep.pool().sweep();
        }
    }
}

fn run_worker(id: usize, sh: Arc<Shared>, sockets: Vec<std::net::TcpListener>) {
    crate::worker::set_id(id);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let drain = Drain::new();
        let mut draining = sh.draining.subscribe();
        let mut accepts = tokio::task::JoinSet::new();
        let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<(usize, tokio::net::TcpStream)>(1024);
        for (li, std_l) in sockets.into_iter().enumerate() {
            let l = tokio::net::TcpListener::from_std(std_l).expect("listener registers with the runtime");
            let tx = conn_tx.clone();
            accepts.spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            if tx.send((li, s)).await.is_err() {
                                return;
                            }
                        }
                        // Out of file descriptors and the like: back off instead of spinning.
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        drop(conn_tx);
        // Beside the accept loops (and stopped with them): this worker's idle upstream
        // connections are swept once a second.
        accepts.spawn(sweep_idle(sh.clone()));
        loop {
            tokio::select! {
                got = conn_rx.recv() => {
                    let Some((li, stream)) = got else { break };
                    serve_conn(&sh, &drain, li, stream);
                }
                _ = draining.wait_for(|d| *d) => break,
            }
        }
        // Drain: stop accepting (closing the sockets), let open connections finish.
        accepts.abort_all();
        drop(conn_rx);
        drain.shutdown().await;
    });
}

fn serve_conn(sh: &Arc<Shared>, drain: &Drain, li: usize, stream: tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let (settings, tls) = {
        let snap = sh.snapshot.load();
        let l = &snap.config.listeners[li];
        let settings = crate::h1::server::Settings {
            max_head: l.max_header_bytes,
            header_timeout: l.header_read_timeout.non_zero(),
            keepalive_timeout: l.keepalive_timeout.non_zero(),
            accepted: tokio::time::Instant::now(),
        };
        let rt = &snap.listeners[li];
        (settings, (rt.name.clone(), rt.tls.clone()))
    };
    let closing = Arc::new(AtomicBool::new(false));
    let conn = drain.watch(Closable::new(downstream(sh.clone(), li, stream, settings, tls, closing.clone()), closing));
    tokio::spawn(conn);
}

/// The HTTP/2 connection preface (RFC 9113 §3.4): a client speaking h2c with prior knowledge
/// opens with it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first byte of a TLS handshake record (RFC 8446 §5.1): no HTTP request starts with it.
const TLS_HANDSHAKE: u8 = 0x16;

/// How long a TLS handshake may take when the listener sets no `header_read_timeout`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve one downstream connection: TLS if it opens with a handshake and the listener takes
/// TLS (then HTTP/2 or HTTP/1.1 by ALPN, on hyper: [`serve_tls`]); else HTTP/2 if it opens
/// with the preface (on hyper), else HTTP/1.1 (weft's own server, [`crate::h1::server`]).
async fn downstream(
    sh: Arc<Shared>,
    li: usize,
    mut tcp: TcpStream,
    settings: crate::h1::server::Settings,
    (listener, tls): (Arc<str>, crate::mtls::ListenerTls),
    closing: Arc<AtomicBool>,
) {
    use crate::mtls::ListenerTls;
    let mut first = BytesMut::with_capacity(8 * 1024);
    // Read until the bytes can no longer be the preface's start, or are all of it.
    // Read until the bytes can no longer be the preface's start, or are all of it; a drain
    // (which wakes this task) ends the wait.
    let sniff = std::future::poll_fn(|cx| {
        loop {
            if closing.load(Ordering::Acquire) {
                return Poll::Ready(false);
            }
            match std::task::ready!(tokio_util::io::poll_read_buf(Pin::new(&mut tcp), cx, &mut first)) {
                Ok(0) | Err(_) => return Poll::Ready(false),
                Ok(_) => {}
            }
            let n = first.len().min(H2_PREFACE.len());
            if first[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
                return Poll::Ready(true);
            }
        }
    });
    // A client that connects and sends nothing is cut by either timeout.
    let got = match settings.header_timeout.into_iter().chain(settings.keepalive_timeout).min() {
        Some(t) => tokio::time::timeout_at(settings.accepted + t, sniff).await.unwrap_or(false),
        None => sniff.await,
    };
    if !got {
        return;
    }
    let stats = &sh.tls.stats;
    match (&tls, first[0] == TLS_HANDSHAKE) {
        (ListenerTls::Disabled, _) | (ListenerTls::Mesh { strict: false }, false) => {}
        (ListenerTls::Mesh { strict: true } | ListenerTls::Terminate(_), false) => {
            return refuse_plaintext(tcp, &listener, tls.mode(), stats).await;
        }
        (ListenerTls::Mesh { .. } | ListenerTls::Terminate(_), true) => {
            let limit = settings.header_timeout.unwrap_or(HANDSHAKE_TIMEOUT);
            return serve_tls(sh.clone(), li, tcp, first.freeze(), &listener, &tls, limit, settings.max_head, closing).await;
        }
    }
    stats.connection(&listener, "plaintext");
    if first.starts_with(H2_PREFACE) {
        let io = Rewind { read: first.freeze(), io: crate::linger::Lingering::new(tcp) };
        serve_h2(sh, li, io, None, settings.max_head, closing).await;
    } else {
        crate::h1::server::serve(sh, li, tcp, first, settings, closing).await;
    }
}

/// A plaintext client on a listener that takes only TLS: answered as nginx answers HTTP on an
/// HTTPS port (an HTTP/1.1 400 that says why, which a person with curl can read), counted and
/// logged, and closed.
async fn refuse_plaintext(mut tcp: TcpStream, listener: &Arc<str>, mode: &str, stats: &crate::mtls::TlsStats) {
    stats.handshake("server", Err("plaintext"));
    let peer = tcp.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
    tracing::warn!(listener = &**listener, peer, mode, "plaintext connection refused: this listener requires TLS");
    let body = format!("plaintext request on listener {listener:?}, which requires {} (tls mode {mode})\n", if mode == "strict" { "mutual TLS" } else { "TLS" });
    crate::linger::answer_and_close(&mut tcp, crate::tls::tls_required_response(&body).as_bytes()).await;
}

/// A TLS connection: the handshake (what was already read is its start), the peer's identity,
/// then HTTP/2 or HTTP/1.1 as ALPN chose, on hyper. A handshake that fails is counted by
/// reason and logged; the listener goes on serving everyone else.
#[allow(clippy::too_many_arguments)]
async fn serve_tls(
    sh: Arc<Shared>,
    li: usize,
    tcp: TcpStream,
    read: Bytes,
    listener: &Arc<str>,
    tls: &crate::mtls::ListenerTls,
    limit: Duration,
    max_head: usize,
    closing: Arc<AtomicBool>,
) {
    use crate::mtls::{ListenerTls, Peer};
    let stats = &sh.tls.stats;
    let peer_addr = tcp.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
    let config = match tls {
        ListenerTls::Terminate(c) => c.clone(),
        _ => match sh.tls.mesh.as_ref().and_then(|m| m.current()) {
            Some(c) => c.server_config(),
            None => {
                stats.handshake("server", Err("no_certificate_yet"));
                return tracing::warn!(listener = &**listener, peer = peer_addr, "TLS connection refused: this sidecar has no certificate yet");
            }
        },
    };
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(Rewind { read, io: tcp });
    let stream = match tokio::time::timeout(limit, accept).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let reason = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).map_or("error", crate::tls::failure_reason);
            stats.handshake("server", Err(reason));
            return tracing::warn!(listener = &**listener, peer = peer_addr, reason, error = %e, "TLS handshake refused");
        }
        Err(_) => {
            stats.handshake("server", Err("timeout"));
            return tracing::warn!(listener = &**listener, peer = peer_addr, "TLS handshake timed out");
        }
    };
    stats.handshake("server", Ok(()));
    let (_, conn) = stream.get_ref();
    let peer = match tls {
        ListenerTls::Terminate(_) => Peer::Tls,
        _ => match conn.peer_certificates().and_then(crate::tls::peer_id) {
            Some(id) => Peer::Mesh(Arc::from(id.to_string())),
            // The verifier requires one; kept as a guard.
            None => return stats.handshake("server", Err("no_spiffe_id")),
        },
    };
    stats.connection(listener, peer.mode());
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let peer = Some(Arc::new(peer));
    if h2 {
        serve_h2(sh, li, stream, peer, max_head, closing).await;
    } else {
        serve_h1_hyper(sh, li, stream, peer, max_head, closing).await;
    }
}

/// The service hyper runs for each request of a connection; `peer` (a TLS connection's) goes
/// in each request's extensions. On an HTTP/1.1 connection (a TLS one: weft's own server
/// serves plain ones) a WebSocket handshake is carried as weft's server carries it, and once
/// the upstream switched, hyper's upgraded connection is joined to the upstream's.
fn service(
    sh: Arc<Shared>,
    li: usize,
    peer: Option<Arc<crate::mtls::Peer>>,
) -> impl hyper::service::Service<Request<Incoming>, Response = http::Response<crate::body::RespBody>, Error = std::convert::Infallible, Future: Send> + Clone {
    service_fn(move |mut req: Request<Incoming>| {
        let sh = sh.clone();
        if let Some(p) = &peer {
            req.extensions_mut().insert(p.clone());
        }
        let upgrade = (req.version() == http::Version::HTTP_11 && asks_upgrade(req.headers())).then(|| {
            req.extensions_mut().insert(crate::h1::UpgradeRequest);
            hyper::upgrade::on(&mut req)
        });
        async move {
            let mut resp = crate::proxy::handle(sh, li, req.map(DownBody::H2), None).await?;
            if let Some(down) = upgrade.filter(|_| resp.status() == http::StatusCode::SWITCHING_PROTOCOLS) {
                join_upgraded(&mut resp, down);
            }
            // An HTTP/1.1 upstream's fields travel beside the map (`h1::fields`); hyper's
            // writers need them in it.
            if let Some(f) = resp.body_mut().take_fields() {
                f.copy_into(resp.headers_mut());
            }
            Ok::<_, std::convert::Infallible>(resp)
        }
    })
}

/// `Connection: upgrade` (a token of it) with an `Upgrade` field: a handshake to carry.
fn asks_upgrade(h: &http::HeaderMap) -> bool {
    h.contains_key(http::header::UPGRADE)
        && h.get_all(http::header::CONNECTION).iter().any(|v| v.as_bytes().split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade")))
}

/// The upstream switched protocols: the `101` goes out with `Connection: upgrade`, and once
/// hyper hands over the client's connection it is joined to the upstream's (as
/// [`crate::tunnel::run`] joins a plain one).
fn join_upgraded(resp: &mut http::Response<crate::body::RespBody>, down: hyper::upgrade::OnUpgrade) {
    let up = resp.extensions().get::<crate::h1::Upgraded>().and_then(crate::h1::Upgraded::take);
    let settings = resp.extensions().get::<crate::tunnel::Settings>().cloned();
    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("upgrade"));
    let (Some((up, up_buf, place)), Some(settings)) = (up, settings) else { return };
    tokio::spawn(async move {
        static NEVER: AtomicBool = AtomicBool::new(false);
        let _place = place;
        match down.await {
            Ok(d) => {
                crate::tunnel::run(TokioIo::new(d), BytesMut::new(), up, up_buf, &settings, &NEVER).await;
            }
            Err(e) => tracing::debug!(error = %e, "client connection not upgraded; tunnel not opened"),
        }
    });
}

/// HTTP/1.1 on hyper, for TLS connections (weft's own HTTP/1.1 server runs on plain sockets).
async fn serve_h1_hyper<I>(sh: Arc<Shared>, li: usize, io: I, peer: Option<Arc<crate::mtls::Peer>>, max_head: usize, closing: Arc<AtomicBool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new()).max_buf_size(max_head.max(8192));
    let conn = b.serve_connection(TokioIo::new(io), service(sh, li, peer)).with_upgrades();
    drive(conn, &closing, |c| c.graceful_shutdown()).await;
}

async fn serve_h2<I>(sh: Arc<Shared>, li: usize, io: I, peer: Option<Arc<crate::mtls::Peer>>, max_head: usize, closing: Arc<AtomicBool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service(sh, li, peer);
    let mut b = http2::Builder::new(TokioExecutor::new());
    // Extended CONNECT (RFC 8441): WebSockets over HTTP/2 (`crate::tunnel`).
    b.timer(TokioTimer::new()).max_header_list_size(max_head as u32).max_concurrent_streams(1024).enable_connect_protocol();
    let conn = b.serve_connection(TokioIo::new(io), svc);
    drive(conn, &closing, |c| c.graceful_shutdown()).await;
}

/// Run a hyper connection to its end; once `closing` is set (a drain), ask it to shut down
/// gracefully (`shutdown`: the connection type's own `graceful_shutdown`).
async fn drive<C, E>(conn: C, closing: &AtomicBool, shutdown: impl Fn(Pin<&mut C>))
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    tokio::pin!(conn);
    let mut asked = false;
    let done = std::future::poll_fn(|cx| {
        if !asked && closing.load(Ordering::Acquire) {
            asked = true;
            shutdown(conn.as_mut());
        }
        conn.as_mut().poll(cx)
    });
    if let Err(e) = done.await {
        tracing::debug!(error = %e, "downstream connection ended with an error");
    }
}

/// A socket with the bytes already read from it (while looking for the HTTP/2 preface or a TLS
/// handshake) put back in front. A plaintext one is closed lingering, so a client still
/// uploading reads an early answer (see `linger`).
struct Rewind<I> {
    read: Bytes,
    io: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

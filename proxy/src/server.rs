//! Sockets and threads. Each worker is one thread with a current-thread tokio runtime and its
//! own listening socket per listener (SO_REUSEPORT: the kernel spreads connections), which
//! measured faster than one multi-thread runtime. A separate control thread runs the admin
//! API, the reloader and periodic upkeep, so they never compete with the data path's runtime.

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::Config;
use crate::drain::Drain;
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
        let snap = Snapshot::compile(cfg.clone(), None, workers, &telemetry)?;
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

        let shared = Arc::new(Shared::new(snap, telemetry, workers, configured, training));
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
    let (max_header, header_timeout) = {
        let snap = sh.snapshot.load();
        let l = &snap.config.listeners[li];
        (l.max_header_bytes, l.header_read_timeout.non_zero())
    };
    let sh2 = sh.clone();
    // `handle`'s own future, not one wrapped in an async block: hyper moves it into the
    // connection's slot once per request, and every layer adds the request's size to it.
    let svc = service_fn(move |req| crate::proxy::handle(sh2.clone(), li, req));
    let mut b = auto::Builder::new(TokioExecutor::new());
    let mut h1 = b.http1();
    // Responses go out flattened into one buffer and one write(2), not a writev(2) of head
    // and body: hyper copies the body (usually small) in user space, and the kernel's send
    // path costs less for one buffer: −6 to −12 % CPU per request (bench/README, stop 25).
    h1.max_buf_size(max_header.max(8192)).keep_alive(true).writev(false);
    // Without a timer hyper arms no per-request header timeout.
    if let Some(t) = header_timeout {
        h1.timer(TokioTimer::new()).header_read_timeout(t);
    }
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(max_header as u32)
        .max_concurrent_streams(1024);
    // Closed lingering, so a client still uploading reads an early answer (see `linger`).
    let conn = b.serve_connection(TokioIo::new(crate::linger::Lingering::new(stream)), svc).into_owned();
    let fut = drain.watch(conn);
    tokio::spawn(async move {
        if let Err(e) = fut.await {
            tracing::debug!(error = %e, "downstream connection ended with an error");
        }
    });
}

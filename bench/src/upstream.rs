//! The one upstream every target forwards to: a hyper HTTP/1.1 server answering any request
//! with the same 100-byte body, keep-alive on, on a single-threaded runtime.
//!
//! It listens on several ports (one per weighted variant) so weft and Envoy route to two
//! distinct clusters while all targets still share one server process. It runs as a child
//! process (the bench binary re-executed with `--serve-upstream`) so it can be pinned with
//! `taskset` to the load generator's core, away from the proxy under test.

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::guard::Spawned;

/// The response body: 100 bytes, small enough that the proxies' per-request cost dominates.
pub const BODY: &[u8; 100] =
    b"weft bench upstream: fixed response body of exactly one hundred bytes for every request............\n";

/// Serves `ports` listeners on 127.0.0.1, printing `listening ADDR ADDR..` once all are bound.
pub fn serve(ports: usize) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut addrs = Vec::new();
        for _ in 0..ports {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?.to_string());
            tokio::spawn(accept_loop(listener));
        }
        println!("listening {}", addrs.join(" "));
        std::io::stdout().flush()?;
        std::future::pending::<Result<()>>().await
    })
}

async fn accept_loop(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_req: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(BODY))))
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A running upstream child and its listening addresses.
pub struct Upstream {
    /// The process (for CPU/RSS readings and cleanup).
    pub process: Spawned,
    /// One address per variant; `addrs[0]` is the one plain targets use.
    pub addrs: Vec<SocketAddr>,
}

impl Upstream {
    /// Re-executes this binary with `--serve-upstream PORTS` on `core` and waits for its
    /// `listening` line.
    pub fn start(core: usize, ports: usize) -> Result<Self> {
        let exe = crate::workspace::self_exe();
        let mut cmd = Command::new("taskset");
        cmd.arg("-c").arg(core.to_string()).arg(exe);
        cmd.args(["--serve-upstream", &ports.to_string()])
            .stdout(Stdio::piped());
        let mut process = Spawned::start("upstream", &mut cmd)?;
        let stdout = process.stdout().context("upstream stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addrs = line
            .strip_prefix("listening ")
            .with_context(|| format!("upstream said {line:?}"))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self { process, addrs })
    }
}

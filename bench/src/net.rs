//! Loopback ports and a minimal blocking HTTP/1.1 GET for readiness checks and admin scrapes.
//!
//! The orchestrator is synchronous (it mostly waits on child processes), so a few lines over
//! `std::net` are simpler than a client runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::guard::Spawned;

/// `n` distinct free ports on 127.0.0.1, for peers to bind right after.
///
/// Probed without `SO_REUSEADDR` (std sets it, tokio's `TcpSocket` lets us clear it) so a port
/// still in TIME_WAIT from an earlier run is skipped: a peer that binds without the option would
/// fail on it. All probes are held until every port is picked, so the ports differ.
pub fn free_addrs(n: usize) -> Result<Vec<SocketAddr>> {
    let probe = || -> std::io::Result<tokio::net::TcpSocket> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(false)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(socket)
    };
    let held = (0..n)
        .map(|_| probe())
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(held
        .iter()
        .map(|s| s.local_addr())
        .collect::<std::io::Result<_>>()?)
}

/// `GET path` with `Connection: close`; returns the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    http_request(addr, "GET", path, None)
}

/// `method path` with `Connection: close` and, if given, a JSON body; answered within 2 s.
/// Returns the status code and the body.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> Result<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    let body = json.unwrap_or("");
    let headers = match json {
        Some(b) => format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()),
        None => String::new(),
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n{headers}\r\n{body}"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status from {addr}{path}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// Polls `GET path` until it answers 200, failing early if `process` exits.
pub fn wait_ok(
    addr: SocketAddr,
    path: &str,
    process: &mut Spawned,
    within: Duration,
) -> Result<()> {
    wait_for(process, within, || http_get(addr, path))
        .with_context(|| format!("http://{addr}{path}"))
}

/// Polls `probe` (a request: its status and body) until it answers 200, failing early if
/// `process` exits.
pub fn wait_for(
    process: &mut Spawned,
    within: Duration,
    mut probe: impl FnMut() -> Result<(u16, String)>,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        if let Some(status) = process.exited() {
            bail!("{} exited during start-up ({status})", process.name);
        }
        match probe() {
            Ok((200, _)) => return Ok(()),
            Ok((code, body)) => last = format!("HTTP {code}: {}", body.trim()),
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} not ready within {within:?} (last: {last})",
        process.name
    )
}

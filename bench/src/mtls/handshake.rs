//! The handshake generator: new TLS connections per second, each a full handshake.
//!
//! `concurrency` loops on one current-thread runtime, for `duration`, each: TCP connect, a full
//! TLS handshake presenting the client certificate (resumption is off in the client config, see
//! `pki::client_config`), ALPN `http/1.1`, one `GET /` with `Connection: close`, the response read
//! to its end (the server closes first, so the TIME_WAIT is the server's and the generator never
//! runs out of ports), close. It runs as a child process (the bench binary re-run with
//! `--handshake-load SPEC`) pinned to the load core, as the upstream is, and prints its counts as
//! one JSON line.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustls::pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::guard::Spawned;

/// The server name sent (SNI). weft's client check reads the server's SPIFFE ID, not this name.
const SNI: &str = "model.weft.local";
/// One exchange taking longer than this counts as an error (a stalled server cannot hang a loop).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one run of the generator did.
#[derive(Clone, Debug, PartialEq)]
pub struct Counts {
    /// Exchanges that completed with a 200.
    pub completed: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first connect to the end of the last exchange.
    pub wall_s: f64,
    /// The generator's own CPU time (utime + stime).
    pub cpu_s: f64,
    /// Completed handshakes that needed a HelloRetryRequest (the server wanted another key
    /// share than the one the client sent: an extra round trip and a second key generation).
    pub hello_retries: u64,
    /// What the first completed handshake negotiated (see `negotiated`), as a short text.
    pub negotiated: Option<String>,
}

/// What a handshake negotiated, read from the client's side: the protocol version, cipher
/// suite, key-exchange group, whether a HelloRetryRequest was needed, ALPN, and the number of
/// certificates the server sent. The same client against two servers makes any difference in
/// what each one chose show here.
fn negotiated(c: &rustls::ClientConnection) -> String {
    let name = |d: Option<String>| d.unwrap_or_else(|| "-".into());
    format!(
        "{} {} {} {} alpn={} server_chain={}",
        name(c.protocol_version().map(|v| format!("{v:?}"))),
        name(c.negotiated_cipher_suite().map(|s| format!("{:?}", s.suite()))),
        name(c.negotiated_key_exchange_group().map(|g| format!("{:?}", g.name()))),
        name(c.handshake_kind().map(|k| format!("{k:?}"))),
        name(c.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned())),
        c.peer_certificates().map_or(0, |p| p.len()),
    )
}

impl Counts {
    pub fn per_second(&self) -> f64 {
        self.completed as f64 / self.wall_s.max(1e-9)
    }
}

/// Runs the generator pinned to `core` against `addr` with the credentials in `pki_dir`.
pub fn run(
    core: usize,
    addr: SocketAddr,
    concurrency: u32,
    duration: Duration,
    pki_dir: &Path,
) -> Result<Counts> {
    let spec = format!(
        "{addr},{concurrency},{},{}",
        duration.as_millis(),
        pki_dir.display()
    );
    let mut cmd = Command::new("taskset");
    cmd.arg("-c")
        .arg(core.to_string())
        .arg(crate::workspace::self_exe())
        .args(["--handshake-load", &spec]);
    let limit = duration * 3 + Duration::from_secs(10);
    let out = Spawned::run_to_end("handshake-load", &mut cmd, limit)?;
    parse_counts(&out).with_context(|| format!("unexpected handshake-load output: {out:?}"))
}

fn parse_counts(out: &str) -> Option<Counts> {
    let v: serde_json::Value = serde_json::from_str(out.lines().last()?).ok()?;
    Some(Counts {
        completed: v["completed"].as_u64()?,
        errors: v["errors"].as_u64()?,
        first_error: v["first_error"].as_str().map(str::to_string),
        wall_s: v["wall_s"].as_f64()?,
        cpu_s: v["cpu_s"].as_f64()?,
        hello_retries: v["hello_retries"].as_u64().unwrap_or(0),
        negotiated: v["negotiated"].as_str().map(str::to_string),
    })
}

/// The child's side of [`run`]: `SPEC` is `ADDR,CONCURRENCY,MILLIS,PKI_DIR`.
pub fn serve(spec: &str) -> Result<()> {
    let mut parts = spec.splitn(4, ',');
    let mut next = |what| parts.next().with_context(|| format!("{spec:?}: no {what}"));
    let addr: SocketAddr = next("address")?.parse()?;
    let concurrency: u32 = next("concurrency")?.parse()?;
    let duration = Duration::from_millis(next("duration")?.parse()?);
    let cfg = super::pki::client_config(Path::new(next("pki dir")?))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut counts = rt.block_on(generate(addr, cfg, concurrency, duration));
    counts.cpu_s = crate::procfs::usage(std::process::id()).map_or(0.0, |u| u.cpu_s);
    println!(
        "{}",
        json!({
            "completed": counts.completed,
            "errors": counts.errors,
            "first_error": counts.first_error,
            "wall_s": counts.wall_s,
            "cpu_s": counts.cpu_s,
            "hello_retries": counts.hello_retries,
            "negotiated": counts.negotiated,
        })
    );
    Ok(())
}

/// `concurrency` loops of exchanges until `duration` has passed.
pub async fn generate(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    concurrency: u32,
    duration: Duration,
) -> Counts {
    let started = Instant::now();
    let deadline = started + duration;
    let connector = TlsConnector::from(cfg);
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let connector = connector.clone();
        loops.spawn(async move {
            let (mut ok, mut errors, mut first) = (0u64, 0u64, None);
            let (mut retries, mut params) = (0u64, None);
            while Instant::now() < deadline {
                match tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(addr, &connector)).await {
                    Ok(Ok((200, hs))) => {
                        ok += 1;
                        retries += u64::from(hs.retried);
                        params.get_or_insert(hs.params);
                    }
                    failed => {
                        errors += 1;
                        first.get_or_insert_with(|| match failed {
                            Ok(Ok((code, _))) => format!("HTTP {code}"),
                            Ok(Err(e)) => format!("{e:#}"),
                            Err(_) => format!("no answer within {EXCHANGE_TIMEOUT:?}"),
                        });
                        // A refused connection fails at once: do not spin on it.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            (ok, errors, first, retries, params)
        });
    }
    let mut counts = Counts {
        completed: 0,
        errors: 0,
        first_error: None,
        wall_s: 0.0,
        cpu_s: 0.0,
        hello_retries: 0,
        negotiated: None,
    };
    while let Some(done) = loops.join_next().await {
        let (ok, errors, first, retries, params) =
            done.unwrap_or((0, 1, Some("a loop panicked".into()), 0, None));
        counts.completed += ok;
        counts.errors += errors;
        counts.first_error = counts.first_error.or(first);
        counts.hello_retries += retries;
        counts.negotiated = counts.negotiated.or(params);
    }
    counts.wall_s = started.elapsed().as_secs_f64();
    counts
}

/// What one exchange's handshake was.
struct Handshake {
    retried: bool,
    params: String,
}

/// One new connection: connect, full handshake, `GET /`, the response to its end; the status
/// and what the handshake negotiated.
async fn exchange(addr: SocketAddr, connector: &TlsConnector) -> Result<(u16, Handshake)> {
    let tcp = TcpStream::connect(addr).await.context("connect")?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(SNI)?;
    let mut tls = connector
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let conn = tls.get_ref().1;
    let hs = Handshake {
        retried: conn.handshake_kind() == Some(rustls::HandshakeKind::FullWithHelloRetryRequest),
        params: negotiated(conn),
    };
    tls.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::with_capacity(512);
    let read = tls.read_to_end(&mut response).await;
    // A server may close without a TLS close_notify after a complete response.
    let complete = response_complete(&response);
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && complete.is_some() => {}
        Err(e) => return Err(e).context("reading the response"),
    }
    match complete {
        Some(status) => Ok((status, hs)),
        None => bail!(
            "incomplete response: {:?}",
            String::from_utf8_lossy(&response[..response.len().min(200)])
        ),
    }
}

/// The status of a response whose head and `Content-Length` body are all there.
fn response_complete(raw: &[u8]) -> Option<u16> {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    (raw.len() - head_end >= length).then_some(status)
}

/// One exchange over TLS from this process (readiness of a TLS listener): the status, as
/// `net::http_get` gives it for plaintext.
pub fn probe(addr: SocketAddr, pki_dir: &Path) -> Result<(u16, String)> {
    let connector = TlsConnector::from(super::pki::client_config(pki_dir)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (status, _) =
            tokio::time::timeout(Duration::from_secs(2), exchange(addr, &connector))
                .await
                .context("no answer within 2 s")??;
        Ok((status, String::new()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_complete_when_its_body_is() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n";
        assert_eq!(response_complete(&[&head[..], b"hello"].concat()), Some(200));
        assert_eq!(response_complete(&[&head[..], b"hel"].concat()), None);
        assert_eq!(response_complete(&head[..20]), None);
        assert_eq!(
            response_complete(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
            Some(400)
        );
    }

    #[test]
    fn parses_the_childs_line() {
        let c = parse_counts(
            "{\"completed\":30,\"errors\":1,\"first_error\":\"TLS handshake\",\"wall_s\":2.0,\"cpu_s\":0.5}\n",
        )
        .unwrap();
        assert_eq!((c.completed, c.errors), (30, 1));
        assert!((c.per_second() - 15.0).abs() < 1e-9);
    }
}

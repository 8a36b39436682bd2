//! raft-write's systems under test: a 3-node weft-control cluster and a 3-member etcd cluster on
//! loopback, each node with its own data dir, plus the one-write requests both accept.
//!
//! Everything here is async (one current-thread runtime drives the clusters' start-up and the
//! load); the processes themselves are [`Spawned`] so they die with the bench.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Method;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::guard::Spawned;
use crate::net;

/// The two systems the bench writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Weft,
    Etcd,
}

impl System {
    pub const ALL: [System; 2] = [System::Weft, System::Etcd];

    pub fn name(self) -> &'static str {
        match self {
            System::Weft => "weft",
            System::Etcd => "etcd",
        }
    }

    /// One write by `client`: weft `PUT /v1/clusters/k{client}`, etcd `POST /v3/kv/put` of key
    /// `k{client}`. The value comes from a process-wide counter, so it differs from the stored
    /// one every time (weft treats a PUT of the stored value as a no-op without a log entry).
    pub fn write_request(self, client: usize) -> (Method, String, Bytes) {
        static SEQ: AtomicU64 = AtomicU64::new(1);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        match self {
            System::Weft => (
                Method::PUT,
                format!("/v1/clusters/k{client}"),
                Bytes::from(format!("{{\"max_idle_per_endpoint\":{seq}}}")),
            ),
            System::Etcd => {
                let key = base64(format!("k{client}").as_bytes());
                let value = base64(format!("v{seq}").as_bytes());
                (
                    Method::POST,
                    "/v3/kv/put".to_string(),
                    Bytes::from(format!("{{\"key\":\"{key}\",\"value\":\"{value}\"}}")),
                )
            }
        }
    }

    /// Whether a write's response says it was committed: weft answers `200` with
    /// `"changed":true`, etcd's gateway `200` with a response header (revision, raft term).
    pub fn write_ok(self, status: u16, body: &[u8]) -> bool {
        let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        status == 200
            && match self {
                System::Weft => has(b"\"changed\":true"),
                System::Etcd => has(b"\"header\""),
            }
    }
}

/// Standard base64 with padding (etcd's JSON gateway takes keys and values as base64 bytes).
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One keep-alive HTTP/1.1 client connection.
pub struct HttpConn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl HttpConn {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await
                .with_context(|| format!("connecting to {addr}: timed out"))?
                .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP handshake with {addr}"))?;
        tokio::spawn(conn);
        Ok(Self {
            sender,
            host: addr.to_string(),
        })
    }

    /// Sends one request and reads the whole response: `(status, body)`.
    pub async fn send(&mut self, method: Method, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.host.as_str());
        if !body.is_empty() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(body))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// False once the server closed the connection (or it broke).
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }
}

/// One request on a fresh connection, answered within 2 s; the body parsed as JSON.
pub async fn request_json(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: &str,
) -> Result<(u16, Value)> {
    let once = async {
        let mut conn = HttpConn::connect(addr).await?;
        let (status, bytes) = conn
            .send(method, path, Bytes::from(body.to_string()))
            .await?;
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok::<_, anyhow::Error>((status, json))
    };
    tokio::time::timeout(Duration::from_secs(2), once)
        .await
        .with_context(|| format!("{addr}{path}: no answer within 2 s"))?
}

/// One member of a running cluster.
pub struct Member {
    pub name: String,
    /// Where clients send writes (weft's API, etcd's client URL).
    pub api: SocketAddr,
    pub process: Spawned,
    /// The member's stderr/stdout, shown when it fails.
    pub log: PathBuf,
}

/// A running 3-node cluster of one system.
pub struct Cluster {
    pub system: System,
    pub members: Vec<Member>,
    /// Index into `members` of the leader, as last found.
    pub leader: usize,
}

/// How long a cluster may take to form (start-up, election, joins).
const FORM_WITHIN: Duration = Duration::from_secs(30);

impl Cluster {
    /// The leader's client address.
    pub fn leader_api(&self) -> SocketAddr {
        self.members[self.leader].api
    }

    /// A follower's client address.
    pub fn follower_api(&self) -> SocketAddr {
        self.members[(self.leader + 1) % self.members.len()].api
    }

    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.process.pid()).collect()
    }

    /// `Err` naming the member (and its last log lines) when one has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            if let Some(status) = m.process.exited() {
                bail!("{} exited ({status}): {}", m.name, log_tail(&m.log));
            }
        }
        Ok(())
    }

    /// weft only: the leader's `(last_log_index, snapshot index)` from `/v1/status` (whether a
    /// snapshot, and with it a log purge, happened during a measurement); `None` for etcd or
    /// when the leader does not answer.
    pub async fn weft_log_state(&self) -> Option<(u64, Option<u64>)> {
        if self.system != System::Weft {
            return None;
        }
        let (_, v) = request_json(self.leader_api(), Method::GET, "/v1/status", "")
            .await
            .ok()?;
        Some((v["last_log_index"].as_u64()?, v["snapshot"].as_u64()))
    }

    /// Asks the members who leads now and updates `leader`; returns that member's name.
    pub async fn find_leader(&mut self) -> Result<String> {
        let leader = match self.system {
            System::Weft => weft_leader(&self.members).await?,
            System::Etcd => etcd_leader(&self.members).await?,
        };
        self.leader = leader;
        Ok(self.members[leader].name.clone())
    }

    /// Starts `weft-control` ×3 under `dir`: node 1 with `--init`, then nodes 2 and 3 with
    /// `--join` (one at a time: each join is a membership change), and waits until node 1
    /// lists three voters and a leader is known.
    /// With `spare_first`, node 1 runs without `wrap` (see raft-write's
    /// `--fsync-delay-spares-leader`).
    pub async fn start_weft(
        bin: &Path,
        wrap: &[String],
        spare_first: bool,
        dir: &Path,
    ) -> Result<Cluster> {
        Self::start_weft_nodes(bin, wrap, spare_first, &[], dir, 3).await
    }

    /// [`Cluster::start_weft`] with `nodes` nodes, each also given `args`.
    pub async fn start_weft_nodes(
        bin: &Path,
        wrap: &[String],
        spare_first: bool,
        args: &[String],
        dir: &Path,
        nodes: usize,
    ) -> Result<Cluster> {
        let ports = net::free_addrs(2 * nodes)?;
        let mut cluster = Cluster {
            system: System::Weft,
            members: Vec::new(),
            leader: 0,
        };
        let first = ports[0];
        for i in 0..nodes {
            let (api, xds) = (ports[2 * i], ports[2 * i + 1]);
            let id = i + 1;
            let data = dir.join(format!("weft-{id}"));
            let log = dir.join(format!("weft-{id}.log"));
            let mut cmd = command(bin, if spare_first && id == 1 { &[] } else { wrap });
            cmd.args(["--id", &id.to_string()])
                .args(["--listen", &api.to_string()])
                .args(["--xds-listen", &xds.to_string()])
                .arg("--data-dir")
                .arg(&data)
                .args(args);
            if id == 1 {
                cmd.arg("--init");
            } else {
                cmd.args(["--join", &first.to_string()]);
            }
            let process = Spawned::start(&format!("weft-control {id}"), with_log(&mut cmd, &log)?)?;
            cluster.members.push(Member {
                name: format!("weft-{id}"),
                api,
                process,
                log,
            });
            cluster.wait_weft_voters(id).await?;
        }
        cluster.find_leader().await?;
        Ok(cluster)
    }

    /// Polls node 1 until it reports `voters` voters and a leader.
    async fn wait_weft_voters(&mut self, voters: usize) -> Result<()> {
        let deadline = Instant::now() + FORM_WITHIN;
        let mut last = String::from("no answer");
        while Instant::now() < deadline {
            self.check_alive()?;
            match request_json(self.members[0].api, Method::GET, "/v1/members", "").await {
                Ok((200, v)) => {
                    let n = v["members"]
                        .as_array()
                        .map_or(0, |m| m.iter().filter(|m| m["voter"] == true).count());
                    if n == voters && v["leader"].is_u64() {
                        return Ok(());
                    }
                    last = v.to_string();
                }
                Ok((code, v)) => last = format!("HTTP {code}: {v}"),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("weft cluster did not reach {voters} voters within {FORM_WITHIN:?} (last: {last})")
    }

    /// Starts etcd ×3 under `dir` as one new cluster and waits until every member reports
    /// healthy (`GET /health`: it sees a leader).
    pub async fn start_etcd(bin: &Path, wrap: &[String], dir: &Path) -> Result<Cluster> {
        let ports = net::free_addrs(6)?;
        let peer = |i: usize| format!("http://{}", ports[2 * i + 1]);
        let initial: Vec<String> = (0..3)
            .map(|i| format!("etcd-{}={}", i + 1, peer(i)))
            .collect();
        let mut cluster = Cluster {
            system: System::Etcd,
            members: Vec::new(),
            leader: 0,
        };
        for i in 0..3 {
            let name = format!("etcd-{}", i + 1);
            let client = format!("http://{}", ports[2 * i]);
            let log = dir.join(format!("{name}.log"));
            let mut cmd = command(bin, wrap);
            cmd.args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.join(&name))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "weft-bench"])
                .args(["--logger", "zap", "--log-outputs", "stderr"]);
            let process = Spawned::start(&name, with_log(&mut cmd, &log)?)?;
            cluster.members.push(Member {
                name,
                api: ports[2 * i],
                process,
                log,
            });
        }
        let deadline = Instant::now() + FORM_WITHIN;
        for i in 0..3 {
            let mut last: String;
            loop {
                cluster.check_alive()?;
                match request_json(cluster.members[i].api, Method::GET, "/health", "").await {
                    Ok((200, v)) if v["health"] == "true" => break,
                    Ok((code, v)) => last = format!("HTTP {code}: {v}"),
                    Err(e) => last = format!("{e:#}"),
                }
                if Instant::now() >= deadline {
                    bail!(
                        "{} not healthy within {FORM_WITHIN:?} (last: {last})",
                        cluster.members[i].name
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        cluster.find_leader().await?;
        Ok(cluster)
    }
}

/// The member weft's node 1 names as leader (`/v1/status`), mapped to our member list by API
/// address (`/v1/members`).
async fn weft_leader(members: &[Member]) -> Result<usize> {
    let (_, status) = request_json(members[0].api, Method::GET, "/v1/status", "").await?;
    let (_, view) = request_json(members[0].api, Method::GET, "/v1/members", "").await?;
    let leader = status["leader"]
        .as_u64()
        .with_context(|| format!("no leader in /v1/status: {status}"))?;
    let addr = view["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["id"] == leader))
        .and_then(|m| m["addr"].as_str())
        .with_context(|| format!("leader {leader} not in /v1/members: {view}"))?;
    members
        .iter()
        .position(|m| m.api.to_string() == addr)
        .with_context(|| format!("leader address {addr} is not one of ours"))
}

/// The member whose `/v3/maintenance/status` says it is the leader (`header.member_id ==
/// leader`; the gateway writes 64-bit ids as strings).
async fn etcd_leader(members: &[Member]) -> Result<usize> {
    let mut seen = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let (code, v) = request_json(m.api, Method::POST, "/v3/maintenance/status", "{}").await?;
        let me = v["header"]["member_id"].as_str().unwrap_or("");
        if code == 200 && !me.is_empty() && v["leader"].as_str() == Some(me) {
            return Ok(i);
        }
        seen.push(format!("{}: HTTP {code} {v}", m.name));
    }
    bail!("no etcd member says it leads: {}", seen.join("; "))
}

/// `bin`, or `wrap[0] wrap[1..] bin` when the node runs under a wrapper (the fsync emulation).
fn command(bin: &Path, wrap: &[String]) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((program, args)) => {
            let mut cmd = Command::new(program);
            cmd.args(args).arg(bin);
            cmd
        }
    }
}

/// Sends the command's stdout and stderr to `log`.
fn with_log<'a>(cmd: &'a mut Command, log: &Path) -> Result<&'a mut Command> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Ok(cmd
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file)))
}

/// The last lines of a member's log, for errors.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn writes_always_change_the_value_and_are_recognised() {
        let (m, path, a) = System::Weft.write_request(3);
        let (_, _, b) = System::Weft.write_request(3);
        assert_eq!((m, path.as_str()), (Method::PUT, "/v1/clusters/k3"));
        assert_ne!(a, b);
        let (m, path, body) = System::Etcd.write_request(0);
        assert_eq!((m, path.as_str()), (Method::POST, "/v3/kv/put"));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["key"], "azA=");
        assert!(System::Weft.write_ok(200, br#"{"kind":"clusters","changed":true,"revision":9}"#));
        assert!(!System::Weft.write_ok(200, br#"{"changed":false}"#));
        assert!(!System::Weft.write_ok(503, br#"{"changed":true}"#));
        assert!(System::Etcd.write_ok(200, br#"{"header":{"revision":"5"}}"#));
    }
}

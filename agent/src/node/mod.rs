//! `weft-agent run`: the node agent's loop. It registers the node's inventory, subscribes to the
//! placements over ADS, and every half second reconciles what runs with what is placed here:
//! starts replicas ([`replica`]) and the weight holders they share ([`holder`]), drains and
//! stops the ones whose placement went, restarts crashed ones after a backoff, and reports the
//! node's state ([`report`]).
//!
//! Its processes outlive it: killed or restarted, the agent adopts what it left running (from
//! the records in `--state-dir`, see [`store`]) instead of restarting it; and while the control
//! plane is unreachable it keeps running what was last placed (the last placements are kept on
//! disk too). Stopping the agent (SIGTERM) leaves the replicas serving; `weft-agent stop`
//! stops them.

pub mod desired;
pub mod holder;
pub mod inventory;
pub mod ports;
pub mod process;
pub mod replica;
pub mod report;
pub mod sidecar;
pub mod store;
pub mod watch;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_control::cli::client::{Client, Server};
use weft_control::nodes::NodeStatus;

use desired::Want;
use holder::Holders;
use replica::{Env, Replica};
use store::{ReplicaRecord, Store};

/// How long between reconcile steps.
const TICK: Duration = Duration::from_millis(500);

/// Everything `weft-agent run` is told (see its flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub node: String,
    /// Control API URLs (registration and reports).
    pub control: Vec<String>,
    /// Control nodes' xDS `host:port`s (placements; the sidecars get them too).
    pub xds: Vec<String>,
    pub xds_ca: Option<PathBuf>,
    pub token: Option<String>,
    pub state_dir: PathBuf,
    pub inventory: Option<PathBuf>,
    pub gpu_source: inventory::Source,
    /// The address sidecars listen on and register (other nodes reach replicas there).
    pub advertise_ip: String,
    pub ports: Range<u16>,
    pub start_timeout: Duration,
    pub drain_timeout_text: String,
    pub drain_timeout: Duration,
    pub report_interval: Duration,
    pub sidecar_report_interval: String,
    pub agent_bin: String,
    pub model_server_bin: String,
    pub proxy_bin: String,
}

/// Wait before start number `tries + 1` after a failure: 1 s doubling to 30 s.
pub fn backoff(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

pub fn now_ms() -> u64 {
    weft_control::cli::node::now_ms()
}

/// `GET path` on `addr` over HTTP/1.1, 200 expected, within 2 s.
pub async fn health(addr: &str, path: &str) -> Result<(), String> {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nuser-agent: weft-agent\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut head = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            match s.read(&mut head[n..]).await.map_err(|e| e.to_string())? {
                0 => break,
                k => n += k,
            }
        }
        let line = String::from_utf8_lossy(&head[..n]).lines().next().unwrap_or_default().to_string();
        if line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200") {
            Ok(())
        } else if line.is_empty() {
            Err("connection closed without an answer".into())
        } else {
            Err(format!("answered {line:?}"))
        }
    };
    tokio::time::timeout(Duration::from_secs(2), attempt).await.map_err(|_| "no answer within 2 s".to_string())?
}

struct Agent {
    opts: Options,
    inv: inventory::Inventory,
    store: Store,
    replicas: BTreeMap<String, Replica>,
    holders: Holders,
    /// What should run; `None` until the control plane said (or a saved set was found): then
    /// adopted replicas run on untouched.
    wants: Option<Vec<Want>>,
    warnings: Vec<String>,
}

impl Agent {
    fn adopt(&mut self) {
        let (holders, mut warnings) = Holders::adopt(&self.store);
        self.holders = holders;
        let (records, w) = self.store.records::<ReplicaRecord>("replicas");
        warnings.extend(w);
        for rec in records {
            let name = rec.want.placement.clone();
            match Replica::adopt(rec, &self.store) {
                Some(r) => {
                    eprintln!("weft-agent: adopted {name} (pid {})", r.status().pid);
                    self.replicas.insert(name, r);
                }
                None => self.store.remove(&self.store.replica_path(&name)),
            }
        }
        self.warnings = warnings;
        self.wants = self.store.placements();
    }

    /// Takes a newly pushed placement set.
    fn placed(&mut self, wants: Vec<Want>) {
        if self.wants.as_ref() != Some(&wants) {
            if let Err(e) = self.store.save_placements(&wants) {
                eprintln!("weft-agent: {e}");
            }
            self.wants = Some(wants);
        }
    }

    async fn tick(&mut self) {
        if let Some(wants) = &self.wants {
            for w in wants {
                match self.replicas.get_mut(&w.placement) {
                    None => {
                        self.replicas.insert(w.placement.clone(), Replica::new(w.clone()));
                    }
                    // Changed launch: drain the old one; the next tick starts the new.
                    Some(r) if &r.want != w => r.drain(self.opts.drain_timeout),
                    Some(_) => {}
                }
            }
            for (name, r) in self.replicas.iter_mut() {
                if !wants.iter().any(|w| &w.placement == name) {
                    r.drain(self.opts.drain_timeout);
                }
            }
        }
        let names: Vec<String> = self.replicas.keys().cloned().collect();
        for name in names {
            let mut r = self.replicas.remove(&name).expect("listed");
            let taken: Vec<u16> = self.replicas.values().flat_map(Replica::ports).collect();
            let mut env = Env { opts: &self.opts, store: &self.store, holders: &mut self.holders, gpus: self.inv.gpu_count(), taken: &taken };
            r.step(&mut env).await;
            if r.state != weft_control::nodes::ReplicaState::Stopped {
                self.replicas.insert(name, r);
            }
        }
        let needed: Vec<holder::Key> = self
            .replicas
            .values()
            .filter(|r| r.state != weft_control::nodes::ReplicaState::Draining)
            .filter_map(Replica::holder_key)
            .collect();
        self.holders.prune(&needed, &self.store);
    }

    fn status(&self) -> NodeStatus {
        let users = |k: &holder::Key| self.replicas.values().filter(|r| r.running() && r.holder_key().as_ref() == Some(k)).count() as u32;
        NodeStatus {
            node: self.opts.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            reported_at_ms: 0,
            inventory_source: self.inv.source.into(),
            gpus: self.inv.gpus.clone(),
            replicas: self.replicas.values().map(Replica::status).collect(),
            holders: self.holders.statuses(users),
            warnings: self.warnings.clone(),
        }
    }
}

/// Runs the agent until SIGTERM or SIGINT (leaving its replicas running).
pub async fn run(opts: Options) -> Result<(), String> {
    let inv = inventory::detect(&opts.node, opts.gpu_source, opts.inventory.as_deref())?;
    let store = Store::open(&opts.state_dir)?;
    let servers = opts.control.iter().map(|s| Server::parse(s, false)).collect::<Result<Vec<_>, _>>().map_err(|e| format!("--control: {e}"))?;
    let tls = match &opts.xds_ca {
        Some(p) => weft_proxy::xds::dial::ControlTls::from_ca_file(p)?,
        None => Default::default(),
    };
    eprintln!(
        "weft-agent: node {} ({} GPU(s) from {}), state in {}",
        opts.node,
        inv.gpu_count(),
        inv.source,
        store.dir.display()
    );
    let reporter = report::spawn(Client::new(servers, opts.token.clone()), opts.node.clone(), inv.spec.clone(), opts.report_interval);
    let connected = Arc::new(AtomicBool::new(false));
    let mut placements = watch::spawn(opts.xds.clone(), tls, format!("agent.{}", opts.node), connected.clone());
    let mut agent = Agent { opts, inv, store, replicas: BTreeMap::new(), holders: Holders::default(), wants: None, warnings: vec![] };
    agent.adopt();
    let stop = weft_proxy::signals::stop_requested();
    tokio::pin!(stop);
    let mut was_connected = false;
    loop {
        if let Some(list) = placements.borrow_and_update().clone() {
            agent.placed(desired::for_node(&agent.opts.node, &list));
        }
        let up = connected.load(Ordering::SeqCst);
        if up != was_connected {
            eprintln!("weft-agent: control plane {}", if up { "connected" } else { "unreachable: keeping every replica as it is" });
            was_connected = up;
        }
        agent.tick().await;
        let status = agent.status();
        reporter.send_if_modified(|old| {
            let changed = old.as_ref() != Some(&status);
            if changed {
                *old = Some(status);
            }
            changed
        });
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(TICK) => {}
            _ = placements.changed() => {}
        }
    }
    eprintln!("weft-agent: stopping; {} replica(s) keep running (weft-agent stop ends them)", agent.replicas.len());
    Ok(())
}

/// `weft-agent stop`: drains every replica recorded in `state_dir` (SIGTERM to the sidecars,
/// then the servers), then stops the weight holders; SIGKILL after `grace`.
pub fn stop_all(state_dir: &std::path::Path, grace: Duration) -> Result<usize, String> {
    let store = Store::open(state_dir)?;
    let (replicas, _) = store.records::<ReplicaRecord>("replicas");
    let (holders, _) = store.records::<store::HolderRecord>("holders");
    let sidecars: Vec<process::ProcId> = replicas.iter().filter_map(|r| r.sidecar).collect();
    let servers: Vec<process::ProcId> = replicas.iter().map(|r| r.server).collect();
    let held: Vec<process::ProcId> = holders.iter().map(|h| h.proc).collect();
    for group in [sidecars, servers, held] {
        let mut procs: Vec<process::Proc> = group.into_iter().filter_map(|id| process::Proc::adopt(id, PathBuf::new())).collect();
        for p in &procs {
            p.signal(rustix::process::Signal::TERM);
        }
        let deadline = std::time::Instant::now() + grace;
        while procs.iter_mut().any(|p| p.exited().is_none()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in &mut procs {
            p.kill();
        }
    }
    for sub in ["replicas", "holders"] {
        if let Ok(entries) = std::fs::read_dir(state_dir.join(sub)) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_file(state_dir.join("placements.json"));
    Ok(replicas.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_from_one_second_to_thirty() {
        let s: Vec<u64> = (1..=8).map(|t| super::backoff(t).as_secs()).collect();
        assert_eq!(s, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}

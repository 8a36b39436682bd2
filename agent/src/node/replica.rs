//! One replica's life on the node: wait for its base's holder, start the model server, once it
//! answers its health check start the sidecar in front of it, once the health check passes
//! through the sidecar it is `ready` (the sidecar registered it, so routing follows). A crash
//! or failing health check stops both processes and retries after a backoff; a placement that
//! went is drained through the sidecar (SIGTERM: it finishes in-flight requests) before the
//! server stops. Every step records the processes in the state directory, so a restarted agent
//! adopts them.

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use weft_control::nodes::{ReplicaState, ReplicaStatus};

use super::desired::{Want, precheck};
use super::holder::{self, Holders};
use super::process::Proc;
use super::sidecar;
use super::store::{ReplicaRecord, Store};
use super::{Options, backoff, health, now_ms};

/// Consecutive failed health checks of a ready replica before it is restarted.
const HEALTH_FAILURES: u32 = 3;
/// How long a server gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What the loop lends a replica's step.
pub struct Env<'a> {
    pub opts: &'a Options,
    pub store: &'a Store,
    pub holders: &'a mut Holders,
    pub gpus: u32,
    /// Ports other replicas hold.
    pub taken: &'a [u16],
}

pub struct Replica {
    pub want: Want,
    pub state: ReplicaState,
    pub reason: String,
    pub since_ms: u64,
    pub restarts: u32,
    pub adopted: bool,
    server: Option<Proc>,
    sidecar: Option<Proc>,
    pub server_port: u16,
    pub inbound: String,
    pub admin_port: u16,
    holder: Option<String>,
    /// Start timeout while starting, next try while failed or backing off, drain end while
    /// draining.
    deadline: Instant,
    health_failures: u32,
    ready_since_ms: u64,
    /// SIGTERM already sent to the server while draining.
    stopping_server: Option<Instant>,
    /// When waiting for a weight holder that is still loading gives up: set once, when the
    /// wait begins, so a holder that never serves fails the replica after `start_timeout`.
    holder_wait_until: Option<Instant>,
}

impl Replica {
    /// A replica to start now (starting, no server yet: the first step starts it).
    pub fn new(want: Want) -> Replica {
        Replica {
            want,
            state: ReplicaState::Starting,
            reason: String::new(),
            since_ms: now_ms(),
            restarts: 0,
            adopted: false,
            server: None,
            sidecar: None,
            server_port: 0,
            inbound: String::new(),
            admin_port: 0,
            holder: None,
            deadline: Instant::now(),
            health_failures: 0,
            ready_since_ms: 0,
            stopping_server: None,
            holder_wait_until: None,
        }
    }

    /// The replica an earlier agent left running, if its server still runs (a sidecar that died
    /// meanwhile is started again by the first step).
    pub fn adopt(rec: ReplicaRecord, store: &Store) -> Option<Replica> {
        let server = Proc::adopt(rec.server, store.log(&format!("server-{}", rec.want.placement)));
        let sidecar = rec.sidecar.and_then(|s| Proc::adopt(s, store.log(&format!("sidecar-{}", rec.want.placement))));
        let Some(server) = server else {
            if let Some(mut s) = sidecar {
                s.kill();
            }
            return None;
        };
        Some(Replica {
            state: ReplicaState::Starting,
            restarts: rec.restarts,
            adopted: true,
            server: Some(server),
            sidecar,
            server_port: rec.server_port,
            inbound: rec.inbound,
            admin_port: rec.admin_port,
            holder: rec.holder,
            deadline: Instant::now() + Duration::from_secs(30),
            ready_since_ms: rec.ready_since_ms,
            ..Replica::new(rec.want)
        })
    }

    pub fn holder_key(&self) -> Option<holder::Key> {
        let l = &self.want.launch;
        (l.command.is_empty() && !l.base_path.is_empty()).then(|| holder::Key { base_path: l.base_path.clone(), gpu: self.want.gpu })
    }

    /// Whether its processes run (what holders count as users).
    pub fn running(&self) -> bool {
        self.server.is_some()
    }

    pub fn ports(&self) -> [u16; 3] {
        [self.server_port, self.admin_port, self.inbound.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)]
    }

    fn set(&mut self, state: ReplicaState, reason: String) {
        if state != self.state || reason != self.reason {
            if !reason.is_empty() {
                eprintln!("weft-agent: {} {}: {reason}", self.want.placement, state.as_str());
            }
            self.state = state;
            self.reason = reason;
            self.since_ms = now_ms();
        }
    }

    fn record(&self, store: &Store) {
        let Some(server) = &self.server else { return };
        let rec = ReplicaRecord {
            want: self.want.clone(),
            server: server.id,
            server_port: self.server_port,
            sidecar: self.sidecar.as_ref().map(|s| s.id),
            inbound: self.inbound.clone(),
            admin_port: self.admin_port,
            holder: self.holder.clone(),
            restarts: self.restarts,
            ready_since_ms: self.ready_since_ms,
        };
        if let Err(e) = store.save(&store.replica_path(&self.want.placement), &rec) {
            eprintln!("weft-agent: {e}");
        }
    }

    /// Kills both processes and waits `backoff` before the next start.
    fn fail(&mut self, state: ReplicaState, reason: String, store: &Store) {
        for mut p in [self.sidecar.take(), self.server.take()].into_iter().flatten() {
            p.kill();
        }
        store.remove(&store.replica_path(&self.want.placement));
        self.restarts += 1;
        self.health_failures = 0;
        self.holder_wait_until = None;
        self.deadline = Instant::now() + backoff(self.restarts);
        self.set(state, reason);
    }

    /// Begins draining: the sidecar finishes in-flight requests and stops.
    pub fn drain(&mut self, drain_timeout: Duration) {
        if self.state == ReplicaState::Draining || self.state == ReplicaState::Stopped {
            return;
        }
        match &self.sidecar {
            Some(s) => s.signal(Signal::TERM),
            None if self.server.is_none() => {
                self.set(ReplicaState::Stopped, String::new());
                return;
            }
            None => {}
        }
        self.deadline = Instant::now() + drain_timeout + Duration::from_secs(2);
        self.set(ReplicaState::Draining, String::new());
    }

    /// One step of the replica's life; see the module doc.
    pub async fn step(&mut self, env: &mut Env<'_>) {
        let now = Instant::now();
        match self.state {
            ReplicaState::Stopped => {}
            ReplicaState::Draining => self.step_drain(env.store),
            ReplicaState::Failed | ReplicaState::Backoff => {
                if now >= self.deadline {
                    self.start(env).await;
                }
            }
            ReplicaState::Starting if self.server.is_none() => self.start(env).await,
            ReplicaState::Starting | ReplicaState::Ready => self.watch(env).await,
        }
    }

    async fn start(&mut self, env: &mut Env<'_>) {
        if let Err(reason) = precheck(&self.want, env.gpus, |p| Path::new(p).is_file()) {
            return self.fail(ReplicaState::Failed, reason, env.store);
        }
        let mut envs = self.want.launch.env.clone();
        if let Some(g) = self.want.gpu {
            envs.entry("CUDA_VISIBLE_DEVICES".into()).or_insert(g.to_string());
        }
        self.holder = None;
        if let Some(key) = self.holder_key() {
            match env.holders.ensure(&key, &self.want.base_model, env.store, &env.opts.agent_bin) {
                holder::Ready::Socket(s) => self.holder = Some(s.display().to_string()),
                holder::Ready::Pending => {
                    let until = *self.holder_wait_until.get_or_insert(Instant::now() + env.opts.start_timeout);
                    if Instant::now() < until {
                        return self.set(ReplicaState::Starting, "waiting for the weight holder to load the base".into());
                    }
                    let reason = format!("the weight holder for {} did not serve within {:?}", key.base_path, env.opts.start_timeout);
                    return self.fail(ReplicaState::Backoff, reason, env.store);
                }
                holder::Ready::Failed(reason) => return self.fail(ReplicaState::Failed, reason, env.store),
            }
            self.holder_wait_until = None;
        }
        let ports = super::ports::pick(env.opts.ports.clone(), 3, env.taken);
        let [server_port, admin_port, inbound_port] = ports[..] else {
            return self.fail(ReplicaState::Backoff, format!("no free ports in {:?}", env.opts.ports), env.store);
        };
        (self.server_port, self.admin_port) = (server_port, admin_port);
        self.inbound = format!("{}:{inbound_port}", env.opts.advertise_ip);
        let argv = if let Some(socket) = &self.holder {
            let mut argv = vec![env.opts.model_server_bin.clone(), "--port".into(), server_port.to_string(), "--variant".into(), self.want.variant.clone()];
            argv.extend(["--holder".into(), socket.clone()]);
            if !self.want.launch.delta_path.is_empty() {
                argv.extend(["--delta".into(), self.want.launch.delta_path.clone()]);
            }
            argv
        } else {
            self.want.launch.argv(server_port)
        };
        let log = env.store.log(&format!("server-{}", self.want.placement));
        match Proc::spawn(&argv, &envs, &log) {
            Ok(p) => self.server = Some(p),
            Err(e) => return self.fail(ReplicaState::Failed, e, env.store),
        }
        self.adopted = false;
        self.deadline = Instant::now() + env.opts.start_timeout;
        self.record(env.store);
        self.set(ReplicaState::Starting, String::new());
    }

    /// Starting or ready: check the processes and the health path.
    async fn watch(&mut self, env: &mut Env<'_>) {
        if let Some(how) = self.server.as_mut().and_then(|s| s.exited().map(str::to_owned)) {
            return self.fail(ReplicaState::Backoff, format!("model server {how}"), env.store);
        }
        if let Some(how) = self.sidecar.as_mut().and_then(|s| s.exited().map(str::to_owned)) {
            return self.fail(ReplicaState::Backoff, format!("sidecar {how}"), env.store);
        }
        let path = self.want.launch.health_path().to_string();
        if self.sidecar.is_none() {
            // The sidecar registers the endpoint as soon as it runs: only start it once the
            // server answers.
            match health(&format!("127.0.0.1:{}", self.server_port), &path).await {
                Ok(()) => self.start_sidecar(env),
                Err(e) if Instant::now() >= self.deadline => {
                    let t = env.opts.start_timeout;
                    self.fail(ReplicaState::Backoff, format!("not healthy within {t:?} of its start: GET {path}: {e}"), env.store)
                }
                Err(_) => {}
            }
            return;
        }
        match health(&self.inbound, &path).await {
            Ok(()) => {
                self.health_failures = 0;
                if self.state != ReplicaState::Ready {
                    if self.ready_since_ms == 0 || !self.adopted {
                        self.ready_since_ms = now_ms();
                    }
                    self.record(env.store);
                    self.set(ReplicaState::Ready, String::new());
                }
            }
            Err(e) if self.state == ReplicaState::Ready => {
                self.health_failures += 1;
                if self.health_failures >= HEALTH_FAILURES {
                    self.fail(ReplicaState::Backoff, format!("health check failed {HEALTH_FAILURES} times: GET {path}: {e}"), env.store);
                }
            }
            Err(e) if Instant::now() >= self.deadline => {
                self.fail(ReplicaState::Backoff, format!("not healthy through its sidecar: GET {path}: {e}"), env.store)
            }
            Err(_) => {}
        }
    }

    fn start_sidecar(&mut self, env: &mut Env<'_>) {
        let o = env.opts;
        let ports = sidecar::Ports { inbound: &self.inbound, admin_port: self.admin_port, server_port: self.server_port };
        let cfg = sidecar::bootstrap(&o.node, &self.want, &ports);
        let config = env.store.run_file(&format!("sidecar-{}.yaml", self.want.placement));
        let cache = env.store.run_file(&format!("sidecar-{}.xds.json", self.want.placement));
        let yaml = serde_norway::to_string(&cfg).expect("a config serializes");
        if let Err(e) = std::fs::write(&config, yaml) {
            return self.fail(ReplicaState::Backoff, format!("{}: {e}", config.display()), env.store);
        }
        let flags = sidecar::Flags {
            proxy_bin: &o.proxy_bin,
            xds: &o.xds,
            xds_ca: o.xds_ca.as_deref(),
            drain_timeout: &o.drain_timeout_text,
            report_interval: &o.sidecar_report_interval,
        };
        let argv = sidecar::argv(&flags, &config, &cache, &self.want);
        let log = env.store.log(&format!("sidecar-{}", self.want.placement));
        match Proc::spawn(&argv, &Default::default(), &log) {
            Ok(p) => {
                self.sidecar = Some(p);
                self.deadline = Instant::now() + o.start_timeout;
                self.record(env.store);
            }
            Err(e) => self.fail(ReplicaState::Failed, e, env.store),
        }
    }

    fn step_drain(&mut self, store: &Store) {
        let sidecar_done = self.sidecar.as_mut().is_none_or(|s| s.exited().is_some());
        if !sidecar_done && Instant::now() < self.deadline {
            return;
        }
        if let Some(mut s) = self.sidecar.take() {
            s.kill();
        }
        let Some(server) = &mut self.server else {
            store.remove(&store.replica_path(&self.want.placement));
            return self.set(ReplicaState::Stopped, String::new());
        };
        match self.stopping_server {
            None => {
                server.signal(Signal::TERM);
                self.stopping_server = Some(Instant::now());
            }
            Some(t) if server.exited().is_some() || t.elapsed() >= STOP_GRACE => {
                server.kill();
                self.server = None;
                store.remove(&store.replica_path(&self.want.placement));
                self.set(ReplicaState::Stopped, String::new());
            }
            Some(_) => {}
        }
    }

    pub fn status(&self) -> ReplicaStatus {
        ReplicaStatus {
            placement: self.want.placement.clone(),
            variant: self.want.variant.clone(),
            base_model: self.want.base_model.clone(),
            state: self.state,
            reason: self.reason.clone(),
            pid: self.server.as_ref().map_or(0, |p| p.id.pid),
            sidecar_pid: self.sidecar.as_ref().map_or(0, |p| p.id.pid),
            endpoint: if self.sidecar.is_some() { self.inbound.clone() } else { String::new() },
            restarts: self.restarts,
            since_ms: self.since_ms,
            gpu: self.want.gpu,
            adopted: self.adopted,
        }
    }
}

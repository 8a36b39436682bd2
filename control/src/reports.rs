//! Sidecar reports: registrations, heartbeats and load, received on the `SidecarReports`
//! stream beside ADS, and the fault detector that turns missing heartbeats into unhealthy
//! endpoints.
//!
//! - A sidecar's first report registers the endpoint it fronts: a `registrations/<node id>`
//!   resource written through Raft (so every control node pushes it to every sidecar), naming
//!   this control node as the one watching it.
//! - Every report is a heartbeat for the phi-accrual detector (`crate::fault`). When a
//!   watched sidecar's φ crosses the threshold, its registration is rewritten with
//!   `healthy: false` — conditional on the revision this node wrote, so if the sidecar has
//!   meanwhile re-registered with another control node, that node's view wins. When its
//!   heartbeats return, it is marked healthy again.
//! - Load (per-variant requests, errors, latency) is summed per sidecar in memory and shown by
//!   `GET /v1/proxies`.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use weft_xds::resources::v1;
use weft_xds::resources::v1::sidecar_reports_server::{SidecarReports, SidecarReportsServer};

use crate::fault::{Detector, Settings};
use crate::resources::{REGISTRATIONS, Registration};
use crate::store::{Command, Node, NodeId, StoreError};

/// How often the detector is consulted.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// Per-variant load: counters summed over a sidecar's reports, gauges as of its last one.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Load {
    pub requests: u64,
    pub errors: u64,
    pub latency_ms_sum: f64,
    #[serde(default)]
    pub in_flight: u32,
    #[serde(default)]
    pub queued: u32,
}

/// What this node knows of one sidecar that reported to it.
#[derive(Debug, Clone, Default)]
struct Sidecar {
    registration: Option<Registration>,
    /// The revision of the registration this node last wrote (0 = not written yet).
    written: u64,
    /// The `healthy` value of that write.
    healthy: bool,
    streams: u32,
    /// When its last report stream closed (this node's ms), while none is open.
    closed_ms: Option<u64>,
    load: BTreeMap<String, Load>,
    /// A training sidecar's last report of its trainer, and when it arrived (this node's ms).
    training: Option<(v1::TrainingReport, u64)>,
    identity: Option<v1::IdentityReport>,
}

/// A sidecar's report state, for `GET /v1/proxies`.
#[derive(Debug, Clone, Serialize)]
pub struct SidecarView {
    pub registration: Option<Registration>,
    pub reporting: bool,
    /// How long ago its last report stream closed, while none is open.
    pub disconnected_ms: Option<u64>,
    pub phi: Option<f64>,
    pub load: BTreeMap<String, Load>,
    /// A training sidecar's view of its trainer (`age_ms` = how old the report is).
    pub training: Option<crate::shards::checkpoint::WorkerState>,
    /// Its mesh identity and certificate validity (Unix seconds), when it has mTLS.
    pub identity: Option<IdentityView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdentityView {
    pub spiffe_id: String,
    pub not_before: i64,
    pub not_after: i64,
}

struct Inner {
    detector: Detector,
    sidecars: BTreeMap<String, Sidecar>,
    /// Per (experiment, variant), summed over every sidecar that reported to this node.
    experiments: BTreeMap<(String, String), ExperimentLoad>,
    /// The same in [`WINDOW_BUCKET_S`] buckets over the last [`WINDOW_S`], for `weftctl stat`.
    windows: BTreeMap<(String, String), std::collections::VecDeque<(u64, ExperimentLoad)>>,
}

/// Width of one bucket of the recent-load window, seconds.
pub const WINDOW_BUCKET_S: u64 = 10;
/// The longest window kept, seconds.
pub const WINDOW_S: u64 = 300;

/// One experiment variant's cumulative load at one control node (what the rollout engine
/// differences per node and merges).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct ExperimentLoad {
    pub experiment: String,
    pub variant: String,
    pub requests: u64,
    pub errors: u64,
    pub latency: weft_proxy::sketch::LogSketch,
    /// Tokens the responses reported (`usage`), and their time to first byte (ms).
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub ttfb: weft_proxy::sketch::LogSketch,
}

impl ExperimentLoad {
    /// Adds `other`'s counts and latencies (exact).
    pub fn add(&mut self, other: &ExperimentLoad) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.latency.merge(&other.latency);
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.ttfb.merge(&other.ttfb);
    }
}

/// Shared by the gRPC service, the detector loop and the API.
pub struct Tracker {
    node: Arc<Node>,
    /// Writes go to the leader; a follower sends them through its own API, which forwards.
    own_api: String,
    token: Option<String>,
    peers: Arc<crate::api::forward::Peers>,
    started: Instant,
    threshold: f64,
    inner: Mutex<Inner>,
}

impl Tracker {
    pub fn new(node: Arc<Node>, own_api: String, token: Option<String>, peers: Arc<crate::api::forward::Peers>) -> Self {
        let settings = Settings::default();
        Tracker {
            node,
            own_api,
            token,
            peers,
            started: Instant::now(),
            threshold: settings.threshold,
            inner: Mutex::new(Inner {
                detector: Detector::new(settings),
                sidecars: BTreeMap::new(),
                experiments: BTreeMap::new(),
                windows: BTreeMap::new(),
            }),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn me(&self) -> NodeId {
        self.node.id()
    }

    /// The tonic service to add to the xDS server.
    pub fn service(self: &Arc<Self>) -> SidecarReportsServer<ReportService> {
        SidecarReportsServer::new(ReportService { tracker: self.clone() })
    }

    pub fn views(&self) -> BTreeMap<String, SidecarView> {
        let now = self.now_ms();
        let inner = self.inner.lock().unwrap();
        inner
            .sidecars
            .iter()
            .map(|(id, s)| {
                let view = SidecarView {
                    // As last written through Raft (what sidecars are told), not as reported.
                    registration: s.registration.clone().map(|r| Registration { healthy: s.healthy || s.written == 0, ..r }),
                    reporting: s.streams > 0,
                    disconnected_ms: s.closed_ms.filter(|_| s.streams == 0).map(|at| now.saturating_sub(at)),
                    phi: inner.detector.phi(id, now),
                    load: s.load.clone(),
                    training: s.training.as_ref().map(|(t, at)| worker_state(t, now.saturating_sub(*at))),
                    identity: s.identity.as_ref().map(|i| IdentityView { spiffe_id: i.spiffe_id.clone(), not_before: i.not_before, not_after: i.not_after }),
                };
                (id.clone(), view)
            })
            .collect()
    }

    /// Cumulative per-experiment-variant load of the sidecars that reported to this node.
    pub fn experiment_loads(&self) -> Vec<ExperimentLoad> {
        self.inner.lock().unwrap().experiments.values().cloned().collect()
    }

    /// Per-experiment-variant load of the last `window_s` seconds (whole buckets; at most
    /// [`WINDOW_S`]), and how many seconds that covers (less while this node is young).
    pub fn experiment_window(&self, window_s: u64) -> (Vec<ExperimentLoad>, f64) {
        let now = self.now_ms();
        let bucket = now / 1000 / WINDOW_BUCKET_S;
        let buckets = window_s.clamp(WINDOW_BUCKET_S, WINDOW_S) / WINDOW_BUCKET_S;
        let inner = self.inner.lock().unwrap();
        let items = inner
            .windows
            .values()
            .filter_map(|ring| {
                let mut sum: Option<ExperimentLoad> = None;
                for (_, l) in ring.iter().filter(|(b, _)| b + buckets > bucket) {
                    match &mut sum {
                        Some(s) => s.add(l),
                        None => sum = Some(l.clone()),
                    }
                }
                sum
            })
            .collect();
        // The current bucket is partly elapsed.
        let covered = ((buckets - 1) * WINDOW_BUCKET_S) as f64 + (now % (WINDOW_BUCKET_S * 1000)) as f64 / 1000.0;
        (items, covered.min(now as f64 / 1000.0).max(1e-3))
    }

    /// Records one report; returns a registration to write, if it carries a new one.
    fn receive(&self, report: &v1::SidecarReport) -> Option<Registration> {
        let now = self.now_ms();
        let mut inner = self.inner.lock().unwrap();
        inner.detector.heartbeat(&report.node_id, now);
        let bucket = now / 1000 / WINDOW_BUCKET_S;
        for l in report.load.iter().filter(|l| !l.experiment.is_empty()) {
            let key = (l.experiment.clone(), l.variant.clone());
            let mut delta = ExperimentLoad {
                experiment: l.experiment.clone(),
                variant: l.variant.clone(),
                requests: l.requests,
                errors: l.errors,
                input_tokens: l.input_tokens,
                output_tokens: l.output_tokens,
                ..ExperimentLoad::default()
            };
            for (sk, into) in [(&l.latency, &mut delta.latency), (&l.ttfb, &mut delta.ttfb)] {
                if let Some(sk) = sk {
                    match weft_proxy::sketch::LogSketch::from_proto(sk) {
                        Ok(sk) => *into = sk,
                        Err(err) => tracing::warn!(node = %report.node_id, error = %err.0, "latency sketch refused"),
                    }
                }
            }
            let total = inner.experiments.entry(key.clone()).or_insert_with(|| ExperimentLoad {
                experiment: l.experiment.clone(),
                variant: l.variant.clone(),
                ..ExperimentLoad::default()
            });
            total.add(&delta);
            let ring = inner.windows.entry(key).or_default();
            match ring.back_mut() {
                Some((b, sum)) if *b == bucket => sum.add(&delta),
                _ => ring.push_back((bucket, delta)),
            }
            while ring.front().is_some_and(|(b, _)| b + WINDOW_S / WINDOW_BUCKET_S < bucket) {
                ring.pop_front();
            }
        }
        let s = inner.sidecars.entry(report.node_id.clone()).or_default();
        // Each report carries the gauges of every busy variant: the others are idle now.
        for t in s.load.values_mut() {
            (t.in_flight, t.queued) = (0, 0);
        }
        for l in &report.load {
            let t = s.load.entry(l.variant.clone()).or_default();
            t.requests += l.requests;
            t.errors += l.errors;
            t.latency_ms_sum += l.latency_ms_sum;
            (t.in_flight, t.queued) = (l.in_flight, l.queued);
        }
        if let Some(t) = &report.training {
            s.training = Some((t.clone(), now));
        }
        if report.identity.is_some() {
            s.identity = report.identity.clone();
        }
        let r = report.registration.as_ref()?;
        let reg = Registration {
            cluster: r.cluster.clone(),
            address: r.address.clone(),
            variant: r.variant.clone(),
            labels: r.labels.clone().into_iter().collect(),
            healthy: true,
            control_node: self.me(),
        };
        s.registration = Some(reg.clone());
        s.written = 0;
        Some(reg)
    }

    fn stream_opened(&self, node_id: &str) {
        let mut inner = self.inner.lock().unwrap();
        let s = inner.sidecars.entry(node_id.to_owned()).or_default();
        s.streams += 1;
        s.closed_ms = None;
    }

    fn stream_closed(&self, node_id: &str) {
        let now = self.now_ms();
        if let Some(s) = self.inner.lock().unwrap().sidecars.get_mut(node_id) {
            s.streams = s.streams.saturating_sub(1);
            if s.streams == 0 {
                s.closed_ms = Some(now);
            }
        }
    }

    /// Writes `node_id`'s registration with `healthy`, conditional on `expect` (None = the
    /// first write of this registration). Returns the new revision.
    async fn write(&self, node_id: &str, reg: &Registration, expect: Option<u64>) -> Result<u64, String> {
        let cmd = Command::Put {
            kind: REGISTRATIONS.into(),
            name: node_id.into(),
            value_json: serde_json::to_string(reg).expect("registration serializes"),
            expect_revision: expect,
        };
        if self.node.leader() == Some(self.me()) {
            match self.node.write(cmd.clone()).await {
                Err(StoreError::NotLeader { .. }) => {}
                other => return other.map_err(|e| e.to_string()),
            }
        }
        // Through this node's own API, whose leader gate forwards to the leader.
        let mut req = http::Request::post("/internal/write").header(http::header::CONTENT_TYPE, "application/json");
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let (parts, _) = req.body(()).map_err(|e| e.to_string())?.into_parts();
        let body = serde_json::to_vec(&cmd).expect("command serializes");
        let resp = self.peers.forward(&self.own_api, None, &parts, body.into()).await?;
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        match v["revision"].as_u64() {
            Some(r) if status.is_success() => Ok(r),
            _ => Err(format!("HTTP {status}: {v}")),
        }
    }

    /// One pass of the detector: writes registrations not written yet, and health changes.
    pub async fn check(&self) {
        let now = self.now_ms();
        let work: Vec<(String, Registration, u64, bool)> = {
            let inner = self.inner.lock().unwrap();
            inner
                .sidecars
                .iter()
                .filter_map(|(id, s)| {
                    let reg = s.registration.clone()?;
                    let up = inner.detector.phi(id, now).is_none_or(|p| p < self.threshold);
                    (s.written == 0 || up != s.healthy).then(|| (id.clone(), reg, s.written, up))
                })
                .collect()
        };
        for (id, mut reg, written, up) in work {
            if written != 0 {
                // Still ours? A sidecar that moved to another control node is that node's now.
                let stored = self.node.local().get(REGISTRATIONS, &id).ok().flatten();
                if stored.as_ref().is_none_or(|r| r.revision != written) {
                    tracing::info!(sidecar = %id, "registration taken over by another control node; no longer watching it");
                    let mut inner = self.inner.lock().unwrap();
                    inner.sidecars.remove(&id);
                    inner.detector.remove(&id);
                    continue;
                }
            }
            reg.healthy = up;
            let expect = (written != 0).then_some(written);
            match self.write(&id, &reg, expect).await {
                Ok(revision) => {
                    if written != 0 {
                        tracing::warn!(sidecar = %id, endpoint = %reg.address, healthy = up, "endpoint health changed");
                    }
                    let mut inner = self.inner.lock().unwrap();
                    if let Some(s) = inner.sidecars.get_mut(&id) {
                        s.written = revision;
                        s.healthy = up;
                    }
                }
                Err(e) => tracing::warn!(sidecar = %id, error = %e, "writing a registration failed; will retry"),
            }
        }
    }

    /// Runs the detector until `stop` fires.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => self.check().await,
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            }
        }
    }
}

/// A training report as the fault detector and checkpoint tracker read it.
fn worker_state(t: &v1::TrainingReport, age_ms: u64) -> crate::shards::checkpoint::WorkerState {
    use crate::shards::checkpoint::{Reported, WorkerState};
    WorkerState {
        job: t.job.clone(),
        worker: t.worker.clone(),
        map_version: t.map_version,
        step: t.step,
        trainer_seen: t.trainer_seen,
        trainer_idle_ms: t.trainer_idle_ms,
        checkpoints: t
            .checkpoints
            .iter()
            .map(|c| Reported { map_version: c.map_version, step: c.step, location: c.location.clone(), r#final: c.r#final })
            .collect(),
        draining: t.draining,
        ready_to_stop: t.ready_to_stop,
        host: t.host.clone(),
        age_ms,
    }
}

/// The gRPC side: one task per report stream.
pub struct ReportService {
    tracker: Arc<Tracker>,
}

type AckStream = Pin<Box<dyn Stream<Item = Result<v1::ReportAck, Status>> + Send>>;

#[tonic::async_trait]
impl SidecarReports for ReportService {
    type ReportStream = AckStream;

    async fn report(&self, request: Request<Streaming<v1::SidecarReport>>) -> Result<Response<AckStream>, Status> {
        let tracker = self.tracker.clone();
        let mut inbound = request.into_inner();
        let out = async_stream(move |tx| async move {
            let mut node_id: Option<String> = None;
            while let Some(msg) = inbound.next().await {
                let Ok(report) = msg else { break };
                if report.node_id.is_empty() {
                    let _ = tx.send(Err(Status::invalid_argument("node_id: empty"))).await;
                    break;
                }
                if node_id.is_none() {
                    tracker.stream_opened(&report.node_id);
                    node_id = Some(report.node_id.clone());
                }
                tracker.receive(&report);
                if tx.send(Ok(v1::ReportAck { seq: report.seq })).await.is_err() {
                    break;
                }
            }
            if let Some(id) = node_id {
                tracker.stream_closed(&id);
            }
        });
        Ok(Response::new(out))
    }
}

/// A response stream fed by a task (the task ends when the client goes away).
fn async_stream<F, Fut>(body: F) -> AckStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<v1::ReportAck, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(body(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

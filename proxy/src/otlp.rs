//! OpenTelemetry trace export over OTLP/gRPC (`telemetry.otlp`, see [`config::Otlp`]).
//!
//! Spans, all in the caller's W3C trace:
//! - one SERVER span per request this sidecar serves, named `{method} {route}`; its parent is
//!   the span id of the incoming `traceparent` (none for a new trace);
//! - one CLIENT span per upstream try (retries included), child of the server span. Its span id
//!   is the one sent upstream in `traceparent`, so the next sidecar's server span is its child;
//! - one CLIENT span per shadow copy (`weft.shadow=true`), likewise.
//!
//! Attributes follow the HTTP semantic conventions (`http.request.method`,
//! `http.response.status_code`, `url.path`, `server.address`, `network.peer.address`, ...) plus
//! `weft.service`, `weft.route`, `weft.experiment`, `weft.variant`, `weft.shadow`,
//! `weft.cluster`, `weft.model.name`, `weft.model.version`, `gen_ai.request.model`,
//! `weft.tenant`, `weft.run_id`, `weft.tls` (how the mesh hop was protected: `mtls`, `tls`,
//! `plaintext`) and `weft.peer.identity` (an inbound caller's SPIFFE ID). The resource carries
//! the node identity.
//!
//! Sampling is parent-based: a caller's sampled flag is followed; a new trace is sampled when
//! its trace id falls under `sample_ratio` (the TraceIdRatioBased rule), and the decision goes
//! upstream in the flags so every sidecar on the path agrees.
//!
//! The exporter can never hurt traffic. The request path builds a small record and
//! `try_send`s it on a bounded queue (no await, no lock); a full queue drops the span and counts
//! it (`weft_otlp_dropped_spans_total{reason="queue_full"}`; `reason="stopped"` for spans that
//! end after a reload replaced their exporter). A dedicated thread batches the queue into
//! `ExportTraceServiceRequest`s, each bounded by `timeout`; a failed export drops its batch
//! (counted, `reason="export_failed"`) and backs off, and the lazy gRPC channel reconnects on
//! the next try. Spans the collector took are counted in `weft_otlp_exported_spans_total`.
//!
//! Why not the OpenTelemetry SDK's `BatchSpanProcessor` + `opentelemetry-otlp`: its drop count
//! is private (logged once at shutdown), and the span ids here must be exactly the ones the
//! proxy already writes into `traceparent`; records built straight into the OTLP protobuf types
//! (`opentelemetry-proto`) give both, with fewer crates.

use http::{HeaderName, Method, Version};
use metrics::{Counter, Label};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};

use crate::config;
use crate::telemetry::{self, Labels, Telemetry};

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Check `telemetry.otlp`; errors name the field.
pub fn validate(o: &config::Otlp) -> Result<(), String> {
    let f = "telemetry.otlp";
    let uri: http::Uri =
        o.endpoint.parse().map_err(|e| format!("{f}.endpoint: {:?} is not a URL: {e}", o.endpoint))?;
    match uri.scheme_str() {
        Some("http") if uri.host().is_some_and(|h| !h.is_empty()) => {}
        Some("https") => {
            return Err(format!(
                "{f}.endpoint: {:?}: https is not supported (no TLS in this build); send to a local collector over http://",
                o.endpoint
            ));
        }
        _ => return Err(format!("{f}.endpoint: {:?} needs http:// and a host, e.g. \"http://127.0.0.1:4317\"", o.endpoint)),
    }
    if !(0.0..=1.0).contains(&o.sample_ratio) {
        return Err(format!("{f}.sample_ratio: {} is not in [0, 1]", o.sample_ratio));
    }
    if !(1..=1 << 20).contains(&o.queue) {
        return Err(format!("{f}.queue: {} is not in 1..=1048576", o.queue));
    }
    if !(1..=1 << 16).contains(&o.batch) {
        return Err(format!("{f}.batch: {} is not in 1..=65536", o.batch));
    }
    if o.flush_interval.is_zero() {
        return Err(format!("{f}.flush_interval: must be above 0"));
    }
    if o.timeout.is_zero() {
        return Err(format!("{f}.timeout: must be above 0"));
    }
    if !o.metrics_interval.is_zero() && o.metrics_interval.0 < Duration::from_millis(50) {
        return Err(format!("{f}.metrics_interval: {:?} is below 50ms (0 turns metrics off)", o.metrics_interval.0));
    }
    metadata(&o.headers)?;
    if o.resource.keys().any(|k| k.is_empty()) {
        return Err(format!("{f}.resource: attribute names must not be empty"));
    }
    Ok(())
}

fn metadata(headers: &std::collections::BTreeMap<String, String>) -> Result<MetadataMap, String> {
    let mut md = MetadataMap::new();
    for (k, v) in headers {
        let key: AsciiMetadataKey =
            k.parse().map_err(|_| format!("telemetry.otlp.headers: {k:?} is not a valid header name"))?;
        let val: AsciiMetadataValue =
            v.parse().map_err(|_| format!("telemetry.otlp.headers.{k}: the value is not a valid header value"))?;
        md.insert(key, val);
    }
    Ok(md)
}

/// An attribute value kept on the request path without formatting.
enum Val {
    Shared(Arc<str>),
    Owned(String),
    Static(&'static str),
    Int(i64),
    F64(f64),
    Bool(bool),
}

impl Val {
    fn into_any(self) -> AnyValue {
        let v = match self {
            Val::Shared(s) => any_value::Value::StringValue(s.to_string()),
            Val::Owned(s) => any_value::Value::StringValue(s),
            Val::Static(s) => any_value::Value::StringValue(s.to_string()),
            Val::Int(i) => any_value::Value::IntValue(i),
            Val::F64(f) => any_value::Value::DoubleValue(f),
            Val::Bool(b) => any_value::Value::BoolValue(b),
        };
        AnyValue { value: Some(v) }
    }
}

type Attrs = Vec<(&'static str, Val)>;

/// One finished span as queued; turned into protobuf on the exporter thread.
struct SpanRec {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// All zero: a root span.
    parent: [u8; 8],
    parent_remote: bool,
    flags: u8,
    kind: span::SpanKind,
    name: String,
    start_ns: u64,
    end_ns: u64,
    /// `Some`: status ERROR with this message.
    error: Option<String>,
    attrs: Attrs,
}

impl SpanRec {
    fn into_proto(self) -> Span {
        let kind = self.kind;
        let has_parent = self.parent != [0; 8];
        // Low byte: W3C trace flags; bit 8: "is_remote is known"; bit 9: the parent is remote.
        let flags = self.flags as u32 | 0x100 | if self.parent_remote { 0x200 } else { 0 };
        Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            parent_span_id: if has_parent { self.parent.to_vec() } else { Vec::new() },
            flags,
            name: self.name,
            kind: kind as i32,
            start_time_unix_nano: self.start_ns,
            end_time_unix_nano: self.end_ns.max(self.start_ns),
            attributes: self
                .attrs
                .into_iter()
                .map(|(k, v)| KeyValue { key: k.to_string(), value: Some(v.into_any()), ..Default::default() })
                .collect(),
            status: Some(match self.error {
                Some(message) => Status { code: status::StatusCode::Error as i32, message },
                None => Status { code: status::StatusCode::Unset as i32, message: String::new() },
            }),
            ..Default::default()
        }
    }
}

/// A span recorded outside a sidecar's request path, e.g. by the control plane (an API write,
/// its Raft commit, each sidecar's push and ACK): ids chosen by the caller, attributes as
/// strings. Exported by [`Telemetry::export_span`] through the same bounded queue.
#[derive(Debug, Clone)]
pub struct Custom {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// All zero: a root span.
    pub parent: [u8; 8],
    /// The parent came from another process (a `traceparent` header).
    pub parent_remote: bool,
    pub kind: CustomKind,
    pub name: String,
    pub start: SystemTime,
    pub end: SystemTime,
    /// `Some`: status ERROR with this message.
    pub error: Option<String>,
    pub attrs: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CustomKind {
    Server,
    Client,
    Internal,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

impl Custom {
    fn into_rec(self) -> SpanRec {
        SpanRec {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: self.parent_remote,
            flags: 1,
            kind: match self.kind {
                CustomKind::Server => span::SpanKind::Server,
                CustomKind::Client => span::SpanKind::Client,
                CustomKind::Internal => span::SpanKind::Internal,
            },
            name: self.name,
            start_ns: unix_ns(self.start),
            end_ns: unix_ns(self.end),
            error: self.error,
            attrs: self.attrs.into_iter().map(|(k, v)| (k, Val::Owned(v))).collect(),
        }
    }
}

/// A fresh span id (never zero).
pub fn span_id() -> [u8; 8] {
    new_span_id()
}

/// A fresh trace id (never zero).
pub fn trace_id() -> [u8; 16] {
    rand::random::<u128>().max(1).to_be_bytes()
}

/// A `traceparent` header value → (trace id, parent span id, sampled); `None` if malformed.
pub fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], bool)> {
    let (trace, flags) = telemetry::parse_traceparent(v)?;
    Some((unhex(trace), unhex(&v[36..52]), unhex::<1>(flags)[0] & 1 == 1))
}

impl Telemetry {
    /// Queues `s` for export; false when export is off or `s`'s new trace is not sampled
    /// (spans with a parent are the caller's decision).
    pub fn export_span(&self, s: Custom) -> bool {
        let Some(e) = self.otlp() else { return false };
        if s.parent == [0; 8] && !e.sample_new(&s.trace_id) {
            return false;
        }
        e.enqueue(s.into_rec());
        true
    }

    /// Whether spans would be exported at all.
    pub fn exporting(&self) -> bool {
        self.otlp().is_some()
    }
}

/// What the exporter thread counts.
struct Counters {
    exported: Counter,
    failed: Counter,
    rejected: Counter,
}

/// A running exporter: the queue's sending side and the thread draining it. Replaced as a whole
/// when a reload changes `telemetry.otlp`.
pub struct Exporter {
    pub(crate) cfg: config::Otlp,
    tx: mpsc::Sender<SpanRec>,
    /// `None`: sample every new trace; otherwise the TraceIdRatioBased bound.
    threshold: Option<u64>,
    run_id: Option<Arc<str>>,
    dropped_full: Counter,
    /// Spans of requests that outlived a replaced (reloaded) exporter.
    dropped_stopped: Counter,
    stop: watch::Sender<bool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Exporter {
    /// Validate `cfg` and start the exporter thread. Nothing connects yet: the gRPC channel
    /// dials on the first export, so a collector that is down costs nothing here.
    pub(crate) fn start(cfg: &config::Otlp, node: &config::Node, t: &Telemetry) -> Result<Arc<Exporter>, String> {
        validate(cfg)?;
        let md = metadata(&cfg.headers)?;
        let (tx, rx) = mpsc::channel(cfg.queue);
        let (stop, stop_rx) = watch::channel(false);
        let dropped = |reason: &'static str| t.counter("weft_otlp_dropped_spans_total", vec![Label::new("reason", reason)]);
        let counters = Counters {
            exported: t.counter("weft_otlp_exported_spans_total", vec![]),
            failed: dropped("export_failed"),
            rejected: dropped("rejected"),
        };
        let resource = resource(cfg, node);
        let run_cfg = cfg.clone();
        let exports = |result: &'static str| t.counter("weft_otlp_metric_exports_total", vec![Label::new("result", result)]);
        let metrics = cfg.metrics_interval.non_zero().map(|interval| crate::otlp_metrics::MetricsJob {
            exposition: t.exposition(),
            interval,
            ok: exports("ok"),
            failed: exports("failed"),
        });
        let thread = std::thread::Builder::new()
            .name("weft-otlp".into())
            .spawn(move || run(run_cfg, md, resource, rx, stop_rx, counters, metrics))
            .map_err(|e| format!("telemetry.otlp: cannot start the exporter thread: {e}"))?;
        let threshold = (cfg.sample_ratio < 1.0).then_some((cfg.sample_ratio * (1u64 << 63) as f64) as u64);
        Ok(Arc::new(Exporter {
            cfg: cfg.clone(),
            tx,
            threshold,
            run_id: (!node.run_id.is_empty()).then(|| Arc::from(node.run_id.as_str())),
            dropped_full: dropped("queue_full"),
            dropped_stopped: dropped("stopped"),
            stop,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Never waits: a full queue drops the span (counted).
    fn enqueue(&self, s: SpanRec) {
        match self.tx.try_send(s) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped_full.increment(1),
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped_stopped.increment(1),
        }
    }

    /// TraceIdRatioBased: the low 63 bits of the trace id's second half under ratio × 2^63.
    fn sample_new(&self, trace_id: &[u8; 16]) -> bool {
        match self.threshold {
            None => true,
            Some(t) => {
                let low = u64::from_be_bytes(trace_id[8..16].try_into().expect("8 bytes")) & (u64::MAX >> 1);
                low < t
            }
        }
    }

    /// Send what is queued (bounded by the export timeout) and end the thread. Does not wait.
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// [`stop`](Self::stop), then wait for the thread, at most `grace`.
    pub(crate) fn stop_and_wait(&self, grace: Duration) {
        self.stop();
        let Some(t) = self.thread.lock().unwrap().take() else { return };
        let deadline = Instant::now() + grace;
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }

    fn common(&self, attrs: &mut Attrs, l: &Labels, tenant: Option<&Arc<str>>) {
        let mut s = |k: &'static str, v: Option<&Arc<str>>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                attrs.push((k, Val::Shared(v.clone())));
            }
        };
        s("weft.service", l.service.get());
        s("weft.route", l.route.get());
        s("weft.experiment", l.experiment.get());
        s("weft.variant", l.variant.get());
        s("weft.cluster", l.cluster.get());
        s("weft.model.name", l.model_name.get());
        s("gen_ai.request.model", l.model_name.get());
        s("weft.model.version", l.model_version.get());
        s("weft.tenant", tenant.or(l.tenant_id.get()));
        s("weft.run_id", self.run_id.as_ref());
        s("weft.peer.identity", l.peer_identity.get());
        attrs.push(("weft.shadow", Val::Bool(l.shadow)));
        attrs.push(("weft.tls", Val::Static(if l.tls.is_empty() { "plaintext" } else { l.tls })));
    }
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.to_string(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.to_string())) }), ..Default::default() }
}

/// Resource attributes from the node identity, then `telemetry.otlp.resource` (which wins).
fn resource(cfg: &config::Otlp, node: &config::Node) -> Resource {
    let service = [cfg.service_name.as_str(), node.id.as_str()].into_iter().find(|s| !s.is_empty()).unwrap_or("weft-proxy");
    let mut attrs: Vec<(String, String)> = vec![("service.name".into(), service.into())];
    for (k, v) in [
        ("service.instance.id", &node.id),
        ("weft.node.id", &node.id),
        ("weft.team", &node.team),
        ("weft.project", &node.project),
        ("weft.run_id", &node.run_id),
        ("weft.job_type", &node.job_type),
    ] {
        if !v.is_empty() {
            attrs.push((k.into(), v.clone()));
        }
    }
    attrs.push(("telemetry.sdk.name".into(), "weft-proxy".into()));
    attrs.push(("telemetry.sdk.language".into(), "rust".into()));
    attrs.push(("telemetry.sdk.version".into(), env!("CARGO_PKG_VERSION").into()));
    for (k, v) in &cfg.resource {
        attrs.retain(|(a, _)| a != k);
        attrs.push((k.clone(), v.clone()));
    }
    Resource { attributes: attrs.iter().map(|(k, v)| kv(k, v)).collect(), ..Default::default() }
}

fn unix_ns_at(start: Instant) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    now.saturating_sub(start.elapsed()).as_nanos() as u64
}

fn end_ns(start_ns: u64, start: Instant) -> u64 {
    start_ns + start.elapsed().as_nanos() as u64
}

fn new_span_id() -> [u8; 8] {
    rand::random::<u64>().max(1).to_be_bytes()
}

fn unhex<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let nib = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = nib(s[2 * i]) << 4 | nib(s[2 * i + 1]);
    }
    out
}

fn host_port(authority: &str) -> (&str, Option<i64>) {
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && p.parse::<u16>().is_ok() => {
            (h.trim_start_matches('[').trim_end_matches(']'), p.parse().ok())
        }
        _ => (authority, None),
    }
}

fn push_endpoint(attrs: &mut Attrs, label: &str, peer: Option<SocketAddr>) {
    let (host, port) = host_port(label);
    if !host.is_empty() {
        attrs.push(("server.address", Val::Owned(host.to_string())));
    }
    if let Some(p) = port {
        attrs.push(("server.port", Val::Int(p)));
    }
    if let Some(a) = peer {
        attrs.push(("network.peer.address", Val::Owned(a.ip().to_string())));
        attrs.push(("network.peer.port", Val::Int(a.port() as i64)));
    }
}

/// How an upstream try or shadow copy ended: a status, or why there was none.
pub(crate) type Outcome = Result<u16, &'static str>;

fn outcome_attrs(attrs: &mut Attrs, o: Outcome) -> Option<String> {
    match o {
        Ok(status) => {
            attrs.push(("http.response.status_code", Val::Int(status as i64)));
            // Client spans: 4xx and 5xx are errors (semantic conventions).
            (status >= 400).then(|| {
                attrs.push(("error.type", Val::Owned(status.to_string())));
                format!("HTTP {status}")
            })
        }
        Err(kind) => {
            attrs.push(("error.type", Val::Static(kind)));
            Some(kind.to_string())
        }
    }
}

/// The trace of one sampled request: the server span, and the tries' spans as they end.
/// Boxed: requests that are not sampled (most) carry an `Option<ReqSpan>` through every
/// future of the request path, and a 456-byte inline span made each of those futures (and
/// their moves) that much larger.
pub struct ReqSpan(Box<SpanState>);

impl std::ops::Deref for ReqSpan {
    type Target = SpanState;
    fn deref(&self) -> &SpanState {
        &self.0
    }
}

impl std::ops::DerefMut for ReqSpan {
    fn deref_mut(&mut self) -> &mut SpanState {
        &mut self.0
    }
}

/// What a [`ReqSpan`] records.
pub struct SpanState {
    ex: Arc<Exporter>,
    trace_id: [u8; 16],
    parent: [u8; 8],
    span_id: [u8; 8],
    flags: u8,
    start_ns: u64,
    start: Instant,
    method: Method,
    path: String,
    authority: Option<String>,
    version: Version,
    tenant: Option<Arc<str>>,
    /// The request's labels as they were when forwarding began (for the tries' spans).
    labels: Option<Labels>,
    tries: u32,
    /// The try whose response went downstream, and the response status.
    last: Option<Attempt>,
    status: u16,
    /// Time to the response's first byte and its token usage, once the body ended.
    stream: (Option<Duration>, Option<crate::usage::Tokens>),
}

/// Decide whether this request is traced, and make `tp` (the `traceparent` to send upstream,
/// from [`telemetry::traceparent`]) carry the decision. `None` when export is off or the
/// request is not sampled: then nothing else here runs for it.
pub(crate) fn start(t: &Telemetry, req: &http::request::Parts, headers: &crate::headers::ReqHeaders, tp: &mut [u8; 55], start: Instant) -> Option<ReqSpan> {
    let ex = t.otlp()?;
    let incoming = headers.get(&TRACEPARENT).filter(|v| telemetry::parse_traceparent(v).is_some());
    let trace_id: [u8; 16] = unhex(&tp[3..35]);
    let (parent, flags) = match incoming {
        // Continue the caller's trace, following its sampling decision.
        Some(v) => (unhex::<8>(&v[36..52]), unhex::<1>(&v[53..55])[0]),
        None => {
            let flags = u8::from(ex.sample_new(&trace_id));
            telemetry::hex_into(&mut tp[53..55], flags as u128);
            ([0; 8], flags)
        }
    };
    if flags & 1 == 0 {
        return None;
    }
    let authority = req.uri.authority().map(|a| a.as_str().to_string()).or_else(|| headers.get_str(&http::header::HOST).map(str::to_string));
    Some(ReqSpan(Box::new(SpanState {
        trace_id,
        parent,
        span_id: new_span_id(),
        flags,
        start_ns: unix_ns_at(start),
        start,
        method: req.method.clone(),
        path: req.uri.path().to_string(),
        authority,
        version: req.version,
        tenant: None,
        labels: None,
        tries: 0,
        last: None,
        status: 0,
        stream: (None, None),
        ex,
    })))
}

/// One upstream try, from before its connection to its end.
pub struct Attempt {
    span_id: [u8; 8],
    start_ns: u64,
    start: Instant,
    endpoint: Arc<str>,
    peer: SocketAddr,
    resend: u32,
}

/// A `traceparent` value (W3C, version 00) for `span_id` in trace `trace_id`.
fn write_traceparent(tp: &mut [u8; 55], trace_id: &[u8; 16], span_id: &[u8; 8], flags: u8) {
    *tp = *b"00-00000000000000000000000000000000-0000000000000000-00";
    telemetry::hex_into(&mut tp[3..35], u128::from_be_bytes(*trace_id));
    telemetry::hex_into(&mut tp[36..52], u64::from_be_bytes(*span_id) as u128);
    telemetry::hex_into(&mut tp[53..55], flags as u128);
}

impl ReqSpan {
    /// The raw tenant header (metrics cap its cardinality; a trace need not).
    pub(crate) fn set_tenant(&mut self, tenant: Option<&str>) {
        self.tenant = tenant.map(Arc::from);
    }

    /// Forwarding begins: remember the labels for the tries' spans.
    pub(crate) fn forwarding(mut self, labels: &Labels) -> ReqSpan {
        self.labels = Some(labels.clone());
        self
    }

    /// A try starts: its own span id goes upstream in `traceparent` (`tp`, the value sent).
    pub(crate) fn attempt(&mut self, tp: &mut [u8; 55], endpoint: &Arc<str>, peer: SocketAddr) -> Attempt {
        let span_id = new_span_id();
        write_traceparent(tp, &self.trace_id, &span_id, self.flags);
        let start = Instant::now();
        self.tries += 1;
        Attempt { span_id, start_ns: unix_ns_at(start), start, endpoint: endpoint.clone(), peer, resend: self.tries - 1 }
    }

    /// A try ended without its response going downstream (failed, or retried).
    pub(crate) fn end_attempt(&self, a: Option<Attempt>, outcome: Outcome) {
        if let Some(a) = a {
            self.emit_attempt(a, outcome, None);
        }
    }

    fn emit_attempt(&self, a: Attempt, outcome: Outcome, body_error: Option<&'static str>) {
        let mut attrs: Attrs = Vec::with_capacity(24);
        attrs.push(("http.request.method", Val::Owned(self.method.as_str().to_string())));
        attrs.push(("url.path", Val::Owned(self.path.clone())));
        push_endpoint(&mut attrs, &a.endpoint, Some(a.peer));
        if a.resend > 0 {
            attrs.push(("http.request.resend_count", Val::Int(a.resend as i64)));
        }
        if let Some(l) = &self.labels {
            self.ex.common(&mut attrs, l, self.tenant.as_ref());
        }
        let mut error = outcome_attrs(&mut attrs, outcome);
        if let Some(e) = body_error {
            attrs.push(("weft.body_end", Val::Static(e)));
            if e == "error" && error.is_none() {
                error = Some("response body failed".into());
            }
        }
        let cluster = self.labels.as_ref().map_or("", |l| &l.cluster);
        self.ex.enqueue(SpanRec {
            trace_id: self.trace_id,
            span_id: a.span_id,
            parent: self.span_id,
            parent_remote: false,
            flags: self.flags,
            kind: span::SpanKind::Client,
            name: format!("{} {cluster}", self.method),
            start_ns: a.start_ns,
            end_ns: end_ns(a.start_ns, a.start),
            error,
            attrs,
        });
    }

    /// The response of try `a` goes downstream; its span ends with the body.
    pub(crate) fn responded(mut self, a: Option<Attempt>, status: u16) -> ReqSpan {
        self.last = a;
        self.status = status;
        self
    }

    /// The response body went downstream to its end (or not: `end` says), its first byte
    /// `ttfb` after the request arrived, reporting `tokens` of usage.
    pub(crate) fn ended(mut self, labels: &Labels, end: crate::body::End, ttfb: Option<Duration>, tokens: Option<crate::usage::Tokens>) {
        let status = self.status;
        self.stream = (ttfb, tokens);
        self.finish(labels, status, Some(end), None);
    }

    /// A span for a shadow copy of this request.
    pub(crate) fn child(&self) -> ChildSpan {
        let start = Instant::now();
        ChildSpan {
            ex: self.ex.clone(),
            trace_id: self.trace_id,
            parent: self.span_id,
            span_id: new_span_id(),
            flags: self.flags,
            start_ns: unix_ns_at(start),
            start,
            method: self.method.clone(),
            path: self.path.clone(),
            tenant: self.tenant.clone(),
        }
    }

    /// The response body ended (`body_end`), or the proxy answered itself (`None`, with the
    /// `x-weft-error` kind in `local_error`): end the last try's span and the server span.
    pub(crate) fn finish(mut self, labels: &Labels, status: u16, body_end: Option<crate::body::End>, local_error: Option<&str>) {
        use crate::body::End;
        let body = body_end.map(|e| match e {
            End::Complete => "complete",
            End::Error => "error",
            End::Cancelled => "cancelled",
        });
        if let Some(a) = self.last.take() {
            self.emit_attempt(a, Ok(status), body);
        }
        let mut attrs: Attrs = Vec::with_capacity(24);
        attrs.push(("http.request.method", Val::Owned(self.method.as_str().to_string())));
        attrs.push(("url.path", Val::Owned(std::mem::take(&mut self.path))));
        attrs.push(("url.scheme", Val::Static("http")));
        if let Some(a) = &self.authority {
            push_endpoint(&mut attrs, a, None);
        }
        attrs.push(("network.protocol.version", Val::Static(match self.version {
            Version::HTTP_2 => "2",
            Version::HTTP_10 => "1.0",
            _ => "1.1",
        })));
        attrs.push(("http.response.status_code", Val::Int(status as i64)));
        if let Some(e) = labels.endpoint.get().filter(|e| !e.is_empty()) {
            attrs.push(("weft.endpoint", Val::Shared(e.clone())));
        }
        if self.tries > 1 {
            attrs.push(("weft.retries", Val::Int(self.tries as i64 - 1)));
        }
        self.ex.common(&mut attrs, labels, self.tenant.as_ref());
        if let Some(d) = self.stream.0 {
            attrs.push(("weft.time_to_first_byte_ms", Val::F64(d.as_secs_f64() * 1000.0)));
        }
        if let Some(t) = self.stream.1 {
            attrs.push(("gen_ai.usage.input_tokens", Val::Int(t.input as i64)));
            attrs.push(("gen_ai.usage.output_tokens", Val::Int(t.output as i64)));
        }
        // Server spans: only 5xx is an error (semantic conventions).
        let mut error = None;
        if let Some(kind) = local_error {
            attrs.push(("weft.error", Val::Owned(kind.to_string())));
        }
        if status >= 500 {
            attrs.push(("error.type", Val::Owned(local_error.map_or_else(|| status.to_string(), str::to_string))));
            error = Some(local_error.map_or_else(|| format!("HTTP {status}"), str::to_string));
        }
        if let Some(b) = body {
            attrs.push(("weft.body_end", Val::Static(b)));
            if b == "error" && error.is_none() {
                error = Some("response body failed".into());
            }
        }
        let name = if labels.route.is_empty() { self.method.to_string() } else { format!("{} {}", self.method, labels.route) };
        self.ex.enqueue(SpanRec {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: true,
            flags: self.flags,
            kind: span::SpanKind::Server,
            name,
            start_ns: self.start_ns,
            end_ns: end_ns(self.start_ns, self.start),
            error,
            attrs,
        });
    }
}

/// The CLIENT span of a shadow copy.
pub struct ChildSpan {
    ex: Arc<Exporter>,
    trace_id: [u8; 16],
    parent: [u8; 8],
    span_id: [u8; 8],
    flags: u8,
    start_ns: u64,
    start: Instant,
    method: Method,
    path: String,
    tenant: Option<Arc<str>>,
}

impl ChildSpan {
    /// Send this span's id upstream: written into `tp`, the copy's `traceparent`.
    pub(crate) fn set_traceparent(&self, tp: &mut [u8; 55]) {
        write_traceparent(tp, &self.trace_id, &self.span_id, self.flags);
    }

    /// The copy ended (`labels`: the shadow's, endpoint included when one was reached).
    pub(crate) fn finish(self, labels: &Labels, outcome: Outcome) {
        let mut attrs: Attrs = Vec::with_capacity(24);
        attrs.push(("http.request.method", Val::Owned(self.method.as_str().to_string())));
        attrs.push(("url.path", Val::Owned(self.path)));
        if !labels.endpoint.is_empty() {
            push_endpoint(&mut attrs, &labels.endpoint, None);
        }
        self.ex.common(&mut attrs, labels, self.tenant.as_ref());
        let error = outcome_attrs(&mut attrs, outcome);
        self.ex.enqueue(SpanRec {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            parent_remote: false,
            flags: self.flags,
            kind: span::SpanKind::Client,
            name: format!("{} {} (shadow)", self.method, labels.cluster),
            start_ns: self.start_ns,
            end_ns: end_ns(self.start_ns, self.start),
            error,
            attrs,
        });
    }
}

/// The exporter thread: its own small runtime, so export work never shares the data path's.
fn run(
    cfg: config::Otlp,
    md: MetadataMap,
    resource: Resource,
    mut rx: mpsc::Receiver<SpanRec>,
    mut stop: watch::Receiver<bool>,
    c: Counters,
    metrics: Option<crate::otlp_metrics::MetricsJob>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "OTLP exporter: no runtime; spans will be dropped");
            return;
        }
    };
    rt.block_on(async move {
        let Ok(endpoint) = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone()) else {
            tracing::error!(endpoint = %cfg.endpoint, "OTLP exporter: bad endpoint");
            return;
        };
        let timeout = cfg.timeout.0;
        let channel = endpoint.connect_timeout(timeout).timeout(timeout).connect_lazy();
        let scope = InstrumentationScope { name: "weft-proxy".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
        if let Some(job) = metrics {
            let m = crate::otlp_metrics::run(job, channel.clone(), md.clone(), resource.clone(), scope.clone(), timeout, stop.clone());
            tokio::spawn(m);
        }
        let mut ex = Export {
            client: TraceServiceClient::new(channel),
            md,
            resource,
            scope,
            timeout,
            c,
            healthy: true,
            endpoint: cfg.endpoint.clone(),
        };
        let batch = cfg.batch;
        let mut buf: Vec<SpanRec> = Vec::with_capacity(batch.min(4096));
        let mut failures = 0u32;
        loop {
            let closing = gather(&mut rx, &mut buf, batch, cfg.flush_interval.0, &mut stop).await;
            if closing {
                // Send what is queued now, within one timeout, then end.
                rx.close();
                while let Ok(s) = rx.try_recv() {
                    buf.push(s);
                }
                let deadline = tokio::time::Instant::now() + timeout;
                while !buf.is_empty() {
                    let chunk: Vec<SpanRec> = buf.drain(..buf.len().min(batch)).collect();
                    let n = chunk.len() as u64;
                    if tokio::time::Instant::now() >= deadline
                        || tokio::time::timeout_at(deadline, ex.send(chunk)).await.is_err()
                    {
                        ex.c.failed.increment(n);
                    }
                }
                return;
            }
            let chunk = std::mem::take(&mut buf);
            if ex.send(chunk).await {
                failures = 0;
                continue;
            }
            // Back off; meanwhile the queue fills and new spans are dropped at the door.
            failures = failures.saturating_add(1);
            let wait = Duration::from_millis((100u64 << failures.min(8)).min(10_000));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    });
}

/// Fill `buf` up to `batch` spans: wait for the first, then at most `flush` for the rest.
/// Returns true when the exporter should finish (stopped, or every sender gone).
async fn gather(
    rx: &mut mpsc::Receiver<SpanRec>,
    buf: &mut Vec<SpanRec>,
    batch: usize,
    flush: Duration,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        n = rx.recv_many(buf, batch) => if n == 0 { return true },
        _ = stop.wait_for(|s| *s) => return true,
    }
    let deadline = tokio::time::Instant::now() + flush;
    while buf.len() < batch {
        tokio::select! {
            n = rx.recv_many(buf, batch - buf.len()) => if n == 0 { return true },
            _ = tokio::time::sleep_until(deadline) => return false,
            _ = stop.wait_for(|s| *s) => return true,
        }
    }
    false
}

struct Export {
    client: TraceServiceClient<tonic::transport::Channel>,
    md: MetadataMap,
    resource: Resource,
    scope: InstrumentationScope,
    timeout: Duration,
    c: Counters,
    healthy: bool,
    endpoint: String,
}

impl Export {
    /// One export request; true when the collector took it.
    async fn send(&mut self, spans: Vec<SpanRec>) -> bool {
        if spans.is_empty() {
            return true;
        }
        let n = spans.len() as u64;
        let body = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans: spans.into_iter().map(SpanRec::into_proto).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let mut req = tonic::Request::new(body);
        *req.metadata_mut() = self.md.clone();
        req.set_timeout(self.timeout);
        let err = match tokio::time::timeout(self.timeout, self.client.export(req)).await {
            Ok(Ok(resp)) => {
                let rejected = resp.into_inner().partial_success.map_or(0, |p| p.rejected_spans.max(0) as u64).min(n);
                self.c.exported.increment(n - rejected);
                self.c.rejected.increment(rejected);
                if !self.healthy {
                    tracing::info!(endpoint = %self.endpoint, "OTLP export recovered");
                    self.healthy = true;
                }
                return true;
            }
            Ok(Err(status)) => status.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        self.c.failed.increment(n);
        if self.healthy {
            tracing::warn!(endpoint = %self.endpoint, error = %err, "OTLP export failed; spans are dropped (and counted) until it recovers");
            self.healthy = false;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otlp(f: impl FnOnce(&mut config::Otlp)) -> Result<(), String> {
        let mut o = config::Otlp::default();
        f(&mut o);
        validate(&o)
    }

    #[test]
    fn validation_names_the_field() {
        assert!(otlp(|_| {}).is_ok());
        let e = |f: fn(&mut config::Otlp)| otlp(f).unwrap_err();
        assert!(e(|o| o.endpoint = "127.0.0.1:4317".into()).starts_with("telemetry.otlp.endpoint:"));
        assert!(e(|o| o.endpoint = "https://c:4317".into()).contains("https"));
        assert!(e(|o| o.sample_ratio = 1.5).starts_with("telemetry.otlp.sample_ratio:"));
        assert!(e(|o| o.sample_ratio = f64::NAN).starts_with("telemetry.otlp.sample_ratio:"));
        assert!(e(|o| o.queue = 0).starts_with("telemetry.otlp.queue:"));
        assert!(e(|o| o.batch = 0).starts_with("telemetry.otlp.batch:"));
        assert!(e(|o| o.flush_interval = crate::duration::Dur::default()).starts_with("telemetry.otlp.flush_interval:"));
        assert!(e(|o| o.timeout = crate::duration::Dur::default()).starts_with("telemetry.otlp.timeout:"));
        assert!(e(|o| {
            o.headers.insert("bad header".into(), "v".into());
        })
        .starts_with("telemetry.otlp.headers:"));
        assert!(e(|o| {
            o.headers.insert("x-key".into(), "line\nbreak".into());
        })
        .starts_with("telemetry.otlp.headers.x-key:"));
    }

    #[test]
    fn yaml_section_parses_with_defaults() {
        let cfg = config::Config::from_yaml(
            "telemetry: {otlp: {endpoint: \"http://10.0.0.1:4317\", sample_ratio: 0.25, headers: {x-api-key: k}}}",
        )
        .unwrap();
        let o = cfg.telemetry.otlp.unwrap();
        assert_eq!((o.endpoint.as_str(), o.sample_ratio, o.queue, o.batch), ("http://10.0.0.1:4317", 0.25, 2048, 512));
        assert_eq!(o.headers["x-api-key"], "k");
        assert!(config::Config::from_yaml("telemetry: {otlp: {endpiont: x}}").is_err(), "unknown fields are errors");
        assert!(config::Config::from_yaml("{}").unwrap().telemetry.otlp.is_none(), "absent = off");
    }

    #[test]
    fn the_documented_example_is_valid() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/proxy.yaml")).unwrap();
        let block: String =
            text.lines().skip_while(|l| l.trim() != "# otlp:").map(|l| l.replacen("# ", "", 1) + "\n").collect();
        let cfg = config::Config::from_yaml(&format!("telemetry:\n{block}")).unwrap();
        let o = cfg.telemetry.otlp.expect("examples/proxy.yaml documents telemetry.otlp");
        validate(&o).unwrap();
        assert_eq!(o, config::Otlp { headers: o.headers.clone(), resource: o.resource.clone(), ..Default::default() }, "it shows the defaults");
    }

    fn exporter(ratio: f64, queue: usize) -> (Telemetry, Arc<Exporter>) {
        let t = Telemetry::new(&config::Node { id: "n1".into(), run_id: "r7".into(), ..Default::default() });
        // A port nothing listens on: exports fail fast, nothing here waits on them.
        let cfg = config::Otlp { endpoint: "http://127.0.0.1:1".into(), sample_ratio: ratio, queue, ..Default::default() };
        let ex = Exporter::start(&cfg, &config::Node { id: "n1".into(), run_id: "r7".into(), ..Default::default() }, &t).unwrap();
        (t, ex)
    }

    #[test]
    fn ratio_sampling_follows_the_trace_id() {
        let (_t, ex) = exporter(0.25, 8);
        let n = 20_000;
        let hits = (0..n).filter(|_| ex.sample_new(&rand::random::<u128>().to_be_bytes())).count();
        assert!((4_000..6_000).contains(&hits), "25% of {n}: {hits}");
        let id = rand::random::<u128>().to_be_bytes();
        assert_eq!(ex.sample_new(&id), ex.sample_new(&id), "same trace, same decision");
        let (_t, all) = exporter(1.0, 8);
        assert!(all.sample_new(&[0xff; 16]));
        let (_t, none) = exporter(0.0, 8);
        assert!(!none.sample_new(&[0; 16]));
        ex.stop_and_wait(Duration::from_secs(5));
    }

    /// [`start`] for a request built in a test.
    fn start_for(t: &Telemetry, req: &http::Request<()>, tp: &mut [u8; 55]) -> Option<ReqSpan> {
        let (parts, ()) = http::Request::new(()).into_parts();
        start(t, &parts, &crate::headers::ReqHeaders::new(req.headers().clone(), None), tp, Instant::now())
    }

    #[test]
    fn traceparent_continues_the_callers_trace_and_sampling() {
        use http::HeaderValue;
        let (t, ex) = exporter(1.0, 8);
        t.set_otlp_for_test(ex.clone());
        let mut req = http::Request::new(());
        req.headers_mut().insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        let mut tp = telemetry::traceparent(req.headers().get("traceparent").map(|v| v.as_bytes()));
        let mut s = start_for(&t, &req, &mut tp).expect("the caller sampled it");
        assert_eq!(s.parent, unhex::<8>(b"00f067aa0ba902b7"));
        let a = s.attempt(&mut tp, &Arc::from("127.0.0.1:80"), "127.0.0.1:80".parse().unwrap());
        let sent = std::str::from_utf8(&tp).unwrap().to_string();
        let id: String = a.span_id.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sent, format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{id}-01"));
        // The caller said "not sampled": not traced, and the flag goes on unchanged.
        req.headers_mut().insert("traceparent", HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        let mut tp = telemetry::traceparent(req.headers().get("traceparent").map(|v| v.as_bytes()));
        assert!(start_for(&t, &req, &mut tp).is_none());
        assert!(tp.ends_with(b"-00"));
        // A new trace under ratio 0: not sampled, and says so upstream.
        let (t0, ex0) = exporter(0.0, 8);
        t0.set_otlp_for_test(ex0);
        let req = http::Request::new(());
        let mut tp = telemetry::traceparent(None);
        assert!(start_for(&t0, &req, &mut tp).is_none());
        assert!(tp.ends_with(b"-00"), "{}", String::from_utf8_lossy(&tp));
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (t, ex) = exporter(1.0, 2);
        let rec = || SpanRec {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: [0; 8],
            parent_remote: false,
            flags: 1,
            kind: span::SpanKind::Server,
            name: "GET".into(),
            start_ns: 1,
            end_ns: 2,
            error: None,
            attrs: vec![],
        };
        for _ in 0..1000 {
            ex.enqueue(rec());
        }
        ex.stop_and_wait(Duration::from_secs(10));
        let m = t.render();
        let dropped: f64 = m
            .lines()
            .filter(|l| l.starts_with("weft_otlp_dropped_spans_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(dropped, 1000.0, "every span is either exported or counted as dropped: {m}");
    }
}

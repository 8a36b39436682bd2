//! Telemetry: Prometheus metrics labelled by variant, model and tenant; the tenant cardinality
//! limit; the sampled JSON access log; W3C `traceparent` propagation; the OTLP trace exporter
//! (see `otlp`), started, replaced or stopped here as the telemetry config says.
//!
//! Each proxy instance owns its own Prometheus recorder (not the process-global one), so
//! several proxies in one process (tests) keep separate `/metrics`. Handles are registered
//! once per label set and cached, so the hot path does one hash lookup and a few atomic adds.

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config;
use crate::sketch::LogSketch;

const META: Metadata<'static> = Metadata::new("weft", metrics::Level::INFO, None);

/// Latency buckets in seconds: sub-ms proxy hops up to multi-minute LLM streams.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// The labels of one request's series. Strings are shared with the config snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    pub service: Arc<str>,
    pub route: Arc<str>,
    pub experiment: Arc<str>,
    pub variant: Arc<str>,
    pub cluster: Arc<str>,
    pub endpoint: Arc<str>,
    pub status_class: &'static str,
    pub model_name: Arc<str>,
    pub model_version: Arc<str>,
    pub tenant_id: Arc<str>,
    pub shadow: bool,
}

impl Labels {
    fn to_metric_labels(&self) -> Vec<Label> {
        vec![
            Label::new("service", self.service.to_string()),
            Label::new("route", self.route.to_string()),
            Label::new("experiment", self.experiment.to_string()),
            Label::new("variant", self.variant.to_string()),
            Label::new("cluster", self.cluster.to_string()),
            Label::new("endpoint", self.endpoint.to_string()),
            Label::new("status_class", self.status_class),
            Label::new("model_name", self.model_name.to_string()),
            Label::new("model_version", self.model_version.to_string()),
            Label::new("tenant_id", self.tenant_id.to_string()),
            Label::new("shadow", if self.shadow { "true" } else { "false" }),
        ]
    }
}

pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Handles of one request series.
pub struct Series {
    pub requests: Counter,
    pub duration: Histogram,
    pub retries: Counter,
    /// Time to the response's first body byte, and the tokens responses reported.
    pub ttfb: Histogram,
    pub input_tokens: Counter,
    pub output_tokens: Counter,
    /// Readable copies of the request count and latency sum (`metrics` handles are
    /// write-only), summed per variant for the load reports sent to the control plane.
    count: AtomicU64,
    latency_us: AtomicU64,
    tokens_in: AtomicU64,
    tokens_out: AtomicU64,
    /// Latencies and times to first byte of an experiment variant's requests (none for other
    /// series): the load reports carry them so the control plane can judge the experiment.
    /// One lock for both: a request takes it once.
    sketches: Option<Mutex<Sketches>>,
}

#[derive(Default)]
struct Sketches {
    latency: LogSketch,
    ttfb: LogSketch,
}

/// Cumulative per-variant totals since start (non-shadow requests); the reporter sends the
/// differences between two readings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VariantTotals {
    pub requests: u64,
    pub errors: u64,
    pub latency_us: u64,
    pub latency: LogSketch,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Time to first byte, ms.
    pub ttfb: LogSketch,
}

/// A variant as the load reports name it: (experiment, variant).
pub type VariantKey = (String, String);

/// FxHash (rustc's hasher): a few cycles per word instead of SipHash's rounds. The series cache
/// is keyed by our own label values, so hash flooding is not a concern.
#[derive(Default)]
struct FxHasher(u64);
impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for b in chunks.remainder() {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The key is already a hash; don't hash it again.
#[derive(Default)]
struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) ^ *b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type SeriesMap = HashMap<u64, Vec<(Labels, Arc<Series>)>, BuildHasherDefault<IdHasher>>;

/// How many label sets each thread remembers in [`RECENT`].
const RECENT_MAX: usize = 16;

thread_local! {
    /// The series this thread looked up last: (telemetry id, labels, series), newest last.
    static RECENT: std::cell::RefCell<Vec<(u64, Labels, Arc<Series>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The same label strings, by identity. A request's labels are mostly the config snapshot's
/// own `Arc<str>`s, so comparing pointers finds a series without hashing ten strings and taking
/// the registry lock (≈500 instructions per request). Equal strings in different allocations
/// just miss and take the slow path.
fn same_strings(a: &Labels, b: &Labels) -> bool {
    Arc::ptr_eq(&a.service, &b.service)
        && Arc::ptr_eq(&a.route, &b.route)
        && Arc::ptr_eq(&a.experiment, &b.experiment)
        && Arc::ptr_eq(&a.variant, &b.variant)
        && Arc::ptr_eq(&a.cluster, &b.cluster)
        && Arc::ptr_eq(&a.endpoint, &b.endpoint)
        && Arc::ptr_eq(&a.model_name, &b.model_name)
        && Arc::ptr_eq(&a.model_version, &b.model_version)
        && Arc::ptr_eq(&a.tenant_id, &b.tenant_id)
        && a.status_class == b.status_class
        && a.shadow == b.shadow
}

/// Telemetry instances, told apart in the per-thread cache (tests run several proxies).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub struct Telemetry {
    /// This instance in [`RECENT`].
    id: u64,
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    series: Mutex<SeriesMap>,
    tenants: Mutex<HashSet<Arc<str>>>,
    tenant_limit: AtomicUsize,
    access_log: Mutex<Option<AccessLog>>,
    /// The OTLP exporter while `telemetry.otlp` is set; one atomic load per request when not.
    otlp: arc_swap::ArcSwapOption<crate::otlp::Exporter>,
    node: config::Node,
    pub other: Arc<str>,
    pub empty: Arc<str>,
}

struct AccessLog {
    sample: f64,
    out: Box<dyn Write + Send>,
}

impl Telemetry {
    pub fn new(node: &config::Node) -> Telemetry {
        let mut b = PrometheusBuilder::new()
            .set_buckets(BUCKETS)
            .expect("static bucket list is non-empty");
        for (k, v) in [
            ("node", &node.id),
            ("team", &node.team),
            ("project", &node.project),
            ("run_id", &node.run_id),
            ("job_type", &node.job_type),
        ] {
            b = b.add_global_label(k, v.clone());
        }
        let recorder = b.build_recorder();
        let handle = recorder.handle();
        let t = Telemetry {
            id: NEXT_ID.fetch_add(1, Relaxed),
            recorder,
            handle,
            series: Mutex::new(HashMap::default()),
            tenants: Mutex::new(HashSet::new()),
            tenant_limit: AtomicUsize::new(50),
            access_log: Mutex::new(None),
            otlp: arc_swap::ArcSwapOption::empty(),
            node: node.clone(),
            other: Arc::from("other"),
            empty: Arc::from(""),
        };
        t.describe();
        t
    }

    fn describe(&self) {
        let d = |name: &'static str, help: &'static str| {
            self.recorder.describe_counter(name.into(), None, help.into());
        };
        d("weft_requests_total", "Requests by service, route, variant, cluster, endpoint, status class, model, tenant; shadow copies labelled shadow=\"true\".");
        d("weft_request_duration_seconds", "Time from request received to response body end.");
        d("weft_retries_total", "Upstream retries (attempts after the first).");
        d("weft_time_to_first_byte_seconds", "Time from request received to the response's first body byte (the first token of a stream).");
        d("weft_tokens_total", "Tokens responses reported in their usage object, by direction (input, output).");
        d("weft_otlp_metric_exports_total", "OTLP metric exports of the registry, by result (ok, failed).");
        d("weft_requests_in_flight", "Upstream requests in flight per cluster.");
        d("weft_variant_requests_in_flight", "Requests in flight per experiment variant (response streams included).");
        d("weft_circuit_breaker_state", "Error-rate breaker state per cluster: 0 closed, 1 open, 2 half-open.");
        d("weft_circuit_breaker_transitions_total", "Breaker state changes per cluster and new state.");
        d("weft_overflow_total", "Requests refused by a cluster threshold (max_requests, max_pending, max_connections, max_retries, breaker_open).");
        d("weft_shed_total", "Requests shed by a variant's concurrency/pending limit.");
        d("weft_outlier_ejections_total", "Endpoints ejected by outlier detection.");
        d("weft_endpoint_ejected", "1 while an endpoint is ejected.");
        d("weft_shadow_skipped_total", "Shadow copies not sent, by reason.");
        d("weft_retry_budget_exhausted_total", "Retries refused by the retry budget.");
        d("weft_config_reloads_total", "Config reloads by result (ok, rejected).");
        d("weft_otlp_exported_spans_total", "Spans the OTLP collector accepted.");
        d("weft_otlp_dropped_spans_total", "Spans not exported, by reason: queue_full (dropped at enqueue, never waited for), export_failed (collector down or slow), rejected (by the collector), stopped (ended after a reload replaced the exporter).");
    }

    /// Apply the telemetry section of a new config (tenant limit, access log, OTLP export).
    pub fn configure(&self, t: &config::Telemetry) -> Result<(), String> {
        if let Some(o) = &t.otlp {
            crate::otlp::validate(o)?;
        }
        let log = if t.access_log.enabled {
            let out: Box<dyn Write + Send> = if t.access_log.path.is_empty() {
                Box::new(std::io::stdout())
            } else {
                Box::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&t.access_log.path)
                        .map_err(|e| format!("telemetry.access_log.path {:?}: {e}", t.access_log.path))?,
                )
            };
            Some(AccessLog { sample: t.access_log.sample, out })
        } else {
            None
        };
        // The exporter last: it is the other step that can fail, and nothing has changed yet.
        self.set_otlp(t.otlp.as_ref())?;
        *self.access_log.lock().unwrap() = log;
        // Already-admitted tenants keep their label when the limit shrinks: relabelling a live
        // series would break its counters.
        self.tenant_limit.store(t.tenant_top_n, Relaxed);
        Ok(())
    }

    /// Start, replace or stop the OTLP exporter. An unchanged section keeps the running one; a
    /// replaced one sends what it has queued and ends on its own (nothing here waits for it).
    fn set_otlp(&self, cfg: Option<&config::Otlp>) -> Result<(), String> {
        if self.otlp.load().as_ref().map(|e| &e.cfg) == cfg {
            return Ok(());
        }
        let next = cfg.map(|c| crate::otlp::Exporter::start(c, &self.node, self)).transpose()?;
        if let Some(old) = self.otlp.swap(next) {
            old.stop();
        }
        Ok(())
    }

    /// The running OTLP exporter, if any.
    pub(crate) fn otlp(&self) -> Option<Arc<crate::otlp::Exporter>> {
        self.otlp.load_full()
    }

    #[cfg(test)]
    pub(crate) fn set_otlp_for_test(&self, ex: Arc<crate::otlp::Exporter>) {
        self.otlp.store(Some(ex));
    }

    /// Stop exporting: send the queued spans and end the exporter thread, waiting at most the
    /// export timeout (plus a second). Call after the proxy drained, so the last requests'
    /// spans go out too.
    pub fn shutdown_otlp(&self) {
        if let Some(ex) = self.otlp.swap(None) {
            ex.stop_and_wait(ex.cfg.timeout.0 + Duration::from_secs(1));
        }
    }

    /// The tenant label for a header value: the first `tenant_top_n` distinct values get their
    /// own label, every later one is `other`, so a client cannot blow up series cardinality.
    pub fn tenant_label(&self, value: Option<&str>) -> Arc<str> {
        let Some(v) = value.filter(|v| !v.is_empty()) else { return self.empty.clone() };
        let mut set = self.tenants.lock().unwrap();
        if let Some(found) = set.get(v) {
            return found.clone();
        }
        if set.len() < self.tenant_limit.load(Relaxed) {
            let a: Arc<str> = Arc::from(v);
            set.insert(a.clone());
            return a;
        }
        self.other.clone()
    }

    /// Handles for a label set, registered on first use.
    pub fn series(&self, labels: &Labels) -> Arc<Series> {
        let recent = RECENT.with(|r| {
            r.borrow().iter().rev().find(|(id, l, _)| *id == self.id && same_strings(l, labels)).map(|(_, _, s)| s.clone())
        });
        if let Some(s) = recent {
            return s;
        }
        let s = self.registered_series(labels);
        RECENT.with(|r| {
            let mut r = r.borrow_mut();
            if r.len() >= RECENT_MAX {
                r.remove(0);
            }
            r.push((self.id, labels.clone(), s.clone()));
        });
        s
    }

    /// The registry's handles for a label set (by content), registered on first use.
    fn registered_series(&self, labels: &Labels) -> Arc<Series> {
        let mut h = FxHasher::default();
        std::hash::Hash::hash(labels, &mut h);
        let key = h.finish();
        let mut map = self.series.lock().unwrap();
        let bucket = map.entry(key).or_default();
        if let Some((_, s)) = bucket.iter().find(|(l, _)| l == labels) {
            return s.clone();
        }
        let ml = labels.to_metric_labels();
        let s = Arc::new(Series {
            requests: self.counter("weft_requests_total", ml.clone()),
            duration: self.histogram("weft_request_duration_seconds", ml.clone()),
            retries: self.counter("weft_retries_total", ml.clone()),
            ttfb: self.histogram("weft_time_to_first_byte_seconds", ml.clone()),
            input_tokens: self.counter("weft_tokens_total", with(&ml, "direction", "input")),
            output_tokens: self.counter("weft_tokens_total", with(&ml, "direction", "output")),
            count: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            tokens_in: AtomicU64::new(0),
            tokens_out: AtomicU64::new(0),
            sketches: (!labels.shadow && !labels.variant.is_empty()).then(|| Mutex::new(Sketches::default())),
        });
        bucket.push((labels.clone(), s.clone()));
        s
    }

    pub fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder.register_counter(&Key::from_parts(name, labels), &META)
    }
    pub fn gauge(&self, name: &'static str, labels: Vec<Label>) -> Gauge {
        self.recorder.register_gauge(&Key::from_parts(name, labels), &META)
    }
    pub fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.recorder.register_histogram(&Key::from_parts(name, labels), &META)
    }

    /// The registry's handle (the OTLP metrics export reads it too).
    pub(crate) fn prometheus_handle(&self) -> metrics_exporter_prometheus::PrometheusHandle {
        self.handle.clone()
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Drain histogram samples into their buckets; run periodically so an unscraped proxy
    /// does not accumulate raw samples.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Record a finished request (or shadow copy).
    pub fn finish(&self, labels: &Labels, duration: Duration, retries: u32) {
        self.finish_stream(labels, duration, retries, None, None);
    }

    /// [`finish`](Self::finish) for a proxied response body that ended: also its time to
    /// first byte and the tokens it reported (one series lookup for all of it).
    pub fn finish_stream(
        &self,
        labels: &Labels,
        duration: Duration,
        retries: u32,
        ttfb: Option<Duration>,
        tokens: Option<crate::usage::Tokens>,
    ) {
        let s = self.series(labels);
        if let Some(d) = ttfb {
            s.ttfb.record(d.as_secs_f64());
        }
        if let Some(t) = tokens {
            s.input_tokens.increment(t.input);
            s.output_tokens.increment(t.output);
            s.tokens_in.fetch_add(t.input, Ordering::Relaxed);
            s.tokens_out.fetch_add(t.output, Ordering::Relaxed);
        }
        s.requests.increment(1);
        s.duration.record(duration.as_secs_f64());
        s.count.fetch_add(1, Ordering::Relaxed);
        s.latency_us.fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
        if let Some(sk) = &s.sketches {
            let mut sk = sk.lock().unwrap();
            sk.latency.add(duration.as_secs_f64() * 1000.0);
            if let Some(d) = ttfb {
                sk.ttfb.add(d.as_secs_f64() * 1000.0);
            }
        }
        if retries > 0 {
            s.retries.increment(retries as u64);
        }
    }

    /// Per-variant totals over every series (5xx series count as errors; shadow copies and
    /// requests outside an experiment are left out).
    pub fn variant_totals(&self) -> std::collections::BTreeMap<VariantKey, VariantTotals> {
        let mut out: std::collections::BTreeMap<VariantKey, VariantTotals> = std::collections::BTreeMap::new();
        let map = self.series.lock().unwrap();
        for (labels, s) in map.values().flatten() {
            if labels.shadow || labels.variant.is_empty() {
                continue;
            }
            let t = out.entry((labels.experiment.to_string(), labels.variant.to_string())).or_default();
            let n = s.count.load(Ordering::Relaxed);
            t.requests += n;
            if labels.status_class == "5xx" {
                t.errors += n;
            }
            t.latency_us += s.latency_us.load(Ordering::Relaxed);
            if let Some(sk) = &s.sketches {
                let sk = sk.lock().unwrap();
                t.latency.merge(&sk.latency);
                t.ttfb.merge(&sk.ttfb);
            }
            t.input_tokens += s.tokens_in.load(Ordering::Relaxed);
            t.output_tokens += s.tokens_out.load(Ordering::Relaxed);
        }
        out
    }

    pub fn access_log_enabled(&self) -> bool {
        self.access_log.lock().unwrap().is_some()
    }

    /// Write one JSON access-log line if this request is sampled.
    pub fn access_log(&self, line: impl FnOnce() -> serde_json::Value) {
        let mut guard = self.access_log.lock().unwrap();
        let Some(log) = guard.as_mut() else { return };
        if log.sample < 1.0 && rand::random::<f64>() >= log.sample {
            return;
        }
        let mut text = line().to_string();
        text.push('\n');
        let _ = log.out.write_all(text.as_bytes());
        let _ = log.out.flush();
    }
}

/// `labels` plus one more.
fn with(labels: &[Label], k: &'static str, v: &'static str) -> Vec<Label> {
    let mut out = labels.to_vec();
    out.push(Label::new(k, v));
    out
}

/// W3C trace context: continue the caller's trace with a new span id, or start a trace.
/// Returns the `traceparent` value to send upstream (`00-<trace>-<span>-<flags>`), written
/// without `format!` since it runs on every request.
pub fn traceparent(incoming: Option<&[u8]>) -> [u8; 55] {
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-01";
    match incoming.and_then(parse_traceparent) {
        Some((trace, flags)) => {
            out[3..35].copy_from_slice(trace);
            out[53..55].copy_from_slice(flags);
        }
        None => hex_into(&mut out[3..35], rand::random::<u128>().max(1)),
    }
    hex_into(&mut out[36..52], rand::random::<u64>().max(1) as u128);
    out
}

/// The trace id inside a `traceparent` value produced by [`traceparent`].
pub fn trace_id(tp: &[u8; 55]) -> &str {
    std::str::from_utf8(&tp[3..35]).unwrap_or("")
}

/// Lowercase hex of the low `out.len() * 4` bits of `v`, most significant first. `out.len()`
/// must be even (whole bytes); written a byte (two digits) at a time, as it runs per request.
pub(crate) fn hex_into(out: &mut [u8], v: u128) {
    debug_assert!(out.len().is_multiple_of(2) && out.len() <= 32);
    let bytes = v.to_be_bytes();
    let skip = 16 - out.len() / 2;
    for (o, b) in out.chunks_exact_mut(2).zip(&bytes[skip..]) {
        o.copy_from_slice(&HEX_PAIRS[*b as usize]);
    }
}

/// The two lowercase hex digits of each byte value.
static HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// `00-<32 hex trace>-<16 hex parent>-<2 hex flags>` → (trace, flags); None if malformed.
pub(crate) fn parse_traceparent(v: &[u8]) -> Option<(&[u8], &[u8])> {
    if v.len() != 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let hex = |x: &[u8]| x.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let (ver, trace, parent, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    let nonzero = |x: &[u8]| x.iter().any(|b| *b != b'0');
    (hex(ver) && ver != b"ff" && hex(trace) && hex(parent) && hex(flags) && nonzero(trace) && nonzero(parent))
        .then_some((trace, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_into_writes_the_low_bytes_most_significant_first() {
        let mut b = [0u8; 32];
        hex_into(&mut b, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
        assert_eq!(&b, b"0123456789abcdeffedcba9876543210");
        let mut b = [0u8; 4];
        hex_into(&mut b, 0xabcd_00f1);
        assert_eq!(&b, b"00f1");
    }

    #[test]
    fn tenant_cardinality_is_capped() {
        let t = Telemetry::new(&config::Node::default());
        t.configure(&config::Telemetry { tenant_top_n: 2, ..Default::default() }).unwrap();
        assert_eq!(&*t.tenant_label(Some("a")), "a");
        assert_eq!(&*t.tenant_label(Some("b")), "b");
        assert_eq!(&*t.tenant_label(Some("c")), "other");
        assert_eq!(&*t.tenant_label(Some("a")), "a");
        assert_eq!(&*t.tenant_label(None), "");
    }

    #[test]
    fn traceparent_continues_or_starts() {
        let inc = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let out = traceparent(Some(inc));
        assert_eq!(trace_id(&out), "4bf92f3577b34da6a3ce929d0e0e4736");
        let out = std::str::from_utf8(&out).unwrap();
        assert!(out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(!out.contains("00f067aa0ba902b7"), "a new span id");
        let fresh = traceparent(Some(b"garbage"));
        assert!(parse_traceparent(&fresh).is_some(), "{}", std::str::from_utf8(&fresh).unwrap());
        assert_ne!(trace_id(&fresh), trace_id(&traceparent(None)), "new traces get new ids");
        assert!(parse_traceparent(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    }

    #[test]
    fn the_per_thread_cache_returns_the_registry_series() {
        let (t1, t2) = (Telemetry::new(&config::Node::default()), Telemetry::new(&config::Node::default()));
        let a = Labels { variant: Arc::from("a"), status_class: "2xx", ..Default::default() };
        // Equal strings in other allocations: a cache miss, but the same series by content.
        let a2 = Labels { variant: Arc::from("a"), status_class: "2xx", ..Default::default() };
        let s = t1.series(&a);
        assert!(Arc::ptr_eq(&s, &t1.series(&a)), "cached");
        assert!(Arc::ptr_eq(&s, &t1.series(&a2)), "content-equal labels share one series");
        assert!(!Arc::ptr_eq(&s, &t2.series(&a)), "another proxy's telemetry has its own series");
        let b = Labels { status_class: "5xx", ..a.clone() };
        assert!(!Arc::ptr_eq(&s, &t1.series(&b)), "a different status class is a different series");
        t1.finish(&a, Duration::from_millis(1), 0);
        t1.finish(&a2, Duration::from_millis(1), 0);
        let text = t1.render();
        let line = text.lines().find(|l| l.starts_with("weft_requests_total{") && l.contains("variant=\"a\"") && l.contains("2xx")).unwrap();
        assert!(line.ends_with(" 2"), "{line}");
    }

    #[test]
    fn series_render_with_identity_labels() {
        let node = config::Node { id: "n1".into(), team: "ml".into(), ..Default::default() };
        let t = Telemetry::new(&node);
        let l = Labels { variant: Arc::from("b"), status_class: "2xx", ..Default::default() };
        t.finish(&l, Duration::from_millis(3), 1);
        t.finish(&l, Duration::from_millis(3), 0);
        let text = t.render();
        let line = text.lines().find(|l| l.starts_with("weft_requests_total{")).unwrap();
        assert!(line.contains("variant=\"b\"") && line.contains("team=\"ml\"") && line.ends_with(" 2"), "{line}");
    }
}

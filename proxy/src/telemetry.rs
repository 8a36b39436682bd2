//! Telemetry: Prometheus metrics labelled by variant, model and tenant; the tenant cardinality
//! limit; the sampled JSON access log; W3C `traceparent` propagation; the OTLP trace exporter
//! (see `otlp`), started, replaced or stopped here as the telemetry config says.
//!
//! Each proxy instance owns its own Prometheus recorder (not the process-global one), so
//! several proxies in one process (tests) keep separate `/metrics`. The recorder holds the
//! long-lived metrics (clusters, breakers, reloads); the per-request series live in `series`,
//! which drops idle ones, and `/metrics` renders both.

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config;
pub use crate::series::{Series, VariantKey, VariantTotals};
use crate::series::{Live, LiveSet, SeriesStore};

const META: Metadata<'static> = Metadata::new("weft", metrics::Level::INFO, None);

/// The labels of one request's series. Strings are shared with the config snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    pub service: LabelValue,
    pub route: LabelValue,
    pub experiment: LabelValue,
    pub variant: LabelValue,
    pub cluster: LabelValue,
    pub endpoint: LabelValue,
    pub status_class: &'static str,
    pub model_name: LabelValue,
    pub model_version: LabelValue,
    pub tenant_id: LabelValue,
    pub shadow: bool,
    /// How the mesh hop was protected: on an inbound listener the downstream connection's
    /// (`mtls`, `tls`, empty = plaintext), on an outbound one the cluster's origination.
    pub tls: &'static str,
    /// The caller's SPIFFE ID, on an inbound listener over mTLS.
    pub peer_identity: LabelValue,
}

/// One label's value: a string shared with the config snapshot, or none (the empty value).
///
/// Why not an `Arc<str>` with one shared empty string: every request builds a label set from
/// empty, hands it to the end of its body and drops it, and each clone or drop of an `Arc` is
/// an atomic read-modify-write (tens of cycles, where an instruction count sees one). Counted
/// with callgrind, that was ≈ 50 of the ≈ 165 atomic operations of a proxied request. An empty
/// value here costs nothing to make, clone, take or drop. Equality and hashing go by content,
/// as they did for `Arc<str>`.
#[derive(Debug, Clone, Default)]
pub struct LabelValue(Option<Arc<str>>);

impl LabelValue {
    /// Whether both are the same shared string (or both empty): the per-thread series cache's
    /// test, cheaper than comparing content.
    pub fn same(&self, other: &LabelValue) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The shared string, if there is one.
    pub fn get(&self) -> Option<&Arc<str>> {
        self.0.as_ref()
    }
}

impl std::ops::Deref for LabelValue {
    type Target = str;
    fn deref(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl PartialEq for LabelValue {
    fn eq(&self, other: &LabelValue) -> bool {
        **self == **other
    }
}

impl Eq for LabelValue {}

impl std::hash::Hash for LabelValue {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (**self).hash(h);
    }
}

impl std::fmt::Display for LabelValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl From<Arc<str>> for LabelValue {
    fn from(s: Arc<str>) -> LabelValue {
        LabelValue(Some(s))
    }
}

impl From<&str> for LabelValue {
    fn from(s: &str) -> LabelValue {
        LabelValue((!s.is_empty()).then(|| Arc::from(s)))
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

pub struct Telemetry {
    recorder: PrometheusRecorder,
    exposition: Exposition,
    /// Request series idle this long are dropped (`telemetry.retain_idle`; 0 = never).
    retain_idle_ms: AtomicU64,
    tenants: Mutex<HashSet<Arc<str>>>,
    tenant_limit: AtomicUsize,
    access_log: Mutex<Option<AccessLog>>,
    /// Whether `access_log` holds a log: read on every request, which must not take the lock
    /// (two atomic read-modify-writes) only to learn that the log is off, as it is by default.
    access_log_on: std::sync::atomic::AtomicBool,
    /// The OTLP exporter while `telemetry.otlp` is set; one atomic load per request when not.
    otlp: arc_swap::ArcSwapOption<crate::otlp::Exporter>,
    node: config::Node,
    pub other: Arc<str>,
}

/// The metric families kept in the `metrics` registry, with their help text.
const REGISTRY_FAMILIES: &[(&str, &str)] = &[
    ("weft_otlp_metric_exports_total", "OTLP metric exports of the registry, by result (ok, failed)."),
    ("weft_shadow_skipped_total", "Shadow copies not sent, by reason."),
    ("weft_config_reloads_total", "Config reloads by result (ok, rejected)."),
    ("weft_authz_decisions_total", "Requests to inbound services that authorization policies apply to, by service, decision (allow, deny) and deciding policy."),
    ("weft_otlp_exported_spans_total", "Spans the OTLP collector accepted."),
    (
        "weft_otlp_dropped_spans_total",
        "Spans not exported, by reason: queue_full (dropped at enqueue, never waited for), export_failed (collector down or slow), rejected (by the collector), stopped (ended after a reload replaced the exporter).",
    ),
];

/// Every metric family a sidecar exports (histograms by their base name), for tools that check
/// what dashboards and alerting rules read.
pub fn exported_families() -> impl Iterator<Item = &'static str> {
    REGISTRY_FAMILIES
        .iter()
        .map(|(n, _)| *n)
        .chain(crate::series::SERIES_FAMILIES.iter().map(|(n, ..)| *n))
        .chain(crate::series::LIVE_FAMILIES.iter().map(|(n, ..)| *n))
}

/// The `/metrics` text: the registry's metrics, the request series, and the live objects'.
#[derive(Clone)]
pub(crate) struct Exposition {
    handle: PrometheusHandle,
    series: Arc<SeriesStore>,
    live: Arc<LiveSet>,
}

impl Exposition {
    pub(crate) fn render(&self) -> String {
        let mut out = self.handle.render();
        self.series.render(&mut out);
        self.live.render(self.series.global_labels(), &mut out);
        out
    }
}

struct AccessLog {
    sample: f64,
    out: Box<dyn Write + Send>,
}

impl Telemetry {
    pub fn new(node: &config::Node) -> Telemetry {
        let mut b = PrometheusBuilder::new()
            .set_buckets(crate::series::BUCKETS)
            .expect("static bucket list is non-empty");
        let global = [
            ("node", node.id.as_str()),
            ("team", &node.team),
            ("project", &node.project),
            ("run_id", &node.run_id),
            ("job_type", &node.job_type),
        ];
        for (k, v) in global {
            b = b.add_global_label(k, v);
        }
        let recorder = b.build_recorder();
        let exposition =
            Exposition { handle: recorder.handle(), series: Arc::new(SeriesStore::new(&global)), live: Arc::default() };
        let t = Telemetry {
            recorder,
            exposition,
            retain_idle_ms: AtomicU64::new(config::Telemetry::default().retain_idle.0.as_millis() as u64),
            tenants: Mutex::new(HashSet::new()),
            tenant_limit: AtomicUsize::new(50),
            access_log: Mutex::new(None),
            access_log_on: std::sync::atomic::AtomicBool::new(false),
            otlp: arc_swap::ArcSwapOption::empty(),
            node: node.clone(),
            other: Arc::from("other"),
        };
        t.describe();
        t
    }

    fn describe(&self) {
        for (name, help) in REGISTRY_FAMILIES {
            self.recorder.describe_counter((*name).into(), None, (*help).into());
        }
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
        {
            let mut guard = self.access_log.lock().unwrap();
            self.access_log_on.store(log.is_some(), Relaxed);
            *guard = log;
        }
        // Already-admitted tenants keep their label when the limit shrinks: relabelling a live
        // series would break its counters.
        self.tenant_limit.store(t.tenant_top_n, Relaxed);
        self.retain_idle_ms.store(t.retain_idle.0.as_millis() as u64, Relaxed);
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
    pub fn tenant_label(&self, value: Option<&str>) -> LabelValue {
        let Some(v) = value.filter(|v| !v.is_empty()) else { return LabelValue::default() };
        let mut set = self.tenants.lock().unwrap();
        if let Some(found) = set.get(v) {
            return found.clone().into();
        }
        if set.len() < self.tenant_limit.load(Relaxed) {
            let a: Arc<str> = Arc::from(v);
            set.insert(a.clone());
            return a.into();
        }
        self.other.clone().into()
    }

    /// Report `o`'s metrics at every scrape for as long as it lives (see [`Live`]).
    pub fn track(&self, o: std::sync::Weak<dyn Live>) {
        self.exposition.live.track(o);
    }

    /// The request series of a label set, created on first use.
    pub fn series(&self, labels: &Labels) -> Arc<Series> {
        self.exposition.series.get(labels)
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

    /// What `/metrics` serves (the OTLP metrics export reads it too).
    pub(crate) fn exposition(&self) -> Exposition {
        self.exposition.clone()
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        self.exposition.render()
    }

    /// Drain histogram samples into their buckets, so an unscraped proxy does not accumulate
    /// raw samples, and drop request series idle for `retain_idle`; run every second.
    pub fn upkeep(&self) {
        self.exposition.handle.run_upkeep();
        let dropped = self.exposition.series.sweep(crate::clock::now_ms(), self.retain_idle_ms.load(Relaxed));
        if dropped > 0 {
            tracing::debug!(dropped, "idle request series dropped");
        }
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
            s.ttfb.record(d);
        }
        if let Some(t) = tokens {
            s.tokens_in.fetch_add(t.input, Relaxed);
            s.tokens_out.fetch_add(t.output, Relaxed);
        }
        s.requests.fetch_add(1, Relaxed);
        s.duration.record(duration);
        s.latency_us.fetch_add(duration.as_micros() as u64, Relaxed);
        if let Some(sk) = &s.sketches {
            let mut sk = sk.lock().unwrap();
            sk.latency.add(duration.as_secs_f64() * 1000.0);
            if let Some(d) = ttfb {
                sk.ttfb.add(d.as_secs_f64() * 1000.0);
            }
        }
        if retries > 0 {
            s.retries.fetch_add(retries as u64, Relaxed);
        }
    }

    /// Per-variant totals since start (shadow copies and requests outside an experiment are
    /// left out; 5xx series count as errors), dropped idle series included.
    pub fn variant_totals(&self) -> std::collections::BTreeMap<VariantKey, VariantTotals> {
        self.exposition.series.variant_totals()
    }

    pub fn access_log_enabled(&self) -> bool {
        self.access_log_on.load(Relaxed)
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
        let a = Labels { variant: LabelValue::from("a"), status_class: "2xx", ..Default::default() };
        // Equal strings in other allocations: a cache miss, but the same series by content.
        let a2 = Labels { variant: LabelValue::from("a"), status_class: "2xx", ..Default::default() };
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
        let l = Labels { variant: LabelValue::from("b"), status_class: "2xx", ..Default::default() };
        t.finish(&l, Duration::from_millis(3), 1);
        t.finish(&l, Duration::from_millis(3), 0);
        let text = t.render();
        let line = text.lines().find(|l| l.starts_with("weft_requests_total{")).unwrap();
        assert!(line.contains("variant=\"b\"") && line.contains("team=\"ml\"") && line.ends_with(" 2"), "{line}");
    }
}

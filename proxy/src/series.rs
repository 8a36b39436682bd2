//! Request series: the per-request metrics — requests, the duration and time-to-first-byte
//! histograms, retries, tokens — one series per label set, kept in weft's own atomics and
//! rendered by weft next to the registry's metrics.
//!
//! Why not `metrics` handles: a series is labelled by endpoint, tenant and status class, and
//! endpoints come and go (autoscaling, restarts), so series must be dropped once idle, as
//! Linkerd's proxy does (`telemetry.retain_idle`). The `metrics` registry can only forget a key
//! by its own idle timer, and a handle still cached here would then write into storage nobody
//! renders. Owning the storage makes dropping a series one map removal, and a histogram record
//! two atomic adds instead of a sample pushed for the upkeep to drain.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sketch::LogSketch;
use crate::telemetry::Labels;

/// Latency buckets in seconds: sub-ms proxy hops up to multi-minute LLM streams.
pub const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// A fixed-bucket latency histogram: per-bucket counts (not cumulative; the last one past the
/// highest bound) and the sum. The count is the buckets' sum, so a scrape racing a record can
/// never show `+Inf` below a finite bucket.
pub struct Hist {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

impl Hist {
    pub fn record(&self, d: Duration) {
        let secs = d.as_secs_f64();
        // Prometheus buckets are `le`: a value equal to a bound belongs to that bound's bucket.
        self.buckets[BUCKETS.partition_point(|b| *b < secs)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }
}

/// One request series.
#[derive(Default)]
pub struct Series {
    pub(crate) requests: AtomicU64,
    /// Sum of request durations, µs (the load reports' mean latency).
    pub(crate) latency_us: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) tokens_in: AtomicU64,
    pub(crate) tokens_out: AtomicU64,
    pub(crate) duration: Hist,
    /// Time to the response's first body byte.
    pub(crate) ttfb: Hist,
    /// Latencies and times to first byte of an experiment variant's requests (none for other
    /// series): the load reports carry them so the control plane can judge the experiment.
    /// One lock for both: a request takes it once.
    pub(crate) sketches: Option<Mutex<Sketches>>,
}

#[derive(Default)]
pub(crate) struct Sketches {
    pub(crate) latency: LogSketch,
    pub(crate) ttfb: LogSketch,
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

impl VariantTotals {
    /// Adds one series' counts (5xx series count as errors).
    fn add(&mut self, labels: &Labels, s: &Series) {
        let n = s.requests.load(Relaxed);
        self.requests += n;
        if labels.status_class == "5xx" {
            self.errors += n;
        }
        self.latency_us += s.latency_us.load(Relaxed);
        if let Some(sk) = &s.sketches {
            let sk = sk.lock().unwrap();
            self.latency.merge(&sk.latency);
            self.ttfb.merge(&sk.ttfb);
        }
        self.input_tokens += s.tokens_in.load(Relaxed);
        self.output_tokens += s.tokens_out.load(Relaxed);
    }
}

/// A variant as the load reports name it: (experiment, variant).
pub type VariantKey = (String, String);

/// FxHash (rustc's hasher): a few cycles per word instead of SipHash's rounds. The series map
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

/// A series in the map, with what the idle sweep last saw of it.
struct Entry {
    labels: Labels,
    series: Arc<Series>,
    /// Request count at the last sweep that saw it change, and when (clock ms).
    seen: u64,
    seen_at_ms: u64,
}

type SeriesMap = HashMap<u64, Vec<Entry>, BuildHasherDefault<IdHasher>>;

/// How many label sets each thread remembers in [`RECENT`].
const RECENT_MAX: usize = 16;

/// A thread's remembered series: store id, store epoch, labels, series.
type Recent = (u64, u64, Labels, Arc<Series>);

thread_local! {
    /// The series this thread looked up last, newest last.
    static RECENT: std::cell::RefCell<Vec<Recent>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The same label strings, by identity. A request's labels are mostly the config snapshot's
/// own `Arc<str>`s, so comparing pointers finds a series without hashing ten strings and taking
/// the map lock (≈500 instructions per request). Equal strings in different allocations just
/// miss and take the slow path.
fn same_strings(a: &Labels, b: &Labels) -> bool {
    a.service.same(&b.service)
        && a.route.same(&b.route)
        && a.experiment.same(&b.experiment)
        && a.variant.same(&b.variant)
        && a.cluster.same(&b.cluster)
        && a.endpoint.same(&b.endpoint)
        && a.model_name.same(&b.model_name)
        && a.model_version.same(&b.model_version)
        && a.tenant_id.same(&b.tenant_id)
        && a.status_class == b.status_class
        && a.shadow == b.shadow
}

/// Stores told apart in the per-thread cache (tests run several proxies in one process).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Every request series of one proxy.
pub struct SeriesStore {
    /// This store in [`RECENT`].
    id: u64,
    /// Bumped when the sweep drops series, so no thread keeps handing out a dropped one.
    epoch: AtomicU64,
    map: Mutex<SeriesMap>,
    /// Totals of dropped series, so the load reports' cumulative totals never go back.
    retired: Mutex<BTreeMap<VariantKey, VariantTotals>>,
    /// The proxy's identity labels, rendered once: `node="n1",team="ml",...,`.
    global: String,
}

impl SeriesStore {
    /// `global`: the identity labels every series carries, in order.
    pub fn new(global: &[(&str, &str)]) -> SeriesStore {
        let mut g = label_pairs(global);
        if !g.is_empty() {
            g.push(',');
        }
        SeriesStore {
            id: NEXT_ID.fetch_add(1, Relaxed),
            epoch: AtomicU64::new(0),
            map: Mutex::new(HashMap::default()),
            retired: Mutex::new(BTreeMap::new()),
            global: g,
        }
    }

    /// The series of a label set, created on first use.
    pub fn get(&self, labels: &Labels) -> Arc<Series> {
        let epoch = self.epoch.load(Relaxed);
        let recent = RECENT.with(|r| {
            r.borrow()
                .iter()
                .rev()
                .find(|(id, e, l, _)| *id == self.id && *e == epoch && same_strings(l, labels))
                .map(|(.., s)| s.clone())
        });
        if let Some(s) = recent {
            return s;
        }
        let s = self.registered(labels);
        RECENT.with(|r| {
            let mut r = r.borrow_mut();
            r.retain(|(id, e, ..)| *id != self.id || *e == epoch);
            if r.len() >= RECENT_MAX {
                r.remove(0);
            }
            r.push((self.id, epoch, labels.clone(), s.clone()));
        });
        s
    }

    /// The map's series for a label set (by content), created on first use.
    fn registered(&self, labels: &Labels) -> Arc<Series> {
        let mut h = FxHasher::default();
        std::hash::Hash::hash(labels, &mut h);
        let mut map = self.map.lock().unwrap();
        let bucket = map.entry(h.finish()).or_default();
        if let Some(e) = bucket.iter().find(|e| e.labels == *labels) {
            return e.series.clone();
        }
        let series = Arc::new(Series {
            sketches: (!labels.shadow && !labels.variant.is_empty()).then(|| Mutex::new(Sketches::default())),
            ..Default::default()
        });
        bucket.push(Entry { labels: labels.clone(), series: series.clone(), seen: 0, seen_at_ms: crate::clock::now_ms() });
        series
    }

    /// Drops the series whose request count has not moved for `retain_ms` (0 = keep all);
    /// returns how many. A dropped series that sees traffic again starts from zero (a counter
    /// reset, which Prometheus' `rate` handles); its totals stay in the load reports'.
    pub fn sweep(&self, now_ms: u64, retain_ms: u64) -> usize {
        let mut dropped = Vec::new();
        {
            let mut map = self.map.lock().unwrap();
            map.retain(|_, bucket| {
                bucket.retain_mut(|e| {
                    let n = e.series.requests.load(Relaxed);
                    if n != e.seen {
                        (e.seen, e.seen_at_ms) = (n, now_ms);
                    }
                    let keep = retain_ms == 0 || now_ms.saturating_sub(e.seen_at_ms) < retain_ms;
                    if !keep {
                        dropped.push((e.labels.clone(), e.series.clone()));
                    }
                    keep
                });
                !bucket.is_empty()
            });
            if !dropped.is_empty() {
                // Inside the map lock: a lookup after this sees the new epoch and the map without them.
                self.epoch.fetch_add(1, Relaxed);
            }
            // Also inside it (lock order: map, then retired, as in `variant_totals`): a reader
            // sees a dropped series either in the map or in `retired`, never in neither, or a
            // report would dip and the next one spike.
            let mut retired = self.retired.lock().unwrap();
            for (labels, s) in &dropped {
                if !labels.shadow && !labels.variant.is_empty() {
                    retired.entry((labels.experiment.to_string(), labels.variant.to_string())).or_default().add(labels, s);
                }
            }
        }
        dropped.len()
    }

    /// How many series are kept.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.map.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Per-variant totals since start (shadow copies and requests outside an experiment are
    /// left out), dropped series included.
    pub fn variant_totals(&self) -> BTreeMap<VariantKey, VariantTotals> {
        let map = self.map.lock().unwrap();
        let mut out = self.retired.lock().unwrap().clone();
        for e in map.values().flatten() {
            if e.labels.shadow || e.labels.variant.is_empty() {
                continue;
            }
            out.entry((e.labels.experiment.to_string(), e.labels.variant.to_string())).or_default().add(&e.labels, &e.series);
        }
        out
    }

    /// Appends the Prometheus text exposition of every series.
    pub fn render(&self, out: &mut String) {
        // Copied out, so requests that miss their thread's cache do not wait for the formatting.
        let held: Vec<(Labels, Arc<Series>)> =
            self.map.lock().unwrap().values().flatten().map(|e| (e.labels.clone(), e.series.clone())).collect();
        let entries: Vec<(String, &Series)> = held.iter().map(|(l, s)| (self.label_text(l), &**s)).collect();
        let family = |out: &mut String, i: usize| {
            let (name, kind, help) = SERIES_FAMILIES[i];
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(out, 0);
        for (l, s) in &entries {
            let _ = writeln!(out, "weft_requests_total{{{l}}} {}", s.requests.load(Relaxed));
        }
        family(out, 1);
        for (l, s) in &entries {
            let _ = writeln!(out, "weft_retries_total{{{l}}} {}", s.retries.load(Relaxed));
        }
        family(out, 2);
        for (l, s) in &entries {
            let _ = writeln!(out, "weft_tokens_total{{{l},direction=\"input\"}} {}", s.tokens_in.load(Relaxed));
            let _ = writeln!(out, "weft_tokens_total{{{l},direction=\"output\"}} {}", s.tokens_out.load(Relaxed));
        }
        for (i, hist) in [(3, (|s: &Series| &s.duration) as fn(&Series) -> &Hist), (4, |s: &Series| &s.ttfb)] {
            family(out, i);
            let name = SERIES_FAMILIES[i].0;
            for (l, s) in &entries {
                let h = hist(s);
                let mut cumulative = 0;
                for (le, b) in BUCKETS.iter().zip(&h.buckets) {
                    cumulative += b.load(Relaxed);
                    let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {cumulative}");
                }
                let count = cumulative + h.buckets[BUCKETS.len()].load(Relaxed);
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {count}");
                let _ = writeln!(out, "{name}_sum{{{l}}} {}", h.sum_ns.load(Relaxed) as f64 / 1e9);
                let _ = writeln!(out, "{name}_count{{{l}}} {count}");
            }
        }
    }

    /// The identity labels, rendered: `node="n1",...,` (each followed by a comma).
    pub fn global_labels(&self) -> &str {
        &self.global
    }

    /// `global...,service="s",...,shadow="false"` (no braces).
    fn label_text(&self, l: &Labels) -> String {
        let own = label_pairs(&[
            ("service", &l.service),
            ("route", &l.route),
            ("experiment", &l.experiment),
            ("variant", &l.variant),
            ("cluster", &l.cluster),
            ("endpoint", &l.endpoint),
            ("status_class", l.status_class),
            ("model_name", &l.model_name),
            ("model_version", &l.model_version),
            ("tenant_id", &l.tenant_id),
            ("shadow", if l.shadow { "true" } else { "false" }),
            ("tls", if l.tls.is_empty() { "plaintext" } else { l.tls }),
            ("peer_identity", &l.peer_identity),
        ]);
        format!("{}{own}", self.global)
    }
}

/// Metrics read from a live object at scrape time, so they leave `/metrics` with the object:
/// per-endpoint state, whose endpoints come and go with the config. Objects are tracked by a
/// weak reference ([`LiveSet`]); nothing is registered or removed by hand.
pub trait Live: Send + Sync {
    /// Appends this object's samples: (family, `k="v",...` labels, value).
    fn samples(&self, now_ms: u64, out: &mut Vec<(&'static str, String, f64)>);
}

/// The families [`Live`] objects report: name, type, help.
pub(crate) const LIVE_FAMILIES: &[(&str, &str, &str)] = &[
    ("weft_endpoint_ejected", "gauge", "1 while an endpoint is ejected."),
    ("weft_outlier_ejections_total", "counter", "Endpoints ejected by outlier detection."),
    ("weft_requests_in_flight", "gauge", "Upstream requests in flight per cluster."),
    ("weft_circuit_breaker_state", "gauge", "Error-rate breaker state per cluster: 0 closed, 1 open, 2 half-open."),
    ("weft_circuit_breaker_transitions_total", "counter", "Breaker state changes per cluster and new state."),
    (
        "weft_overflow_total",
        "counter",
        "Requests refused by a cluster threshold (max_requests, max_pending, max_connections, max_retries, breaker_open).",
    ),
    ("weft_retry_budget_exhausted_total", "counter", "Retries refused by the retry budget."),
    ("weft_tunnels_active", "gauge", "Upgraded connections (WebSocket) open per cluster."),
    ("weft_tunnel_bytes_total", "counter", "Bytes tunnelled over upgraded connections, by direction (upstream: client to server; downstream: back)."),
    ("weft_tunnels_closed_total", "counter", "Upgraded connections ended, by reason (closed, idle_timeout, error, drain)."),
    ("weft_variant_requests_in_flight", "gauge", "Requests in flight per experiment variant (response streams included)."),
    ("weft_shed_total", "counter", "Requests shed by a variant's concurrency/pending limit."),
    (
        "weft_tls_handshakes_total",
        "counter",
        "TLS handshakes by side (server: a listener's, client: to a cluster) and result (ok, or why refused: plaintext, expired, unknown_issuer, no_client_certificate, no_spiffe_id, wrong_trust_domain, wrong_identity, ...).",
    ),
    ("weft_downstream_connections_total", "counter", "Downstream connections accepted per listener, by how they came (mtls, tls, plaintext)."),
    ("weft_tls_credential_reloads_total", "counter", "Mesh credential reloads by result (rotated, unchanged, failed)."),
    ("weft_tls_certificate_expiry_timestamp_seconds", "gauge", "When the sidecar's current mesh certificate expires (Unix seconds)."),
    ("weft_tls_certificate_issued_timestamp_seconds", "gauge", "When the sidecar's current mesh certificate became valid (Unix seconds)."),
];

/// The tracked [`Live`] objects of one proxy.
#[derive(Default)]
pub struct LiveSet(Mutex<Tracked>);

#[derive(Default)]
struct Tracked {
    objects: Vec<std::sync::Weak<dyn Live>>,
    /// Length after the last pruning: tracking prunes when the list has doubled since, so an
    /// unscraped proxy that reloads often does not keep every dropped endpoint's allocation.
    pruned_at: usize,
}

impl LiveSet {
    pub fn track(&self, o: std::sync::Weak<dyn Live>) {
        let mut t = self.0.lock().unwrap();
        t.objects.push(o);
        if t.objects.len() >= 2 * t.pruned_at.max(32) {
            t.objects.retain(|w| w.strong_count() > 0);
            t.pruned_at = t.objects.len();
        }
    }

    /// Appends the samples of every object still alive (and forgets the dropped ones), grouped
    /// by family, each line prefixed with `global` labels.
    pub fn render(&self, global: &str, out: &mut String) {
        let mut samples = Vec::new();
        let now = crate::clock::now_ms();
        self.0.lock().unwrap().objects.retain(|w| match w.upgrade() {
            Some(o) => {
                o.samples(now, &mut samples);
                true
            }
            None => false,
        });
        // One sample per label set, or Prometheus rejects the whole scrape: an endpoint listed
        // twice, or removed and added back while a request still holds the old one, reports
        // twice; the newest (tracked last) wins.
        let mut seen = std::collections::HashSet::new();
        let mut unique: Vec<_> = samples.iter().rev().filter(|(f, l, _)| seen.insert((*f, l.as_str()))).collect();
        unique.reverse();
        for (family, kind, help) in LIVE_FAMILIES {
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} {kind}");
            for (_, labels, value) in unique.iter().filter(|(f, ..)| f == family) {
                let _ = writeln!(out, "{family}{{{global}{labels}}} {value}");
            }
        }
    }
}

/// `k="v",k2="v2"` with the values escaped.
pub fn label_pairs(pairs: &[(&str, &str)]) -> String {
    let mut t = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        let _ = write!(t, "{}{k}=\"{}\"", if i > 0 { "," } else { "" }, Escaped(v));
    }
    t
}

/// The request series' families: name, type, help (rendered in this order).
pub(crate) const SERIES_FAMILIES: &[(&str, &str, &str)] = &[
    (
        "weft_requests_total",
        "counter",
        "Requests by service, route, variant, cluster, endpoint, status class, model, tenant; shadow copies labelled shadow=\"true\".",
    ),
    ("weft_retries_total", "counter", "Upstream retries (attempts after the first)."),
    ("weft_tokens_total", "counter", "Tokens responses reported in their usage object, by direction (input, output)."),
    ("weft_request_duration_seconds", "histogram", "Time from request received to response body end."),
    (
        "weft_time_to_first_byte_seconds",
        "histogram",
        "Time from request received to the response's first body byte (the first token of a stream).",
    ),
];

/// A label value escaped for the text exposition format: `\`, `"` and line feeds.
struct Escaped<'a>(&'a str);
impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::LabelValue;

    fn labels(variant: &str, class: &'static str) -> Labels {
        Labels { experiment: LabelValue::from("e"), variant: LabelValue::from(variant), status_class: class, ..Default::default() }
    }

    #[test]
    fn histograms_render_cumulative_le_buckets() {
        let st = SeriesStore::new(&[("node", "n1")]);
        let s = st.get(&labels("a", "2xx"));
        s.duration.record(Duration::from_micros(300));
        s.duration.record(Duration::from_millis(1));
        s.duration.record(Duration::from_secs(400));
        let mut out = String::new();
        st.render(&mut out);
        let line = |needle: &str| out.lines().find(|l| l.starts_with("weft_request_duration_seconds") && l.contains(needle)).unwrap().to_string();
        assert!(line("le=\"0.0005\"").ends_with(" 1"), "{out}");
        assert!(line("le=\"0.001\"").ends_with(" 2"), "a value on a bound is in that bucket");
        assert!(line("le=\"300\"").ends_with(" 2"));
        assert!(line("le=\"+Inf\"").ends_with(" 3"));
        assert!(line("_sum").ends_with(" 400.0013"), "{}", line("_sum"));
        assert!(line("_bucket").starts_with("weft_request_duration_seconds_bucket{node=\"n1\",service=\"\""));
        assert_eq!(out.matches("# TYPE weft_request_duration_seconds histogram").count(), 1);
    }

    #[test]
    fn label_values_are_escaped() {
        let st = SeriesStore::new(&[]);
        let l = Labels { route: LabelValue::from("a\"b\\c\nd"), status_class: "2xx", ..Default::default() };
        st.get(&l).requests.fetch_add(1, Relaxed);
        let mut out = String::new();
        st.render(&mut out);
        assert!(out.contains(r#"route="a\"b\\c\nd""#), "{out}");
    }

    /// A series with no requests for `retain` is dropped: no longer rendered, not handed out
    /// by any thread's cache, and its counts stay in the variant totals.
    #[test]
    fn idle_series_are_dropped_and_their_totals_kept() {
        let st = SeriesStore::new(&[]);
        let (busy, idle) = (labels("a", "2xx"), labels("b", "5xx"));
        for l in [&busy, &idle] {
            st.get(l).requests.fetch_add(3, Relaxed);
        }
        assert_eq!(st.sweep(1_000, 60_000), 0);
        st.get(&busy).requests.fetch_add(1, Relaxed);
        assert_eq!(st.sweep(40_000, 60_000), 0);
        st.get(&busy).requests.fetch_add(1, Relaxed);
        assert_eq!(st.sweep(70_000, 60_000), 1, "b has been idle since 1 s");
        assert_eq!(st.kept(), 1);
        let mut out = String::new();
        st.render(&mut out);
        assert!(!out.contains("variant=\"b\""), "{out}");
        let totals = st.variant_totals();
        assert_eq!(totals[&("e".to_string(), "b".to_string())].errors, 3, "a dropped series still counts");
        assert_eq!(totals[&("e".to_string(), "a".to_string())].requests, 5);
        // This thread's cache must not return the dropped series: a new one starts at zero.
        let again = st.get(&idle);
        assert_eq!(again.requests.load(Relaxed), 0);
        again.requests.fetch_add(2, Relaxed);
        assert_eq!(st.variant_totals()[&("e".to_string(), "b".to_string())].requests, 5, "retired 3 + new 2");
        assert_eq!(st.sweep(10_000_000, 0), 0, "retain 0 keeps everything");
    }

    struct Fixed(&'static str, f64);
    impl Live for Fixed {
        fn samples(&self, _: u64, out: &mut Vec<(&'static str, String, f64)>) {
            out.push(("weft_endpoint_ejected", label_pairs(&[("endpoint", self.0)]), self.1));
        }
    }

    /// Live objects report while alive, once per label set (the newest wins), and leave with
    /// their last reference.
    #[test]
    fn live_objects_report_once_per_label_set_while_alive() {
        let set = LiveSet::default();
        let (old, new, other) = (Arc::new(Fixed("a", 1.0)), Arc::new(Fixed("a", 0.0)), Arc::new(Fixed("b", 1.0)));
        for o in [&old, &new, &other] {
            set.track(Arc::downgrade(&(o.clone() as Arc<dyn Live>)));
        }
        let render = || {
            let mut out = String::new();
            set.render("node=\"n\",", &mut out);
            out.lines().filter(|l| l.starts_with("weft_endpoint_ejected{")).map(str::to_string).collect::<Vec<_>>()
        };
        assert_eq!(render(), vec![r#"weft_endpoint_ejected{node="n",endpoint="a"} 0"#, r#"weft_endpoint_ejected{node="n",endpoint="b"} 1"#]);
        drop((new, other));
        assert_eq!(render(), vec![r#"weft_endpoint_ejected{node="n",endpoint="a"} 1"#]);
        drop(old);
        assert!(render().is_empty());
    }
}

//! The mTLS scenario's results: per-repeat samples, the metrics summarised over repeats, the
//! ratios against Envoy and the targets.

use serde_json::{Value, json};

use crate::peers::Target;
use crate::report::{Check, Closed, Measured, Metric, Ratio, Summary, metric, round};

/// One target measured in one repeat of the mTLS scenario.
#[derive(Clone, Debug)]
pub struct MtlsSample {
    pub target: Target,
    pub repeat: usize,
    /// wrk through the pair (CPU of both sidecars), or over TLS to a terminator.
    pub closed: Closed,
    /// New connections per second, each a full handshake and one request (see `handshake`).
    pub handshakes_per_s: f64,
    pub handshakes: u64,
    pub handshake_errors: u64,
    /// The first handshake error, if any, for the report.
    pub handshake_error: Option<String>,
    /// CPU of the TLS server (the inbound sidecar, or the terminator) per completed handshake.
    pub handshake_server_cpu_us: f64,
    /// The TLS server's CPU over the wall time during the handshake phase.
    pub handshake_server_cpu_busy: f64,
    /// The handshake generator's own CPU over its wall time (≈1.0: the client side, not the
    /// server, limited the rate).
    pub handshake_client_cpu_busy: f64,
    /// Handshakes that needed a HelloRetryRequest (see `handshake::Counts`).
    pub handshake_hello_retries: u64,
    /// What the server negotiated with the generator (version, suite, group, kind, ALPN,
    /// certificates sent).
    pub handshake_negotiated: Option<String>,
}

impl Measured for MtlsSample {
    fn target(&self) -> Target {
        self.target
    }
}

/// The targets of the mTLS scenario, in report order (there is no `direct`: nothing to add
/// TLS to).
pub const TARGETS: [Target; 5] = [
    Target::Weft,
    Target::WeftRelease,
    Target::Envoy,
    Target::Nginx,
    Target::Haproxy,
];

pub const METRICS: &[Metric<MtlsSample>] = &[
    metric("rps", "req/s (wrk)", |s| Some(s.closed.rps), 0),
    metric(
        "cpu_us_per_req",
        "CPU µs/req",
        |s| Some(s.closed.cpu_us_per_req),
        1,
    ),
    metric(
        "handshakes_per_s",
        "handshakes/s",
        |s| Some(s.handshakes_per_s),
        0,
    ),
    metric(
        "handshake_server_cpu_us",
        "server CPU µs/handshake",
        |s| Some(s.handshake_server_cpu_us),
        0,
    ),
    metric(
        "handshake_client_cpu_busy",
        "generator busy",
        |s| Some(s.handshake_client_cpu_busy),
        2,
    ),
    metric("rss_idle_mib", "idle MiB", |s| Some(s.closed.rss_idle_mib), 1),
    metric("rss_peak_mib", "peak MiB", |s| Some(s.closed.rss_peak_mib), 1),
];

pub fn summary(samples: &[MtlsSample]) -> Summary<MtlsSample> {
    Summary::over(samples, METRICS, &TARGETS)
}

const RATIOS: &[Ratio] = &[
    ("weft_rps_over_envoy_rps", Target::Weft, Target::Envoy, "rps"),
    (
        "weft_cpu_over_envoy_cpu",
        Target::Weft,
        Target::Envoy,
        "cpu_us_per_req",
    ),
    (
        "weft_handshakes_over_envoy_handshakes",
        Target::Weft,
        Target::Envoy,
        "handshakes_per_s",
    ),
    (
        "weft_handshake_cpu_over_envoy_handshake_cpu",
        Target::Weft,
        Target::Envoy,
        "handshake_server_cpu_us",
    ),
    (
        "weft_release_rps_over_envoy_rps",
        Target::WeftRelease,
        Target::Envoy,
        "rps",
    ),
    (
        "weft_release_cpu_over_envoy_cpu",
        Target::WeftRelease,
        Target::Envoy,
        "cpu_us_per_req",
    ),
    (
        "weft_release_handshakes_over_envoy_handshakes",
        Target::WeftRelease,
        Target::Envoy,
        "handshakes_per_s",
    ),
    // Not like for like (and so for WEFT_OVER_NGINX_HAPROXY here): nginx and HAProxy terminate
    // TLS from the load generator in one process (one TLS hop, one proxy), where weft and Envoy
    // are two sidecars with mTLS between them.
    (
        "weft_handshakes_over_nginx_handshakes",
        Target::Weft,
        Target::Nginx,
        "handshakes_per_s",
    ),
    (
        "weft_handshakes_over_haproxy_handshakes",
        Target::Weft,
        Target::Haproxy,
        "handshakes_per_s",
    ),
];

pub fn ratios(summary: &Summary<MtlsSample>) -> Value {
    crate::report::ratios_of(summary, &[RATIOS, crate::report::WEFT_OVER_NGINX_HAPROXY])
}

/// The mTLS targets, from the medians.
pub fn checks(s: &Summary<MtlsSample>) -> Vec<Check> {
    let weft = |k| s.median(Target::Weft, k);
    let envoy_times = |k, f: f64| s.median(Target::Envoy, k).map(|v| v * f);
    vec![
        Check {
            name: "mtls: weft rps >= 2x envoy rps",
            value: weft("rps"),
            limit: envoy_times("rps", 2.0),
            at_least: true,
        },
        Check {
            name: "mtls: weft CPU/req <= 0.5x envoy's",
            value: weft("cpu_us_per_req"),
            limit: envoy_times("cpu_us_per_req", 0.5),
            at_least: false,
        },
        Check {
            name: "mtls: weft handshakes/s >= envoy's",
            value: weft("handshakes_per_s"),
            limit: envoy_times("handshakes_per_s", 1.0),
            at_least: true,
        },
    ]
}

/// One sample as a JSON object (the raw per-repeat numbers).
pub fn sample_json(s: &MtlsSample) -> Value {
    s.closed.json_with(json!({
        "target": s.target.name(),
        "repeat": s.repeat,
        "handshakes_per_s": round(s.handshakes_per_s, 1),
        "handshakes": s.handshakes,
        "handshake_errors": s.handshake_errors,
        "handshake_error": s.handshake_error,
        "handshake_server_cpu_us": round(s.handshake_server_cpu_us, 1),
        "handshake_server_cpu_busy": round(s.handshake_server_cpu_busy, 3),
        "handshake_client_cpu_busy": round(s.handshake_client_cpu_busy, 3),
        "handshake_hello_retries": s.handshake_hello_retries,
        "handshake_negotiated": s.handshake_negotiated,
    }))
}

/// Explanations stored with the numbers, so the JSON reads on its own.
pub const NOTES: &[&str] = &[
    "weft, weft_release, envoy: two sidecars of the same proxy on the proxy core, wrk (plaintext HTTP/1.1) -> outbound sidecar A -> mutual TLS (TLS 1.3, HTTP/1.1, pooled connections; A presents spiffe://weft.local/ns/bench/sa/client and checks the server's URI SAN is spiffe://weft.local/service/model; B requires a client certificate chaining to the bench's root) -> inbound sidecar B -> plaintext upstream",
    "nginx, haproxy: TLS termination only: one process terminating TLS from wrk (https://, no client certificate) -> plaintext upstream; neither does SPIFFE mTLS on both hops, so their numbers are a reference, not the same work",
    "rps: closed loop, wrk -t1 with --connections connections for --duration s, after a warm-up; cpu_us_per_req: utime+stime of every proxy process (A + B for a pair) during it / requests completed; cpu_busy: the same CPU / wall time",
    "handshakes_per_s: the bench's generator (tokio-rustls, on the load core), --connections loops for --duration s, each: TCP connect to B (or the terminator), a full TLS handshake presenting the client certificate (resumption disabled), GET / with Connection: close, read to the end, close; completed exchanges / wall time. handshake_server_cpu_us: the TLS server's CPU per completed exchange; handshake_client_cpu_busy: the generator's CPU / wall time (near 1.0 the client limited the rate); handshake_negotiated: what the first handshake negotiated, as the generator saw it (version, cipher suite, key-exchange group, Full or FullWithHelloRetryRequest, ALPN, certificates the server sent); handshake_hello_retries: handshakes that needed a HelloRetryRequest",
    "summary.mtls holds medians over repeats; summary.mtls.*.range holds [min, max]",
];

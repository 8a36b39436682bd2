//! The YAML bootstrap: what a user writes. Every type here maps 1:1 onto a weft xDS resource
//! (listener, service = route configuration, experiment, cluster + its endpoints), so the
//! control plane can push exactly what a file can say. Parsing is strict (unknown fields are
//! errors) so a typo never silently becomes a default. Semantic checks live in `snapshot`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::duration::Dur;

/// The whole bootstrap file.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node: Node,
    pub admin: Admin,
    pub listeners: Vec<Listener>,
    pub services: Vec<Service>,
    pub experiments: Vec<Experiment>,
    pub clusters: Vec<Cluster>,
    pub telemetry: Telemetry,
    /// Present on a training worker's sidecar: the job whose shard map it subscribes to and
    /// hands to the trainer on loopback (see `training`).
    pub training: Option<Training>,
    /// This sidecar's mesh identity for mutual TLS (see [`Identity`]); absent = no mTLS.
    pub identity: Option<Identity>,
    /// Who may call the services of this sidecar's inbound listeners (see
    /// [`AuthorizationPolicy`]); empty = everyone.
    pub authorization: Vec<AuthorizationPolicy>,
    /// Revoked identities (see [`Revocation`]).
    pub revocations: Vec<Revocation>,
}

/// `revocations[]`: a peer whose certificate is for `identity` and became valid before
/// `issued_before` (Unix seconds) is refused in the TLS handshake, by callers and callees alike
/// (`weft_tls_handshakes_total{result="revoked"}`). Certificates issued later are accepted, so
/// revoke the identity's join token too (`weftctl identity revoke` does both) or it is simply
/// renewed. Leaves are backdated by up to a minute, so one issued within that minute after the
/// revocation is refused too. Connections already open are not cut.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Revocation {
    pub name: String,
    pub identity: String,
    pub issued_before: u64,
}

/// `authorization[]`: which callers may reach which services, enforced by the inbound sidecar
/// (requests on `direction: inbound` listeners) after mTLS told it who the caller is.
///
/// For a request to service S, the policies that apply are those naming S in `services` (or
/// naming none), on sidecars whose own identity is in `namespace` (or any, when empty). Then:
/// a matching rule of a `deny` policy refuses it (deny wins); else a matching rule of an
/// `allow` policy admits it; else, if any `allow` policy applies, it is refused (allow-lists
/// are closed); else it is admitted. So with no policy a namespace is default-allow, and one
/// `allow` policy with no rules makes it default-deny. A refusal is a 403 naming the policy.
///
/// ```yaml
/// authorization:
///   - name: chat-callers
///     namespace: ml                  # sidecars of spiffe://TD/ns/ml/...; empty = every sidecar
///     services: [chat]               # empty = every service
///     action: allow                  # or deny
///     rules:
///       - identities: ["spiffe://weft.local/ns/apps/sa/web", "spiffe://weft.local/ns/batch/*"]
///         path_prefixes: ["/v1/"]    # empty = any path
///         methods: [POST]            # empty = any method
/// ```
///
/// An identity is a whole SPIFFE ID, a prefix ending in `*`, or `*` (any mTLS peer); a rule
/// with no identities matches every caller, plaintext ones included.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthorizationPolicy {
    pub name: String,
    pub namespace: String,
    pub services: Vec<String>,
    pub action: AuthzAction,
    pub rules: Vec<AuthzRule>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AuthzAction {
    #[default]
    Allow,
    Deny,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthzRule {
    pub identities: Vec<String>,
    pub path_prefixes: Vec<String>,
    pub methods: Vec<String>,
}

/// `identity`: who this sidecar is in the mesh, as a SPIFFE ID carried by its leaf certificate,
/// and where its credentials come from. With an identity, inbound listeners require mutual TLS
/// by default (`listeners[].tls.mode`), and clusters with `tls.mode: mesh` originate it.
///
/// ```yaml
/// identity:
///   spiffe_id: spiffe://weft.local/ns/default/sa/model-a   # or .../service/NAME; empty = the cert's
///   cert_file: /etc/weft/tls/cert.pem    # leaf first, then any intermediates
///   key_file: /etc/weft/tls/key.pem      # PKCS#8, readable by this sidecar alone
///   ca_file: /etc/weft/tls/ca.pem        # the mesh root(s) peers must chain to
/// ```
///
/// The three files are reread when they change (checked every second), so an outside issuer
/// (cert-manager, SPIRE, a cron job) can rotate them; a set that does not load is logged and
/// counted, and the previous one keeps serving.
///
/// Or weft-control issues them (with `--xds`): the sidecar makes its own key, sends the mesh
/// CA a CSR with its join token, keeps what comes back in `dir`, and renews two thirds through
/// each certificate's life. After a restart it serves what `dir` holds while that is valid, so
/// a control plane that is down stops nothing until the certificate expires.
///
/// ```yaml
/// identity:
///   spiffe_id: spiffe://weft.local/service/model-a   # required: what the token admits
///   token_file: /etc/weft/join-token     # from `weftctl identity token create`
///   dir: /var/lib/weft/identity          # key.pem (0600), cert.pem, ca.pem
/// ```
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Identity {
    pub spiffe_id: String,
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
    pub token_file: String,
    pub dir: String,
}

/// How a listener treats TLS (`listeners[].tls.mode`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ListenerTlsMode {
    /// Only mutual TLS with a peer of the mesh (a client certificate chaining to the mesh root,
    /// with a SPIFFE ID of this trust domain); plaintext connections are refused.
    Strict,
    /// Mutual TLS when the client starts a TLS handshake, plaintext otherwise (each connection
    /// counted by which it was): for migrating a service to mTLS.
    Permissive,
    /// Plaintext only.
    Disabled,
    /// Plain TLS with the listener's own certificate (`cert_file`, `key_file`) and no client
    /// certificate: an ingress listener for clients outside the mesh.
    Terminate,
}

/// `listeners[].tls`. Absent mode: `strict` on an inbound listener of a sidecar that has an
/// `identity`, `disabled` otherwise (an outbound listener serves the local app on loopback).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerTls {
    pub mode: Option<ListenerTlsMode>,
    /// `terminate` only: the certificate chain and key (PEM) served to clients.
    pub cert_file: String,
    pub key_file: String,
}

/// How a cluster's upstream connections use TLS (`clusters[].tls.mode`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClusterTlsMode {
    /// Mutual TLS to other sidecars of the mesh with this sidecar's `identity`: the server must
    /// chain to the mesh root and hold one of `identities` (any of the trust domain when empty).
    #[default]
    Mesh,
    /// Plain TLS to an upstream outside the mesh: the server's certificate must be valid for
    /// `sni` under `ca_file` (the system's roots when empty).
    Simple,
}

/// `clusters[].tls`: absent = plaintext.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterTls {
    pub mode: ClusterTlsMode,
    /// `mesh`: SPIFFE IDs the upstream sidecars may hold.
    pub identities: Vec<String>,
    /// Server name sent (SNI) and, for `simple`, checked; default the endpoint's host.
    pub sni: String,
    /// `simple`: roots (PEM) the upstream must chain to; empty = the system's.
    pub ca_file: String,
}

/// Workload identity of this sidecar; attached to every metric series and log line.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Node {
    pub id: String,
    pub team: String,
    pub project: String,
    pub run_id: String,
    pub job_type: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Loopback by default: the admin API can drain the proxy and dump its config.
    pub address: String,
    /// A second, read-only listener serving only `GET /metrics`, `/ready` and `/live`, for a
    /// scraper or probes outside the pod while the admin API stays on loopback (as Istio's
    /// 15090/15021 beside Envoy's loopback admin). Default: none.
    pub metrics_address: Option<String>,
}

impl Default for Admin {
    fn default() -> Self {
        Admin { address: "127.0.0.1:9901".into(), metrics_address: None }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// The local app calls the sidecar; traffic leaves the pod.
    #[default]
    Outbound,
    /// In front of the local model server.
    Inbound,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Listener {
    pub name: String,
    pub address: String,
    pub direction: Direction,
    /// Largest request head (request line + headers) accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Time allowed to receive a request head on a connection (slowloris guard). Off by default,
    /// as in Envoy: it arms a timer per request. Set it on listeners reachable from outside.
    pub header_read_timeout: Dur,
    /// How long an HTTP/1.1 connection may sit idle between requests before the proxy closes
    /// it (nginx's `keepalive_timeout`, Envoy's connection `idle_timeout`). 0 = never.
    pub keepalive_timeout: Dur,
    pub tls: ListenerTls,
}

impl Default for Listener {
    fn default() -> Self {
        Listener {
            name: String::new(),
            address: String::new(),
            direction: Direction::Outbound,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Dur::default(),
            keepalive_timeout: Dur::from_millis(3_600_000),
            tls: ListenerTls::default(),
        }
    }
}

/// A service: the hosts it answers to and its ordered routes (first match wins).
/// Maps onto an xDS RouteConfiguration with one virtual host.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Service {
    pub name: String,
    /// Listener names this service is served on; empty = all listeners.
    pub listeners: Vec<String>,
    /// Host/authority values (port stripped, case-insensitive); `*` matches any host.
    pub hosts: Vec<String>,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Route {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    /// Send every request of this route to one cluster...
    pub cluster: Option<String>,
    /// ...or split it between the variants of an experiment.
    pub experiment: Option<String>,
    /// Time until the response headers, across all tries. Default 60s; 0 = none.
    pub timeout: Option<Dur>,
    /// Time for one try until its response headers. Default: none (the route timeout bounds it).
    pub per_try_timeout: Option<Dur>,
    /// Longest silence between two body chunks, either direction. Default 5m; 0 = none.
    /// Deliberately not a total-duration limit, so long LLM token streams are never cut.
    pub idle_timeout: Option<Dur>,
    pub retry: Option<RetryPolicy>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RouteMatch {
    pub path_exact: Option<String>,
    pub path_prefix: Option<String>,
    pub headers: Vec<HeaderMatch>,
    /// Model name taken from a KServe v2 path (`/v2/models/{name}/...`).
    pub model: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderMatch {
    pub name: String,
    /// Exact value; when absent the header only has to be present.
    pub exact: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Total tries including the first.
    pub attempts: u32,
    /// Conditions: `connect-failure`, `reset`, and status codes as strings ("503").
    pub on: Vec<String>,
    pub backoff_base: Dur,
    pub backoff_max: Dur,
    /// Retries allowed as a fraction of requests over the last 10 s...
    pub budget_ratio: f64,
    /// ...plus this many per second, so a quiet service can still retry.
    pub budget_min_per_sec: u32,
    /// A request is replayable only if its whole body fits in this many bytes.
    pub buffer_bytes: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 2,
            on: vec!["connect-failure".into(), "reset".into(), "502".into(), "503".into(), "504".into()],
            backoff_base: Dur::from_millis(25),
            backoff_max: Dur::from_millis(250),
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
            buffer_bytes: 64 * 1024,
        }
    }
}

/// An A/B experiment: how requests of a route are split between model variants.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Experiment {
    pub name: String,
    /// Mixed into the sticky hash; a new salt re-randomizes every unit.
    pub salt: String,
    /// Header holding the unit id (user, session); same unit → same variant.
    pub unit_header: Option<String>,
    /// Header that forces a variant (for tests); ignored unless `allow_override`.
    pub override_header: String,
    pub allow_override: bool,
    pub variants: Vec<Variant>,
    pub stratify: Option<Stratify>,
    pub shadow: Option<Shadow>,
}

impl Default for Experiment {
    fn default() -> Self {
        Experiment {
            name: String::new(),
            salt: String::new(),
            unit_header: None,
            override_header: "x-weft-variant".into(),
            allow_override: true,
            variants: vec![],
            stratify: None,
            shadow: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Variant {
    pub name: String,
    pub cluster: String,
    /// A relative share: the variant gets `weight / sum of the experiment's weights` of the
    /// traffic (90/10 and 9/1 split alike). 0 = none, though overrides still reach it.
    pub weight: u32,
    pub model_version: String,
    /// Requests in flight to this variant at once; 0 = unlimited.
    pub max_concurrency: u32,
    /// Requests allowed to wait for a concurrency slot; beyond that they are shed with 503.
    pub max_pending: u32,
}

/// Per-stratum weights: requests whose `header` value is a key here use those weights.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Stratify {
    pub header: String,
    pub weights: BTreeMap<String, BTreeMap<String, u32>>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Shadow {
    pub cluster: String,
    /// Label for the shadow's telemetry.
    pub variant: String,
    /// Fraction of requests copied, 0.0..=1.0.
    pub fraction: f64,
    /// Requests whose body is larger are not shadowed (counted as skipped).
    pub max_body_bytes: usize,
    /// The shadow copy gives up after this long.
    pub timeout: Dur,
}

impl Default for Shadow {
    fn default() -> Self {
        Shadow {
            cluster: String::new(),
            variant: "shadow".into(),
            fraction: 0.0,
            max_body_bytes: 64 * 1024,
            timeout: Dur::from_millis(10_000),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    /// Power of two choices over EWMA latency × in-flight.
    #[default]
    P2cEwma,
    RoundRobin,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with a keep-alive pool.
    #[default]
    Http1,
    /// HTTP/2 prior knowledge (h2c); required for gRPC upstreams.
    Http2,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    pub name: String,
    /// `host:port` of each endpoint (IP literals or names resolved at load).
    pub endpoints: Vec<String>,
    pub lb: LbPolicy,
    pub protocol: UpstreamProtocol,
    pub connect_timeout: Dur,
    /// Idle upstream connections kept per endpoint.
    pub max_idle_per_endpoint: usize,
    pub circuit_breaker: CircuitBreaker,
    pub outlier: Option<Outlier>,
    pub tls: Option<ClusterTls>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            name: String::new(),
            endpoints: vec![],
            lb: LbPolicy::P2cEwma,
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Dur::from_millis(1000),
            max_idle_per_endpoint: 128,
            circuit_breaker: CircuitBreaker::default(),
            outlier: None,
            tls: None,
        }
    }
}

/// Per-cluster limits (Envoy's thresholds) plus an optional error-rate breaker.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CircuitBreaker {
    pub max_connections: u32,
    pub max_pending: u32,
    pub max_requests: u32,
    pub max_retries: u32,
    pub error_rate: Option<ErrorRate>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            max_connections: 1024,
            max_pending: 1024,
            max_requests: 1024,
            max_retries: 3,
            error_rate: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorRate {
    /// Open when this percentage of requests in the window failed (5xx or gateway error).
    pub threshold_pct: f64,
    /// ...and at least this many requests were seen in the window.
    pub min_requests: u32,
    pub window: Dur,
    pub open_duration: Dur,
    /// Requests let through while half-open; all must succeed to close.
    pub half_open_probes: u32,
}

impl Default for ErrorRate {
    fn default() -> Self {
        ErrorRate {
            threshold_pct: 50.0,
            min_requests: 20,
            window: Dur::from_millis(10_000),
            open_duration: Dur::from_millis(5_000),
            half_open_probes: 3,
        }
    }
}

/// Passive outlier detection: eject an endpoint after consecutive failures.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Outlier {
    /// Consecutive 5xx responses that eject; 0 = off.
    pub consecutive_5xx: u32,
    /// Consecutive 502/503/504 or connect failures that eject; 0 = off.
    pub consecutive_gateway_errors: u32,
    /// Ejection lasts base × number of times ejected...
    pub base_ejection_time: Dur,
    /// ...capped here.
    pub max_ejection_time: Dur,
    /// Never eject more than this share of the cluster's endpoints.
    pub max_ejection_pct: u32,
}

impl Default for Outlier {
    fn default() -> Self {
        Outlier {
            consecutive_5xx: 5,
            consecutive_gateway_errors: 3,
            base_ejection_time: Dur::from_millis(30_000),
            max_ejection_time: Dur::from_millis(300_000),
            max_ejection_pct: 50,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// Header carrying the tenant id label.
    pub tenant_header: String,
    /// Distinct tenant values that get their own label; later ones are labelled `other`.
    pub tenant_top_n: usize,
    /// Header overriding the variant's `model_version` label when the client sends it.
    pub model_version_header: String,
    pub access_log: AccessLog,
    /// OpenTelemetry trace export over OTLP/gRPC; absent = nothing exported, no cost.
    pub otlp: Option<Otlp>,
    /// A request series (one label set of `weft_requests_total` and its histograms) that sees
    /// no request for this long is dropped from `/metrics`, as Linkerd's proxy does, so
    /// endpoints that came and went do not grow the metrics forever; `0s` keeps every series.
    pub retain_idle: Dur,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            tenant_header: "x-tenant-id".into(),
            tenant_top_n: 50,
            model_version_header: "x-model-version".into(),
            access_log: AccessLog::default(),
            otlp: None,
            retain_idle: Dur(std::time::Duration::from_secs(600)),
        }
    }
}

/// `telemetry.otlp`: send a span per request served (SERVER) and per upstream try and shadow
/// copy (CLIENT) to an OpenTelemetry collector over OTLP/gRPC. The request path only enqueues
/// (never waits): when the queue is full, or the collector is down, spans are dropped and counted
/// (`weft_otlp_dropped_spans_total`), never requests.
///
/// ```yaml
/// telemetry:
///   otlp:
///     endpoint: "http://127.0.0.1:4317"   # collector's OTLP/gRPC address (http:// only, no TLS)
///     service_name: ""                    # resource service.name; default node.id, else weft-proxy
///     sample_ratio: 1.0                   # for new traces; a caller's sampled flag is followed
///     queue: 2048                         # spans waiting to be sent; beyond that, dropped
///     batch: 512                          # spans per export request
///     flush_interval: 1s                  # a partial batch is sent after this long
///     timeout: 5s                         # per export request (and connect)
///     metrics_interval: 10s               # send the /metrics registry as OTLP metrics; 0 = off
///     headers: {x-api-key: "..."}         # gRPC metadata on every export
///     resource: {model: llama-3-8b}       # extra resource attributes
/// ```
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Otlp {
    pub endpoint: String,
    pub service_name: String,
    pub sample_ratio: f64,
    pub queue: usize,
    pub batch: usize,
    pub flush_interval: Dur,
    pub timeout: Dur,
    /// Every this often the registry `/metrics` serves goes out as OTLP metrics; 0 = never.
    pub metrics_interval: Dur,
    pub headers: BTreeMap<String, String>,
    pub resource: BTreeMap<String, String>,
}

impl Default for Otlp {
    fn default() -> Self {
        Otlp {
            endpoint: "http://127.0.0.1:4317".into(),
            service_name: String::new(),
            sample_ratio: 1.0,
            queue: 2048,
            batch: 512,
            flush_interval: Dur::from_millis(1000),
            timeout: Dur::from_millis(5000),
            metrics_interval: Dur::from_millis(10_000),
            headers: BTreeMap::new(),
            resource: BTreeMap::new(),
        }
    }
}

/// `training`: this sidecar sits beside one worker of a distributed training job. With
/// `--xds` it subscribes to the job's shard map and serves the trainer a loopback API on the
/// admin address (`/training/map`, `/training/ack`, `/training/checkpoint`); its reports
/// carry the trainer's progress and checkpoints to the control plane. On drain (`POST
/// /drain`, SIGTERM) it first POSTs the trainer's checkpoint hook and waits for it, up to
/// `hook_deadline`.
///
/// ```yaml
/// training:
///   job: llama-ft                         # the trainingjobs/<job> this worker belongs to
///   worker: llama-ft-3                    # its name in the shard map; default node.id
///   checkpoint_hook: "http://127.0.0.1:7070/checkpoint"   # empty = no hook
///   hook_deadline: 60s                    # how long a drain waits for the hook
///   host: ""                              # the machine preemption notices name; default
///                                         # $NODE_NAME, else node.id
/// ```
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Training {
    pub job: String,
    pub worker: String,
    pub checkpoint_hook: String,
    pub hook_deadline: Dur,
    pub host: String,
}

impl Default for Training {
    fn default() -> Self {
        Training {
            job: String::new(),
            worker: String::new(),
            checkpoint_hook: String::new(),
            hook_deadline: Dur::from_millis(60_000),
            host: String::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLog {
    pub enabled: bool,
    /// Fraction of requests logged, 0.0..=1.0.
    pub sample: f64,
    /// File to append JSON lines to; empty = stdout.
    pub path: String,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog { enabled: false, sample: 1.0, path: String::new() }
    }
}

impl Config {
    /// Parse YAML text. Errors name the line, column and field.
    pub fn from_yaml(text: &str) -> Result<Config, String> {
        serde_norway::from_str(text).map_err(|e| format!("invalid YAML: {e}"))
    }

    /// Puts the sidecar in front of one local server: every request on the inbound listener
    /// `listener` goes to `upstream` (`127.0.0.1:PORT`) through a service and a cluster both
    /// named `local`. What the Kubernetes injector's and the node agent's bootstraps share.
    pub fn front(&mut self, local: &str, listener: &str, upstream: String) {
        self.services.push(Service {
            name: local.to_string(),
            listeners: vec![listener.to_string()],
            hosts: vec!["*".into()],
            routes: vec![Route {
                name: "all".into(),
                matcher: RouteMatch { path_prefix: Some("/".into()), ..Default::default() },
                cluster: Some(local.to_string()),
                ..Default::default()
            }],
        });
        self.clusters.push(Cluster { name: local.to_string(), endpoints: vec![upstream], ..Default::default() });
    }
}

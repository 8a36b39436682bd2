//! The request path, top to bottom. Read `handle` first: each step is one call into the module
//! that owns it (route → assign → limit → shadow → cluster/lb → retry → pool → telemetry).
//!
//! Invariants kept here:
//! - a request reads one config snapshot from start to end, even if a reload swaps it meanwhile;
//! - bodies stream; only a bounded copy is kept, for retries and shadows;
//! - nothing is retried once a response byte went downstream (we only retry on response heads
//!   we have not forwarded);
//! - the shadow copy runs in its own task and can never delay or fail the primary.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::body::{DownBody, End, Recorder, ReqBody, RespBody, UpBody};
use crate::breaker::Admit;
use crate::clock::{self, now_ms};
use crate::cluster::{Cluster, Endpoint, Overflow};
use crate::otlp;
use crate::outlier::Outcome;
use crate::h1::{self, SendError};
use crate::headers::{self, ReqHeaders};
use crate::pool::{Conn, ConnectError};
use crate::retry::{self, Failure};
use crate::route;
use crate::snapshot::{ExperimentRt, RetryRt, RouteRt, Snapshot, Target, VariantRt};
use crate::telemetry::{self, Labels};
use crate::Shared;

static X_WEFT_VARIANT: HeaderName = HeaderName::from_static("x-weft-variant");
static SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
static X_WEFT_SHADOW: HeaderName = HeaderName::from_static("x-weft-shadow");
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Handle one downstream request on listener `li`. Never fails: errors become local responses
/// (the `Result` is the shape hyper's service wants).
/// `fields`: the request's header fields as weft's HTTP/1.1 server read them, which are not in
/// its map (see [`crate::h1::fields`]).
pub async fn handle(sh: Arc<Shared>, li: usize, req: Request<DownBody>, fields: Option<h1::Fields>) -> Result<Response<RespBody>, std::convert::Infallible> {
    let start = Instant::now();
    let snap = sh.snapshot.load_full();
    let version = req.version();
    // Every value empty until routed (free to make: see `telemetry::LabelValue`).
    let mut labels = Labels::default();
    let mut span = None;
    let grpc = crate::grpc_reply::is_grpc(req.headers());
    let mut resp = match serve(&sh, &snap, li, req, fields, start, &mut labels, &mut span).await {
        Ok(resp) => resp,
        Err(local) => {
            // Telemetry keeps the HTTP status the error stands for (a gRPC caller sees 200 and
            // the grpc-status), so error rates count it either way.
            let status = local.status;
            labels.status_class = telemetry::status_class(status.as_u16());
            let resp = if grpc { local.into_grpc_response() } else { local.into_response() };
            sh.telemetry.finish(&labels, start.elapsed(), 0);
            if let Some(s) = span.take() {
                let kind = resp.headers().get("x-weft-error").and_then(|v| v.to_str().ok());
                s.finish(&labels, status.as_u16(), None, kind);
            }
            resp
        }
    };
    *resp.version_mut() = version;
    Ok(resp)
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    sh: &Arc<Shared>,
    snap: &Arc<Snapshot>,
    li: usize,
    req: Request<DownBody>,
    fields: Option<h1::Fields>,
    start: Instant,
    labels: &mut Labels,
    span: &mut Option<otlp::ReqSpan>,
) -> Result<Response<RespBody>, Local> {
    let (mut parts, body) = req.into_parts();
    // How the connection came (set on TLS connections; none = plaintext).
    let peer = parts.extensions.remove::<Arc<crate::mtls::Peer>>();
    let mut headers = ReqHeaders::new(std::mem::take(&mut parts.headers), fields);
    // A WebSocket handshake (weft's HTTP/1.1 server marks it): the protocol it asks for.
    let mut upgrade = parts.extensions.get::<h1::UpgradeRequest>().and_then(|_| headers.get_shared(&header::UPGRADE));
    // An HTTP/2 client's WebSocket (RFC 8441: CONNECT with `:protocol`) goes upstream as the
    // HTTP/1.1 handshake it stands for: GET + Upgrade, with a key of the proxy's making.
    let mut h2_stream = None;
    if parts.method == Method::CONNECT
        && let Some(protocol) = parts.extensions.get::<hyper::ext::Protocol>()
    {
        upgrade = Some(Bytes::copy_from_slice(protocol.as_str().as_bytes()));
        h2_stream = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        parts.method = Method::GET;
    }
    // Trace context first, so even a request answered locally gets its server span.
    let mut trace = telemetry::traceparent(headers.get(&TRACEPARENT));
    *span = otlp::start(&sh.telemetry, &parts, &headers, &mut trace, start);
    // 1. Which service: by Host / :authority on this listener.
    let missing = || Local::new(StatusCode::BAD_REQUEST, "missing_host", "the request has no Host header or :authority");
    let authority = authority(&parts.uri, &headers).ok_or_else(missing)?;
    let host = headers::visible(&authority).ok_or_else(missing)?;
    if !valid_host(host) {
        return Err(Local::new(
            StatusCode::BAD_REQUEST,
            "invalid_host",
            format!("the Host header or :authority {host:?} is not a host[:port]"),
        ));
    }
    let listener = &snap.listeners[li];
    let si = listener.hosts.lookup(host).ok_or_else(|| {
        Local::new(
            StatusCode::NOT_FOUND,
            "unknown_host",
            format!("no service on listener {:?} answers to host {host:?}", &*listener.name),
        )
        .with("host", host.to_string())
    })?;
    let service = &snap.services[si];
    labels.service = service.name.clone().into();
    // 1b. Whether the caller may: on inbound listeners, by its mTLS identity.
    let inbound = listener.direction == crate::config::Direction::Inbound;
    if inbound {
        if let Some(p) = peer.as_deref() {
            labels.tls = p.mode();
            if let crate::mtls::Peer::Mesh(id) = p {
                labels.peer_identity = id.clone().into();
            }
        }
        authorize(sh, snap, si, peer.as_deref(), &parts)?;
    }

    // 2. Which route: path, headers, KServe model name.
    let path = parts.uri.path();
    let model = route::kserve_model(path);
    if let Some(m) = model {
        labels.model_name = m.into();
    }
    let route = service.routes.iter().find(|r| r.matcher.matches(path, &headers, model)).ok_or_else(|| {
        Local::new(StatusCode::NOT_FOUND, "no_route", format!("service {:?} has no route for {path:?}", &*service.name))
            .with("path", path.to_string())
    })?;
    labels.route = route.name.clone().into();
    let tenant = header_str(&headers, snap.tenant_header.as_ref());
    labels.tenant_id = sh.telemetry.tenant_label(tenant);
    if let Some(s) = span.as_mut() {
        s.set_tenant(tenant);
    }

    // 3. Which variant (and so which cluster).
    let (cluster, variant, experiment) = match route.target {
        Target::Cluster(c) => (&snap.clusters[c], None, None),
        Target::Experiment(e) => {
            let exp = &snap.experiments[e];
            let v = &exp.variants[assign(exp, &headers)];
            (&snap.clusters[v.cluster], Some(v), Some(exp))
        }
    };
    labels.cluster = cluster.name.clone().into();
    if !inbound {
        labels.tls = cluster.origin.as_ref().map_or("", |o| o.mode());
    }
    // Looked at only for a handshake (not per request).
    let h2_cluster = upgrade.is_some() && cluster.endpoints.iter().any(|e| e.protocol == crate::config::UpstreamProtocol::Http2);
    if h2_cluster && h2_stream.is_none() {
        return Err(Local::new(
            StatusCode::NOT_IMPLEMENTED,
            "upgrade_unsupported",
            format!(
                "cluster {:?} speaks HTTP/2; an HTTP/1.1 Upgrade (WebSocket) needs an HTTP/1.1 cluster (an HTTP/2 client's extended CONNECT can reach either)",
                &*cluster.name
            ),
        ));
    }
    if let (Some(v), Some(e)) = (variant, experiment) {
        labels.experiment = e.name.clone().into();
        labels.variant = v.name.clone().into();
        labels.model_version = v.model_version.clone().into();
    }
    if let Some(mv) = header_str(&headers, snap.model_version_header.as_ref())
        .or_else(|| route::kserve_version(path))
    {
        labels.model_version = mv.into();
    }

    // 4. Per-variant isolation: a slot, or shed at once.
    let deadline = route.timeout.map(|t| start + t);
    let slot = match variant {
        None => None,
        Some(v) => Some(acquire_slot(v, deadline).await?),
    };

    // 5. Prepare the upstream request; keep a bounded copy of the body if a retry or a shadow
    //    may need it.
    // Not for a handshake: a copy could not be upgraded, so it would only load the shadow.
    let shadow = experiment.and_then(|e| e.shadow.as_ref()).filter(|s| upgrade.is_none() && rand::random::<f64>() < s.fraction);
    prepare_headers(&mut headers, &authority, parts.uri.authority().is_some());
    let record_limit = route.retry.as_ref().map_or(0, |r| r.buffer_bytes).max(shadow.map_or(0, |s| s.max_body_bytes));
    let body = Prepared::new(body, record_limit);

    // 6. Shadow copy: fire and forget.
    if let Some(s) = shadow {
        crate::shadow::spawn(sh, snap, s, &parts, &headers, &authority, trace, &body, labels, span.as_ref().map(|t| t.child()));
    }

    // 7. Forward, retrying within policy and budget.
    let span_fwd = span.take().map(|s| s.forwarding(labels));
    let variant_header = variant.map(|v| v.header.clone());
    let mut req_parts = ReqParts {
        method: parts.method,
        uri: parts.uri,
        headers,
        authority,
        traceparent: trace,
        variant: variant_header,
        span: span_fwd,
        upgrade,
    };
    // Not boxed: hyper moves this whole future into its per-connection slot once per request
    // (a memcpy of ~2 KiB), which measured cheaper than allocating and freeing a box that size
    // (callgrind: 34.8k -> 33.9k instructions per request without the box).
    let mut sent = match forward(cluster, route, &mut req_parts, body, start, deadline).await {
        Ok(sent) => sent,
        Err(local) => {
            *span = req_parts.span.take();
            return Err(local);
        }
    };
    labels.endpoint = cluster.endpoints[sent.ep].label.clone().into();
    labels.status_class = telemetry::status_class(sent.resp.status().as_u16());
    let ending = req_parts.span.take().map(|s| s.responded(sent.attempt, sent.resp.status().as_u16()));

    // 8. Respond, streaming the body; telemetry and connection reuse happen when it ends.
    let (mut rparts, incoming) = sent.resp.into_parts();
    // An HTTP/1.1 upstream's fields are not in the map but beside the body, and had their
    // hop-by-hop ones left out as they were read (`h1::fields`); HTTP/2's are in the map.
    strip_hop_by_hop(&mut rparts.headers);
    if let Some(v) = variant {
        rparts.headers.insert(X_WEFT_VARIANT.clone(), v.header.clone());
    }
    if req_parts.upgrade.is_some() {
        let settings = crate::tunnel::Settings { cluster: cluster.clone(), idle: route.idle_timeout };
        crate::tunnel::on_response(&mut rparts, &incoming, h2_stream, h2_cluster, settings)?;
    }
    sent.held.hand_over();
    let on_end = finish_on_end(sh, cluster, sent.ep, slot, std::mem::take(labels), start, sent.attempts - 1, &req_parts, ending, peer);
    let content_type = match incoming.fields() {
        Some(f) => f.get("content-type"),
        None => headers::find(&rparts.headers, &header::CONTENT_TYPE).map(|v| v.as_bytes()),
    };
    let scan = crate::usage::scanned(content_type);
    Ok(Response::from_parts(rparts, RespBody::upstream(incoming, route.idle_timeout, scan, on_end)))
}

/// Choose the variant for a request.
fn assign(exp: &ExperimentRt, h: &ReqHeaders) -> usize {
    let forced = exp.override_header.as_ref().and_then(|n| h.get_str(n));
    let unit = exp.unit_header.as_ref().and_then(|n| h.get(n));
    let stratum = exp.stratify_header.as_ref().and_then(|n| h.get_str(n));
    exp.assigner.assign(forced, unit, stratum, rand::random::<u64>).0
}

async fn acquire_slot(v: &VariantRt, deadline: Option<Instant>) -> Result<crate::limit::Slot, Local> {
    let shed = || {
        Local::new(StatusCode::SERVICE_UNAVAILABLE, "variant_overloaded", format!(
            "variant {:?} is at its concurrency limit and its pending queue is full", &*v.name
        ))
        .header("x-weft-shed", "variant_pending_full")
    };
    let acquired = match deadline {
        None => v.limiter.acquire().await,
        Some(d) => tokio::time::timeout_at(d.into(), v.limiter.acquire()).await.map_err(|_| {
            Local::new(StatusCode::GATEWAY_TIMEOUT, "timeout", "route timeout while queued for the variant")
        })?,
    };
    acquired.ok_or_else(shed)
}

/// What a request looks like to every try.
pub(crate) struct ReqParts {
    pub method: Method,
    pub uri: Uri,
    pub headers: ReqHeaders,
    /// The downstream Host / :authority (visible ASCII, checked when the request came in).
    pub authority: Bytes,
    /// The `traceparent` every try sends (created when the request had none; a traced try
    /// writes its own span id in). Kept beside `headers`, with `variant`, rather than in the
    /// map: an HTTP/1.1 try writes them after the request's own headers, so no request pays
    /// for inserting them (and a retry's copy of them); an HTTP/2 try inserts them.
    pub traceparent: [u8; 55],
    /// `x-weft-variant` for the upstream: which arm it serves (replacing a forced override).
    pub variant: Option<HeaderValue>,
    /// The request's trace while OTLP export is on and it is sampled.
    pub span: Option<otlp::ReqSpan>,
    /// The protocol a WebSocket handshake asks to switch to, asked of the upstream too.
    pub upgrade: Option<Bytes>,
}

/// The request's header map outlives no exchange: its allocation goes to the next upstream
/// response parsed on this worker ([`headers::recycle`]).
impl Drop for ReqParts {
    fn drop(&mut self) {
        headers::recycle(std::mem::take(&mut self.headers.map));
    }
}

impl ReqParts {
    /// The request for one try to an HTTP/2 upstream. `last`: no try can follow, so the
    /// headers are moved rather than copied. (HTTP/1.1 tries are written straight from these
    /// parts, see [`send`].)
    pub(crate) fn build_h2(&mut self, body: ReqBody, last: bool) -> Request<ReqBody> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.headers_mut() = if last { std::mem::take(&mut self.headers).into_map() } else { self.headers.to_map() };
        // From parts, never by pasting strings: the path is the one routed on, whatever the
        // Host holds (`valid_host` already refused one that is not an authority).
        let mut p = http::uri::Parts::default();
        p.scheme = Some(http::uri::Scheme::HTTP);
        p.authority = http::uri::Authority::try_from(&self.authority[..]).ok();
        p.path_and_query = Some(self.uri.path_and_query().cloned().unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")));
        *req.uri_mut() = Uri::from_parts(p).unwrap_or_else(|_| Uri::from_static("/"));
        *req.version_mut() = Version::HTTP_2;
        if let Some(p) = self.upgrade.as_ref().and_then(|p| std::str::from_utf8(p).ok()) {
            // An HTTP/2 client's WebSocket, on to an HTTP/2 upstream as the same extended CONNECT.
            *req.method_mut() = Method::CONNECT;
            req.extensions_mut().insert(hyper::ext::Protocol::from(p));
        }
        let h = req.headers_mut();
        h.remove(header::HOST);
        if let Ok(v) = HeaderValue::from_bytes(&self.traceparent) {
            h.insert(TRACEPARENT.clone(), v);
        }
        if let Some(v) = &self.variant {
            h.insert(X_WEFT_VARIANT.clone(), v.clone());
        }
        req
    }
}

/// Send one try's request on `conn` and wait for the response head. The primary's tries and
/// the shadow copies both go through here. An HTTP/1.1 response body returns its connection
/// to `ep`'s pool when it ends cleanly.
pub(crate) async fn send(
    conn: Conn,
    ep: &Arc<Endpoint>,
    max_idle: usize,
    parts: &mut ReqParts,
    body: ReqBody,
    last: bool,
) -> Result<Response<UpBody>, SendError> {
    match conn {
        Conn::H2(mut s) => match s.send_request(parts.build_h2(body, last)).await {
            Ok(r) => Ok(r.map(UpBody::H2)),
            Err(e) => Err(SendError::Failed(e.to_string())),
        },
        Conn::H1 { conn, .. } => {
            let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let home = h1::Home { endpoint: ep.clone(), max_idle };
            let both;
            let set: &[(&HeaderName, &[u8])] = match &parts.variant {
                Some(v) => {
                    both = [(&TRACEPARENT, &parts.traceparent[..]), (&X_WEFT_VARIANT, v.as_bytes())];
                    &both
                }
                None => &[(&TRACEPARENT, &parts.traceparent[..])],
            };
            // An HTTP/2 client's WebSocket has no key (RFC 8441 §5); this handshake needs one.
            let key;
            let with_key;
            let set = match &parts.upgrade {
                Some(p) if p.eq_ignore_ascii_case(b"websocket") && !parts.headers.contains(&SEC_WEBSOCKET_KEY) => {
                    key = crate::tunnel::websocket_key();
                    with_key = [set, &[(&SEC_WEBSOCKET_KEY, key.as_bytes())]].concat();
                    &with_key[..]
                }
                _ => set,
            };
            let head = h1::Head { method: &parts.method, target, headers: &parts.headers, set, upgrade: parts.upgrade.as_deref() };
            Ok(conn.send(head, body, home).await?.map(UpBody::H1))
        }
    }
}

/// The request body, as it is before the first try.
pub(crate) enum Prepared {
    Empty,
    Stream { body: DownBody, recorder: Option<Arc<Recorder>> },
}

impl Prepared {
    fn new(body: DownBody, record_limit: usize) -> Prepared {
        use http_body::Body;
        if body.is_end_stream() {
            return Prepared::Empty;
        }
        let fits = body.size_hint().upper().is_none_or(|n| n as usize <= record_limit);
        let recorder = (record_limit > 0 && fits).then(|| Recorder::new(record_limit));
        Prepared::Stream { body, recorder }
    }

    pub(crate) fn recorder(&self) -> Option<&Arc<Recorder>> {
        match self {
            Prepared::Stream { recorder, .. } => recorder.as_ref(),
            Prepared::Empty => None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Prepared::Empty)
    }
}

/// What the first try sends, and how later tries get a body again.
struct Bodies {
    first: Option<ReqBody>,
    replay: Replay,
    /// The retry policy's `buffer_bytes`: the recorder may hold more (its limit is the larger
    /// of this and the shadow's), but a retry replays no body above this.
    limit: usize,
}

enum Replay {
    Empty,
    Recorded(Arc<Recorder>),
    Impossible,
}

impl Bodies {
    fn new(p: Prepared, limit: usize) -> Bodies {
        match p {
            Prepared::Empty => Bodies { first: Some(ReqBody::full(Bytes::new())), replay: Replay::Empty, limit },
            Prepared::Stream { body, recorder } => Bodies {
                replay: recorder.clone().map_or(Replay::Impossible, Replay::Recorded),
                first: Some(ReqBody::stream(body, recorder)),
                limit,
            },
        }
    }

    /// The body for the next try; None when the request cannot be replayed.
    fn next(&mut self) -> Option<ReqBody> {
        if let Some(b) = self.first.take() {
            return Some(b);
        }
        match &self.replay {
            Replay::Empty => Some(ReqBody::full(Bytes::new())),
            Replay::Recorded(r) => r.replay().filter(|b| b.len() <= self.limit).map(ReqBody::full),
            Replay::Impossible => None,
        }
    }

    /// Could another try get a body? (Checked before spending budget on it.)
    fn replayable(&self) -> bool {
        self.first.is_some()
            || match &self.replay {
                Replay::Empty => true,
                Replay::Recorded(r) => r.complete_len().is_some_and(|n| n <= self.limit),
                Replay::Impossible => false,
            }
    }
}

struct Sent<'a> {
    resp: Response<UpBody>,
    ep: usize,
    /// The try's in-flight counts, until the response body takes them over.
    held: Held<'a>,
    attempts: u32,
    /// The try's span (OTLP), ended with the body or when the response is dropped for a retry.
    attempt: Option<otlp::Attempt>,
}

/// Send to `cluster`, retrying per the route's policy.
async fn forward<'a>(
    cluster: &'a Arc<Cluster>,
    route: &RouteRt,
    parts: &mut ReqParts,
    body: Prepared,
    start: Instant,
    deadline: Option<Instant>,
) -> Result<Sent<'a>, Local> {
    let policy = route.retry.as_ref();
    if let Some(p) = policy {
        p.budget.lock().unwrap().record_request(clock::ms_of(start));
    }
    let mut bodies = Bodies::new(body, policy.map_or(0, |p| p.buffer_bytes));
    let mut tried: Vec<usize> = Vec::new();
    let mut attempt = 0u32;
    let mut retry: Option<Retry<'a>> = None;
    loop {
        attempt += 1;
        let slot = retry.take().map(|r| r.slot);
        let outcome = try_once(cluster, route, parts, &mut bodies, &tried, deadline, slot).await;
        let (failure, ep) = match outcome {
            Ok(mut sent) => {
                let status = sent.resp.status().as_u16();
                let retryable = policy.is_some_and(|p| p.on.matches(Failure::Status(status)));
                retry = if retryable { may_retry(cluster, policy, attempt, &bodies, deadline) } else { None };
                if retry.is_none() {
                    sent.attempts = attempt;
                    return Ok(sent);
                }
                // Dropped unread: its connection is not reused, and its counts end here.
                let Sent { ep, held, attempt, .. } = sent;
                drop(held);
                if let Some(s) = &parts.span {
                    s.end_attempt(attempt, Ok(status));
                }
                (Failure::Status(status), ep)
            }
            Err(TryError::Local(l)) => return Err(l),
            Err(TryError::Failed(f, ep, local)) => {
                let retryable = policy.is_some_and(|p| p.on.matches(f));
                retry = if retryable { may_retry(cluster, policy, attempt, &bodies, deadline) } else { None };
                if retry.is_none() {
                    return Err(local);
                }
                (f, ep)
            }
        };
        tried.push(ep);
        tracing::debug!(cluster = %cluster.name, ?failure, attempt, "retrying");
        if let Some(r) = &retry {
            tokio::time::sleep(r.wait).await;
        }
    }
}

/// A granted retry: its backoff, and its place in the cluster's `max_retries`, taken when it
/// was granted so that retries waiting out their backoff count too.
struct Retry<'a> {
    wait: Duration,
    slot: Counted<'a>,
}

/// Whether one more try is allowed: attempts left, body replayable, the backoff ends before the
/// route deadline, cluster `max_retries` not reached, and the retry budget grants it (checked
/// last: it spends).
fn may_retry<'a>(
    cluster: &'a Cluster,
    policy: Option<&RetryRt>,
    attempt: u32,
    bodies: &Bodies,
    deadline: Option<Instant>,
) -> Option<Retry<'a>> {
    let p = policy?;
    if attempt >= p.attempts || !bodies.replayable() {
        return None;
    }
    let wait = Duration::from_millis(retry::backoff_ms(p.backoff_base_ms, p.backoff_max_ms, attempt, rand::random()));
    // A try that would start at or past the deadline cannot succeed; it would only reach the
    // upstream and be charged to it as a timeout.
    if deadline.is_some_and(|d| Instant::now() + wait >= d) {
        return None;
    }
    let active = &cluster.retries_active;
    if active.fetch_add(1, Relaxed) >= cluster.cfg.circuit_breaker.max_retries {
        active.fetch_sub(1, Relaxed);
        cluster.count_overflow(Overflow::MaxRetries);
        return None;
    }
    let slot = Counted::adopt(active);
    if !p.budget.lock().unwrap().try_withdraw(now_ms()) {
        cluster.stats.budget_exhausted.fetch_add(1, Relaxed);
        return None;
    }
    Some(Retry { wait, slot })
}

enum TryError {
    /// Not retryable at all (overflow, no endpoint): answer with this.
    Local(Local),
    /// The try failed on endpoint `.1`; `.2` is the answer if we stop here.
    Failed(Failure, usize, Local),
}

/// One try: thresholds, breaker, endpoint pick, connection, request, response head.
async fn try_once<'a>(
    cluster: &'a Arc<Cluster>,
    route: &RouteRt,
    parts: &mut ReqParts,
    bodies: &mut Bodies,
    tried: &[usize],
    deadline: Option<Instant>,
    _retry_slot: Option<Counted<'a>>,
) -> Result<Sent<'a>, TryError> {
    let started = Instant::now();
    let now = clock::ms_of(started);
    let mut probe = admit(cluster, now).map_err(|o| TryError::Local(overflow(cluster, o)))?;
    let ep_i = cluster.pick(tried, now).ok_or_else(|| {
        TryError::Local(
            Local::new(StatusCode::SERVICE_UNAVAILABLE, "no_healthy_endpoint", match cluster.endpoints.len() {
                0 => format!("cluster {:?} has no endpoints", &*cluster.name),
                n => format!("cluster {:?} has no healthy endpoint (all {n} ejected)", &*cluster.name),
            })
            .with("cluster", cluster.name.to_string()),
        )
    })?;
    let ep = &cluster.endpoints[ep_i];

    // The try's time limit: the per-try timeout, cut short by the route deadline.
    let limit = match (route.per_try_timeout.map(|t| started + t), deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let held = Held::take(cluster, ep_i);
    let last = route.retry.as_ref().is_none_or(|r| r.attempts <= 1);
    let attempt = parts.span.as_mut().map(|s| s.attempt(&mut parts.traceparent, &ep.label, ep.addr));
    // The exchange future is built inside each arm: held in a local first, it would take
    // room in this future's state next to the copy being awaited, and be copied once more.
    let result = match limit {
        None => exchange(cluster, ep_i, parts, bodies, last).await,
        Some(l) => tokio::time::timeout_at(l.into(), exchange(cluster, ep_i, parts, bodies, last))
            .await
            .unwrap_or(Err(Attempt::Timeout)),
    };
    match result {
        Ok(resp) => {
            ep.load.finished(started, false);
            cluster.record(ep_i, Outcome::from_status(resp.status().as_u16()), probe.verdict(), now);
            // `active`/in-flight are released when the response body ends (see finish_on_end),
            // or right here if the caller drops this response to retry.
            Ok(Sent { resp, ep: ep_i, held, attempts: 0, attempt })
        }
        Err(a) => {
            drop(held);
            if let Some(s) = &parts.span {
                s.end_attempt(attempt, Err(a.kind()));
            }
            // Only what the endpoint did counts against it: a request refused here (pending
            // or connection limits, a body that cannot be replayed) never reached it.
            if matches!(a, Attempt::Connect(_) | Attempt::Reset(_) | Attempt::Timeout) {
                ep.load.finished(started, true);
                cluster.record(ep_i, Outcome::GatewayError, probe.verdict(), now);
            }
            Err(a.into_error(cluster, ep_i, deadline))
        }
    }
}

/// The cluster-wide checks every request sent to `cluster` passes, primary try or shadow copy:
/// the `max_requests` threshold, then the error-rate breaker. Returns the refusing threshold
/// (not yet counted).
pub(crate) fn admit(cluster: &Cluster, now: u64) -> Result<ProbeTicket<'_>, Overflow> {
    if cluster.active.load(Relaxed) >= cluster.cfg.circuit_breaker.max_requests {
        return Err(Overflow::MaxRequests);
    }
    match cluster.admit(now) {
        Admit::No => Err(Overflow::BreakerOpen),
        a => Ok(ProbeTicket { cluster, armed: a == Admit::Probe }),
    }
}

/// A half-open breaker's probe slot, held by the try it admitted: recorded with the try's
/// outcome, or given back when the try ends without one (cancelled, refused locally, no
/// endpoint), so that probes that never report cannot hold the breaker half-open for good.
pub(crate) struct ProbeTicket<'a> {
    cluster: &'a Cluster,
    armed: bool,
}

impl ProbeTicket<'_> {
    /// Whether the try was a probe; its outcome is being recorded, so the slot is settled.
    pub(crate) fn verdict(&mut self) -> bool {
        std::mem::take(&mut self.armed)
    }
}

impl Drop for ProbeTicket<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cluster.abandon_probe();
        }
    }
}

/// A try's hold on its cluster's active-request count and its endpoint's in-flight count.
/// Released when dropped, so also when the request is cancelled mid-try (a client that resets
/// its stream drops the whole request future); otherwise a cancelled request stayed counted
/// for good, and enough of them made `max_requests` refuse everything.
pub(crate) struct Held<'a> {
    cluster: &'a Cluster,
    ep: usize,
    armed: bool,
}

impl<'a> Held<'a> {
    pub(crate) fn take(cluster: &'a Cluster, ep: usize) -> Held<'a> {
        cluster.endpoints[ep].load.start();
        cluster.active.fetch_add(1, Relaxed);
        cluster.stats.in_flight.fetch_add(1, Relaxed);
        Held { cluster, ep, armed: true }
    }

    /// The response body took the counts over: it calls [`release`] when it ends.
    fn hand_over(&mut self) {
        self.armed = false;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.armed {
            release(self.cluster, self.ep);
        }
    }
}

/// Decrement the in-flight counts taken by [`Held::take`].
fn release(cluster: &Cluster, ep: usize) {
    cluster.endpoints[ep].load.end();
    cluster.active.fetch_sub(1, Relaxed);
    cluster.stats.in_flight.fetch_sub(1, Relaxed);
}

enum Attempt {
    Connect(String),
    Overflow,
    Pending,
    Reset(String),
    Timeout,
    NoBody,
}

impl Attempt {
    /// The `error.type` of a try's span.
    fn kind(&self) -> &'static str {
        match self {
            Attempt::Connect(_) => "connect_failure",
            Attempt::Overflow => "overflow_max_connections",
            Attempt::Pending => "overflow_max_pending",
            Attempt::Reset(_) => "reset",
            Attempt::Timeout => "timeout",
            Attempt::NoBody => "not_replayable",
        }
    }

    fn into_error(self, cluster: &Cluster, ep: usize, deadline: Option<Instant>) -> TryError {
        let who = format!("{} ({})", &*cluster.name, &*cluster.endpoints[ep].label);
        match self {
            Attempt::Connect(e) => TryError::Failed(Failure::ConnectFailure, ep, Local::new(
                StatusCode::SERVICE_UNAVAILABLE, "upstream_connect_failure", format!("cannot connect to {who}: {e}"),
            )),
            Attempt::Reset(e) => TryError::Failed(Failure::Reset, ep, Local::new(
                StatusCode::BAD_GATEWAY, "upstream_reset", format!("{who} failed before responding: {e}"),
            )),
            Attempt::Timeout => {
                let route_timeout = deadline.is_some_and(|d| Instant::now() >= d);
                TryError::Failed(Failure::Timeout, ep, Local::new(
                    StatusCode::GATEWAY_TIMEOUT, "upstream_timeout",
                    format!("{who} did not respond within the {} timeout", if route_timeout { "route" } else { "per-try" }),
                ))
            }
            Attempt::Overflow => TryError::Local(overflow(cluster, Overflow::MaxConnections)),
            Attempt::Pending => TryError::Local(overflow(cluster, Overflow::MaxPending)),
            Attempt::NoBody => TryError::Local(Local::new(
                StatusCode::BAD_GATEWAY, "not_replayable", "the request body could not be replayed for a retry",
            )),
        }
    }
}

/// Get a connection and send the request; resolves at the response head.
async fn exchange(
    cluster: &Cluster,
    ep_i: usize,
    parts: &mut ReqParts,
    bodies: &mut Bodies,
    last: bool,
) -> Result<Response<UpBody>, Attempt> {
    let ep = &cluster.endpoints[ep_i];
    let dial = cluster.dial(ep);
    if cluster.pending.fetch_add(1, Relaxed) >= cluster.cfg.circuit_breaker.max_pending {
        cluster.pending.fetch_sub(1, Relaxed);
        return Err(Attempt::Pending);
    }
    let conn = {
        let _pending = Counted::adopt(&cluster.pending);
        ep.pool().checkout(ep.addr, &dial).await
    };
    let conn = match conn {
        Ok(c) => c,
        Err(ConnectError::Overflow) => return Err(Attempt::Overflow),
        Err(ConnectError::Failed(e)) => return Err(Attempt::Connect(e)),
        Err(ConnectError::Timeout) => return Err(Attempt::Connect("connect timeout".into())),
    };
    // The body is taken only now: a connect failure leaves it untouched for the next try.
    let body = bodies.next().ok_or(Attempt::NoBody)?;
    let reused = matches!(conn, Conn::H1 { reused: true, .. });
    let max_idle = cluster.cfg.max_idle_per_endpoint;
    let (body, e) = match send(conn, ep, max_idle, parts, body, last).await {
        Ok(r) => return Ok(r),
        Err(SendError::Failed(e)) => return Err(Attempt::Reset(e)),
        Err(SendError::Unsent(body, e)) => (body, e),
    };
    if !reused {
        bodies.first = Some(body);
        return Err(Attempt::Reset(e));
    }
    // A pooled connection the peer closed meanwhile, found on the first write: resend once on
    // a fresh connection (not a retry). Boxed: a cold path, whose futures would otherwise size
    // (and be copied with) every request's future.
    Box::pin(async {
        match crate::pool::dial_h1(ep.addr, &dial).await {
            Ok(conn) => match send(Conn::H1 { conn, reused: false }, ep, max_idle, parts, body, last).await {
                Ok(r) => Ok(r),
                Err(SendError::Failed(e)) => Err(Attempt::Reset(e)),
                Err(SendError::Unsent(body, e)) => {
                    bodies.first = Some(body);
                    Err(Attempt::Reset(e))
                }
            },
            Err(_) => {
                // Never sent: the body goes back for the next try (it may be the only copy of
                // a streamed body).
                bodies.first = Some(body);
                Err(Attempt::Connect("reconnect after stale pooled connection failed".into()))
            }
        }
    })
    .await
}

/// The closure run when the response body ends: free the counts, reuse the connection, record
/// telemetry, release the variant slot.
#[allow(clippy::too_many_arguments)]
fn finish_on_end(
    sh: &Arc<Shared>,
    cluster: &Arc<Cluster>,
    ep: usize,
    slot: Option<crate::limit::Slot>,
    labels: Labels,
    start: Instant,
    retries: u32,
    parts: &ReqParts,
    span: Option<otlp::ReqSpan>,
    peer: Option<Arc<crate::mtls::Peer>>,
) -> crate::body::OnEnd {
    let sh = sh.clone();
    let cluster = cluster.clone();
    // Boxed: the access log is off by default, and the closure is moved into its box whole.
    let log = sh.telemetry.access_log_enabled().then(|| Box::new((parts.method.clone(), parts.uri.clone(), telemetry::trace_id(&parts.traceparent).to_string(), peer)));
    Box::new(move |end: End, stream: crate::usage::StreamInfo| {
        release(&cluster, ep);
        let elapsed = start.elapsed();
        let ttfb = stream.first_byte.map(|t| t.saturating_duration_since(start));
        sh.telemetry.finish_stream(&labels, elapsed, retries, ttfb, stream.tokens);
        if let Some(s) = span {
            s.ended(&labels, end, ttfb, stream.tokens);
        }
        if let Some(log) = log {
            let (method, uri, trace, peer) = *log;
            sh.telemetry.access_log(|| serde_json::json!({
                "time_ms": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
                "method": method.as_str(), "path": uri.to_string(), "service": &*labels.service,
                "route": &*labels.route, "variant": &*labels.variant, "cluster": &*labels.cluster,
                "endpoint": &*labels.endpoint, "status_class": labels.status_class,
                "model_name": &*labels.model_name, "tenant_id": &*labels.tenant_id,
                "duration_ms": elapsed.as_secs_f64() * 1000.0, "retries": retries,
                "end": format!("{end:?}"), "trace_id": trace,
                "tls": peer.as_ref().map_or("plaintext", |p| p.mode()),
                "peer_identity": peer.as_ref().and_then(|p| p.identity()),
                "ttfb_ms": ttfb.map(|d| d.as_secs_f64() * 1000.0),
                "input_tokens": stream.tokens.map(|t| t.input), "output_tokens": stream.tokens.map(|t| t.output),
            }));
        }
        drop(slot);
    })
}

/// Apply `authorization[]` to a request for service `si`: counted per decision; a refusal is a
/// 403 naming the policy (and an access-log line).
fn authorize(sh: &Shared, snap: &Snapshot, si: usize, peer: Option<&crate::mtls::Peer>, parts: &http::request::Parts) -> Result<(), Local> {
    use crate::authz::Decision;
    let caller = peer.and_then(|p| p.identity());
    let decision = snap.authz.check(si, caller, &parts.method, parts.uri.path());
    if decision == Decision::Open {
        return Ok(());
    }
    let service = &snap.services[si].name;
    let denied = matches!(decision, Decision::Deny(_));
    let labels = vec![
        metrics::Label::new("service", service.to_string()),
        metrics::Label::new("decision", if denied { "deny" } else { "allow" }),
        metrics::Label::new("policy", decision.policy().to_string()),
    ];
    sh.telemetry.counter("weft_authz_decisions_total", labels).increment(1);
    if !denied {
        return Ok(());
    }
    let who = caller.map_or_else(|| "a plaintext caller (no mTLS identity)".to_string(), |c| c.to_string());
    tracing::debug!(service = &**service, caller = %who, policy = decision.policy(), "request refused by authorization");
    sh.telemetry.access_log(|| serde_json::json!({
        "time_ms": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        "method": parts.method.as_str(), "path": parts.uri.path(), "service": &**service, "status_class": "4xx",
        "tls": peer.map_or("plaintext", |p| p.mode()), "peer_identity": caller,
        "authz": "deny", "authz_policy": decision.policy(),
    }));
    Err(Local::new(StatusCode::FORBIDDEN, "unauthorized", format!("{who} may not call service {:?} (policy {})", &**service, decision.policy()))
        .with("policy", decision.policy().to_string())
        .with("caller", who))
}

fn overflow(cluster: &Cluster, o: Overflow) -> Local {
    cluster.count_overflow(o);
    Local::new(StatusCode::SERVICE_UNAVAILABLE, "overflow", format!("cluster {:?} refused the request: {}", &*cluster.name, o.as_str()))
        .header("x-weft-overflow", o.as_str())
        .with("cluster", cluster.name.to_string())
}

/// An atomic count held for a scope.
struct Counted<'a>(&'a std::sync::atomic::AtomicU32);
impl<'a> Counted<'a> {
    /// Take over a count already added.
    fn adopt(c: &'a std::sync::atomic::AtomicU32) -> Self {
        Counted(c)
    }
}
impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// The bytes of a plain host name or IPv4 address (the fast path of [`valid_host`]).
static HOST_NAME_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_';
        c += 1;
    }
    t
};

/// Whether `h` is an authority without userinfo: `host[:port]` (RFC 9110 §7.2). The common
/// shape (name or IPv4 address, optional numeric port) is checked byte by byte; an IPv6
/// literal is parsed as one; anything else goes to the `http` crate's parser. Routing and the
/// upstream URI both rely on it: a Host holding `/`, `?`, `#` or `@` would otherwise let a
/// client choose the path an HTTP/2 upstream sees.
fn valid_host(h: &str) -> bool {
    // One table lookup per byte of the name, up to a colon; then an optional port.
    let b = h.as_bytes();
    let name_len = b.iter().position(|&c| !HOST_NAME_BYTE[c as usize]).unwrap_or(b.len());
    let plain = name_len > 0
        && match &b[name_len..] {
            [] => true,
            [b':', port @ ..] => is_port(port),
            _ => false,
        };
    if plain {
        return true;
    }
    // An IP literal: brackets around an IPv6 address, nothing else (`http` lets `x[::1]`,
    // `[zz]` and `[]` through).
    if let Some(rest) = h.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else { return false };
        return addr.parse::<std::net::Ipv6Addr>().is_ok()
            && match after.as_bytes() {
                [] => true,
                [b':', port @ ..] => is_port(port),
                _ => false,
            };
    }
    // A name with sub-delims and the like, as `http` parses it. It takes any digits after the colon (and
    // its `port_u16` reads through `u16::from_str`, which allows a leading `+`): the port is
    // checked here as on the fast path.
    !h.contains(['@', '[', ']'])
        && http::uri::Authority::try_from(h).is_ok_and(|a| {
            !a.host().is_empty() && (!h.contains(':') || a.port().is_some_and(|p| is_port(p.as_str().as_bytes())))
        })
}

/// A port: one or more digits, at most 65535 in value (leading zeros allowed).
fn is_port(p: &[u8]) -> bool {
    !p.is_empty()
        && p.iter().all(u8::is_ascii_digit)
        && p.iter().try_fold(0u32, |n, d| n.checked_mul(10)?.checked_add(u32::from(d - b'0'))).is_some_and(|n| n <= u32::from(u16::MAX))
}

/// The request's :authority (HTTP/2) or Host header, if present and non-empty (the caller
/// checks it is visible ASCII). A Host header is shared with the request (no copy): this runs
/// on every request.
fn authority(uri: &Uri, h: &ReqHeaders) -> Option<Bytes> {
    let v = match uri.authority() {
        Some(a) => Bytes::copy_from_slice(a.as_str().as_bytes()),
        None => h.get_shared(&header::HOST)?,
    };
    (!v.is_empty()).then_some(v)
}

fn header_str<'a>(h: &'a ReqHeaders, name: Option<&HeaderName>) -> Option<&'a str> {
    name.and_then(|n| h.get_str(n)).filter(|v| !v.is_empty())
}

/// Headers that describe one hop, not the message; never forwarded (RFC 9110 §7.6.1).
fn is_hop_by_hop(n: &HeaderName) -> bool {
    // Names are lowercase: a plain match (length first) instead of case-folding comparisons.
    matches!(n.as_str(), "connection" | "transfer-encoding" | "upgrade" | "proxy-authenticate" | "te" | "keep-alive" | "proxy-connection")
}

/// Remove hop-by-hop headers. Most messages carry none, so one pass over the names (cheap
/// comparisons) ends there; otherwise only what is present is removed (hashing).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    if !h.keys().any(is_hop_by_hop) {
        return;
    }
    let present: Vec<HeaderName> = h.keys().filter(|n| is_hop_by_hop(n)).cloned().collect();
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // "close" and "keep-alive" are connection options, rarely header names.
        .filter(|n| !n.eq_ignore_ascii_case("close") && !n.eq_ignore_ascii_case("keep-alive"))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in present {
        // gRPC needs `te: trailers` end to end; any other TE value is hop-by-hop.
        if n == header::TE && h.get(&n).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers")) {
            continue;
        }
        h.remove(n);
    }
}

/// The request's own headers as they go upstream: hop-by-hop ones removed, Host present (an
/// HTTP/2 request has only :authority), and only one. When the target carries the authority
/// (`from_target`: an HTTP/2 :authority, an HTTP/1.1 absolute-form target), that is the Host
/// sent: a proxy replaces the client's Host with it (RFC 9112 §3.2.2), and routing used it too.
/// `traceparent` and `x-weft-variant` are set per try (see [`ReqParts::traceparent`]).
fn prepare_headers(h: &mut ReqHeaders, authority: &Bytes, from_target: bool) {
    // The fields weft's HTTP/1.1 server read had theirs left out already (`h1::fields`).
    strip_hop_by_hop(&mut h.map);
    // Two Host fields of an HTTP/2 request (its HTTP/1.1 ones were refused) become the one
    // it was routed by.
    let hosts_twice = || !h.map.is_empty() && h.map.get_all(header::HOST).iter().nth(1).is_some();
    if (from_target || !h.forwards(&header::HOST) || hosts_twice())
        && let Ok(v) = HeaderValue::from_maybe_shared(authority.clone())
    {
        h.insert(header::HOST, v);
    }
}

pub(crate) fn shadow_header() -> (HeaderName, HeaderValue) {
    (X_WEFT_SHADOW.clone(), HeaderValue::from_static("true"))
}

/// A response the proxy makes itself: JSON naming what went wrong.
pub struct Local {
    status: StatusCode,
    body: serde_json::Map<String, serde_json::Value>,
    headers: Vec<(&'static str, String)>,
}

impl Local {
    pub fn new(status: StatusCode, error: &str, message: impl Into<String>) -> Local {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), error.into());
        body.insert("message".into(), message.into().into());
        Local { status, body, headers: vec![("x-weft-error", error.to_string())] }
    }
    pub fn with(mut self, k: &str, v: String) -> Local {
        self.body.insert(k.into(), v.into());
        self
    }
    pub fn header(mut self, k: &'static str, v: &str) -> Local {
        self.headers.push((k, v.to_string()));
        self
    }
    /// The reply to a gRPC call (see [`crate::grpc_reply`]): 200, trailers-only, the status
    /// and message as `grpc-status`/`grpc-message`, weft's own headers kept.
    pub fn into_grpc_response(self) -> Response<RespBody> {
        let kind = self.body.get("error").and_then(|v| v.as_str()).unwrap_or_default();
        let message = self.body.get("message").and_then(|v| v.as_str()).unwrap_or_default();
        let code = crate::grpc_reply::code(kind, self.status.as_u16());
        let message = crate::grpc_reply::encode_message(message);
        let mut r = Response::new(RespBody::local(Bytes::new()));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert("grpc-status", HeaderValue::from(code));
        if let Ok(v) = HeaderValue::from_str(&message) {
            h.insert("grpc-message", v);
        }
        insert_all(h, self.headers);
        r
    }

    pub fn into_response(self) -> Response<RespBody> {
        let mut text = serde_json::to_vec(&self.body).unwrap_or_default();
        text.push(b'\n');
        let mut r = Response::new(RespBody::local(text));
        *r.status_mut() = self.status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        insert_all(r.headers_mut(), self.headers);
        r
    }
}

/// A local reply's own headers (`x-weft-error`, `retry-after`, ...); a value that is not a
/// valid header value is dropped rather than failing the reply.
fn insert_all(h: &mut http::HeaderMap, headers: Vec<(&'static str, String)>) {
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_authorities_are_valid_hosts() {
        for ok in ["svc", "svc.ns.svc.cluster.local", "svc:8080", "10.0.0.1:80", "[::1]", "[fe80::1]:443", "[::ffff:10.0.0.1]:80", "a_b", "svc:65535", "svc:0"] {
            assert!(valid_host(ok), "{ok:?}");
        }
        for bad in ["", ":80", "svc/x", "svc?", "svc#", "u@svc", "a b", "svc:8080:1", "svc:123456", "svc:99999", "svc:", "svc:8o", "a:b:c", "[::1", "svc\\x", "svc:+80", "svc:65536", "x[::1]", "[zz]", "[]", "[::1]x", "[::1]:+80", "[::1]:", "a]b", "[::1]:70000"] {
            assert!(!valid_host(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_h2_upstream_gets_the_routed_path_whatever_the_host() {
        let mut parts = ReqParts {
            method: Method::GET,
            uri: Uri::from_static("/public/infer?q=1"),
            headers: ReqHeaders::default(),
            authority: Bytes::from_static(b"svc:8080"),
            traceparent: crate::telemetry::traceparent(None),
            variant: Some(HeaderValue::from_static("b")),
            span: None,
            upgrade: None,
        };
        let req = parts.build_h2(ReqBody::full(Bytes::new()), false);
        assert_eq!(req.uri().to_string(), "http://svc:8080/public/infer?q=1");
        parts.authority = Bytes::from_static(b"[::1]:9");
        let req = parts.build_h2(ReqBody::full(Bytes::new()), true);
        assert_eq!(req.uri().path_and_query().unwrap().as_str(), "/public/infer?q=1");
    }

    #[test]
    fn hop_by_hop_headers_are_removed_but_te_trailers_kept() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["te", "content-type"]);
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn the_upstream_gets_one_host_the_one_routed_by() {
        let hosts = |h: &ReqHeaders| h.map.get_all(header::HOST).iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
        let authority = Bytes::from_static(b"svc");
        // HTTP/2 without :authority, two host fields (routed by the first).
        let mut h = ReqHeaders::default();
        h.map.append(header::HOST, HeaderValue::from_static("svc"));
        h.map.append(header::HOST, HeaderValue::from_static("other"));
        prepare_headers(&mut h, &authority, false);
        assert_eq!(hosts(&h), ["svc"]);
        // The target's authority replaces a Host that differs from it.
        let mut h = ReqHeaders::default();
        h.map.append(header::HOST, HeaderValue::from_static("elsewhere"));
        prepare_headers(&mut h, &authority, true);
        assert_eq!(hosts(&h), ["svc"]);
        // One Host, no authority in the target: kept as it is.
        let mut h = ReqHeaders::default();
        h.map.append(header::HOST, HeaderValue::from_static("svc:80"));
        prepare_headers(&mut h, &authority, false);
        assert_eq!(hosts(&h), ["svc:80"]);
    }
}

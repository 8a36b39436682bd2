//! OTLP trace export against an in-process OTLP/gRPC receiver: the spans and their attributes,
//! parent/child links across two chained sidecars, parent-based sampling, and a collector that
//! is down (requests unaffected, drops counted). Every wait is bounded; nothing is timed.

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode as SpanStatus};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_tests::*;

/// A received span with its resource's attributes.
#[derive(Clone, Debug)]
struct Got {
    resource: BTreeMap<String, String>,
    span: Span,
}

impl Got {
    fn attr(&self, k: &str) -> Option<String> {
        attr(&self.span.attributes, k)
    }
    fn a(&self, k: &str) -> String {
        self.attr(k).unwrap_or_else(|| panic!("span {:?} has no attribute {k}: {:#?}", self.span.name, self.span.attributes))
    }
    fn kind(&self) -> SpanKind {
        SpanKind::try_from(self.span.kind).unwrap()
    }
}

fn attr(kvs: &[KeyValue], k: &str) -> Option<String> {
    let v = kvs.iter().find(|kv| kv.key == k)?.value.as_ref()?.value.as_ref()?;
    Some(match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Got>>>,
    api_keys: Arc<Mutex<Vec<String>>>,
    metrics: Arc<Mutex<Vec<opentelemetry_proto::tonic::metrics::v1::Metric>>>,
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut out = self.metrics.lock().unwrap();
        for rm in req.into_inner().resource_metrics {
            for sm in rm.scope_metrics {
                out.extend(sm.metrics);
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        if let Some(k) = req.metadata().get("x-api-key").and_then(|v| v.to_str().ok()) {
            self.api_keys.lock().unwrap().push(k.to_string());
        }
        let mut out = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let resource: BTreeMap<String, String> = rs
                .resource
                .map(|r| r.attributes.iter().filter_map(|kv| Some((kv.key.clone(), attr(std::slice::from_ref(kv), &kv.key)?))).collect())
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    out.push(Got { resource: resource.clone(), span });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    async fn start() -> (Collector, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let c = Collector::default();
        let svc = TraceServiceServer::new(c.clone());
        let metrics = MetricsServiceServer::new(c.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .add_service(metrics)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (c, addr)
    }

    /// The spans of `trace` (hex), once `want` of them arrived (at most 15 s).
    async fn trace(&self, trace: &str, want: usize) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let got: Vec<Got> = self.spans.lock().unwrap().iter().filter(|g| hex(&g.span.trace_id) == trace).cloned().collect();
            if got.len() >= want || Instant::now() > deadline {
                assert!(got.len() >= want, "expected {want} spans of trace {trace}, got {}: {got:#?}", got.len());
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn otlp_section(collector: &str, extra: &str) -> String {
    format!("telemetry:\n  otlp: {{endpoint: \"http://{collector}\", flush_interval: 50ms{extra}}}\n")
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_http_and_weft_attributes_for_tries_and_shadow_copies() {
    let (collector, caddr) = Collector::start().await;
    let (b, shadow, bad) = (Upstream::start("b").await, Upstream::start("shadow").await, Upstream::start("bad").await);
    bad.status.store(503, SeqCst);
    let yaml = format!(
        r#"
node: {{id: sidecar-a, team: ml, project: chat, run_id: run-42, job_type: inference}}
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - name: chat
    hosts: [chat]
    routes:
      - {{name: flaky, match: {{path_prefix: /flaky}}, cluster: bad, retry: {{attempts: 3, on: ["503"], backoff_base: 1ms, backoff_max: 2ms, budget_ratio: 1.0}}}}
      - {{name: infer, experiment: ab}}
experiments:
  - name: ab
    variants: [{{name: b, cluster: b, weight: 1, model_version: "2"}}]
    shadow: {{cluster: shadow, variant: candidate, fraction: 1.0, timeout: 3s}}
clusters:
  - {{name: b, endpoints: ["{}"]}}
  - {{name: shadow, endpoints: ["{}"]}}
  - {{name: bad, endpoints: ["{}"]}}
{}"#,
        b.addr,
        shadow.addr,
        bad.addr,
        otlp_section(&caddr.to_string(), ", headers: {x-api-key: secret}, resource: {model: llama}"),
    );
    let p = start_proxy(&yaml);
    let c = client();
    let tp = format!("00-{TRACE}-{PARENT}-01");
    let (status, h, _) =
        get(&c, p.listener_addrs[0], "chat", "/v2/models/llama/infer", &[("traceparent", &tp), ("x-tenant-id", "acme")]).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-weft-variant"], "b");

    // Server span + upstream try + shadow copy.
    let spans = collector.trace(TRACE, 3).await;
    let server = spans.iter().find(|g| g.kind() == SpanKind::Server).expect("a server span");
    assert_eq!(hex(&server.span.parent_span_id), PARENT, "the caller's span is the parent");
    assert_eq!(server.span.name, "GET infer");
    for (k, v) in [
        ("http.request.method", "GET"),
        ("http.response.status_code", "200"),
        ("url.path", "/v2/models/llama/infer"),
        ("server.address", "chat"),
        ("weft.service", "chat"),
        ("weft.route", "infer"),
        ("weft.experiment", "ab"),
        ("weft.variant", "b"),
        ("weft.shadow", "false"),
        ("weft.model.name", "llama"),
        ("gen_ai.request.model", "llama"),
        ("weft.model.version", "2"),
        ("weft.tenant", "acme"),
        ("weft.run_id", "run-42"),
    ] {
        assert_eq!(server.a(k), v, "server span {k}");
    }
    let r = &server.resource;
    for (k, v) in [
        ("service.name", "sidecar-a"),
        ("weft.team", "ml"),
        ("weft.project", "chat"),
        ("weft.run_id", "run-42"),
        ("weft.job_type", "inference"),
        ("model", "llama"),
    ] {
        assert_eq!(r.get(k).map(String::as_str), Some(v), "resource {k}: {r:?}");
    }
    let clients: Vec<&Got> = spans.iter().filter(|g| g.kind() == SpanKind::Client).collect();
    assert_eq!(clients.len(), 2, "{clients:#?}");
    for g in &clients {
        assert_eq!(g.span.parent_span_id, server.span.span_id, "tries and copies are children of the server span");
        assert_eq!(hex(&g.span.trace_id), TRACE);
        assert_eq!(g.a("http.response.status_code"), "200");
        assert_eq!(g.a("server.address"), "127.0.0.1");
        assert_eq!(g.a("weft.experiment"), "ab");
        assert_eq!(g.a("weft.tenant"), "acme");
    }
    let attempt = clients.iter().find(|g| g.a("weft.shadow") == "false").expect("the upstream try");
    assert_eq!((attempt.a("weft.variant"), attempt.a("server.port")), ("b".to_string(), b.addr.port().to_string()));
    assert_eq!(attempt.a("network.peer.address"), "127.0.0.1");
    let copy = clients.iter().find(|g| g.a("weft.shadow") == "true").expect("the shadow copy");
    assert_eq!((copy.a("weft.variant"), copy.a("weft.cluster")), ("candidate".to_string(), "shadow".to_string()));
    assert_eq!(copy.a("server.port"), shadow.addr.port().to_string());

    // Retries: one client span per try, the resends numbered; the server span is an error.
    let trace2 = "0af7651916cd43dd8448eb211c80319c";
    let tp2 = format!("00-{trace2}-b7ad6b7169203331-01");
    let (status, _, _) = get(&c, p.listener_addrs[0], "chat", "/flaky", &[("traceparent", &tp2)]).await;
    assert_eq!(status, 503);
    let spans = collector.trace(trace2, 4).await;
    let server = spans.iter().find(|g| g.kind() == SpanKind::Server).unwrap();
    assert_eq!((server.a("weft.route"), server.a("http.response.status_code"), server.a("weft.retries")), ("flaky".into(), "503".into(), "2".into()));
    assert_eq!(server.span.status.as_ref().unwrap().code, SpanStatus::Error as i32);
    let mut resends: Vec<Option<String>> =
        spans.iter().filter(|g| g.kind() == SpanKind::Client).map(|g| g.attr("http.request.resend_count")).collect();
    resends.sort();
    assert_eq!(resends, vec![None, Some("1".into()), Some("2".into())]);
    assert!(spans.iter().filter(|g| g.kind() == SpanKind::Client).all(|g| g.a("http.response.status_code") == "503"
        && g.span.parent_span_id == server.span.span_id));
    assert!(collector.api_keys.lock().unwrap().iter().all(|k| k == "secret"), "configured headers go as gRPC metadata");
    assert!(!collector.api_keys.lock().unwrap().is_empty());

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = admin_get(p.admin_addr, "/metrics").await.1;
        let exported = metric_sum(&m, "weft_otlp_exported_spans_total", &[]);
        if exported >= 7.0 || Instant::now() > deadline {
            assert!(exported >= 7.0, "exported counter: {m}");
            assert_eq!(metric_sum(&m, "weft_otlp_dropped_spans_total", &[]), 0.0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_chained_sidecars_make_one_trace() {
    let (collector, caddr) = Collector::start().await;
    let model = Upstream::start("model").await;
    let inbound = start_proxy(&format!(
        r#"
node: {{id: sidecar-2}}
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: in, address: "127.0.0.1:0", direction: inbound}}]
services: [{{name: m, hosts: ["*"], routes: [{{name: local, cluster: model}}]}}]
clusters: [{{name: model, endpoints: ["{}"]}}]
{}"#,
        model.addr,
        otlp_section(&caddr.to_string(), ""),
    ));
    let outbound = start_proxy(&format!(
        r#"
node: {{id: sidecar-1}}
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: m, hosts: [m], routes: [{{name: remote, cluster: peer}}]}}]
clusters: [{{name: peer, endpoints: ["{}"]}}]
{}"#,
        inbound.listener_addrs[0],
        otlp_section(&caddr.to_string(), ""),
    ));
    // No traceparent: sidecar 1 starts the trace.
    let (status, _, body) = get(&client(), outbound.listener_addrs[0], "m", "/headers", &[]).await;
    assert_eq!(status, 200);
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let tp = seen["traceparent"].as_str().expect("the model server gets a traceparent").to_string();
    let trace = tp[3..35].to_string();
    let spans = collector.trace(&trace, 4).await;
    let by = |node: &str, kind: SpanKind| -> Got {
        let v: Vec<&Got> = spans.iter().filter(|g| g.resource["service.name"] == node && g.kind() == kind).collect();
        assert_eq!(v.len(), 1, "{node} {kind:?}: {spans:#?}");
        v[0].clone()
    };
    let (s1, a1) = (by("sidecar-1", SpanKind::Server), by("sidecar-1", SpanKind::Client));
    let (s2, a2) = (by("sidecar-2", SpanKind::Server), by("sidecar-2", SpanKind::Client));
    assert!(s1.span.parent_span_id.is_empty(), "sidecar 1 started the trace");
    assert_eq!(a1.span.parent_span_id, s1.span.span_id);
    assert_eq!(s2.span.parent_span_id, a1.span.span_id, "sidecar 2's server span is a child of sidecar 1's try");
    assert_eq!(a2.span.parent_span_id, s2.span.span_id);
    assert_eq!(hex(&a2.span.span_id), &tp[36..52], "the model server's parent is sidecar 2's try");
    assert!(tp.ends_with("-01"), "sampled: {tp}");
    for g in [&s1, &a1, &s2, &a2] {
        assert_eq!(hex(&g.span.trace_id), trace);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_caller_then_the_ratio() {
    let (collector, caddr) = Collector::start().await;
    let up = Upstream::start("up").await;
    let p = start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, cluster: c}}]}}]
clusters: [{{name: c, endpoints: ["{}"]}}]
{}"#,
        up.addr,
        otlp_section(&caddr.to_string(), ", sample_ratio: 0.0"),
    ));
    let c = client();
    // A new trace under ratio 0: not sampled, and the upstream is told so.
    let (_, _, body) = get(&c, p.listener_addrs[0], "s", "/headers", &[]).await;
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let unsampled = seen["traceparent"].as_str().unwrap().to_string();
    assert!(unsampled.ends_with("-00"), "{unsampled}");
    // The caller sampled it: traced whatever the ratio.
    let (status, _, _) = get(&c, p.listener_addrs[0], "s", "/x", &[("traceparent", &format!("00-{TRACE}-{PARENT}-01"))]).await;
    assert_eq!(status, 200);
    collector.trace(TRACE, 2).await;
    // Spans go out in order, so the unsampled request's would have arrived by now.
    assert!(collector.spans.lock().unwrap().iter().all(|g| hex(&g.span.trace_id) == TRACE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_down_drops_spans_not_requests() {
    let up = Upstream::start("up").await;
    // Port 1 is never listened on: every export fails at once.
    let p = start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, cluster: c}}]}}]
clusters: [{{name: c, endpoints: ["{}"]}}]
{}"#,
        up.addr,
        otlp_section("127.0.0.1:1", ", queue: 2, batch: 1, timeout: 1s"),
    ));
    let c = client();
    for _ in 0..100 {
        let (status, _, body) = get(&c, p.listener_addrs[0], "s", "/", &[]).await;
        assert_eq!((status, &body[..]), (http::StatusCode::OK, &b"up"[..]));
    }
    assert_eq!(up.hits(), 100);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = admin_get(p.admin_addr, "/metrics").await.1;
        let dropped = metric_sum(&m, "weft_otlp_dropped_spans_total", &[]);
        let full = metric_sum(&m, "weft_otlp_dropped_spans_total", &[("reason", "queue_full")]);
        // 200 spans (server + try per request): a 2-span queue behind a dead collector
        // cannot hold them; the ones it took fail to export and are counted too (all but the two
        // it may still hold while backing off).
        if (dropped >= 198.0 && full > 0.0) || Instant::now() > deadline {
            assert!(full > 0.0 && dropped >= 198.0, "{m}");
            assert_eq!(metric_sum(&m, "weft_otlp_exported_spans_total", &[]), 0.0);
            assert_eq!(metric_sum(&m, "weft_requests_total", &[("status_class", "2xx")]), 100.0);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_turns_export_on_and_rejects_a_bad_section() {
    let (collector, caddr) = Collector::start().await;
    let up = Upstream::start("up").await;
    let base = format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: [s], routes: [{{name: r, cluster: c}}]}}]
clusters: [{{name: c, endpoints: ["{}"]}}]
"#,
        up.addr
    );
    let p = start_proxy(&base);
    let c = client();
    let off = "0af7651916cd43dd8448eb211c80319c";
    get(&c, p.listener_addrs[0], "s", "/", &[("traceparent", &format!("00-{off}-{PARENT}-01"))]).await;
    let bad = weft_proxy::Config::from_yaml(&format!("{base}{}", otlp_section(&caddr.to_string(), ", sample_ratio: 2"))).unwrap();
    let err = p.reload(bad).unwrap_err();
    assert!(err.starts_with("telemetry.otlp.sample_ratio:"), "{err}");
    let on = weft_proxy::Config::from_yaml(&format!("{base}{}", otlp_section(&caddr.to_string(), ""))).unwrap();
    p.reload(on).unwrap();
    get(&c, p.listener_addrs[0], "s", "/", &[("traceparent", &format!("00-{TRACE}-{PARENT}-01"))]).await;
    collector.trace(TRACE, 2).await;
    assert!(collector.spans.lock().unwrap().iter().all(|g| hex(&g.span.trace_id) == TRACE), "nothing exported while off");
}

/// The control plane's side: `PUT /v1/clusters/c1` with a `traceparent` shows as one trace —
/// the write (SERVER, the caller's child), its Raft commit, and the push to the connected
/// sidecar until its ACK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_write_is_traced_to_the_sidecars_ack() {
    use weft_tests::procs::{ControlProc, SidecarProc, api, wait_for};
    let (collector, caddr) = Collector::start().await;
    let root = tempfile::tempdir().unwrap();
    let c = client();
    let endpoint = format!("http://{caddr}");
    let node = ControlProc::start_with(1, root.path(), true, None, &["--otlp-endpoint", &endpoint]);
    wait_for("the node leads", Duration::from_secs(20), || async { node.status(&c).await.filter(|s| s["leader"] == 1).map(|_| ()) }).await;
    let _side = SidecarProc::start("side-a", &root.path().join("side"), &[&node]);
    wait_for("the sidecar is connected", Duration::from_secs(20), || async {
        let (_, v) = api(&c, http::Method::GET, node.api, "/v1/proxies", None).await;
        v["items"].as_array().into_iter().flatten().any(|p| p["node_id"] == "side-a" && p["connected"] == true).then_some(())
    })
    .await;
    let req = http::Request::put(format!("http://{}/v1/clusters/c1", node.api))
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .body(full(r#"{"endpoints": ["127.0.0.1:9"]}"#))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::OK);
    let spans = collector.trace(TRACE, 3).await;
    let by = |name: &str| spans.iter().find(|g| g.span.name == name).unwrap_or_else(|| panic!("no {name} span: {spans:#?}")).clone();
    let write = by("PUT /v1/{kind}/{name}");
    assert_eq!(write.kind(), SpanKind::Server);
    assert_eq!(hex(&write.span.parent_span_id), PARENT, "the caller's span is the parent");
    assert_eq!((write.a("weft.kind"), write.a("weft.name"), write.a("weft.changed")), ("clusters".into(), "c1".into(), "true".into()));
    assert_eq!(write.resource.get("service.name").map(String::as_str), Some("weft-control"));
    let commit = by("raft.commit");
    assert_eq!((commit.kind(), hex(&commit.span.parent_span_id)), (SpanKind::Internal, hex(&write.span.span_id)));
    let push = by("xds.push");
    assert_eq!((push.kind(), hex(&push.span.parent_span_id)), (SpanKind::Client, hex(&write.span.span_id)));
    assert_eq!((push.a("weft.node_id"), push.a("xds.ack"), push.a("xds.type_url")), ("side-a".into(), "ACK".into(), weft_xds::typeurl::CLUSTER.into()));
    assert_eq!(push.a("xds.version"), write.a("weft.revision"), "the sidecar ACKed the write's revision");
    assert!(push.span.end_time_unix_nano >= push.span.start_time_unix_nano && push.span.start_time_unix_nano >= commit.span.start_time_unix_nano);
}

/// Metrics over OTLP: the registry `/metrics` serves, as OTLP sums, gauges and histograms with
/// the same names and labels, every `metrics_interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_registry_goes_out_over_otlp_too() {
    use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value as V};
    let (collector, caddr) = Collector::start().await;
    let up = Upstream::start("m").await;
    let yaml = format!(
        "node: {{id: side-m}}\nadmin: {{address: \"127.0.0.1:0\"}}\nlisteners: [{{name: out, address: \"127.0.0.1:0\"}}]\n\
         services: [{{name: s, hosts: [s], routes: [{{name: r, experiment: ab}}]}}]\n\
         experiments: [{{name: ab, variants: [{{name: a, cluster: m, weight: 1}}]}}]\n\
         clusters: [{{name: m, endpoints: [\"{}\"]}}]\n{}",
        up.addr,
        otlp_section(&caddr.to_string(), ", metrics_interval: 100ms")
    );
    let proxy = start_proxy(&yaml);
    let c = client();
    for _ in 0..5 {
        let (s, _, _) = get(&c, proxy.listener_addrs[0], "s", "/", &[]).await;
        assert_eq!(s, http::StatusCode::OK);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let (requests, histogram) = loop {
        let got = collector.metrics.lock().unwrap().clone();
        let requests: f64 = got
            .iter()
            .filter(|m| m.name == "weft_requests_total")
            .filter_map(|m| match &m.data {
                Some(Data::Sum(s)) if s.is_monotonic => Some(s),
                _ => None,
            })
            .flat_map(|s| s.data_points.iter())
            .filter(|p| attr(&p.attributes, "variant").as_deref() == Some("a") && attr(&p.attributes, "node").as_deref() == Some("side-m"))
            .map(|p| match p.value {
                Some(V::AsDouble(v)) => v,
                _ => 0.0,
            })
            .fold(0.0, f64::max);
        let histogram = got.iter().any(|m| {
            m.name == "weft_request_duration_seconds" && matches!(&m.data, Some(Data::Histogram(h)) if h.data_points.iter().any(|p| p.count >= 5))
        });
        if (requests >= 5.0 && histogram) || Instant::now() > deadline {
            break (requests, histogram);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(requests, 5.0, "the counter as /metrics shows it");
    assert!(histogram, "the latency histogram with its 5 samples");
    // The collector holds an export before its answer reaches the sidecar, which counts the
    // export as ok only then: wait for it.
    let text = loop {
        let text = proxy.shared.telemetry.render();
        if metric_sum(&text, "weft_otlp_metric_exports_total", &[("result", "ok")]) >= 1.0 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(metric_sum(&text, "weft_otlp_metric_exports_total", &[("result", "ok")]) >= 1.0, "{text}");
}

//! The model server simulator over real HTTP on loopback: KServe v2 infer, SSE completions,
//! error rate, and the vLLM queue gauges on /metrics.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use weft_proxy::model_sim::{ModelSim, SimOptions};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

async fn sim(opts: SimOptions) -> (ModelSim, HttpClient) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = ModelSim::start(l, opts).unwrap();
    (s, Client::builder(TokioExecutor::new()).build_http())
}

async fn call(c: &HttpClient, method: &str, url: String, body: Option<Value>) -> (StatusCode, String, String) {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.map(|b| b.to_string()).unwrap_or_default())))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    let status = resp.status();
    let ctype = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ctype, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn model_sim_infer_answers_kserve_v2_json() {
    let (s, c) = sim(SimOptions { model: "ranker".into(), latency_ms: 5.0, ..Default::default() }).await;
    let (st, _, _) = call(&c, "GET", format!("http://{}/v2/health/ready", s.addr), None).await;
    assert_eq!(st, StatusCode::OK);
    let body = json!({"id": "r1", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": [1.0]}]});
    let (st, ctype, text) = call(&c, "POST", format!("http://{}/v2/models/ranker/infer", s.addr), Some(body)).await;
    assert_eq!(st, StatusCode::OK, "{text}");
    assert_eq!(ctype, "application/json");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model_name"], "ranker");
    assert_eq!(v["id"], "r1");
    assert_eq!(v["outputs"][0]["datatype"], "FP32");
    assert_eq!(v["outputs"][0]["shape"], json!([1]));
    assert!(v["outputs"][0]["data"][0].is_f64());
    let (st, _, _) = call(&c, "POST", format!("http://{}/v2/models/other/infer", s.addr), None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn model_sim_streams_sse_tokens_then_done() {
    let opts = SimOptions { model: "llm".into(), latency_ms: 5.0, tokens_per_s: 200.0, ..Default::default() };
    let (s, c) = sim(opts).await;
    let t = Instant::now();
    let req = json!({"model": "llm", "prompt": "hi there", "max_tokens": 10, "stream": true});
    let (st, ctype, text) = call(&c, "POST", format!("http://{}/v1/completions", s.addr), Some(req)).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(ctype, "text/event-stream");
    // 9 gaps of 5 ms between tokens.
    assert!(t.elapsed() >= Duration::from_millis(45), "{:?}", t.elapsed());
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 11, "{text}");
    for e in &events[..10] {
        let v: Value = serde_json::from_str(e.strip_prefix("data: ").expect("data: prefix")).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert!(v["choices"][0]["text"].is_string());
    }
    let last: Value = serde_json::from_str(&events[9][6..]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(events[10], "data: [DONE]");

    let req = json!({"model": "llm", "prompt": "hi", "max_tokens": 3});
    let (st, _, text) = call(&c, "POST", format!("http://{}/v1/completions", s.addr), Some(req)).await;
    assert_eq!(st, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn model_sim_error_rate_one_gives_5xx() {
    let (s, c) = sim(SimOptions { model: "m".into(), latency_ms: 1.0, error_rate: 1.0, ..Default::default() }).await;
    for _ in 0..5 {
        let (st, _, _) = call(&c, "POST", format!("http://{}/v2/models/m/infer", s.addr), None).await;
        assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let req = json!({"model": "m", "prompt": "x", "stream": true});
    let (st, _, _) = call(&c, "POST", format!("http://{}/v1/completions", s.addr), Some(req)).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    let (_, _, metrics) = call(&c, "GET", format!("http://{}/metrics", s.addr), None).await;
    assert!(metrics.contains("model_sim_requests_total{model_name=\"m\",outcome=\"error\"} 6"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_sim_metrics_show_the_queue_beyond_max_concurrency() {
    let opts = SimOptions { model: "m".into(), latency_ms: 400.0, jitter_ms: 0.0, max_concurrency: 2, ..Default::default() };
    let (s, c) = sim(opts).await;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (c, url) = (c.clone(), format!("http://{}/v2/models/m/infer", s.addr));
        tasks.push(tokio::spawn(async move { call(&c, "POST", url, None).await.0 }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (st, ctype, metrics) = call(&c, "GET", format!("http://{}/metrics", s.addr), None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(ctype.starts_with("text/plain"));
    assert!(metrics.contains("# TYPE vllm:num_requests_waiting gauge"), "{metrics}");
    assert!(metrics.contains("vllm:num_requests_running{model_name=\"m\"} 2"), "{metrics}");
    assert!(metrics.contains("vllm:num_requests_waiting{model_name=\"m\"} 3"), "{metrics}");
    assert!(metrics.contains("vllm:kv_cache_usage_perc{model_name=\"m\"} 1"), "{metrics}");
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    let (_, _, metrics) = call(&c, "GET", format!("http://{}/metrics", s.addr), None).await;
    assert!(metrics.contains("vllm:num_requests_waiting{model_name=\"m\"} 0"), "{metrics}");
}

/// Through a sidecar: the tokens a completion reports (plain JSON, and the usage chunk of an
/// SSE stream) and its time to first byte land in the metrics and the variant's load totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_counts_reported_tokens_and_time_to_first_byte() {
    let (s, c) = sim(SimOptions { model: "llm".into(), latency_ms: 20.0, jitter_ms: 0.0, tokens_per_s: 500.0, ..Default::default() }).await;
    let yaml = format!(
        "node: {{id: side}}\nadmin: {{address: \"127.0.0.1:0\"}}\nlisteners: [{{name: out, address: \"127.0.0.1:0\"}}]\n\
         services: [{{name: llm, hosts: [llm], routes: [{{name: r, experiment: ab}}]}}]\n\
         experiments: [{{name: ab, variants: [{{name: a, cluster: llm, weight: 1}}]}}]\n\
         clusters: [{{name: llm, endpoints: [\"{}\"]}}]\n",
        s.addr
    );
    let cfg = weft_proxy::Config::from_yaml(&yaml).unwrap();
    let proxy = weft_proxy::Proxy::start(cfg, weft_proxy::Options::default()).unwrap();
    let url = format!("http://{}/v1/completions", proxy.listener_addrs[0]);
    let send = |body: Value| {
        let req = Request::post(url.clone()).header("host", "llm").header("content-type", "application/json").body(Full::new(Bytes::from(body.to_string()))).unwrap();
        c.request(req)
    };
    let resp = send(json!({"model": "llm", "prompt": "a b c", "max_tokens": 5})).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = resp.into_body().collect().await.unwrap();
    let stream = json!({"model": "llm", "prompt": "x y", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}});
    let resp = send(stream).await.unwrap();
    let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("\"usage\"") && text.ends_with("data: [DONE]\n\n"), "{text}");
    // The totals are recorded when the body ends, just after the client read it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let totals = loop {
        let t = proxy.shared.telemetry.variant_totals();
        let v = t.get(&("ab".to_string(), "a".to_string())).cloned().unwrap_or_default();
        if v.requests == 2 || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // A streamed response is accounted when it ends (it once was not: its end-of-body hook
    // was dropped at the first frame, so streams leaked their in-flight counts).
    assert_eq!(totals.requests, 2, "{totals:?}");
    let clusters = proxy.shared.snapshot.load().clusters[0].describe();
    assert_eq!((clusters["active_requests"].as_u64(), clusters["endpoints"][0]["in_flight"].as_u64()), (Some(0), Some(0)), "{clusters}");
    assert_eq!((totals.input_tokens, totals.output_tokens), (3 + 2, 5 + 4));
    assert_eq!(totals.ttfb.count(), 2, "a time to first byte per response");
    let p50 = totals.ttfb.quantile(0.5).unwrap();
    assert!(p50 >= 19.0, "the first byte comes after the model's 20 ms latency: {p50}");
    let metrics = proxy.shared.telemetry.render();
    let tokens = |dir: &str| {
        metrics.lines().filter(|l| l.starts_with("weft_tokens_total{") && l.contains(&format!("direction=\"{dir}\""))).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>()
    };
    assert_eq!((tokens("input"), tokens("output")), (5.0, 9.0), "{metrics}");
    assert!(metrics.contains("weft_time_to_first_byte_seconds_count"), "{metrics}");
    proxy.shutdown(Duration::from_secs(1));
}

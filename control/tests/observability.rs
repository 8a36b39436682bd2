//! What operators point their tools at: `/metrics` (checked by Prometheus' own `promtool`),
//! `/healthz` and `/readyz`, grpc.health.v1 on the xDS port (a real health client), and an
//! xDS subscription to a type the control plane does not serve (an error the client sees, a
//! log line and a metric, not an empty success).

mod common;

use common::*;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One plain HTTP/1.1 request, as a scraper or a probe sends it: status and body text.
async fn get(url: &str, method: Method, path: &str) -> (StatusCode, String) {
    let mut s = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.unwrap();
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: weft\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head.split(' ').nth(1).and_then(|c| c.parse::<u16>().ok()).unwrap_or(0);
    (StatusCode::from_u16(code).unwrap(), body.to_owned())
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {line_start:?} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_unknown_xds_types() {
    let node = start().await;
    let url = node.url.as_str();
    let files = tempfile::tempdir().unwrap();
    let app = write(&files, "c.yaml", "kind: Cluster\nname: c\nspec: {endpoints: [\"127.0.0.1:9\"]}\n");
    assert_eq!(ctl(url, &["apply", "-f", &app], None).await.code, 0);
    let _ = get(url, Method::GET, "/v1/services/absent").await;

    let (status, text) = get(url, Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(metric(&text, "weft_control_raft_is_leader "), 1.0);
    assert!(metric(&text, "weft_control_raft_term ") >= 1.0);
    assert!(metric(&text, "weft_control_raft_commit_index ") >= 2.0, "the apply was committed");
    assert!(metric(&text, "weft_control_write_duration_seconds_count ") >= 1.0);
    assert!(text.contains("weft_control_api_requests_total{method=\"PUT\",route=\"/v1/{kind}/{name}\",status=\"200\"}"), "{text}");
    assert!(text.contains("weft_control_api_requests_total{method=\"GET\",route=\"/v1/{kind}/{name}\",status=\"404\"}"), "{text}");
    let (status, _) = get(url, Method::HEAD, "/metrics").await;
    assert_eq!(status, StatusCode::OK, "HEAD /metrics");

    // Prometheus' own linter reads the exposition (skipped, with a message, without promtool).
    match std::process::Command::new("promtool").args(["check", "metrics"]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn() {
        Err(e) => eprintln!("SKIP promtool check: promtool not found ({e}); install Debian's prometheus package"),
        Ok(mut child) => {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}");
        }
    }

    assert_eq!(get(url, Method::GET, "/healthz").await.0, StatusCode::OK);
    let (status, text) = get(url, Method::GET, "/readyz").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.starts_with("ready: leader 1"), "{text}");

    // grpc.health.v1 on the xDS port, with the stock client.
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.running.xds_addr)).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "envoy.service.discovery.v3.AggregatedDiscoveryService"] {
        let r = health.check(HealthCheckRequest { service: service.into() }).await.unwrap();
        assert_eq!(r.into_inner().status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // gRPC reflection on the xDS port (what grpcurl uses): every service is listed, and ADS
    // is described down to its messages.
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.running.xds_addr)).unwrap().connect().await.unwrap();
    let mut reflection = ServerReflectionClient::new(channel);
    let ask = |m: MessageRequest| {
        let req = ServerReflectionRequest { host: String::new(), message_request: Some(m) };
        tokio_stream::iter(vec![req])
    };
    let mut answers = reflection.server_reflection_info(ask(MessageRequest::ListServices(String::new()))).await.unwrap().into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) = answers.message().await.unwrap().unwrap().message_response else { panic!("no service list") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["envoy.service.discovery.v3.AggregatedDiscoveryService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "weft.v1.SidecarReports"] {
        assert!(names.iter().any(|n| n == want), "{want} not listed: {names:?}");
    }
    let ads_symbol = MessageRequest::FileContainingSymbol("envoy.service.discovery.v3.AggregatedDiscoveryService".into());
    let mut answers = reflection.server_reflection_info(ask(ads_symbol)).await.unwrap().into_inner();
    let Some(MessageResponse::FileDescriptorResponse(files)) = answers.message().await.unwrap().unwrap().message_response else { panic!("no descriptor for ADS") };
    use prost::Message;
    let names: Vec<String> = files.file_descriptor_proto.iter().map(|b| prost_types::FileDescriptorProto::decode(&b[..]).unwrap().name().to_string()).collect();
    assert!(names.iter().any(|n| n == "envoy/service/discovery/v3/ads.proto"), "{names:?}");

    // A type this control plane does not serve: the stream ends with an error naming it.
    use weft_xds::transport::{AggregatedDiscoveryServiceClient, DiscoveryRequest, Node as XdsNode};
    let made_up = "type.googleapis.com/example.v1.Nothing";
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{}", node.running.xds_addr)).await.unwrap();
    let mut responses = ads.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let node_id = XdsNode { id: "envoy-1".into(), ..Default::default() };
    tx.send(DiscoveryRequest { node: Some(node_id), type_url: made_up.into(), ..Default::default() }).await.unwrap();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), responses.message()).await.unwrap();
    let status = answer.expect_err("an error, not an empty success");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains(made_up), "{}", status.message());
    let (_, text) = get(url, Method::GET, "/metrics").await;
    assert_eq!(metric(&text, "weft_control_xds_unknown_type_requests_total "), 1.0);
    node.running.shutdown().await.unwrap();
}

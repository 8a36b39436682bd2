//! The injector's HTTPS server as the API server calls it: `POST /inject` over TLS (checked
//! against the CA that issued its certificate, by the address it is dialed at) answers the
//! AdmissionReview; `/healthz` answers its probes; plaintext is refused and TLS keeps serving.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use weft_control::ca::MeshCa;
use weft_control::tls::dial::Dialer;
use weft_control::tls::{CertSource, Serving};
use weft_k8s::inject::Settings;

async fn call(dialer: &Dialer, addr: std::net::SocketAddr, method: &str, path: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let stream = dialer.connect(&addr.to_string()).await.map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "weft-injector.weft-system.svc")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    Ok((status, resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes().to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_admission_reviews_over_tls() {
    let ca = MeshCa::generate("cluster.local", SystemTime::now(), Duration::from_secs(3600)).unwrap();
    let cert = ca.serving_cert(&["127.0.0.1".into()], SystemTime::now(), Duration::from_secs(3600)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, &cert.cert_pem).unwrap();
    std::fs::write(&key_file, &cert.key_pem).unwrap();

    let serving = Serving::new(CertSource::Files { cert: cert_file, key: key_file }, "--tls-cert/--tls-key").unwrap();
    let tls = serving.server_config(&[b"h2", b"http/1.1"]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(weft_k8s::webhook::serve(listener, tls, Arc::new(Settings::default()), stop));

    let trusting = Dialer::tls(weft_control::tls::roots(ca.cert_pem()).unwrap(), None).unwrap();
    let body = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/deployment-pod.json")).unwrap();
    let (status, out) = call(&trusting, addr, "POST", "/inject", body).await.unwrap();
    assert_eq!(status, 200);
    let review: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(review["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(review["response"]["patchType"], "JSONPatch");

    let (status, out) = call(&trusting, addr, "GET", "/healthz", vec![]).await.unwrap();
    assert_eq!((status, out.as_slice()), (200, b"ok\n".as_slice()));

    // Plaintext gets a 400 that says to use TLS, and the port keeps serving TLS.
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("tls_required"), "{answer}");
    assert_eq!(call(&trusting, addr, "GET", "/healthz", vec![]).await.unwrap().0, 200);
}

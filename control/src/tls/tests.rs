use super::*;
use crate::tls::dial::Dialer;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

fn ca() -> Arc<MeshCa> {
    Arc::new(MeshCa::generate("mesh.local", SystemTime::now(), Duration::from_secs(3600)).unwrap())
}

fn issued(ca: &Arc<MeshCa>, client_ca: Option<&MeshCa>) -> Settings {
    Settings {
        source: CertSource::Issued { ca: ca.clone(), names: vec!["127.0.0.1".into(), "localhost".into()], lifetime: ISSUED_LIFETIME },
        peer_roots_pem: ca.cert_pem().into(),
        client_roots_pem: client_ca.map(|c| c.cert_pem().to_string()),
    }
}

/// An API port answering `200 hello` over `tls`.
async fn serve(tls: &ControlTls) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let accepted = listen::accept(l, tls.api.clone(), "api").unwrap();
    let addr = axum::serve::Listener::local_addr(&accepted).unwrap();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    tokio::spawn(async move { axum::serve(accepted, app).await });
    addr
}

/// `GET /` through `dialer`: the body, or why it failed.
async fn get(dialer: &Dialer, addr: std::net::SocketAddr) -> Result<String, String> {
    let stream = dialer.connect(&addr.to_string()).await.map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("/").header("host", "x").body(Full::new(bytes::Bytes::new())).unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes()).into_owned())
}

#[tokio::test]
async fn a_node_checked_by_name_serves_and_a_stranger_or_plaintext_is_refused() {
    let ca = ca();
    let tls = ControlTls::new(&issued(&ca, None)).unwrap();
    let addr = serve(&tls).await;
    let trusting = Dialer::tls(roots(ca.cert_pem()).unwrap(), None).unwrap();
    assert_eq!(get(&trusting, addr).await.unwrap(), "hello");
    // A client trusting another root refuses the node.
    let other = MeshCa::generate("mesh.local", SystemTime::now(), Duration::from_secs(3600)).unwrap();
    let stranger = Dialer::tls(roots(other.cert_pem()).unwrap(), None).unwrap();
    let e = get(&stranger, addr).await.unwrap_err();
    // (The same CA name, another key: the signature does not check.)
    assert!(e.contains("invalid peer certificate: BadSignature"), "{e}");
    // A certificate for other names does not pass for this address.
    let named = Settings { source: CertSource::Issued { ca: ca.clone(), names: vec!["control-0.weft".into()], lifetime: ISSUED_LIFETIME }, ..issued(&ca, None) };
    let wrong_name = serve(&ControlTls::new(&named).unwrap()).await;
    let e = get(&trusting, wrong_name).await.unwrap_err();
    assert!(e.to_lowercase().contains("not valid for name") || e.contains("NotValidForName"), "{e}");
    // Plaintext is told to use https, and the port goes on serving TLS.
    let plain = get(&Dialer::default(), addr).await.unwrap();
    assert!(plain.contains("https://"), "{plain}");
    assert_eq!(get(&trusting, addr).await.unwrap(), "hello");
}

#[tokio::test]
async fn with_a_client_ca_the_api_port_wants_a_client_certificate() {
    let ca = ca();
    let tls = ControlTls::new(&issued(&ca, Some(&ca))).unwrap();
    let addr = serve(&tls).await;
    let anonymous = Dialer::tls(roots(ca.cert_pem()).unwrap(), None).unwrap();
    assert!(get(&anonymous, addr).await.is_err(), "no client certificate, no answer");
    // A peer presents its own serving certificate.
    let peer = ControlTls::new(&issued(&ca, Some(&ca))).unwrap();
    assert_eq!(get(&peer.dialer, addr).await.unwrap(), "hello");
}

#[tokio::test]
async fn changed_files_are_served_without_a_restart_and_bad_ones_are_not() {
    let ca = ca();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let write = |c: &crate::ca::ServingCert| {
        std::fs::write(&cert, &c.cert_pem).unwrap();
        std::fs::write(&key, &c.key_pem).unwrap();
    };
    let names = ["127.0.0.1".to_string()];
    write(&ca.serving_cert(&names, SystemTime::now(), Duration::from_secs(3600)).unwrap());
    let s = Settings { source: CertSource::Files { cert: cert.clone(), key: key.clone() }, ..issued(&ca, None) };
    let tls = Arc::new(ControlTls::new(&s).unwrap());
    let first = tls.serving.current.not_after();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(tls.clone().keep_fresh(stop));
    // A garbage pair is logged and the old certificate keeps serving.
    std::fs::write(&key, "garbage").unwrap();
    tokio::time::sleep(CHECK_EVERY + Duration::from_secs(1)).await;
    assert_eq!(tls.serving.current.not_after(), first);
    write(&ca.serving_cert(&names, SystemTime::now(), Duration::from_secs(7200)).unwrap());
    tokio::time::sleep(CHECK_EVERY + Duration::from_secs(1)).await;
    assert!(tls.serving.current.not_after() > first + Duration::from_secs(3000), "the new certificate serves");
    let addr = serve(&tls).await;
    assert_eq!(get(&Dialer::tls(roots(ca.cert_pem()).unwrap(), None).unwrap(), addr).await.unwrap(), "hello");
}

#[test]
fn bad_settings_name_the_flag() {
    let ca = ca();
    let s = Settings { source: CertSource::Files { cert: "/nonexistent/tls.crt".into(), key: "/nonexistent/tls.key".into() }, ..issued(&ca, None) };
    assert!(ControlTls::new(&s).err().unwrap().starts_with("--tls-cert/--tls-key: /nonexistent/tls.crt"));
    let s = Settings { peer_roots_pem: "nothing".into(), ..issued(&ca, None) };
    assert!(ControlTls::new(&s).err().unwrap().starts_with("--tls-ca:"));
    let s = Settings { client_roots_pem: Some("nothing".into()), ..issued(&ca, None) };
    assert!(ControlTls::new(&s).err().unwrap().starts_with("--tls-client-ca:"));
}

//! Mutual TLS between sidecars, with certificates from weft's own mesh CA
//! (`weft_control::ca::MeshCa`) written to files as an outside issuer would: two sidecars speak
//! mTLS over HTTP/1.1 and HTTP/2 (SSE streams too) and the inbound one sees the caller's SPIFFE
//! ID; a plaintext client on a strict port is refused and a permissive port takes both; each
//! bad client certificate (expired, another CA's, another trust domain's, no URI SAN, none at
//! all) is refused with its reason counted, and good clients keep being served; a server with
//! the wrong identity is refused by the client side; rewritten files rotate the credentials
//! under load without losing a request; plain TLS: an ingress listener terminates it and a
//! cluster originates it to an upstream outside the mesh, checked by name; a WebSocket crosses
//! the mTLS hop over HTTP/1.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use weft_control::ca::MeshCa;
use weft_proxy::identity::SpiffeId;
use weft_proxy::tls::{Credentials, Expect};
use weft_tests::*;

const TD: &str = "mesh.local";
const MODEL: &str = "spiffe://mesh.local/service/model";
const WEB: &str = "spiffe://mesh.local/ns/apps/sa/web";

/// A mesh CA and a directory for the files sidecars read.
struct Pki {
    ca: MeshCa,
    dir: tempfile::TempDir,
}

fn now() -> SystemTime {
    SystemTime::now()
}

/// A leaf for `id` from `ca`, issued at `at` for `life`: (cert PEM, key PEM).
fn leaf(ca: &MeshCa, id: &str, at: SystemTime, life: Duration) -> (String, String) {
    let id: SpiffeId = id.parse().unwrap();
    let req = weft_proxy::identity::request(&id).unwrap();
    (ca.sign(&req.csr_pem, &id, at, life).unwrap().cert_pem, req.key_pem)
}

impl Pki {
    fn new() -> Pki {
        Pki { ca: MeshCa::generate(TD, now(), Duration::from_secs(86_400)).unwrap(), dir: tempfile::tempdir().unwrap() }
    }

    fn path(&self, name: &str, what: &str) -> String {
        self.dir.path().join(format!("{name}-{what}.pem")).display().to_string()
    }

    /// Write `name`'s credentials (a leaf for `id` issued at `at`) and the root.
    fn write(&self, name: &str, id: &str, at: SystemTime) {
        let (cert, key) = leaf(&self.ca, id, at, Duration::from_secs(3600));
        // Key first: a reader seeing the new cert with the old key would refuse the pair
        // (and keep the old credentials until the next change).
        std::fs::write(self.path(name, "key"), key).unwrap();
        std::fs::write(self.path(name, "cert"), cert).unwrap();
        std::fs::write(self.path(name, "ca"), self.ca.cert_pem()).unwrap();
    }

    /// The `identity:` section for `name`, after writing its files.
    fn identity(&self, name: &str, id: &str) -> String {
        self.write(name, id, now());
        format!(
            "identity: {{spiffe_id: \"{id}\", cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\"}}",
            self.path(name, "cert"),
            self.path(name, "key"),
            self.path(name, "ca")
        )
    }
}

/// An inbound sidecar in front of `up`, with identity MODEL; `tls` is its listener's tls block.
fn inbound(pki: &Pki, up: SocketAddr, tls: &str, log: &str) -> weft_proxy::Proxy {
    start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
{identity}
listeners: [{{name: in, address: "127.0.0.1:0", direction: inbound{tls}}}]
services: [{{name: model, hosts: ["*"], routes: [{{name: r, cluster: local}}]}}]
clusters: [{{name: local, endpoints: ["{up}"]}}]
telemetry: {{access_log: {{enabled: true, path: "{log}"}}}}
"#,
        identity = pki.identity("model", MODEL),
    ))
}

/// An outbound sidecar with identity WEB: host `model` over HTTP/1.1, `model-h2` over HTTP/2 and
/// `model-fresh` over HTTP/1.1 on a new connection per request, all mTLS to `to`, expecting
/// `expect`.
fn outbound(pki: &Pki, to: SocketAddr, expect: &str, cluster_extra: &str) -> weft_proxy::Proxy {
    start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
{identity}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services:
  - {{name: m, hosts: ["model"], routes: [{{name: r, cluster: model}}]}}
  - {{name: m2, hosts: ["model-h2"], routes: [{{name: r, cluster: model-h2}}]}}
  - {{name: m3, hosts: ["model-fresh"], routes: [{{name: r, cluster: model-fresh, timeout: 10s}}]}}
clusters:
  - {{name: model, endpoints: ["{to}"], tls: {{identities: ["{expect}"]}}{cluster_extra}}}
  - {{name: model-h2, protocol: http2, endpoints: ["{to}"], tls: {{identities: ["{expect}"]}}}}
  # No idle connection kept: each request opens one, shaking hands with the credentials of
  # the moment.
  - {{name: model-fresh, endpoints: ["{to}"], tls: {{identities: ["{expect}"]}}, max_idle_per_endpoint: 0, connect_timeout: 5s}}
"#,
        identity = pki.identity("web", WEB),
    ))
}

async fn metrics(p: &weft_proxy::Proxy) -> String {
    admin_get(p.admin_addr, "/metrics").await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_speak_mtls_over_http1_and_http2_and_the_callee_sees_the_callers_id() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let log = pki.dir.path().join("access.log");
    let inp = inbound(&pki, up.addr, "", &log.display().to_string());
    let out = outbound(&pki, inp.listener_addrs[0], MODEL, "");
    let c = client();
    for host in ["model", "model-h2"] {
        let (s, h, b) = get(&c, out.listener_addrs[0], host, "/", &[]).await;
        assert_eq!((s, &b[..]), (http::StatusCode::OK, &b"model-a"[..]), "{host}: {h:?}");
        // A token stream arrives whole, event by event.
        let (s, _, b) = get(&c, out.listener_addrs[0], host, "/sse?n=5&gap_ms=20", &[]).await;
        assert_eq!(s, http::StatusCode::OK);
        let text = String::from_utf8_lossy(&b);
        assert_eq!(text.matches("data: token-").count(), 5, "{host}: {text}");
    }
    let m = metrics(&inp).await;
    assert!(metric_sum(&m, "weft_downstream_connections_total", &[("listener", "in"), ("tls", "mtls")]) >= 2.0, "{m}");
    assert_eq!(metric_sum(&m, "weft_downstream_connections_total", &[("tls", "plaintext")]), 0.0);
    let mo = metrics(&out).await;
    assert!(metric_sum(&mo, "weft_tls_handshakes_total", &[("side", "client"), ("result", "ok")]) >= 2.0, "{mo}");
    assert!(metric_sum(&mo, "weft_tls_certificate_expiry_timestamp_seconds", &[("identity", WEB)]) > 0.0, "{mo}");
    // The inbound's access log names the caller and how it came.
    let text = wait_for_log(&log, WEB).await;
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!((line["tls"].as_str(), line["peer_identity"].as_str()), (Some("mtls"), Some(WEB)), "{line}");
}

async fn wait_for_log(path: &std::path::Path, needle: &str) -> String {
    weft_tests::procs::wait_for("the access log line", Duration::from_secs(5), || async {
        std::fs::read_to_string(path).ok().filter(|t| t.contains(needle))
    })
    .await
}

/// GET / on a TLS connection made with `cfg`; the status, or why it failed.
async fn tls_get(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> Result<http::StatusCode, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg).connect(ServerName::try_from("model").unwrap(), tcp).await.map_err(|e| format!("handshake: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let req = http::Request::get("/").header("host", "model").body(full("")).unwrap();
    let resp = send.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    Ok(resp.status())
}

fn client_cfg(cert: &str, key: &str, roots: &str) -> Arc<rustls::ClientConfig> {
    let creds = Credentials::from_pem(cert, key, roots).unwrap();
    weft_proxy::tls::client_config(&creds, Expect::one(MODEL.parse().unwrap()), b"http/1.1").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_refused_on_a_strict_port_and_a_permissive_port_takes_both() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let log = pki.dir.path().join("a.log").display().to_string();
    let strict = inbound(&pki, up.addr, "", &log);
    let c = client();
    let (s, h, b) = get(&c, strict.listener_addrs[0], "model", "/", &[]).await;
    assert_eq!(s, http::StatusCode::BAD_REQUEST);
    assert_eq!(h.get("x-weft-error").and_then(|v| v.to_str().ok()), Some("tls_required"));
    assert!(String::from_utf8_lossy(&b).contains("requires mutual TLS"), "{b:?}");
    let m = metrics(&strict).await;
    assert_eq!(metric_sum(&m, "weft_tls_handshakes_total", &[("side", "server"), ("result", "plaintext")]), 1.0, "{m}");
    assert_eq!(up.hits(), 0, "nothing reached the model server");

    let permissive = inbound(&pki, up.addr, ", tls: {mode: permissive}", &log);
    let addr = permissive.listener_addrs[0];
    assert_eq!(get(&c, addr, "model", "/", &[]).await.0, http::StatusCode::OK);
    let (cert, key) = leaf(&pki.ca, WEB, now(), Duration::from_secs(600));
    assert_eq!(tls_get(addr, client_cfg(&cert, &key, pki.ca.cert_pem())).await, Ok(http::StatusCode::OK));
    let m = metrics(&permissive).await;
    for tls in ["mtls", "plaintext"] {
        assert_eq!(metric_sum(&m, "weft_downstream_connections_total", &[("listener", "in"), ("tls", tls)]), 1.0, "{tls}: {m}");
    }
}

/// A certificate for DNS name `name` only (no URI SAN), signed by `ca`'s key, for `usage`.
fn dns_leaf(ca: &MeshCa, name: &str, usage: rcgen::ExtendedKeyUsagePurpose) -> (String, String) {
    use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, pem::PemObject};
    let ca_key = rcgen::KeyPair::try_from(&PrivatePkcs8KeyDer::from_pem_slice(ca.key_pem().as_bytes()).unwrap()).unwrap();
    let ca_der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, &issuer).unwrap();
    let pem = |label, der: &[u8]| weft_proxy::identity::pem_encode(label, der);
    (pem("CERTIFICATE", cert.der()), pem("PRIVATE KEY", &key.serialize_der()))
}

/// Accepts any server: for a client that must get as far as the server's check of its own
/// (missing) certificate.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(&self, m: &[u8], c: &rustls::pki_types::CertificateDer<'_>, d: &rustls::DigitallySignedStruct) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(&self, m: &[u8], c: &rustls::pki_types::CertificateDer<'_>, d: &rustls::DigitallySignedStruct) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_client_certificate_is_refused_with_its_reason_and_good_clients_carry_on() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let log = pki.dir.path().join("a.log").display().to_string();
    let inp = inbound(&pki, up.addr, "", &log);
    let addr = inp.listener_addrs[0];
    let root = pki.ca.cert_pem();
    let good = || {
        let (cert, key) = leaf(&pki.ca, WEB, now(), Duration::from_secs(600));
        client_cfg(&cert, &key, root)
    };
    assert_eq!(tls_get(addr, good()).await, Ok(http::StatusCode::OK));

    let rogue = MeshCa::generate(TD, now(), Duration::from_secs(86_400)).unwrap();
    // The same root and key, signing for another trust domain.
    let other_td = MeshCa::from_pem("other.mesh", pki.ca.cert_pem(), pki.ca.key_pem()).unwrap();
    let provider = weft_proxy::identity::crypto_provider();
    let anonymous = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    let cases: Vec<(&str, Arc<rustls::ClientConfig>, &[&str])> = vec![
        ("expired", {
            let (c, k) = leaf(&pki.ca, WEB, now() - Duration::from_secs(7200), Duration::from_secs(3600));
            client_cfg(&c, &k, root)
        }, &["expired"]),
        ("another CA's", {
            let (c, k) = leaf(&rogue, WEB, now(), Duration::from_secs(600));
            client_cfg(&c, &k, root)
        }, &["bad_signature", "unknown_issuer"]),
        ("another trust domain's", {
            let (c, k) = leaf(&other_td, "spiffe://other.mesh/ns/apps/sa/web", now(), Duration::from_secs(600));
            client_cfg(&c, &k, root)
        }, &["wrong_trust_domain"]),
        ("without a URI SAN", {
            let (c, k) = dns_leaf(&pki.ca, "web.apps", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
            let creds = Credentials::from_pem(&c, &k, root).unwrap();
            weft_proxy::tls::client_config(&creds, Expect::one(MODEL.parse().unwrap()), b"http/1.1").unwrap()
        }, &["no_spiffe_id"]),
        ("absent", Arc::new(anonymous), &["no_client_certificate"]),
    ];
    for (what, cfg, reasons) in cases {
        let before = metrics(&inp).await;
        let count = |m: &str| reasons.iter().map(|r| metric_sum(m, "weft_tls_handshakes_total", &[("side", "server"), ("result", r)])).sum::<f64>();
        let got = tls_get(addr, cfg).await;
        assert!(got.is_err(), "a client certificate {what} was accepted: {got:?}");
        // Counted once the server's side of the handshake ended (after the alert the client read).
        let counted = weft_tests::procs::wait_for(&format!("{what}: counted as one of {reasons:?}"), Duration::from_secs(5), || async {
            let after = metrics(&inp).await;
            (count(&after) > count(&before)).then_some(count(&after) - count(&before))
        })
        .await;
        assert_eq!(counted, 1.0, "{what}");
        // Everyone else is still served.
        assert_eq!(tls_get(addr, good()).await, Ok(http::StatusCode::OK), "after the {what} one");
    }
    assert_eq!(up.hits(), 6, "only the good clients' requests reached the model server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_another_identity_is_refused_by_the_calling_sidecar() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let log = pki.dir.path().join("a.log").display().to_string();
    let inp = inbound(&pki, up.addr, "", &log);
    let out = outbound(&pki, inp.listener_addrs[0], "spiffe://mesh.local/service/billing", "");
    let (s, h, b) = get(&client(), out.listener_addrs[0], "model", "/", &[]).await;
    assert_eq!(s, http::StatusCode::SERVICE_UNAVAILABLE, "{h:?} {b:?}");
    let body = String::from_utf8_lossy(&b);
    assert!(body.contains("is not the expected spiffe://mesh.local/service/billing"), "{body}");
    let m = metrics(&out).await;
    assert!(metric_sum(&m, "weft_tls_handshakes_total", &[("side", "client"), ("result", "wrong_identity")]) >= 1.0, "{m}");
    assert_eq!(up.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_credentials_rotate_under_load_without_losing_a_request() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let log = pki.dir.path().join("a.log").display().to_string();
    let inp = inbound(&pki, up.addr, "", &log);
    // Pooled connections carry most requests (they stay open across rotations); every tenth
    // request opens a new connection (`model-fresh`), shaking hands with the credentials of
    // the moment.
    let out = outbound(&pki, inp.listener_addrs[0], MODEL, "");
    let addr = out.listener_addrs[0];
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (sent, failed) = (sent.clone(), failed.clone());
        tokio::spawn(async move {
            let c = client();
            // 200 requests a second for 10 s.
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            for i in 0..2000 {
                tick.tick().await;
                let c = c.clone();
                let (sent, failed) = (sent.clone(), failed.clone());
                let host = if i % 10 == 0 { "model-fresh" } else { "model" };
                tokio::spawn(async move {
                    sent.fetch_add(1, SeqCst);
                    if get(&c, addr, host, "/", &[]).await.0 != http::StatusCode::OK {
                        failed.fetch_add(1, SeqCst);
                    }
                });
            }
        })
    };
    let issued = |m: &str, id: &str| metric_sum(m, "weft_tls_certificate_issued_timestamp_seconds", &[("identity", id)]);
    let first = (issued(&metrics(&inp).await, MODEL), issued(&metrics(&out).await, WEB));
    for i in 1..=3u64 {
        // Files are checked every second and loaded once unchanged for a check.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // Each leaf issued a few seconds later than the last, so the two are told apart.
        let at = now() + Duration::from_secs(5 * i);
        pki.write("model", MODEL, at);
        pki.write("web", WEB, at);
    }
    load.await.unwrap();
    weft_tests::procs::wait_for("every request answered", Duration::from_secs(10), || async {
        (sent.load(SeqCst) == 2000 && up.hits() + failed.load(SeqCst) >= 2000).then_some(())
    })
    .await;
    assert_eq!(failed.load(SeqCst), 0, "requests lost during rotation");
    for (p, id, was) in [(&inp, MODEL, first.0), (&out, WEB, first.1)] {
        let m = metrics(p).await;
        assert_eq!(metric_sum(&m, "weft_tls_credential_reloads_total", &[("result", "failed")]), 0.0, "{m}");
        assert!(metric_sum(&m, "weft_tls_credential_reloads_total", &[("result", "rotated")]) >= 3.0, "{id}: {m}");
        assert!(issued(&m, id) >= was + 14.0, "{id} serves the last leaf: {} vs {was}", issued(&m, id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_terminates_tls_and_a_cluster_originates_it_checked_by_name() {
    let pki = Pki::new();
    let up = Upstream::start("model-a").await;
    let (cert, key) = dns_leaf(&pki.ca, "model.example", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let (cert_path, key_path, ca_path) = (pki.path("ingress", "cert"), pki.path("ingress", "key"), pki.path("ingress", "ca"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    std::fs::write(&ca_path, pki.ca.cert_pem()).unwrap();
    let ingress = start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: edge, address: "127.0.0.1:0", tls: {{mode: terminate, cert_file: "{cert_path}", key_file: "{key_path}"}}}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, cluster: local}}]}}]
clusters: [{{name: local, endpoints: ["{}"]}}]
"#,
        up.addr
    ));
    let edge = ingress.listener_addrs[0];
    let caller = |sni: &str| {
        start_proxy(&format!(
            r#"
admin: {{address: "127.0.0.1:0"}}
listeners: [{{name: out, address: "127.0.0.1:0"}}]
services: [{{name: s, hosts: ["*"], routes: [{{name: r, cluster: edge}}]}}]
clusters: [{{name: edge, endpoints: ["{edge}"], tls: {{mode: simple, sni: "{sni}", ca_file: "{ca_path}"}}}}]
"#
        ))
    };
    let good = caller("model.example");
    let (s, _, b) = get(&client(), good.listener_addrs[0], "model", "/", &[]).await;
    assert_eq!((s, &b[..]), (http::StatusCode::OK, &b"model-a"[..]));
    let m = metrics(&ingress).await;
    assert_eq!(metric_sum(&m, "weft_downstream_connections_total", &[("listener", "edge"), ("tls", "tls")]), 1.0, "{m}");
    // Plaintext to the TLS-only ingress: refused, saying TLS (not mutual TLS) is required.
    let (s, _, b) = get(&client(), edge, "model", "/", &[]).await;
    assert_eq!(s, http::StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&b).contains("requires TLS"), "{b:?}");
    // A name the certificate does not hold: the caller refuses the server.
    let wrong = caller("other.example");
    let (s, _, b) = get(&client(), wrong.listener_addrs[0], "model", "/", &[]).await;
    assert_eq!(s, http::StatusCode::SERVICE_UNAVAILABLE, "{b:?}");
    let m = metrics(&wrong).await;
    assert_eq!(metric_sum(&m, "weft_tls_handshakes_total", &[("side", "client"), ("result", "wrong_name")]), 1.0, "{m}");
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_crosses_the_mtls_hop_over_http1() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    // A WebSocket echo server behind the inbound sidecar.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws_addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                if let Ok(ws) = tokio_tungstenite::accept_async(s).await {
                    let (mut tx, mut rx) = ws.split();
                    while let Some(Ok(m)) = rx.next().await {
                        if (m.is_text() || m.is_binary()) && tx.send(m).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    let pki = Pki::new();
    let log = pki.dir.path().join("a.log").display().to_string();
    let inp = start_proxy(&format!(
        r#"
admin: {{address: "127.0.0.1:0"}}
{identity}
listeners: [{{name: in, address: "127.0.0.1:0", direction: inbound}}]
services: [{{name: model, hosts: ["*"], routes: [{{name: r, cluster: local}}]}}]
clusters: [{{name: local, endpoints: ["{ws_addr}"]}}]
telemetry: {{access_log: {{enabled: true, path: "{log}"}}}}
"#,
        identity = pki.identity("model", MODEL),
    ));
    let out = outbound(&pki, inp.listener_addrs[0], MODEL, "");
    let tcp = tokio::net::TcpStream::connect(out.listener_addrs[0]).await.unwrap();
    let req = "ws://model/v1/stream".into_client_request().unwrap();
    let (mut ws, resp) = tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::client_async(req, tcp)).await.unwrap().unwrap();
    assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..20 {
        ws.send(Message::text(format!("token {i}"))).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), format!("token {i}"));
    }
    let big = vec![7u8; 300_000];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(got.into_data().len(), big.len());
    ws.close(None).await.unwrap();
    let m = metrics(&inp).await;
    assert_eq!(metric_sum(&m, "weft_downstream_connections_total", &[("listener", "in"), ("tls", "mtls")]), 1.0, "{m}");
    assert!(metric_sum(&m, "weft_tunnel_bytes_total", &[]) >= 300_000.0, "{m}");
}

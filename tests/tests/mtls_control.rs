//! Workload certificates from weft-control, end to end with the real binaries: `weftctl`
//! makes a join token per identity; each sidecar makes its own key, gets its leaf through the
//! `Identity/Sign` RPC and keeps the key to itself (mode 0600, never in the control plane's
//! data); the outbound sidecar reaches the inbound one over mTLS with a cluster pushed over
//! xDS; certificates with a 30 s lifetime rotate three times under 200 requests a second
//! without losing one; with the control plane down, traffic goes on until the leaf expires,
//! the expiry is visible, and issuance resumes when it returns; an authorization policy
//! applied through the API admits one caller's identity and refuses another's (403), and
//! `weftctl proxy-status` shows each sidecar's certificate expiry; a revoked identity is
//! refused in the handshake and its token revoked.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use serde_json::{Value, json};
use weft_tests::procs::{ControlProc, SidecarProc, api, wait_for, weftctl};
use weft_tests::*;

const MODEL: &str = "spiffe://mesh.local/service/model";
const WEB: &str = "spiffe://mesh.local/ns/apps/sa/web";

async fn control(root: &Path, lifetime: &str) -> ControlProc {
    let c = client();
    let node = ControlProc::start_with(1, root, true, None, &["--trust-domain", "mesh.local", "--leaf-lifetime", lifetime]);
    wait_for("the control node leads and has a CA", Duration::from_secs(20), || async {
        let (s, _) = api(&c, Method::GET, node.api, "/v1/identity/ca", None).await;
        (s == StatusCode::OK).then_some(())
    })
    .await;
    node
}

/// A join token for `identity`, written to `dir/name.token`.
fn token(node: &ControlProc, identity: &str, dir: &Path, name: &str) -> std::path::PathBuf {
    let out: Value = serde_json::from_str(&weftctl(node, &["identity", "token", "create", "--identity", identity, "-o", "json"])).unwrap();
    assert_eq!(out["identity"], identity);
    let path = dir.join(format!("{name}.token"));
    std::fs::write(&path, out["token"].as_str().unwrap()).unwrap();
    std::fs::write(path.with_extension("id"), identity).unwrap();
    path
}

fn identity(id: &str, token: &Path, dir: &Path) -> String {
    format!("identity: {{spiffe_id: \"{id}\", token_file: \"{}\", dir: \"{}\"}}\n", token.display(), dir.display())
}

struct Mesh {
    node: ControlProc,
    inbound: SidecarProc,
    outbound: SidecarProc,
    up: Arc<Upstream>,
    dir: tempfile::TempDir,
}

/// A control node, an inbound sidecar in front of a model server (registered as an endpoint of
/// cluster `model`), and an outbound one; `model` is mTLS (pushed over xDS), and so is
/// `model-fresh`, the same endpoint keeping no idle connection, so each of its requests shakes
/// hands with the certificates of the moment.
async fn mesh(lifetime: &str) -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let node = control(dir.path(), lifetime).await;
    let c = client();
    for (path, spec) in [
        ("/v1/clusters/model", json!({"endpoints": [], "tls": {"identities": [MODEL]}, "connect_timeout": "5s"})),
        // The same endpoint on a new connection per request (its address is added below).
        ("/v1/clusters/model-fresh", json!({"endpoints": [], "tls": {"identities": [MODEL]}, "max_idle_per_endpoint": 0, "connect_timeout": "5s"})),
        ("/v1/services/s", json!({"hosts": ["model"], "listeners": ["out"], "routes": [{"name": "r", "cluster": "model", "timeout": "10s"}]})),
        ("/v1/services/s-fresh", json!({"hosts": ["model-fresh"], "listeners": ["out"], "routes": [{"name": "r", "cluster": "model-fresh", "timeout": "10s"}]})),
    ] {
        let (s, v) = api(&c, Method::PUT, node.api, path, Some(spec)).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
    }
    let up = Upstream::start("model-a").await;
    let side = dir.path().join("side");
    std::fs::create_dir_all(&side).unwrap();
    let (tin, tout) = (token(&node, MODEL, &side, "in"), token(&node, WEB, &side, "out"));
    let log = side.join("in-access.log");
    let (din, dout) = (side.join("in-id"), side.join("out-id"));
    let model = up.addr;
    let inbound = SidecarProc::launch("in-1", &side, &[&node], |admin, listen| {
        format!(
            "node: {{id: in-1}}\nadmin: {{address: \"{admin}\"}}\n{}\
             listeners: [{{name: in, address: \"{listen}\", direction: inbound}}]\n\
             services: [{{name: local, hosts: [\"*\"], listeners: [in], routes: [{{name: r, cluster: local}}]}}]\n\
             clusters: [{{name: local, endpoints: [\"{model}\"]}}]\n\
             telemetry: {{access_log: {{enabled: true, path: \"{}\"}}}}\n",
            identity(MODEL, &tin, &din),
            log.display()
        )
    }, ["--register-cluster", "model", "--report-interval", "200ms"].map(String::from).to_vec());
    let outbound = outbound_sidecar("out-1", &node, &side, &tout, &dout);
    let (s, v) = api(&c, Method::PUT, node.api, "/v1/endpoints/model-fresh", Some(json!({"endpoints": [{"address": inbound.listen.to_string()}]}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_for("traffic flows over mTLS", Duration::from_secs(30), || async {
        (body_if_ok(&c, outbound.listen, "model", "/").await == "model-a").then_some(())
    })
    .await;
    Mesh { node, inbound, outbound, up, dir }
}

/// An outbound sidecar (listener `out`) with the identity `token` admits, kept in `id_dir`.
fn outbound_sidecar(name: &str, node: &ControlProc, side: &Path, token: &Path, id_dir: &Path) -> SidecarProc {
    let id = std::fs::read_to_string(token.with_extension("id")).unwrap();
    SidecarProc::launch(name, side, &[node], |admin, listen| {
        format!("node: {{id: {name}}}\nadmin: {{address: \"{admin}\"}}\n{}listeners: [{{name: out, address: \"{listen}\"}}]\n", identity(&id, token, id_dir))
    }, vec![])
}

async fn metrics(admin: SocketAddr) -> String {
    admin_get(admin, "/metrics").await.1
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issued_certificates_rotate_three_times_under_load_losing_nothing_and_keys_stay_home() {
    let m = mesh("30s").await;
    // The inbound sidecar saw the caller over mTLS.
    let mi = metrics(m.inbound.admin).await;
    assert!(metric_sum(&mi, "weft_downstream_connections_total", &[("listener", "in"), ("tls", "mtls")]) >= 1.0, "{mi}");
    assert_eq!(metric_sum(&mi, "weft_downstream_connections_total", &[("tls", "plaintext")]), 0.0, "{mi}");

    // The key: the sidecar's alone, and nowhere in the control plane's data.
    use std::os::unix::fs::PermissionsExt;
    let key_path = m.dir.path().join("side/in-id/key.pem");
    assert_eq!(std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777, 0o600);
    let key = std::fs::read_to_string(&key_path).unwrap();
    // Base64 characters 50..64 of a P-256 PKCS#8 key encode its private scalar (what comes
    // before is the same ASN.1 header for every such key, the CA's too), within the PEM's
    // first line, so a copy of the key anywhere would hold them.
    let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let secret = &body[50..64];
    let cert = std::fs::read_to_string(m.dir.path().join("side/in-id/cert.pem")).unwrap();
    weft_proxy::tls::Credentials::from_pem(&cert, &key, &std::fs::read_to_string(m.dir.path().join("side/in-id/ca.pem")).unwrap())
        .expect("the issued leaf is for the key the sidecar made");
    for entry in walk(&m.node.dir) {
        let bytes = std::fs::read(&entry).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(secret), "the sidecar's key is in the control plane's {}", entry.display());
    }

    // 200 requests a second for 65 s: three renewals of a 30 s leaf (each two thirds through).
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let addr = m.outbound.listen;
    let total = 13_000u64;
    let base = m.up.hits();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let c = client();
    for i in 0..total {
        tick.tick().await;
        let (c, sent, failed) = (c.clone(), sent.clone(), failed.clone());
        // Every tenth on a new connection (a full handshake with the certificates of the moment).
        let host = if i % 10 == 0 { "model-fresh" } else { "model" };
        tokio::spawn(async move {
            sent.fetch_add(1, SeqCst);
            let (s, _, b) = get(&c, addr, host, "/", &[]).await;
            if s != StatusCode::OK {
                failed.fetch_add(1, SeqCst);
                eprintln!("lost: {s} {}", String::from_utf8_lossy(&b));
            }
        });
    }
    wait_for("every request answered", Duration::from_secs(20), || async {
        (m.up.hits() - base + failed.load(SeqCst) >= total).then_some(())
    })
    .await;
    assert_eq!(failed.load(SeqCst), 0, "requests lost across rotations");
    for (who, admin) in [("inbound", m.inbound.admin), ("outbound", m.outbound.admin)] {
        let text = metrics(admin).await;
        let issued = metric_sum(&text, "weft_tls_credential_reloads_total", &[("result", "issued")]);
        assert!(issued >= 4.0, "{who}: the first certificate and three renewals, got {issued}\n{text}");
        assert_eq!(metric_sum(&text, "weft_tls_credential_reloads_total", &[("result", "issue_failed")]), 0.0, "{who}");
        let expiry = metric_sum(&text, "weft_tls_certificate_expiry_timestamp_seconds", &[]);
        assert!(expiry > unix_now() && expiry < unix_now() + 31.0, "{who}: a 30 s leaf, renewed: expires at {expiry}");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_control_plane_down_mtls_serves_until_the_leaf_expires_and_issuance_resumes() {
    let mut m = mesh("10s").await;
    let c = client();
    let expiry = |text: &str| metric_sum(text, "weft_tls_certificate_expiry_timestamp_seconds", &[]);
    m.node.kill();
    let until = expiry(&metrics(m.outbound.admin).await).min(expiry(&metrics(m.inbound.admin).await));
    assert!(until > unix_now(), "valid when the control plane went");
    // Until a second before the earlier expiry, every request is served, each on a new
    // connection (`model-fresh`): an open connection would outlive its certificates.
    let mut served = 0;
    while unix_now() < until - 1.0 {
        let (s, _, b) = get(&c, m.outbound.listen, "model-fresh", "/", &[]).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
        served += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served > 10, "{served}");
    // The failed renewals and the expiry are visible.
    let text = metrics(m.outbound.admin).await;
    assert!(metric_sum(&text, "weft_tls_credential_reloads_total", &[("result", "issue_failed")]) >= 1.0, "{text}");
    // After it, new connections fail: an expired leaf is refused.
    wait_for("requests fail once the leaf expired", Duration::from_secs(10), || async {
        (get(&c, m.outbound.listen, "model-fresh", "/", &[]).await.0 == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    let refused = |t: &str| metric_sum(t, "weft_tls_handshakes_total", &[("result", "expired")]);
    let (ti, to) = (metrics(m.inbound.admin).await, metrics(m.outbound.admin).await);
    assert!(refused(&ti) + refused(&to) >= 1.0, "an expired certificate was refused\n{ti}\n{to}");
    // The control plane returns: both sidecars get new leaves, traffic resumes.
    m.node.restart();
    wait_for("traffic resumes with new certificates", Duration::from_secs(40), || async {
        (body_if_ok(&c, m.outbound.listen, "model-fresh", "/").await == "model-a").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_policy_admits_one_identity_and_refuses_another() {
    const BATCH: &str = "spiffe://mesh.local/ns/batch/sa/job";
    let m = mesh("1h").await;
    let side = m.dir.path().join("side");
    let batch = outbound_sidecar("batch-1", &m.node, &side, &token(&m.node, BATCH, &side, "batch"), &side.join("batch-id"));
    let c = client();
    wait_for("the batch sidecar is served before any policy", Duration::from_secs(30), || async {
        (body_if_ok(&c, batch.listen, "model", "/").await == "model-a").then_some(())
    })
    .await;
    // `weftctl proxy-status` shows each sidecar's certificate expiry.
    wait_for("proxy-status shows the certificates' expiry", Duration::from_secs(20), || async {
        let out = weftctl(&m.node, &["proxy-status"]);
        let line = |n: &str| out.lines().find(|l| l.starts_with(n)).map(|l| l.contains(" in ") && !l.contains("EXPIRED"));
        (line("in-1 ") == Some(true) && line("out-1 ") == Some(true) && line("batch-1 ") == Some(true)).then_some(())
    })
    .await;
    // Only WEB may call the model server's service; and nobody its /admin.
    for (name, spec) in [
        ("model-callers", json!({"services": ["local"], "rules": [{"identities": [WEB]}]})),
        ("no-admin", json!({"action": "deny", "rules": [{"path_prefixes": ["/admin"]}]})),
    ] {
        let (s, v) = api(&c, Method::PUT, m.node.api, &format!("/v1/authorizationpolicies/{name}"), Some(spec)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, _, b) = wait_for("the batch caller is refused", Duration::from_secs(20), || async {
        let r = get(&c, batch.listen, "model", "/", &[]).await;
        (r.0 == StatusCode::FORBIDDEN).then_some(r)
    })
    .await;
    let body: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((s, body["error"].as_str(), body["caller"].as_str()), (StatusCode::FORBIDDEN, Some("unauthorized"), Some(BATCH)), "{body}");
    assert_eq!(get(&c, m.outbound.listen, "model-fresh", "/", &[]).await.0, StatusCode::OK, "WEB is admitted");
    let (s, _, b) = get(&c, m.outbound.listen, "model", "/admin/stats", &[]).await;
    let body: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((s, body["policy"].as_str()), (StatusCode::FORBIDDEN, Some("no-admin")), "deny wins: {body}");

    let text = metrics(m.inbound.admin).await;
    let count = |decision, policy| metric_sum(&text, "weft_authz_decisions_total", &[("service", "local"), ("decision", decision), ("policy", policy)]);
    assert!(count("deny", "(no allow rule matched)") >= 1.0 && count("allow", "model-callers") >= 1.0 && count("deny", "no-admin") == 1.0, "{text}");
    let log = std::fs::read_to_string(side.join("in-access.log")).unwrap();
    let denied: Vec<Value> = log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|l| l["authz"] == "deny").collect();
    assert!(denied.iter().any(|l| l["peer_identity"] == BATCH && l["tls"] == "mtls"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_identity_is_refused_in_the_handshake_and_gets_no_new_certificate() {
    const BATCH: &str = "spiffe://mesh.local/ns/batch/sa/job";
    let m = mesh("1h").await;
    let side = m.dir.path().join("side");
    let batch = outbound_sidecar("batch-1", &m.node, &side, &token(&m.node, BATCH, &side, "batch"), &side.join("batch-id"));
    let c = client();
    wait_for("the batch sidecar is served", Duration::from_secs(30), || async {
        (body_if_ok(&c, batch.listen, "model-fresh", "/").await == "model-a").then_some(())
    })
    .await;
    let out: Value = serde_json::from_str(&weftctl(&m.node, &["identity", "revoke", "--identity", "ns/batch/sa/job", "-o", "json"])).unwrap();
    assert_eq!((out["identity"].as_str(), out["tokens_revoked"].as_array().map(Vec::len)), (Some(BATCH), Some(1)), "{out}");
    // New connections from the revoked identity are refused by the inbound sidecar (in TLS 1.3
    // the client has sent its request by then: it sees the connection close, a 502).
    wait_for("the revoked caller is refused", Duration::from_secs(20), || async {
        get(&c, batch.listen, "model-fresh", "/", &[]).await.0.is_server_error().then_some(())
    })
    .await;
    let hits = m.up.hits();
    for _ in 0..5 {
        assert!(get(&c, batch.listen, "model-fresh", "/", &[]).await.0.is_server_error());
    }
    assert_eq!(m.up.hits(), hits, "nothing of the revoked caller reaches the model server");
    assert_eq!(get(&c, m.outbound.listen, "model-fresh", "/", &[]).await.0, StatusCode::OK, "other identities are served");
    let text = metrics(m.inbound.admin).await;
    assert!(metric_sum(&text, "weft_tls_handshakes_total", &[("side", "server"), ("result", "revoked")]) >= 1.0, "{text}");
    let tokens: Value = serde_json::from_str(&weftctl(&m.node, &["identity", "token", "list", "-o", "json"])).unwrap();
    assert!(tokens["items"].as_array().unwrap().iter().all(|t| t["identity"] != BATCH), "its token is gone: {tokens}");
}

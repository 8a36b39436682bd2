//! TLS on the control plane's own ports, end to end with the real binaries: three
//! `weft-control` nodes issue themselves serving certificates from a CA of the user's own
//! (`--tls-from-ca`) and require client certificates on the API/Raft port
//! (`--tls-client-ca`); they form a cluster over TLS (join, Raft replication, forwarding a
//! follower's write to the leader, fan-in of sidecar reports); `weftctl --ca --cert --key`
//! talks to any of them; a sidecar with `--xds-ca` gets its workload certificate and its
//! config over TLS xDS and shows up in `weftctl proxy-status`. Refused: plaintext to the API
//! port (a 400 naming https), `weftctl` without a client certificate, `weftctl` trusting
//! another root.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use weft_control::ca::MeshCa;
use weft_tests::procs::{ControlProc, SidecarProc, wait_for};
use weft_tests::*;

const MODEL: &str = "spiffe://mesh.local/service/model";

struct Pki {
    ca: PathBuf,
    ca_key: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// Another CA's root.
    stranger: PathBuf,
}

fn pki(dir: &Path) -> Pki {
    let year = Duration::from_secs(365 * 24 * 3600);
    let ca = MeshCa::generate("mesh.local", SystemTime::now(), year).unwrap();
    let admin = ca.serving_cert(&["weftctl-admin".into()], SystemTime::now(), year).unwrap();
    let stranger = MeshCa::generate("other.mesh", SystemTime::now(), year).unwrap();
    let p = Pki { ca: dir.join("ca.pem"), ca_key: dir.join("ca.key"), cert: dir.join("admin.pem"), key: dir.join("admin.key"), stranger: dir.join("stranger.pem") };
    for (path, text) in [(&p.ca, ca.cert_pem()), (&p.ca_key, ca.key_pem()), (&p.cert, &admin.cert_pem), (&p.key, &admin.key_pem), (&p.stranger, stranger.cert_pem())] {
        std::fs::write(path, text).unwrap();
    }
    p
}

/// `weftctl --server https://NODE ARGS` with `tls` flags: (success, stdout, stderr).
fn weftctl(node: &ControlProc, tls: &[&Path], flags: &[&str], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(workspace_bin("weftctl"));
    cmd.arg("--server").arg(format!("https://{}", node.api));
    for (flag, path) in flags.iter().zip(tls) {
        cmd.arg(flag).arg(path);
    }
    let o = cmd.args(args).output().expect("weftctl runs");
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sidecars_and_weftctl_over_tls_and_plaintext_or_strangers_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = pki(dir.path());
    let s = |p: &Path| p.display().to_string();
    let (ca, ca_key) = (s(&p.ca), s(&p.ca_key));
    let flags = ["--trust-domain", "mesh.local", "--ca-cert", &ca, "--ca-key", &ca_key, "--tls-from-ca", "--tls-client-ca", &ca];
    let ok = |node: &ControlProc, args: &[&str]| {
        let (ok, out, err) = weftctl(node, &[&p.ca, &p.cert, &p.key], &["--ca", "--cert", "--key"], args);
        ok.then_some(out).ok_or(err)
    };
    let first = ControlProc::start_with(1, dir.path(), true, None, &flags);
    wait_for("node 1 leads, over TLS", Duration::from_secs(20), || async {
        let out = ok(&first, &["status", "-o", "json"]).ok()?;
        let v: Value = serde_json::from_str(&out).ok()?;
        (v["leader"] == 1).then_some(())
    })
    .await;
    let mut nodes = vec![first];
    for id in 2..=3 {
        nodes.push(ControlProc::start_with(id, dir.path(), false, Some(nodes[0].api), &flags));
    }
    for node in &nodes {
        wait_for(&format!("node {} sees 3 voters", node.id), Duration::from_secs(40), || async {
            let v: Value = serde_json::from_str(&ok(node, &["members", "list", "-o", "json"]).ok()?).ok()?;
            let voters = v["members"].as_array()?.iter().filter(|m| m["voter"] == true).count();
            (voters == 3 && v["leader"].is_u64()).then_some(())
        })
        .await;
    }

    // A follower's write is forwarded to the leader (over TLS, with the node's certificate).
    let leader = serde_json::from_str::<Value>(&ok(&nodes[0], &["status", "-o", "json"]).unwrap()).unwrap()["leader"].as_u64().unwrap();
    let follower = nodes.iter().find(|n| n.id != leader).unwrap();
    let out = ok(follower, &["identity", "token", "create", "--identity", MODEL, "-o", "json"]).unwrap();
    let token: Value = serde_json::from_str(&out).unwrap();
    let side = dir.path().join("side");
    std::fs::create_dir_all(&side).unwrap();
    let token_file = side.join("model.token");
    std::fs::write(&token_file, token["token"].as_str().unwrap()).unwrap();

    // A sidecar gets its certificate and config over TLS xDS, and its reports reach every node.
    let up = Upstream::start("model-a").await;
    let id_dir = side.join("model-id");
    let model = up.addr;
    let sidecar = SidecarProc::launch("in-1", &side, &[&nodes[0], &nodes[1]], |admin, listen| {
        format!(
            "node: {{id: in-1}}\nadmin: {{address: \"{admin}\"}}\n\
             identity: {{spiffe_id: \"{MODEL}\", token_file: \"{}\", dir: \"{}\"}}\n\
             listeners: [{{name: in, address: \"{listen}\", direction: inbound}}]\n\
             services: [{{name: local, hosts: [\"*\"], listeners: [in], routes: [{{name: r, cluster: local}}]}}]\n\
             clusters: [{{name: local, endpoints: [\"{model}\"]}}]\n",
            token_file.display(),
            id_dir.display()
        )
    }, vec!["--xds-ca".into(), ca.clone(), "--register-cluster".into(), "model".into(), "--report-interval".into(), "200ms".into()]);
    wait_for("the sidecar's certificate is issued over TLS", Duration::from_secs(30), || async {
        id_dir.join("cert.pem").exists().then_some(())
    })
    .await;
    wait_for("every node lists the sidecar with its certificate", Duration::from_secs(30), || async {
        for n in &nodes {
            let out = ok(n, &["proxy-status"]).ok()?;
            let line = out.lines().find(|l| l.starts_with("in-1 "))?;
            if !line.contains(" in ") || line.contains("EXPIRED") {
                return None;
            }
        }
        Some(())
    })
    .await;
    let (_, metrics) = admin_get(sidecar.admin, "/metrics").await;
    assert!(metric_sum(&metrics, "weft_tls_credential_reloads_total", &[("result", "issued")]) >= 1.0, "{metrics}");

    // Plaintext to the API port: told to use https, and the port goes on serving.
    let mut tcp = std::net::TcpStream::connect(nodes[0].api).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(b"GET /v1/status HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("https://"), "{answer}");
    // No client certificate: refused in the handshake.
    let (done, _, err) = weftctl(&nodes[0], &[&p.ca], &["--ca"], &["status"]);
    assert!(!done && err.contains("CertificateRequired"), "{err}");
    // Trusting another root: the node is refused.
    let (done, _, err) = weftctl(&nodes[0], &[&p.stranger, &p.cert, &p.key], &["--ca", "--cert", "--key"], &["status"]);
    assert!(!done && err.contains("invalid peer certificate"), "{err}");
    // An https server without --ca says what is missing.
    let (done, _, err) = weftctl(&nodes[0], &[], &[], &["status"]);
    assert!(!done && err.contains("--ca FILE"), "{err}");
    assert!(ok(&nodes[2], &["status"]).is_ok(), "still serving after the refusals");
}

//! The scenario's certificates, made at start-up with weft's own mesh CA
//! (`weft_control::ca::MeshCa`) and written as PEM files beside the proxies' configs: a root,
//! a leaf for the inbound side (`SERVER_ID`, also served by the TLS terminators) and one for
//! the outbound side and the handshake generator (`CLIENT_ID`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow};
use weft_control::ca::MeshCa;
use weft_proxy::identity::{self, SpiffeId};
use weft_proxy::tls::{Credentials, Expect};

pub const TRUST_DOMAIN: &str = "weft.local";
/// The inbound sidecar (B) and the TLS terminators.
pub const SERVER_ID: &str = "spiffe://weft.local/service/model";
/// The outbound sidecar (A) and the handshake generator.
pub const CLIENT_ID: &str = "spiffe://weft.local/ns/bench/sa/client";

/// The files [`generate`] writes, as the configuration templates name them (`{{TMP}}/NAME`).
pub const ROOT: &str = "mesh-root.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";
/// HAProxy's `crt`: the server's certificate and key in one file.
pub const SERVER_BUNDLE: &str = "server-bundle.pem";
pub const CLIENT_CERT: &str = "client-cert.pem";
pub const CLIENT_KEY: &str = "client-key.pem";
pub const FILES: [&str; 6] = [
    ROOT,
    SERVER_CERT,
    SERVER_KEY,
    SERVER_BUNDLE,
    CLIENT_CERT,
    CLIENT_KEY,
];

/// Lifetime of the root and the leaves: longer than any run.
const LIFETIME: Duration = Duration::from_secs(86_400);

/// Makes a root and the two leaves and writes [`FILES`] into `dir` (keys with mode 0600).
pub fn generate(dir: &Path) -> Result<()> {
    let now = SystemTime::now();
    let ca = MeshCa::generate(TRUST_DOMAIN, now, LIFETIME).context("mesh CA")?;
    std::fs::write(dir.join(ROOT), ca.cert_pem())?;
    for (id, cert, key) in [
        (SERVER_ID, SERVER_CERT, SERVER_KEY),
        (CLIENT_ID, CLIENT_CERT, CLIENT_KEY),
    ] {
        let id: SpiffeId = id.parse()?;
        let req = identity::request(&id).map_err(|e| anyhow!("{id}: {e}"))?;
        let leaf = ca
            .sign(&req.csr_pem, &id, now, LIFETIME)
            .with_context(|| format!("signing {id}"))?;
        identity::write_key(&dir.join(key), &req.key_pem)?;
        std::fs::write(dir.join(cert), &leaf.cert_pem)?;
        if cert == SERVER_CERT {
            identity::write_key(
                &dir.join(SERVER_BUNDLE),
                &format!("{}{}", leaf.cert_pem, req.key_pem),
            )?;
        }
    }
    Ok(())
}

/// The handshake generator's client: the `CLIENT_ID` leaf from `dir`, accepting a server whose
/// chain leads to the root and whose URI SAN is `SERVER_ID` (weft's own client check), ALPN
/// `http/1.1`, no session resumption: every handshake is a full one.
pub fn client_config(dir: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let read = |f: &str| -> Result<String> {
        let path: PathBuf = dir.join(f);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let creds = Credentials::from_pem(&read(CLIENT_CERT)?, &read(CLIENT_KEY)?, &read(ROOT)?)
        .map_err(|e| anyhow!("client credentials: {e}"))?;
    let expect = Expect::one(SERVER_ID.parse()?);
    let cfg = weft_proxy::tls::client_config(&creds, expect, b"http/1.1")
        .map_err(|e| anyhow!("client config: {e}"))?;
    // weft's client config disables resumption already; said again here because the
    // measurement depends on it.
    let mut cfg = (*cfg).clone();
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_and_the_client_loads_them() {
        let dir = std::env::temp_dir().join(format!("weft-bench-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        generate(&dir).unwrap();
        for f in FILES {
            assert!(dir.join(f).is_file(), "{f}");
        }
        let bundle = std::fs::read_to_string(dir.join(SERVER_BUNDLE)).unwrap();
        assert!(bundle.contains("BEGIN CERTIFICATE") && bundle.contains("BEGIN PRIVATE KEY"));
        let cfg = client_config(&dir).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

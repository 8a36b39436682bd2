//! TLS on the control plane's own ports (`--tls-cert`/`--tls-key`, or `--tls-from-ca`): the
//! REST API and the Raft RPCs (one listener), and xDS (the sidecars' ADS streams, reports and
//! `Identity/Sign`). Off unless asked for, so loopback demos and stock Envoy clients keep
//! working without certificates.
//!
//! - [`ControlTls`]: the server configurations and the [`dial::Dialer`] a node calls its peers
//!   with, all sharing one serving certificate ([`Current`]) that is swapped whole when its
//!   files change or, when the node issued it from the mesh CA, before it expires;
//! - [`listen`]: accepting TLS connections (handshakes off the accept loop) for axum and tonic;
//! - [`dial`]: connecting to a control node over TLS (peers, `weftctl`), checked by name.
//!
//! Server authentication is by name (DNS or IP SAN, as any HTTPS client checks), against
//! `--tls-ca` (default: the `--ca-cert` mesh root). With `--tls-client-ca` the API/Raft port
//! also requires a client certificate from that CA (peers present their own serving
//! certificate, so it must allow client auth too: `--tls-from-ca` ones do), and the xDS port
//! checks one when offered (a sidecar without a certificate yet must still reach `Sign`).

pub mod dial;
pub mod listen;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use weft_proxy::identity::crypto_provider;

use crate::ca::MeshCa;

/// How often the serving certificate's files are checked for a change (and an issued one for
/// its renewal time).
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Lifetime of a serving certificate a node issues itself (`--tls-from-ca`); renewed two thirds
/// through, without a restart.
pub const ISSUED_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Where the node's serving certificate comes from.
#[derive(Clone)]
pub enum CertSource {
    /// PEM files (chain, PKCS#8 key), reread when they change.
    Files { cert: PathBuf, key: PathBuf },
    /// Signed by the mesh CA (`--ca-cert`/`--ca-key`) for `names` (DNS names or IPs).
    Issued { ca: Arc<MeshCa>, names: Vec<String>, lifetime: Duration },
}

impl std::fmt::Debug for CertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertSource::Files { cert, key } => f.debug_struct("Files").field("cert", cert).field("key", key).finish(),
            CertSource::Issued { names, lifetime, .. } => f.debug_struct("Issued").field("names", names).field("lifetime", lifetime).finish(),
        }
    }
}

/// What `--tls-*` asked for.
#[derive(Clone, Debug)]
pub struct Settings {
    pub source: CertSource,
    /// PEM roots other control nodes' certificates are checked against.
    pub peer_roots_pem: String,
    /// PEM roots client certificates are checked against; `None` = none asked for.
    pub client_roots_pem: Option<String>,
}

/// The serving certificate in use, swapped whole; servers and the peer dialer resolve it per
/// handshake, so a new one is used by the next connection.
#[derive(Debug)]
pub struct Current {
    key: ArcSwap<CertifiedKey>,
    /// When the certificate in use stops being valid.
    not_after: ArcSwap<SystemTime>,
}

impl Current {
    fn new(k: Loaded) -> Current {
        Current { key: ArcSwap::from_pointee(k.key), not_after: ArcSwap::from_pointee(k.not_after) }
    }

    fn install(&self, k: Loaded) {
        self.key.store(Arc::new(k.key));
        self.not_after.store(Arc::new(k.not_after));
    }

    pub fn not_after(&self) -> SystemTime {
        **self.not_after.load()
    }
}

impl rustls::server::ResolvesServerCert for Current {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.load_full())
    }
}

impl rustls::client::ResolvesClientCert for Current {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.key.load_full())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A certificate and key ready to serve.
struct Loaded {
    key: CertifiedKey,
    not_before: SystemTime,
    not_after: SystemTime,
}

/// A chain (leaf first) and its key, from PEM, checked to belong together.
fn load(chain_pem: &str, key_pem: &str) -> Result<Loaded, String> {
    let (chain, key) = weft_proxy::tls::chain_and_key(chain_pem, key_pem)?;
    let (not_before, not_after) = weft_proxy::tls::validity(&chain[0]).map_err(|e| format!("certificate: {e}"))?;
    let key = CertifiedKey::from_der(chain, key, &crypto_provider()).map_err(|e| format!("key: {e}"))?;
    Ok(Loaded { key, not_before, not_after })
}

/// PEM roots into a store; an empty one is an error.
pub use weft_proxy::tls::roots_from_pem as roots;

impl CertSource {
    fn load(&self) -> Result<Loaded, String> {
        match self {
            CertSource::Files { cert, key } => {
                let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
                load(&read(cert)?, &read(key)?)
            }
            CertSource::Issued { ca, names, lifetime } => {
                let issued = ca.serving_cert(names, SystemTime::now(), *lifetime).map_err(|e| e.to_string())?;
                load(&issued.cert_pem, &issued.key_pem)
            }
        }
    }

    /// What identifies the files' current contents (so a change is noticed), or `None` for an
    /// issued certificate.
    fn stamp(&self) -> Option<Vec<(SystemTime, u64)>> {
        let CertSource::Files { cert, key } = self else { return None };
        let one = |p: &PathBuf| std::fs::metadata(p).map_or((SystemTime::UNIX_EPOCH, 0), |m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        Some(vec![one(cert), one(key)])
    }
}

/// TLS for one control node.
pub struct ControlTls {
    /// The REST API and Raft listener (HTTP/1.1).
    pub api: Arc<ServerConfig>,
    /// The xDS listener (HTTP/2).
    pub xds: Arc<ServerConfig>,
    /// How this node calls its peers' API ports.
    pub dialer: dial::Dialer,
    pub serving: Arc<Serving>,
}

/// A serving certificate and where it comes from, kept fresh by [`Serving::keep_fresh`]. The
/// control plane's ports use it, and so does any other weft server that takes a certificate
/// from files (weft-k8s's admission webhook, whose certificate cert-manager rotates).
pub struct Serving {
    pub current: Arc<Current>,
    source: CertSource,
}

impl Serving {
    /// Loads (or issues) the certificate now; `what` names the flags in the error.
    pub fn new(source: CertSource, what: &str) -> Result<Arc<Serving>, String> {
        let current = Arc::new(Current::new(source.load().map_err(|e| format!("{what}: {e}"))?));
        Ok(Arc::new(Serving { current, source }))
    }

    /// A server configuration resolving this certificate per handshake, with no client
    /// certificates asked for.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, String> {
        let b = ServerConfig::builder_with_provider(crypto_provider()).with_safe_default_protocol_versions().map_err(|e| e.to_string())?;
        let mut cfg = b.with_no_client_auth().with_cert_resolver(self.current.clone());
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(cfg))
    }
}

impl ControlTls {
    /// The configurations; the certificate is loaded (or issued) now, so a bad one is a start-up
    /// error naming the flag.
    pub fn new(s: &Settings) -> Result<ControlTls, String> {
        let what = match &s.source {
            CertSource::Files { .. } => "--tls-cert/--tls-key",
            CertSource::Issued { .. } => "--tls-from-ca",
        };
        let serving = Serving::new(s.source.clone(), what)?;
        let current = serving.current.clone();
        let client_roots = s.client_roots_pem.as_deref().map(roots).transpose().map_err(|e| format!("--tls-client-ca: {e}"))?.map(Arc::new);
        let server = |alpn: &[u8], required: bool| -> Result<Arc<ServerConfig>, String> {
            let b = ServerConfig::builder_with_provider(crypto_provider()).with_safe_default_protocol_versions().map_err(|e| e.to_string())?;
            let b = match &client_roots {
                Some(r) => {
                    let v = WebPkiClientVerifier::builder_with_provider(r.clone(), crypto_provider());
                    let v = if required { v } else { v.allow_unauthenticated() };
                    b.with_client_cert_verifier(v.build().map_err(|e| format!("--tls-client-ca: {e}"))?)
                }
                None => b.with_no_client_auth(),
            };
            let mut cfg = b.with_cert_resolver(current.clone());
            cfg.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(cfg))
        };
        let api = server(b"http/1.1", true)?;
        let xds = server(b"h2", false)?;
        let peer_roots = roots(&s.peer_roots_pem).map_err(|e| format!("--tls-ca: {e}"))?;
        let dialer = dial::Dialer::tls(peer_roots, Some(current.clone()))?;
        Ok(ControlTls { api, xds, dialer, serving })
    }

    /// See [`Serving::keep_fresh`].
    pub async fn keep_fresh(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        self.serving.clone().keep_fresh(stop).await
    }
}

impl Serving {
    /// Keeps the serving certificate fresh until `stop`: files reread when they change (a bad
    /// pair is logged and the old one keeps serving), an issued one reissued two thirds
    /// through its life.
    pub async fn keep_fresh(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut stamp = self.source.stamp();
        let mut issued_from = SystemTime::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let due = match &self.source {
                CertSource::Files { .. } => {
                    let now = self.source.stamp();
                    let changed = now != stamp;
                    stamp = now;
                    changed
                }
                CertSource::Issued { .. } => SystemTime::now() >= crate::ca::renew_at(issued_from, self.current.not_after()),
            };
            if !due {
                continue;
            }
            match self.source.load() {
                Ok(l) => {
                    tracing::info!(valid_until = weft_proxy::tls::unix_secs(l.not_after), "control-plane TLS certificate replaced");
                    issued_from = l.not_before;
                    self.current.install(l);
                }
                Err(e) => tracing::warn!(error = %e, "control-plane TLS certificate not replaced; the current one keeps serving"),
            }
        }
    }
}

#[cfg(test)]
mod tests;

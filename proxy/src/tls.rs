//! rustls configurations for mutual TLS between sidecars, built from a sidecar's leaf, its key
//! and the mesh root (PEM). Peers are authenticated by SPIFFE ID (the leaf's URI SAN), not by
//! DNS name: a client checks that the server's chain leads to the mesh root and that its ID is
//! the one it expected; a server requires a client chain to the same root and reads the
//! client's ID from it ([`peer_id`]) for authorization.
//!
//! Groundwork of issue 38: not yet used by the listeners or the upstream pools.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::identity::{SpiffeId, crypto_provider, uri_sans};

/// ALPN, most preferred first: HTTP/2 between sidecars, HTTP/1.1 for what only speaks that.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A sidecar's TLS identity and what it trusts.
#[derive(Clone, Debug)]
pub struct Credentials {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    roots: Arc<RootCertStore>,
}

impl Credentials {
    /// From PEM: the leaf (and any intermediates after it), its PKCS#8 key, the mesh root(s).
    pub fn from_pem(chain_pem: &str, key_pem: &str, roots_pem: &str) -> Result<Credentials, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("certificate chain: {e}"))?;
        if chain.is_empty() {
            return Err("certificate chain: no CERTIFICATE block".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("private key: {e}"))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("roots: {e}"))?;
            roots.add(cert).map_err(|e| format!("roots: {e}"))?;
        }
        if roots.is_empty() {
            return Err("roots: no CERTIFICATE block".into());
        }
        Ok(Credentials { chain, key: Arc::new(key), roots: Arc::new(roots) })
    }
}

/// The server side: a client certificate chaining to the mesh root is required.
pub fn server_config(c: &Credentials) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = crypto_provider();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(c.roots.clone(), provider.clone())
        .build()
        .map_err(|e| format!("client verifier: {e}"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(c.chain.clone(), c.key.clone_key())
        .map_err(|e| format!("server certificate: {e}"))?;
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The client side, presenting its own certificate and accepting only a server whose chain
/// leads to the mesh root and whose ID is `expect`.
pub fn client_config(c: &Credentials, expect: SpiffeId) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = crypto_provider();
    let verifier = Arc::new(SpiffeVerifier { roots: c.roots.clone(), provider: provider.clone(), expect });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
        .map_err(|e| format!("client certificate: {e}"))?;
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The SPIFFE ID of a verified peer's leaf (the first certificate), if it carries one weft
/// issues.
pub fn peer_id(certs: &[CertificateDer<'_>]) -> Option<SpiffeId> {
    let sans = uri_sans(certs.first()?).ok()?;
    sans.iter().find_map(|s| s.parse().ok())
}

/// Checks a server as webpki checks a chain (signatures, validity, server-auth usage), then
/// its SPIFFE ID instead of a DNS name: the server name a connection is opened with is for SNI
/// only.
#[derive(Debug)]
struct SpiffeVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    expect: SpiffeId,
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        let algs = self.provider.signature_verification_algorithms.all;
        rustls::client::verify_server_cert_signed_by_trust_anchor(&cert, &self.roots, intermediates, now, algs)?;
        match peer_id(std::slice::from_ref(end_entity)) {
            Some(id) if id == self.expect => Ok(ServerCertVerified::assertion()),
            got => Err(rustls::Error::General(format!(
                "server identity {} is not the expected {}",
                got.map_or("(none)".to_string(), |g| g.to_string()),
                self.expect
            ))),
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

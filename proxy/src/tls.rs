//! rustls configurations for mutual TLS between sidecars, built from a sidecar's leaf, its key
//! and the mesh root (PEM). Peers are authenticated by SPIFFE ID (the leaf's URI SAN), not by
//! DNS name: a client checks that the server's chain leads to the mesh root and that its ID is
//! the one it expected; a server requires a client chain to the same root and reads the
//! client's ID from it ([`peer_id`]) for authorization.
//!
//! Groundwork of issue 38: not yet used by the listeners or the upstream pools.

use std::sync::Arc;

use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use crate::identity::{SpiffeId, crypto_provider, uri_sans};

/// ALPN a server offers, most preferred first: HTTP/2 between sidecars, HTTP/1.1 for what only
/// speaks that. A client offers the one protocol its pool speaks.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A sidecar's TLS identity and what it trusts.
#[derive(Clone, Debug)]
pub struct Credentials {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    roots: Arc<RootCertStore>,
    revoked: Revoked,
}

/// Revoked identities: a peer certificate for one of them that became valid before its time is
/// refused, by both the client and the server side. Shared and swapped whole (the control
/// plane pushes the list), so configurations made earlier see every change.
#[derive(Clone, Debug, Default)]
pub struct Revoked(Arc<arc_swap::ArcSwap<Vec<(SpiffeId, SystemTime)>>>);

impl Revoked {
    pub fn set(&self, list: Vec<(SpiffeId, SystemTime)>) {
        self.0.store(Arc::new(list));
    }

    /// Whether a certificate for `id` that became valid at `from` is revoked.
    fn check(&self, id: &SpiffeId, from: SystemTime) -> Result<(), String> {
        match self.0.load().iter().find(|(r, before)| r == id && from < *before) {
            Some((_, before)) => {
                Err(format!("the certificate of {id} (valid from {}) is revoked: issued before {}", unix_secs(from), unix_secs(*before)))
            }
            None => Ok(()),
        }
    }

    /// The peer's leaf checked against the list.
    fn check_leaf(&self, leaf: &CertificateDer<'_>, id: &SpiffeId) -> Result<(), rustls::Error> {
        if self.0.load().is_empty() {
            return Ok(());
        }
        let (from, _) = validity(leaf).map_err(rustls::Error::General)?;
        self.check(id, from).map_err(rustls::Error::General)
    }
}

impl Credentials {
    /// From PEM: the leaf (and any intermediates after it), its PKCS#8 key, the mesh root(s).
    pub fn from_pem(chain_pem: &str, key_pem: &str, roots_pem: &str) -> Result<Credentials, String> {
        let (chain, key) = chain_and_key(chain_pem, key_pem)?;
        let roots = roots_from_pem(roots_pem).map_err(|e| format!("roots: {e}"))?;
        Ok(Credentials { chain, key: Arc::new(key), roots: Arc::new(roots), revoked: Revoked::default() })
    }

    /// Refuse peers on `revoked` (its later changes included).
    pub fn with_revocations(mut self, revoked: Revoked) -> Credentials {
        self.revoked = revoked;
        self
    }

    /// The leaf, DER.
    pub fn leaf(&self) -> &[u8] {
        &self.chain[0]
    }

    /// The leaf's SPIFFE ID (its URI SAN), if it has one weft accepts.
    pub fn id(&self) -> Option<SpiffeId> {
        peer_id(&self.chain)
    }

    /// When the leaf expires.
    pub fn not_after(&self) -> Result<SystemTime, String> {
        validity(&self.chain[0]).map(|(_, to)| to)
    }

    /// When the leaf became valid.
    pub fn not_before(&self) -> Result<SystemTime, String> {
        validity(&self.chain[0]).map(|(from, _)| from)
    }
}

/// The certificates in `pem` as trust anchors; none is an error.
pub fn roots_from_pem(pem: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(roots)
}

/// A certificate chain (leaf first) and its key, from PEM.
pub fn chain_and_key(chain_pem: &str, key_pem: &str) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err("certificate chain: no CERTIFICATE block".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("private key: {e}"))?;
    Ok((chain, key))
}

/// Unix seconds of `t` (0 before the epoch): how certificate times travel in reports and
/// metrics.
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A certificate's validity period.
pub fn validity(der: &[u8]) -> Result<(SystemTime, SystemTime), String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let at = |t: ASN1Time| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(t.timestamp().max(0) as u64);
    Ok((at(cert.validity().not_before), at(cert.validity().not_after)))
}

/// Which servers a client accepts: those of `trust_domain` holding one of `ids` (any of the
/// trust domain when `ids` is empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Expect {
    pub trust_domain: String,
    pub ids: Vec<SpiffeId>,
}

impl Expect {
    pub fn one(id: SpiffeId) -> Expect {
        Expect { trust_domain: id.trust_domain().to_string(), ids: vec![id] }
    }

    fn check(&self, got: Option<SpiffeId>) -> Result<(), String> {
        match got {
            Some(id) if self.ids.contains(&id) => Ok(()),
            Some(id) if self.ids.is_empty() && id.trust_domain() == self.trust_domain => Ok(()),
            Some(id) if id.trust_domain() != self.trust_domain => {
                Err(format!("server identity {id} is not of trust domain {:?}", self.trust_domain))
            }
            Some(id) => Err(format!(
                "server identity {id} is not the expected {}",
                self.ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" or ")
            )),
            None => Err("server certificate has no SPIFFE ID (URI SAN)".into()),
        }
    }
}

/// The server side: a client certificate chaining to the mesh root, with a SPIFFE ID of
/// `trust_domain`, is required.
pub fn server_config(c: &Credentials, trust_domain: &str) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = crypto_provider();
    let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(c.roots.clone(), provider.clone())
        .build()
        .map_err(|e| format!("client verifier: {e}"))?;
    let verifier = Arc::new(SpiffeClientVerifier { inner, trust_domain: trust_domain.to_string(), revoked: c.revoked.clone() });
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(c.chain.clone(), c.key.clone_key())
        .map_err(|e| format!("server certificate: {e}"))?;
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // No resumption between sidecars: a resumed session skips the certificate checks, so an
    // expired (or rotated-out) leaf would go on opening connections. Pools keep connections
    // open, so full handshakes are per connection, not per request.
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// A server for clients outside the mesh: the listener's own certificate, no client
/// certificate asked for.
pub fn terminate_config(chain_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, String> {
    let (chain, key) = chain_and_key(chain_pem, key_pem)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("certificate: {e}"))?;
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// A client for a server outside the mesh: webpki's checks against `roots` (the system's when
/// `None`), the server name checked too; ALPN `alpn`.
pub fn simple_client_config(roots_pem: Option<&str>, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    let roots = match roots_pem {
        Some(pem) => roots_from_pem(pem).map_err(|e| format!("roots: {e}"))?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found.errors.first().map_or(String::new(), |e| format!(": {e}"));
                return Err(format!("no system root certificates found{why}; give ca_file"));
            }
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err("roots: no usable system root certificate; give ca_file".into());
            }
            roots
        }
    };
    let mut cfg = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(cfg))
}

/// The client side, presenting its own certificate and accepting only a server whose chain
/// leads to the mesh root and whose ID is one `expect` allows; ALPN `alpn`.
pub fn client_config(c: &Credentials, expect: Expect, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = crypto_provider();
    let verifier = Arc::new(SpiffeVerifier { roots: c.roots.clone(), provider: provider.clone(), expect, revoked: c.revoked.clone() });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(c.chain.clone(), c.key.clone_key())
        .map_err(|e| format!("client certificate: {e}"))?;
    cfg.alpn_protocols = vec![alpn.to_vec()];
    // See `server_config`: every connection checks both certificates.
    cfg.resumption = rustls::client::Resumption::disabled();
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
    expect: Expect,
    revoked: Revoked,
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
        let id = peer_id(std::slice::from_ref(end_entity));
        self.expect.check(id.clone()).map_err(rustls::Error::General)?;
        if let Some(id) = &id {
            self.revoked.check_leaf(end_entity, id)?;
        }
        Ok(ServerCertVerified::assertion())
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

/// webpki's client checks, then the client's SPIFFE ID: it must have one, of this trust domain
/// (authorization by ID comes after the handshake).
#[derive(Debug)]
struct SpiffeClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
    revoked: Revoked,
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(&self, end_entity: &CertificateDer<'_>, intermediates: &[CertificateDer<'_>], now: UnixTime) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        match peer_id(std::slice::from_ref(end_entity)) {
            Some(id) if id.trust_domain() == self.trust_domain => {
                self.revoked.check_leaf(end_entity, &id)?;
                Ok(ok)
            }
            Some(id) => Err(rustls::Error::General(format!("client identity {id} is not of trust domain {:?}", self.trust_domain))),
            None => Err(rustls::Error::General("client certificate has no SPIFFE ID (URI SAN)".into())),
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Why a handshake failed, as a metric label: what an operator can act on.
pub fn failure_reason(e: &rustls::Error) -> &'static str {
    use rustls::{CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => "expired",
        E::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => "not_yet_valid",
        E::InvalidCertificate(C::UnknownIssuer) => "unknown_issuer",
        E::InvalidCertificate(C::BadSignature) => "bad_signature",
        E::InvalidCertificate(C::Revoked) => "revoked",
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => "wrong_name",
        E::InvalidCertificate(_) => "bad_certificate",
        E::NoCertificatesPresented => "no_client_certificate",
        E::General(m) if m.contains("is revoked") => "revoked",
        E::General(m) if m.contains("no SPIFFE ID") => "no_spiffe_id",
        E::General(m) if m.contains("trust domain") => "wrong_trust_domain",
        E::General(m) if m.contains("is not the expected") => "wrong_identity",
        E::AlertReceived(_) => "peer_alert",
        E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } | E::InvalidMessage(_) => "not_tls",
        _ => "error",
    }
}

/// The HTTP/1.1 `400` (header `x-weft-error: tls_required`) a plaintext client of a TLS-only
/// port gets, with `body` saying what to do instead, so a person with curl can read it.
pub fn tls_required_response(body: &str) -> String {
    format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nx-weft-error: tls_required\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{CERTIFICATE, PRIVATE_KEY, pem_encode};

    /// A root and a leaf for each ID it signs (URI SAN), as PEM.
    struct Pki {
        root_pem: String,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        fn new() -> Pki {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::default();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
            p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
            let root = p.self_signed(&key).unwrap();
            Pki { root_pem: pem_encode(CERTIFICATE, root.der()), issuer: rcgen::Issuer::new(p, key) }
        }

        fn credentials(&self, id: &str) -> Credentials {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::default();
            p.subject_alt_names = vec![rcgen::SanType::URI(rcgen::string::Ia5String::try_from(id).unwrap())];
            let leaf = p.signed_by(&key, &self.issuer).unwrap();
            Credentials::from_pem(&pem_encode(CERTIFICATE, leaf.der()), &pem_encode(PRIVATE_KEY, &key.serialize_der()), &self.root_pem).unwrap()
        }
    }

    /// Runs a handshake between the two in memory, to its end.
    fn handshake(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
        let mut buf = Vec::new();
        for _ in 0..10 {
            if !client.is_handshaking() && !server.is_handshaking() && !client.wants_write() && !server.wants_write() {
                return;
            }
            buf.clear();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            server.process_new_packets().unwrap();
            buf.clear();
            while server.wants_write() {
                server.write_tls(&mut buf).unwrap();
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            client.process_new_packets().unwrap();
        }
        panic!("the handshake did not finish");
    }

    /// Between weft's own sides: one round trip (no HelloRetryRequest), X25519, AES-128-GCM,
    /// and the client's ID read back on the server.
    #[test]
    fn sidecars_agree_on_x25519_in_one_round_trip() {
        let pki = Pki::new();
        let server_id = "spiffe://mesh.test/service/model";
        let client_id = "spiffe://mesh.test/ns/apps/sa/web";
        let server_cfg = server_config(&pki.credentials(server_id), "mesh.test").unwrap();
        let client_cfg = client_config(&pki.credentials(client_id), Expect::one(server_id.parse().unwrap()), b"h2").unwrap();
        let mut client = rustls::ClientConnection::new(client_cfg, ServerName::try_from("model").unwrap()).unwrap();
        let mut server = rustls::ServerConnection::new(server_cfg).unwrap();
        handshake(&mut client, &mut server);
        for (kind, group, suite) in [
            (client.handshake_kind(), client.negotiated_key_exchange_group().map(|g| g.name()), client.negotiated_cipher_suite().map(|s| s.suite())),
            (server.handshake_kind(), server.negotiated_key_exchange_group().map(|g| g.name()), server.negotiated_cipher_suite().map(|s| s.suite())),
        ] {
            assert_eq!(kind, Some(rustls::HandshakeKind::Full));
            assert_eq!(group, Some(rustls::NamedGroup::X25519));
            assert_eq!(suite, Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256));
        }
        assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));
        assert_eq!(server.peer_certificates().and_then(peer_id).map(|i| i.to_string()).as_deref(), Some(client_id));
    }
}

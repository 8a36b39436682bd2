//! The mesh CA: weft-control signs sidecars' certificate signing requests into short-lived
//! leaf certificates whose one URI SAN is the SPIFFE ID the caller was admitted as.
//!
//! What a CSR asks for is checked, never trusted: the subject, extensions and validity are
//! the CA's own (a CSR cannot make itself a CA, outlive the lifetime, or add names), and a
//! CSR asking for an identity other than the one its caller holds, or in another trust domain,
//! is refused naming both. Each leaf gets a random serial (rcgen's default would repeat it for
//! a re-issue under the same key). Pure: keys and certificates in, PEM out; where the root is
//! kept is the caller's business.

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, string::Ia5String,
};
use std::time::{Duration, SystemTime};
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer, PrivatePkcs8KeyDer, pem::PemObject};
use weft_proxy::identity::{self, SpiffeId, check_trust_domain, pem_encode};

/// A leaf's lifetime unless told otherwise (Linkerd and Istio issue 24 h leaves too).
pub const DEFAULT_LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How far a certificate's `not_before` lies in the past, for clocks a little behind the
/// CA's: a minute, or a tenth of a short lifetime (so renewal at two thirds stays after issue).
fn backdate(lifetime: Duration) -> Duration {
    Duration::from_secs(60).min(lifetime / 10)
}

/// Why a CSR was refused (`field` names what was wrong, as the API's errors do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for CaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}
impl std::error::Error for CaError {}

fn refuse<T>(field: &'static str, message: impl Into<String>) -> Result<T, CaError> {
    Err(CaError { field, message: message.into() })
}

/// A signed leaf.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// When a leaf should be renewed: the sidecars' rule (two thirds through its life, so a
/// renewal has a third of it to succeed in, a control plane down for hours).
pub use weft_proxy::xds::issue::renew_at;

/// The key stays out of `Debug`.
pub struct MeshCa {
    trust_domain: String,
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

impl std::fmt::Debug for MeshCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshCa").field("trust_domain", &self.trust_domain).finish_non_exhaustive()
    }
}

impl MeshCa {
    /// A new self-signed root for `trust_domain`, valid for `lifetime` from `now`.
    pub fn generate(trust_domain: &str, now: SystemTime, lifetime: Duration) -> Result<MeshCa, CaError> {
        check_trust_domain(trust_domain).map_err(|e| CaError { field: "trust_domain", message: e.0 })?;
        let key = KeyPair::generate().map_err(|e| CaError { field: "key", message: e.to_string() })?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "weft");
        dn.push(DnType::CommonName, format!("weft mesh CA {trust_domain}"));
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        // The root names its trust domain, so a sidecar given the wrong root can say so.
        let uri = Ia5String::try_from(format!("spiffe://{trust_domain}")).map_err(|e| CaError { field: "trust_domain", message: e.to_string() })?;
        p.subject_alt_names = vec![SanType::URI(uri)];
        p.not_before = offset(now - backdate(lifetime));
        p.not_after = offset(now + lifetime);
        p.serial_number = Some(SerialNumber::from(rand::random::<u64>()));
        let cert = p.self_signed(&key).map_err(|e| CaError { field: "key", message: e.to_string() })?;
        let cert_pem = pem_encode(identity::CERTIFICATE, cert.der());
        let key_pem = pem_encode(identity::PRIVATE_KEY, &key.serialize_der());
        Ok(MeshCa { trust_domain: trust_domain.into(), cert_pem, key_pem, issuer: Issuer::new(p, key) })
    }

    /// The CA from its certificate and key (PEM), as [`MeshCa::cert_pem`] and
    /// [`MeshCa::key_pem`] gave them, or a CA of the user's own (bring your own root: it must
    /// be a CA certificate whose key is this one).
    pub fn from_pem(trust_domain: &str, cert_pem: &str, key_pem: &str) -> Result<MeshCa, CaError> {
        check_trust_domain(trust_domain).map_err(|e| CaError { field: "trust_domain", message: e.0 })?;
        let bad_key = |e: String| CaError { field: "key", message: format!("not a PEM PKCS#8 private key: {e}") };
        let key_der = PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad_key(e.to_string()))?;
        let key = KeyPair::try_from(&key_der).map_err(|e| bad_key(e.to_string()))?;
        let bad_cert = |e: String| CaError { field: "cert", message: format!("not a PEM CA certificate: {e}") };
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| bad_cert(e.to_string()))?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| bad_cert(e.to_string()))?;
        Ok(MeshCa { trust_domain: trust_domain.into(), cert_pem: cert_pem.into(), key_pem: key_pem.into(), issuer })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The root certificate sidecars trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The root's private key (to persist it; never sent to a sidecar).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Sign `csr_pem` for `holder`, the identity its caller was admitted as, valid for
    /// `lifetime` from `now`.
    pub fn sign(&self, csr_pem: &str, holder: &SpiffeId, now: SystemTime, lifetime: Duration) -> Result<Leaf, CaError> {
        if holder.trust_domain() != self.trust_domain {
            return refuse("identity", format!("{holder} is not in this mesh's trust domain {:?}", self.trust_domain));
        }
        // Parsing checks the CSR's self-signature: its sender holds the key it names.
        let bad = |e: String| CaError { field: "csr", message: format!("not a valid PEM certificate signing request: {e}") };
        let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
        let mut csr = CertificateSigningRequestParams::from_der(&der).map_err(|e| bad(e.to_string()))?;
        let asked: Vec<&str> = csr
            .params
            .subject_alt_names
            .iter()
            .filter_map(|s| if let SanType::URI(u) = s { Some(u.as_str()) } else { None })
            .collect();
        let want = holder.to_string();
        match asked.as_slice() {
            [] => return refuse("csr", format!("the CSR names no URI SAN; it must ask for {want}")),
            [one] if *one == want => {}
            [one] => return refuse("csr", format!("the CSR asks for {one}, but its caller is {want}")),
            many => return refuse("csr", format!("the CSR asks for {} identities ({}); a leaf carries one", many.len(), many.join(", "))),
        }
        if csr.params.subject_alt_names.len() != 1 {
            return refuse("csr", "the CSR asks for names besides its SPIFFE ID (DNS, IP, e-mail); a leaf carries its ID only");
        }
        let p = &mut csr.params;
        p.distinguished_name = DistinguishedName::new();
        p.is_ca = IsCa::NoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        p.custom_extensions.clear();
        p.name_constraints = None;
        p.crl_distribution_points.clear();
        p.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = (now - backdate(lifetime), now + lifetime);
        p.not_before = offset(not_before);
        p.not_after = offset(not_after);
        p.serial_number = Some(SerialNumber::from(rand::random::<[u8; 16]>().to_vec()));
        let leaf = csr.signed_by(&self.issuer).map_err(|e| CaError { field: "csr", message: format!("signing: {e}") })?;
        Ok(Leaf { cert_pem: pem_encode(identity::CERTIFICATE, leaf.der()), not_before, not_after })
    }

    /// A control node's own serving certificate and a new key for it, for `names` (DNS names,
    /// or IP addresses written as such), valid for `lifetime` from `now`. Server and client
    /// auth both: a node presents it to its peers when they ask for a client certificate.
    pub fn serving_cert(&self, names: &[String], now: SystemTime, lifetime: Duration) -> Result<ServingCert, CaError> {
        if names.is_empty() {
            return refuse("names", "a serving certificate needs at least one DNS name or IP address");
        }
        let key = KeyPair::generate().map_err(|e| CaError { field: "key", message: e.to_string() })?;
        let mut p = CertificateParams::new(names.to_vec()).map_err(|e| CaError { field: "names", message: e.to_string() })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, names[0].clone());
        p.distinguished_name = dn;
        p.is_ca = IsCa::NoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        p.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = (now - backdate(lifetime), now + lifetime);
        p.not_before = offset(not_before);
        p.not_after = offset(not_after);
        p.serial_number = Some(SerialNumber::from(rand::random::<[u8; 16]>().to_vec()));
        let cert = p.signed_by(&key, &self.issuer).map_err(|e| CaError { field: "names", message: format!("signing: {e}") })?;
        Ok(ServingCert {
            cert_pem: pem_encode(identity::CERTIFICATE, cert.der()),
            key_pem: pem_encode(identity::PRIVATE_KEY, &key.serialize_der()),
        })
    }
}

/// A control node's serving certificate (PEM) and its key (PKCS#8 PEM).
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::UnixTime;

    fn now() -> SystemTime {
        SystemTime::now()
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    /// Whether `leaf` chains to `root` at `at`, as a TLS peer checks it (webpki through rustls).
    fn chains(root: &str, leaf: &str, at: SystemTime) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(root)).unwrap();
        let leaf = der(leaf);
        let parsed = rustls::server::ParsedCertificate::try_from(&leaf)?;
        let algs = weft_proxy::identity::crypto_provider().signature_verification_algorithms;
        let at = UnixTime::since_unix_epoch(at.duration_since(SystemTime::UNIX_EPOCH).unwrap());
        rustls::client::verify_server_cert_signed_by_trust_anchor(&parsed, &roots, &[], at, algs.all)
    }

    #[test]
    fn a_signed_leaf_chains_to_the_root_carries_the_id_and_expires() {
        let ca = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600 * 24 * 365)).unwrap();
        let id = SpiffeId::workload("mesh.local", "default", "ranker").unwrap();
        let req = weft_proxy::identity::request(&id).unwrap();
        let leaf = ca.sign(&req.csr_pem, &id, now(), Duration::from_secs(30)).unwrap();
        chains(ca.cert_pem(), &leaf.cert_pem, now()).unwrap();
        assert_eq!(weft_proxy::identity::uri_sans(&der(&leaf.cert_pem)).unwrap(), [id.to_string()]);
        let expired = chains(ca.cert_pem(), &leaf.cert_pem, now() + Duration::from_secs(120)).unwrap_err();
        assert!(expired.to_string().contains("expired"), "{expired}");
        assert_eq!(leaf.not_after.duration_since(leaf.not_before).unwrap(), Duration::from_secs(33), "backdated a tenth");
        assert!(renew_at(leaf.not_before, leaf.not_after) > now() + Duration::from_secs(15), "renewed well after issue");

        // Another mesh's root does not vouch for it.
        let other = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600)).unwrap();
        assert!(chains(other.cert_pem(), &leaf.cert_pem, now()).is_err());
        // Two leaves for the same key get different serials.
        let again = ca.sign(&req.csr_pem, &id, now(), Duration::from_secs(30)).unwrap();
        assert_ne!(again.cert_pem, leaf.cert_pem);
    }

    #[test]
    fn the_ca_survives_a_restart_from_its_pem() {
        let ca = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600)).unwrap();
        let back = MeshCa::from_pem("mesh.local", ca.cert_pem(), ca.key_pem()).unwrap();
        let id = SpiffeId::service("mesh.local", "chat").unwrap();
        let leaf = back.sign(&weft_proxy::identity::request(&id).unwrap().csr_pem, &id, now(), DEFAULT_LEAF_LIFETIME).unwrap();
        chains(ca.cert_pem(), &leaf.cert_pem, now()).unwrap();
        let e = MeshCa::from_pem("mesh.local", ca.cert_pem(), "garbage").unwrap_err();
        assert_eq!(e.field, "key");
    }

    #[test]
    fn bad_csrs_are_refused_naming_why() {
        let ca = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600)).unwrap();
        let me = SpiffeId::service("mesh.local", "chat").unwrap();
        let someone_else = SpiffeId::service("mesh.local", "admin").unwrap();
        let life = Duration::from_secs(60);
        let garbage = ca.sign("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", &me, now(), life);
        assert_eq!(garbage.unwrap_err().field, "csr");
        assert_eq!(ca.sign("not pem at all", &me, now(), life).unwrap_err().field, "csr");
        let theirs = weft_proxy::identity::request(&someone_else).unwrap();
        let e = ca.sign(&theirs.csr_pem, &me, now(), life).unwrap_err();
        assert!(e.message.contains("asks for spiffe://mesh.local/service/admin") && e.message.contains("caller is spiffe://mesh.local/service/chat"), "{e}");
        let foreign = SpiffeId::service("other.mesh", "chat").unwrap();
        let e = ca.sign(&weft_proxy::identity::request(&foreign).unwrap().csr_pem, &foreign, now(), life).unwrap_err();
        assert!(e.field == "identity" && e.message.contains("trust domain"), "{e}");
        // A CSR with no URI SAN, or with extra names.
        let key = KeyPair::generate().unwrap();
        let bare = CertificateParams::new(vec!["chat.example".into()]).unwrap().serialize_request(&key).map(|c| pem_encode(identity::CSR, c.der())).unwrap();
        assert!(ca.sign(&bare, &me, now(), life).unwrap_err().message.contains("no URI SAN"));
        let mut p = CertificateParams::new(vec!["chat.example".into()]).unwrap();
        p.subject_alt_names.push(SanType::URI(Ia5String::try_from(me.to_string()).unwrap()));
        let extra = p.serialize_request(&key).map(|c| pem_encode(identity::CSR, c.der())).unwrap();
        assert!(ca.sign(&extra, &me, now(), life).unwrap_err().message.contains("besides its SPIFFE ID"));
    }

    /// A sidecar's credentials for `id`, issued by `ca`, trusting `trust`'s root.
    fn credentials(ca: &MeshCa, id: &SpiffeId, trust: &MeshCa) -> weft_proxy::tls::Credentials {
        let req = weft_proxy::identity::request(id).unwrap();
        let leaf = ca.sign(&req.csr_pem, id, now(), Duration::from_secs(3600)).unwrap();
        weft_proxy::tls::Credentials::from_pem(&leaf.cert_pem, &req.key_pem, trust.cert_pem()).unwrap()
    }

    /// A TLS handshake in memory between `client` and `server`; the server's view of the
    /// client's identity, or the first side's error.
    fn handshake(client: std::sync::Arc<rustls::ClientConfig>, server: std::sync::Arc<rustls::ServerConfig>) -> Result<(Option<SpiffeId>, Vec<u8>), String> {
        let name = rustls::pki_types::ServerName::try_from("chat.mesh").unwrap();
        let mut c = rustls::ClientConnection::new(client, name).unwrap();
        let mut s = rustls::ServerConnection::new(server).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets().map_err(|e| format!("server: {e}"))?;
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut &buf[..]).unwrap();
            c.process_new_packets().map_err(|e| format!("client: {e}"))?;
            if !c.is_handshaking() && !s.is_handshaking() {
                let peer = s.peer_certificates().and_then(weft_proxy::tls::peer_id);
                return Ok((peer, c.alpn_protocol().unwrap_or_default().to_vec()));
            }
        }
        Err("handshake did not finish".into())
    }

    #[test]
    fn sidecars_authenticate_each_other_by_spiffe_id() {
        use weft_proxy::tls::{client_config, server_config};
        let ca = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600)).unwrap();
        let client_id = SpiffeId::workload("mesh.local", "apps", "web").unwrap();
        let server_id = SpiffeId::service("mesh.local", "chat").unwrap();
        let (client, server) = (credentials(&ca, &client_id, &ca), credentials(&ca, &server_id, &ca));
        let server_cfg = server_config(&server, "mesh.local").unwrap();
        let (seen, alpn) = handshake(client_config(&client, weft_proxy::tls::Expect::one(server_id.clone()), b"h2").unwrap(), server_cfg.clone()).unwrap();
        assert_eq!(seen, Some(client_id.clone()), "the server reads the client's ID");
        assert_eq!(alpn, b"h2");

        // The client expected someone else: refused, naming both.
        let wrong = SpiffeId::service("mesh.local", "admin").unwrap();
        let e = handshake(client_config(&client, weft_proxy::tls::Expect::one(wrong), b"h2").unwrap(), server_cfg.clone()).unwrap_err();
        assert!(e.starts_with("client:") && e.contains("spiffe://mesh.local/service/chat is not the expected spiffe://mesh.local/service/admin"), "{e}");

        // A client whose leaf another CA signed (same ID, trusting the real root): the server
        // refuses it.
        let rogue_ca = MeshCa::generate("mesh.local", now(), Duration::from_secs(3600)).unwrap();
        let rogue = credentials(&rogue_ca, &client_id, &ca);
        let e = handshake(client_config(&rogue, weft_proxy::tls::Expect::one(server_id.clone()), b"h2").unwrap(), server_cfg.clone()).unwrap_err();
        assert!(e.starts_with("server:"), "{e}");
        // And a server with a rogue leaf is refused by the client.
        let rogue_server = server_config(&credentials(&rogue_ca, &server_id, &ca), "mesh.local").unwrap();
        let e = handshake(client_config(&client, weft_proxy::tls::Expect::one(server_id), b"h2").unwrap(), rogue_server).unwrap_err();
        assert!(e.starts_with("client:"), "{e}");
    }

    #[test]
    fn renewal_is_two_thirds_through() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(renew_at(t0, t0 + Duration::from_secs(90)), t0 + Duration::from_secs(60));
        assert_eq!(renew_at(t0, t0 + DEFAULT_LEAF_LIFETIME), t0 + Duration::from_secs(16 * 3600));
    }
}

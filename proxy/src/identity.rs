//! Workload identity for mutual TLS: SPIFFE IDs, and the sidecar's side of certificate issuance.
//!
//! A sidecar's identity is a SPIFFE ID, `spiffe://TRUST_DOMAIN/ns/NS/sa/NAME` (a workload
//! account in a namespace) or `spiffe://TRUST_DOMAIN/service/NAME`, carried as the one URI SAN
//! of its leaf certificate. The sidecar makes its own key pair and sends the mesh CA
//! (weft-control) only a certificate signing request: the private key never leaves the
//! sidecar, and on disk it is readable by its owner alone (mode 0600).
//!
//! Pure but for [`write_key`]: parsing, the CSR, reading SANs back from a certificate.

use std::fmt;
use std::path::Path;

/// A SPIFFE ID weft issues certificates for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    trust_domain: String,
    path: String,
}

/// Why a string is not a SPIFFE ID weft issues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdError(pub String);

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for IdError {}

fn bad<T>(why: impl Into<String>) -> Result<T, IdError> {
    Err(IdError(why.into()))
}

/// A trust domain (SPIFFE: lowercase letters, digits, `.`, `-`, `_`; at most 255 bytes).
pub fn check_trust_domain(td: &str) -> Result<(), IdError> {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b);
    if td.is_empty() || td.len() > 255 || !td.bytes().all(ok) {
        return bad(format!("trust domain {td:?}: lowercase letters, digits, '.', '-' and '_' only, 1 to 255 of them"));
    }
    Ok(())
}

/// A path segment: what a Kubernetes name may hold, and `_` (SPIFFE allows letters, digits,
/// `.`, `-`, `_`; weft keeps to names that are also valid resource names).
fn check_segment(what: &str, s: &str) -> Result<(), IdError> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
    if s.is_empty() || s.len() > 253 || s == "." || s == ".." || !s.bytes().all(ok) {
        return bad(format!("{what} {s:?}: letters, digits, '.', '-' and '_' only, 1 to 253 of them"));
    }
    Ok(())
}

impl SpiffeId {
    /// `spiffe://TD/ns/NS/sa/NAME`: a workload account.
    pub fn workload(trust_domain: &str, namespace: &str, account: &str) -> Result<SpiffeId, IdError> {
        check_trust_domain(trust_domain)?;
        check_segment("namespace", namespace)?;
        check_segment("service account", account)?;
        Ok(SpiffeId { trust_domain: trust_domain.into(), path: format!("/ns/{namespace}/sa/{account}") })
    }

    /// `spiffe://TD/service/NAME`: a service.
    pub fn service(trust_domain: &str, name: &str) -> Result<SpiffeId, IdError> {
        check_trust_domain(trust_domain)?;
        check_segment("service", name)?;
        Ok(SpiffeId { trust_domain: trust_domain.into(), path: format!("/service/{name}") })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The path, from its leading `/`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The workload's namespace, for `/ns/NS/sa/NAME` IDs.
    pub fn namespace(&self) -> Option<&str> {
        let mut segs = self.path.split('/').skip(1);
        (segs.next() == Some("ns")).then(|| segs.next()).flatten()
    }
}

impl std::str::FromStr for SpiffeId {
    type Err = IdError;

    /// Only the two forms weft issues; anything else (a query, a port, other paths) is refused
    /// with what was wrong.
    fn from_str(s: &str) -> Result<SpiffeId, IdError> {
        let Some(rest) = s.strip_prefix("spiffe://") else { return bad(format!("{s:?} is not a spiffe:// URI")) };
        let (td, path) = rest.split_once('/').unwrap_or((rest, ""));
        let segs: Vec<&str> = path.split('/').collect();
        match segs.as_slice() {
            ["ns", ns, "sa", sa] => SpiffeId::workload(td, ns, sa),
            ["service", name] => SpiffeId::service(td, name),
            _ => bad(format!("{s:?}: the path must be /ns/NAMESPACE/sa/ACCOUNT or /service/NAME")),
        }
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}{}", self.trust_domain, self.path)
    }
}

/// The TLS crypto provider every weft TLS configuration uses: rustls on ring, passed
/// explicitly rather than installed process-wide. rustls 0.23.48 deprecates ring's default
/// provider because ring has no post-quantum key exchange (X25519MLKEM768); aws-lc-rs has it
/// but needs a C/CMake toolchain and builds slowly, which DESIGN.md ruled out for now. This is
/// the one place that choice is made.
///
/// Key exchange: X25519 first, then P-256, then P-384 ([`KX_GROUPS`]). The ring provider's own
/// default list puts P-384 first, and a TLS 1.3 client sends its key share for its first group
/// only, while a rustls server takes the client's order: a weft client then made every peer do
/// P-384 ECDH (ring's P-384 is generic bignum code, several times the cost of its X25519 or
/// P-256; it was half the CPU of a full handshake), and a server preferring X25519 (Envoy,
/// OpenSSL) answered it with a HelloRetryRequest, a second round trip and key generation.
///
/// Cipher suites: the provider's, with AES-128-GCM first (as BoringSSL and Go order them)
/// instead of AES-256-GCM-SHA384, whose SHA-384 (the transcript hash and the key schedule of a
/// TLS 1.3 handshake) ring runs in generic code, where its SHA-256 uses the CPU's SHA
/// instructions; AES-128 also takes 10 rounds per block to AES-256's 14 on pooled connections.
/// Every suite stays offered and accepted; a server still follows the client's order.
#[allow(deprecated)]
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    use rustls::CipherSuite as S;
    let mut p = rustls::crypto::ring::default_provider();
    p.kx_groups = KX_GROUPS.to_vec();
    // Stable: the rest keep the provider's order (suites of the other TLS version are skipped
    // when one is chosen, so where they sit among these does not matter).
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            S::TLS13_AES_128_GCM_SHA256 | S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    std::sync::Arc::new(p)
}

/// The key-exchange groups weft offers and accepts, most preferred first: see
/// [`crypto_provider`].
pub static KX_GROUPS: &[&dyn rustls::crypto::SupportedKxGroup] = {
    use rustls::crypto::ring::kx_group::{SECP256R1, SECP384R1, X25519};
    &[X25519, SECP256R1, SECP384R1]
};

/// A sidecar's new key pair (PKCS#8 PEM) and the CSR (PEM) asking for `id`.
pub struct Request {
    pub key_pem: String,
    pub csr_pem: String,
}

/// Make a P-256 key pair and a CSR for `id` (its one URI SAN).
pub fn request(id: &SpiffeId) -> Result<Request, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| format!("generating a key pair: {e}"))?;
    let mut params = rcgen::CertificateParams::default();
    let uri = rcgen::string::Ia5String::try_from(id.to_string()).map_err(|e| format!("{id}: {e}"))?;
    params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params.serialize_request(&key).map_err(|e| format!("making the CSR: {e}"))?;
    Ok(Request { key_pem: pem_encode(PRIVATE_KEY, &key.serialize_der()), csr_pem: pem_encode(CSR, csr.der()) })
}

/// PEM labels weft writes.
pub const CERTIFICATE: &str = "CERTIFICATE";
pub const PRIVATE_KEY: &str = "PRIVATE KEY";
pub const CSR: &str = "CERTIFICATE REQUEST";

/// `der` as one PEM block (RFC 7468: base64 in lines of 64). Reading PEM back is
/// rustls-pki-types' `PemObject`.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Write a private key readable by its owner only (created with mode 0600, not chmod-ed
/// afterwards, so it is never readable by others even for an instant); replaces the file
/// atomically (rename), so a reader sees the old key or the new one.
pub fn write_key(path: &Path, pem: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(pem.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The URI SANs of a DER certificate (the SPIFFE ID is the one weft issues).
pub fn uri_sans(der: &[u8]) -> Result<Vec<String>, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(u) = name {
                out.push(u.to_string());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_forms_parse_and_print_back() {
        for s in ["spiffe://mesh.local/ns/default/sa/ranker", "spiffe://prod-1/service/chat_a"] {
            let id: SpiffeId = s.parse().unwrap();
            assert_eq!(id.to_string(), s);
        }
        let id: SpiffeId = "spiffe://mesh.local/ns/ml/sa/trainer".parse().unwrap();
        assert_eq!((id.trust_domain(), id.namespace()), ("mesh.local", Some("ml")));
        assert_eq!("spiffe://td/service/x".parse::<SpiffeId>().unwrap().namespace(), None);
    }

    #[test]
    fn anything_else_is_refused_saying_what() {
        for (s, why) in [
            ("https://mesh.local/service/a", "not a spiffe://"),
            ("spiffe://Mesh.Local/service/a", "trust domain"),
            ("spiffe://mesh.local:443/service/a", "trust domain"),
            ("spiffe:///service/a", "trust domain"),
            ("spiffe://mesh.local", "the path must be"),
            ("spiffe://mesh.local/ns/a/sa", "the path must be"),
            ("spiffe://mesh.local/service/a/b", "the path must be"),
            ("spiffe://mesh.local/service/..", "service"),
            ("spiffe://mesh.local/service/a?x=1", "service"),
            ("spiffe://mesh.local/ns/a b/sa/c", "namespace"),
        ] {
            let e = s.parse::<SpiffeId>().unwrap_err();
            assert!(e.0.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn a_request_holds_a_csr_for_the_id_and_a_key_that_signs_it() {
        let id = SpiffeId::service("mesh.local", "chat").unwrap();
        let r = request(&id).unwrap();
        assert!(r.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{}", r.key_pem);
        // The CSR parses, its self-signature checks, and it asks for the ID.
        use rustls::pki_types::{CertificateSigningRequestDer, pem::PemObject};
        let der = CertificateSigningRequestDer::from_pem_slice(r.csr_pem.as_bytes()).unwrap();
        let csr = rcgen::CertificateSigningRequestParams::from_der(&der).unwrap();
        let uris: Vec<String> = csr
            .params
            .subject_alt_names
            .iter()
            .filter_map(|s| if let rcgen::SanType::URI(u) = s { Some(u.as_str().to_string()) } else { None })
            .collect();
        assert_eq!(uris, [id.to_string()]);
        assert!(!r.csr_pem.contains("PRIVATE KEY"), "the CSR carries no key");
    }

    #[test]
    fn key_exchange_prefers_x25519_and_keeps_every_group() {
        use rustls::NamedGroup;
        let names: Vec<NamedGroup> = crypto_provider().kx_groups.iter().map(|g| g.name()).collect();
        assert_eq!(names, [NamedGroup::X25519, NamedGroup::secp256r1, NamedGroup::secp384r1]);
    }

    #[test]
    fn aes_128_gcm_comes_first_and_no_suite_is_dropped() {
        use rustls::CipherSuite as S;
        #[allow(deprecated)]
        let default = rustls::crypto::ring::default_provider().cipher_suites;
        let ours = crypto_provider().cipher_suites.clone();
        assert_eq!(ours[0].suite(), S::TLS13_AES_128_GCM_SHA256);
        let tls13: Vec<S> = ours.iter().filter(|s| s.tls13().is_some()).map(|s| s.suite()).collect();
        assert_eq!(tls13, [S::TLS13_AES_128_GCM_SHA256, S::TLS13_AES_256_GCM_SHA384, S::TLS13_CHACHA20_POLY1305_SHA256]);
        let mut a: Vec<u16> = ours.iter().map(|s| u16::from(s.suite())).collect();
        let mut b: Vec<u16> = default.iter().map(|s| u16::from(s.suite())).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    #[test]
    fn the_key_file_is_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf.key");
        write_key(&path, "-----BEGIN PRIVATE KEY-----\n").unwrap();
        write_key(&path, "-----BEGIN PRIVATE KEY-----\nnew\n").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&path).unwrap().ends_with("new\n"), "replaced");
        assert!(!path.with_extension("tmp").exists());
    }
}

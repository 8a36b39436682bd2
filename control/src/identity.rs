//! The mesh CA at run time: its root, join tokens, and the `weft.v1.Identity/Sign` RPC on the
//! xDS port.
//!
//! - The root is made by the first leader (kept in the Raft store under kind `meshca`, so every
//!   control node can sign and a new leader keeps it), or is the user's own, given to every
//!   node by `--ca-cert`/`--ca-key` (bring your own CA: then it is never stored).
//! - A join token (`weftctl identity token create`) admits one SPIFFE ID. Only a SHA-256 of its
//!   secret is stored (kind `jointokens`); the token itself is shown once. A sidecar uses it for
//!   its first certificate and for each renewal, until the token expires or is revoked.
//! - `Sign` takes a token and a CSR, and returns a leaf for the token's identity: the sidecar's
//!   key never leaves it. Any control node answers from its own replica (no Raft write).
//!
//! Neither kind is a resource of the API (`/v1/{kind}` does not list them).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use weft_proxy::identity::SpiffeId;
use weft_xds::resources::v1;

use crate::ca::{Leaf, MeshCa};
use crate::store::{Command, Node};

pub const CA_KIND: &str = "meshca";
const CA_NAME: &str = "root";
pub const TOKENS_KIND: &str = "jointokens";
/// Lifetime of the root a leader makes: renewing a root is a planned operation (bring the new
/// one in beside the old), so it is long.
const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);

#[derive(Serialize, Deserialize)]
struct StoredCa {
    trust_domain: String,
    cert_pem: String,
    key_pem: String,
}

/// A join token as stored: never its secret, only the secret's SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TokenRecord {
    pub identity: String,
    pub secret_sha256: String,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds; 0 = never.
    pub expires: u64,
    #[serde(default)]
    pub description: String,
}

/// A join token as handed out: `weft-join.ID.SECRET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
}

const TOKEN_PREFIX: &str = "weft-join";

impl JoinToken {
    pub fn generate() -> JoinToken {
        use base64::Engine;
        let id = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        JoinToken { id, secret }
    }

    pub fn parse(s: &str) -> Result<JoinToken, &'static str> {
        let mut parts = s.trim().split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(TOKEN_PREFIX), Some(id), Some(secret), None) if !id.is_empty() && !secret.is_empty() => {
                Ok(JoinToken { id: id.into(), secret: secret.into() })
            }
            _ => Err("not a join token (weft-join.ID.SECRET, as `weftctl identity token create` printed it)"),
        }
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{TOKEN_PREFIX}.{}.{}", self.id, self.secret)
    }
}

pub fn sha256_hex(s: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, s.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

use weft_proxy::tls::unix_secs as unix;

/// The identity a token admits at `now`, or why it admits none. Pure.
pub fn admit(record: Option<&TokenRecord>, token: &JoinToken, now: SystemTime) -> Result<SpiffeId, String> {
    let Some(r) = record else { return Err(format!("join token {} is unknown (or was revoked)", token.id)) };
    // Compared without an early exit: the time taken says nothing about the stored hash.
    let (a, b) = (sha256_hex(&token.secret), &r.secret_sha256);
    if a.len() != b.len() || a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0 {
        return Err(format!("join token {} does not match", token.id));
    }
    if r.expires != 0 && unix(now) >= r.expires {
        return Err(format!("join token {} expired", token.id));
    }
    r.identity.parse().map_err(|e: weft_proxy::identity::IdError| format!("join token {}: {e}", token.id))
}

/// `spiffe://…`, or a path under `trust_domain` (`ns/NS/sa/NAME`, `service/NAME`).
pub fn parse_identity(s: &str, trust_domain: &str) -> Result<SpiffeId, String> {
    let full = if s.starts_with("spiffe://") { s.to_string() } else { format!("spiffe://{trust_domain}/{}", s.trim_start_matches('/')) };
    let id: SpiffeId = full.parse().map_err(|e: weft_proxy::identity::IdError| e.0)?;
    if id.trust_domain() != trust_domain {
        return Err(format!("{id} is not in this mesh's trust domain {trust_domain:?}"));
    }
    Ok(id)
}

/// The mesh CA of one control node.
pub struct Authority {
    node: Arc<Node>,
    trust_domain: String,
    leaf_lifetime: Duration,
    /// `--ca-cert`/`--ca-key`.
    own: Option<Arc<MeshCa>>,
    /// The stored root, parsed, with the revision it was read at.
    stored: Mutex<Option<(u64, Arc<MeshCa>)>>,
}

impl Authority {
    pub fn new(node: Arc<Node>, trust_domain: &str, leaf_lifetime: Duration, own: Option<(&Path, &Path)>) -> anyhow::Result<Authority> {
        weft_proxy::identity::check_trust_domain(trust_domain).map_err(|e| anyhow::anyhow!("--trust-domain: {e}"))?;
        if leaf_lifetime < Duration::from_secs(10) {
            anyhow::bail!("--leaf-lifetime: {leaf_lifetime:?} is below the minimum of 10s");
        }
        let own = match own {
            None => None,
            Some((cert, key)) => {
                let read = |p: &Path, flag: &str| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", p.display()));
                let ca = MeshCa::from_pem(trust_domain, &read(cert, "--ca-cert")?, &read(key, "--ca-key")?)
                    .map_err(|e| anyhow::anyhow!("--ca-cert/--ca-key: {e}"))?;
                Some(Arc::new(ca))
            }
        };
        Ok(Authority { node, trust_domain: trust_domain.into(), leaf_lifetime, own, stored: Mutex::default() })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn leaf_lifetime(&self) -> Duration {
        self.leaf_lifetime
    }

    /// The CA that signs: the user's own, else the stored root (`None` until a leader made one).
    pub fn ca(&self) -> Result<Option<Arc<MeshCa>>, String> {
        if let Some(own) = &self.own {
            return Ok(Some(own.clone()));
        }
        let Some(r) = self.node.local().get(CA_KIND, CA_NAME).map_err(|e| e.to_string())? else { return Ok(None) };
        let mut cached = self.stored.lock().unwrap();
        if let Some((rev, ca)) = cached.as_ref()
            && *rev == r.revision
        {
            return Ok(Some(ca.clone()));
        }
        let s: StoredCa = serde_json::from_str(&r.value_json).map_err(|e| format!("stored mesh CA: {e}"))?;
        if s.trust_domain != self.trust_domain {
            return Err(format!(
                "the stored mesh CA is for trust domain {:?}, but this node runs with --trust-domain {:?}",
                s.trust_domain, self.trust_domain
            ));
        }
        let ca = Arc::new(MeshCa::from_pem(&s.trust_domain, &s.cert_pem, &s.key_pem).map_err(|e| format!("stored mesh CA: {e}"))?);
        *cached = Some((r.revision, ca.clone()));
        Ok(Some(ca))
    }

    /// On the leader: make and store the root if there is none (and no CA of the user's own).
    pub async fn ensure_root(&self) -> Result<(), String> {
        if self.own.is_some() || self.ca()?.is_some() {
            return Ok(());
        }
        let ca = MeshCa::generate(&self.trust_domain, SystemTime::now(), ROOT_LIFETIME).map_err(|e| e.to_string())?;
        let value = StoredCa { trust_domain: self.trust_domain.clone(), cert_pem: ca.cert_pem().into(), key_pem: ca.key_pem().into() };
        let value_json = serde_json::to_string(&value).map_err(|e| e.to_string())?;
        // Create only: two leaders in a row never replace a root sidecars already trust.
        let cmd = Command::Put { kind: CA_KIND.into(), name: CA_NAME.into(), value_json, expect_revision: Some(0) };
        match self.node.write(cmd).await {
            Ok(_) => {
                tracing::info!(trust_domain = %self.trust_domain, "made the mesh CA's root");
                Ok(())
            }
            Err(crate::store::StoreError::Rejected(crate::store::CommandError::Conflict { .. })) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Sign `csr_pem` for whoever `token` admits.
    pub fn sign(&self, token: &str, csr_pem: &str, now: SystemTime) -> Result<(Leaf, String), tonic::Status> {
        use tonic::Status;
        let token = JoinToken::parse(token).map_err(Status::unauthenticated)?;
        let record = self.node.local().get(TOKENS_KIND, &token.id).map_err(|e| Status::unavailable(e.to_string()))?;
        let record = record.map(|r| serde_json::from_str::<TokenRecord>(&r.value_json)).transpose().map_err(|e| Status::internal(format!("stored token: {e}")))?;
        let id = admit(record.as_ref(), &token, now).map_err(Status::unauthenticated)?;
        let ca = self.ca().map_err(Status::internal)?.ok_or_else(|| Status::unavailable("this control node has no mesh CA yet (no leader has made one); retry"))?;
        let leaf = ca.sign(csr_pem, &id, now, self.leaf_lifetime).map_err(|e| match e.field {
            "identity" => Status::permission_denied(e.to_string()),
            _ => Status::invalid_argument(e.to_string()),
        })?;
        Ok((leaf, ca.cert_pem().to_string()))
    }
}

/// `weft.v1.Identity` over the authority.
pub struct Service(pub Arc<Authority>);

#[tonic::async_trait]
impl v1::identity_server::Identity for Service {
    async fn sign(&self, req: tonic::Request<v1::SignRequest>) -> Result<tonic::Response<v1::SignResponse>, tonic::Status> {
        let r = req.into_inner();
        let result = self.0.sign(&r.token, &r.csr_pem, SystemTime::now());
        match &result {
            Ok((leaf, _)) => tracing::info!(not_after = unix(leaf.not_after), "issued a workload certificate"),
            Err(e) => tracing::warn!(code = ?e.code(), error = e.message(), "refused a certificate request"),
        }
        let (leaf, roots) = result?;
        Ok(tonic::Response::new(v1::SignResponse {
            cert_chain_pem: leaf.cert_pem,
            roots_pem: roots,
            not_before: unix(leaf.not_before) as i64,
            not_after: unix(leaf.not_after) as i64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(t: &JoinToken, identity: &str, expires: u64) -> TokenRecord {
        TokenRecord { identity: identity.into(), secret_sha256: sha256_hex(&t.secret), created: 0, expires, description: String::new() }
    }

    #[test]
    fn a_token_prints_and_parses_back_and_garbage_is_refused() {
        let t = JoinToken::generate();
        assert_eq!(JoinToken::parse(&t.to_string()), Ok(t.clone()));
        assert_ne!(JoinToken::generate(), t, "random");
        for bad in ["", "weft-join", "weft-join..x", "weft-join.a.b.c", "bearer abc", "other.a.b"] {
            assert!(JoinToken::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_token_admits_its_identity_until_it_expires_and_nothing_else() {
        let t = JoinToken::generate();
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let r = record(&t, "spiffe://mesh.local/service/chat", 1000);
        assert_eq!(admit(Some(&r), &t, at(999)).unwrap().to_string(), "spiffe://mesh.local/service/chat");
        assert!(admit(Some(&r), &t, at(1000)).unwrap_err().contains("expired"));
        assert!(admit(Some(&record(&t, "spiffe://mesh.local/service/chat", 0)), &t, at(u64::MAX / 4)).is_ok(), "0 = never expires");
        let forged = JoinToken { id: t.id.clone(), secret: "guess".into() };
        assert!(admit(Some(&r), &forged, at(1)).unwrap_err().contains("does not match"));
        assert!(admit(None, &t, at(1)).unwrap_err().contains("unknown"));
        // The stored record holds no secret.
        assert!(!serde_json::to_string(&r).unwrap().contains(&t.secret));
    }

    #[test]
    fn identities_are_read_under_the_trust_domain() {
        assert_eq!(parse_identity("ns/ml/sa/ranker", "mesh.local").unwrap().to_string(), "spiffe://mesh.local/ns/ml/sa/ranker");
        assert_eq!(parse_identity("/service/chat", "mesh.local").unwrap().to_string(), "spiffe://mesh.local/service/chat");
        assert!(parse_identity("spiffe://other/service/chat", "mesh.local").unwrap_err().contains("trust domain"));
        assert!(parse_identity("service", "mesh.local").is_err());
    }
}

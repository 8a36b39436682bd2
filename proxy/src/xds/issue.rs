//! The sidecar's side of certificate issuance (`identity.token_file`): make a key pair, send
//! the mesh CA (`weft.v1.Identity/Sign` on a control node's xDS port) only a CSR and the join
//! token, keep the answer in `identity.dir` (the key readable by this sidecar alone) and serve
//! it; renew two thirds through each certificate's life, failing over between control nodes
//! and backing off while none answers. A renewal that fails leaves the current certificate
//! serving until it expires (visible as `weft_tls_certificate_expiry_timestamp_seconds`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tonic::transport::Endpoint;
use weft_xds::resources::v1;

use crate::identity::{self, SpiffeId};
use crate::mtls::{Issued, Loaded, MeshIdentity, TlsContext};

/// Per attempt on one control node (connect and answer).
const TIMEOUT: Duration = Duration::from_secs(5);

/// When a certificate valid for `[from, to]` should be renewed: two thirds through.
pub fn renew_at(from: SystemTime, to: SystemTime) -> SystemTime {
    from + to.duration_since(from).unwrap_or_default().mul_f64(2.0 / 3.0)
}

/// Keep the identity issued and renewed, forever.
pub async fn run(mesh: Arc<MeshIdentity>, ctx: Arc<TlsContext>, servers: Vec<String>, tls: super::dial::ControlTls) {
    let Some(issued) = mesh.issued.clone() else { return };
    let Some(id) = mesh.id() else { return };
    let mut backoff = super::client::Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    loop {
        if let Some(cur) = mesh.current() {
            let wait = renew_at(cur.not_before, cur.not_after).duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(wait).await;
        }
        match issue(&mesh, &issued, &id, &servers, &tls).await {
            Ok(l) => {
                let left = l.not_after.duration_since(SystemTime::now()).unwrap_or_default();
                tracing::info!(identity = %l.id, valid_for_s = left.as_secs(), "mesh certificate issued");
                mesh.install(l);
                ctx.stats.reload("issued");
                backoff.reset();
            }
            Err(e) => {
                ctx.stats.reload("issue_failed");
                let left = mesh.current().and_then(|c| c.not_after.duration_since(SystemTime::now()).ok());
                match left {
                    Some(l) => tracing::warn!(error = %e, expires_in_s = l.as_secs(), "certificate renewal failed; the current one serves until it expires"),
                    None => tracing::warn!(error = %e, "no certificate: mesh TLS connections are refused until one is issued"),
                }
                tokio::time::sleep(backoff.step()).await;
            }
        }
    }
}

/// One issuance: a new key and CSR, signed by the first control node that answers, written to
/// `dir` and checked.
async fn issue(mesh: &MeshIdentity, issued: &Issued, id: &SpiffeId, servers: &[String], tls: &super::dial::ControlTls) -> Result<Loaded, String> {
    let token = std::fs::read_to_string(&issued.token_file).map_err(|e| format!("identity.token_file {}: {e}", issued.token_file.display()))?;
    let req = identity::request(id)?;
    let mut why = Vec::new();
    for addr in servers {
        match sign(addr, tls, token.trim(), &req.csr_pem).await {
            Ok(resp) => {
                let loaded = mesh.build(&resp.cert_chain_pem, &req.key_pem, &resp.roots_pem)?;
                keep(issued, &req.key_pem, &resp).map_err(|e| format!("identity.dir {}: {e}", issued.dir.display()))?;
                return Ok(loaded);
            }
            // A refusal is the same on every node: no use asking the others.
            Err((true, e)) => return Err(format!("{addr}: {e}")),
            Err((false, e)) => why.push(format!("{addr}: {e}")),
        }
    }
    Err(why.join("; "))
}

/// Ask `addr` to sign; the error says whether the CA refused (true) or could not be reached.
async fn sign(addr: &str, tls: &super::dial::ControlTls, token: &str, csr_pem: &str) -> Result<v1::SignResponse, (bool, String)> {
    let channel = super::dial::channel(addr, tls, |e: Endpoint| e.connect_timeout(TIMEOUT).timeout(TIMEOUT)).await.map_err(|e| (false, e))?;
    let mut client = v1::identity_client::IdentityClient::new(channel);
    let req = v1::SignRequest { token: token.into(), csr_pem: csr_pem.into() };
    match client.sign(req).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => {
            use tonic::Code;
            let refused = matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument);
            Err((refused, format!("{:?}: {}", s.code(), s.message())))
        }
    }
}

/// Write the key (0600), then the chain and the roots, each replaced atomically.
fn keep(issued: &Issued, key_pem: &str, resp: &v1::SignResponse) -> std::io::Result<()> {
    identity::write_key(&issued.key(), key_pem)?;
    for (path, text) in [(issued.cert(), &resp.cert_chain_pem), (issued.ca(), &resp.roots_pem)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_two_thirds_through() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(renew_at(t0, t0 + Duration::from_secs(33)), t0 + Duration::from_secs(22));
        assert_eq!(renew_at(t0, t0), t0, "an empty life renews at once");
    }
}

//! Opening the gRPC channel to a control node: plain HTTP/2, or HTTP/2 over TLS when the
//! control plane runs `--tls-*` (`--xds-ca FILE`, or an `https://` address). The control node is
//! checked by the name (or IP) it is addressed by, against the `--xds-ca` roots (the mesh root
//! when the nodes run `--tls-from-ca`) or the system's. The ADS stream, the report stream and
//! `Identity/Sign` all open their channels here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// How to reach control nodes: which are TLS, and what they are checked against.
#[derive(Clone, Debug, Default)]
pub struct ControlTls {
    /// `--xds-ca`: every node is TLS, checked against these roots.
    pub ca: Option<Arc<rustls::ClientConfig>>,
}

impl ControlTls {
    /// From `--xds-ca FILE` (PEM roots).
    pub fn from_ca_file(path: &std::path::Path) -> Result<ControlTls, String> {
        let pem = std::fs::read_to_string(path).map_err(|e| format!("--xds-ca {}: {e}", path.display()))?;
        let cfg = crate::tls::simple_client_config(Some(&pem), b"h2").map_err(|e| format!("--xds-ca {}: {e}", path.display()))?;
        Ok(ControlTls { ca: Some(cfg) })
    }

    /// The TLS configuration for `addr`, or `None` for plaintext; and `host:port`.
    fn for_addr<'a>(&self, addr: &'a str) -> Result<(Option<Arc<rustls::ClientConfig>>, &'a str), String> {
        let (https, rest) = match (addr.strip_prefix("https://"), addr.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => (self.ca.is_some(), addr),
        };
        let rest = rest.trim_end_matches('/');
        match (https, &self.ca) {
            (false, _) => Ok((None, rest)),
            (true, Some(c)) => Ok((Some(c.clone()), rest)),
            (true, None) => Ok((Some(crate::tls::simple_client_config(None, b"h2")?), rest)),
        }
    }
}

/// A channel to the control node at `addr`, `tune`d (timeouts, keep-alive), connected.
pub async fn channel(addr: &str, tls: &ControlTls, tune: impl FnOnce(Endpoint) -> Endpoint) -> Result<Channel, String> {
    let (cfg, hostport) = tls.for_addr(addr)?;
    let endpoint = Endpoint::from_shared(format!("http://{hostport}")).map_err(|e| format!("invalid control node address {addr:?}: {}", causes(&e)))?;
    let endpoint = tune(endpoint);
    let connected = match cfg {
        None => endpoint.connect().await,
        Some(cfg) => endpoint.connect_with_connector(TlsConnector { cfg, hostport: hostport.to_string() }).await,
    };
    connected.map_err(|e| format!("cannot connect: {}", causes(&e)))
}

/// An error with its sources, one line (tonic's own Display says only "transport error").
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The name a server at `addr` (`host:port`, `[v6]:port`) must hold: its host, a DNS name or
/// an IP address.
pub fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is not a DNS name or IP address: {e}"))
}

/// TCP, then the TLS handshake with the node checked by name.
#[derive(Clone)]
struct TlsConnector {
    cfg: Arc<rustls::ClientConfig>,
    hostport: String,
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TokioIo<crate::stream::Stream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (cfg, hostport) = (self.cfg.clone(), self.hostport.clone());
        Box::pin(async move {
            let name = server_name(&hostport).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tcp = tokio::net::TcpStream::connect(&hostport).await?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(cfg).connect(name, tcp).await?;
            Ok(TokioIo::new(crate::stream::Stream::Tls(Box::new(tls))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_addresses_are_tls() {
        let plain = ControlTls::default();
        assert!(plain.for_addr("127.0.0.1:7701").unwrap().0.is_none());
        assert_eq!(plain.for_addr("http://127.0.0.1:7701/").unwrap().1, "127.0.0.1:7701");
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, crate::identity::pem_encode(crate::identity::CERTIFICATE, p.self_signed(&key).unwrap().der())).unwrap();
        let tls = ControlTls::from_ca_file(&ca).unwrap();
        assert!(tls.for_addr("127.0.0.1:7701").unwrap().0.is_some(), "--xds-ca makes bare addresses TLS");
        assert!(tls.for_addr("http://127.0.0.1:7701").unwrap().0.is_none(), "an explicit http:// stays plaintext");
        assert!(ControlTls::from_ca_file(&dir.path().join("missing")).unwrap_err().starts_with("--xds-ca "));
    }
}

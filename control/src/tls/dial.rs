//! Connecting to a control node's API port: plain TCP, or TLS with the node checked by the
//! name (or IP) it is addressed by, as any HTTPS client checks it. Raft RPCs, forwarding to the
//! leader, report fan-in and `weftctl` all dial through a [`Dialer`], so one flag turns TLS on
//! for every one of them.

use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use weft_proxy::identity::crypto_provider;
use weft_proxy::stream::Stream;

/// How a connection failed: before anything was sent (the node is not there) or in the TLS
/// handshake (it is, but one side refused the other).
#[derive(Debug)]
pub enum DialError {
    Connect(std::io::Error),
    Tls(String),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Connect(e) => write!(f, "{e}"),
            DialError::Tls(e) => write!(f, "TLS: {e}"),
        }
    }
}

/// Plain TCP (the default) or TLS.
#[derive(Clone, Default)]
pub struct Dialer {
    tls: Option<Arc<ClientConfig>>,
}

impl Dialer {
    /// TLS, trusting `roots`; `client` is the certificate presented when a server asks for one.
    pub fn tls(roots: RootCertStore, client: Option<Arc<dyn rustls::client::ResolvesClientCert>>) -> Result<Dialer, String> {
        let b = ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let mut cfg = match client {
            Some(c) => b.with_client_cert_resolver(c),
            None => b.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Dialer { tls: Some(Arc::new(cfg)) })
    }

    /// TLS trusting the roots in `ca` (PEM), presenting `cert` (chain and key files) when
    /// given: `weftctl --ca --cert --key`.
    pub fn from_files(ca: &std::path::Path, cert: Option<(std::path::PathBuf, std::path::PathBuf)>) -> Result<Dialer, String> {
        let read = |flag: &str, p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("{flag} {}: {e}", p.display()));
        let roots = super::roots(&read("--ca", ca)?).map_err(|e| format!("--ca {}: {e}", ca.display()))?;
        let client = match cert {
            Some((c, k)) => {
                let loaded = super::load(&read("--cert", &c)?, &read("--key", &k)?).map_err(|e| format!("--cert/--key: {e}"))?;
                Some(Arc::new(super::Current::new(loaded)) as Arc<dyn rustls::client::ResolvesClientCert>)
            }
            None => None,
        };
        Dialer::tls(roots, client)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// `http` or `https`, for URLs shown to people.
    pub fn scheme(&self) -> &'static str {
        if self.is_tls() { "https" } else { "http" }
    }

    /// Connects to `addr` (`host:port`), then shakes hands when TLS is on.
    pub async fn connect(&self, addr: &str) -> Result<Stream, DialError> {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(DialError::Connect)?;
        let _ = tcp.set_nodelay(true);
        let Some(cfg) = &self.tls else { return Ok(Stream::Tcp(tcp)) };
        let name = server_name(addr).map_err(DialError::Tls)?;
        let tls = tokio_rustls::TlsConnector::from(cfg.clone()).connect(name, tcp).await.map_err(|e| DialError::Tls(e.to_string()))?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

pub use weft_proxy::xds::dial::server_name;

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;

    #[test]
    fn names_from_addresses() {
        assert_eq!(server_name("127.0.0.1:7700").unwrap(), ServerName::try_from("127.0.0.1").unwrap());
        assert_eq!(server_name("control-0.weft:7700").unwrap(), ServerName::try_from("control-0.weft").unwrap());
        assert_eq!(server_name("[::1]:7700").unwrap(), ServerName::try_from("::1").unwrap());
        assert!(server_name("bad name:7700").is_err());
    }
}

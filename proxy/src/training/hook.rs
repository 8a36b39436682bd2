//! The trainer's checkpoint hook: one `POST` of a small JSON body to a loopback URL, answered
//! with any 2xx once the trainer's checkpoint is written.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// A parsed `http://host:port/path` hook URL.
#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    authority: String,
    path: String,
}

impl Hook {
    pub fn parse(url: &str) -> Result<Hook, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url:?}: only http:// hooks (the trainer is on loopback)"));
        }
        let authority = uri.authority().filter(|a| a.port_u16().is_some()).ok_or_else(|| format!("{url:?}: give host:port"))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        Ok(Hook { authority: authority.to_string(), path })
    }

    /// POSTs `body`; Ok on a 2xx answer.
    pub async fn call(&self, body: serde_json::Value) -> Result<(), String> {
        let stream = tokio::net::TcpStream::connect(&self.authority).await.map_err(|e| format!("connect {}: {e}", self.authority))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let req = http::Request::post(&self.path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| e.to_string())?;
        let resp = send.send_request(req).await.map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let text = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&text[..text.len().min(200)])))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_urls_are_loopback_http_with_a_port() {
        let h = Hook::parse("http://127.0.0.1:7070/checkpoint?now=1").unwrap();
        assert_eq!((h.authority.as_str(), h.path.as_str()), ("127.0.0.1:7070", "/checkpoint?now=1"));
        assert!(Hook::parse("https://127.0.0.1:7070/x").unwrap_err().contains("only http://"));
        assert!(Hook::parse("http://127.0.0.1/x").unwrap_err().contains("host:port"));
        assert!(Hook::parse("not a url").is_err());
    }
}

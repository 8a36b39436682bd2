//! Route matching: which service a request is for (by host) and which of its routes (by path,
//! headers and model name). Pure: no IO, compiled once per config snapshot.

use http::{HeaderName, HeaderValue};
use std::collections::HashMap;

use crate::config;

#[derive(Debug, Clone)]
pub enum PathMatch {
    Any,
    Exact(String),
    Prefix(String),
}

/// A compiled `match:` block.
#[derive(Debug, Clone)]
pub struct RouteMatcher {
    path: PathMatch,
    headers: Vec<(HeaderName, Option<HeaderValue>)>,
    model: Option<String>,
}

impl RouteMatcher {
    pub fn compile(m: &config::RouteMatch) -> Result<RouteMatcher, String> {
        let path = match (&m.path_exact, &m.path_prefix) {
            (Some(_), Some(_)) => {
                return Err("match: set path_exact or path_prefix, not both".into());
            }
            (Some(p), None) => PathMatch::Exact(check_path("path_exact", p)?),
            (None, Some(p)) => PathMatch::Prefix(check_path("path_prefix", p)?),
            (None, None) => PathMatch::Any,
        };
        let mut headers = Vec::with_capacity(m.headers.len());
        for h in &m.headers {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("match.headers: {:?} is not a valid header name", h.name))?;
            let value = match &h.exact {
                Some(v) => Some(HeaderValue::from_str(v).map_err(|_| {
                    format!("match.headers.{}: {:?} is not a valid header value", h.name, v)
                })?),
                None => None,
            };
            headers.push((name, value));
        }
        Ok(RouteMatcher { path, headers, model: m.model.clone() })
    }

    pub fn matches(&self, path: &str, headers: &crate::headers::ReqHeaders, model: Option<&str>) -> bool {
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
        };
        path_ok
            && self.headers.iter().all(|(name, want)| match (headers.get(name), want) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(got), Some(want)) => got == want.as_bytes(),
            })
            && self.model.as_deref().is_none_or(|want| model == Some(want))
    }
}

fn check_path(field: &str, p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("match.{field}: {p:?} must start with '/'"));
    }
    Ok(p.to_string())
}

/// The model name of a KServe v2 path: `/v2/models/{name}` or `/v2/models/{name}/...`.
pub fn kserve_model(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/models/")?;
    let name = rest.split(['/', '?']).next().unwrap_or("");
    (!name.is_empty()).then_some(name)
}

/// The model version of a KServe v2 path: `/v2/models/{name}/versions/{v}/...`.
pub fn kserve_version(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/models/")?;
    let mut parts = rest.split(['/', '?']);
    parts.next()?;
    if parts.next()? != "versions" {
        return None;
    }
    parts.next().filter(|v| !v.is_empty())
}

/// Host → service lookup for one listener. Hosts are compared without port, lowercased.
#[derive(Debug, Clone, Default)]
pub struct HostTable {
    exact: HashMap<String, usize>,
    wildcard: Option<usize>,
}

impl HostTable {
    /// Register `host` for service `idx`; an error names the host served twice.
    pub fn insert(&mut self, host: &str, idx: usize) -> Result<(), String> {
        let host = host.to_ascii_lowercase();
        let slot = if host == "*" {
            &mut self.wildcard
        } else {
            if host.is_empty() || host.contains(['/', ' ']) {
                return Err(format!("hosts: {host:?} is not a valid host name"));
            }
            match self.exact.entry(host.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    return Err(format!("hosts: {host:?} is claimed by two services on one listener"));
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(idx);
                    return Ok(());
                }
            }
        };
        if slot.is_some() {
            return Err("hosts: \"*\" is claimed by two services on one listener".into());
        }
        *slot = Some(idx);
        Ok(())
    }

    /// Find the service for a Host/authority value (port stripped, any case).
    pub fn lookup(&self, authority: &str) -> Option<usize> {
        if self.exact.is_empty() {
            return self.wildcard;
        }
        let host = strip_port(authority);
        let found = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.exact.get(&host.to_ascii_lowercase())
        } else {
            self.exact.get(host)
        };
        found.copied().or(self.wildcard)
    }
}

/// `host:port` → `host`; IPv6 literals keep their brackets.
pub fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rfind(':') {
        Some(i) if authority[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &authority[..i],
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::ReqHeaders;
    use http::HeaderMap;
    use proptest::prelude::*;

    fn m(yaml: &str) -> RouteMatcher {
        let cfg: config::RouteMatch = serde_norway::from_str(yaml).unwrap();
        RouteMatcher::compile(&cfg).unwrap()
    }

    #[test]
    fn path_and_headers() {
        let r = m("path_prefix: /v2/\nheaders: [{name: x-env, exact: prod}, {name: x-debug}]");
        let mut h = HeaderMap::new();
        assert!(!r.matches("/v2/models/a/infer", &ReqHeaders::new(h.clone(), None), None));
        h.insert("x-env", HeaderValue::from_static("prod"));
        h.insert("x-debug", HeaderValue::from_static("1"));
        assert!(r.matches("/v2/models/a/infer", &ReqHeaders::new(h.clone(), None), None));
        assert!(!r.matches("/v1/completions", &ReqHeaders::new(h.clone(), None), None));
        h.insert("x-env", HeaderValue::from_static("dev"));
        assert!(!r.matches("/v2/models/a/infer", &ReqHeaders::new(h.clone(), None), None));
        let exact = m("path_exact: /health");
        assert!(exact.matches("/health", &ReqHeaders::default(), None));
        assert!(!exact.matches("/healthz", &ReqHeaders::default(), None));
    }

    #[test]
    fn model_match_uses_kserve_name() {
        let r = m("model: resnet");
        let p = "/v2/models/resnet/versions/3/infer";
        assert_eq!(kserve_model(p), Some("resnet"));
        assert_eq!(kserve_version(p), Some("3"));
        assert!(r.matches(p, &ReqHeaders::default(), kserve_model(p)));
        assert!(!r.matches("/v2/models/bert/infer", &ReqHeaders::default(), Some("bert")));
        assert_eq!(kserve_model("/v2/models/"), None);
        assert_eq!(kserve_model("/v2/models/x?y=1"), Some("x"));
    }

    #[test]
    fn bad_matchers_are_named() {
        let e = RouteMatcher::compile(&serde_norway::from_str("path_prefix: v2").unwrap()).unwrap_err();
        assert!(e.contains("path_prefix") && e.contains("v2"), "{e}");
        let e = RouteMatcher::compile(&serde_norway::from_str("headers: [{name: 'a b'}]").unwrap())
            .unwrap_err();
        assert!(e.contains("a b"), "{e}");
    }

    #[test]
    fn hosts_strip_port_and_case() {
        let mut t = HostTable::default();
        t.insert("Ranker", 0).unwrap();
        t.insert("*", 1).unwrap();
        assert_eq!(t.lookup("ranker:8080"), Some(0));
        assert_eq!(t.lookup("RANKER"), Some(0));
        assert_eq!(t.lookup("other"), Some(1));
        assert!(t.insert("ranker", 2).is_err());
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        let mut none = HostTable::default();
        none.insert("a", 0).unwrap();
        assert_eq!(none.lookup("b"), None);
    }

    proptest! {
        #[test]
        fn matcher_never_panics(path in ".*", hname in "[a-z-]{1,12}", hval in "[ -~]{0,20}", model in proptest::option::of(".*")) {
            let r = m("path_prefix: /v2/\nheaders: [{name: x-env, exact: prod}]\nmodel: m");
            let mut h = HeaderMap::new();
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(hname.as_bytes()), HeaderValue::from_str(&hval)) {
                h.insert(n, v);
            }
            let _ = r.matches(&path, &ReqHeaders::new(h.clone(), None), model.as_deref());
            let _ = kserve_model(&path);
            let _ = kserve_version(&path);
            let _ = strip_port(&path);
        }
    }
}

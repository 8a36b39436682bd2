//! Bearer tokens with roles, read from a YAML file (`--tokens`). Pure apart from reading the
//! file: `Tokens::check` decides 401/403 from a header value and the role a route needs.

use std::path::Path;

use serde::Deserialize;

/// What a token may do; each role includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads.
    Viewer,
    /// Reads and resource writes (services, experiments, clusters, endpoints).
    Operator,
    /// Everything, including membership changes and the Raft RPCs between nodes.
    Admin,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token: String,
    role: Role,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

/// The token table. An empty table means authentication is off.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: Vec<TokenEntry>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one nobody issued: 401.
    Unauthenticated(&'static str),
    /// A valid token whose role is too small: 403.
    Forbidden { name: String, role: Role, needed: Role },
}

/// Compares without an early exit, so response time does not reveal a token's prefix.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Parses a token file; empty tokens, duplicate tokens and unknown roles are errors.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let f: TokenFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        for (i, t) in f.tokens.iter().enumerate() {
            if t.token.len() < 8 {
                return Err(format!("tokens[{i}] ({}): token must be at least 8 characters", t.name));
            }
            if f.tokens[..i].iter().any(|o| o.token == t.token) {
                return Err(format!("tokens[{i}] ({}): token is used twice", t.name));
            }
        }
        Ok(Tokens { entries: f.tokens })
    }

    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// A token of the admin role, which nodes present to each other.
    pub fn admin_token(&self) -> Option<String> {
        self.entries.iter().find(|t| t.role == Role::Admin).map(|t| t.token.clone())
    }

    /// Decides a request carrying `authorization` (the header value, if any) to a route
    /// that needs `needed`.
    pub fn check(&self, authorization: Option<&[u8]>, needed: Role) -> Result<(), Denied> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(h) = authorization else {
            return Err(Denied::Unauthenticated("missing bearer token"));
        };
        let Some(token) = h.strip_prefix(b"Bearer ").or_else(|| h.strip_prefix(b"bearer ")) else {
            return Err(Denied::Unauthenticated("authorization is not a bearer token"));
        };
        // Check every entry (no early exit) so timing does not tell which one matched.
        let mut found = None;
        for e in &self.entries {
            if same(e.token.as_bytes(), token) {
                found = Some(e);
            }
        }
        match found {
            None => Err(Denied::Unauthenticated("unknown token")),
            Some(e) if e.role >= needed => Ok(()),
            Some(e) => Err(Denied::Forbidden { name: e.name.clone(), role: e.role, needed }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::parse(
            "tokens:\n  - {name: a, token: admin-secret, role: admin}\n  - {name: v, token: viewer-secret, role: viewer}\n",
        )
        .unwrap()
    }

    #[test]
    fn roles_decide_401_and_403() {
        let t = tokens();
        assert_eq!(t.check(None, Role::Viewer), Err(Denied::Unauthenticated("missing bearer token")));
        assert_eq!(t.check(Some(b"Bearer nope-nope"), Role::Viewer), Err(Denied::Unauthenticated("unknown token")));
        assert_eq!(t.check(Some(b"Basic abc"), Role::Viewer), Err(Denied::Unauthenticated("authorization is not a bearer token")));
        assert_eq!(t.check(Some(b"Bearer viewer-secret"), Role::Viewer), Ok(()));
        assert!(matches!(
            t.check(Some(b"Bearer viewer-secret"), Role::Operator),
            Err(Denied::Forbidden { role: Role::Viewer, needed: Role::Operator, .. })
        ));
        assert_eq!(t.check(Some(b"Bearer admin-secret"), Role::Admin), Ok(()));
        assert_eq!(t.admin_token().as_deref(), Some("admin-secret"));
    }

    #[test]
    fn no_file_means_no_auth_and_bad_files_are_refused() {
        assert_eq!(Tokens::default().check(None, Role::Admin), Ok(()));
        assert!(Tokens::parse("tokens: [{name: a, token: short, role: admin}]").unwrap_err().contains("at least 8"));
        assert!(Tokens::parse("tokens: [{name: a, token: longenough, role: root}]").is_err());
        let dup = "tokens: [{name: a, token: longenough, role: admin}, {name: b, token: longenough, role: viewer}]";
        assert!(Tokens::parse(dup).unwrap_err().contains("used twice"));
    }
}

//! Authorization at the inbound sidecar: `authorization[]` compiled per service, and the
//! decision for one request from its caller's SPIFFE ID (mTLS), method and path. Pure; the
//! semantics are in [`crate::config::AuthorizationPolicy`].

use std::sync::Arc;

use http::Method;

use crate::config::{AuthorizationPolicy, AuthzAction, Config};

/// The policies that apply to each service, by service index.
#[derive(Default)]
pub struct Authz {
    per_service: Vec<Vec<Arc<Policy>>>,
}

struct Policy {
    name: Arc<str>,
    action: AuthzAction,
    rules: Vec<Rule>,
}

struct Rule {
    identities: Vec<IdPattern>,
    path_prefixes: Vec<String>,
    methods: Vec<Method>,
}

enum IdPattern {
    /// `*`: any authenticated caller.
    Any,
    Exact(String),
    /// `spiffe://td/ns/batch/*`: IDs starting with what comes before the `*`.
    Prefix(String),
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No policy applies to the service.
    Open,
    /// Admitted by this allow policy.
    Allow(Arc<str>),
    /// Refused: by this deny policy's rule, or (`None`) because no allow policy's rule matched.
    Deny(Option<Arc<str>>),
}

impl Decision {
    /// The `policy` label: the deciding policy, `(none matched)` for a closed allow-list.
    pub fn policy(&self) -> &str {
        match self {
            Decision::Open => "",
            Decision::Allow(p) | Decision::Deny(Some(p)) => p,
            Decision::Deny(None) => "(no allow rule matched)",
        }
    }
}

impl Authz {
    /// Compile `cfg.authorization` for `cfg.services`, on a sidecar whose identity's namespace
    /// is `own_namespace`. Policies naming services this sidecar does not serve are kept out
    /// (policies are pushed to every sidecar).
    pub fn compile(cfg: &Config, own_namespace: Option<&str>) -> Result<Authz, String> {
        let mut seen = std::collections::HashSet::new();
        let mut compiled = Vec::new();
        for p in &cfg.authorization {
            if p.name.is_empty() || !seen.insert(p.name.as_str()) {
                return Err(format!("authorization: every policy needs a unique, non-empty name ({:?})", p.name));
            }
            let policy = compile_policy(p)?;
            let applies_here = p.namespace.is_empty() || Some(p.namespace.as_str()) == own_namespace;
            if applies_here {
                compiled.push((p, Arc::new(policy)));
            }
        }
        let per_service = cfg
            .services
            .iter()
            .map(|s| compiled.iter().filter(|(p, _)| p.services.is_empty() || p.services.contains(&s.name)).map(|(_, c)| c.clone()).collect())
            .collect();
        Ok(Authz { per_service })
    }

    /// The decision for a request to service `si` from `caller` (its SPIFFE ID; `None` for a
    /// plaintext caller).
    pub fn check(&self, si: usize, caller: Option<&str>, method: &Method, path: &str) -> Decision {
        let Some(policies) = self.per_service.get(si).filter(|p| !p.is_empty()) else { return Decision::Open };
        let hit = |p: &&Arc<Policy>| p.rules.iter().any(|r| r.matches(caller, method, path));
        if let Some(p) = policies.iter().filter(|p| p.action == AuthzAction::Deny).find(hit) {
            return Decision::Deny(Some(p.name.clone()));
        }
        if let Some(p) = policies.iter().filter(|p| p.action == AuthzAction::Allow).find(hit) {
            return Decision::Allow(p.name.clone());
        }
        if policies.iter().any(|p| p.action == AuthzAction::Allow) { Decision::Deny(None) } else { Decision::Open }
    }
}

fn compile_policy(p: &AuthorizationPolicy) -> Result<Policy, String> {
    let f = format!("authorization.{}", p.name);
    let mut rules = Vec::with_capacity(p.rules.len());
    for (i, r) in p.rules.iter().enumerate() {
        let rf = format!("{f}.rules[{i}]");
        let identities = r
            .identities
            .iter()
            .map(|s| match s.as_str() {
                "*" => Ok(IdPattern::Any),
                s if !s.starts_with("spiffe://") => Err(format!("{rf}.identities: {s:?} is not a spiffe:// ID, a prefix ending in '*', or '*'")),
                s => match s.strip_suffix('*') {
                    Some(prefix) if !prefix.contains('*') => Ok(IdPattern::Prefix(prefix.to_string())),
                    None if !s.contains('*') => Ok(IdPattern::Exact(s.to_string())),
                    _ => Err(format!("{rf}.identities: {s:?}: '*' may only end a pattern")),
                },
            })
            .collect::<Result<_, _>>()?;
        for pp in &r.path_prefixes {
            if !pp.starts_with('/') {
                return Err(format!("{rf}.path_prefixes: {pp:?} must start with '/'"));
            }
        }
        let methods = r
            .methods
            .iter()
            .map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| format!("{rf}.methods: {m:?} is not an HTTP method")))
            .collect::<Result<_, _>>()?;
        rules.push(Rule { identities, path_prefixes: r.path_prefixes.clone(), methods });
    }
    Ok(Policy { name: Arc::from(p.name.as_str()), action: p.action, rules })
}

impl Rule {
    fn matches(&self, caller: Option<&str>, method: &Method, path: &str) -> bool {
        let who = self.identities.is_empty()
            || caller.is_some_and(|c| {
                self.identities.iter().any(|p| match p {
                    IdPattern::Any => true,
                    IdPattern::Exact(id) => c == id,
                    IdPattern::Prefix(pre) => c.starts_with(pre.as_str()),
                })
            });
        who && (self.methods.is_empty() || self.methods.contains(method))
            && (self.path_prefixes.is_empty() || self.path_prefixes.iter().any(|p| path.starts_with(p.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authz(yaml: &str, ns: Option<&str>) -> Result<Authz, String> {
        let base = "listeners: [{name: in, address: \"127.0.0.1:0\", direction: inbound}]\nservices: [{name: chat, hosts: [chat], routes: [{name: r, cluster: c}]}, {name: embed, hosts: [embed], routes: [{name: r, cluster: c}]}]\nclusters: [{name: c}]\n";
        Authz::compile(&Config::from_yaml(&format!("{base}{yaml}")).unwrap(), ns)
    }

    const WEB: &str = "spiffe://td/ns/apps/sa/web";
    const BATCH: &str = "spiffe://td/ns/batch/sa/job";

    #[test]
    fn without_policies_everyone_is_served() {
        let a = authz("", None).unwrap();
        assert_eq!(a.check(0, None, &Method::GET, "/"), Decision::Open);
    }

    #[test]
    fn an_allow_list_admits_its_callers_and_closes_the_service_to_the_rest() {
        let a = authz(
            "authorization: [{name: p, services: [chat], rules: [{identities: [\"spiffe://td/ns/apps/sa/web\"], path_prefixes: [/v1/], methods: [post]}]}]",
            None,
        )
        .unwrap();
        assert_eq!(a.check(0, Some(WEB), &Method::POST, "/v1/chat"), Decision::Allow("p".into()));
        for (who, m, path) in [(Some(BATCH), Method::POST, "/v1/chat"), (Some(WEB), Method::GET, "/v1/chat"), (Some(WEB), Method::POST, "/admin"), (None, Method::POST, "/v1/chat")] {
            assert_eq!(a.check(0, who, &m, path), Decision::Deny(None), "{who:?} {m} {path}");
        }
        assert_eq!(a.check(1, Some(BATCH), &Method::GET, "/"), Decision::Open, "another service is untouched");
    }

    #[test]
    fn deny_wins_over_allow_and_patterns_match_prefixes() {
        let a = authz(
            "authorization:\n  - {name: all, rules: [{identities: [\"*\"]}]}\n  - {name: no-batch, action: deny, rules: [{identities: [\"spiffe://td/ns/batch/*\"]}]}",
            None,
        )
        .unwrap();
        assert_eq!(a.check(0, Some(WEB), &Method::GET, "/"), Decision::Allow("all".into()));
        assert_eq!(a.check(1, Some(BATCH), &Method::GET, "/"), Decision::Deny(Some("no-batch".into())));
        assert_eq!(a.check(0, None, &Method::GET, "/"), Decision::Deny(None), "'*' is any mTLS peer, not plaintext");
    }

    #[test]
    fn a_policy_applies_on_sidecars_of_its_namespace_only_and_an_empty_allow_denies_all() {
        let yaml = "authorization: [{name: lockdown, namespace: ml}]";
        assert_eq!(authz(yaml, Some("ml")).unwrap().check(0, Some(WEB), &Method::GET, "/"), Decision::Deny(None));
        assert_eq!(authz(yaml, Some("apps")).unwrap().check(0, Some(WEB), &Method::GET, "/"), Decision::Open);
        assert_eq!(authz(yaml, None).unwrap().check(0, Some(WEB), &Method::GET, "/"), Decision::Open);
    }

    #[test]
    fn bad_policies_are_refused_naming_the_field() {
        for (yaml, want) in [
            ("authorization: [{name: p, rules: [{identities: [web]}]}]", "authorization.p.rules[0].identities"),
            ("authorization: [{name: p, rules: [{identities: [\"spiffe://td/*/x\"]}]}]", "may only end"),
            ("authorization: [{name: p, rules: [{path_prefixes: [v1]}]}]", "must start with '/'"),
            ("authorization: [{name: p, rules: [{methods: [\"GE T\"]}]}]", "not an HTTP method"),
            ("authorization: [{name: p}, {name: p}]", "unique"),
        ] {
            let e = authz(yaml, None).err().unwrap_or_else(|| panic!("accepted {yaml}"));
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}

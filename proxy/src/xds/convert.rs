//! weft.v1 resources → the YAML config types. Pure: no IO, no validation beyond what the
//! conversion itself needs (types, ranges, duplicate names). Whether the result can be served
//! (known clusters, valid headers, ...) is decided by `Snapshot::compile` through
//! `Shared::apply`, exactly as for a YAML file, so a pushed config and a file are held to the
//! same rules. Errors name the resource and the field, in the same `clusters.NAME.field`
//! style as the snapshot's errors, so a NACK reads like a rejected file.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weft_xds::resources::{Resource, from_any, v1};
use weft_xds::transport::Any;
use weft_xds::typeurl;

use crate::config::{self, Config};
use crate::duration::Dur;

/// The weft types a sidecar subscribes to. Listeners are deliberately absent: they come from
/// the bootstrap file, because a listener change needs new sockets (a restart).
pub const SUBSCRIBED: &[&str] =
    &[typeurl::CLUSTER, typeurl::ENDPOINTS, typeurl::EXPERIMENT, typeurl::SERVICE, typeurl::AUTHORIZATION_POLICY, typeurl::REVOCATION];

/// Longest duration accepted, the same bound the YAML parser applies (10 years).
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86400);

/// Everything the control plane delivered, converted, one field per subscribed type. This is
/// the unit that is merged onto the bootstrap, persisted to disk and restored after a
/// restart, so it is kept in config form (readable JSON) rather than as protobuf bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Dynamic {
    pub clusters: Vec<config::Cluster>,
    /// Cluster name → the addresses to route to (see [`endpoints`] for which ones).
    pub endpoints: BTreeMap<String, Vec<String>>,
    pub experiments: Vec<config::Experiment>,
    pub services: Vec<config::Service>,
    pub authorization: Vec<config::AuthorizationPolicy>,
    pub revocations: Vec<config::Revocation>,
}

impl Dynamic {
    /// Replaces the resources of `type_url` with `resources` (State-of-the-World: a response
    /// is the whole set of its type). Unknown types are an error, not silently dropped.
    pub fn set(&mut self, type_url: &str, resources: &[Any]) -> Result<(), String> {
        match type_url {
            typeurl::CLUSTER => self.clusters = convert_all(resources, "clusters", cluster)?,
            typeurl::ENDPOINTS => {
                self.endpoints = convert_all(resources, "endpoints", endpoints)?.into_iter().collect()
            }
            typeurl::EXPERIMENT => self.experiments = convert_all(resources, "experiments", experiment)?,
            typeurl::SERVICE => self.services = convert_all(resources, "services", service)?,
            typeurl::AUTHORIZATION_POLICY => self.authorization = convert_all(resources, "authorization", authorization_policy)?,
            typeurl::REVOCATION => {
                self.revocations = convert_all(resources, "revocations", |r: v1::Revocation| {
                    Ok(config::Revocation { name: r.name, identity: r.identity, issued_before: r.issued_before })
                })?
            }
            other => return Err(format!("{other}: not a type this sidecar subscribes to")),
        }
        Ok(())
    }

    /// The names of the resources of `type_url` whose entry differs between `self` and
    /// `other` (added, changed or removed), in `other`'s order then removals: the unit a
    /// sidecar accepts or refuses one by one when a whole response cannot be served.
    pub fn changed(&self, other: &Dynamic, type_url: &str) -> Vec<String> {
        fn diff<T: PartialEq>(a: &[T], b: &[T], name: impl Fn(&T) -> &String) -> Vec<String> {
            let find = |v: &[T], n: &String| v.iter().position(|x| name(x) == n);
            let mut out: Vec<String> =
                b.iter().filter(|x| find(a, name(x)).is_none_or(|i| &a[i] != *x)).map(|x| name(x).clone()).collect();
            out.extend(a.iter().filter(|x| find(b, name(x)).is_none()).map(|x| name(x).clone()));
            out
        }
        match type_url {
            typeurl::CLUSTER => diff(&self.clusters, &other.clusters, |c| &c.name),
            typeurl::EXPERIMENT => diff(&self.experiments, &other.experiments, |e| &e.name),
            typeurl::SERVICE => diff(&self.services, &other.services, |s| &s.name),
            typeurl::AUTHORIZATION_POLICY => diff(&self.authorization, &other.authorization, |p| &p.name),
            typeurl::REVOCATION => diff(&self.revocations, &other.revocations, |r| &r.name),
            typeurl::ENDPOINTS => {
                let (a, b) = (&self.endpoints, &other.endpoints);
                let mut out: Vec<String> = b.iter().filter(|(n, e)| a.get(*n) != Some(*e)).map(|(n, _)| n.clone()).collect();
                out.extend(a.keys().filter(|n| !b.contains_key(*n)).cloned());
                out
            }
            _ => Vec::new(),
        }
    }

    /// Makes resource `name` of `type_url` what it is in `from`: replaced or added (after the
    /// resource that precedes it in `from`, so order follows the push), or removed if `from`
    /// has none.
    pub fn take(&mut self, from: &Dynamic, type_url: &str, name: &str) {
        fn take<T: Clone>(to: &mut Vec<T>, from: &[T], n: &str, name: impl Fn(&T) -> &String) {
            let at = to.iter().position(|x| name(x) == n);
            match (from.iter().position(|x| name(x) == n), at) {
                (Some(i), Some(j)) => to[j] = from[i].clone(),
                (Some(i), None) => {
                    let after = from[..i].iter().rev().find_map(|p| to.iter().position(|x| name(x) == name(p)));
                    to.insert(after.map_or(0, |j| j + 1), from[i].clone());
                }
                (None, Some(j)) => {
                    to.remove(j);
                }
                (None, None) => {}
            }
        }
        match type_url {
            typeurl::CLUSTER => take(&mut self.clusters, &from.clusters, name, |c| &c.name),
            typeurl::EXPERIMENT => take(&mut self.experiments, &from.experiments, name, |e| &e.name),
            typeurl::SERVICE => take(&mut self.services, &from.services, name, |s| &s.name),
            typeurl::AUTHORIZATION_POLICY => take(&mut self.authorization, &from.authorization, name, |p| &p.name),
            typeurl::REVOCATION => take(&mut self.revocations, &from.revocations, name, |r| &r.name),
            typeurl::ENDPOINTS => match from.endpoints.get(name) {
                Some(e) => {
                    self.endpoints.insert(name.to_owned(), e.clone());
                }
                None => {
                    self.endpoints.remove(name);
                }
            },
            _ => {}
        }
    }

    /// The config to serve: the bootstrap (node, admin, listeners, telemetry, and any static
    /// services/experiments/clusters) plus these resources. A pushed resource with the name of
    /// a static one replaces it, so a bootstrap can seed defaults the control plane takes
    /// over. `Endpoints` resources set the endpoints of the cluster of their name, whether
    /// that cluster came from the bootstrap or was pushed; endpoints of a cluster that does
    /// not exist (yet) are kept but unused.
    pub fn merge(&self, bootstrap: &Config) -> Config {
        let mut cfg = bootstrap.clone();
        overlay(&mut cfg.clusters, &self.clusters, |c| &c.name);
        overlay(&mut cfg.experiments, &self.experiments, |e| &e.name);
        overlay(&mut cfg.authorization, &self.authorization, |p| &p.name);
        overlay(&mut cfg.revocations, &self.revocations, |r| &r.name);
        // A pushed service names the listeners it is for; on a sidecar without any of them
        // (an inbound-only sidecar, say) it is not served, rather than being an error that
        // would make this sidecar NACK config meant for others.
        let here = |n: &String| bootstrap.listeners.iter().any(|l| &l.name == n);
        let services: Vec<config::Service> = self
            .services
            .iter()
            .filter(|s| s.listeners.is_empty() || s.listeners.iter().any(here))
            .map(|s| config::Service { listeners: s.listeners.iter().filter(|n| here(n)).cloned().collect(), ..s.clone() })
            .collect();
        overlay(&mut cfg.services, &services, |s| &s.name);
        for c in &mut cfg.clusters {
            if let Some(addrs) = self.endpoints.get(&c.name) {
                c.endpoints.clone_from(addrs);
            }
        }
        cfg
    }
}

/// Replaces same-name entries of `base` in place and appends the others, keeping order.
fn overlay<T: Clone>(base: &mut Vec<T>, pushed: &[T], name: impl Fn(&T) -> &String) {
    for item in pushed {
        match base.iter_mut().find(|b| name(b) == name(item)) {
            Some(slot) => *slot = item.clone(),
            None => base.push(item.clone()),
        }
    }
}

/// Decodes and converts every resource of one response, refusing two with the same name
/// (SotW sends each resource once; a repeat means a broken server, and "last one wins" would
/// hide it).
/// A number must be finite even where this sidecar does not use it (a service for another
/// listener): the saved config is JSON, which has no NaN, and a NaN saved as `null` made the
/// whole file unreadable after a restart.
fn finite(field: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() { Ok(v) } else { Err(format!("{field}: {v} is not a finite number")) }
}

fn convert_all<R: Resource, T>(
    resources: &[Any],
    kind: &str,
    convert: impl Fn(R) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        let r: R = from_any(any).map_err(|e| format!("{kind}[{i}]: {e}"))?;
        let name = r.resource_name().to_owned();
        if name.is_empty() {
            return Err(format!("{kind}[{i}]: the resource has no name"));
        }
        if !seen.insert(name.clone()) {
            return Err(format!("{kind}.{name}: pushed twice in one response"));
        }
        out.push(convert(r)?);
    }
    Ok(out)
}

/// A protobuf duration as a config duration; negative or absurd values are errors.
fn dur(field: &str, d: &prost_types::Duration) -> Result<Dur, String> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(format!("{field}: invalid duration {}s {}ns", d.seconds, d.nanos));
    }
    let d2 = Duration::new(d.seconds as u64, d.nanos as u32);
    if d2 > MAX_DURATION {
        return Err(format!("{field}: duration {}s is out of range", d.seconds));
    }
    Ok(Dur(d2))
}

/// An optional duration with a default for "absent".
fn dur_or(field: &str, d: &Option<prost_types::Duration>, default: Dur) -> Result<Dur, String> {
    d.as_ref().map_or(Ok(default), |d| dur(field, d))
}

/// An optional duration that stays optional (the snapshot applies the default).
fn opt_dur(field: &str, d: &Option<prost_types::Duration>) -> Result<Option<Dur>, String> {
    d.as_ref().map(|d| dur(field, d)).transpose()
}

fn size(field: &str, v: Option<u64>, default: usize) -> Result<usize, String> {
    v.map_or(Ok(default), |v| usize::try_from(v).map_err(|_| format!("{field}: {v} is too large")))
}

pub fn cluster(c: v1::Cluster) -> Result<config::Cluster, String> {
    let f = format!("clusters.{}", c.name);
    let d = config::Cluster::default();
    let lb = match v1::LbPolicy::try_from(c.lb) {
        Ok(v1::LbPolicy::P2cEwma) => config::LbPolicy::P2cEwma,
        Ok(v1::LbPolicy::RoundRobin) => config::LbPolicy::RoundRobin,
        Err(_) => return Err(format!("{f}.lb: unknown load-balancing policy {}", c.lb)),
    };
    let protocol = match v1::UpstreamProtocol::try_from(c.protocol) {
        Ok(v1::UpstreamProtocol::Http1) => config::UpstreamProtocol::Http1,
        Ok(v1::UpstreamProtocol::Http2) => config::UpstreamProtocol::Http2,
        Err(_) => return Err(format!("{f}.protocol: unknown upstream protocol {}", c.protocol)),
    };
    let circuit_breaker = match c.circuit_breaker {
        None => d.circuit_breaker,
        Some(cb) => {
            let dd = config::CircuitBreaker::default();
            config::CircuitBreaker {
                max_connections: cb.max_connections.unwrap_or(dd.max_connections),
                max_pending: cb.max_pending.unwrap_or(dd.max_pending),
                max_requests: cb.max_requests.unwrap_or(dd.max_requests),
                max_retries: cb.max_retries.unwrap_or(dd.max_retries),
                error_rate: cb.error_rate.map(|er| error_rate(&f, er)).transpose()?,
            }
        }
    };
    let outlier = c
        .outlier
        .map(|o| {
            let od = config::Outlier::default();
            let of = format!("{f}.outlier");
            Ok::<_, String>(config::Outlier {
                consecutive_5xx: o.consecutive_5xx.unwrap_or(od.consecutive_5xx),
                consecutive_gateway_errors: o.consecutive_gateway_errors.unwrap_or(od.consecutive_gateway_errors),
                base_ejection_time: dur_or(
                    &format!("{of}.base_ejection_time"),
                    &o.base_ejection_time,
                    od.base_ejection_time,
                )?,
                max_ejection_time: dur_or(
                    &format!("{of}.max_ejection_time"),
                    &o.max_ejection_time,
                    od.max_ejection_time,
                )?,
                max_ejection_pct: o.max_ejection_pct.unwrap_or(od.max_ejection_pct),
            })
        })
        .transpose()?;
    Ok(config::Cluster {
        connect_timeout: dur_or(&format!("{f}.connect_timeout"), &c.connect_timeout, d.connect_timeout)?,
        max_idle_per_endpoint: size(
            &format!("{f}.max_idle_per_endpoint"),
            c.max_idle_per_endpoint,
            d.max_idle_per_endpoint,
        )?,
        name: c.name,
        // Filled from the `Endpoints` resource of the same name by `Dynamic::merge`.
        endpoints: vec![],
        lb,
        protocol,
        circuit_breaker,
        outlier,
        tls: match c.tls {
            None => None,
            Some(t) => Some(config::ClusterTls {
                mode: match v1::ClusterTlsMode::try_from(t.mode) {
                    Ok(v1::ClusterTlsMode::Mesh) => config::ClusterTlsMode::Mesh,
                    Ok(v1::ClusterTlsMode::Simple) => config::ClusterTlsMode::Simple,
                    Err(_) => return Err(format!("{f}.tls.mode: unknown value {}", t.mode)),
                },
                identities: t.identities,
                sni: t.sni,
                ca_file: t.ca_file,
            }),
        },
    })
}

pub fn authorization_policy(p: v1::AuthorizationPolicy) -> Result<config::AuthorizationPolicy, String> {
    let action = match v1::AuthzAction::try_from(p.action) {
        Ok(v1::AuthzAction::Allow) => config::AuthzAction::Allow,
        Ok(v1::AuthzAction::Deny) => config::AuthzAction::Deny,
        Err(_) => return Err(format!("authorization.{}.action: unknown value {}", p.name, p.action)),
    };
    Ok(config::AuthorizationPolicy {
        name: p.name,
        namespace: p.namespace,
        services: p.services,
        action,
        rules: p
            .rules
            .into_iter()
            .map(|r| config::AuthzRule { identities: r.identities, path_prefixes: r.path_prefixes, methods: r.methods })
            .collect(),
    })
}

fn error_rate(f: &str, er: v1::ErrorRate) -> Result<config::ErrorRate, String> {
    let d = config::ErrorRate::default();
    let f = format!("{f}.circuit_breaker.error_rate");
    Ok(config::ErrorRate {
        threshold_pct: finite(&format!("{f}.threshold_pct"), er.threshold_pct.unwrap_or(d.threshold_pct))?,
        min_requests: er.min_requests.unwrap_or(d.min_requests),
        window: dur_or(&format!("{f}.window"), &er.window, d.window)?,
        open_duration: dur_or(&format!("{f}.open_duration"), &er.open_duration, d.open_duration)?,
        half_open_probes: er.half_open_probes.unwrap_or(d.half_open_probes),
    })
}

/// The addresses to route to: the healthy endpoints. If none is healthy, all of them (Envoy's
/// "panic routing"): the proxy cannot serve a cluster without endpoints, and refusing the
/// whole push because a fault detector marked every replica down would also freeze every
/// other update; trying suspected-down endpoints (outlier detection still applies) is the
/// lesser harm.
pub fn endpoints(e: v1::Endpoints) -> Result<(String, Vec<String>), String> {
    let f = format!("endpoints.{}", e.cluster_name);
    for (i, ep) in e.endpoints.iter().enumerate() {
        if ep.address.trim().is_empty() {
            return Err(format!("{f}.endpoints[{i}].address: empty"));
        }
    }
    let healthy: Vec<String> = e.endpoints.iter().filter(|ep| ep.healthy).map(|ep| ep.address.clone()).collect();
    let addrs = if healthy.is_empty() { e.endpoints.into_iter().map(|ep| ep.address).collect() } else { healthy };
    Ok((e.cluster_name, addrs))
}

pub fn experiment(e: v1::Experiment) -> Result<config::Experiment, String> {
    let f = format!("experiments.{}", e.name);
    let d = config::Experiment::default();
    let shadow = e
        .shadow
        .map(|s| {
            let sd = config::Shadow::default();
            Ok::<_, String>(config::Shadow {
                cluster: s.cluster,
                variant: s.variant.unwrap_or(sd.variant),
                fraction: finite(&format!("{f}.shadow.fraction"), s.fraction)?,
                max_body_bytes: size(&format!("{f}.shadow.max_body_bytes"), s.max_body_bytes, sd.max_body_bytes)?,
                timeout: dur_or(&format!("{f}.shadow.timeout"), &s.timeout, sd.timeout)?,
            })
        })
        .transpose()?;
    Ok(config::Experiment {
        name: e.name,
        salt: e.salt,
        unit_header: e.unit_header,
        override_header: e.override_header.unwrap_or(d.override_header),
        allow_override: e.allow_override.unwrap_or(d.allow_override),
        variants: e
            .variants
            .into_iter()
            .map(|v| config::Variant {
                name: v.name,
                cluster: v.cluster,
                weight: v.weight,
                model_version: v.model_version,
                max_concurrency: v.max_concurrency,
                max_pending: v.max_pending,
            })
            .collect(),
        stratify: e.stratify.map(|s| config::Stratify {
            header: s.header,
            weights: s.weights.into_iter().map(|(stratum, w)| (stratum, w.weights)).collect(),
        }),
        shadow,
    })
}

pub fn service(s: v1::Service) -> Result<config::Service, String> {
    let f = format!("services.{}", s.name);
    let routes = s.routes.into_iter().map(|r| route(&f, r)).collect::<Result<Vec<_>, String>>()?;
    Ok(config::Service { name: s.name, listeners: s.listeners, hosts: s.hosts, routes })
}

fn route(service: &str, r: v1::Route) -> Result<config::Route, String> {
    let f = format!("{service}.routes.{}", r.name);
    let (cluster, experiment) = match r.target {
        Some(v1::route::Target::Cluster(c)) => (Some(c), None),
        Some(v1::route::Target::Experiment(e)) => (None, Some(e)),
        // Left for the snapshot to reject with its usual "set exactly one" error.
        None => (None, None),
    };
    let m = r.r#match.unwrap_or_default();
    let retry = r
        .retry
        .map(|p| {
            let d = config::RetryPolicy::default();
            let rf = format!("{f}.retry");
            Ok::<_, String>(config::RetryPolicy {
                attempts: p.attempts.unwrap_or(d.attempts),
                on: if p.on.is_empty() { d.on } else { p.on },
                backoff_base: dur_or(&format!("{rf}.backoff_base"), &p.backoff_base, d.backoff_base)?,
                backoff_max: dur_or(&format!("{rf}.backoff_max"), &p.backoff_max, d.backoff_max)?,
                budget_ratio: finite(&format!("{rf}.budget_ratio"), p.budget_ratio.unwrap_or(d.budget_ratio))?,
                budget_min_per_sec: p.budget_min_per_sec.unwrap_or(d.budget_min_per_sec),
                buffer_bytes: size(&format!("{rf}.buffer_bytes"), p.buffer_bytes, d.buffer_bytes)?,
            })
        })
        .transpose()?;
    Ok(config::Route {
        matcher: config::RouteMatch {
            path_exact: m.path_exact,
            path_prefix: m.path_prefix,
            headers: m.headers.into_iter().map(|h| config::HeaderMatch { name: h.name, exact: h.exact }).collect(),
            model: m.model,
        },
        cluster,
        experiment,
        timeout: opt_dur(&format!("{f}.timeout"), &r.timeout)?,
        per_try_timeout: opt_dur(&format!("{f}.per_try_timeout"), &r.per_try_timeout)?,
        idle_timeout: opt_dur(&format!("{f}.idle_timeout"), &r.idle_timeout)?,
        retry,
        name: r.name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_xds::resources::to_any;

    fn secs(s: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds: s, nanos: 0 })
    }

    fn bootstrap() -> Config {
        Config::from_yaml(
            r#"
node: {id: n1}
listeners: [{name: out, address: "127.0.0.1:0"}]
services: [{name: static, hosts: [static], routes: [{name: r, cluster: a}]}]
clusters: [{name: a, endpoints: ["127.0.0.1:1"]}]
"#,
        )
        .unwrap()
    }

    #[test]
    fn pushed_services_for_listeners_this_sidecar_lacks_are_not_served_here() {
        let mk = |name: &str, listeners: &[&str]| config::Service {
            name: name.into(),
            listeners: listeners.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let d = Dynamic {
            services: vec![mk("all", &[]), mk("elsewhere", &["in"]), mk("both", &["in", "out"])],
            ..Default::default()
        };
        let merged = d.merge(&bootstrap());
        let got: Vec<(&str, Vec<String>)> =
            merged.services.iter().map(|s| (s.name.as_str(), s.listeners.clone())).collect();
        assert_eq!(
            got,
            vec![("static", vec![]), ("all", vec![]), ("both", vec!["out".to_string()])],
            "the bootstrap has only listener `out`"
        );
    }

    #[test]
    fn absent_fields_mean_the_yaml_defaults() {
        let c = cluster(v1::Cluster { name: "c".into(), ..Default::default() }).unwrap();
        assert_eq!(c, config::Cluster { name: "c".into(), ..Default::default() });
        let e = experiment(v1::Experiment { name: "e".into(), ..Default::default() }).unwrap();
        assert_eq!(e, config::Experiment { name: "e".into(), ..Default::default() });
        let p = route("services.s", v1::Route { retry: Some(Default::default()), ..Default::default() }).unwrap();
        assert_eq!(p.retry, Some(config::RetryPolicy::default()));
        assert_eq!(p.timeout, None, "absent route timeout stays absent: the snapshot applies 60s");
    }

    #[test]
    fn a_number_that_is_not_finite_is_refused_naming_the_field() {
        let nan = v1::Cluster {
            name: "c".into(),
            circuit_breaker: Some(v1::CircuitBreaker {
                error_rate: Some(v1::ErrorRate { threshold_pct: Some(f64::NAN), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = cluster(nan).unwrap_err();
        assert!(e.contains("clusters.c.circuit_breaker.error_rate.threshold_pct"), "{e}");
    }

    #[test]
    fn set_fields_are_carried_over() {
        let c = cluster(v1::Cluster {
            name: "c".into(),
            lb: v1::LbPolicy::RoundRobin as i32,
            protocol: v1::UpstreamProtocol::Http2 as i32,
            connect_timeout: secs(3),
            max_idle_per_endpoint: Some(7),
            circuit_breaker: Some(v1::CircuitBreaker {
                max_requests: Some(9),
                error_rate: Some(v1::ErrorRate { min_requests: Some(4), ..Default::default() }),
                ..Default::default()
            }),
            outlier: Some(v1::Outlier { consecutive_5xx: Some(2), ..Default::default() }),
            tls: Some(v1::ClusterTls {
                mode: v1::ClusterTlsMode::Mesh as i32,
                identities: vec!["spiffe://mesh.local/service/b".into()],
                ..Default::default()
            }),
        })
        .unwrap();
        let tls = c.tls.as_ref().unwrap();
        assert_eq!((tls.mode, &tls.identities[..]), (config::ClusterTlsMode::Mesh, &["spiffe://mesh.local/service/b".to_string()][..]));
        assert_eq!((c.lb, c.protocol), (config::LbPolicy::RoundRobin, config::UpstreamProtocol::Http2));
        assert_eq!((c.connect_timeout, c.max_idle_per_endpoint), (Dur::from_millis(3000), 7));
        assert_eq!(c.circuit_breaker.max_requests, 9);
        assert_eq!(c.circuit_breaker.max_pending, config::CircuitBreaker::default().max_pending);
        assert_eq!(c.circuit_breaker.error_rate.unwrap().min_requests, 4);
        assert_eq!(c.outlier.unwrap().consecutive_5xx, 2);

        let s = service(v1::Service {
            name: "s".into(),
            hosts: vec!["s.svc".into()],
            routes: vec![v1::Route {
                name: "r".into(),
                r#match: Some(v1::RouteMatch { path_prefix: Some("/v1".into()), ..Default::default() }),
                target: Some(v1::route::Target::Experiment("e".into())),
                timeout: secs(0),
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        let r = &s.routes[0];
        assert_eq!((r.experiment.as_deref(), r.cluster.as_deref()), (Some("e"), None));
        assert_eq!(r.matcher.path_prefix.as_deref(), Some("/v1"));
        assert_eq!(r.timeout, Some(Dur::default()), "zero means none and is kept as zero");
    }

    #[test]
    fn errors_name_the_resource_and_field() {
        let bad_lb = cluster(v1::Cluster { name: "c".into(), lb: 42, ..Default::default() }).unwrap_err();
        assert_eq!(bad_lb, "clusters.c.lb: unknown load-balancing policy 42");
        let neg = service(v1::Service {
            name: "s".into(),
            routes: vec![v1::Route { name: "r".into(), idle_timeout: secs(-1), ..Default::default() }],
            ..Default::default()
        })
        .unwrap_err();
        assert!(neg.starts_with("services.s.routes.r.idle_timeout: invalid duration"), "{neg}");
        let mut d = Dynamic::default();
        let wrong = d.set(typeurl::CLUSTER, &[to_any(&v1::Service::default())]).unwrap_err();
        assert!(wrong.starts_with("clusters[0]: expected a resource of type"), "{wrong}");
        let garbage = Any { type_url: typeurl::SERVICE.into(), value: vec![0xff; 3] };
        assert!(d.set(typeurl::SERVICE, &[garbage]).unwrap_err().starts_with("services[0]: undecodable"));
        let twice = vec![to_any(&v1::Cluster { name: "x".into(), ..Default::default() }); 2];
        assert_eq!(d.set(typeurl::CLUSTER, &twice).unwrap_err(), "clusters.x: pushed twice in one response");
    }

    #[test]
    fn endpoints_keep_healthy_ones_or_all_when_none_is() {
        let ep = |a: &str, healthy| v1::Endpoint { address: a.into(), healthy, ..Default::default() };
        let mixed = v1::Endpoints { cluster_name: "c".into(), endpoints: vec![ep("h:1", true), ep("u:1", false)] };
        assert_eq!(endpoints(mixed).unwrap(), ("c".into(), vec!["h:1".into()]));
        let down = v1::Endpoints { cluster_name: "c".into(), endpoints: vec![ep("u:1", false)] };
        assert_eq!(endpoints(down).unwrap().1, vec!["u:1".to_string()]);
        let empty = v1::Endpoints { cluster_name: "c".into(), endpoints: vec![ep(" ", true)] };
        assert_eq!(endpoints(empty).unwrap_err(), "endpoints.c.endpoints[0].address: empty");
    }

    #[test]
    fn merge_overlays_pushed_resources_on_the_bootstrap() {
        let mut d = Dynamic::default();
        d.set(typeurl::CLUSTER, &[to_any(&v1::Cluster { name: "b".into(), ..Default::default() })]).unwrap();
        let eps = |c: &str, a: &str| v1::Endpoints {
            cluster_name: c.into(),
            endpoints: vec![v1::Endpoint { address: a.into(), healthy: true, ..Default::default() }],
        };
        d.set(
            typeurl::ENDPOINTS,
            &[to_any(&eps("a", "127.0.0.1:2")), to_any(&eps("b", "127.0.0.1:3")), to_any(&eps("zz", "127.0.0.1:4"))],
        )
        .unwrap();
        let cfg = d.merge(&bootstrap());
        let got: Vec<(&str, &[String])> =
            cfg.clusters.iter().map(|c| (c.name.as_str(), c.endpoints.as_slice())).collect();
        assert_eq!(got, vec![("a", &["127.0.0.1:2".to_string()][..]), ("b", &["127.0.0.1:3".to_string()][..])]);
        assert_eq!(cfg.listeners, bootstrap().listeners, "listeners always come from the bootstrap");
        assert_eq!(cfg.services.len(), 1);

        // A pushed service with a static one's name replaces it.
        let s = v1::Service { name: "static".into(), hosts: vec!["other".into()], ..Default::default() };
        d.set(typeurl::SERVICE, &[to_any(&s)]).unwrap();
        let cfg = d.merge(&bootstrap());
        assert_eq!(cfg.services.len(), 1);
        assert_eq!(cfg.services[0].hosts, vec!["other".to_string()]);
    }

    #[test]
    fn dynamic_round_trips_through_json() {
        let mut d = Dynamic::default();
        d.set(
            typeurl::CLUSTER,
            &[to_any(&v1::Cluster { name: "b".into(), connect_timeout: secs(2), ..Default::default() })],
        )
        .unwrap();
        d.endpoints.insert("b".into(), vec!["127.0.0.1:3".into()]);
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Dynamic>(&text).unwrap(), d);
    }
}

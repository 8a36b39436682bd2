//! Config types → weft.v1 resources: the inverse of [`super::convert`], used by the control
//! plane to push what a user wrote in the proxy's YAML vocabulary. Every optional protobuf
//! field is set explicitly, so `convert(encode(x)) == x` holds for every valid value (tested
//! below) and a sidecar never substitutes its own default for one the user chose.

use std::time::Duration;

use weft_xds::resources::v1;

use crate::config;
use crate::duration::Dur;

fn dur(d: Dur) -> prost_types::Duration {
    let d: Duration = d.0;
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

fn opt_dur(d: Option<Dur>) -> Option<prost_types::Duration> {
    d.map(dur)
}

pub fn cluster(c: &config::Cluster) -> v1::Cluster {
    let cb = &c.circuit_breaker;
    v1::Cluster {
        name: c.name.clone(),
        lb: match c.lb {
            config::LbPolicy::P2cEwma => v1::LbPolicy::P2cEwma,
            config::LbPolicy::RoundRobin => v1::LbPolicy::RoundRobin,
        } as i32,
        protocol: match c.protocol {
            config::UpstreamProtocol::Http1 => v1::UpstreamProtocol::Http1,
            config::UpstreamProtocol::Http2 => v1::UpstreamProtocol::Http2,
        } as i32,
        connect_timeout: Some(dur(c.connect_timeout)),
        max_idle_per_endpoint: Some(c.max_idle_per_endpoint as u64),
        circuit_breaker: Some(v1::CircuitBreaker {
            max_connections: Some(cb.max_connections),
            max_pending: Some(cb.max_pending),
            max_requests: Some(cb.max_requests),
            max_retries: Some(cb.max_retries),
            error_rate: cb.error_rate.as_ref().map(|er| v1::ErrorRate {
                threshold_pct: Some(er.threshold_pct),
                min_requests: Some(er.min_requests),
                window: Some(dur(er.window)),
                open_duration: Some(dur(er.open_duration)),
                half_open_probes: Some(er.half_open_probes),
            }),
        }),
        outlier: c.outlier.as_ref().map(|o| v1::Outlier {
            consecutive_5xx: Some(o.consecutive_5xx),
            consecutive_gateway_errors: Some(o.consecutive_gateway_errors),
            base_ejection_time: Some(dur(o.base_ejection_time)),
            max_ejection_time: Some(dur(o.max_ejection_time)),
            max_ejection_pct: Some(o.max_ejection_pct),
        }),
        tls: c.tls.as_ref().map(|t| v1::ClusterTls {
            mode: match t.mode {
                config::ClusterTlsMode::Mesh => v1::ClusterTlsMode::Mesh,
                config::ClusterTlsMode::Simple => v1::ClusterTlsMode::Simple,
            } as i32,
            identities: t.identities.clone(),
            sni: t.sni.clone(),
            ca_file: t.ca_file.clone(),
        }),
    }
}

pub fn authorization_policy(p: &config::AuthorizationPolicy) -> v1::AuthorizationPolicy {
    v1::AuthorizationPolicy {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        services: p.services.clone(),
        action: match p.action {
            config::AuthzAction::Allow => v1::AuthzAction::Allow,
            config::AuthzAction::Deny => v1::AuthzAction::Deny,
        } as i32,
        rules: p
            .rules
            .iter()
            .map(|r| v1::AuthzRule { identities: r.identities.clone(), path_prefixes: r.path_prefixes.clone(), methods: r.methods.clone() })
            .collect(),
    }
}

pub fn revocation(r: &config::Revocation) -> v1::Revocation {
    v1::Revocation { name: r.name.clone(), identity: r.identity.clone(), issued_before: r.issued_before }
}

pub fn experiment(e: &config::Experiment) -> v1::Experiment {
    v1::Experiment {
        name: e.name.clone(),
        salt: e.salt.clone(),
        unit_header: e.unit_header.clone(),
        override_header: Some(e.override_header.clone()),
        allow_override: Some(e.allow_override),
        variants: e
            .variants
            .iter()
            .map(|v| v1::Variant {
                name: v.name.clone(),
                cluster: v.cluster.clone(),
                weight: v.weight,
                model_version: v.model_version.clone(),
                max_concurrency: v.max_concurrency,
                max_pending: v.max_pending,
            })
            .collect(),
        stratify: e.stratify.as_ref().map(|s| v1::Stratify {
            header: s.header.clone(),
            weights: s
                .weights
                .iter()
                .map(|(k, w)| (k.clone(), v1::VariantWeights { weights: w.clone() }))
                .collect(),
        }),
        shadow: e.shadow.as_ref().map(|s| v1::Shadow {
            cluster: s.cluster.clone(),
            variant: Some(s.variant.clone()),
            fraction: s.fraction,
            max_body_bytes: Some(s.max_body_bytes as u64),
            timeout: Some(dur(s.timeout)),
        }),
    }
}

pub fn service(s: &config::Service) -> v1::Service {
    v1::Service {
        name: s.name.clone(),
        listeners: s.listeners.clone(),
        hosts: s.hosts.clone(),
        routes: s.routes.iter().map(route).collect(),
    }
}

fn route(r: &config::Route) -> v1::Route {
    let m = &r.matcher;
    v1::Route {
        name: r.name.clone(),
        r#match: Some(v1::RouteMatch {
            path_exact: m.path_exact.clone(),
            path_prefix: m.path_prefix.clone(),
            headers: m
                .headers
                .iter()
                .map(|h| v1::HeaderMatch { name: h.name.clone(), exact: h.exact.clone() })
                .collect(),
            model: m.model.clone(),
        }),
        // Both set (or neither) is invalid; the sidecar rejects it with its usual error, so
        // encode the cluster and let validation speak rather than silently dropping one.
        target: match (&r.cluster, &r.experiment) {
            (Some(c), _) => Some(v1::route::Target::Cluster(c.clone())),
            (None, Some(e)) => Some(v1::route::Target::Experiment(e.clone())),
            (None, None) => None,
        },
        timeout: opt_dur(r.timeout),
        per_try_timeout: opt_dur(r.per_try_timeout),
        idle_timeout: opt_dur(r.idle_timeout),
        retry: r.retry.as_ref().map(|p| v1::RetryPolicy {
            attempts: Some(p.attempts),
            on: p.on.clone(),
            backoff_base: Some(dur(p.backoff_base)),
            backoff_max: Some(dur(p.backoff_max)),
            budget_ratio: Some(p.budget_ratio),
            budget_min_per_sec: Some(p.budget_min_per_sec),
            buffer_bytes: Some(p.buffer_bytes as u64),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::convert;
    use super::*;
    use crate::Config;

    #[test]
    fn encode_then_convert_is_identity() {
        let cfg = Config::from_yaml(
            r#"
listeners: [{name: out, address: "127.0.0.1:0"}]
services:
  - name: chat
    hosts: [chat, "*.chat"]
    listeners: [out]
    routes:
      - {name: a, match: {path_prefix: /v1, headers: [{name: x-t, exact: "1"}, {name: x-p}], model: m}, experiment: e,
         timeout: 0s, per_try_timeout: 2s, idle_timeout: 90s, retry: {attempts: 3, on: ["503"], budget_ratio: 0.5}}
      - {name: b, match: {path_exact: /x}, cluster: c1}
experiments:
  - name: e
    salt: s1
    unit_header: x-user-id
    allow_override: false
    variants: [{name: a, cluster: c1, weight: 70, model_version: "7"}, {name: b, cluster: c2, weight: 30, max_concurrency: 4, max_pending: 2}]
    stratify: {header: x-tenant, weights: {gold: {a: 1, b: 9}}}
    shadow: {cluster: c2, fraction: 0.25, timeout: 1500ms}
clusters:
  - {name: c1, lb: round_robin, protocol: http2, connect_timeout: 250ms, max_idle_per_endpoint: 3,
     circuit_breaker: {max_requests: 9, error_rate: {threshold_pct: 20, window: 3s}},
     outlier: {consecutive_5xx: 2}}
  - {name: c2}
"#,
        )
        .unwrap();
        for c in &cfg.clusters {
            assert_eq!(&convert::cluster(cluster(c)).unwrap(), c);
        }
        for e in &cfg.experiments {
            assert_eq!(&convert::experiment(experiment(e)).unwrap(), e);
        }
        for s in &cfg.services {
            assert_eq!(&convert::service(service(s)).unwrap(), s);
        }
    }
}

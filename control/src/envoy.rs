//! weft's resources as the standard Envoy v3 xDS resources, so a stock Envoy whose bootstrap
//! names only weft-control as its ADS server routes what weft's own sidecars route. Pure: no IO.
//!
//! The mapping, resource by resource:
//! - each weft `Cluster` → an Envoy `Cluster` of type EDS over ADS (connect timeout, load
//!   balancer, circuit-breaker thresholds, outlier detection, HTTP/2 upstreams);
//! - each cluster's merged endpoints (its own list, `endpoints` resources, sidecar
//!   registrations) → a `ClusterLoadAssignment`;
//! - every `Service` → one virtual host of the single `RouteConfiguration` [`ROUTE_CONFIG`]
//!   (its hosts are the domains; a route to an experiment becomes `weighted_clusters` with the
//!   variants' relative weights, which is also how Envoy reads weights);
//! - one `Listener` [`LISTENER`] at the control plane's `--envoy-listener` address, with the
//!   HTTP connection manager reading that route configuration over ADS.
//!
//! What Envoy has no equivalent for is left out rather than approximated: sticky assignment
//! by unit header (Envoy picks a weighted cluster per request), overrides, strata, shadows,
//! the error-rate breaker and retry budgets.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as upstream_http;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use envoy_types::pb::google::protobuf;
use envoy_types::util::pack_any;
use weft_proxy::config;
use weft_xds::resources::v1;
use weft_xds::transport::Any;

/// The one listener weft-control serves to Envoy.
pub const LISTENER: &str = "weft-http";
/// The one route configuration, holding a virtual host per service.
pub const ROUTE_CONFIG: &str = "weft";
/// Where the generated listener binds unless `--envoy-listener` says otherwise (the port
/// Istio's outbound capture uses).
pub const DEFAULT_LISTENER_ADDRESS: &str = "0.0.0.0:15001";

fn duration(d: Duration) -> protobuf::Duration {
    protobuf::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

fn u32_value(value: u32) -> Option<protobuf::UInt32Value> {
    Some(protobuf::UInt32Value { value })
}

fn ads() -> Option<core::ConfigSource> {
    Some(core::ConfigSource {
        resource_api_version: core::ApiVersion::V3 as i32,
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    })
}

fn socket_address(ip: std::net::IpAddr, port: u16) -> Option<core::Address> {
    Some(core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port.into())),
            ..Default::default()
        })),
    })
}

/// A weft cluster as an Envoy EDS cluster (its endpoints come from [`load_assignment`]).
pub fn cluster(c: &config::Cluster) -> Any {
    let cb = &c.circuit_breaker;
    let lb = match c.lb {
        // Envoy's least-request balancer is power-of-two-choices on active requests: the
        // closest it has to weft's P2C over latency × in-flight.
        config::LbPolicy::P2cEwma => cluster::cluster::LbPolicy::LeastRequest,
        config::LbPolicy::RoundRobin => cluster::cluster::LbPolicy::RoundRobin,
    };
    let mut typed_extension_protocol_options = std::collections::HashMap::new();
    if c.protocol == config::UpstreamProtocol::Http2 {
        let options = upstream_http::HttpProtocolOptions {
            upstream_protocol_options: Some(
                upstream_http::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    upstream_http::http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            upstream_http::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                core::Http2ProtocolOptions::default(),
                            ),
                        ),
                    },
                ),
            ),
            ..Default::default()
        };
        typed_extension_protocol_options
            .insert("envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(), pack_any(options));
    }
    let outlier_detection = c.outlier.as_ref().map(|o| cluster::OutlierDetection {
        consecutive_5xx: u32_value(o.consecutive_5xx),
        consecutive_gateway_failure: u32_value(o.consecutive_gateway_errors),
        // Envoy enforces gateway-failure ejection 0 % of the time unless told otherwise.
        enforcing_consecutive_gateway_failure: u32_value(if o.consecutive_gateway_errors > 0 { 100 } else { 0 }),
        enforcing_consecutive_5xx: u32_value(if o.consecutive_5xx > 0 { 100 } else { 0 }),
        base_ejection_time: Some(duration(o.base_ejection_time.0)),
        max_ejection_time: Some(duration(o.max_ejection_time.0)),
        max_ejection_percent: u32_value(o.max_ejection_pct),
        ..Default::default()
    });
    let envoy = cluster::Cluster {
        name: c.name.clone(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig { eds_config: ads(), service_name: String::new() }),
        connect_timeout: Some(duration(c.connect_timeout.0)),
        lb_policy: lb as i32,
        circuit_breakers: Some(cluster::CircuitBreakers {
            thresholds: vec![cluster::circuit_breakers::Thresholds {
                priority: core::RoutingPriority::Default as i32,
                max_connections: u32_value(cb.max_connections),
                max_pending_requests: u32_value(cb.max_pending),
                max_requests: u32_value(cb.max_requests),
                max_retries: u32_value(cb.max_retries),
                ..Default::default()
            }],
            ..Default::default()
        }),
        outlier_detection,
        typed_extension_protocol_options,
        ..Default::default()
    };
    pack_any(envoy)
}

/// A cluster's endpoints as a `ClusterLoadAssignment`. Envoy's EDS takes IP addresses only:
/// an endpoint given by host name is left out (weft's sidecars resolve names, Envoy would
/// reject the whole assignment).
pub fn load_assignment(cluster_name: &str, endpoints: &[v1::Endpoint]) -> Any {
    let lb_endpoints = endpoints
        .iter()
        .filter_map(|e| {
            let addr: SocketAddr = e.address.parse().ok()?;
            let health = if e.healthy { core::HealthStatus::Healthy } else { core::HealthStatus::Unhealthy };
            Some(endpoint::LbEndpoint {
                health_status: health as i32,
                host_identifier: Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(endpoint::Endpoint {
                    address: socket_address(addr.ip(), addr.port()),
                    ..Default::default()
                })),
                ..Default::default()
            })
        })
        .collect();
    pack_any(endpoint::ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: vec![endpoint::LocalityLbEndpoints { lb_endpoints, ..Default::default() }],
        ..Default::default()
    })
}

/// Escapes `s` for RE2, which takes a backslash before any punctuation.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn header_matcher(name: &str, pattern: Option<matcher::string_matcher::MatchPattern>) -> route::HeaderMatcher {
    use route::header_matcher::HeaderMatchSpecifier;
    let specifier = match pattern {
        Some(p) => HeaderMatchSpecifier::StringMatch(matcher::StringMatcher {
            match_pattern: Some(p),
            ignore_case: false,
        }),
        None => HeaderMatchSpecifier::PresentMatch(true),
    };
    route::HeaderMatcher { name: name.to_string(), header_match_specifier: Some(specifier), ..Default::default() }
}

fn route_match(m: &config::RouteMatch) -> route::RouteMatch {
    use route::route_match::PathSpecifier;
    let path = match (&m.path_exact, &m.path_prefix) {
        (Some(exact), _) => PathSpecifier::Path(exact.clone()),
        (None, Some(prefix)) => PathSpecifier::Prefix(prefix.clone()),
        (None, None) => PathSpecifier::Prefix("/".into()),
    };
    let mut headers: Vec<_> = m
        .headers
        .iter()
        .map(|h| header_matcher(&h.name, h.exact.clone().map(matcher::string_matcher::MatchPattern::Exact)))
        .collect();
    if let Some(model) = &m.model {
        // The KServe v2 model name is a path segment: match it on `:path`, alongside the
        // path specifier above.
        let regex = format!("^/v2/models/{}([/?].*)?$", regex_escape(model));
        let pattern = matcher::string_matcher::MatchPattern::SafeRegex(matcher::RegexMatcher {
            regex,
            ..Default::default()
        });
        headers.push(header_matcher(":path", Some(pattern)));
    }
    route::RouteMatch { path_specifier: Some(path), headers, ..Default::default() }
}

/// weft's retry conditions in Envoy's vocabulary: `retry_on` plus the status codes.
fn retry_policy(r: &config::RetryPolicy, per_try: Option<Duration>) -> route::RetryPolicy {
    let mut on = Vec::new();
    let mut codes = Vec::new();
    for cond in &r.on {
        let envoy = match cond.parse::<u32>() {
            Ok(code) => {
                codes.push(code);
                "retriable-status-codes"
            }
            // A timed-out try answers 504 in Envoy, which `gateway-error` retries.
            Err(_) if cond == "timeout" => "gateway-error",
            Err(_) => cond.as_str(),
        };
        if !on.contains(&envoy) {
            on.push(envoy);
        }
    }
    route::RetryPolicy {
        retry_on: on.join(","),
        num_retries: u32_value(r.attempts.saturating_sub(1)),
        retriable_status_codes: codes,
        per_try_timeout: per_try.map(duration),
        retry_back_off: Some(route::retry_policy::RetryBackOff {
            base_interval: Some(duration(r.backoff_base.0)),
            max_interval: Some(duration(r.backoff_max.0)),
        }),
        ..Default::default()
    }
}

/// The route's target: one cluster, or the experiment's variants by weight. `None` when the
/// experiment is unknown or gives no variant any weight (the route is left out: Envoy would
/// refuse a weighted-clusters action that sums to 0).
fn cluster_specifier(
    r: &config::Route,
    experiments: &BTreeMap<&str, &config::Experiment>,
) -> Option<route::route_action::ClusterSpecifier> {
    use route::route_action::ClusterSpecifier;
    if let Some(c) = &r.cluster {
        return Some(ClusterSpecifier::Cluster(c.clone()));
    }
    let exp = experiments.get(r.experiment.as_deref()?)?;
    let clusters: Vec<_> = exp
        .variants
        .iter()
        .filter(|v| v.weight > 0)
        .map(|v| route::weighted_cluster::ClusterWeight {
            name: v.cluster.clone(),
            weight: u32_value(v.weight),
            // Upstreams see which variant served the request, as behind a weft sidecar.
            request_headers_to_add: vec![core::HeaderValueOption {
                header: Some(core::HeaderValue {
                    key: exp.override_header.clone(),
                    value: v.name.clone(),
                    ..Default::default()
                }),
                append_action: core::header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    (!clusters.is_empty())
        .then(|| ClusterSpecifier::WeightedClusters(route::WeightedCluster { clusters, ..Default::default() }))
}

fn envoy_route(r: &config::Route, experiments: &BTreeMap<&str, &config::Experiment>) -> Option<route::Route> {
    let action = route::RouteAction {
        cluster_specifier: Some(cluster_specifier(r, experiments)?),
        // weft's defaults: 60 s to the response headers, 5 min of silence in a body.
        timeout: Some(duration(r.timeout.map_or(Duration::from_secs(60), |d| d.0))),
        idle_timeout: Some(duration(r.idle_timeout.map_or(Duration::from_secs(300), |d| d.0))),
        retry_policy: r.retry.as_ref().map(|p| retry_policy(p, r.per_try_timeout.map(|d| d.0))),
        ..Default::default()
    };
    Some(route::Route {
        name: r.name.clone(),
        r#match: Some(route_match(&r.matcher)),
        action: Some(route::route::Action::Route(action)),
        ..Default::default()
    })
}

/// Every service as a virtual host of one route configuration. A host two services claim
/// goes to the first by name (Envoy refuses a configuration with a domain twice; a weft
/// sidecar refuses the second service alike); a service left with no host is left out.
pub fn route_configuration<'a>(
    services: impl IntoIterator<Item = &'a config::Service>,
    experiments: &BTreeMap<&str, &config::Experiment>,
) -> Any {
    let mut claimed = BTreeSet::new();
    let virtual_hosts = services
        .into_iter()
        .filter_map(|s| {
            let domains: Vec<String> =
                s.hosts.iter().map(|h| h.to_ascii_lowercase()).filter(|h| claimed.insert(h.clone())).collect();
            (!domains.is_empty()).then(|| route::VirtualHost {
                name: s.name.clone(),
                domains,
                routes: s.routes.iter().filter_map(|r| envoy_route(r, experiments)).collect(),
                ..Default::default()
            })
        })
        .collect();
    pack_any(route::RouteConfiguration {
        name: ROUTE_CONFIG.into(),
        virtual_hosts,
        // Hosts match without their port, as in weft.
        ignore_port_in_host_matching: true,
        ..Default::default()
    })
}

/// The listener Envoy serves on: the HTTP connection manager with [`ROUTE_CONFIG`] over ADS.
pub fn listener(address: SocketAddr) -> Any {
    let manager = hcm::HttpConnectionManager {
        stat_prefix: "weft".into(),
        codec_type: hcm::http_connection_manager::CodecType::Auto as i32,
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(hcm::Rds {
            config_source: ads(),
            route_config_name: ROUTE_CONFIG.into(),
        })),
        http_filters: vec![hcm::HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack_any(Router::default()))),
            ..Default::default()
        }],
        // WebSocket upgrades pass through, as they do through a weft sidecar.
        upgrade_configs: vec![hcm::http_connection_manager::UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    pack_any(listener::Listener {
        name: LISTENER.into(),
        address: socket_address(address.ip(), address.port()),
        filter_chains: vec![listener::FilterChain {
            filters: vec![listener::Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(listener::filter::ConfigType::TypedConfig(pack_any(manager))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn unpack<M: Message + Default>(any: &Any) -> M {
        M::decode(any.value.as_slice()).unwrap()
    }

    fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
        serde_norway::from_str(s).unwrap()
    }

    #[test]
    fn an_experiment_route_becomes_weighted_clusters_with_the_variant_shares() {
        let exp: config::Experiment = yaml(
            "name: e\nvariants:\n- {name: a, cluster: ca, weight: 150}\n- {name: b, cluster: cb, weight: 50}\n- {name: c, cluster: cc, weight: 0}",
        );
        let svc: config::Service = yaml(
            "name: s\nhosts: [Chat.Example]\nroutes:\n- {name: r, match: {path_prefix: /v1/}, experiment: e}\n- {name: gone, experiment: nope}",
        );
        let exps = BTreeMap::from([("e", &exp)]);
        let rc: route::RouteConfiguration = unpack(&route_configuration([&svc], &exps));
        assert_eq!(rc.name, ROUTE_CONFIG);
        let vh = &rc.virtual_hosts[0];
        assert_eq!(vh.domains, vec!["chat.example"]);
        assert_eq!(vh.routes.len(), 1, "a route to an unknown experiment is left out");
        let Some(route::route::Action::Route(action)) = &vh.routes[0].action else { panic!("no route action") };
        let Some(route::route_action::ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier else {
            panic!("not weighted: {action:?}")
        };
        let got: Vec<_> = w.clusters.iter().map(|c| (c.name.as_str(), c.weight.unwrap().value)).collect();
        assert_eq!(got, vec![("ca", 150), ("cb", 50)], "weights are relative shares; weight 0 is left out");
        assert_eq!(w.clusters[0].request_headers_to_add[0].header.as_ref().unwrap().value, "a");
    }

    #[test]
    fn a_host_claimed_twice_goes_to_the_first_service() {
        let a: config::Service = yaml("name: a\nhosts: [x, y]\nroutes: [{name: r, cluster: c}]");
        let b: config::Service = yaml("name: b\nhosts: [x]\nroutes: [{name: r, cluster: c}]");
        let rc: route::RouteConfiguration = unpack(&route_configuration([&a, &b], &BTreeMap::new()));
        assert_eq!(rc.virtual_hosts.len(), 1);
        assert_eq!(rc.virtual_hosts[0].domains, vec!["x", "y"]);
    }

    #[test]
    fn a_model_match_checks_the_kserve_path_segment() {
        let m: config::RouteMatch = yaml("path_prefix: /v2/\nmodel: llama-3.1\nheaders: [{name: x-env}]");
        let got = route_match(&m);
        assert_eq!(got.path_specifier, Some(route::route_match::PathSpecifier::Prefix("/v2/".into())));
        assert_eq!(got.headers[0].header_match_specifier, Some(route::header_matcher::HeaderMatchSpecifier::PresentMatch(true)));
        let Some(route::header_matcher::HeaderMatchSpecifier::StringMatch(s)) = &got.headers[1].header_match_specifier
        else {
            panic!("no :path matcher")
        };
        let Some(matcher::string_matcher::MatchPattern::SafeRegex(r)) = &s.match_pattern else { panic!() };
        assert_eq!(r.regex, r"^/v2/models/llama\-3\.1([/?].*)?$");
    }

    #[test]
    fn endpoints_by_name_are_left_out_and_health_is_kept() {
        let eps = vec![
            v1::Endpoint { address: "127.0.0.1:8080".into(), healthy: true, ..Default::default() },
            v1::Endpoint { address: "[::1]:9000".into(), healthy: false, ..Default::default() },
            v1::Endpoint { address: "model.svc:80".into(), healthy: true, ..Default::default() },
        ];
        let cla: endpoint::ClusterLoadAssignment = unpack(&load_assignment("c", &eps));
        let lbs = &cla.endpoints[0].lb_endpoints;
        assert_eq!(lbs.len(), 2);
        assert_eq!(lbs[1].health_status, core::HealthStatus::Unhealthy as i32);
    }

    #[test]
    fn an_h2_cluster_asks_envoy_for_http2_upstreams() {
        let c: config::Cluster = yaml("name: g\nendpoints: [127.0.0.1:1]\nprotocol: http2\nlb: round_robin");
        let got: cluster::Cluster = unpack(&cluster(&c));
        assert!(got.typed_extension_protocol_options.contains_key("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"));
        assert_eq!(got.lb_policy, cluster::cluster::LbPolicy::RoundRobin as i32);
        assert!(got.eds_cluster_config.is_some());
    }
}

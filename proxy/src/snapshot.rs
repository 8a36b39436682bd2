//! A validated, compiled config: what every request reads, through one `Arc` swapped
//! atomically on reload. Compiling is validating: a config that compiles can be served, and
//! one that does not is rejected with an error naming the field, leaving the old one in place.

use http::HeaderName;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::assign::Assigner;
use crate::cluster::Cluster;
use crate::config::{self, Config, Direction};
use crate::limit::Limiter;
use crate::retry::{Budget, RetryOn};
use crate::route::{HostTable, RouteMatcher};
use crate::telemetry::Telemetry;

pub struct Snapshot {
    /// Increases by one with every accepted config.
    pub version: u64,
    pub config: Config,
    pub listeners: Vec<ListenerRt>,
    /// `authorization[]` per service, enforced on inbound listeners.
    pub authz: crate::authz::Authz,
    pub services: Vec<ServiceRt>,
    pub experiments: Vec<ExperimentRt>,
    pub clusters: Vec<Arc<Cluster>>,
    pub tenant_header: Option<HeaderName>,
    pub model_version_header: Option<HeaderName>,
}

pub struct ListenerRt {
    pub name: Arc<str>,
    pub address: SocketAddr,
    pub direction: Direction,
    pub hosts: HostTable,
    pub tls: crate::mtls::ListenerTls,
}

pub struct ServiceRt {
    pub name: Arc<str>,
    pub routes: Vec<RouteRt>,
}

pub enum Target {
    Cluster(usize),
    Experiment(usize),
}

pub struct RouteRt {
    pub name: Arc<str>,
    pub matcher: RouteMatcher,
    pub target: Target,
    pub timeout: Option<Duration>,
    pub per_try_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub retry: Option<RetryRt>,
}

pub struct RetryRt {
    pub attempts: u32,
    pub on: RetryOn,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub buffer_bytes: usize,
    pub budget: Arc<Mutex<Budget>>,
    cfg: config::RetryPolicy,
}

pub struct ExperimentRt {
    pub name: Arc<str>,
    pub assigner: Assigner,
    pub variants: Vec<VariantRt>,
    pub unit_header: Option<HeaderName>,
    pub override_header: Option<HeaderName>,
    pub stratify_header: Option<HeaderName>,
    pub shadow: Option<ShadowRt>,
}

pub struct VariantRt {
    pub name: Arc<str>,
    /// `x-weft-variant` value, built once.
    pub header: http::HeaderValue,
    pub cluster: usize,
    pub model_version: Arc<str>,
    pub limiter: Arc<Limiter>,
    limits: (u32, u32),
}

pub struct ShadowRt {
    pub cluster: usize,
    pub variant: Arc<str>,
    pub fraction: f64,
    pub max_body_bytes: usize,
    pub timeout: Duration,
}

/// Default route timeout: long enough for slow inference, short enough to free stuck slots.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default stream idle timeout: generous, since it is the only limit on a token stream.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

fn header(field: &str, name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{field}: {name:?} is not a valid header name"))
}

fn opt_header(field: &str, name: &str) -> Result<Option<HeaderName>, String> {
    if name.is_empty() { Ok(None) } else { header(field, name).map(Some) }
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut seen = HashSet::new();
    for n in names {
        if n.is_empty() {
            return Err(format!("{what}: every entry needs a non-empty name"));
        }
        if !seen.insert(n) {
            return Err(format!("{what}: name {n:?} is used twice"));
        }
    }
    Ok(())
}

impl Snapshot {
    /// Validate and compile `cfg`. `prev` lends its runtime state (pools, EWMA, breakers,
    /// limiters, budgets) to the parts that did not change.
    pub fn compile(
        cfg: Config,
        prev: Option<&Snapshot>,
        workers: usize,
        tel: &Telemetry,
        tls: &Arc<crate::mtls::TlsContext>,
    ) -> Result<Snapshot, String> {
        unique("listeners", cfg.listeners.iter().map(|l| l.name.as_str()))?;
        unique("services", cfg.services.iter().map(|s| s.name.as_str()))?;
        unique("experiments", cfg.experiments.iter().map(|e| e.name.as_str()))?;
        unique("clusters", cfg.clusters.iter().map(|c| c.name.as_str()))?;
        if cfg.listeners.is_empty() {
            return Err("listeners: at least one listener is required".into());
        }
        cfg.admin
            .address
            .parse::<SocketAddr>()
            .map_err(|_| format!("admin.address: {:?} is not an ip:port address", cfg.admin.address))?;
        if let Some(m) = &cfg.admin.metrics_address {
            m.parse::<SocketAddr>().map_err(|_| format!("admin.metrics_address: {m:?} is not an ip:port address"))?;
        }

        let mut clusters = Vec::with_capacity(cfg.clusters.len());
        let mut cluster_idx = HashMap::new();
        for (i, c) in cfg.clusters.iter().enumerate() {
            let old = prev.and_then(|p| p.clusters.iter().find(|x| x.cfg.name == c.name));
            clusters.push(Cluster::build(c, old, workers, tel, tls)?);
            cluster_idx.insert(c.name.as_str(), i);
        }
        let find_cluster = |field: String, name: &str| {
            cluster_idx.get(name).copied().ok_or_else(|| format!("{field}: unknown cluster {name:?}"))
        };

        let mut experiments = Vec::with_capacity(cfg.experiments.len());
        let mut exp_idx = HashMap::new();
        for (i, e) in cfg.experiments.iter().enumerate() {
            let old = prev.and_then(|p| p.experiments.iter().find(|x| &*x.name == e.name.as_str()));
            experiments.push(compile_experiment(e, old, &find_cluster, tel)?);
            exp_idx.insert(e.name.as_str(), i);
        }

        let mut services = Vec::with_capacity(cfg.services.len());
        for s in &cfg.services {
            let f = format!("services.{}", s.name);
            unique(&format!("{f}.routes"), s.routes.iter().map(|r| r.name.as_str()))?;
            if s.routes.is_empty() {
                return Err(format!("{f}.routes: at least one route is required"));
            }
            if s.hosts.is_empty() {
                return Err(format!("{f}.hosts: at least one host (or \"*\") is required"));
            }
            let old_svc = prev.and_then(|p| p.services.iter().find(|x| &*x.name == s.name.as_str()));
            let mut routes = Vec::with_capacity(s.routes.len());
            for r in &s.routes {
                let rf = format!("{f}.routes.{}", r.name);
                let target = match (&r.cluster, &r.experiment) {
                    (Some(c), None) => Target::Cluster(find_cluster(format!("{rf}.cluster"), c)?),
                    (None, Some(e)) => Target::Experiment(
                        *exp_idx.get(e.as_str()).ok_or_else(|| format!("{rf}.experiment: unknown experiment {e:?}"))?,
                    ),
                    _ => return Err(format!("{rf}: set exactly one of cluster or experiment")),
                };
                let old_route = old_svc.and_then(|o| o.routes.iter().find(|x| &*x.name == r.name.as_str()));
                routes.push(RouteRt {
                    name: Arc::from(r.name.as_str()),
                    matcher: RouteMatcher::compile(&r.matcher).map_err(|e| format!("{rf}.{e}"))?,
                    target,
                    timeout: r.timeout.map_or(Some(DEFAULT_TIMEOUT), |d| d.non_zero()),
                    per_try_timeout: r.per_try_timeout.and_then(|d| d.non_zero()),
                    idle_timeout: r.idle_timeout.map_or(Some(DEFAULT_IDLE_TIMEOUT), |d| d.non_zero()),
                    retry: match &r.retry {
                        None => None,
                        Some(p) => Some(compile_retry(&rf, p, old_route.and_then(|o| o.retry.as_ref()))?),
                    },
                });
            }
            services.push(ServiceRt { name: Arc::from(s.name.as_str()), routes });
        }

        let mut listeners = Vec::with_capacity(cfg.listeners.len());
        for l in &cfg.listeners {
            let f = format!("listeners.{}", l.name);
            let address = l
                .address
                .parse()
                .map_err(|_| format!("{f}.address: {:?} is not an ip:port address", l.address))?;
            if l.max_header_bytes < 8192 {
                return Err(format!("{f}.max_header_bytes: {} is below the minimum of 8192", l.max_header_bytes));
            }
            let mut hosts = HostTable::default();
            let named = |s: &config::Service| s.listeners.iter().any(|n| n == &l.name);
            // An inbound listener some service names is that service's alone: it fronts the
            // local server, and a mesh service (no listeners) matching there would send the
            // request back out into the mesh, often to this very sidecar: a loop.
            let dedicated = l.direction == config::Direction::Inbound && cfg.services.iter().any(named);
            for (si, s) in cfg.services.iter().enumerate() {
                if named(s) || (s.listeners.is_empty() && !dedicated) {
                    for h in &s.hosts {
                        hosts.insert(h, si).map_err(|e| format!("services.{}.{e}", s.name))?;
                    }
                }
            }
            let tls = crate::mtls::ListenerTls::compile(l, cfg.identity.is_some())?;
            listeners.push(ListenerRt { name: Arc::from(l.name.as_str()), address, direction: l.direction, hosts, tls });
        }
        for s in &cfg.services {
            for n in &s.listeners {
                if !cfg.listeners.iter().any(|l| &l.name == n) {
                    return Err(format!("services.{}.listeners: unknown listener {n:?}", s.name));
                }
            }
        }

        let t = &cfg.telemetry;
        if !(0.0..=1.0).contains(&t.access_log.sample) {
            return Err(format!("telemetry.access_log.sample: {} is not in [0, 1]", t.access_log.sample));
        }
        let tenant_header = opt_header("telemetry.tenant_header", &t.tenant_header)?;
        let model_version_header = opt_header("telemetry.model_version_header", &t.model_version_header)?;

        let own_namespace = cfg
            .identity
            .as_ref()
            .and_then(|i| i.spiffe_id.parse::<crate::identity::SpiffeId>().ok())
            .and_then(|id| id.namespace().map(String::from));
        let authz = crate::authz::Authz::compile(&cfg, own_namespace.as_deref())?;
        crate::mtls::check_revocations(&cfg)?;

        Ok(Snapshot {
            authz,
            version: prev.map_or(1, |p| p.version + 1),
            listeners,
            services,
            experiments,
            clusters,
            tenant_header,
            model_version_header,
            config: cfg,
        })
    }

    /// JSON for the admin `/config_dump`.
    pub fn dump(&self) -> serde_json::Value {
        serde_json::json!({ "version": self.version, "config": &self.config })
    }
}

fn compile_retry(rf: &str, p: &config::RetryPolicy, old: Option<&RetryRt>) -> Result<RetryRt, String> {
    if !(1..=10).contains(&p.attempts) {
        return Err(format!("{rf}.retry.attempts: {} is not in 1..=10", p.attempts));
    }
    if !(0.0..=10.0).contains(&p.budget_ratio) {
        return Err(format!("{rf}.retry.budget_ratio: {} is not in [0, 10]", p.budget_ratio));
    }
    if p.backoff_max < p.backoff_base {
        return Err(format!("{rf}.retry.backoff_max: {} is below backoff_base {}", p.backoff_max, p.backoff_base));
    }
    let on = RetryOn::parse(&p.on).map_err(|e| format!("{rf}.{e}"))?;
    let budget = match old {
        Some(o) if o.cfg.budget_ratio == p.budget_ratio && o.cfg.budget_min_per_sec == p.budget_min_per_sec => {
            o.budget.clone()
        }
        _ => Arc::new(Mutex::new(Budget::new(p.budget_ratio, p.budget_min_per_sec))),
    };
    Ok(RetryRt {
        attempts: p.attempts,
        on,
        backoff_base_ms: p.backoff_base.0.as_millis() as u64,
        backoff_max_ms: p.backoff_max.0.as_millis() as u64,
        buffer_bytes: p.buffer_bytes,
        budget,
        cfg: p.clone(),
    })
}

fn compile_experiment(
    e: &config::Experiment,
    old: Option<&ExperimentRt>,
    find_cluster: &dyn Fn(String, &str) -> Result<usize, String>,
    tel: &Telemetry,
) -> Result<ExperimentRt, String> {
    let f = format!("experiments.{}", e.name);
    if e.variants.is_empty() {
        return Err(format!("{f}.variants: at least one variant is required"));
    }
    unique(&format!("{f}.variants"), e.variants.iter().map(|v| v.name.as_str()))?;
    let weights: Vec<(String, u32)> = e.variants.iter().map(|v| (v.name.clone(), v.weight)).collect();
    let strata: HashMap<String, HashMap<String, u32>> = e
        .stratify
        .as_ref()
        .map(|s| s.weights.iter().map(|(k, v)| (k.clone(), v.clone().into_iter().collect())).collect())
        .unwrap_or_default();
    let assigner = Assigner::new(&weights, &e.salt, &strata).map_err(|err| format!("{f}.{err}"))?;
    let mut variants = Vec::with_capacity(e.variants.len());
    for v in &e.variants {
        let cluster = find_cluster(format!("{f}.variants.{}.cluster", v.name), &v.cluster)?;
        let limits = (v.max_concurrency, v.max_pending);
        let before = old.and_then(|o| o.variants.iter().find(|x| &*x.name == v.name.as_str()));
        let kept = before.filter(|x| x.limits == limits).map(|x| x.limiter.clone());
        let header = http::HeaderValue::from_str(&v.name)
            .map_err(|_| format!("{f}.variants: {:?} cannot be sent as a header value", v.name))?;
        variants.push(VariantRt {
            header,
            name: Arc::from(v.name.as_str()),
            cluster,
            model_version: Arc::from(v.model_version.as_str()),
            limiter: kept.unwrap_or_else(|| {
                let labels = crate::series::label_pairs(&[("experiment", &e.name), ("variant", &v.name)]);
                let stats = before.map(|x| x.limiter.stats().clone()).unwrap_or_default();
                let l = Arc::new(Limiter::new(v.max_concurrency, v.max_pending, labels, stats));
                tel.track(Arc::downgrade(&(l.clone() as Arc<dyn crate::series::Live>)));
                l
            }),
            limits,
        });
    }
    let shadow = match &e.shadow {
        None => None,
        Some(s) => {
            if !(0.0..=1.0).contains(&s.fraction) {
                return Err(format!("{f}.shadow.fraction: {} is not in [0, 1]", s.fraction));
            }
            if s.timeout.is_zero() {
                return Err(format!("{f}.shadow.timeout: must be above 0"));
            }
            Some(ShadowRt {
                cluster: find_cluster(format!("{f}.shadow.cluster"), &s.cluster)?,
                variant: Arc::from(s.variant.as_str()),
                fraction: s.fraction,
                max_body_bytes: s.max_body_bytes,
                timeout: s.timeout.0,
            })
        }
    };
    Ok(ExperimentRt {
        name: Arc::from(e.name.as_str()),
        assigner,
        variants,
        unit_header: match &e.unit_header {
            Some(h) => Some(header(&format!("{f}.unit_header"), h)?),
            None => None,
        },
        override_header: if e.allow_override {
            opt_header(&format!("{f}.override_header"), &e.override_header)?
        } else {
            None
        },
        stratify_header: match &e.stratify {
            Some(s) => Some(header(&format!("{f}.stratify.header"), &s.header)?),
            None => None,
        },
        shadow,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> Result<Snapshot, String> {
        let tel = Telemetry::new(&config::Node::default());
        Snapshot::compile(Config::from_yaml(yaml)?, None, 1, &tel, &crate::mtls::TlsContext::none())
    }

    const OK: &str = r#"
listeners: [{name: out, address: "127.0.0.1:0"}]
services:
  - name: s
    hosts: [s]
    routes:
      - {name: r, match: {path_prefix: /}, experiment: e}
experiments:
  - name: e
    variants: [{name: a, cluster: c, weight: 1}]
clusters: [{name: c, endpoints: ["127.0.0.1:1"]}]
"#;

    #[test]
    fn example_file_compiles() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/proxy.yaml")).unwrap();
        compile(&text).unwrap();
    }

    /// The routing loop a node agent's sidecar hit: a mesh service pushed without listeners
    /// matched `Host: chat` on the inbound listener too and sent the request back out.
    #[test]
    fn an_inbound_listener_a_service_names_serves_only_that_service() {
        let yaml = r#"
listeners:
  - {name: out, address: "127.0.0.1:0"}
  - {name: in, address: "127.0.0.1:0", direction: inbound}
  - {name: open, address: "127.0.0.1:0", direction: inbound}
services:
  - {name: local, listeners: [in], hosts: ["*"], routes: [{name: r, cluster: c}]}
  - {name: chat, hosts: [chat], routes: [{name: r, cluster: c}]}
clusters: [{name: c, endpoints: ["127.0.0.1:1"]}]
"#;
        let s = compile(yaml).unwrap();
        let service = |l: usize, host: &str| s.listeners[l].hosts.lookup(host).map(|i| s.services[i].name.to_string());
        assert_eq!(service(0, "chat").as_deref(), Some("chat"));
        assert_eq!(service(1, "chat").as_deref(), Some("local"), "the fronting listener keeps to its server");
        assert_eq!(service(2, "chat").as_deref(), Some("chat"), "an inbound listener no service names serves them all");
    }

    #[test]
    fn minimal_config_compiles_with_defaults() {
        let s = compile(OK).unwrap();
        assert_eq!(s.version, 1);
        assert_eq!(s.services[0].routes[0].timeout, Some(DEFAULT_TIMEOUT));
        assert_eq!(s.services[0].routes[0].idle_timeout, Some(DEFAULT_IDLE_TIMEOUT));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (OK.replace("cluster: c, weight", "cluster: nope, weight"), "experiments.e.variants.a.cluster: unknown cluster \"nope\""),
            (OK.replace("experiment: e}", "experiment: x}"), "services.s.routes.r.experiment: unknown experiment \"x\""),
            (OK.replace("\"127.0.0.1:1\"", "\"nohost\""), "clusters.c.endpoints"),
            (OK.replace("weight: 1", "weight: 0"), "experiments.e.variants: weights sum to 0"),
            (OK.replace("address: \"127.0.0.1:0\"", "address: here"), "listeners.out.address"),
            (OK.replace("hosts: [s]", "hosts: [s]\n    listeners: [nope]"), "unknown listener \"nope\""),
            (OK.replace("routes:\n", "routes:\n      - {name: r, match: {}, cluster: c}\n"), "name \"r\" is used twice"),
            (OK.replace("{path_prefix: /}", "{path_prefix: /, typo: 1}"), "unknown field `typo`"),
            (format!("admin: {{metrics_address: \"all:9090\"}}\n{OK}"), "admin.metrics_address: \"all:9090\" is not an ip:port"),
        ];
        for (yaml, want) in cases {
            let err = compile(&yaml).err().unwrap_or_else(|| panic!("accepted: {yaml}"));
            assert!(err.contains(want), "error {err:?} does not contain {want:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_yaml_never_panics(s in ".{0,400}") {
            let _ = compile(&s);
        }

        #[test]
        fn mutated_config_never_panics(pos in 0usize..400, byte in proptest::num::u8::ANY) {
            let mut b = OK.as_bytes().to_vec();
            let p = pos % b.len();
            b[p] = byte;
            if let Ok(s) = String::from_utf8(b) {
                let _ = compile(&s);
            }
        }
    }
}

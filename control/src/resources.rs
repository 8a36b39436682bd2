//! The kinds of config resource the control plane stores, how a spec is validated, and how
//! the stored state becomes the xDS resources pushed to sidecars. Pure: no IO.
//!
//! A spec is written in weft-proxy's own YAML vocabulary (a `services[]`, `experiments[]` or
//! `clusters[]` item), so a section of a proxy file can be applied as is, and it is checked by
//! the proxy's own compiler (`Snapshot::compile`): what the control plane accepts, a sidecar
//! accepts — except references to resources that do not exist yet, which the API refuses
//! unless the write allows them ([`missing`]), and which a sidecar refuses resource by
//! resource (serving the rest).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use weft_proxy::config::{self, Config};
use weft_proxy::xds::encode;
use weft_xds::resources::{to_any, v1};
use weft_xds::transport::Any;
use weft_xds::{Resources, typeurl};

use crate::envoy;
use crate::store::Resource;

/// A resource kind, named as in the URL (`/v1/services`) and in YAML (`kind: Service`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Clusters,
    Endpoints,
    Experiments,
    Services,
    /// The GPU inventory the scheduler places on (a scheduler `NodeSpec` each).
    Nodes,
    /// Where the scheduler placed each workload; written only by `POST /v1/schedule/apply`
    /// (deleting one releases its capacity).
    Placements,
    /// What each node's agent reports (a `nodes::NodeStatus` each, named after the node):
    /// its GPUs, the replicas it runs for placements, its weight holders. Written by the
    /// agents, which are API clients; not pushed over xDS.
    NodeStatuses,
    /// How to autoscale one variant (an `autoscaler::spec::AutoscalerSpec` each).
    Autoscalers,
    /// The autoscaler's replica targets; written only by the leader's decision loop.
    ScalingDecisions,
    /// A progressive rollout of an experiment's candidate variant (named after the experiment).
    Rollouts,
    /// The rollout engine's state and evidence per rollout; written only by the engine.
    RolloutStates,
    /// A distributed training job: workers, dataset shards, global batch, model layout.
    TrainingJobs,
    /// The shard map computed for each training job; written only by the control plane.
    ShardMaps,
    /// Each training job's complete coordinated checkpoints; written only by the control plane.
    Checkpoints,
    /// Who may call which service (a proxy `authorization[]` item each), pushed to every
    /// sidecar and enforced by inbound ones.
    AuthorizationPolicies,
    /// Revoked identities (a proxy `revocations[]` item each): peers whose certificate for the
    /// identity predates `issued_before` are refused in the handshake.
    Revocations,
}

impl Kind {
    /// In apply order: what others refer to comes first.
    pub const ALL: [Kind; 16] = [
        Kind::Clusters,
        Kind::Endpoints,
        Kind::Experiments,
        Kind::Services,
        Kind::Nodes,
        Kind::Placements,
        Kind::NodeStatuses,
        Kind::Autoscalers,
        Kind::ScalingDecisions,
        Kind::Rollouts,
        Kind::RolloutStates,
        Kind::TrainingJobs,
        Kind::ShardMaps,
        Kind::Checkpoints,
        Kind::AuthorizationPolicies,
        Kind::Revocations,
    ];

    /// Whether specs of this kind are written through the resource API (placements are the
    /// scheduler's output: writing one by hand would bypass its capacity checks).
    pub fn user_writable(self) -> bool {
        self.written_by().is_none()
    }

    /// For kinds only the control plane writes: who writes them, and what DELETE does.
    pub fn written_by(self) -> Option<&'static str> {
        match self {
            Kind::Placements => Some("the scheduler (POST /v1/schedule/apply, or an autoscaler with a placement); DELETE releases one"),
            Kind::ScalingDecisions => {
                Some("the autoscaler's decision loop (write an autoscaler instead); DELETE makes it decide afresh")
            }
            Kind::ShardMaps => Some("the control plane from the training job (write the trainingjob; weftctl training scale)"),
            Kind::Checkpoints => Some("the control plane when every rank of a training job reported a checkpoint at one step"),
            Kind::RolloutStates => Some(
                "the rollout engine (write a rollout; steer it with POST /v1/rollout/NAME/promote|rollback|pause|resume)",
            ),
            _ => None,
        }
    }

    /// The URL segment and store key prefix.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Clusters => "clusters",
            Kind::Endpoints => "endpoints",
            Kind::Experiments => "experiments",
            Kind::Services => "services",
            Kind::Nodes => "nodes",
            Kind::Placements => "placements",
            Kind::NodeStatuses => "nodestatuses",
            Kind::Autoscalers => "autoscalers",
            Kind::ScalingDecisions => "scalingdecisions",
            Kind::Rollouts => "rollouts",
            Kind::RolloutStates => "rolloutstates",
            Kind::TrainingJobs => "trainingjobs",
            Kind::ShardMaps => "shardmaps",
            Kind::Checkpoints => "checkpoints",
            Kind::AuthorizationPolicies => "authorizationpolicies",
            Kind::Revocations => "revocations",
        }
    }

    /// The `kind:` of a YAML document.
    pub fn yaml_kind(self) -> &'static str {
        match self {
            Kind::Clusters => "Cluster",
            Kind::Endpoints => "Endpoints",
            Kind::Experiments => "Experiment",
            Kind::Services => "Service",
            Kind::Nodes => "Node",
            Kind::Placements => "Placement",
            Kind::NodeStatuses => "NodeStatus",
            Kind::Autoscalers => "Autoscaler",
            Kind::ScalingDecisions => "ScalingDecision",
            Kind::Rollouts => "Rollout",
            Kind::RolloutStates => "RolloutState",
            Kind::TrainingJobs => "TrainingJob",
            Kind::ShardMaps => "ShardMap",
            Kind::Checkpoints => "Checkpoint",
            Kind::AuthorizationPolicies => "AuthorizationPolicy",
            Kind::Revocations => "Revocation",
        }
    }

    /// The spec field that holds the resource's name (it must equal the name in the URL): a
    /// node status names its node.
    pub fn name_field(self) -> &'static str {
        match self {
            Kind::NodeStatuses => "node",
            _ => "name",
        }
    }

    /// Accepts the URL segment, the YAML kind, or the singular (`service`), any case.
    pub fn parse(s: &str) -> Option<Kind> {
        let l = s.to_ascii_lowercase();
        Kind::ALL.into_iter().find(|k| {
            let seg = k.as_str();
            l == seg || l == k.yaml_kind().to_ascii_lowercase() || Some(l.as_str()) == seg.strip_suffix('s')
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Extra endpoints of the cluster of the same name, beyond those in the cluster spec and those
/// sidecars register.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointsSpec {
    pub name: String,
    pub endpoints: Vec<EndpointSpec>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointSpec {
    /// `host:port`.
    pub address: String,
    /// The experiment variant served there (labels telemetry; empty = none).
    pub variant: String,
    pub labels: BTreeMap<String, String>,
}

/// A spec the control plane refused, naming the field (a path relative to the spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() { f.write_str(&self.message) } else { write!(f, "{}: {}", self.field, self.message) }
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), message: message.into() }
}

/// A spec that passed validation: its normalized JSON (every default filled in, the name set)
/// and the resources it refers to.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid {
    pub json: String,
    /// (kind, name, field that refers to it).
    pub refs: Vec<(Kind, String, String)>,
}

/// Names must be usable as URL segments, store keys and label values.
pub fn check_name(name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(err(
            "name",
            format!("{name:?} is not a valid name (1-253 characters of a-z, A-Z, 0-9, '-', '_', '.')"),
        ))
    }
}

/// Deserializes with the failing field's path in the error.
fn parse<T: serde::de::DeserializeOwned>(spec: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        err(if path == "." { String::new() } else { path }, e.inner().to_string())
    })
}

/// The proxy's compiler run on `cfg`; its errors (`services.NAME.routes.r.cluster: ...`) are
/// made relative to the spec being validated (`routes.r.cluster`).
fn compile(cfg: Config, prefix: &str) -> Result<(), FieldError> {
    let result = with_scratch_telemetry(|tel| weft_proxy::Snapshot::compile(cfg, None, 1, tel, &weft_proxy::mtls::TlsContext::none()).map(|_| ()));
    result.map_err(|e| {
        let (field, message) = e.split_once(": ").unwrap_or(("", e.as_str()));
        let field = field.strip_prefix(prefix).map(|f| f.trim_start_matches('.')).unwrap_or(field);
        err(field, message)
    })
}

/// Runs `f` with a metrics registry nobody reads. The proxy's compiler registers each
/// cluster's and variant's metrics as it builds them; a fresh Prometheus recorder per
/// validation cost about as much as the rest of it (its registry probes the CPU count through
/// cgroup files), so each thread keeps one and replaces it every `REUSES` validations, which
/// bounds the series that validated-but-discarded names leave behind.
fn with_scratch_telemetry<R>(f: impl FnOnce(&weft_proxy::telemetry::Telemetry) -> R) -> R {
    use std::cell::RefCell;
    use weft_proxy::telemetry::Telemetry;
    const REUSES: u32 = 256;
    thread_local! {
        static SCRATCH: RefCell<Option<(Telemetry, u32)>> = const { RefCell::new(None) };
    }
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(_, uses)| *uses >= REUSES) {
            *slot = Some((Telemetry::new(&config::Node::default()), 0));
        }
        let (tel, uses) = slot.as_mut().expect("set above");
        *uses += 1;
        f(tel)
    })
}

/// A config holding just enough around the resource under test: one listener, plus stand-ins
/// for every cluster and experiment it refers to (whether they exist is checked separately).
fn harness(refs: &[(Kind, String, String)]) -> Config {
    let mut cfg = Config::default();
    cfg.listeners.push(config::Listener { name: "validate".into(), address: "127.0.0.1:0".into(), ..Default::default() });
    let stub_cluster = |name: &str| config::Cluster { name: name.into(), ..Default::default() };
    cfg.clusters.push(stub_cluster("weft-validate-stub"));
    for (kind, name, _) in refs {
        match kind {
            Kind::Clusters if !cfg.clusters.iter().any(|c| &c.name == name) => cfg.clusters.push(stub_cluster(name)),
            Kind::Experiments if !cfg.experiments.iter().any(|e| &e.name == name) => {
                cfg.experiments.push(config::Experiment {
                    name: name.clone(),
                    variants: vec![config::Variant {
                        name: "stub".into(),
                        cluster: "weft-validate-stub".into(),
                        weight: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            }
            _ => {}
        }
    }
    cfg
}

/// `host:port` with a numeric port; the host is resolved by each sidecar, not here.
pub fn check_address(field: &str, addr: &str) -> Result<(), FieldError> {
    let ok = addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok { Ok(()) } else { Err(err(field, format!("{addr:?} is not a host:port address"))) }
}

/// Fills in or checks the spec's name field (`field`: `name`, or what the kind calls it)
/// against the name in the path.
fn named(spec: &Value, field: &str, name: &str) -> Result<Value, FieldError> {
    let mut spec = spec.clone();
    let Some(obj) = spec.as_object_mut() else {
        return Err(err("", "the spec must be a JSON object"));
    };
    match obj.get(field) {
        None | Some(Value::Null) => {}
        Some(Value::String(n)) if n == name || n.is_empty() => {}
        Some(other) => return Err(err(field, format!("{other} does not match the name in the path ({name:?})"))),
    }
    obj.insert(field.into(), Value::String(name.into()));
    Ok(spec)
}

fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("config types serialize")
}

/// Validates `spec` as a `kind` named `name`.
pub fn validate(kind: Kind, name: &str, spec: &Value) -> Result<Valid, FieldError> {
    check_name(name)?;
    let spec = named(spec, kind.name_field(), name)?;
    match kind {
        Kind::Clusters => {
            let c: config::Cluster = parse(&spec)?;
            for (i, ep) in c.endpoints.iter().enumerate() {
                check_address(&format!("endpoints[{i}]"), ep)?;
            }
            let mut cfg = harness(&[]);
            cfg.clusters.push(config::Cluster { endpoints: vec![], ..c.clone() });
            compile(cfg, &format!("clusters.{name}"))?;
            Ok(Valid { json: to_json(&c), refs: vec![] })
        }
        Kind::Endpoints => {
            let e: EndpointsSpec = parse(&spec)?;
            for (i, ep) in e.endpoints.iter().enumerate() {
                check_address(&format!("endpoints[{i}].address"), &ep.address)?;
            }
            Ok(Valid { json: to_json(&e), refs: vec![(Kind::Clusters, name.into(), "name".into())] })
        }
        Kind::Experiments => {
            let e: config::Experiment = parse(&spec)?;
            let mut refs: Vec<_> = e
                .variants
                .iter()
                .enumerate()
                .map(|(i, v)| (Kind::Clusters, v.cluster.clone(), format!("variants[{i}].cluster")))
                .collect();
            if let Some(s) = &e.shadow {
                refs.push((Kind::Clusters, s.cluster.clone(), "shadow.cluster".into()));
            }
            refs.retain(|(_, n, _)| !n.is_empty());
            let mut cfg = harness(&refs);
            cfg.experiments.push(e.clone());
            compile(cfg, &format!("experiments.{name}"))?;
            Ok(Valid { json: to_json(&e), refs })
        }
        Kind::Services => {
            let s: config::Service = parse(&spec)?;
            if !s.listeners.is_empty() {
                // Listener names are per sidecar (bootstrap); they cannot be checked here.
            }
            let mut refs = Vec::new();
            for r in &s.routes {
                if let Some(c) = &r.cluster {
                    refs.push((Kind::Clusters, c.clone(), format!("routes.{}.cluster", r.name)));
                }
                if let Some(e) = &r.experiment {
                    refs.push((Kind::Experiments, e.clone(), format!("routes.{}.experiment", r.name)));
                }
            }
            let mut cfg = harness(&refs);
            cfg.services.push(config::Service { listeners: vec![], ..s.clone() });
            compile(cfg, &format!("services.{name}"))?;
            Ok(Valid { json: to_json(&s), refs })
        }
        Kind::Nodes => {
            let n: crate::scheduler::inventory::NodeSpec = parse(&spec)?;
            crate::scheduler::inventory::Cluster::new(vec![n.clone()])
                .map_err(|e| err("", format!("not a usable node: {e:?}")))?;
            Ok(Valid { json: to_json(&n), refs: vec![] })
        }
        Kind::NodeStatuses => {
            let s: crate::nodes::NodeStatus = parse(&spec)?;
            s.validate()?;
            Ok(Valid { json: to_json(&s), refs: vec![] })
        }
        Kind::Autoscalers => {
            let a: crate::autoscaler::spec::AutoscalerSpec = parse(&spec)?;
            a.validate().map_err(|(field, message)| err(field, message))?;
            Ok(Valid { json: to_json(&a), refs: vec![] })
        }
        Kind::Rollouts => {
            let r: crate::experiments::rollout::RolloutSpec = parse(&spec)?;
            r.validate().map_err(|(field, message)| err(field, message))?;
            Ok(Valid { json: to_json(&r), refs: vec![(Kind::Experiments, name.into(), "name".into())] })
        }
        Kind::TrainingJobs => {
            let j: crate::shards::job::JobSpec = parse(&spec)?;
            j.validate().map_err(|(field, message)| err(field, message))?;
            Ok(Valid { json: to_json(&j), refs: vec![] })
        }
        Kind::AuthorizationPolicies => {
            let p: config::AuthorizationPolicy = parse(&spec)?;
            if !p.namespace.is_empty() {
                weft_proxy::identity::SpiffeId::workload("td", &p.namespace, "x").map_err(|e| err("namespace", e.0))?;
            }
            // The services it names are per sidecar (some live only in an inbound sidecar's
            // bootstrap), so they are not references to check here.
            let mut cfg = harness(&[]);
            cfg.authorization.push(p.clone());
            compile(cfg, &format!("authorization.{name}"))?;
            Ok(Valid { json: to_json(&p), refs: vec![] })
        }
        Kind::Revocations => {
            let r: config::Revocation = parse(&spec)?;
            let mut cfg = harness(&[]);
            cfg.revocations.push(r.clone());
            compile(cfg, &format!("revocations.{name}"))?;
            Ok(Valid { json: to_json(&r), refs: vec![] })
        }
        Kind::Placements | Kind::ScalingDecisions | Kind::RolloutStates | Kind::ShardMaps | Kind::Checkpoints => {
            Err(err("", format!("{kind} are written by {}", kind.written_by().unwrap_or("the control plane"))))
        }
    }
}

/// A reference to a resource that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The field of the referring spec (`routes.all.cluster`).
    pub field: String,
    pub kind: Kind,
    pub name: String,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {:?} does not exist", self.field, self.kind.yaml_kind(), self.name)
    }
}

impl Missing {
    /// The warning for an allowed one (`weftctl apply` matches its `Kind "name" does not exist`).
    pub fn warning(&self) -> String {
        format!("{self} (yet); sidecars will not serve this until it does")
    }
}

/// The references among `refs` to resources `exists` does not know.
pub fn missing(refs: &[(Kind, String, String)], exists: impl Fn(Kind, &str) -> bool) -> Vec<Missing> {
    refs.iter()
        .filter(|(k, n, _)| !exists(*k, n))
        .map(|(kind, name, field)| Missing { field: field.clone(), kind: *kind, name: name.clone() })
        .collect()
}

/// An endpoint a sidecar registered for the model server it fronts, with the fault
/// detector's verdict. Stored under kind `registrations`, keyed by the sidecar's node id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Registration {
    pub cluster: String,
    pub address: String,
    pub variant: String,
    pub labels: BTreeMap<String, String>,
    pub healthy: bool,
    /// The control node watching its heartbeats.
    pub control_node: u64,
}

/// Store key prefix of sidecar registrations (not a user-writable kind).
pub const REGISTRATIONS: &str = "registrations";

/// One stored resource converted for xDS: its weft.v1 body, and/or the endpoints it
/// contributes to a cluster.
#[derive(Debug, Clone, Default)]
struct Converted {
    revision: u64,
    body: Option<(&'static str, String, Any)>,
    endpoints: Option<(String, Vec<v1::Endpoint>)>,
    /// The same resource for Envoy clients, when it maps onto one resource of its own
    /// (a cluster); services and experiments are kept parsed for the route configuration.
    envoy: Option<(&'static str, String, Any)>,
    routing: Option<Routing>,
}

/// A service or experiment as parsed, for the Envoy route configuration they make together.
#[derive(Debug, Clone)]
enum Routing {
    Service(config::Service),
    Experiment(config::Experiment),
}

fn endpoint(address: &str, variant: &str, labels: &BTreeMap<String, String>) -> v1::Endpoint {
    v1::Endpoint {
        address: address.into(),
        variant: variant.into(),
        node_id: String::new(),
        healthy: true,
        labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// Converts one stored resource (a value that no longer parses is left out).
fn convert(r: &Resource) -> Converted {
    let mut c = Converted { revision: r.revision, ..Default::default() };
    match r.kind.as_str() {
        "clusters" => {
            if let Ok(cl) = serde_json::from_str::<config::Cluster>(&r.value_json) {
                let eps = cl.endpoints.iter().map(|a| endpoint(a, "", &BTreeMap::new())).collect();
                c.endpoints = Some((cl.name.clone(), eps));
                c.body = Some((typeurl::CLUSTER, cl.name.clone(), to_any(&encode::cluster(&cl))));
                c.envoy = Some((typeurl::envoy::CLUSTER, cl.name.clone(), envoy::cluster(&cl)));
            }
        }
        "endpoints" => {
            if let Ok(e) = serde_json::from_str::<EndpointsSpec>(&r.value_json) {
                let eps = e.endpoints.iter().map(|ep| endpoint(&ep.address, &ep.variant, &ep.labels)).collect();
                c.endpoints = Some((r.name.clone(), eps));
            }
        }
        REGISTRATIONS => {
            if let Ok(reg) = serde_json::from_str::<Registration>(&r.value_json) {
                let ep = v1::Endpoint {
                    node_id: r.name.clone(),
                    healthy: reg.healthy,
                    ..endpoint(&reg.address, &reg.variant, &reg.labels)
                };
                c.endpoints = Some((reg.cluster.clone(), vec![ep]));
            }
        }
        "experiments" => {
            if let Ok(e) = serde_json::from_str::<config::Experiment>(&r.value_json) {
                c.body = Some((typeurl::EXPERIMENT, e.name.clone(), to_any(&encode::experiment(&e))));
                c.routing = Some(Routing::Experiment(e));
            }
        }
        "services" => {
            if let Ok(sv) = serde_json::from_str::<config::Service>(&r.value_json) {
                c.body = Some((typeurl::SERVICE, sv.name.clone(), to_any(&encode::service(&sv))));
                c.routing = Some(Routing::Service(sv));
            }
        }
        "authorizationpolicies" => {
            if let Ok(p) = serde_json::from_str::<config::AuthorizationPolicy>(&r.value_json) {
                c.body = Some((typeurl::AUTHORIZATION_POLICY, p.name.clone(), to_any(&encode::authorization_policy(&p))));
            }
        }
        "revocations" => {
            if let Ok(rv) = serde_json::from_str::<config::Revocation>(&r.value_json) {
                c.body = Some((typeurl::REVOCATION, rv.name.clone(), to_any(&encode::revocation(&rv))));
            }
        }
        "shardmaps" => {
            if let Ok(m) = serde_json::from_str::<crate::shards::job::ShardMapRecord>(&r.value_json) {
                c.body = Some((typeurl::SHARD_MAP, r.name.clone(), to_any(&m.to_xds(&r.name))));
            }
        }
        "scalingdecisions" => {
            if let Ok(d) = serde_json::from_str::<crate::autoscaler::spec::DecisionRecord>(&r.value_json) {
                c.body = Some((typeurl::SCALING_DECISION, r.name.clone(), to_any(&d.to_xds(&r.name))));
            }
        }
        "placements" => {
            if let Ok(p) = serde_json::from_str::<crate::placements::PlacementRecord>(&r.value_json) {
                c.body = Some((typeurl::PLACEMENT, r.name.clone(), to_any(&crate::placements::to_xds(&r.name, &p))));
            }
        }
        _ => {}
    }
    c
}

/// Builds everything the xDS server pushes from the stored state, remembering each resource's
/// conversion by revision so a rebuild after one write converts one resource, not all.
///
/// Each resource is versioned by the revision that last wrote it; a cluster's `Endpoints` by
/// the newest of its sources (the cluster's own list, an `endpoints` resource, sidecar
/// registrations), so every control node labels the same state the same way. The cache keeps
/// an entry's old version while its body is unchanged, so editing a cluster's load-balancing
/// settings does not push its (unchanged) endpoints to every sidecar again.
///
/// Alongside weft's own resources it builds the Envoy v3 ones ([`envoy`]); the one route
/// configuration is rebuilt only when a service or experiment changed.
pub struct XdsBuilder {
    memo: std::collections::HashMap<(String, String), Converted>,
    envoy_listener: Any,
    /// The Envoy route configuration of the services and experiments last seen.
    envoy_routes: Option<Any>,
}

impl Default for XdsBuilder {
    fn default() -> Self {
        XdsBuilder::new(envoy::DEFAULT_LISTENER_ADDRESS.parse().expect("a socket address"))
    }
}

impl XdsBuilder {
    /// A builder whose Envoy listener binds `envoy_listener`.
    pub fn new(envoy_listener: std::net::SocketAddr) -> Self {
        XdsBuilder { memo: Default::default(), envoy_listener: envoy::listener(envoy_listener), envoy_routes: None }
    }

    /// `resources` must come in `(kind, name)` order (as the store and the publisher's mirror
    /// keep them), which fixes the order of merged endpoints.
    pub fn build<'a>(&mut self, resources: impl IntoIterator<Item = &'a Resource>) -> Resources {
        let mut out = Resources::new();
        let mut endpoints: BTreeMap<String, (u64, Vec<v1::Endpoint>)> = BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        let mut routing = Vec::new();
        let mut routes_changed = self.envoy_routes.is_none();
        for r in resources {
            let key = (r.kind.clone(), r.name.clone());
            let c = match self.memo.get(&key) {
                Some(c) if c.revision == r.revision => c,
                _ => {
                    let c = convert(r);
                    routes_changed |= c.routing.is_some() || self.memo.get(&key).is_some_and(|old| old.routing.is_some());
                    self.memo.insert(key.clone(), c);
                    &self.memo[&key]
                }
            };
            for (url, name, any) in c.body.iter().chain(&c.envoy) {
                out.insert_versioned(url, name, c.revision, any.clone());
            }
            if let Some((cluster, eps)) = &c.endpoints {
                let slot = endpoints.entry(cluster.clone()).or_default();
                slot.0 = slot.0.max(c.revision);
                slot.1.extend(eps.iter().cloned());
            }
            if c.routing.is_some() {
                routing.push(key.clone());
            }
            seen.insert(key);
        }
        self.memo.retain(|k, c| {
            let keep = seen.contains(k);
            routes_changed |= !keep && c.routing.is_some();
            keep
        });
        for (cluster, (revision, eps)) in endpoints {
            let mut addrs = BTreeSet::new();
            let eps: Vec<_> = eps.into_iter().filter(|e| addrs.insert(e.address.clone())).collect();
            out.insert_versioned(typeurl::envoy::CLUSTER_LOAD_ASSIGNMENT, &cluster, revision, envoy::load_assignment(&cluster, &eps));
            let res = v1::Endpoints { cluster_name: cluster.clone(), endpoints: eps };
            out.insert_versioned(typeurl::ENDPOINTS, &cluster, revision, to_any(&res));
        }
        if routes_changed {
            self.envoy_routes = Some(self.envoy_route_configuration(&routing));
        }
        if let Some(routes) = &self.envoy_routes {
            out.insert(typeurl::envoy::ROUTE_CONFIGURATION, envoy::ROUTE_CONFIG, routes.clone());
        }
        out.insert(typeurl::envoy::LISTENER, envoy::LISTENER, self.envoy_listener.clone());
        out
    }

    /// The services and experiments among `keys` (in store order) as Envoy's routes.
    fn envoy_route_configuration(&self, keys: &[(String, String)]) -> Any {
        let mut services = Vec::new();
        let mut experiments = BTreeMap::new();
        for key in keys {
            match &self.memo[key].routing {
                Some(Routing::Service(s)) => services.push(s),
                Some(Routing::Experiment(e)) => {
                    experiments.insert(e.name.as_str(), e);
                }
                None => {}
            }
        }
        envoy::route_configuration(services, &experiments)
    }
}

/// [`XdsBuilder::build`] without memory, from resources grouped by kind.
pub fn xds_resources(state: &BTreeMap<String, Vec<Resource>>) -> Resources {
    XdsBuilder::default().build(state.values().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_parse_in_every_spelling() {
        for s in ["services", "Service", "service", "SERVICES"] {
            assert_eq!(Kind::parse(s), Some(Kind::Services), "{s}");
        }
        assert_eq!(Kind::parse("Endpoints"), Some(Kind::Endpoints));
        assert_eq!(Kind::parse("endpoint"), Some(Kind::Endpoints));
        assert_eq!(Kind::parse("pods"), None);
    }

    #[test]
    fn a_valid_service_is_normalized_and_its_references_listed() {
        let v = validate(
            Kind::Services,
            "chat",
            &json!({"hosts": ["chat"], "routes": [{"name": "r", "experiment": "ab"}, {"name": "s", "cluster": "c"}]}),
        )
        .unwrap();
        let back: config::Service = serde_json::from_str(&v.json).unwrap();
        assert_eq!(back.name, "chat", "name filled in from the path");
        assert_eq!(
            v.refs,
            vec![
                (Kind::Experiments, "ab".into(), "routes.r.experiment".into()),
                (Kind::Clusters, "c".into(), "routes.s.cluster".into())
            ]
        );
        let gone = missing(&v.refs, |k, n| k == Kind::Clusters && n == "c");
        assert_eq!(gone, vec![Missing { field: "routes.r.experiment".into(), kind: Kind::Experiments, name: "ab".into() }]);
        assert!(gone[0].warning().starts_with("routes.r.experiment: Experiment \"ab\" does not exist"), "{gone:?}");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (Kind::Services, json!({"hosts": ["a"], "routes": [{"name": "r", "cluster": "c", "match": {"path_prefix": 5}}]}), "routes[0].match.path_prefix"),
            (Kind::Services, json!({"hosts": ["a"], "routes": [{"name": "r", "cluster": "c", "bogus": 1}]}), "routes[0].bogus"),
            (Kind::Services, json!({"hosts": [], "routes": [{"name": "r", "cluster": "c"}]}), "hosts"),
            (Kind::Services, json!({"hosts": ["a"], "routes": [{"name": "r"}]}), "routes.r"),
            (Kind::Clusters, json!({"connect_timeout": "soon"}), "connect_timeout"),
            (Kind::Clusters, json!({"endpoints": ["nowhere"]}), "endpoints[0]"),
            (Kind::Experiments, json!({"variants": []}), "variants"),
            (Kind::Endpoints, json!({"endpoints": [{"address": "h:0"}]}), "endpoints[0].address"),
            (Kind::Services, json!({"name": "other"}), "name"),
            (Kind::Services, json!([1, 2]), ""),
            (Kind::Clusters, json!({"tls": {"identities": ["https://x"]}}), "tls.identities"),
            (Kind::AuthorizationPolicies, json!({"rules": [{"identities": ["web"]}]}), "rules[0].identities"),
            (Kind::AuthorizationPolicies, json!({"namespace": "a b"}), "namespace"),
            (Kind::NodeStatuses, json!({"node": "other", "reported_at_ms": 1, "inventory_source": "nvml"}), "node"),
            (Kind::NodeStatuses, json!({"reported_at_ms": 1, "inventory_source": "nvml", "name": "x"}), "name"),
            (
                Kind::NodeStatuses,
                json!({"reported_at_ms": 1, "inventory_source": "nvml", "replicas": [
                    {"placement": "p", "variant": "a", "base_model": "m", "state": "ready"},
                    {"placement": "q", "variant": "a", "base_model": "m", "state": "running"}]}),
                "replicas[1].state",
            ),
            (
                Kind::Autoscalers,
                json!({"variant": "a", "capacity_rps": 1.0, "placement": {"base_model": "m", "base_bytes": 1, "compute_milli": 10,
                    "launch": {"cluster": "c", "base_path": "/b", "health_path": "h"}}}),
                "placement.launch.health_path",
            ),
        ];
        for (kind, spec, field) in cases {
            let e = validate(kind, "x", &spec).expect_err(&spec.to_string());
            assert_eq!(e.field, field, "{spec}: {e}");
            assert!(!e.message.is_empty());
        }
        assert_eq!(validate(Kind::Clusters, "a/b", &json!({})).unwrap_err().field, "name");
    }

    #[test]
    fn a_node_status_is_named_after_its_node_and_never_pushed() {
        let v = validate(Kind::NodeStatuses, "gpu-1", &crate::nodes::tests::report()).unwrap();
        let mut report = crate::nodes::tests::report();
        report.as_object_mut().unwrap().remove("node");
        let filled = validate(Kind::NodeStatuses, "gpu-1", &report).unwrap();
        assert_eq!(filled, v, "the node's name comes from the path when absent");
        let r = Resource { kind: "nodestatuses".into(), name: "gpu-1".into(), value_json: v.json, revision: 3 };
        let built = XdsBuilder::default().build([&r]);
        let without = XdsBuilder::default().build([]);
        assert_eq!(format!("{built:?}"), format!("{without:?}"), "agents' reports are not xDS resources");
    }

    #[test]
    fn tls_files_are_the_sidecars_not_looked_for_on_the_control_node() {
        let spec = json!({"tls": {"mode": "simple", "sni": "api.example", "ca_file": "/etc/only-on-the-sidecar/ca.pem"}});
        validate(Kind::Clusters, "ext", &spec).expect("a sidecar's ca_file is not read here");
        let policy = json!({"services": ["chat"], "rules": [{"identities": ["spiffe://weft.local/ns/apps/*"], "methods": ["POST"]}]});
        validate(Kind::AuthorizationPolicies, "p", &policy).expect("a valid policy");
    }

    #[test]
    fn stored_state_becomes_versioned_xds_resources() {
        let res = |kind: &str, name: &str, rev: u64, v: Value| Resource {
            kind: kind.into(),
            name: name.into(),
            value_json: v.to_string(),
            revision: rev,
        };
        let mut state = BTreeMap::new();
        state.insert("clusters".into(), vec![res("clusters", "c", 3, json!({"name": "c", "endpoints": ["10.0.0.1:80"]}))]);
        state.insert(
            "endpoints".into(),
            vec![res("endpoints", "c", 5, json!({"name": "c", "endpoints": [{"address": "10.0.0.2:80", "variant": "b"}]}))],
        );
        state.insert(
            REGISTRATIONS.into(),
            vec![res(REGISTRATIONS, "side-1", 9, json!({"cluster": "c", "address": "10.0.0.3:80", "healthy": false}))],
        );
        let snap = weft_xds::Snapshot::default().next(10, xds_resources(&state)).unwrap();
        assert_eq!(snap.entries(typeurl::CLUSTER).unwrap()["c"].version, 3);
        let e = &snap.entries(typeurl::ENDPOINTS).unwrap()["c"];
        assert_eq!(e.version, 9, "endpoints take the newest of their sources");
        let eps: v1::Endpoints = weft_xds::resources::from_any(&e.body).unwrap();
        let summary: Vec<_> = eps.endpoints.iter().map(|e| (e.address.as_str(), e.healthy, e.node_id.as_str())).collect();
        assert_eq!(summary, vec![("10.0.0.1:80", true, ""), ("10.0.0.2:80", true, ""), ("10.0.0.3:80", false, "side-1")]);
    }

    #[test]
    fn editing_a_cluster_does_not_re_version_endpoints_it_did_not_change() {
        let res = |kind: &str, name: &str, rev: u64, v: Value| Resource {
            kind: kind.into(),
            name: name.into(),
            value_json: v.to_string(),
            revision: rev,
        };
        let reg = res(REGISTRATIONS, "side-1", 2, json!({"cluster": "c", "address": "10.0.0.3:80", "healthy": true}));
        let cluster = |rev, lb: &str| res("clusters", "c", rev, json!({"name": "c", "lb": lb}));
        let mut builder = XdsBuilder::default();
        let s1 = weft_xds::Snapshot::default().next(3, builder.build([&cluster(3, "round_robin"), &reg])).unwrap();
        let s2 = s1.next(4, builder.build([&cluster(4, "p2c_ewma"), &reg])).unwrap();
        assert_eq!(s2.entries(typeurl::CLUSTER).unwrap()["c"].version, 4);
        assert_eq!(s2.entries(typeurl::ENDPOINTS).unwrap()["c"].version, 3, "endpoints unchanged, not pushed again");
        assert_eq!(s2.type_version(typeurl::ENDPOINTS), 3);
    }

    #[test]
    fn committed_placements_become_xds_placements() {
        let record = json!({
            "workload": {"kind": "replica", "name": "r-0", "variant": "a", "base_model": "m", "base_bytes": 10,
                "delta_bytes": 1, "working_set_bytes": 1, "compute_milli": 500, "cpu_milli": 1, "memory_mib": 1, "priority": 2},
            "allocations": [{"node": "gpu-1", "cpu_milli": 1, "memory_mib": 1,
                "gpus": [{"gpu": 1, "milli": 500, "memory_bytes": 2}], "shared_base": {"base": "m", "bytes": 10}}]
        });
        let mut state = BTreeMap::new();
        let r = Resource { kind: "placements".into(), name: "r-0".into(), value_json: record.to_string(), revision: 7 };
        state.insert("placements".into(), vec![r]);
        let snap = weft_xds::Snapshot::default().next(8, xds_resources(&state)).unwrap();
        let e = &snap.entries(typeurl::PLACEMENT).unwrap()["r-0"];
        assert_eq!(e.version, 7);
        let p: v1::Placement = weft_xds::resources::from_any(&e.body).unwrap();
        assert_eq!((p.kind.as_str(), p.variant.as_str(), p.priority), ("replica", "a", 2));
        let a = &p.assignments[0];
        assert_eq!((a.node.as_str(), a.gpus[0].index, a.gpus[0].milli, a.shared_base.as_str()), ("gpu-1", 1, 500, "m"));
    }
}

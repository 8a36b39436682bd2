//! The containers the injector adds: weft-proxy as a native sidecar (an init container with
//! `restartPolicy: Always`, so the kubelet starts it before the model server and stops it
//! after), its bootstrap, and the optional iptables redirect step. Pure: no IO.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
    Probe, ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use weft_proxy::config::{self, Config, Direction};

use super::annotations::{Redirect, Request};

/// The sidecar container's name (also how re-injection is recognised).
pub const CONTAINER: &str = "weft-proxy";
/// The redirect init container's name.
pub const REDIRECT_CONTAINER: &str = "weft-redirect";
/// The environment variable carrying the sidecar's bootstrap YAML (`weft-proxy --config-env`).
pub const BOOTSTRAP_ENV: &str = "WEFT_PROXY_BOOTSTRAP";
/// The volume (and mount) of the mesh root the sidecar checks the control plane's TLS with.
pub const CA_VOLUME: &str = "weft-mesh-ca";
const CA_DIR: &str = "/etc/weft/ca";

/// What every injected sidecar shares: the injector's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The weft image (weft-proxy).
    pub image: String,
    pub image_pull_policy: String,
    /// An image with `iptables` for the `weft.dev/redirect: iptables` init step (the weft image
    /// built by deploy/build-images.sh has none); without it such pods are denied, saying so.
    pub redirect_image: Option<String>,
    /// The control plane's xDS addresses (`host:port`), e.g. the StatefulSet's pods.
    pub xds: Vec<String>,
    /// A ConfigMap with the mesh root (`ca.crt`): the sidecar then dials xDS over TLS.
    pub xds_ca_config_map: Option<String>,
    /// Port the app calls (on loopback) to reach other services through the mesh.
    pub outbound_port: u16,
    /// Port other sidecars call this pod on; it forwards to the model server on loopback.
    pub inbound_port: u16,
    /// Read-only port for `/metrics`, `/ready`, `/live` (probes, a ServiceMonitor).
    pub metrics_port: u16,
    /// Loopback admin API.
    pub admin_port: u16,
    pub default_cpu: String,
    pub default_memory: String,
    /// The uid the sidecar runs as (non-root).
    pub uid: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            image: "weft:latest".into(),
            image_pull_policy: "IfNotPresent".into(),
            redirect_image: None,
            xds: vec!["weft-control.weft-system.svc:7701".into()],
            xds_ca_config_map: None,
            outbound_port: 15001,
            inbound_port: 15006,
            metrics_port: 15090,
            admin_port: 15000,
            default_cpu: "100m".into(),
            default_memory: "128Mi".into(),
            uid: 1337,
        }
    }
}

/// The sidecar's bootstrap: node identity, the two listeners, and the inbound route to the
/// model server on loopback. Services, experiments and clusters for outbound calls come over
/// xDS.
pub fn bootstrap(s: &Settings, r: &Request, namespace: &str) -> Config {
    let mut cfg = Config {
        node: config::Node {
            id: String::new(),
            team: namespace.to_string(),
            project: r.service.clone(),
            job_type: "inference".into(),
            ..Default::default()
        },
        admin: config::Admin {
            address: format!("127.0.0.1:{}", s.admin_port),
            metrics_address: Some(format!("0.0.0.0:{}", s.metrics_port)),
        },
        listeners: vec![
            config::Listener {
                name: "outbound".into(),
                address: format!("127.0.0.1:{}", s.outbound_port),
                direction: Direction::Outbound,
                ..Default::default()
            },
            config::Listener {
                name: "inbound".into(),
                address: format!("0.0.0.0:{}", s.inbound_port),
                direction: Direction::Inbound,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    cfg.front(&format!("{}-local", r.service), "inbound", format!("127.0.0.1:{}", r.port));
    cfg
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn http_probe(path: &str, port: u16, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction { path: Some(path.into()), port: IntOrString::Int(port.into()), ..Default::default() }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// The weft-proxy container, started as a native sidecar.
pub fn proxy_container(s: &Settings, r: &Request, namespace: &str) -> Container {
    let yaml = serde_norway::to_string(&bootstrap(s, r, namespace)).expect("a Config always serializes");
    let mut args = vec![
        "--config-env".to_string(),
        BOOTSTRAP_ENV.into(),
        "--xds".into(),
        s.xds.join(","),
        // The kubelet expands $(VAR) in args from the container's env.
        "--node-id".into(),
        "$(POD_NAME).$(POD_NAMESPACE)".into(),
        "--register-cluster".into(),
        r.service.clone(),
        "--register-address".into(),
        format!("$(POD_IP):{}", s.inbound_port),
    ];
    if !r.variant.is_empty() {
        args.extend(["--register-variant".into(), r.variant.clone()]);
    }
    if !r.model.is_empty() {
        args.extend(["--register-label".into(), format!("model={}", r.model)]);
    }
    if s.xds_ca_config_map.is_some() {
        args.extend(["--xds-ca".into(), format!("{CA_DIR}/ca.crt")]);
    }
    let cpu = r.cpu.clone().unwrap_or_else(|| s.default_cpu.clone());
    let memory = r.memory.clone().unwrap_or_else(|| s.default_memory.clone());
    let requests = BTreeMap::from([("cpu".to_string(), Quantity(cpu)), ("memory".to_string(), Quantity(memory.clone()))]);
    let port = |name: &str, p: u16| ContainerPort {
        name: Some(name.into()),
        container_port: p.into(),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Container {
        name: CONTAINER.into(),
        image: Some(s.image.clone()),
        image_pull_policy: Some(s.image_pull_policy.clone()),
        command: Some(vec!["weft-proxy".into()]),
        args: Some(args),
        restart_policy: Some("Always".into()),
        env: Some(vec![
            env_field("POD_NAME", "metadata.name"),
            env_field("POD_NAMESPACE", "metadata.namespace"),
            env_field("POD_IP", "status.podIP"),
            EnvVar { name: BOOTSTRAP_ENV.into(), value: Some(yaml), ..Default::default() },
        ]),
        ports: Some(vec![port("weft-inbound", s.inbound_port), port("weft-metrics", s.metrics_port)]),
        // The kubelet holds the model server back until this passes: the sidecar is listening.
        startup_probe: Some(http_probe("/live", s.metrics_port, 1, 60)),
        readiness_probe: Some(http_probe("/ready", s.metrics_port, 2, 3)),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            limits: Some(BTreeMap::from([("memory".to_string(), Quantity(memory))])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(s.uid),
            run_as_group: Some(s.uid),
            run_as_non_root: Some(true),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            ..Default::default()
        }),
        volume_mounts: s.xds_ca_config_map.as_ref().map(|_| {
            vec![VolumeMount { name: CA_VOLUME.into(), mount_path: CA_DIR.into(), read_only: Some(true), ..Default::default() }]
        }),
        ..Default::default()
    }
}

/// The volume holding the mesh root, when the sidecar dials xDS over TLS.
pub fn ca_volume(s: &Settings) -> Option<Volume> {
    s.xds_ca_config_map.as_ref().map(|cm| Volume {
        name: CA_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource { name: cm.clone(), ..Default::default() }),
        ..Default::default()
    })
}

/// With `weft.dev/redirect: iptables`: an init step that redirects inbound TCP to the model port
/// to the sidecar's inbound port. Only inbound: the sidecar reaches the model server on
/// loopback, which PREROUTING does not see, so there is no loop, and outbound calls keep
/// using the explicit outbound port.
pub fn redirect_container(s: &Settings, r: &Request) -> Option<Container> {
    let image = s.redirect_image.clone()?;
    (r.redirect == Redirect::Iptables).then(|| Container {
        name: REDIRECT_CONTAINER.into(),
        image: Some(image),
        image_pull_policy: Some(s.image_pull_policy.clone()),
        command: Some(
            [
                "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", &r.port.to_string(), "-j", "REDIRECT",
                "--to-ports", &s.inbound_port.to_string(),
            ]
            .map(String::from)
            .to_vec(),
        ),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

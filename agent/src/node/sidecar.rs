//! The weft-proxy sidecar the agent starts beside each replica: its bootstrap (admin on
//! loopback, one inbound listener on the node's advertised address, everything on it to the
//! model server) and its command line (xDS, registration in the launch's cluster with the
//! variant and `model=<base>` labels, drain timeout). Pure.

use std::path::Path;

use weft_control::launch::MODEL_LABEL;
use weft_proxy::config::{self, Config, Direction};

use super::desired::Want;

/// Where one sidecar listens and what it fronts.
pub struct Ports<'a> {
    /// `ip:port` other sidecars reach the replica at (registered).
    pub inbound: &'a str,
    pub admin_port: u16,
    pub server_port: u16,
}

/// The sidecar's node id: unique per replica in the mesh, naming node and placement.
pub fn node_id(node: &str, placement: &str) -> String {
    format!("{node}.{placement}")
}

pub fn bootstrap(node: &str, want: &Want, ports: &Ports<'_>) -> Config {
    let mut cfg = Config {
        node: config::Node {
            id: node_id(node, &want.placement),
            project: want.launch.cluster.clone(),
            job_type: "inference".into(),
            ..Default::default()
        },
        admin: config::Admin { address: format!("127.0.0.1:{}", ports.admin_port), metrics_address: None },
        listeners: vec![config::Listener {
            name: "inbound".into(),
            address: ports.inbound.to_string(),
            direction: Direction::Inbound,
            ..Default::default()
        }],
        ..Default::default()
    };
    cfg.front("local", "inbound", format!("127.0.0.1:{}", ports.server_port));
    cfg
}

/// What the agent passes to every sidecar besides the bootstrap.
pub struct Flags<'a> {
    pub proxy_bin: &'a str,
    pub xds: &'a [String],
    pub xds_ca: Option<&'a Path>,
    pub drain_timeout: &'a str,
    pub report_interval: &'a str,
}

pub fn argv(f: &Flags<'_>, config: &Path, cache: &Path, want: &Want) -> Vec<String> {
    let mut a: Vec<String> = vec![f.proxy_bin.into(), "--config".into(), config.display().to_string()];
    a.extend(["--xds".into(), f.xds.join(","), "--xds-cache".into(), cache.display().to_string()]);
    a.extend(["--register-cluster".into(), want.launch.cluster.clone()]);
    a.extend(["--register-variant".into(), want.variant.clone()]);
    a.extend(["--register-label".into(), format!("{MODEL_LABEL}={}", want.base_model)]);
    for (k, v) in &want.launch.labels {
        a.extend(["--register-label".into(), format!("{k}={v}")]);
    }
    a.extend(["--drain-timeout".into(), f.drain_timeout.into(), "--report-interval".into(), f.report_interval.into()]);
    a.extend(["--workers".into(), "1".into(), "--log".into(), "warn".into()]);
    if let Some(ca) = f.xds_ca {
        a.extend(["--xds-ca".into(), ca.display().to_string()]);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_fronts_the_server_and_the_flags_register_the_variant() {
        let mut want = Want {
            placement: "chat-a-0".into(),
            variant: "a".into(),
            base_model: "llama".into(),
            gpu: Some(0),
            launch: weft_control::launch::Launch { cluster: "chat-a".into(), base_path: "/m/b".into(), ..Default::default() },
        };
        want.launch.labels.insert("tier".into(), "gold".into());
        let cfg = bootstrap("n1", &want, &Ports { inbound: "127.0.0.1:7000", admin_port: 7001, server_port: 7002 });
        let text = serde_norway::to_string(&cfg).unwrap();
        let back = Config::from_yaml(&text).unwrap();
        assert_eq!(back.node.id, "n1.chat-a-0");
        assert_eq!(back.clusters[0].endpoints, ["127.0.0.1:7002"]);
        assert_eq!(back.listeners[0].address, "127.0.0.1:7000");
        let flags = Flags { proxy_bin: "weft-proxy", xds: &["127.0.0.1:1".into()], xds_ca: None, drain_timeout: "5s", report_interval: "1s" };
        let a = argv(&flags, Path::new("/c.yaml"), Path::new("/x.json"), &want).join(" ");
        assert!(a.contains("--register-cluster chat-a --register-variant a --register-label model=llama --register-label tier=gold"), "{a}");
    }
}

//! How a node agent starts one replica of a model variant: which weights weft's reference
//! model server loads (or which command of your own runs instead), the weft cluster the
//! replica's sidecar registers its endpoint in, how the agent health-checks the server, and
//! the labels on the endpoint.
//!
//! A `Launch` rides on an inference replica workload (`POST /v1/schedule/plan|apply`) or an
//! autoscaler's replica template (`placement.launch`, copied into every replica it places),
//! is stored in the placement, and reaches the node agent in `weft.v1.Placement.launch`.
//! The scheduler never reads it: where a replica goes does not depend on how it starts.
//! Pure: no IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weft_xds::resources::v1;

/// The path health-checked on a server whose launch names none.
pub const DEFAULT_HEALTH_PATH: &str = "/healthz";

/// What a `command` argument says where the server's port goes.
pub const PORT_PLACEHOLDER: &str = "{port}";

/// Endpoint label the agent sets itself (to the replica's base model): a launch may not set it.
pub const MODEL_LABEL: &str = "model";

/// How a node agent starts a replica (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    /// The weft cluster the replica's sidecar registers its endpoint in (required).
    pub cluster: String,
    /// safetensors file of the base weights on the node, loaded once per (base, GPU) by the
    /// node's weight holder and shared by every variant replica there.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub base_path: String,
    /// safetensors file of the variant's own weights (LoRA `layers.N.lora_a`/`lora_b` and/or
    /// `head.weight`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub delta_path: String,
    /// Run this command instead of weft's reference model server (e.g. vLLM): argv, where
    /// `{port}` is replaced by the port it must listen on (on 127.0.0.1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment of the server process, beside the agent's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Path the agent health-checks on the server (default "/healthz").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_path: String,
    /// Extra labels on the registered endpoint (beside `model=<base_model>`, which the agent
    /// adds).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Launch {
    /// Checks every field; the error names the first one at fault, relative to the launch
    /// (`cluster`, `command[0]`): see [`Launch::validate_under`] for the whole path.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.cluster.trim().is_empty() {
            return Err(("cluster", "required: the weft cluster the replica's sidecar registers its endpoint in".into()));
        }
        crate::resources::check_name(&self.cluster).map_err(|e| ("cluster", e.message))?;
        // A variant's delta is applied by weft's model server; a command loads its own weights.
        if !self.delta_path.is_empty() && self.base_path.is_empty() {
            return Err((
                "delta_path",
                format!("{:?} needs base_path: a variant's weights apply over base weights weft's model server loads", self.delta_path),
            ));
        }
        match (self.base_path.is_empty(), self.command.is_empty()) {
            (false, false) => {
                return Err((
                    "command",
                    format!(
                        "give command or base_path, not both: a command ({:?}) loads its own weights, base_path {:?} is for weft's model server",
                        self.command.join(" "),
                        self.base_path
                    ),
                ));
            }
            (true, true) => {
                return Err(("base_path", "give base_path (weft's model server loads it) or command (a server of your own)".into()));
            }
            _ => {}
        }
        if self.command.first().is_some_and(|c| c.trim().is_empty()) {
            return Err(("command[0]", "the program to run is empty".into()));
        }
        if !self.health_path.is_empty() && !self.health_path.starts_with('/') {
            return Err(("health_path", format!("{:?} must start with '/'", self.health_path)));
        }
        // A key the OS cannot set would fail the start on the node, far from the mistake.
        if let Some(k) = self.env.keys().find(|k| k.is_empty() || k.contains(['=', '\0'])) {
            return Err(("env", format!("{k:?} is not an environment variable name (empty, or holds '=' or NUL)")));
        }
        if let Some(k) = self.labels.keys().find(|k| k.trim().is_empty()) {
            return Err(("labels", format!("{k:?}: a label needs a name")));
        }
        if let Some(v) = self.labels.get(MODEL_LABEL) {
            return Err(("labels", format!("{MODEL_LABEL}={v:?}: the agent sets {MODEL_LABEL} to the replica's base model")));
        }
        Ok(())
    }

    /// [`Launch::validate`] with the field as a path under `prefix` (`workloads[2].launch`
    /// gives `workloads[2].launch.cluster`), for the API's errors.
    pub fn validate_under(&self, prefix: &str) -> Result<(), (String, String)> {
        self.validate().map_err(|(field, message)| (format!("{prefix}.{field}"), message))
    }

    /// The path to health-check: `health_path`, or [`DEFAULT_HEALTH_PATH`].
    pub fn health_path(&self) -> &str {
        if self.health_path.is_empty() { DEFAULT_HEALTH_PATH } else { &self.health_path }
    }

    /// `command` with every `{port}` replaced by `port` (empty without a command).
    pub fn argv(&self, port: u16) -> Vec<String> {
        let port = port.to_string();
        self.command.iter().map(|a| a.replace(PORT_PLACEHOLDER, &port)).collect()
    }
}

impl From<&Launch> for v1::Launch {
    fn from(l: &Launch) -> Self {
        v1::Launch {
            cluster: l.cluster.clone(),
            base_path: l.base_path.clone(),
            delta_path: l.delta_path.clone(),
            command: l.command.clone(),
            env: l.env.clone(),
            health_path: l.health_path.clone(),
            labels: l.labels.clone(),
        }
    }
}

/// What a node agent reads back from `weft.v1.Placement.launch` (then [`Launch::validate`]s:
/// a control plane validated it, but the agent should not trust the wire).
impl From<v1::Launch> for Launch {
    fn from(l: v1::Launch) -> Self {
        Launch {
            cluster: l.cluster,
            base_path: l.base_path,
            delta_path: l.delta_path,
            command: l.command,
            env: l.env,
            health_path: l.health_path,
            labels: l.labels,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A launch of weft's reference server with a variant delta.
    pub(crate) fn reference() -> Launch {
        Launch {
            cluster: "chat-a".into(),
            base_path: "/models/llama-8b.safetensors".into(),
            delta_path: "/models/chat-a.safetensors".into(),
            ..Launch::default()
        }
    }

    /// A launch of a server of one's own.
    pub(crate) fn own_command() -> Launch {
        Launch {
            cluster: "chat-b".into(),
            command: vec!["vllm".into(), "serve".into(), "--port".into(), "{port}".into()],
            env: [("CUDA_MODULE_LOADING".to_string(), "LAZY".to_string())].into(),
            health_path: "/health".into(),
            labels: [("tier".to_string(), "gold".to_string())].into(),
            ..Launch::default()
        }
    }

    #[test]
    fn the_two_ways_to_start_a_server_are_valid() {
        assert_eq!(reference().validate(), Ok(()));
        assert_eq!(Launch { delta_path: String::new(), ..reference() }.validate(), Ok(()), "a base alone");
        assert_eq!(own_command().validate(), Ok(()));
    }

    #[test]
    fn each_bad_field_is_named() {
        type Case = (fn(&mut Launch), &'static str);
        let cases: [Case; 12] = [
            (|l| l.cluster = String::new(), "cluster"),
            (|l| l.cluster = "a b".into(), "cluster"),
            (|l| l.command = vec!["server".into()], "command"),
            (|l| l.base_path = String::new(), "delta_path"),
            (|l| (l.base_path, l.delta_path) = (String::new(), String::new()), "base_path"),
            (|l| l.health_path = "healthz".into(), "health_path"),
            (|l| l.env = [("A=B".to_string(), "x".to_string())].into(), "env"),
            (|l| l.env = [(String::new(), "x".to_string())].into(), "env"),
            (|l| l.labels = [(" ".to_string(), "x".to_string())].into(), "labels"),
            (|l| l.labels = [(MODEL_LABEL.to_string(), "other".to_string())].into(), "labels"),
            (|l| *l = Launch { command: vec![" ".into()], ..own_command() }, "command[0]"),
            (|l| *l = Launch { delta_path: "/d.safetensors".into(), ..own_command() }, "delta_path"),
        ];
        for (break_it, field) in cases {
            let mut l = reference();
            break_it(&mut l);
            let (got, message) = l.validate().unwrap_err();
            assert_eq!(got, field, "{l:?}: {message}");
            assert!(!message.is_empty());
        }
        let (field, message) = Launch { command: vec!["x".into()], ..reference() }.validate_under("workloads[2].launch").unwrap_err();
        assert_eq!(field, "workloads[2].launch.command");
        assert!(message.contains("/models/llama-8b.safetensors"), "the message names the value: {message}");
    }

    #[test]
    fn unknown_fields_are_refused_and_defaults_left_out() {
        let e = serde_json::from_value::<Launch>(serde_json::json!({"cluster": "c", "base_path": "/b", "gpus": 1})).unwrap_err();
        assert!(e.to_string().contains("gpus"), "{e}");
        let json = serde_json::to_value(Launch { delta_path: String::new(), ..reference() }).unwrap();
        assert_eq!(json, serde_json::json!({"cluster": "chat-a", "base_path": "/models/llama-8b.safetensors"}));
    }

    #[test]
    fn argv_health_path_and_the_xds_form() {
        let l = own_command();
        assert_eq!(l.argv(8123), ["vllm", "serve", "--port", "8123"]);
        assert_eq!(l.health_path(), "/health");
        assert_eq!(reference().health_path(), DEFAULT_HEALTH_PATH);
        assert!(reference().argv(1).is_empty());
        let wire = v1::Launch::from(&l);
        assert_eq!((wire.cluster.as_str(), wire.env["CUDA_MODULE_LOADING"].as_str()), ("chat-b", "LAZY"));
        assert_eq!(Launch::from(wire), l, "the agent reads back what was placed");
    }
}

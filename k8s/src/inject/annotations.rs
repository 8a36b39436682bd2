//! What a pod asks of its sidecar, read from its `weft.dev/*` annotations. Pure: no IO.
//!
//! Every value is checked here, before anything is patched, so a bad one denies the pod with a
//! message naming the annotation and the value instead of starting a half-configured sidecar.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;

/// The annotation (or label) prefix of everything weft reads off a pod.
pub const PREFIX: &str = "weft.dev/";
/// Label or annotation: `"true"` asks for injection, `"false"` opts a pod out even in a
/// namespace labelled for injection.
pub const INJECT: &str = "weft.dev/inject";
/// Set by the injector on the pods it patched, with the injector's version: re-injection is a
/// no-op.
pub const INJECTED: &str = "weft.dev/injected";
/// The weft cluster this pod serves (registered under), default: the `app.kubernetes.io/name`
/// or `app` label.
pub const SERVICE: &str = "weft.dev/service";
/// The experiment variant the pod serves (empty = none).
pub const VARIANT: &str = "weft.dev/variant";
/// The model server's container port (a number, or the name of a container port); default: the
/// first container's first port.
pub const PORT: &str = "weft.dev/port";
/// The model the pod serves, as a label on its registered endpoint.
pub const MODEL: &str = "weft.dev/model";
/// The sidecar's CPU and memory requests (Kubernetes quantities); memory is also its limit.
pub const PROXY_CPU: &str = "weft.dev/proxy-cpu";
pub const PROXY_MEMORY: &str = "weft.dev/proxy-memory";
/// `port` (default: callers use the sidecar's port explicitly) or `iptables` (an init step
/// redirects the model port to the sidecar's inbound port, so callers need not change).
pub const REDIRECT: &str = "weft.dev/redirect";

/// Every annotation the injector understands; an unknown `weft.dev/` key is refused (a typo
/// silently ignored would leave the sidecar misconfigured).
pub const KNOWN: [&str; 9] = [INJECT, INJECTED, SERVICE, VARIANT, PORT, MODEL, PROXY_CPU, PROXY_MEMORY, REDIRECT];

/// How inbound traffic reaches the sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirect {
    /// Callers (other sidecars, by registration) dial the sidecar's inbound port.
    Port,
    /// An init container with NET_ADMIN redirects the model port to the inbound port.
    Iptables,
}

/// A pod's sidecar request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub service: String,
    pub variant: String,
    pub port: u16,
    pub model: String,
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub redirect: Redirect,
}

/// A value the injector cannot use, naming the annotation and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub annotation: String,
    pub value: String,
    pub why: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {}: {:?} {}", self.annotation, self.value, self.why)
    }
}

fn invalid(annotation: &str, value: &str, why: impl Into<String>) -> Invalid {
    Invalid { annotation: annotation.into(), value: value.into(), why: why.into() }
}

/// Whether the pod opted out (`weft.dev/inject: "false"` as a label or an annotation).
pub fn opted_out(pod: &Pod) -> bool {
    let m = &pod.metadata;
    [&m.labels, &m.annotations].into_iter().flatten().any(|map| map.get(INJECT).is_some_and(|v| v == "false"))
}

/// Whether the pod already carries the sidecar (marked by the injector, or a container of that
/// name added by hand).
pub fn already_injected(pod: &Pod, container: &str) -> bool {
    let marked = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(INJECTED));
    let spec = pod.spec.as_ref();
    let named = spec.is_some_and(|s| {
        s.containers.iter().chain(s.init_containers.iter().flatten()).any(|c| c.name == container)
    });
    marked || named
}

/// Read and check the pod's sidecar request.
pub fn read(pod: &Pod) -> Result<Request, Invalid> {
    let empty = BTreeMap::new();
    let ann = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some((k, v)) = ann.iter().find(|(k, _)| k.starts_with(PREFIX) && !KNOWN.contains(&k.as_str())) {
        return Err(invalid(k, v, format!("is not a weft annotation (known: {})", KNOWN.join(", "))));
    }
    if let Some(v) = ann.get(INJECT).or_else(|| labels.get(INJECT))
        && v != "true"
        && v != "false"
    {
        return Err(invalid(INJECT, v, "must be \"true\" or \"false\""));
    }

    let service = match ann.get(SERVICE) {
        Some(v) => v.clone(),
        None => labels.get("app.kubernetes.io/name").or_else(|| labels.get("app")).cloned().ok_or_else(|| {
            invalid(SERVICE, "", "is missing, and the pod has no app.kubernetes.io/name or app label to default it from")
        })?,
    };
    dns_label(SERVICE, &service)?;
    let variant = ann.get(VARIANT).cloned().unwrap_or_default();
    if !variant.is_empty() {
        dns_label(VARIANT, &variant)?;
    }
    let model = ann.get(MODEL).cloned().unwrap_or_default();
    if model.len() > 253 || model.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(MODEL, &model, "must be at most 253 characters, without spaces or control characters"));
    }
    let port = model_port(pod, ann.get(PORT).map(String::as_str))?;
    let cpu = ann.get(PROXY_CPU).map(|v| quantity(PROXY_CPU, v)).transpose()?;
    let memory = ann.get(PROXY_MEMORY).map(|v| quantity(PROXY_MEMORY, v)).transpose()?;
    let redirect = match ann.get(REDIRECT).map(String::as_str) {
        None | Some("port") => Redirect::Port,
        Some("iptables") => Redirect::Iptables,
        Some(v) => return Err(invalid(REDIRECT, v, "must be \"port\" or \"iptables\"")),
    };
    Ok(Request { service, variant, port, model, cpu, memory, redirect })
}

/// The model server's port: the annotation's number or named container port, else the first
/// container's first port.
fn model_port(pod: &Pod, annotation: Option<&str>) -> Result<u16, Invalid> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    let ports = || containers.iter().flat_map(|c| c.ports.iter().flatten());
    let Some(v) = annotation else {
        return ports()
            .next()
            .and_then(|p| u16::try_from(p.container_port).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(PORT, "", "is missing, and no container declares a port to default it from"));
    };
    // All digits: a port number; anything else: a container port's name.
    if v.chars().all(|c| c.is_ascii_digit()) {
        return v
            .parse::<u16>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| invalid(PORT, v, "must be a port number in 1..=65535 or a container port's name"));
    }
    ports()
        .find(|p| p.name.as_deref() == Some(v))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .ok_or_else(|| invalid(PORT, v, "names no container port of this pod"))
}

/// An RFC 1123 label: what weft names (clusters, variants) must be to serve as Kubernetes names.
fn dns_label(annotation: &str, v: &str) -> Result<(), Invalid> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-');
    if ok { Ok(()) } else { Err(invalid(annotation, v, "must be a DNS label (a-z, 0-9, '-', at most 63)")) }
}

/// A Kubernetes resource quantity (`100m`, `0.5`, `128Mi`, `1e3`), checked with the API
/// server's grammar so the patched pod is not refused later for it.
fn quantity(annotation: &str, v: &str) -> Result<String, Invalid> {
    let bad = || invalid(annotation, v, "is not a Kubernetes quantity (e.g. 100m, 0.5, 128Mi)");
    let body = v.strip_prefix(['+', '-']).unwrap_or(v);
    if v.starts_with('-') {
        return Err(invalid(annotation, v, "must not be negative"));
    }
    let digits_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (num, suffix) = body.split_at(digits_end);
    let num_ok = !num.is_empty() && num != "." && num.matches('.').count() <= 1;
    const SUFFIXES: [&str; 16] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
    let exp_ok = suffix
        .strip_prefix(['e', 'E'])
        .map(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
        })
        .unwrap_or(false);
    if num_ok && (SUFFIXES.contains(&suffix) || exp_ok) { Ok(v.to_string()) } else { Err(bad()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
    use kube::api::ObjectMeta;

    fn pod(ann: &[(&str, &str)], labels: &[(&str, &str)]) -> Pod {
        let map = |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        Pod {
            metadata: ObjectMeta { annotations: map(ann), labels: map(labels), ..Default::default() },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "model".into(),
                    ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8000, ..Default::default() }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_come_from_labels_and_the_first_port() {
        let r = read(&pod(&[], &[("app", "ranker")])).unwrap();
        assert_eq!((r.service.as_str(), r.port, r.redirect), ("ranker", 8000, Redirect::Port));
        let r = read(&pod(&[(PORT, "http"), (VARIANT, "b"), (PROXY_CPU, "250m")], &[("app", "ranker")])).unwrap();
        assert_eq!((r.port, r.variant.as_str(), r.cpu.as_deref()), (8000, "b", Some("250m")));
    }

    #[test]
    fn each_bad_value_names_its_annotation_and_value() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 8] = [
            (&[(PORT, "0")], PORT, "0"),
            (&[(PORT, "70000")], PORT, "70000"),
            (&[(PORT, "grpc")], PORT, "grpc"),
            (&[(SERVICE, "Ranker_A")], SERVICE, "Ranker_A"),
            (&[(PROXY_MEMORY, "lots")], PROXY_MEMORY, "lots"),
            (&[(PROXY_CPU, "-1")], PROXY_CPU, "-1"),
            (&[(REDIRECT, "ebpf")], REDIRECT, "ebpf"),
            (&[("weft.dev/varient", "b")], "weft.dev/varient", "b"),
        ];
        for (ann, name, value) in cases {
            let e = read(&pod(ann, &[("app", "ranker")])).unwrap_err();
            assert_eq!((e.annotation.as_str(), e.value.as_str()), (name, value), "{e}");
            assert!(e.to_string().contains(name) && e.to_string().contains(value), "{e}");
        }
        let e = read(&pod(&[], &[])).unwrap_err();
        assert_eq!(e.annotation, SERVICE);
    }

    #[test]
    fn quantities_follow_the_api_servers_grammar() {
        for ok in ["1", "0.5", "100m", "128Mi", "1Gi", "1e3", "2E-2", ".5"] {
            assert!(quantity(PROXY_CPU, ok).is_ok(), "{ok}");
        }
        for bad in ["", "m", "1.2.3", "12mb", "1e", "Mi"] {
            assert!(quantity(PROXY_CPU, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn opt_out_and_reinjection_are_recognised() {
        assert!(opted_out(&pod(&[(INJECT, "false")], &[])));
        assert!(opted_out(&pod(&[], &[(INJECT, "false")])));
        assert!(!opted_out(&pod(&[], &[(INJECT, "true")])));
        assert!(already_injected(&pod(&[(INJECTED, "0.1.0")], &[]), "weft-proxy"));
        assert!(already_injected(&pod(&[], &[]), "model"));
        assert!(!already_injected(&pod(&[], &[]), "weft-proxy"));
    }
}

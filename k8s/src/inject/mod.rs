//! The sidecar injector: a mutating admission webhook that answers an `AdmissionReview` for a
//! pod with a JSONPatch adding weft-proxy. Pure: bytes in, bytes out; the HTTPS server is in
//! [`crate::webhook`].
//!
//! Failure policy: a pod that cannot be read, or whose `weft.dev/*` annotations are invalid, is
//! **denied** with a message naming the annotation and the value (a pod that asked for the mesh
//! and silently started without it would be worse: its callers would route around it). The
//! webhook configuration in deploy/kubernetes sets `failurePolicy: Fail` for the same reason,
//! scoped by selectors to namespaces and pods that asked for injection, so an unreachable
//! injector never blocks anything else. A patch is all or nothing: it is computed in full
//! before it is returned.

pub mod annotations;
pub mod sidecar;

use json_patch::Patch;
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::Status;
use serde_json::{Value, json};

pub use sidecar::Settings;

/// The value of `weft.dev/injected` on patched pods.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the webhook decided for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admitted unchanged, and why (logged; not an error).
    Unchanged(&'static str),
    /// Admitted with this patch.
    Patched(Patch),
    /// Denied, with a message for the user.
    Denied(String),
}

/// Answer one AdmissionReview request body with the AdmissionReview response body.
pub fn review(settings: &Settings, body: &[u8]) -> (Decision, Vec<u8>) {
    let (decision, response) = match serde_json::from_slice::<AdmissionReview<Pod>>(body) {
        Ok(review) => match TryInto::<AdmissionRequest<Pod>>::try_into(review) {
            Ok(req) => {
                let d = decide(settings, &req);
                let resp = respond(AdmissionResponse::from(&req), &d);
                (d, resp)
            }
            Err(_) => unreadable(body, "the AdmissionReview has no request".into()),
        },
        Err(e) => unreadable(body, format!("the AdmissionReview cannot be read: {e}")),
    };
    let out = serde_json::to_vec(&response.into_review()).expect("an AdmissionReview always serializes");
    (decision, out)
}

/// A review whose pod does not parse: denied, under the request's uid when that much can be read
/// (the API server matches responses by uid).
fn unreadable(body: &[u8], why: String) -> (Decision, AdmissionResponse) {
    let uid = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/request/uid").and_then(Value::as_str).map(str::to_string));
    let Some(uid) = uid else {
        return (Decision::Denied(why.clone()), AdmissionResponse::invalid(&why));
    };
    // Build a request-shaped response carrying the uid, then deny it.
    let mut resp = AdmissionResponse::invalid(&why);
    resp.uid = uid;
    let d = Decision::Denied(why);
    let resp = respond(resp, &d);
    (d, resp)
}

fn respond(base: AdmissionResponse, d: &Decision) -> AdmissionResponse {
    match d {
        Decision::Unchanged(_) => base,
        Decision::Patched(p) => base.with_patch(p.clone()).expect("a JSONPatch always serializes"),
        Decision::Denied(msg) => {
            let mut r = base.deny(msg);
            r.result = Status::failure(msg, "BadRequest").with_code(400);
            r
        }
    }
}

/// Decide for one admission request: unchanged, patched or denied.
pub fn decide(settings: &Settings, req: &AdmissionRequest<Pod>) -> Decision {
    if req.kind.kind != "Pod" || req.operation != Operation::Create {
        return Decision::Unchanged("not a pod being created");
    }
    let Some(pod) = &req.object else {
        return Decision::Denied("the AdmissionReview carries no pod object".into());
    };
    if annotations::opted_out(pod) {
        return Decision::Unchanged("opted out (weft.dev/inject: \"false\")");
    }
    if annotations::already_injected(pod, sidecar::CONTAINER) {
        return Decision::Unchanged("already injected");
    }
    if pod.spec.is_none() {
        return Decision::Denied("the pod has no spec".into());
    }
    let request = match annotations::read(pod) {
        Ok(r) => r,
        Err(e) => return Decision::Denied(format!("weft sidecar injection: {e}")),
    };
    if request.redirect == annotations::Redirect::Iptables && settings.redirect_image.is_none() {
        return Decision::Denied(format!(
            "weft sidecar injection: annotation {}: \"iptables\" needs an injector started with --redirect-image (an image with iptables); this one has none: use \"port\" or ask your mesh admin",
            annotations::REDIRECT
        ));
    }
    let namespace = req.namespace.as_deref().or(pod.metadata.namespace.as_deref()).unwrap_or("default");
    match patch(settings, pod, &request, namespace) {
        Ok(p) => Decision::Patched(p),
        Err(e) => Decision::Denied(format!("weft sidecar injection: {e}")),
    }
}

/// The JSONPatch that adds the sidecar (and the redirect step and CA volume when asked for) and
/// marks the pod injected.
pub fn patch(s: &Settings, pod: &Pod, r: &annotations::Request, namespace: &str) -> Result<Patch, String> {
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let mut ops = Vec::new();
    let add = |path: String, value: Value| json!({"op": "add", "path": path, "value": value});

    match &pod.metadata.annotations {
        None => ops.push(add("/metadata/annotations".into(), json!({ annotations::INJECTED: VERSION }))),
        Some(_) => ops.push(add(format!("/metadata/annotations/{}", pointer_escape(annotations::INJECTED)), json!(VERSION))),
    }

    let ours: Vec<Value> = sidecar::redirect_container(s, r)
        .into_iter()
        .chain([sidecar::proxy_container(s, r, namespace)])
        .map(|c| serde_json::to_value(c).expect("a Container always serializes"))
        .collect();
    match spec.init_containers.as_deref() {
        None | Some([]) => ops.push(add("/spec/initContainers".into(), Value::Array(ours))),
        // Ours go first, so the sidecar is up before the pod's own init steps and the app.
        Some(_) => ops.extend(ours.into_iter().enumerate().map(|(i, c)| add(format!("/spec/initContainers/{i}"), c))),
    }

    if let Some(v) = sidecar::ca_volume(s) {
        let existing = spec.volumes.as_deref().unwrap_or_default();
        if existing.iter().any(|e| e.name == v.name) {
            return Err(format!("the pod already has a volume named {:?}, which the sidecar needs", v.name));
        }
        let v = serde_json::to_value(v).expect("a Volume always serializes");
        match spec.volumes {
            None => ops.push(add("/spec/volumes".into(), json!([v]))),
            Some(_) => ops.push(add("/spec/volumes/-".into(), v)),
        }
    }
    serde_json::from_value(Value::Array(ops)).map_err(|e| format!("internal: patch does not parse: {e}"))
}

/// RFC 6901: `~` and `/` in a JSON Pointer token.
fn pointer_escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

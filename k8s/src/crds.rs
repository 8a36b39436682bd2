//! weft's resources as Kubernetes custom resources (group `weft.dev`, version `v1alpha1`). Each
//! spec *is* the Rust type weft-control validates (flattened in), so the CRD's OpenAPI v3 schema
//! is generated from the same type and cannot drift from what the REST API accepts.
//!
//! The CRDs are cluster-scoped: weft's names are global (a Route names clusters and
//! experiments by name, across the mesh), and two namespaces each holding a `ranker` route would
//! silently overwrite each other in weft's store.
//!
//! [`to_weft`] maps a custom resource to the weft kind, name and spec [`crate::sync`] writes
//! through weft-control's REST API. Pure: no IO.

// Each printer column is its own `#[kube(printcolumn(...))]`, so `type_ = "string"` repeats:
// clippy reads that as a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::object::HasSpec;
use kube::{CustomResource, CustomResourceExt, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use weft_control::resources::Kind;

/// The API group of weft's custom resources.
pub const GROUP: &str = "weft.dev";

/// What the sync writes back: whether weft-control accepted the spec, and what became of it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// `Accepted` (written to weft's store) or `Refused` (weft-control refused it: see
    /// `message`); empty until the sync has seen it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// weft-control's answer: the refused field and why, or what was written.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The `metadata.generation` this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The weft store revision (Raft log index) of the accepted write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Sidecars that refused (NACKed) the pushed resource, as `node: reason`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nacks: Vec<String>,
    /// Rollouts only: the engine's phase, its step (index into `spec.steps`) and the
    /// candidate's current weight (percent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_step: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_weight: Option<u32>,
}

/// A route table (weft's `services[]` item): hosts, and routes to clusters or experiments.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "weft.dev", version = "v1alpha1", kind = "Route", status = "SyncStatus", shortname = "wrt")]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[kube(printcolumn(name = "Revision", type_ = "integer", json_path = ".status.revision"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
pub struct RouteSpec {
    #[serde(flatten)]
    pub service: weft_proxy::config::Service,
}

/// An A/B experiment between variants (weft's `experiments[]` item).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "weft.dev", version = "v1alpha1", kind = "Experiment", status = "SyncStatus", shortname = "wexp")]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[kube(printcolumn(name = "Revision", type_ = "integer", json_path = ".status.revision"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
pub struct ExperimentSpec {
    #[serde(flatten)]
    pub experiment: weft_proxy::config::Experiment,
}

/// A progressive rollout of an experiment's candidate (named after the experiment).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "weft.dev", version = "v1alpha1", kind = "Rollout", status = "SyncStatus", shortname = "wro")]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[kube(printcolumn(name = "Rollout", type_ = "string", json_path = ".status.rolloutPhase"))]
#[kube(printcolumn(name = "Step", type_ = "integer", json_path = ".status.rolloutStep"))]
#[kube(printcolumn(name = "Weight", type_ = "integer", json_path = ".status.rolloutWeight"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
pub struct RolloutSpec {
    #[serde(flatten)]
    pub rollout: weft_control::experiments::rollout::RolloutSpec,
}

/// How to autoscale one variant.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "weft.dev", version = "v1alpha1", kind = "Autoscaler", status = "SyncStatus", shortname = "was")]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[kube(printcolumn(name = "Revision", type_ = "integer", json_path = ".status.revision"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
pub struct AutoscalerSpec {
    #[serde(flatten)]
    pub autoscaler: weft_control::autoscaler::spec::AutoscalerSpec,
}

/// A distributed training job: workers, dataset shards, global batch, model layout.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "weft.dev", version = "v1alpha1", kind = "TrainingJob", status = "SyncStatus", shortname = "wtj")]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[kube(printcolumn(name = "Revision", type_ = "integer", json_path = ".status.revision"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
pub struct TrainingJobSpec {
    #[serde(flatten)]
    pub job: weft_control::shards::job::JobSpec,
}

/// Every CRD, in the order deploy/kubernetes/crds.yaml lists them.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![Route::crd(), Experiment::crd(), Rollout::crd(), Autoscaler::crd(), TrainingJob::crd()]
}

/// The CRDs as one multi-document YAML (what `weft-k8s crds` prints and crds.yaml holds).
pub fn yaml() -> String {
    let mut out = String::from("# Generated by `weft-k8s crds` from weft's spec types; do not edit.\n");
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd).expect("a CRD always serializes"));
    }
    out
}

/// The weft kind each custom resource kind is written as.
pub fn kind_of(cr_kind: &str) -> Option<Kind> {
    Some(match cr_kind {
        "Route" => Kind::Services,
        "Experiment" => Kind::Experiments,
        "Rollout" => Kind::Rollouts,
        "Autoscaler" => Kind::Autoscalers,
        "TrainingJob" => Kind::TrainingJobs,
        _ => return None,
    })
}

/// A custom resource as the weft write it becomes: kind, name (`metadata.name`) and the spec as
/// weft-control takes it. A spec `name` other than the object's is refused, naming both.
pub fn to_weft<K>(cr: &K) -> Result<(Kind, String, Value), String>
where
    K: Resource<DynamicType = ()> + HasSpec,
    K::Spec: Serialize,
{
    let kind = kind_of(&K::kind(&())).ok_or_else(|| format!("{} is not a weft kind", K::kind(&())))?;
    let name = cr.meta().name.clone().ok_or("the object has no metadata.name")?;
    let mut spec = serde_json::to_value(cr.spec()).map_err(|e| format!("spec: {e}"))?;
    let obj = spec.as_object_mut().ok_or("spec: not an object")?;
    match obj.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n != name => {
            return Err(format!("spec.name: {n:?} differs from metadata.name {name:?} (leave spec.name out)"));
        }
        _ => {
            obj.insert("name".into(), Value::String(name.clone()));
        }
    }
    Ok((kind, name, spec))
}

//! EndpointSlices → weft endpoints. Pure: watch events in, the endpoint sets that changed out;
//! [`crate::sync`] feeds it from the API server's watch and writes the changes to weft-control.
//!
//! Which Services are meshed: those labelled `weft.dev/mesh: "true"` (the EndpointSlice
//! controller copies a Service's labels onto its slices, so the watch selects on the label).
//! A Service feeds the weft cluster named by its `weft.dev/cluster` label (default: the
//! Service's name), labelled with the `weft.dev/variant` label's variant. The port taken from
//! each slice is the one named `weft` (the Service port that targets the sidecar's inbound
//! port), else the slice's only port. Endpoints whose `ready` condition is false are left out
//! (a missing condition means ready, as the API documents); a Service may span many slices,
//! merged here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use weft_control::resources::{EndpointSpec, EndpointsSpec};

/// The label selecting meshed Services' slices.
pub const MESH_LABEL: &str = "weft.dev/mesh";
/// Label naming the weft cluster (default: the Service's name).
pub const CLUSTER_LABEL: &str = "weft.dev/cluster";
/// Label naming the variant served by the Service's pods.
pub const VARIANT_LABEL: &str = "weft.dev/variant";
/// The Service port (by name) whose endpoints are the sidecars' inbound ports.
pub const PORT_NAME: &str = "weft";
/// The label the EndpointSlice controller puts on each slice.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// One slice's contribution, keyed by the slice's namespace/name.
#[derive(Debug, Clone, PartialEq)]
struct Slice {
    cluster: String,
    endpoints: Vec<EndpointSpec>,
}

/// A change to write: the cluster's full endpoint set (empty when its last slice went away).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Put(EndpointsSpec),
    /// No slice feeds the cluster any more: delete its `endpoints` resource.
    Delete(String),
}

/// A slice the sync cannot use, and why (logged, the slice is skipped).
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub slice: String,
    pub why: String,
}

/// The slices seen so far and what they add up to.
#[derive(Debug, Default)]
pub struct Endpoints {
    slices: BTreeMap<String, Slice>,
    /// Slices listed since a watch (re)start, applied together at `InitDone`.
    relist: Option<BTreeMap<String, Slice>>,
    /// What was last written per cluster, so an unchanged set is not rewritten.
    written: BTreeMap<String, Vec<EndpointSpec>>,
}

fn key(s: &EndpointSlice) -> String {
    format!("{}/{}", s.metadata.namespace.as_deref().unwrap_or(""), s.metadata.name.as_deref().unwrap_or(""))
}

/// One slice's endpoints, or why it is skipped.
fn convert(s: &EndpointSlice) -> Result<Slice, String> {
    let labels = s.metadata.labels.clone().unwrap_or_default();
    let service = labels.get(SERVICE_NAME).ok_or_else(|| format!("has no {SERVICE_NAME} label"))?;
    let cluster = labels.get(CLUSTER_LABEL).unwrap_or(service).clone();
    let variant = labels.get(VARIANT_LABEL).cloned().unwrap_or_default();
    let bracket = match s.address_type.as_str() {
        "IPv4" => false,
        "IPv6" => true,
        other => return Err(format!("addressType {other:?} is not an IP family weft dials")),
    };
    let ports = s.ports.as_deref().unwrap_or_default();
    let port = match ports.iter().find(|p| p.name.as_deref() == Some(PORT_NAME)) {
        Some(p) => p.port,
        None if ports.len() == 1 => ports[0].port,
        None => {
            return Err(format!(
                "has {} ports and none named {PORT_NAME:?}: name the Service port that targets the sidecar's inbound port {PORT_NAME:?}",
                ports.len()
            ));
        }
    };
    let Some(port) = port.filter(|p| (1..=65535).contains(p)) else {
        return Err("its port has no number (a named targetPort no pod resolves)".into());
    };
    let mut endpoints = Vec::new();
    for e in &s.endpoints {
        if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
            continue;
        }
        let mut labels = BTreeMap::new();
        if let Some(z) = &e.zone {
            labels.insert("zone".to_string(), z.clone());
        }
        if let Some(n) = &e.node_name {
            labels.insert("node".to_string(), n.clone());
        }
        if let Some(pod) = e.target_ref.as_ref().filter(|r| r.kind.as_deref() == Some("Pod")).and_then(|r| r.name.clone()) {
            labels.insert("pod".to_string(), pod);
        }
        // Every address of an endpoint is the same pod: the first is enough.
        if let Some(ip) = e.addresses.first() {
            let address = if bracket { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
            endpoints.push(EndpointSpec { address, variant: variant.clone(), labels });
        }
    }
    Ok(Slice { cluster, endpoints })
}

impl Endpoints {
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one watch event; returns the clusters whose endpoint set changed, and the slices
    /// skipped.
    pub fn apply(&mut self, event: Event<EndpointSlice>) -> (Vec<Change>, Vec<Skipped>) {
        let mut skipped = Vec::new();
        let mut touched = BTreeSet::new();
        let mut put = |slices: &mut BTreeMap<String, Slice>, s: &EndpointSlice, touched: &mut BTreeSet<String>| {
            let k = key(s);
            if let Some(old) = slices.remove(&k) {
                touched.insert(old.cluster);
            }
            match convert(s) {
                Ok(slice) => {
                    touched.insert(slice.cluster.clone());
                    slices.insert(k, slice);
                }
                Err(why) => skipped.push(Skipped { slice: k, why }),
            }
        };
        match event {
            Event::Apply(s) => put(&mut self.slices, &s, &mut touched),
            Event::Delete(s) => {
                if let Some(old) = self.slices.remove(&key(&s)) {
                    touched.insert(old.cluster);
                }
            }
            // A (re)list: slices deleted while the watch was down are simply not listed, so
            // the listed set replaces the old one whole at InitDone.
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(s) => {
                let relist = self.relist.get_or_insert_with(BTreeMap::new);
                put(relist, &s, &mut BTreeSet::new());
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.slices, listed);
                touched.extend(old.values().map(|s| s.cluster.clone()));
                touched.extend(self.slices.values().map(|s| s.cluster.clone()));
                touched.extend(self.written.keys().cloned());
            }
        }
        (self.changes(touched), skipped)
    }

    /// The full endpoint set of each touched cluster, where it differs from what was written.
    fn changes(&mut self, touched: BTreeSet<String>) -> Vec<Change> {
        let mut out = Vec::new();
        for cluster in touched {
            let mut set: Vec<EndpointSpec> =
                self.slices.values().filter(|s| s.cluster == cluster).flat_map(|s| s.endpoints.clone()).collect();
            set.sort_by(|a, b| a.address.cmp(&b.address));
            set.dedup_by(|a, b| a.address == b.address);
            let feeds = self.slices.values().any(|s| s.cluster == cluster);
            if self.written.get(&cluster) == Some(&set) && feeds {
                continue;
            }
            if feeds {
                self.written.insert(cluster.clone(), set.clone());
                out.push(Change::Put(EndpointsSpec { name: cluster, endpoints: set }));
            } else if self.written.remove(&cluster).is_some() {
                out.push(Change::Delete(cluster));
            }
        }
        out
    }

    /// Forget what was written (after weft-control lost writes, e.g. a failed PUT): the next
    /// event rewrites every touched cluster.
    pub fn forget_written(&mut self, cluster: &str) {
        self.written.remove(cluster);
    }
}

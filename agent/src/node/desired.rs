//! What this node should run, from the placements the control plane pushes: one [`Want`] per
//! inference replica assigned here that carries a launch. Pure: the loop in [`super`] compares
//! it with what runs.

use serde::{Deserialize, Serialize};
use weft_control::launch::Launch;
use weft_xds::resources::v1;

/// One replica this node should run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    /// The placement's name: the replica's identity on this node.
    pub placement: String,
    pub variant: String,
    pub base_model: String,
    /// The GPU (index in this node) the scheduler gave it; `None` for a CPU placement.
    pub gpu: Option<u32>,
    pub launch: Launch,
}

/// The replicas placed on `node`: inference replicas (`kind` "replica") with a launch and an
/// assignment on this node, sorted by placement name. A placement without a launch says where,
/// not how, and is left to whoever starts it; gangs and pods are not the agent's.
pub fn for_node(node: &str, placements: &[v1::Placement]) -> Vec<Want> {
    let mut wants: Vec<Want> = placements
        .iter()
        .filter(|p| p.kind == "replica")
        .filter_map(|p| {
            let launch = p.launch.clone()?;
            let here = p.assignments.iter().find(|a| a.node == node)?;
            Some(Want {
                placement: p.name.clone(),
                variant: p.variant.clone(),
                base_model: p.base_model.clone(),
                gpu: here.gpus.first().map(|g| g.index),
                launch: Launch::from(launch),
            })
        })
        .collect();
    wants.sort_by(|a, b| a.placement.cmp(&b.placement));
    wants
}

/// Why a want cannot be started on this node as it is (checked before anything starts, so a
/// bad placement disturbs nothing else): a GPU the node does not have, a model file that is
/// not there. The message names the field and the value.
pub fn precheck(want: &Want, gpus: u32, exists: impl Fn(&str) -> bool) -> Result<(), String> {
    if let Some(g) = want.gpu
        && g >= gpus
    {
        return Err(format!("gpu {g}: this node has {gpus} GPU(s) (indexes 0..{gpus})"));
    }
    for (field, path) in [("launch.base_path", &want.launch.base_path), ("launch.delta_path", &want.launch.delta_path)] {
        if !path.is_empty() && !exists(path) {
            return Err(format!("{field} {path}: no such file on this node"));
        }
    }
    if want.launch.command.is_empty() && want.launch.base_path.is_empty() {
        return Err("launch: neither base_path nor command".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(name: &str, kind: &str, node: &str, gpu: Option<u32>, launch: bool) -> v1::Placement {
        v1::Placement {
            name: name.into(),
            kind: kind.into(),
            variant: "a".into(),
            base_model: "m".into(),
            assignments: vec![v1::Assignment {
                node: node.into(),
                gpus: gpu.map(|index| v1::GpuShare { index, milli: 500, memory_bytes: 1 }).into_iter().collect(),
                ..Default::default()
            }],
            launch: launch.then(|| v1::Launch { cluster: "c".into(), base_path: "/m/base".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn only_launchable_replicas_on_this_node_are_wanted() {
        let ps = [
            placement("z", "replica", "n1", Some(1), true),
            placement("a", "replica", "n1", None, true),
            placement("other-node", "replica", "n2", Some(0), true),
            placement("no-launch", "replica", "n1", Some(0), false),
            placement("gang", "gang", "n1", Some(0), true),
        ];
        let w = for_node("n1", &ps);
        assert_eq!(w.iter().map(|w| (w.placement.as_str(), w.gpu)).collect::<Vec<_>>(), [("a", None), ("z", Some(1))]);
        assert_eq!(w[0].launch.cluster, "c");
    }

    #[test]
    fn a_missing_gpu_or_file_is_named() {
        let w = for_node("n1", &[placement("p", "replica", "n1", Some(2), true)]).remove(0);
        assert_eq!(precheck(&w, 2, |_| true).unwrap_err(), "gpu 2: this node has 2 GPU(s) (indexes 0..2)");
        assert_eq!(precheck(&w, 3, |_| false).unwrap_err(), "launch.base_path /m/base: no such file on this node");
        assert!(precheck(&w, 3, |_| true).is_ok());
    }
}

//! What the node has, as the agent registers it (`PUT /v1/nodes/<node>`) and reports it: the
//! GPUs from NVML when the NVIDIA driver is there (loaded at run time, so the agent runs on
//! machines without it), else a declared inventory file.
//!
//! The declared file is a node's spec in the control API's terms, without the name:
//!
//! ```yaml
//! cpu_milli: 16000
//! memory_mib: 65536
//! gpu_model: A100
//! gpu_count: 2
//! gpu_memory_bytes: 85899345920
//! ```
//!
//! With NVML, the file (when given) still supplies what NVML does not know (pool, price,
//! topology); the GPU fields come from the driver.

use std::path::Path;

use serde_json::{Value, json};
use weft_control::nodes::GpuStatus;

/// Where the GPU inventory came from (`NodeStatus.inventory_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// NVML if the driver loads, else the declared file.
    Auto,
    Nvml,
    Declared,
}

/// The node's inventory: the spec to register and the GPUs to report.
#[derive(Clone, Debug, PartialEq)]
pub struct Inventory {
    /// `weft_control::scheduler::inventory::NodeSpec` as JSON (the API's body).
    pub spec: Value,
    pub gpus: Vec<GpuStatus>,
    /// "nvml" or "declared".
    pub source: &'static str,
}

impl Inventory {
    pub fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }
}

/// Reads the declared file (YAML or JSON) into a spec for `node`; errors name the file and
/// the field.
pub fn declared(node: &str, text: &str, file: &Path) -> Result<Inventory, String> {
    let mut spec: Value = serde_norway::from_str(text).map_err(|e| format!("--inventory {}: {e}", file.display()))?;
    let Some(map) = spec.as_object_mut() else {
        return Err(format!("--inventory {}: expected a mapping of node fields (cpu_milli, memory_mib, gpu_model, gpu_count, ...)", file.display()));
    };
    if let Some(name) = map.get("name").and_then(Value::as_str)
        && name != node
    {
        return Err(format!("--inventory {}: name {name:?} is not this node ({node:?})", file.display()));
    }
    map.insert("name".into(), json!(node));
    // Through YAML again, not `from_value`: serde_norway's errors name the field at fault.
    let named = serde_norway::to_string(&spec).map_err(|e| e.to_string())?;
    let parsed: weft_control::scheduler::inventory::NodeSpec =
        serde_norway::from_str(&named).map_err(|e| format!("--inventory {}: {e}", file.display()))?;
    let gpus = (0..parsed.gpu_count as u32)
        .map(|index| GpuStatus { index, name: parsed.gpu_model.clone(), memory_bytes: parsed.gpu_memory_bytes, used_bytes: 0 })
        .collect();
    Ok(Inventory { spec, gpus, source: "declared" })
}

/// The GPUs NVML sees, or why it cannot be asked (no driver, no device).
pub fn nvml_gpus() -> Result<Vec<GpuStatus>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let n = nvml.device_count().map_err(|e| format!("NVML device count: {e}"))?;
    (0..n)
        .map(|index| {
            let d = nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}"))?;
            let name = d.name().map_err(|e| format!("NVML device {index} name: {e}"))?;
            let mem = d.memory_info().map_err(|e| format!("NVML device {index} memory: {e}"))?;
            Ok(GpuStatus { index, name, memory_bytes: mem.total, used_bytes: mem.used })
        })
        .collect()
}

/// This machine's CPUs (milli) and memory (MiB), for a spec that does not declare them.
fn host_resources() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    (cpus * 1000, mem_kib / 1024)
}

/// The inventory by `source`: see the module doc.
pub fn detect(node: &str, source: Source, file: Option<&Path>) -> Result<Inventory, String> {
    let declared_inv = match file {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| format!("--inventory {}: {e}", f.display()))?;
            Some(declared(node, &text, f)?)
        }
        None => None,
    };
    let nvml = match source {
        Source::Declared => None,
        Source::Nvml => Some(nvml_gpus()?),
        Source::Auto => nvml_gpus().ok().filter(|g| !g.is_empty()),
    };
    match (nvml, declared_inv) {
        (None, Some(d)) => Ok(d),
        (None, None) if source == Source::Declared => Err("--gpu-source declared needs --inventory FILE".into()),
        (None, None) => Err("no GPUs found through NVML (no NVIDIA driver here?) and no --inventory FILE declared".into()),
        (Some(gpus), d) => {
            let (cpu, mem) = host_resources();
            let mut spec = d.map(|d| d.spec).unwrap_or_else(|| json!({"name": node, "cpu_milli": cpu, "memory_mib": mem}));
            spec["gpu_model"] = json!(gpus.first().map(|g| g.name.clone()).unwrap_or_default());
            spec["gpu_count"] = json!(gpus.len());
            spec["gpu_memory_bytes"] = json!(gpus.iter().map(|g| g.memory_bytes).min().unwrap_or(0));
            Ok(Inventory { spec, gpus, source: "nvml" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_inventory_is_read_and_bad_ones_are_named() {
        let f = Path::new("inv.yaml");
        let inv = declared("n1", "cpu_milli: 8000\nmemory_mib: 16384\ngpu_model: L4\ngpu_count: 2\ngpu_memory_bytes: 1000\n", f).unwrap();
        assert_eq!(inv.spec["name"], "n1");
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!((inv.gpus[1].index, inv.gpus[1].name.as_str(), inv.gpus[1].memory_bytes), (1, "L4", 1000));
        let e = declared("n1", "cpu_milli: lots\nmemory_mib: 1\n", f).unwrap_err();
        assert!(e.starts_with("--inventory inv.yaml:") && e.contains("cpu_milli"), "{e}");
        let e = declared("n1", "name: n2\ncpu_milli: 1\nmemory_mib: 1\n", f).unwrap_err();
        assert!(e.contains("\"n2\" is not this node"), "{e}");
    }
}

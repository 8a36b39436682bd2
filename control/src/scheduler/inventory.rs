//! The cluster the scheduler places into: node specs (static) and what is free on them (dynamic).
//!
//! Everything a placement decision reads per candidate lives in [`NodeFree`], one small `Copy`
//! record per node with pre-aggregated GPU figures (free milli-GPU in total, on the emptiest
//! GPU, number of fully free GPUs), so scoring a node never walks its allocations. Per-GPU
//! state (free milli-GPU and free memory) is a flat vector indexed by the node's first GPU.
//! Every change to a node bumps its `version`, which is how policies cache per-node scores.
//!
//! GPU sharing follows the trace's model: a GPU is 1000 milli-GPU of compute; a pod asks for a
//! fraction of one GPU or for whole GPUs. Inference replicas also hold GPU memory, and
//! replicas of variants of one base model share one resident copy of the base weights per
//! GPU ([`SharedBase`]): the first replica on a GPU loads it, the last one to leave frees it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Compute units of one GPU.
pub const MILLI: u32 = 1000;
/// Upper bound on GPUs per node; lets the hot path use stack arrays.
pub const MAX_GPUS_PER_NODE: usize = 16;
/// Upper bound on distinct GPU models in one inventory ([`ModelSet`] is a 64-bit mask).
pub const MAX_MODELS: usize = 64;

/// Index of a node in its [`Cluster`].
pub type NodeId = u32;
/// Interned GPU model name.
pub type ModelId = u8;
/// Handle of a live allocation.
pub type AllocId = u32;

/// A set of GPU models (bit per interned model). Workloads that accept any model use [`ModelSet::ANY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelSet(pub u64);

impl ModelSet {
    pub const ANY: Self = Self(u64::MAX);
    pub const NONE: Self = Self(0);

    pub fn contains(self, m: ModelId) -> bool {
        self.0 >> m & 1 == 1
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Capacity pool of a node: on-demand, or spot (cheaper, reclaimable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    #[default]
    OnDemand,
    Spot,
}

/// Where a node sits; gangs ask to stay inside one rack, switch or zone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Topology {
    pub zone: String,
    pub rack: String,
    pub switch: String,
}

/// A topology level, from the tightest to the loosest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Switch,
    Rack,
    Zone,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Switch => "switch",
            Level::Rack => "rack",
            Level::Zone => "zone",
        })
    }
}

/// A node as configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// GPU model name (`""` for a CPU-only node).
    #[serde(default)]
    pub gpu_model: String,
    #[serde(default)]
    pub gpu_count: u8,
    /// Memory of each GPU.
    #[serde(default)]
    pub gpu_memory_bytes: u64,
    #[serde(default)]
    pub topology: Topology,
    #[serde(default)]
    pub pool: Pool,
    #[serde(default)]
    pub price_per_hour: f64,
    /// Spot nodes: expected hours until the provider reclaims the node (`None`: no estimate,
    /// treated as too risky for work that needs an uptime guarantee). Ignored on on-demand nodes.
    #[serde(default)]
    pub expected_uptime_hours: Option<f64>,
}

impl NodeSpec {
    /// A node in the trace's terms (on-demand, no topology, no GPU memory limit modelled).
    pub fn trace(name: &str, cpu_milli: u32, memory_mib: u64, gpus: u8, model: &str) -> Self {
        Self {
            name: name.to_string(),
            cpu_milli,
            memory_mib,
            gpu_model: model.to_string(),
            gpu_count: gpus,
            gpu_memory_bytes: 0,
            topology: Topology::default(),
            pool: Pool::OnDemand,
            price_per_hour: 0.0,
            expected_uptime_hours: None,
        }
    }

    /// Whether this node's expected uptime reaches `hours` (on-demand nodes always do).
    pub fn uptime_at_least(&self, hours: f64) -> bool {
        match self.pool {
            Pool::OnDemand => true,
            Pool::Spot => self.expected_uptime_hours.is_some_and(|u| u >= hours),
        }
    }
}

/// What is free on one node, with the GPU aggregates scoring needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFree {
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Free milli-GPU summed over the node's GPUs.
    pub gpu_milli: u32,
    /// Free milli-GPU of the emptiest GPU (0 without GPUs).
    pub max_gpu_milli: u32,
    /// GPUs with nothing allocated on them.
    pub full_gpus: u8,
    pub gpu_count: u8,
    pub model: ModelId,
    /// Bumped on every change; policies key their per-node caches on it.
    pub version: u32,
}

/// What is free on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFree {
    pub milli: u32,
    pub memory_bytes: u64,
}

/// A base model's weights resident on a GPU, shared by the replicas that use it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resident {
    pub base: String,
    pub bytes: u64,
    /// Replicas on this GPU referencing it.
    pub users: u32,
}

/// A share of one GPU held by an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuGrant {
    /// GPU index within the node.
    pub gpu: u8,
    pub milli: u32,
    /// GPU memory held by the allocation itself (shared base weights are accounted separately).
    pub memory_bytes: u64,
}

/// Base weights an allocation maps on each of its GPUs instead of owning a copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedBase {
    pub base: String,
    /// Bytes of the base per GPU (the whole model for a single-GPU replica).
    pub bytes: u64,
}

/// Resources held by one placed workload (one pod, one replica, or one gang worker).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// Name of the workload (a gang's workers share it).
    pub owner: String,
    pub node: NodeId,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpus: Vec<GpuGrant>,
    pub priority: i32,
    /// Gang this allocation belongs to: preemption evicts a gang whole or not at all.
    pub gang: Option<u32>,
    pub shared_base: Option<SharedBase>,
}

/// Why an allocation does not fit on its node right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shortfall {
    UnknownNode,
    Cpu,
    Memory,
    /// A GPU index that is out of range or repeated.
    BadGpu,
    GpuCompute,
    GpuMemory,
}

/// The inventory could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InventoryError {
    TooManyGpus { node: String, gpus: u8 },
    TooManyModels,
    DuplicateNode(String),
}

impl fmt::Display for InventoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyGpus { node, gpus } => write!(
                f,
                "node {node} has {gpus} GPUs; at most {MAX_GPUS_PER_NODE} are supported"
            ),
            Self::TooManyModels => write!(f, "more than {MAX_MODELS} distinct GPU models"),
            Self::DuplicateNode(n) => write!(f, "node {n} is listed twice"),
        }
    }
}

impl std::error::Error for InventoryError {}

/// Source of [`Cluster::id`]s.
static NEXT_CLUSTER_ID: AtomicU64 = AtomicU64::new(1);

/// Nodes, their free resources and the live allocations.
#[derive(Debug)]
pub struct Cluster {
    /// Distinct per instance (a clone gets a new one): node versions are only comparable
    /// within one instance, so caches keyed on versions also key on this.
    id: u64,
    specs: Vec<NodeSpec>,
    models: Vec<String>,
    free: Vec<NodeFree>,
    gpu_first: Vec<u32>,
    gpus: Vec<GpuFree>,
    residents: Vec<Vec<Resident>>,
    /// Interned (switch, rack, zone) per node, indexed by [`Level`].
    domains: Vec<[u32; 3]>,
    allocs: Vec<Option<Allocation>>,
    vacant: Vec<AllocId>,
    gpu_milli_capacity: u64,
    gpu_milli_allocated: u64,
}

impl Cluster {
    pub fn new(specs: Vec<NodeSpec>) -> Result<Self, InventoryError> {
        let mut models: Vec<String> = Vec::new();
        let mut names = HashMap::new();
        let mut domain_ids: [HashMap<String, u32>; 3] = Default::default();
        let mut free = Vec::with_capacity(specs.len());
        let mut gpu_first = Vec::with_capacity(specs.len());
        let mut gpus = Vec::new();
        let mut domains = Vec::with_capacity(specs.len());
        let mut capacity = 0u64;
        for (i, s) in specs.iter().enumerate() {
            if names.insert(s.name.clone(), i).is_some() {
                return Err(InventoryError::DuplicateNode(s.name.clone()));
            }
            if usize::from(s.gpu_count) > MAX_GPUS_PER_NODE {
                return Err(InventoryError::TooManyGpus {
                    node: s.name.clone(),
                    gpus: s.gpu_count,
                });
            }
            let model = match models.iter().position(|m| *m == s.gpu_model) {
                Some(m) => m,
                None => {
                    if models.len() == MAX_MODELS {
                        return Err(InventoryError::TooManyModels);
                    }
                    models.push(s.gpu_model.clone());
                    models.len() - 1
                }
            };
            gpu_first.push(gpus.len() as u32);
            for _ in 0..s.gpu_count {
                gpus.push(GpuFree {
                    milli: MILLI,
                    memory_bytes: s.gpu_memory_bytes,
                });
            }
            capacity += u64::from(s.gpu_count) * u64::from(MILLI);
            free.push(NodeFree {
                cpu_milli: s.cpu_milli,
                memory_mib: s.memory_mib,
                gpu_milli: u32::from(s.gpu_count) * MILLI,
                max_gpu_milli: if s.gpu_count > 0 { MILLI } else { 0 },
                full_gpus: s.gpu_count,
                gpu_count: s.gpu_count,
                model: model as ModelId,
                version: 0,
            });
            let t = &s.topology;
            let mut d = [0u32; 3];
            for (lvl, key) in [&t.switch, &t.rack, &t.zone].into_iter().enumerate() {
                // A switch or rack name is only meaningful inside its zone (and a switch inside
                // its rack), so the interned key carries the enclosing names.
                let full = match lvl {
                    0 => format!("{}/{}/{}", t.zone, t.rack, key),
                    1 => format!("{}/{}", t.zone, key),
                    _ => key.clone(),
                };
                let n = domain_ids[lvl].len() as u32;
                d[lvl] = *domain_ids[lvl].entry(full).or_insert(n);
            }
            domains.push(d);
        }
        let n_gpus = gpus.len();
        Ok(Self {
            id: NEXT_CLUSTER_ID.fetch_add(1, Ordering::Relaxed),
            specs,
            models,
            free,
            gpu_first,
            gpus,
            residents: vec![Vec::new(); n_gpus],
            domains,
            allocs: Vec::new(),
            vacant: Vec::new(),
            gpu_milli_capacity: capacity,
            gpu_milli_allocated: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Identity of this instance (see the field).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    pub fn spec(&self, n: NodeId) -> &NodeSpec {
        &self.specs[n as usize]
    }

    pub fn specs(&self) -> &[NodeSpec] {
        &self.specs
    }

    /// Free resources of every node, indexed by [`NodeId`].
    pub fn free(&self) -> &[NodeFree] {
        &self.free
    }

    pub fn node(&self, n: NodeId) -> &NodeFree {
        &self.free[n as usize]
    }

    /// Per-GPU free resources of node `n`.
    pub fn gpus(&self, n: NodeId) -> &[GpuFree] {
        let start = self.gpu_first[n as usize] as usize;
        &self.gpus[start..start + usize::from(self.free[n as usize].gpu_count)]
    }

    /// Bases resident on GPU `gpu` of node `n`.
    pub fn residents(&self, n: NodeId, gpu: u8) -> &[Resident] {
        &self.residents[self.gpu_first[n as usize] as usize + usize::from(gpu)]
    }

    /// Whether `base` (of `bytes` per GPU) is loaded on GPU `gpu` of node `n`. A base is
    /// identified by name and size: two artifacts that share a name but not a size are not
    /// the same weights, and sharing one for the other would under-count memory.
    pub fn is_resident(&self, n: NodeId, gpu: u8, base: &str, bytes: u64) -> bool {
        self.residents(n, gpu)
            .iter()
            .any(|r| r.base == base && r.bytes == bytes)
    }

    pub fn models(&self) -> &[String] {
        &self.models
    }

    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.models
            .iter()
            .position(|m| m == name)
            .map(|m| m as ModelId)
    }

    /// The models named in `spec` that exist here; an empty list accepts any model. Names not
    /// in the inventory are dropped, so a list of only unknown models is [`ModelSet::NONE`].
    pub fn model_set<S: AsRef<str>>(&self, spec: &[S]) -> ModelSet {
        if spec.is_empty() {
            return ModelSet::ANY;
        }
        let mut set = 0u64;
        for s in spec {
            if let Some(m) = self.model_id(s.as_ref()) {
                set |= 1 << m;
            }
        }
        ModelSet(set)
    }

    /// The node's interned domain at `level` (equal ids = same switch/rack/zone).
    pub fn domain(&self, n: NodeId, level: Level) -> u32 {
        self.domains[n as usize][level as usize]
    }

    /// Total and allocated milli-GPU over the cluster.
    pub fn gpu_milli_capacity(&self) -> u64 {
        self.gpu_milli_capacity
    }

    pub fn gpu_milli_allocated(&self) -> u64 {
        self.gpu_milli_allocated
    }

    /// Allocated GPU compute over all GPUs (the FGD paper's "GPU allocation ratio").
    pub fn gpu_alloc_ratio(&self) -> f64 {
        if self.gpu_milli_capacity == 0 {
            return 0.0;
        }
        self.gpu_milli_allocated as f64 / self.gpu_milli_capacity as f64
    }

    /// GPU memory in use (allocations' own memory plus resident bases).
    pub fn gpu_memory_used(&self) -> u64 {
        let mut used = 0;
        for (n, s) in self.specs.iter().enumerate() {
            for g in self.gpus(n as NodeId) {
                used += s.gpu_memory_bytes - g.memory_bytes;
            }
        }
        used
    }

    pub fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.allocs.get(id as usize).and_then(Option::as_ref)
    }

    /// Live allocations with their ids.
    pub fn allocations(&self) -> impl Iterator<Item = (AllocId, &Allocation)> {
        self.allocs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (i as AllocId, a)))
    }

    /// Whether node `n` models GPU memory (trace nodes do not: their GPU memory is 0).
    pub fn models_gpu_memory(&self, n: NodeId) -> bool {
        self.specs[n as usize].gpu_memory_bytes > 0
    }

    /// GPU memory `a` would take on its GPU `gpu`: its own bytes, plus the base unless resident
    /// (nothing where GPU memory is not modelled).
    fn memory_need(&self, a: &Allocation, g: &GpuGrant) -> u64 {
        if !self.models_gpu_memory(a.node) {
            return 0;
        }
        let base = match &a.shared_base {
            Some(b) if !self.is_resident(a.node, g.gpu, &b.base, b.bytes) => b.bytes,
            _ => 0,
        };
        g.memory_bytes + base
    }

    /// Checks that `a` fits its node now.
    pub fn check(&self, a: &Allocation) -> Result<(), Shortfall> {
        let Some(f) = self.free.get(a.node as usize) else {
            return Err(Shortfall::UnknownNode);
        };
        if a.cpu_milli > f.cpu_milli {
            return Err(Shortfall::Cpu);
        }
        if a.memory_mib > f.memory_mib {
            return Err(Shortfall::Memory);
        }
        let gpus = self.gpus(a.node);
        let mut seen = 0u32;
        for g in &a.gpus {
            if usize::from(g.gpu) >= gpus.len() || seen >> g.gpu & 1 == 1 {
                return Err(Shortfall::BadGpu);
            }
            seen |= 1 << g.gpu;
            let free = gpus[usize::from(g.gpu)];
            if g.milli > free.milli {
                return Err(Shortfall::GpuCompute);
            }
            if self.memory_need(a, g) > free.memory_bytes {
                return Err(Shortfall::GpuMemory);
            }
        }
        Ok(())
    }

    /// Takes the resources of `a` (after [`Cluster::check`]); returns its handle.
    pub fn allocate(&mut self, a: Allocation) -> Result<AllocId, Shortfall> {
        self.check(&a)?;
        let n = a.node as usize;
        let start = self.gpu_first[n] as usize;
        for g in &a.gpus {
            let idx = start + usize::from(g.gpu);
            let need = self.memory_need(&a, g);
            if let Some(b) = &a.shared_base {
                let res = &mut self.residents[idx];
                match res
                    .iter_mut()
                    .find(|r| r.base == b.base && r.bytes == b.bytes)
                {
                    Some(r) => r.users += 1,
                    None => res.push(Resident {
                        base: b.base.clone(),
                        bytes: b.bytes,
                        users: 1,
                    }),
                }
            }
            let gpu = &mut self.gpus[idx];
            gpu.milli -= g.milli;
            gpu.memory_bytes -= need;
            self.gpu_milli_allocated += u64::from(g.milli);
        }
        let f = &mut self.free[n];
        f.cpu_milli -= a.cpu_milli;
        f.memory_mib -= a.memory_mib;
        self.refresh(a.node);
        let id = match self.vacant.pop() {
            Some(id) => {
                self.allocs[id as usize] = Some(a);
                id
            }
            None => {
                self.allocs.push(Some(a));
                (self.allocs.len() - 1) as AllocId
            }
        };
        Ok(id)
    }

    /// Gives back the resources of allocation `id`; the last replica using a resident base
    /// on a GPU unloads it.
    pub fn release(&mut self, id: AllocId) -> Option<Allocation> {
        let a = self.allocs.get_mut(id as usize)?.take()?;
        self.vacant.push(id);
        let n = a.node as usize;
        let start = self.gpu_first[n] as usize;
        let modelled = self.models_gpu_memory(a.node);
        for g in &a.gpus {
            let idx = start + usize::from(g.gpu);
            let mut freed = g.memory_bytes;
            if let Some(b) = &a.shared_base {
                let res = &mut self.residents[idx];
                if let Some(pos) = res
                    .iter()
                    .position(|r| r.base == b.base && r.bytes == b.bytes)
                {
                    res[pos].users -= 1;
                    if res[pos].users == 0 {
                        freed += res.swap_remove(pos).bytes;
                    }
                }
            }
            if !modelled {
                freed = 0;
            }
            let gpu = &mut self.gpus[idx];
            gpu.milli += g.milli;
            gpu.memory_bytes += freed;
            self.gpu_milli_allocated -= u64::from(g.milli);
        }
        let f = &mut self.free[n];
        f.cpu_milli += a.cpu_milli;
        f.memory_mib += a.memory_mib;
        self.refresh(a.node);
        Some(a)
    }

    /// Recomputes node `n`'s GPU aggregates and bumps its version.
    fn refresh(&mut self, n: NodeId) {
        let (mut total, mut max, mut full) = (0, 0, 0);
        for g in self.gpus(n) {
            total += g.milli;
            max = max.max(g.milli);
            full += u8::from(g.milli == MILLI);
        }
        let f = &mut self.free[n as usize];
        f.gpu_milli = total;
        f.max_gpu_milli = max;
        f.full_gpus = full;
        f.version = f.version.wrapping_add(1);
    }
}

impl Clone for Cluster {
    fn clone(&self) -> Self {
        Self {
            id: NEXT_CLUSTER_ID.fetch_add(1, Ordering::Relaxed),
            specs: self.specs.clone(),
            models: self.models.clone(),
            free: self.free.clone(),
            gpu_first: self.gpu_first.clone(),
            gpus: self.gpus.clone(),
            residents: self.residents.clone(),
            domains: self.domains.clone(),
            allocs: self.allocs.clone(),
            vacant: self.vacant.clone(),
            gpu_milli_capacity: self.gpu_milli_capacity,
            gpu_milli_allocated: self.gpu_milli_allocated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gib(x: u64) -> u64 {
        x << 30
    }

    fn two_nodes() -> Cluster {
        let mut a = NodeSpec::trace("a", 8000, 32768, 2, "T4");
        a.gpu_memory_bytes = gib(16);
        let b = NodeSpec::trace("b", 4000, 8192, 0, "");
        Cluster::new(vec![a, b]).unwrap()
    }

    fn pod(node: NodeId, cpu: u32, gpus: Vec<GpuGrant>) -> Allocation {
        Allocation {
            owner: "p".into(),
            node,
            cpu_milli: cpu,
            memory_mib: 1024,
            gpus,
            priority: 0,
            gang: None,
            shared_base: None,
        }
    }

    fn grant(gpu: u8, milli: u32, mem: u64) -> GpuGrant {
        GpuGrant {
            gpu,
            milli,
            memory_bytes: mem,
        }
    }

    #[test]
    fn allocate_and_release_restore_aggregates() {
        let mut c = two_nodes();
        let before = *c.node(0);
        let id = c.allocate(pod(0, 1000, vec![grant(1, 300, 0)])).unwrap();
        let f = c.node(0);
        assert_eq!((f.gpu_milli, f.max_gpu_milli, f.full_gpus), (1700, 1000, 1));
        assert_eq!(f.cpu_milli, 7000);
        assert_eq!(c.gpu_milli_allocated(), 300);
        c.release(id).unwrap();
        let after = *c.node(0);
        assert_eq!(after.version, before.version + 2);
        assert_eq!(
            NodeFree {
                version: before.version,
                ..after
            },
            before
        );
        assert!(c.release(id).is_none(), "double release is a no-op");
    }

    #[test]
    fn over_commit_is_refused() {
        let mut c = two_nodes();
        assert_eq!(c.check(&pod(0, 9000, vec![])), Err(Shortfall::Cpu));
        c.allocate(pod(0, 0, vec![grant(0, 700, 0)])).unwrap();
        assert_eq!(
            c.check(&pod(0, 0, vec![grant(0, 400, 0)])),
            Err(Shortfall::GpuCompute)
        );
        assert_eq!(
            c.check(&pod(0, 0, vec![grant(1, 100, 0), grant(1, 100, 0)])),
            Err(Shortfall::BadGpu)
        );
        assert_eq!(
            c.check(&pod(0, 0, vec![grant(1, 100, gib(17))])),
            Err(Shortfall::GpuMemory)
        );
        assert_eq!(
            c.check(&pod(1, 0, vec![grant(0, 100, 0)])),
            Err(Shortfall::BadGpu)
        );
    }

    #[test]
    fn shared_base_is_loaded_once_and_unloaded_by_the_last_user() {
        let mut c = two_nodes();
        let replica = |delta| Allocation {
            shared_base: Some(SharedBase {
                base: "llama".into(),
                bytes: gib(10),
            }),
            ..pod(0, 0, vec![grant(0, 100, delta)])
        };
        let r1 = c.allocate(replica(gib(1))).unwrap();
        assert_eq!(c.gpus(0)[0].memory_bytes, gib(5));
        // A second variant pays only its own delta: 10 + 1 + 1 = 12 of 16 GiB.
        let r2 = c.allocate(replica(gib(1))).unwrap();
        assert_eq!(c.gpus(0)[0].memory_bytes, gib(4));
        assert!(c.is_resident(0, 0, "llama", gib(10)));
        // A 5 GiB delta no longer fits next to the resident base.
        assert_eq!(c.check(&replica(gib(5))), Err(Shortfall::GpuMemory));
        c.release(r1);
        assert!(c.is_resident(0, 0, "llama", gib(10)));
        c.release(r2);
        assert!(!c.is_resident(0, 0, "llama", gib(10)));
        assert_eq!(c.gpus(0)[0].memory_bytes, gib(16));
        assert_eq!(c.gpu_memory_used(), 0);
    }

    #[test]
    fn model_sets_and_domains() {
        let mut specs = vec![
            NodeSpec::trace("a", 1, 1, 1, "T4"),
            NodeSpec::trace("b", 1, 1, 1, "V100"),
            NodeSpec::trace("c", 1, 1, 1, "T4"),
        ];
        specs[0].topology.rack = "r1".into();
        specs[1].topology.rack = "r1".into();
        specs[2].topology.rack = "r2".into();
        let c = Cluster::new(specs).unwrap();
        let t4 = c.model_set(&["T4"]);
        assert!(t4.contains(c.node(0).model) && !t4.contains(c.node(1).model));
        assert_eq!(c.model_set::<&str>(&[]), ModelSet::ANY);
        assert_eq!(c.model_set(&["A100"]), ModelSet::NONE);
        assert_eq!(c.domain(0, Level::Rack), c.domain(1, Level::Rack));
        assert_ne!(c.domain(0, Level::Rack), c.domain(2, Level::Rack));
    }

    #[test]
    fn bad_inventories_are_refused() {
        let dup = vec![
            NodeSpec::trace("a", 1, 1, 0, ""),
            NodeSpec::trace("a", 1, 1, 0, ""),
        ];
        assert!(matches!(
            Cluster::new(dup),
            Err(InventoryError::DuplicateNode(_))
        ));
        let big = vec![NodeSpec::trace("a", 1, 1, 17, "X")];
        assert!(matches!(
            Cluster::new(big),
            Err(InventoryError::TooManyGpus { .. })
        ));
    }
}

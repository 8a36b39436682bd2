//! The model a weft reference server runs, as tensors in safetensors files:
//!
//! - a **base**: `layers.{i}.weight` of shape `[d, d]` for `i` in `0..L`, and `head.weight`
//!   of shape `[classes, d]`, all `F32`;
//! - a **delta** (one variant's own weights): for any of the base's layers a LoRA pair
//!   `layers.{i}.lora_a` `[r, d]` and `layers.{i}.lora_b` `[d, r]`, and/or its own
//!   `head.weight` `[classes, d]` replacing the base's.
//!
//! Tensors are packed into one run of `f32` ([`Packed`]) with every tensor 64-byte aligned, so
//! the same bytes can live on the heap or in a shared mapping and be read as `&[f32]` in place.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

/// Tensors start at multiples of this many floats (64 bytes: a cache line).
const ALIGN_FLOATS: usize = 16;

/// Where each tensor lies in a packed run of floats, and a checksum of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub tensors: BTreeMap<String, Entry>,
    /// Length of the packed run, in floats.
    pub floats: usize,
    /// [`checksum`] of the packed run: a receiver of a shared copy checks it (which also
    /// faults every page in, so the copy's memory is counted where it is used).
    pub checksum: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub shape: Vec<usize>,
    /// Offset in floats.
    pub offset: usize,
}

impl Entry {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// FNV-1a over the floats' bits: cheap, and any flipped or missing byte changes it.
pub fn checksum(floats: &[f32]) -> u64 {
    floats.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, f| (h ^ u64::from(f.to_bits())).wrapping_mul(0x0100_0000_01b3))
}

/// A packed run of tensors over any storage that reads as floats (a `Vec<f32>` on the heap,
/// a shared mapping).
pub struct Packed<S> {
    pub manifest: Manifest,
    pub storage: S,
}

impl<S: AsRef<[f32]>> Packed<S> {
    /// The tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<(&[usize], &[f32])> {
        let e = self.manifest.tensors.get(name)?;
        Some((&e.shape, &self.storage.as_ref()[e.offset..e.offset + e.len()]))
    }
}

/// Reads every tensor of a safetensors file into one packed run on the heap. Only `F32`
/// tensors are accepted (the reference server computes in f32).
pub fn read_packed(path: &Path) -> Result<Packed<Vec<f32>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: not a safetensors file: {e}", path.display()))?;
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut tensors = BTreeMap::new();
    let mut floats = 0usize;
    for name in &names {
        let t = st.tensor(name).map_err(|e| format!("{}: tensor {name}: {e}", path.display()))?;
        if t.dtype() != Dtype::F32 {
            return Err(format!("{}: tensor {name} is {:?}; only F32 is supported", path.display(), t.dtype()));
        }
        let entry = Entry { shape: t.shape().to_vec(), offset: floats.next_multiple_of(ALIGN_FLOATS) };
        floats = entry.offset + entry.len();
        tensors.insert(name.clone(), entry);
    }
    let mut data = vec![0f32; floats];
    for (name, e) in &tensors {
        let t = st.tensor(name).expect("listed above");
        for (dst, src) in data[e.offset..e.offset + e.len()].iter_mut().zip(t.data().chunks_exact(4)) {
            *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        }
    }
    let manifest = Manifest { tensors, floats, checksum: checksum(&data) };
    Ok(Packed { manifest, storage: data })
}

/// A base model's shape, checked: `layers` square `[d, d]` layers and a `[classes, d]` head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub layers: usize,
    pub d: usize,
    pub classes: usize,
}

/// A base model over its packed tensors.
pub struct Base<S> {
    pub packed: Packed<S>,
    pub dims: Dims,
}

fn layer_weight(i: usize) -> String {
    format!("layers.{i}.weight")
}

impl<S: AsRef<[f32]>> Base<S> {
    /// Checks that `packed` is a base (see the module docs), naming what is wrong.
    pub fn new(packed: Packed<S>) -> Result<Base<S>, String> {
        let t = &packed.manifest.tensors;
        let Some(first) = t.get(&layer_weight(0)) else { return Err("the base has no layers.0.weight".into()) };
        let d = first.shape.first().copied().unwrap_or(0);
        let layers = (0..).take_while(|i| t.contains_key(&layer_weight(*i))).count();
        for i in 0..layers {
            let s = &t[&layer_weight(i)].shape;
            if s != &[d, d] {
                return Err(format!("base tensor layers.{i}.weight has shape {s:?}, expected [{d}, {d}]"));
            }
        }
        let head = t.get("head.weight").ok_or("the base has no head.weight")?;
        let classes = match head.shape.as_slice() {
            [c, dd] if *dd == d && *c > 0 => *c,
            s => return Err(format!("base tensor head.weight has shape {s:?}, expected [classes, {d}]")),
        };
        let expected = layers + 1;
        if t.len() != expected {
            let extra: Vec<&String> =
                t.keys().filter(|k| *k != "head.weight" && !(0..layers).any(|i| **k == layer_weight(i))).collect();
            return Err(format!("the base has tensors that are not part of it: {extra:?}"));
        }
        Ok(Base { packed, dims: Dims { layers, d, classes } })
    }

    pub fn layer(&self, i: usize) -> &[f32] {
        self.packed.tensor(&layer_weight(i)).expect("checked in new").1
    }

    pub fn head(&self) -> &[f32] {
        self.packed.tensor("head.weight").expect("checked in new").1
    }
}

/// One variant's delta, checked against its base's dims.
pub struct Delta {
    pub packed: Packed<Vec<f32>>,
    /// Per base layer: its LoRA pair's rank, if the delta adapts it.
    pub lora: Vec<Option<usize>>,
    pub head: bool,
}

impl Delta {
    /// Checks `packed` against `dims`, naming the tensor and shapes that do not match.
    pub fn new(packed: Packed<Vec<f32>>, dims: Dims) -> Result<Delta, String> {
        let mut lora = vec![None; dims.layers];
        let mut head = false;
        let t = &packed.manifest.tensors;
        for (name, e) in t {
            let shape = e.shape.as_slice();
            if name == "head.weight" {
                if shape != [dims.classes, dims.d] {
                    return Err(format!(
                        "delta tensor head.weight has shape {shape:?}; the base's head is [{}, {}]",
                        dims.classes, dims.d
                    ));
                }
                head = true;
                continue;
            }
            let parsed = name.strip_prefix("layers.").and_then(|r| r.split_once('.'));
            let Some((index, part)) = parsed else { return Err(format!("delta tensor {name} is not a LoRA pair or a head")) };
            let Ok(i) = index.parse::<usize>() else { return Err(format!("delta tensor {name}: {index:?} is not a layer index")) };
            if i >= dims.layers {
                return Err(format!("delta tensor {name}: the base has {} layers", dims.layers));
            }
            match part {
                "lora_a" => {
                    let (r, b) = match (shape, t.get(&format!("layers.{i}.lora_b"))) {
                        ([r, d], Some(b)) if *d == dims.d && *r > 0 => (*r, b),
                        (_, None) => return Err(format!("delta tensor {name} has no layers.{i}.lora_b")),
                        _ => {
                            return Err(format!("delta tensor {name} has shape {shape:?}, expected [rank, {}] (the base's d)", dims.d));
                        }
                    };
                    if b.shape != [dims.d, r] {
                        return Err(format!("delta tensor layers.{i}.lora_b has shape {:?}, expected [{}, {r}]", b.shape, dims.d));
                    }
                    lora[i] = Some(r);
                }
                "lora_b" if t.contains_key(&format!("layers.{i}.lora_a")) => {}
                "lora_b" => return Err(format!("delta tensor {name} has no layers.{i}.lora_a")),
                _ => return Err(format!("delta tensor {name} is not a LoRA pair (lora_a, lora_b) or a head")),
            }
        }
        Ok(Delta { packed, lora, head })
    }

    /// The LoRA pair of layer `i`: `(rank, A [r, d], B [d, r])`.
    pub fn lora(&self, i: usize) -> Option<(usize, &[f32], &[f32])> {
        let r = self.lora.get(i).copied().flatten()?;
        let a = self.packed.tensor(&format!("layers.{i}.lora_a"))?.1;
        let b = self.packed.tensor(&format!("layers.{i}.lora_b"))?.1;
        Some((r, a, b))
    }

    pub fn head(&self) -> Option<&[f32]> {
        self.head.then(|| self.packed.tensor("head.weight").map(|t| t.1)).flatten()
    }
}

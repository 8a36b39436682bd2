//! Writes base and delta safetensors files with seeded random weights, for tests, the
//! `weight-share` bench and demos (`weft-agent make-base`, `make-delta`). Weights are scaled
//! by 1/sqrt(d) so activations stay bounded through any number of layers.

use std::path::Path;

use safetensors::{Dtype, tensor::TensorView};

use super::model::Dims;

/// SplitMix64: a seeded, dependency-free source of reproducible weights.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn tensor(&mut self, n: usize, scale: f32) -> Vec<u8> {
        (0..n).flat_map(|_| (self.next_f32() * scale).to_le_bytes()).collect()
    }
}

fn write(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<u8>)>) -> Result<(), String> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, bytes)| TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (n.clone(), v)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A base of `dims` (about `4·L·d²` bytes).
pub fn base(path: &Path, dims: Dims, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let scale = 1.0 / (dims.d as f32).sqrt();
    let mut tensors: Vec<_> =
        (0..dims.layers).map(|i| (format!("layers.{i}.weight"), vec![dims.d, dims.d], rng.tensor(dims.d * dims.d, scale * 1.7))).collect();
    tensors.push(("head.weight".into(), vec![dims.classes, dims.d], rng.tensor(dims.classes * dims.d, scale)));
    write(path, tensors)
}

/// A delta for a base of `dims`: a rank-`rank` LoRA pair on every layer (none when 0) and,
/// with `head`, its own head.
pub fn delta(path: &Path, dims: Dims, rank: usize, head: bool, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let scale = 1.0 / (dims.d as f32).sqrt();
    let mut tensors = Vec::new();
    for i in 0..dims.layers {
        if rank > 0 {
            tensors.push((format!("layers.{i}.lora_a"), vec![rank, dims.d], rng.tensor(rank * dims.d, scale)));
            tensors.push((format!("layers.{i}.lora_b"), vec![dims.d, rank], rng.tensor(dims.d * rank, 1.0 / (rank as f32).sqrt())));
        }
    }
    if head {
        tensors.push(("head.weight".into(), vec![dims.classes, dims.d], rng.tensor(dims.classes * dims.d, scale)));
    }
    write(path, tensors)
}

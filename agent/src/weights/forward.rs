//! The forward step: `x` through every layer (`W x`, plus `B (A x)` where the variant adapts
//! the layer, then ReLU), then the head. Small, but real: every base weight is read and a
//! variant's delta changes the answer, so an output says which variant computed it.

use super::model::{Base, Delta};

/// `out = M x` for a row-major `[rows, cols]` matrix.
fn matvec(m: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(m.chunks_exact(cols)) {
        *o = dot(row, x);
    }
}

/// A dot product in eight lanes (a plain `sum()` of f32 is sequential: floats do not
/// reassociate, so the compiler cannot vectorize it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The logits for input `x` (of length d; shorter inputs are zero-padded, longer cut).
pub fn forward<S: AsRef<[f32]>>(base: &Base<S>, delta: Option<&Delta>, input: &[f32]) -> Vec<f32> {
    let d = base.dims.d;
    let mut x = vec![0f32; d];
    for (xi, v) in x.iter_mut().zip(input) {
        *xi = *v;
    }
    let mut y = vec![0f32; d];
    let mut t = Vec::new();
    let mut u = vec![0f32; d];
    for i in 0..base.dims.layers {
        matvec(base.layer(i), d, &x, &mut y);
        if let Some((r, a, b)) = delta.and_then(|dl| dl.lora(i)) {
            t.resize(r, 0.0);
            matvec(a, d, &x, &mut t);
            matvec(b, r, &t, &mut u);
            y.iter_mut().zip(&u).for_each(|(yi, ui)| *yi += ui);
        }
        y.iter_mut().for_each(|v| *v = v.max(0.0));
        std::mem::swap(&mut x, &mut y);
    }
    let head = delta.and_then(Delta::head).unwrap_or_else(|| base.head());
    let mut logits = vec![0f32; base.dims.classes];
    matvec(head, d, &x, &mut logits);
    logits
}

/// Index of the largest logit (the answer's class).
pub fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, v)| if *v > bv { (i, *v) } else { (bi, bv) }).0
}

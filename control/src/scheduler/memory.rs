//! GPU memory of a training worker, from the model's shape (seed 001's estimator).
//!
//! Training memory is dominated by per-parameter state, so it is estimated per parameter:
//! weights, gradients, optimizer state (Adam keeps m and v), and under mixed precision an fp32
//! master copy of the weights beside the half-precision ones. Activations are estimated as
//! `batch × seq × hidden × bytes × multiplier`, the multiplier covering FFN intermediates and
//! temporary buffers. Framework overhead (CUDA context, allocator caching, workspaces) is a
//! flat addition. The scheduler uses the total to decide which GPUs a gang worker fits on.

use serde::{Deserialize, Serialize};

/// Number format of weights, gradients and activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in 4-byte floats.
    #[default]
    Fp32,
    /// 2-byte weights, gradients and activations, plus a 4-byte master copy of the weights;
    /// optimizer state stays 4-byte.
    Mixed,
}

impl Precision {
    fn bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Mixed => 2,
        }
    }
}

/// Optimizer, by how many fp32 values of state it keeps per parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    Sgd,
    Momentum,
    /// m and v.
    #[default]
    Adam,
}

impl Optimizer {
    fn states(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::Momentum => 1,
            Optimizer::Adam => 2,
        }
    }
}

/// The model and run shape to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingShape {
    pub params: u64,
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub optimizer: Optimizer,
    pub batch: u64,
    pub seq: u64,
    pub hidden: u64,
    /// Headroom over one `batch × seq × hidden` activation tensor.
    #[serde(default = "default_multiplier")]
    pub activation_multiplier: f64,
    /// CUDA context, allocator caching and workspaces.
    #[serde(default = "default_overhead")]
    pub overhead_bytes: u64,
}

fn default_multiplier() -> f64 {
    3.0
}

/// 2.5 GB: the middle of the 2–4 GB the seed gives for framework overhead.
fn default_overhead() -> u64 {
    2_500_000_000
}

impl TrainingShape {
    /// A shape with the default activation multiplier (×3) and overhead (2.5 GB).
    pub fn new(
        params: u64,
        precision: Precision,
        optimizer: Optimizer,
        batch: u64,
        seq: u64,
        hidden: u64,
    ) -> Self {
        Self {
            params,
            precision,
            optimizer,
            batch,
            seq,
            hidden,
            activation_multiplier: default_multiplier(),
            overhead_bytes: default_overhead(),
        }
    }

    pub fn estimate(&self) -> MemoryEstimate {
        let b = self.precision.bytes();
        let activations =
            (self.batch * self.seq * self.hidden * b) as f64 * self.activation_multiplier;
        MemoryEstimate {
            weights: self.params * b,
            gradients: self.params * b,
            optimizer: self.params * 4 * self.optimizer.states(),
            master_weights: match self.precision {
                Precision::Fp32 => 0,
                Precision::Mixed => self.params * 4,
            },
            activations: activations.round() as u64,
            overhead: self.overhead_bytes,
        }
    }
}

/// The estimate, term by term (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub master_weights: u64,
    pub activations: u64,
    pub overhead: u64,
}

impl MemoryEstimate {
    /// Per-parameter state: weights, gradients, optimizer, master copy.
    pub fn model_states(&self) -> u64 {
        self.weights + self.gradients + self.optimizer + self.master_weights
    }

    /// Everything but the framework overhead.
    pub fn without_overhead(&self) -> u64 {
        self.model_states() + self.activations
    }

    pub fn total(&self) -> u64 {
        self.without_overhead() + self.overhead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    /// The seed's worked example: 2B parameters, fp32, Adam, batch 8, seq 512, hidden 4096.
    #[test]
    fn seed_worked_example() {
        let e = TrainingShape::new(
            2_000_000_000,
            Precision::Fp32,
            Optimizer::Adam,
            8,
            512,
            4096,
        )
        .estimate();
        assert_eq!(e.weights, 8_000_000_000);
        assert_eq!(e.gradients, 8_000_000_000);
        assert_eq!(e.optimizer, 16_000_000_000);
        assert_eq!(e.model_states(), 32_000_000_000, "8 + 8 + 16 = 32 GB");
        // 8 × 512 × 4096 × 4 B = 64 MiB, ×3 headroom ≈ 0.2 GB.
        assert_eq!(e.activations, 3 * 67_108_864);
        assert!((e.activations as f64 / GB - 0.2).abs() < 0.01);
        assert!(
            (e.without_overhead() as f64 / GB - 32.2).abs() < 0.01,
            "≈ 32.2 GB"
        );
        let total = e.total() as f64 / GB;
        assert!(
            (34.0..=36.0).contains(&total),
            "34-36 GB with overhead, got {total}"
        );
    }

    /// Mixed precision, the seed's alternative: fp16 weights (4 GB) + fp32 master (8 GB) +
    /// fp16 grads (4 GB) + fp32 m and v (16 GB) = 32 GB of state for 2B parameters.
    #[test]
    fn mixed_precision_keeps_an_fp32_master_copy() {
        let e = TrainingShape::new(
            2_000_000_000,
            Precision::Mixed,
            Optimizer::Adam,
            8,
            512,
            4096,
        )
        .estimate();
        assert_eq!(e.weights, 4_000_000_000);
        assert_eq!(e.master_weights, 8_000_000_000);
        assert_eq!(e.gradients, 4_000_000_000);
        assert_eq!(e.optimizer, 16_000_000_000);
        assert_eq!(e.model_states(), 32_000_000_000);
        assert_eq!(
            e.activations,
            3 * 33_554_432,
            "activations halve at 2 bytes"
        );
    }

    #[test]
    fn sgd_keeps_no_optimizer_state() {
        let e = TrainingShape::new(1_000, Precision::Fp32, Optimizer::Sgd, 1, 1, 1).estimate();
        assert_eq!(e.optimizer, 0);
        let m = TrainingShape::new(1_000, Precision::Fp32, Optimizer::Momentum, 1, 1, 1).estimate();
        assert_eq!(m.optimizer, 4_000);
    }
}

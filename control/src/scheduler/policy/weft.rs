//! weft's placement policy for GPU-sharing tasks (work in progress: starts as FGD).

use std::sync::Arc;

use super::fgd::FragCache;
use super::{Best, Choice, Shape, TargetDistribution};
use crate::scheduler::inventory::{Cluster, NodeId};
use crate::scheduler::rng::SplitMix64;

pub struct WeftScorer {
    cache: FragCache,
}

impl WeftScorer {
    pub fn new(target: Arc<TargetDistribution>) -> Self {
        Self {
            cache: FragCache::new(target),
        }
    }

    pub fn choose(
        &mut self,
        cluster: &Cluster,
        shape: &Shape,
        allowed: Option<&dyn Fn(NodeId) -> bool>,
        rng: &mut SplitMix64,
    ) -> Option<Choice> {
        let mut best = Best::new();
        let key = Shape {
            memory_mib: 0,
            ..*shape
        };
        self.cache.scan(cluster, &key, allowed, |n, f, d| {
            if f.memory_mib >= shape.memory_mib {
                best.offer(d.frag, Choice { node: n, gpus: d.gpus }, rng);
            }
        });
        best.choice()
    }
}

//! The toy training workload of the training end-to-end test (`weft-toy-trainer`): a dataset
//! of shards whose records are deterministic numbers, and a "model" that folds every record
//! it trains on into a sum and a count. The fold is commutative, so the result over the whole
//! dataset is one number whatever the rank count, order or rescales: a shard lost or counted
//! twice changes it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Record `i` of shard `shard`.
pub fn record(shard: &str, i: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in shard.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h ^ mix(i))
}

/// The model: a sum of mixed records and how many there were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Model {
    pub sum: u64,
    pub count: u64,
}

impl Model {
    pub fn train(&mut self, record: u64) {
        self.sum = self.sum.wrapping_add(mix(record.rotate_left(17)));
        self.count += 1;
    }

    pub fn merge(&mut self, o: Model) {
        self.sum = self.sum.wrapping_add(o.sum);
        self.count += o.count;
    }
}

/// Shard ids as the control plane names them.
pub fn shard_id(i: usize) -> String {
    format!("shard-{i:05}")
}

/// The single-process result over the whole dataset.
pub fn whole(sizes: &[u64]) -> Model {
    let mut m = Model::default();
    for (i, &n) in sizes.iter().enumerate() {
        let id = shard_id(i);
        for j in 0..n {
            m.train(record(&id, j));
        }
    }
    m
}

/// One rank's checkpoint file: its model and the read offset of each shard it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub rank: u32,
    pub step: u64,
    pub map_version: u64,
    pub model: Model,
    pub offsets: BTreeMap<String, u64>,
}

impl Snapshot {
    pub fn to_json(&self) -> Value {
        json!({"rank": self.rank, "step": self.step, "map_version": self.map_version,
            "sum": self.model.sum.to_string(), "count": self.model.count, "offsets": self.offsets})
    }

    pub fn from_json(v: &Value) -> Result<Snapshot, String> {
        let n = |k: &str| v[k].as_u64().ok_or_else(|| format!("checkpoint: {k} missing"));
        Ok(Snapshot {
            rank: n("rank")? as u32,
            step: n("step")?,
            map_version: n("map_version")?,
            model: Model {
                sum: v["sum"].as_str().and_then(|s| s.parse().ok()).ok_or("checkpoint: sum missing")?,
                count: n("count")?,
            },
            offsets: serde_json::from_value(v["offsets"].clone()).map_err(|e| format!("checkpoint offsets: {e}"))?,
        })
    }

    pub fn read(path: &str) -> Result<Snapshot, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        Snapshot::from_json(&serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?)
    }
}

/// The model and shard offsets of a complete checkpoint (its manifest's `parts`): the sum of
/// every rank's model, and every shard's offset from the rank that owned it.
pub fn restore(parts: &[Value]) -> Result<(Model, BTreeMap<String, u64>), String> {
    let mut model = Model::default();
    let mut offsets = BTreeMap::new();
    for p in parts {
        let s = Snapshot::read(p["location"].as_str().ok_or("manifest part without location")?)?;
        model.merge(s.model);
        for (k, v) in s.offsets {
            if offsets.insert(k.clone(), v).is_some() {
                return Err(format!("shard {k} is in two ranks' checkpoints"));
            }
        }
    }
    Ok((model, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fold_does_not_depend_on_order() {
        let sizes = [5, 3, 8];
        let mut rev = Model::default();
        for (i, &n) in sizes.iter().enumerate().rev() {
            for j in (0..n).rev() {
                rev.train(record(&shard_id(i), j));
            }
        }
        assert_eq!(rev, whole(&sizes));
        let mut twice = whole(&sizes);
        twice.train(record(&shard_id(0), 0));
        assert_ne!(twice.sum, whole(&sizes).sum, "a record counted twice shows");
    }
}

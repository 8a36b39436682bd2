//! Variant assignment: which variant of an experiment serves a request. Pure logic.
//!
//! Order of precedence: an allowed override header naming a variant; else a sticky choice by
//! hashing the unit id with the experiment salt (same unit → same variant in every sidecar and
//! across restarts, since the hash is a fixed function, not std's randomized SipHash); else a
//! weighted random choice. Weights come from the request's stratum when one is configured.

use std::collections::HashMap;

/// Cumulative weights for one weight vector.
#[derive(Debug, Clone)]
struct Table {
    cumulative: Vec<u64>,
    total: u64,
}

impl Table {
    fn new(weights: &[u32]) -> Table {
        let mut acc = 0u64;
        let cumulative = weights
            .iter()
            .map(|w| {
                acc += *w as u64;
                acc
            })
            .collect();
        Table { cumulative, total: acc }
    }

    /// Map a uniform 64-bit value onto a variant index by weight.
    fn pick(&self, x: u64) -> usize {
        let point = ((x as u128 * self.total as u128) >> 64) as u64;
        self.cumulative.partition_point(|c| *c <= point)
    }
}

#[derive(Debug, Clone)]
pub struct Assigner {
    names: Vec<String>,
    salt: String,
    default: Table,
    strata: HashMap<String, Table>,
}

/// Why a variant was chosen; reported in telemetry so overrides don't pollute A/B statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Override,
    Sticky,
    Random,
}

impl Assigner {
    /// `variants`: (name, weight); `strata`: stratum → per-variant-name weights.
    pub fn new(
        variants: &[(String, u32)],
        salt: &str,
        strata: &HashMap<String, HashMap<String, u32>>,
    ) -> Result<Assigner, String> {
        let names: Vec<String> = variants.iter().map(|(n, _)| n.clone()).collect();
        let weights: Vec<u32> = variants.iter().map(|(_, w)| *w).collect();
        let default = Table::new(&weights);
        if default.total == 0 {
            return Err("variants: weights sum to 0; give at least one variant a weight".into());
        }
        let mut tables = HashMap::new();
        for (stratum, ws) in strata {
            for name in ws.keys() {
                if !names.contains(name) {
                    return Err(format!("stratify.weights.{stratum}: unknown variant {name:?}"));
                }
            }
            let w: Vec<u32> = names.iter().map(|n| ws.get(n).copied().unwrap_or(0)).collect();
            let t = Table::new(&w);
            if t.total == 0 {
                return Err(format!("stratify.weights.{stratum}: weights sum to 0"));
            }
            tables.insert(stratum.clone(), t);
        }
        Ok(Assigner { names, salt: salt.to_string(), default, strata: tables })
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Choose a variant. `random` is called only when neither override nor unit id decide.
    pub fn assign(
        &self,
        override_to: Option<&str>,
        unit: Option<&[u8]>,
        stratum: Option<&str>,
        random: impl FnOnce() -> u64,
    ) -> (usize, Reason) {
        if let Some(i) = override_to.and_then(|n| self.index_of(n)) {
            return (i, Reason::Override);
        }
        let table = stratum.and_then(|s| self.strata.get(s)).unwrap_or(&self.default);
        match unit {
            Some(u) if !u.is_empty() => (table.pick(sticky_hash(&self.salt, u)), Reason::Sticky),
            _ => (table.pick(random()), Reason::Random),
        }
    }
}

/// FNV-1a over salt, a separator and the unit id, then a splitmix64 finalizer so every output
/// bit depends on every input bit (FNV alone is weak in the high bits we use).
pub fn sticky_hash(salt: &str, unit: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in salt.as_bytes().iter().chain(&[0xff]).chain(unit) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ab(wa: u32, wb: u32) -> Assigner {
        Assigner::new(&[("a".into(), wa), ("b".into(), wb)], "s1", &HashMap::new()).unwrap()
    }

    #[test]
    fn sticky_is_stable_and_salt_rerandomizes() {
        let a = ab(50, 50);
        let other = Assigner::new(&[("a".into(), 50), ("b".into(), 50)], "s2", &HashMap::new()).unwrap();
        let mut moved = 0;
        for u in 0..2000 {
            let id = format!("user-{u}");
            let (v1, r) = a.assign(None, Some(id.as_bytes()), None, || unreachable!());
            assert_eq!(r, Reason::Sticky);
            assert_eq!(a.assign(None, Some(id.as_bytes()), None, || 0).0, v1);
            if other.assign(None, Some(id.as_bytes()), None, || 0).0 != v1 {
                moved += 1;
            }
        }
        // A new salt re-randomizes: about half the units change variant.
        assert!((800..1200).contains(&moved), "moved {moved}");
    }

    #[test]
    fn sticky_split_follows_weights() {
        let a = ab(90, 10);
        let n = 20_000;
        let b = (0..n)
            .filter(|u| a.assign(None, Some(format!("u{u}").as_bytes()), None, || 0).0 == 1)
            .count();
        assert!((1700..2300).contains(&b), "b got {b} of {n}");
    }

    #[test]
    fn override_and_zero_weight() {
        let a = ab(100, 0);
        assert_eq!(a.assign(Some("b"), None, None, || 0), (1, Reason::Override));
        assert_eq!(a.assign(Some("nope"), None, None, || u64::MAX).0, 0);
        assert_eq!(a.assign(None, None, None, || u64::MAX).0, 0);
        assert!(Assigner::new(&[("a".into(), 0)], "", &HashMap::new()).is_err());
    }

    #[test]
    fn strata_use_their_own_weights() {
        let mut strata = HashMap::new();
        strata.insert("gold".to_string(), HashMap::from([("b".to_string(), 1)]));
        let a = Assigner::new(&[("a".into(), 1), ("b".into(), 0)], "", &strata).unwrap();
        assert_eq!(a.assign(None, Some(b"x"), Some("gold"), || 0).0, 1);
        assert_eq!(a.assign(None, Some(b"x"), Some("silver"), || 0).0, 0);
        let bad = HashMap::from([("gold".to_string(), HashMap::from([("z".to_string(), 1)]))]);
        let e = Assigner::new(&[("a".into(), 1)], "", &bad).unwrap_err();
        assert!(e.contains("\"z\""), "{e}");
    }

    #[test]
    fn random_edges_map_inside_range() {
        let a = ab(1, 1);
        assert_eq!(a.assign(None, None, None, || 0).0, 0);
        assert_eq!(a.assign(None, None, None, || u64::MAX).0, 1);
    }
}

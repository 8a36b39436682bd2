//! Which endpoint was last sent which prompt blocks: the picker's estimate of each server's
//! prefix cache (as GIE's prefix-cache scorer keeps one), so a prompt that shares a long
//! prefix with an earlier one can go where that prefix's KV blocks probably still are.
//! Bounded: past `capacity` (block, endpoint) entries the least recently sent are forgotten,
//! as the server's own cache evicts them.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

pub struct PrefixIndex<K> {
    /// Block hash → the endpoints it was sent to, with the tick of the last send.
    map: HashMap<u64, Vec<(K, u64)>>,
    /// Every send in order, for eviction; entries re-sent since are stale and skipped.
    order: VecDeque<(u64, K, u64)>,
    live: usize,
    tick: u64,
    capacity: usize,
}

impl<K: Clone + Eq + Hash> PrefixIndex<K> {
    pub fn new(capacity: usize) -> Self {
        PrefixIndex { map: HashMap::new(), order: VecDeque::new(), live: 0, tick: 0, capacity: capacity.max(1) }
    }

    /// Notes that `blocks` were sent to `endpoint`.
    pub fn record(&mut self, blocks: &[u64], endpoint: &K) {
        for &b in blocks {
            self.tick += 1;
            let holders = self.map.entry(b).or_default();
            match holders.iter_mut().find(|(k, _)| k == endpoint) {
                Some(h) => h.1 = self.tick,
                None => {
                    holders.push((endpoint.clone(), self.tick));
                    self.live += 1;
                }
            }
            self.order.push_back((b, endpoint.clone(), self.tick));
        }
        while self.live > self.capacity {
            let Some((b, k, t)) = self.order.pop_front() else { break };
            if self.is_current(b, &k, t) {
                self.remove(b, &k);
            }
        }
        if self.order.len() > 2 * self.capacity {
            let order = std::mem::take(&mut self.order);
            self.order = order.into_iter().filter(|(b, k, t)| self.is_current(*b, k, *t)).collect();
        }
    }

    fn is_current(&self, block: u64, endpoint: &K, tick: u64) -> bool {
        self.map.get(&block).is_some_and(|hs| hs.iter().any(|(k, t)| k == endpoint && *t == tick))
    }

    fn remove(&mut self, block: u64, endpoint: &K) {
        if let Some(hs) = self.map.get_mut(&block) {
            let before = hs.len();
            hs.retain(|(k, _)| k != endpoint);
            self.live -= before - hs.len();
            if hs.is_empty() {
                self.map.remove(&block);
            }
        }
    }

    /// How many of `blocks`, from the first, were sent to `endpoint` (and not forgotten).
    pub fn matched(&self, blocks: &[u64], endpoint: &K) -> usize {
        blocks.iter().take_while(|b| self.map.get(b).is_some_and(|hs| hs.iter().any(|(k, _)| k == endpoint))).count()
    }

    /// (block, endpoint) entries held.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_prefix_matches_where_it_was_sent_and_only_there() {
        let mut idx = PrefixIndex::new(1000);
        idx.record(&[1, 2, 3], &"a");
        idx.record(&[1, 9], &"b");
        assert_eq!(idx.matched(&[1, 2, 3, 4], &"a"), 3);
        assert_eq!(idx.matched(&[1, 2, 3, 4], &"b"), 1, "only the leading run counts");
        assert_eq!(idx.matched(&[7, 2, 3], &"a"), 0, "only a run from the first block counts");
        assert_eq!(idx.matched(&[1], &"c"), 0);
    }

    #[test]
    fn past_capacity_the_least_recently_sent_blocks_are_forgotten() {
        let mut idx = PrefixIndex::new(4);
        idx.record(&[1, 2], &"a");
        idx.record(&[3, 4], &"a");
        idx.record(&[1, 2], &"a"); // re-sent: now the newest
        idx.record(&[5, 6], &"a");
        assert_eq!(idx.len(), 4);
        assert_eq!(idx.matched(&[1, 2], &"a"), 2, "re-sent blocks survive");
        assert_eq!(idx.matched(&[3, 4], &"a"), 0, "the oldest went");
        // The same prompt sent again and again keeps the log bounded.
        for _ in 0..1000 {
            idx.record(&[1, 2], &"a");
        }
        assert!(idx.order.len() <= 8 + 2, "{}", idx.order.len());
        assert_eq!(idx.matched(&[5, 6], &"a"), 2);
    }
}

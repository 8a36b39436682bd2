//! The LLM mode's engine: a continuous-batching scheduler as vLLM runs one, in simulated time
//! (pure: the server drives it and sleeps each step's duration).
//!
//! Each step admits waiting sequences in arrival order while one fits (a running slot, KV blocks
//! for its prompt and its `max_tokens`, as a server that never preempts reserves them, and its
//! adapter loaded or loadable), then runs up to `max_batch_tokens` of prefill, oldest first,
//! and one decode token for every sequence already decoding. A prompt's leading blocks found in
//! the prefix cache need no prefill; a finished sequence's prompt blocks stay cached until
//! evicted, least recently used first. The step lasts `step_ms + prefill tokens ·
//! prefill_ms_per_token + decoding sequences · decode_ms_per_seq`, plus `adapter_load_ms` for each
//! adapter loaded in it.

use std::collections::{HashMap, VecDeque};

#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// KV-cache blocks, and tokens per block.
    pub kv_blocks: u32,
    pub block_tokens: u32,
    /// Sequences in the running batch at most (vLLM's max_num_seqs).
    pub max_running: usize,
    /// Prefill tokens per step at most (chunked prefill's budget).
    pub max_batch_tokens: u32,
    pub step_ms: f64,
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_seq: f64,
    pub adapter_load_ms: f64,
    /// Adapters held at once (vLLM's max_loras).
    pub max_adapters: usize,
}

impl Default for EngineConfig {
    /// Near a 7-8B model on one H100-class GPU: ~30 k prefill tokens/s, ~20 ms decode steps
    /// for a full batch, 32 k tokens of KV cache.
    fn default() -> Self {
        EngineConfig {
            kv_blocks: 2048,
            block_tokens: 16,
            max_running: 64,
            max_batch_tokens: 2048,
            step_ms: 6.0,
            prefill_ms_per_token: 0.033,
            decode_ms_per_seq: 0.2,
            adapter_load_ms: 150.0,
            max_adapters: 4,
        }
    }
}

impl EngineConfig {
    pub fn validate(&self) -> Result<(), String> {
        let checks = [
            (self.kv_blocks > 0, "--kv-blocks must be > 0"),
            (self.block_tokens > 0, "--block-tokens must be > 0"),
            (self.max_running > 0, "--max-running must be > 0"),
            (self.max_batch_tokens > 0, "--max-batch-tokens must be > 0"),
            (self.max_adapters > 0, "--max-adapters must be > 0"),
        ];
        for (ok, msg) in checks {
            if !ok {
                return Err(msg.into());
            }
        }
        for (v, flag) in [(self.step_ms, "--step-ms"), (self.prefill_ms_per_token, "--prefill-ms-per-token"), (self.decode_ms_per_seq, "--decode-ms-per-seq"), (self.adapter_load_ms, "--adapter-load-ms")] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{flag}: {v} must be ≥ 0"));
            }
        }
        Ok(())
    }
}

/// A request as the engine takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seq {
    pub id: u64,
    /// Hashes of the prompt's full blocks (chained, so equal hashes mean equal prefixes).
    pub blocks: Vec<u64>,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub adapter: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The prefill finished: the first token (`cached` prompt tokens came from the cache).
    First { id: u64, cached: u32 },
    Token { id: u64 },
    /// The last token was sent.
    Done { id: u64 },
}

struct Running {
    seq: Seq,
    /// Prompt tokens still to prefill.
    to_prefill: u32,
    cached: u32,
    generated: u32,
    /// Blocks reserved for it beyond the shared cached prompt blocks it references.
    own_blocks: u32,
    /// Prompt blocks it references in the cache (pinned while it runs).
    pinned: Vec<u64>,
}

#[derive(Default)]
pub struct Engine {
    cfg: EngineConfig,
    waiting: VecDeque<Seq>,
    running: Vec<Running>,
    /// Cached prompt blocks → how many running sequences reference it.
    cache: HashMap<u64, u32>,
    /// Cached blocks no sequence references, least recently used first (evictable).
    idle: VecDeque<u64>,
    /// Blocks reserved by running sequences (not counting the cached ones they share).
    reserved: u32,
    /// Loaded adapters, least recently used first.
    adapters: VecDeque<String>,
}

/// What `/metrics` shows (vLLM's names).
#[derive(Clone, Debug, PartialEq)]
pub struct Gauges {
    pub waiting: usize,
    pub running: usize,
    pub kv_usage: f64,
    pub running_adapters: Vec<String>,
    pub waiting_adapters: Vec<String>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine { cfg, ..Engine::default() }
    }

    pub fn submit(&mut self, seq: Seq) {
        self.waiting.push_back(seq);
    }

    /// A sequence the client gave up on leaves the queue or the batch.
    pub fn cancel(&mut self, id: u64) {
        self.waiting.retain(|s| s.id != id);
        if let Some(i) = self.running.iter().position(|r| r.seq.id == id) {
            let r = self.running.swap_remove(i);
            self.release(r);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Blocks in use: reserved plus cached (referenced or idle).
    fn used(&self) -> u32 {
        self.reserved + self.cache.len() as u32
    }

    pub fn gauges(&self) -> Gauges {
        let names = |it: &mut dyn Iterator<Item = &Option<String>>| {
            let mut v: Vec<String> = it.flatten().cloned().collect();
            v.sort();
            v.dedup();
            v
        };
        // Idle cached blocks are free to reuse, as vLLM counts them: usage is what is pinned.
        let pinned = self.reserved + (self.cache.len() - self.idle.len()) as u32;
        Gauges {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_usage: pinned as f64 / self.cfg.kv_blocks as f64,
            running_adapters: names(&mut self.running.iter().map(|r| &r.seq.adapter)),
            waiting_adapters: names(&mut self.waiting.iter().map(|s| &s.adapter)),
        }
    }

    /// Frees `n` blocks' room by evicting idle cached blocks; false if there are not enough.
    fn make_room(&mut self, n: u32) -> bool {
        while self.used() + n > self.cfg.kv_blocks {
            let Some(b) = self.idle.pop_front() else { return false };
            self.cache.remove(&b);
        }
        true
    }

    fn release(&mut self, r: Running) {
        self.reserved -= r.own_blocks;
        self.unpin(&r.pinned);
    }

    /// Drops one reference to each cached block; unreferenced ones become evictable.
    fn unpin(&mut self, blocks: &[u64]) {
        for b in blocks {
            if let Some(refs) = self.cache.get_mut(b) {
                *refs -= 1;
                if *refs == 0 {
                    self.idle.push_back(*b);
                }
            }
        }
    }

    /// Admits the head of the queue if it fits; the adapter it needs loaded (and whether that
    /// took a load).
    fn admit(&mut self) -> Option<bool> {
        let seq = self.waiting.front()?;
        if self.running.len() >= self.cfg.max_running {
            return None;
        }
        let mut load = false;
        if let Some(a) = &seq.adapter
            && !self.adapters.contains(a)
        {
            let in_use = |name: &String| self.running.iter().any(|r| r.seq.adapter.as_ref() == Some(name));
            if self.adapters.len() >= self.cfg.max_adapters {
                let evict = self.adapters.iter().position(|n| !in_use(n))?;
                self.adapters.remove(evict);
            }
            load = true;
        }
        let bt = self.cfg.block_tokens;
        let hit = seq.blocks.iter().take_while(|b| self.cache.contains_key(b)).count();
        // Cached blocks and the whole prompt are prefilled at most to the last token (the
        // last one is always computed, to give the first token's logits).
        let cached = ((hit as u32) * bt).min(seq.prompt_tokens.saturating_sub(1));
        let total = (seq.prompt_tokens + seq.max_tokens).div_ceil(bt);
        let own = total.saturating_sub(hit as u32);
        // Pin the hits first so making room cannot evict them.
        let hits: Vec<u64> = seq.blocks[..hit].to_vec();
        for b in &hits {
            let refs = self.cache.get_mut(b).expect("hit");
            if *refs == 0 {
                self.idle.retain(|x| x != b);
            }
            *refs += 1;
        }
        if !self.make_room(own) {
            self.unpin(&hits);
            return None;
        }
        let seq = self.waiting.pop_front().expect("front");
        if let Some(a) = &seq.adapter {
            self.adapters.retain(|n| n != a);
            self.adapters.push_back(a.clone());
        }
        self.reserved += own;
        self.running.push(Running { to_prefill: seq.prompt_tokens - cached, cached, generated: 0, own_blocks: own, pinned: hits, seq });
        Some(load)
    }

    /// One step: its duration in ms and what happened by its end; `None` when there is
    /// nothing to do.
    pub fn step(&mut self) -> Option<(f64, Vec<Event>)> {
        let mut ms = self.cfg.step_ms;
        while let Some(loaded) = self.admit() {
            if loaded {
                ms += self.cfg.adapter_load_ms;
            }
        }
        if self.running.is_empty() {
            // Nothing fits (a prompt larger than the whole cache): refuse it rather than spin.
            return None;
        }
        let mut events = Vec::new();
        let mut budget = self.cfg.max_batch_tokens;
        let mut decoding = 0;
        for r in &mut self.running {
            if r.to_prefill > 0 {
                let n = r.to_prefill.min(budget);
                budget -= n;
                r.to_prefill -= n;
                ms += n as f64 * self.cfg.prefill_ms_per_token;
                if r.to_prefill == 0 {
                    r.generated = 1;
                    events.push(Event::First { id: r.seq.id, cached: r.cached });
                }
            } else {
                decoding += 1;
                r.generated += 1;
                events.push(Event::Token { id: r.seq.id });
            }
        }
        ms += decoding as f64 * self.cfg.decode_ms_per_seq;
        // Finished prompts' blocks enter the cache; finished sequences leave.
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.to_prefill == 0 && r.generated == 1 && r.pinned.len() < r.seq.blocks.len() {
                self.cache_prompt(i);
            }
            let r = &self.running[i];
            if r.to_prefill == 0 && r.generated >= r.seq.max_tokens {
                events.push(Event::Done { id: r.seq.id });
                let r = self.running.swap_remove(i);
                self.release(r);
            } else {
                i += 1;
            }
        }
        Some((ms, events))
    }

    /// Moves a just-prefilled prompt's full blocks from its own reservation into the cache
    /// (pinned by it), so later prompts sharing the prefix find them.
    fn cache_prompt(&mut self, i: usize) {
        let r = &mut self.running[i];
        let new: Vec<u64> = r.seq.blocks[r.pinned.len()..].to_vec();
        for b in new {
            match self.cache.get_mut(&b) {
                Some(refs) => {
                    if *refs == 0 {
                        self.idle.retain(|x| *x != b);
                    }
                    *refs += 1;
                }
                None => {
                    // The block moves from its reservation to the cache: same room.
                    self.cache.insert(b, 1);
                    r.own_blocks -= 1;
                    self.reserved -= 1;
                }
            }
            r.pinned.push(b);
        }
    }

    /// The queue's head, when it can never fit (larger than the whole cache); taken out.
    pub fn refuse_unfit(&mut self) -> Option<Seq> {
        let head = self.waiting.front()?;
        let need = (head.prompt_tokens + head.max_tokens).div_ceil(self.cfg.block_tokens);
        (need > self.cfg.kv_blocks).then(|| self.waiting.pop_front()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: u64, blocks: Vec<u64>, prompt: u32, max: u32) -> Seq {
        Seq { id, blocks, prompt_tokens: prompt, max_tokens: max, adapter: None }
    }

    /// Runs until idle; each id's (time of first token, time done, cached tokens).
    fn run(e: &mut Engine) -> HashMap<u64, (f64, f64, u32)> {
        let mut t = 0.0;
        let mut out: HashMap<u64, (f64, f64, u32)> = HashMap::new();
        while let Some((ms, events)) = e.step() {
            t += ms;
            for ev in events {
                match ev {
                    Event::First { id, cached } => {
                        out.insert(id, (t, 0.0, cached));
                    }
                    // A first token from a step the test ran itself is not seen here.
                    Event::Done { id } => out.entry(id).or_insert((f64::NAN, 0.0, 0)).1 = t,
                    Event::Token { .. } => {}
                }
            }
        }
        out
    }

    fn cfg() -> EngineConfig {
        EngineConfig { step_ms: 1.0, prefill_ms_per_token: 0.01, decode_ms_per_seq: 0.1, ..EngineConfig::default() }
    }

    #[test]
    fn prefill_cost_grows_with_the_prompt_and_decode_with_the_output() {
        let mut e = Engine::new(cfg());
        e.submit(seq(1, vec![], 1000, 10));
        let r = run(&mut e)[&1];
        assert!((r.0 - (1.0 + 10.0)).abs() < 1e-9, "one step with 1000 prefill tokens: {r:?}");
        assert!((r.1 - r.0 - 9.0 * 1.1).abs() < 1e-9, "nine decode steps: {r:?}");
        let mut e = Engine::new(cfg());
        e.submit(seq(1, vec![], 5000, 1));
        let r = run(&mut e)[&1];
        assert!(r.0 > 3.0 * 1.0 + 49.9, "chunked over three steps: {r:?}");
        assert!(e.is_idle());
    }

    #[test]
    fn a_repeated_prefix_is_not_prefilled_again() {
        let mut e = Engine::new(cfg());
        let blocks: Vec<u64> = (1..=50).collect(); // 800 tokens
        e.submit(seq(1, blocks.clone(), 820, 2));
        let first = run(&mut e)[&1];
        assert_eq!(first.2, 0);
        e.submit(seq(2, blocks.clone(), 820, 2));
        let second = run(&mut e)[&2];
        assert_eq!(second.2, 800, "the 50 cached blocks");
        assert!(second.0 < first.0 / 3.0, "{second:?} vs {first:?}");
        // Another prefix shares nothing.
        e.submit(seq(3, (100..150).collect(), 820, 2));
        assert_eq!(run(&mut e)[&3].2, 0);
    }

    #[test]
    fn the_kv_cache_bounds_the_batch_and_queued_requests_wait() {
        // Room for two sequences of 64 + 64 tokens (8 blocks each) in 16 blocks.
        let mut e = Engine::new(EngineConfig { kv_blocks: 16, ..cfg() });
        for id in 1..=3 {
            e.submit(seq(id, vec![], 64, 64));
        }
        e.step().unwrap();
        let g = e.gauges();
        assert_eq!((g.running, g.waiting), (2, 1));
        assert!((g.kv_usage - 1.0).abs() < 1e-9, "{g:?}");
        let r = run(&mut e);
        assert!(r[&3].0 > r[&1].1, "the third starts after one finished: {r:?}");
        // A prompt bigger than the whole cache is refused, not left to block the queue.
        e.submit(seq(9, vec![], 1000, 10));
        assert!(e.step().is_none());
        assert_eq!(e.refuse_unfit().map(|s| s.id), Some(9));
    }

    #[test]
    fn adapters_load_once_within_the_slots_and_show_in_the_gauges() {
        let mut e = Engine::new(EngineConfig { max_adapters: 1, ..cfg() });
        let with = |id, a: &str| Seq { adapter: Some(a.into()), ..seq(id, vec![], 10, 3) };
        e.submit(with(1, "sql"));
        e.submit(with(2, "sql"));
        e.submit(with(3, "chat"));
        let (ms, _) = e.step().unwrap();
        assert!((150.0..300.0).contains(&ms), "one load for both sql requests: {ms}");
        let g = e.gauges();
        assert_eq!(g.running_adapters, vec!["sql".to_string()]);
        assert_eq!(g.waiting_adapters, vec!["chat".to_string()], "no slot for chat while sql runs");
        let r = run(&mut e);
        assert!(r[&3].0 > r[&1].1, "chat waited for the slot: {r:?}");
    }

    #[test]
    fn a_cancelled_sequence_frees_its_room() {
        let mut e = Engine::new(EngineConfig { kv_blocks: 8, ..cfg() });
        e.submit(seq(1, vec![], 64, 64));
        e.submit(seq(2, vec![], 64, 64));
        e.step();
        assert_eq!(e.gauges().waiting, 1);
        e.cancel(1);
        e.step();
        assert_eq!((e.gauges().running, e.gauges().waiting), (1, 0));
    }
}

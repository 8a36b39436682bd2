//! The inference picker (`lb: inference`): filters, then scores, then picks, from what each
//! endpoint's server reports ([`Signals`]), what this sidecar itself has in flight there, and
//! what the request is (its model or adapter, its prompt's length and leading blocks).
//!
//! Filters, in order, each skipped when it would leave nothing:
//! 1. adapter: a request for an adapter some endpoint has loaded goes to one that has it
//!    loaded or has a free adapter slot;
//! 2. saturation: endpoints whose KV cache is at `kv_threshold` or whose queue is at
//!    `queue_threshold` are left out. When every endpoint is saturated a `sheddable` request
//!    is refused (429 with Retry-After, as GIE sheds); `standard` and `critical` ones go on.
//!
//! Scoring (`weft`): the estimated prefill work ahead of the request's first token, in
//! tokens, lowest wins: what this sidecar sent there and is still waiting for the first token
//! of (exact and current, where a scrape is up to one interval old), plus the server's queue
//! beyond that (other clients' requests, at the mean prompt length seen), plus a share of its
//! running batch (decode steps slow prefill down), plus the request's own prompt less the
//! prefix probably cached there, plus an adapter load where it is not loaded, plus a penalty
//! when its KV cache is near full (the request would wait for blocks or preempt). So prefix
//! affinity holds only while it saves more than the extra queue costs.
//!
//! `gie_default` is the Gateway API Inference Extension's default profile as its docs give it,
//! kept as the baseline the `inference-routing` bench measures against: queue-scorer (weight
//! 1), kv-cache-utilization-scorer (1) and prefix-cache-scorer (3), max-score picker, on the
//! scraped metrics alone; sheddable requests are refused when every endpoint is saturated
//! (queue ≥ 5 or KV ≥ 0.8, its saturation detector's defaults).

use std::fmt::Write as _;

use super::metrics::Signals;

/// How much a request matters when every endpoint is saturated (header `x-weft-criticality`,
/// GIE's criticality levels).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Criticality {
    Critical,
    #[default]
    Standard,
    Sheddable,
}

impl Criticality {
    pub const HEADER: &'static str = "x-weft-criticality";

    /// The header's value; an unknown one is an error naming it (the caller answers 400).
    pub fn parse(v: Option<&str>) -> Result<Criticality, String> {
        match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("standard") => Ok(Criticality::Standard),
            Some("critical") => Ok(Criticality::Critical),
            Some("sheddable") => Ok(Criticality::Sheddable),
            Some(other) => Err(format!("{}: {other:?} is not critical, standard or sheddable", Self::HEADER)),
        }
    }
}

/// Which scoring the picker runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scoring {
    #[default]
    Weft,
    GieDefault,
}

/// The picker's knobs (a cluster's `inference:` block).
#[derive(Clone, Debug, PartialEq)]
pub struct Knobs {
    pub scoring: Scoring,
    /// KV-cache use at which an endpoint counts as saturated.
    pub kv_threshold: f64,
    /// Queued requests at which an endpoint counts as saturated.
    pub queue_threshold: f64,
    /// Tokens of prefill one running request is worth (its decode steps share the batch).
    pub running_weight: f64,
    /// Tokens of prefill an adapter load costs where the adapter is not loaded.
    pub adapter_load_tokens: f64,
    /// Tokens of prefill added when KV use is at the threshold, growing linearly above it.
    pub kv_penalty_tokens: f64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs { scoring: Scoring::Weft, kv_threshold: 0.8, queue_threshold: 5.0, running_weight: 16.0, adapter_load_tokens: 2048.0, kv_penalty_tokens: 4096.0 }
    }
}

/// What the picker knows of one endpoint for this request.
#[derive(Clone, Debug, Default)]
pub struct View<'a> {
    /// The server's last report, if it is fresh (stale signals are passed as `None`).
    pub signals: Option<&'a Signals>,
    /// This sidecar's requests to it still waiting for their first token: how many, and their
    /// uncached prompt tokens.
    pub pending: u32,
    pub pending_tokens: f64,
    /// This request's leading blocks probably cached there.
    pub prefix_blocks: usize,
    /// May take traffic (not ejected, not already tried by this request).
    pub available: bool,
}

/// The request, as the picker sees it.
#[derive(Clone, Debug, Default)]
pub struct Ask<'a> {
    pub model: Option<&'a str>,
    pub blocks: usize,
    pub prompt_tokens: f64,
    /// Mean prompt tokens this picker has seen (for queued requests of unknown length).
    pub mean_prompt_tokens: f64,
    pub criticality: Criticality,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Send it to endpoint `index`; `reason` goes to the access log.
    Pick { index: usize, reason: String },
    /// Refuse it (429); `reason` is the response's message.
    Shed { reason: String },
    /// No endpoint may take traffic.
    None,
}

fn saturated(s: &Signals, k: &Knobs) -> bool {
    s.waiting >= k.queue_threshold || s.kv_usage.is_some_and(|kv| kv >= k.kv_threshold)
}

/// Keeps the candidates `keep` accepts, unless that leaves none.
fn narrow(cands: &mut Vec<usize>, keep: impl Fn(usize) -> bool) -> bool {
    let kept: Vec<usize> = cands.iter().copied().filter(|&i| keep(i)).collect();
    let narrowed = !kept.is_empty() && kept.len() < cands.len();
    if !kept.is_empty() {
        *cands = kept;
    }
    narrowed
}

/// Picks an endpoint for `ask` among `views`; `random(n)` is a uniform index below `n`, for
/// ties.
pub fn pick(knobs: &Knobs, ask: &Ask, views: &[View], mut random: impl FnMut(usize) -> usize) -> Decision {
    let mut cands: Vec<usize> = (0..views.len()).filter(|&i| views[i].available).collect();
    if cands.is_empty() {
        return Decision::None;
    }
    let mut notes = String::new();
    let has = |i: usize, m: &str| views[i].signals.is_some_and(|s| s.adapters.contains(m));
    let loaded = |i: usize| ask.model.is_some_and(|m| has(i, m));
    let is_adapter = ask.model.is_some_and(|m| cands.iter().any(|&i| has(i, m)));
    if is_adapter && knobs.scoring == Scoring::Weft {
        let slot = |i: usize| views[i].signals.is_some_and(|s| s.max_adapters.is_some_and(|m| (s.adapters.len() as u32) < m));
        if narrow(&mut cands, |i| loaded(i) || slot(i)) {
            notes.push_str(" adapter-filter");
        }
    }
    let sat = |i: usize| views[i].signals.is_some_and(|s| saturated(s, knobs));
    let all_saturated = cands.iter().all(|&i| sat(i));
    if all_saturated {
        if ask.criticality == Criticality::Sheddable {
            return Decision::Shed { reason: format!("every endpoint is saturated (queue ≥ {} or KV cache ≥ {}) and the request is sheddable", knobs.queue_threshold, knobs.kv_threshold) };
        }
        notes.push_str(" all-saturated");
    } else if knobs.scoring == Scoring::Weft && narrow(&mut cands, |i| !sat(i)) {
        notes.push_str(" saturation-filter");
    }
    let (best, score, why) = match knobs.scoring {
        Scoring::Weft => {
            let cost = |i: usize| -> f64 {
                let v = &views[i];
                let mut c = v.pending_tokens + (ask.prompt_tokens - cached_tokens(ask, v.prefix_blocks)).max(0.0);
                if let Some(s) = v.signals {
                    c += (s.waiting - v.pending as f64).max(0.0) * ask.mean_prompt_tokens + s.running * knobs.running_weight;
                    if let Some(kv) = s.kv_usage
                        && kv >= knobs.kv_threshold
                    {
                        c += knobs.kv_penalty_tokens * (1.0 + (kv - knobs.kv_threshold) / (1.0 - knobs.kv_threshold).max(1e-3));
                    }
                }
                if is_adapter && !loaded(i) {
                    c += knobs.adapter_load_tokens;
                }
                c
            };
            let (best, c) = argbest(&cands, |i| -cost(i), &mut random);
            (best, -c, "est-prefill-tokens")
        }
        Scoring::GieDefault => {
            let q = |i: usize| views[i].signals.map_or(0.0, |s| s.waiting);
            let (lo, hi) = cands.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &i| (lo.min(q(i)), hi.max(q(i))));
            let score = |i: usize| -> f64 {
                let queue = if hi > lo { (hi - q(i)) / (hi - lo) } else { 1.0 };
                let kv = 1.0 - views[i].signals.and_then(|s| s.kv_usage).unwrap_or(0.0);
                let prefix = if ask.blocks == 0 { 0.0 } else { views[i].prefix_blocks as f64 / ask.blocks as f64 };
                queue + kv + 3.0 * prefix
            };
            let (best, s) = argbest(&cands, score, &mut random);
            (best, s, "gie-score")
        }
    };
    let v = &views[best];
    let mut reason = format!("{why}={score:.0} prefix={}/{} pending={}", v.prefix_blocks, ask.blocks, v.pending);
    match v.signals {
        Some(s) => {
            let _ = write!(reason, " queue={} running={}", s.waiting, s.running);
            if let Some(kv) = s.kv_usage {
                let _ = write!(reason, " kv={kv:.2}");
            }
        }
        None => reason.push_str(" signals=stale"),
    }
    if is_adapter {
        reason.push_str(if loaded(best) { " adapter=loaded" } else { " adapter=load" });
    }
    reason.push_str(&notes);
    Decision::Pick { index: best, reason }
}

/// Tokens of the prompt covered by `blocks` cached blocks.
fn cached_tokens(ask: &Ask, blocks: usize) -> f64 {
    ((blocks * super::request::BLOCK_CHARS) as f64 / super::request::CHARS_PER_TOKEN).min(ask.prompt_tokens)
}

/// The candidate with the highest `score`, ties broken at random.
fn argbest(cands: &[usize], score: impl Fn(usize) -> f64, random: &mut impl FnMut(usize) -> usize) -> (usize, f64) {
    let scores: Vec<f64> = cands.iter().map(|&i| score(i)).collect();
    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tied: Vec<usize> = cands.iter().zip(&scores).filter(|(_, s)| **s >= top - 1e-9).map(|(&i, _)| i).collect();
    (tied[random(tied.len())], top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::prefix::PrefixIndex;

    fn sig(waiting: f64, running: f64, kv: f64) -> Signals {
        Signals { waiting, running, kv_usage: Some(kv), ..Signals::default() }
    }

    fn view(s: &Signals) -> View<'_> {
        View { signals: Some(s), available: true, ..View::default() }
    }

    fn ask(prompt_tokens: f64) -> Ask<'static> {
        Ask { prompt_tokens, mean_prompt_tokens: 500.0, ..Ask::default() }
    }

    fn picked(d: Decision) -> usize {
        match d {
            Decision::Pick { index, .. } => index,
            other => panic!("expected a pick, got {other:?}"),
        }
    }

    #[test]
    fn the_shortest_queue_of_work_wins_counting_own_requests_the_scrape_has_not_seen() {
        let (a, b) = (sig(2.0, 4.0, 0.3), sig(0.0, 4.0, 0.3));
        let k = Knobs::default();
        assert_eq!(picked(pick(&k, &ask(100.0), &[view(&a), view(&b)], |_| 0)), 1, "b's queue is empty");
        // b just got 3 long prompts from this sidecar the last scrape did not show yet.
        let b_busy = View { pending: 3, pending_tokens: 6000.0, ..view(&b) };
        assert_eq!(picked(pick(&k, &ask(100.0), &[view(&a), b_busy], |_| 0)), 0);
    }

    #[test]
    fn saturated_endpoints_are_filtered_out_while_others_can_take_it() {
        let k = Knobs::default();
        let (full_kv, long_queue, ok) = (sig(0.0, 1.0, 0.95), sig(6.0, 1.0, 0.1), sig(3.0, 8.0, 0.5));
        let d = pick(&k, &ask(10.0), &[view(&full_kv), view(&long_queue), view(&ok)], |_| 0);
        let Decision::Pick { index, reason } = d else { panic!() };
        assert_eq!(index, 2);
        assert!(reason.contains("saturation-filter"), "{reason}");
    }

    #[test]
    fn a_saturated_pool_sheds_sheddable_requests_only() {
        let k = Knobs::default();
        let (a, b) = (sig(9.0, 8.0, 0.9), sig(5.0, 8.0, 0.99));
        let views = [view(&a), view(&b)];
        for scoring in [Scoring::Weft, Scoring::GieDefault] {
            let k = Knobs { scoring, ..k.clone() };
            let shed = pick(&k, &Ask { criticality: Criticality::Sheddable, ..ask(10.0) }, &views, |_| 0);
            assert!(matches!(&shed, Decision::Shed { reason } if reason.contains("sheddable")), "{scoring:?}: {shed:?}");
            for c in [Criticality::Standard, Criticality::Critical] {
                let Decision::Pick { reason, .. } = pick(&k, &Ask { criticality: c, ..ask(10.0) }, &views, |_| 0) else { panic!("{c:?} is served") };
                assert!(reason.contains("all-saturated"), "{reason}");
            }
        }
        // One endpoint with room: nothing is shed.
        let c = sig(0.0, 1.0, 0.1);
        assert_eq!(picked(pick(&k, &Ask { criticality: Criticality::Sheddable, ..ask(10.0) }, &[view(&a), view(&b), view(&c)], |_| 0)), 2);
        assert_eq!(Criticality::parse(Some("Sheddable")), Ok(Criticality::Sheddable));
        assert!(Criticality::parse(Some("urgent")).unwrap_err().contains("\"urgent\""));
    }

    #[test]
    fn stale_signals_neither_filter_nor_shed() {
        // The caller passes stale signals as None: an endpoint last seen saturated is not
        // avoided on that old word, and a sheddable request is not refused on it.
        let k = Knobs::default();
        let fresh_full = sig(9.0, 8.0, 0.95);
        let stale = View { available: true, ..View::default() };
        let d = pick(&k, &Ask { criticality: Criticality::Sheddable, ..ask(10.0) }, &[view(&fresh_full), stale], |_| 0);
        let Decision::Pick { index, reason } = d else { panic!("{d:?}") };
        assert_eq!(index, 1);
        assert!(reason.contains("signals=stale"), "{reason}");
    }

    #[test]
    fn an_adapter_goes_where_it_is_loaded_or_can_be_unless_that_endpoint_is_far_busier() {
        let with = |waiting: f64, adapters: &[&str], max: u32| Signals {
            waiting,
            running: 2.0,
            kv_usage: Some(0.2),
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            max_adapters: Some(max),
        };
        let (loaded, no_slot, free_slot) = (with(1.0, &["sql"], 2), with(0.0, &["x", "y"], 2), with(0.0, &["x"], 2));
        let k = Knobs::default();
        let a = Ask { model: Some("sql"), ..ask(200.0) };
        let views = [view(&loaded), view(&no_slot), view(&free_slot)];
        let Decision::Pick { index, reason } = pick(&k, &a, &views, |_| 0) else { panic!() };
        assert_eq!(index, 0, "loaded, one short request queued, beats an adapter load: {reason}");
        assert!(reason.contains("adapter=loaded") && reason.contains("adapter-filter"), "{reason}");
        // The loaded endpoint is now far behind: load it on the one with a free slot, never
        // on the one without.
        let busy = View { pending: 4, pending_tokens: 20_000.0, ..view(&loaded) };
        let Decision::Pick { index, reason } = pick(&k, &a, &[busy, view(&no_slot), view(&free_slot)], |_| 0) else { panic!() };
        assert_eq!(index, 2, "{reason}");
        assert!(reason.contains("adapter=load"), "{reason}");
        // A base-model request is not filtered by adapters.
        assert_eq!(picked(pick(&k, &Ask { model: Some("base"), ..ask(200.0) }, &views, |_| 0)), 1, "the full-slots endpoint ties with the free one");
    }

    /// Repeated prefixes stick to one endpoint while it keeps up, and move once it is
    /// overloaded.
    #[test]
    fn prefix_affinity_holds_until_the_endpoint_is_overloaded() {
        let k = Knobs::default();
        let blocks: Vec<u64> = (0..32).collect(); // a 2 KiB shared prefix, ~512 tokens
        let idle = [sig(0.0, 2.0, 0.3), sig(0.0, 2.0, 0.3), sig(0.0, 2.0, 0.3), sig(0.0, 2.0, 0.3)];
        let mut idx = PrefixIndex::new(10_000);
        let mut rng = 0usize;
        let mut random = |n: usize| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let mut chosen = Vec::new();
        for _ in 0..20 {
            let views: Vec<View> = (0..4).map(|e| View { prefix_blocks: idx.matched(&blocks, &e), ..view(&idle[e]) }).collect();
            let a = Ask { blocks: blocks.len(), ..ask(600.0) };
            let e = picked(pick(&k, &a, &views, &mut random));
            idx.record(&blocks, &e);
            chosen.push(e);
        }
        assert!(chosen.iter().all(|&e| e == chosen[0]), "one endpoint keeps the prefix: {chosen:?}");
        // It now has a backlog worth more than the prefix saves: the next goes elsewhere.
        let e0 = chosen[0];
        let views: Vec<View> = (0..4)
            .map(|e| View { prefix_blocks: idx.matched(&blocks, &e), pending: if e == e0 { 6 } else { 0 }, pending_tokens: if e == e0 { 3000.0 } else { 0.0 }, ..view(&idle[e]) })
            .collect();
        let Decision::Pick { index, reason } = pick(&k, &Ask { blocks: blocks.len(), ..ask(600.0) }, &views, &mut random) else { panic!() };
        assert_ne!(index, e0, "{reason}");
        assert!(reason.contains("prefix=0/32"), "{reason}");
    }

    /// The baseline as GIE documents it: prefix weight 3 outweighs queue and KV together, so
    /// a cached prefix wins even on the endpoint with the longest queue.
    #[test]
    fn gie_default_scores_queue_kv_and_prefix_one_one_three() {
        let k = Knobs { scoring: Scoring::GieDefault, ..Knobs::default() };
        let (busy, idle) = (sig(4.0, 8.0, 0.7), sig(0.0, 1.0, 0.1));
        let a = Ask { blocks: 10, ..ask(100.0) };
        let views = [View { prefix_blocks: 10, ..view(&busy) }, view(&idle)];
        let Decision::Pick { index, reason } = pick(&k, &a, &views, |_| 0) else { panic!() };
        assert_eq!(index, 0, "3·1 + 0 + 0.3 > 0 + 1 + 0.9: {reason}");
        assert!(reason.starts_with("gie-score=3"), "{reason}");
        let views = [View { prefix_blocks: 5, ..view(&busy) }, view(&idle)];
        assert_eq!(picked(pick(&k, &a, &views, |_| 0)), 1, "3·0.5 + 0.3 < 1.9");
    }
}

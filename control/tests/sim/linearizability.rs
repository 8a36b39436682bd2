//! A linearizability checker for the store's key/value register with revisions.
//!
//! The search is Wing & Gong's, with Lowe's memoization as in Knossos and Porcupine: walk the
//! history as a list of call and return events; at a call, try to linearize that operation
//! (apply it to the model) and start over from the first remaining event; at a return whose
//! operation has not been linearized yet, undo the last choice. A cache of (set of linearized
//! operations, model state) pairs already explored cuts the search from factorial to roughly
//! linear on real histories. Keys are checked independently (P-compositionality: every
//! operation touches one key, and a history is linearizable iff each key's sub-history is).
//!
//! Why our own and not `stateright`'s `LinearizabilityTester`: stateright brings a model
//! checker with an HTTP explorer (tiny_http, dashmap, crossbeam, parking_lot, rand 0.8, ...)
//! into the dependency tree for one function, its tester explores interleavings without
//! memoization (exponential on a 1,000-operation history with 12 concurrent clients), and it
//! has no notion of an operation whose outcome is unknown except "still in flight on its
//! thread". The search here is a few hundred lines, checked against a brute-force search on
//! thousands of random small histories (see the tests at the bottom).
//!
//! The model: each key holds nothing or `(value, revision)`. A write's revision is the log
//! index that applied it, so it must be greater than the revision it replaces; a read must
//! return exactly the current value and revision; a compare-and-set (`expect`) succeeds only
//! when the current revision equals `expect` (0 = absent) and otherwise reports the current
//! revision. An operation whose outcome is unknown (timeout, crash) gets an infinite return
//! time and two possible effects: it took effect, or it did not.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

/// Return time of an operation whose outcome is unknown: it may take effect at any point
/// after its call, or never.
pub const NEVER: u64 = u64::MAX;

/// What one client operation did, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A linearizable read; `seen` is `(value, revision)` or `None` when the key was absent.
    Read { seen: Option<(u64, u64)> },
    /// A put of `value` (unique per operation), optionally guarded by `expect` (0 = absent).
    Write {
        value: u64,
        expect: Option<u64>,
        outcome: Outcome,
    },
}

/// How a write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged with this revision.
    Written(u64),
    /// Refused because the current revision (given) differed from `expect`.
    Conflict(u64),
    /// Timed out or failed ambiguously: it may or may not have been applied.
    Unknown,
}

/// One operation of a recorded history. `call` and `ret` are ticks of one logical clock
/// shared by all clients (strictly increasing, so real-time order is exact); `ret` is
/// [`NEVER`] exactly when the outcome is unknown.
#[derive(Clone, Debug)]
pub struct Operation {
    pub client: usize,
    pub key: String,
    pub call: u64,
    pub ret: u64,
    pub op: Op,
}

/// Statistics of a successful check.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub keys: usize,
    pub ops: usize,
    pub indeterminate: usize,
    /// Search steps over all keys (a measure of how hard the history was).
    pub steps: u64,
}

/// Why a history is not linearizable (or could not be decided within the step budget).
#[derive(Debug, Clone)]
pub struct Violation {
    pub key: String,
    pub reason: String,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "linearizable: {} operations ({} with unknown outcome) on {} keys, {} search steps",
            self.ops, self.indeterminate, self.keys, self.steps
        )
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key {:?}: {}", self.key, self.reason)
    }
}

/// Default search budget per key; real histories need a few thousand steps per key.
pub const DEFAULT_MAX_STEPS: u64 = 20_000_000;

/// Checks a whole history (all keys).
pub fn check(ops: &[Operation]) -> Result<Report, Violation> {
    check_with_budget(ops, DEFAULT_MAX_STEPS)
}

/// [`check`] with an explicit per-key step budget; running out of budget is a `Violation`
/// (undecided counts as failure, so a test can never pass by giving up).
pub fn check_with_budget(ops: &[Operation], max_steps: u64) -> Result<Report, Violation> {
    validate(ops)?;
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for o in ops {
        by_key.entry(o.key.as_str()).or_default().push(o);
    }
    let mut report = Report {
        keys: by_key.len(),
        ops: ops.len(),
        indeterminate: ops.iter().filter(|o| o.ret == NEVER).count(),
        steps: 0,
    };
    for (key, key_ops) in by_key {
        let model = Model::new(key, &key_ops)?;
        report.steps += search(key, &key_ops, &model, max_steps)?;
    }
    Ok(report)
}

/// Shape checks that do not need the search, with precise messages.
fn validate(ops: &[Operation]) -> Result<(), Violation> {
    let bad = |o: &Operation, reason: String| Violation {
        key: o.key.clone(),
        reason: format!("{reason}: {o:?}"),
    };
    // A client waits for each answer before its next call, so its completed operations do
    // not overlap (one with unknown outcome overlaps everything after it).
    let mut by_client: HashMap<usize, Vec<&Operation>> = HashMap::new();
    for o in ops {
        by_client.entry(o.client).or_default().push(o);
    }
    for client_ops in by_client.values_mut() {
        client_ops.sort_by_key(|o| o.call);
        for pair in client_ops.windows(2) {
            if pair[0].ret != NEVER && pair[0].ret > pair[1].call {
                return Err(bad(
                    pair[1],
                    format!("overlaps {:?} of the same client", pair[0]),
                ));
            }
        }
    }
    // A log index holds one entry, which writes a key at most once (writes of different keys
    // batched into one entry share its index): one (key, revision) holds one value.
    let mut by_rev: HashMap<(&str, u64), u64> = HashMap::new();
    for o in ops {
        if o.call >= o.ret {
            return Err(bad(o, "returns before it is called".into()));
        }
        let unknown = matches!(
            o.op,
            Op::Write {
                outcome: Outcome::Unknown,
                ..
            }
        );
        if unknown != (o.ret == NEVER) {
            return Err(bad(o, "unknown outcome iff infinite return time".into()));
        }
        let seen = match o.op {
            Op::Read { seen: Some(s) } => Some(s),
            Op::Write {
                value,
                outcome: Outcome::Written(r),
                ..
            } => Some((value, r)),
            _ => None,
        };
        if let Some((value, rev)) = seen {
            if rev == 0 {
                return Err(bad(o, "revision 0 is never a write".into()));
            }
            if let Some(&v) = by_rev.get(&(o.key.as_str(), rev))
                && v != value
            {
                return Err(bad(o, format!("revision {rev} of this key also holds value {v}")));
            }
            by_rev.insert((o.key.as_str(), rev), value);
        }
    }
    Ok(())
}

/// Revision of a register state: known, or that of a write whose revision nobody observed,
/// of which only a lower bound is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rev {
    Known(u64),
    /// Some revision strictly greater than this.
    Above(u64),
}

impl Rev {
    /// The smallest revision this can be.
    fn floor(self) -> u64 {
        match self {
            Rev::Known(c) => c,
            Rev::Above(l) => l + 1,
        }
    }

    /// Whether this can be revision `x`.
    fn may_be(self, x: u64) -> bool {
        match self {
            Rev::Known(c) => c == x,
            Rev::Above(l) => x > l,
        }
    }
}

/// The register: `None` when absent.
type Reg = Option<(u64, Rev)>;

/// The sequential specification of one key, plus what the history reveals about each value
/// (the revision it was written at, from acknowledgements and reads).
struct Model {
    rev_of: HashMap<u64, u64>,
}

impl Model {
    fn new(key: &str, ops: &[&Operation]) -> Result<Self, Violation> {
        let mut rev_of: HashMap<u64, u64> = HashMap::new();
        let mut written: HashSet<u64> = HashSet::new();
        for o in ops {
            if let Op::Write { value, .. } = o.op
                && !written.insert(value)
            {
                return Err(Violation {
                    key: key.into(),
                    reason: format!("value {value} is written by two operations"),
                });
            }
        }
        for o in ops {
            let (value, rev) = match o.op {
                Op::Read { seen: Some((v, r)) } => (v, r),
                Op::Write {
                    value,
                    outcome: Outcome::Written(r),
                    ..
                } => (value, r),
                _ => continue,
            };
            if !written.contains(&value) {
                return Err(Violation {
                    key: key.into(),
                    reason: format!("read returned value {value}, which no operation wrote: {o:?}"),
                });
            }
            if let Some(&prev) = rev_of.get(&value)
                && prev != rev
            {
                return Err(Violation {
                    key: key.into(),
                    reason: format!(
                        "value {value} seen at revisions {prev} and {rev} (applied twice?): {o:?}"
                    ),
                });
            }
            rev_of.insert(value, rev);
        }
        Ok(Self { rev_of })
    }

    /// The states `op` can lead to from `s`: none (impossible here), one, or two (an
    /// operation with unknown outcome either took effect or did not).
    ///
    /// A state whose revision is unobserved (`Rev::Above`) matches any larger revision that an
    /// operation reports (a conflict's `actual`, a CAS's `expect`), which then becomes known.
    fn successors(&self, s: &Reg, op: &Op) -> [Option<Reg>; 2] {
        let cur = s.map_or(Rev::Known(0), |(_, r)| r);
        // Pins the current revision to `x` (it may_be `x`).
        let pinned = |x: u64| s.map(|(v, _)| (v, Rev::Known(x)));
        // A write that took effect: its precondition held, and its revision (log index) is
        // larger than the one it replaced. Returns the smallest revision it can have.
        let after = |expect: Option<u64>| match expect {
            None => Some(cur.floor()),
            Some(e) => cur.may_be(e).then_some(e),
        };
        match *op {
            Op::Read { seen: None } => [s.is_none().then_some(None), None],
            Op::Read { seen: Some((v, r)) } => [
                (s.is_some_and(|(sv, _)| sv == v) && cur.may_be(r)).then(|| pinned(r)),
                None,
            ],
            Op::Write {
                value,
                expect,
                outcome: Outcome::Written(r),
            } => [
                after(expect)
                    .filter(|&low| r > low)
                    .map(|_| Some((value, Rev::Known(r)))),
                None,
            ],
            Op::Write {
                expect: Some(e),
                outcome: Outcome::Conflict(actual),
                ..
            } => [
                (cur.may_be(actual) && actual != e).then(|| pinned(actual)),
                None,
            ],
            Op::Write {
                expect: None,
                outcome: Outcome::Conflict(_),
                ..
            } => [None, None],
            Op::Write {
                value,
                expect,
                outcome: Outcome::Unknown,
            } => {
                let effect = after(expect).and_then(|low| match self.rev_of.get(&value) {
                    Some(&r) => (r > low).then_some(Rev::Known(r)),
                    None => Some(Rev::Above(low)),
                });
                [effect.map(|rev| Some((value, rev))), Some(*s)]
            }
        }
    }
}

const HEAD: usize = 0;
const NIL: usize = usize::MAX;

/// The event list: a doubly linked list over call/return events sorted by time, from which
/// linearized operations are lifted (and put back, in LIFO order, when backtracking).
struct Events {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For event slot `i` (1-based): the operation and whether it is the return event.
    event: Vec<(usize, bool)>,
    call_slot: Vec<usize>,
    ret_slot: Vec<usize>,
}

impl Events {
    fn new(ops: &[&Operation]) -> Self {
        let mut evs: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            evs.push((o.call, false, i));
            evs.push((o.ret, true, i));
        }
        evs.sort_unstable();
        let n = evs.len();
        let mut e = Events {
            next: (1..=n + 1).map(|i| if i > n { NIL } else { i }).collect(),
            prev: (0..=n).map(|i| i.wrapping_sub(1)).collect(),
            event: vec![(usize::MAX, false); n + 1],
            call_slot: vec![0; ops.len()],
            ret_slot: vec![0; ops.len()],
        };
        e.prev[HEAD] = NIL;
        for (slot, &(_, is_ret, op)) in evs.iter().enumerate().map(|(i, x)| (i + 1, x)) {
            e.event[slot] = (op, is_ret);
            if is_ret {
                e.ret_slot[op] = slot;
            } else {
                e.call_slot[op] = slot;
            }
        }
        e
    }

    fn unlink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = x;
        if n != NIL {
            self.prev[n] = x;
        }
    }

    fn lift(&mut self, op: usize) {
        self.unlink(self.call_slot[op]);
        self.unlink(self.ret_slot[op]);
    }

    fn unlift(&mut self, op: usize) {
        self.relink(self.ret_slot[op]);
        self.relink(self.call_slot[op]);
    }
}

struct Frame {
    op: usize,
    before: Reg,
    alt: usize,
}

/// The search for one key; returns the number of steps taken.
fn search(key: &str, ops: &[&Operation], model: &Model, max_steps: u64) -> Result<u64, Violation> {
    let n = ops.len();
    let words = n.div_ceil(64);
    let mut events = Events::new(ops);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, Reg)> = HashSet::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut state: Reg = None;
    // The deepest point reached, for the error message.
    let mut best: (usize, Vec<u64>, Reg) = (0, linearized.clone(), None);
    let mut steps = 0u64;
    let mut cur = events.next[HEAD];

    // Tries `op`'s alternatives from `from` on; on success it is linearized and on the stack.
    let mut try_op = |op: usize,
                      from: usize,
                      state: &mut Reg,
                      linearized: &mut Vec<u64>,
                      stack: &mut Vec<Frame>,
                      events: &mut Events|
     -> bool {
        let alts = model.successors(state, &ops[op].op);
        for (alt, next) in alts.iter().enumerate().skip(from) {
            let Some(next) = next else { continue };
            let mut with = linearized.clone();
            with[op / 64] |= 1 << (op % 64);
            if cache.insert((with.clone(), *next)) {
                stack.push(Frame {
                    op,
                    before: *state,
                    alt,
                });
                *state = *next;
                *linearized = with;
                events.lift(op);
                return true;
            }
        }
        false
    };

    while events.next[HEAD] != NIL {
        steps += 1;
        if steps > max_steps {
            return Err(Violation {
                key: key.into(),
                reason: format!(
                    "undecided after {max_steps} search steps ({n} operations); raise the budget"
                ),
            });
        }
        // Every operation has a return event (NEVER sorts last), so the list always ends with
        // a return and the cursor stops there at the latest.
        debug_assert!(cur != NIL);
        let (op, is_ret) = events.event[cur];
        if !is_ret {
            if try_op(op, 0, &mut state, &mut linearized, &mut stack, &mut events) {
                if stack.len() > best.0 {
                    best = (stack.len(), linearized.clone(), state);
                }
                cur = events.next[HEAD];
            } else {
                cur = events.next[cur];
            }
            continue;
        }
        // `op` must take effect before it returns, but nothing before this point allowed it:
        // undo the most recent choice and try its next alternative (or skip it).
        let Some(frame) = stack.pop() else {
            return Err(Violation {
                key: key.into(),
                reason: explain(ops, &best),
            });
        };
        state = frame.before;
        linearized[frame.op / 64] &= !(1 << (frame.op % 64));
        events.unlift(frame.op);
        if try_op(
            frame.op,
            frame.alt + 1,
            &mut state,
            &mut linearized,
            &mut stack,
            &mut events,
        ) {
            cur = events.next[HEAD];
        } else {
            cur = events.next[events.call_slot[frame.op]];
        }
    }
    Ok(steps)
}

/// Describes the deepest partial linearization: the earliest-returning operation that could
/// not be placed after it, the state at that point, and the operations overlapping it.
fn explain(ops: &[&Operation], best: &(usize, Vec<u64>, Reg)) -> String {
    let (depth, done, state) = best;
    let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
    let stuck = (0..ops.len())
        .filter(|&i| !is_done(i))
        .min_by_key(|&i| (ops[i].ret, ops[i].call));
    let mut s = format!(
        "not linearizable: {} operations, at most {depth} linearized; state then: {state:?}",
        ops.len()
    );
    if let Some(i) = stuck {
        let o = ops[i];
        let _ = write!(
            s,
            "\n  cannot place: {o:?}\n  overlapping or just before it:"
        );
        let mut near: Vec<&Operation> = ops
            .iter()
            .copied()
            .filter(|p| p.call <= o.ret && p.ret.saturating_add(200) >= o.call)
            .collect();
        near.sort_by_key(|p| p.call);
        for p in near.iter().take(40) {
            let _ = write!(s, "\n    {p:?}");
        }
        if near.len() > 40 {
            let _ = write!(s, "\n    ... {} more", near.len() - 40);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Rng;

    fn op(client: usize, call: u64, ret: u64, op: Op) -> Operation {
        Operation {
            client,
            key: "k".into(),
            call,
            ret,
            op,
        }
    }
    fn w(c: usize, call: u64, ret: u64, value: u64, rev: u64) -> Operation {
        op(
            c,
            call,
            ret,
            Op::Write {
                value,
                expect: None,
                outcome: Outcome::Written(rev),
            },
        )
    }
    fn w_unknown(c: usize, call: u64, value: u64) -> Operation {
        op(
            c,
            call,
            NEVER,
            Op::Write {
                value,
                expect: None,
                outcome: Outcome::Unknown,
            },
        )
    }
    fn cas(c: usize, call: u64, ret: u64, value: u64, expect: u64, outcome: Outcome) -> Operation {
        op(
            c,
            call,
            ret,
            Op::Write {
                value,
                expect: Some(expect),
                outcome,
            },
        )
    }
    fn r(c: usize, call: u64, ret: u64, seen: Option<(u64, u64)>) -> Operation {
        op(c, call, ret, Op::Read { seen })
    }

    fn rejects(h: &[Operation]) -> String {
        match check(h) {
            Ok(rep) => panic!("accepted a non-linearizable history ({rep:?}): {h:#?}"),
            Err(v) => v.to_string(),
        }
    }

    #[test]
    fn accepts_linearizable_histories() {
        // Sequential.
        check(&[
            r(0, 0, 1, None),
            w(0, 2, 3, 10, 5),
            r(1, 4, 5, Some((10, 5))),
        ])
        .unwrap();
        // A read concurrent with a write may see either side, and later reads agree.
        check(&[
            w(0, 0, 10, 10, 5),
            r(1, 1, 2, None),
            r(2, 3, 4, Some((10, 5))),
            r(1, 5, 6, Some((10, 5))),
        ])
        .unwrap();
        // Two concurrent writes: reads order them consistently with their revisions.
        check(&[
            w(0, 0, 10, 10, 5),
            w(1, 1, 9, 11, 6),
            r(2, 2, 3, Some((10, 5))),
            r(2, 4, 5, Some((11, 6))),
        ])
        .unwrap();
        // A timed-out write may have happened (observed later) ...
        check(&[w_unknown(0, 0, 10), r(1, 5, 6, Some((10, 9)))]).unwrap();
        // ... or not (never observed).
        check(&[w_unknown(0, 0, 10), r(1, 5, 6, None), w(1, 7, 8, 11, 12)]).unwrap();
        // Compare-and-set: one winner, the loser sees the winner's revision.
        check(&[
            w(0, 0, 1, 10, 5),
            cas(1, 2, 6, 11, 5, Outcome::Written(8)),
            cas(2, 3, 7, 12, 5, Outcome::Conflict(8)),
            r(0, 8, 9, Some((11, 8))),
        ])
        .unwrap();
        // A write nobody read is revealed by a conflict's revision, then a CAS builds on it.
        check(&[
            w(0, 0, 1, 10, 5),
            w_unknown(1, 2, 11),
            cas(2, 5, 6, 12, 5, Outcome::Conflict(9)),
            cas(2, 7, 8, 13, 9, Outcome::Written(10)),
            r(0, 11, 12, Some((13, 10))),
        ])
        .unwrap();
        // An unknown CAS that lost is fine too.
        check(&[
            w(0, 0, 1, 10, 5),
            cas(1, 2, NEVER, 11, 5, Outcome::Unknown),
            w(2, 3, 4, 12, 7),
            r(0, 8, 9, Some((12, 7))),
        ])
        .unwrap();
    }

    #[test]
    fn rejects_non_linearizable_histories() {
        // Stale read: a completed write is not visible to a read that starts after it.
        let m = rejects(&[w(0, 0, 1, 10, 5), r(1, 2, 3, None)]);
        assert!(m.contains("not linearizable"), "{m}");
        // Reads go back in time.
        rejects(&[
            w(0, 0, 1, 10, 5),
            w(0, 2, 3, 11, 7),
            r(1, 4, 5, Some((10, 5))),
        ]);
        // Once a concurrent write is seen, a later read cannot unsee it.
        rejects(&[
            w(0, 0, 10, 10, 5),
            r(1, 1, 2, Some((10, 5))),
            r(2, 3, 4, None),
        ]);
        // Revisions must grow with real time.
        rejects(&[w(0, 0, 1, 10, 9), w(1, 2, 3, 11, 5)]);
        // A read reports the right value with the wrong revision.
        rejects(&[w(0, 0, 1, 10, 5), r(1, 2, 3, Some((10, 6)))]);
        // Two CAS against the same revision both succeed.
        rejects(&[
            w(0, 0, 1, 10, 5),
            cas(1, 2, 3, 11, 5, Outcome::Written(8)),
            cas(2, 4, 5, 12, 5, Outcome::Written(9)),
        ]);
        // A conflict that reports a revision the key never had at that point.
        rejects(&[w(0, 0, 1, 10, 5), cas(1, 2, 3, 11, 4, Outcome::Conflict(3))]);
        // An unknown write observed, then unobserved.
        rejects(&[
            w_unknown(0, 0, 10),
            r(1, 5, 6, Some((10, 9))),
            r(1, 7, 8, None),
        ]);
        // A value applied twice (two revisions).
        let m = rejects(&[
            w_unknown(0, 0, 10),
            r(1, 5, 6, Some((10, 9))),
            r(1, 7, 8, Some((10, 12))),
        ]);
        assert!(m.contains("applied twice"), "{m}");
        // A conflict reveals revision 9 (so the unknown write happened), yet a later write
        // gets the smaller revision 8.
        rejects(&[
            w(0, 0, 1, 10, 5),
            w_unknown(1, 2, 11),
            cas(2, 5, 6, 12, 5, Outcome::Conflict(9)),
            w(2, 7, 8, 13, 8),
        ]);
        // A read of a value nobody wrote.
        rejects(&[r(0, 0, 1, Some((99, 3)))]);
    }

    /// Reference: try every order of the operations that respects real time.
    fn brute_force(ops: &[Operation]) -> bool {
        let refs: Vec<&Operation> = ops.iter().collect();
        let (Ok(()), Ok(model)) = (validate(ops), Model::new("k", &refs)) else {
            return false;
        };
        fn go(ops: &[&Operation], model: &Model, left: &mut Vec<usize>, s: Reg) -> bool {
            if left.is_empty() {
                return true;
            }
            for idx in 0..left.len() {
                let i = left[idx];
                let blocked = left.iter().any(|&j| ops[j].ret < ops[i].call);
                if blocked {
                    continue;
                }
                for next in model.successors(&s, &ops[i].op).into_iter().flatten() {
                    left.remove(idx);
                    let ok = go(ops, model, left, next);
                    left.insert(idx, i);
                    if ok {
                        return true;
                    }
                }
            }
            false
        }
        let mut left: Vec<usize> = (0..refs.len()).collect();
        go(&refs, &model, &mut left, None)
    }

    /// A random small history: outputs come from a real sequential run at random points
    /// inside each operation's interval, then are sometimes corrupted.
    fn random_history(rng: &mut Rng) -> Vec<Operation> {
        let n = 1 + rng.below(7) as usize;
        let mut ops = Vec::new();
        let mut points = Vec::new();
        let mut t = 0u64;
        for i in 0..n {
            t += rng.below(3);
            let call = t;
            let len = 1 + rng.below(8);
            let unknown = rng.below(5) == 0;
            let point = call * 10 + 1 + rng.below(len * 10 - 1);
            let kind = rng.below(3);
            ops.push((i, call, call + len, unknown, kind));
            points.push((point, i));
        }
        points.sort_unstable();
        let mut state: Option<(u64, u64)> = None;
        let mut next_rev = 1;
        let mut out: Vec<Option<Operation>> = vec![None; n];
        for (_, i) in points {
            let (client, call, ret, unknown, kind) = ops[i];
            let value = 100 + i as u64;
            let cur = state.map_or(0, |s| s.1);
            let o = match kind {
                0 if !unknown => Op::Read { seen: state },
                _ => {
                    let expect = (kind == 2).then(|| {
                        if rng.below(2) == 0 {
                            cur
                        } else {
                            rng.below(next_rev + 1)
                        }
                    });
                    let applies =
                        expect.is_none_or(|e| e == cur) && !(unknown && rng.below(2) == 0);
                    let outcome = if applies {
                        next_rev += 1 + rng.below(2);
                        state = Some((value, next_rev));
                        Outcome::Written(next_rev)
                    } else {
                        Outcome::Conflict(cur)
                    };
                    let outcome = if unknown { Outcome::Unknown } else { outcome };
                    Op::Write {
                        value,
                        expect,
                        outcome,
                    }
                }
            };
            let ret = if unknown { NEVER } else { ret };
            out[i] = Some(op(client, call, ret, o));
        }
        let mut h: Vec<Operation> = out.into_iter().flatten().collect();
        // Corrupt one output in a third of the cases.
        if rng.below(3) == 0 {
            let i = rng.below(h.len() as u64) as usize;
            match &mut h[i].op {
                Op::Read { seen } => {
                    *seen = match rng.below(3) {
                        0 => None,
                        1 => seen.map(|(v, r)| (v, r + 1)),
                        _ => Some((100 + rng.below(n as u64), 1 + rng.below(next_rev + 1))),
                    }
                }
                Op::Write { outcome, .. } => {
                    *outcome = match *outcome {
                        Outcome::Written(r) => Outcome::Written(r.saturating_sub(1).max(1)),
                        Outcome::Conflict(a) => Outcome::Conflict(a + 1),
                        Outcome::Unknown => Outcome::Unknown,
                    }
                }
            }
        }
        h
    }

    /// The search agrees with brute force on thousands of random small histories, and both
    /// verdicts occur often (so the comparison means something).
    #[test]
    fn search_agrees_with_brute_force() {
        let mut rng = Rng::new(7);
        let (mut yes, mut no) = (0, 0);
        for case in 0..5000 {
            let h = random_history(&mut rng);
            let expected = brute_force(&h);
            let got = check(&h).is_ok();
            assert_eq!(
                got, expected,
                "case {case}: checker {got}, brute force {expected}: {h:#?}"
            );
            if expected {
                yes += 1;
            } else {
                no += 1;
            }
        }
        assert!(yes > 1000 && no > 500, "linearizable {yes}, not {no}");
    }

    /// A long, highly concurrent linearizable history is decided quickly (the memoization
    /// works), and a single corrupted read in it is found.
    #[test]
    fn large_histories_are_decided() {
        let mut rng = Rng::new(11);
        let clients = 16;
        let mut ops = Vec::new();
        let mut state: Option<(u64, u64)> = None;
        let mut rev = 0;
        // Each client has one operation in flight; operations take effect at a random tick
        // inside their interval. Simulate ticks: at each tick, some operation takes effect.
        let mut open: Vec<Option<(u64, u64, bool)>> = vec![None; clients];
        let mut clock = 0u64;
        let mut value = 0u64;
        while ops.len() < 3000 {
            let c = rng.below(clients as u64) as usize;
            clock += 1;
            match open[c] {
                None => {
                    value += 1;
                    open[c] = Some((clock, value, rng.below(2) == 0));
                }
                Some((call, v, is_read)) => {
                    // Take effect now and return now.
                    let o = if is_read {
                        Op::Read { seen: state }
                    } else {
                        rev += 1;
                        state = Some((v, rev));
                        Op::Write {
                            value: v,
                            expect: None,
                            outcome: Outcome::Written(rev),
                        }
                    };
                    clock += 1;
                    ops.push(op(c, call, clock, o));
                    open[c] = None;
                }
            }
        }
        let rep = check(&ops).unwrap();
        assert!(rep.steps < 1_000_000, "{rep:?}");
        // Corrupt one late read to an older value.
        let i = ops
            .iter()
            .rposition(|o| matches!(o.op, Op::Read { seen: Some(_) }))
            .unwrap();
        let old = ops
            .iter()
            .find_map(|o| match o.op {
                Op::Write {
                    value,
                    outcome: Outcome::Written(r),
                    ..
                } if o.ret + 100 < ops[i].call => Some((value, r)),
                _ => None,
            })
            .unwrap();
        ops[i].op = Op::Read { seen: Some(old) };
        rejects(&ops);
    }
}

//! The error-rate circuit breaker: closed → open → half-open → closed. Pure state machine;
//! the cluster holds one behind a mutex and feeds it outcomes with the current time.
//!
//! Closed: requests flow; when the window holds ≥ `min_requests` and the failure share is
//! ≥ `threshold_pct`, it opens. Open: everything is refused for `open_duration`, then it goes
//! half-open. Half-open: up to `half_open_probes` requests go through; if all succeed it closes
//! (with a clean window), the first failure re-opens it.

use crate::window::Window;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { sent: u32, ok: u32 },
}

impl State {
    /// Gauge value: 0 closed, 1 open, 2 half-open.
    pub fn code(&self) -> u8 {
        match self {
            State::Closed => 0,
            State::Open { .. } => 1,
            State::HalfOpen { .. } => 2,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open { .. } => "open",
            State::HalfOpen { .. } => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Let through as a half-open probe; its outcome must be reported with `probe = true`.
    Probe,
    No,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub threshold_pct: f64,
    pub min_requests: u64,
    pub window_ms: u64,
    pub open_ms: u64,
    pub probes: u32,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    pub settings: Settings,
    state: State,
    /// [successes, failures]
    window: Window<10>,
}

impl Breaker {
    pub fn new(settings: Settings) -> Breaker {
        let window = Window::new(settings.window_ms);
        Breaker { settings, state: State::Closed, window }
    }

    pub fn state(&self, now_ms: u64) -> State {
        match self.state {
            State::Open { until_ms } if now_ms >= until_ms => State::HalfOpen { sent: 0, ok: 0 },
            s => s,
        }
    }

    /// Whether a request may go now, and the new state if asking moved it (open → half-open).
    pub fn admit(&mut self, now_ms: u64) -> (Admit, Option<State>) {
        let before = self.state;
        self.state = self.state(now_ms);
        let changed = (self.state.code() != before.code()).then_some(self.state);
        (self.admit_in_state(), changed)
    }

    fn admit_in_state(&mut self) -> Admit {
        match &mut self.state {
            State::Closed => Admit::Yes,
            State::Open { .. } => Admit::No,
            State::HalfOpen { sent, .. } => {
                if *sent < self.settings.probes.max(1) {
                    *sent += 1;
                    Admit::Probe
                } else {
                    Admit::No
                }
            }
        }
    }

    /// A probe that ends without a verdict (its client went away, or it was refused locally
    /// before reaching an endpoint) gives its slot back. Without this, probes that never report
    /// would hold half-open's slots for good and the cluster would refuse every request until
    /// a restart.
    pub fn abandon_probe(&mut self) {
        if let State::HalfOpen { sent, ok } = &mut self.state
            && *sent > *ok
        {
            *sent -= 1;
        }
    }

    /// Report an outcome. Returns the new state when it changed.
    pub fn record(&mut self, now_ms: u64, success: bool, probe: bool) -> Option<State> {
        let before = self.state;
        match &mut self.state {
            State::Closed => {
                self.window.add(now_ms, usize::from(!success), 1);
                let [ok, failed] = self.window.totals(now_ms);
                let total = ok + failed;
                if total >= self.settings.min_requests.max(1)
                    && failed as f64 * 100.0 >= self.settings.threshold_pct * total as f64
                {
                    self.state = State::Open { until_ms: now_ms + self.settings.open_ms };
                }
            }
            State::HalfOpen { ok, .. } if probe => {
                if !success {
                    self.state = State::Open { until_ms: now_ms + self.settings.open_ms };
                } else {
                    *ok += 1;
                    if *ok >= self.settings.probes.max(1) {
                        self.window.clear();
                        self.state = State::Closed;
                    }
                }
            }
            // Outcomes of requests admitted before the breaker opened don't move it.
            _ => {}
        }
        (self.state.code() != before.code()).then_some(self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(Settings { threshold_pct: 50.0, min_requests: 10, window_ms: 10_000, open_ms: 5_000, probes: 2 })
    }

    #[test]
    fn opens_half_opens_and_closes() {
        let mut b = breaker();
        for i in 0..9 {
            assert_eq!(b.admit(100 + i).0, Admit::Yes);
            assert_eq!(b.record(100 + i, false, false), None, "below min_requests");
        }
        assert_eq!(b.record(120, false, false), Some(State::Open { until_ms: 5_120 }));
        assert_eq!(b.admit(3_000).0, Admit::No);
        // After open_duration: half-open, two probes, then refuse until they report.
        assert_eq!(b.admit(5_200).0, Admit::Probe);
        assert_eq!(b.admit(5_201).0, Admit::Probe);
        assert_eq!(b.admit(5_202).0, Admit::No);
        assert_eq!(b.record(5_300, true, true), None);
        assert_eq!(b.record(5_301, true, true), Some(State::Closed));
        assert_eq!(b.admit(5_302).0, Admit::Yes);
        // The window was cleared: one failure does not re-open.
        assert_eq!(b.record(5_303, false, false), None);
    }

    /// A breaker opened at t = 9 ms by ten failures (half-open from 5,009 ms).
    fn opened() -> Breaker {
        let mut b = breaker();
        for i in 0..10 {
            b.record(i, false, false);
        }
        b
    }

    #[test]
    fn failed_probe_reopens() {
        let mut b = opened();
        assert_eq!(b.admit(6_000).0, Admit::Probe);
        assert_eq!(b.record(6_001, false, true), Some(State::Open { until_ms: 11_001 }));
    }

    #[test]
    fn an_abandoned_probe_frees_its_slot() {
        let mut b = opened();
        assert_eq!(b.admit(6_000).0, Admit::Probe);
        assert_eq!(b.admit(6_001).0, Admit::Probe);
        assert_eq!(b.admit(6_002).0, Admit::No, "both slots taken");
        assert_eq!(b.record(6_003, true, true), None);
        b.abandon_probe();
        assert_eq!(b.admit(6_004).0, Admit::Probe, "the abandoned slot is free again");
        assert_eq!(b.record(6_005, true, true), Some(State::Closed));
        b.abandon_probe();
        assert_eq!(b.state(6_006), State::Closed, "abandoning outside half-open changes nothing");
    }

    #[test]
    fn healthy_traffic_stays_closed() {
        let mut b = breaker();
        for i in 0..1000 {
            b.record(i * 10, i % 3 != 0, false);
        }
        assert_eq!(b.state(10_000), State::Closed);
    }
}

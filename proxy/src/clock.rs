//! A cheap monotonic millisecond clock shared by the breaker, outlier detector and retry
//! budget, so their pure logic can take `now` as a plain number (and tests can pass any).

use std::sync::OnceLock;
use std::time::Instant;

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Milliseconds since the process first asked; starts at 1 so 0 can mean "never".
pub fn now_ms() -> u64 {
    ms_of(Instant::now())
}

/// The same clock for an `Instant` the caller already read (saves a clock read on hot paths).
pub fn ms_of(t: Instant) -> u64 {
    t.saturating_duration_since(start()).as_millis() as u64 + 1
}

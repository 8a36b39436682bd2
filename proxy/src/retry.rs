//! Retry decisions: which failures are retried, how long to back off, and the budget that
//! keeps retries from amplifying an outage. Pure apart from the caller-supplied clock/random.

use crate::window::Window;

/// What went wrong with one try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    ConnectFailure,
    /// Connection reset or protocol error before response headers.
    Reset,
    /// The per-try timeout fired before response headers.
    Timeout,
    Status(u16),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub reset: bool,
    pub timeout: bool,
    pub statuses: Vec<u16>,
}

impl RetryOn {
    pub fn parse(items: &[String]) -> Result<RetryOn, String> {
        let mut on = RetryOn { connect_failure: false, reset: false, timeout: false, statuses: vec![] };
        for item in items {
            match item.as_str() {
                "connect-failure" => on.connect_failure = true,
                "reset" => on.reset = true,
                "timeout" => on.timeout = true,
                "5xx" => on.statuses.extend(500..=599),
                "gateway-error" => on.statuses.extend([502, 503, 504]),
                code => match code.parse::<u16>() {
                    Ok(c) if (100..=599).contains(&c) => on.statuses.push(c),
                    _ => {
                        return Err(format!(
                            "retry.on: {code:?} is not connect-failure, reset, timeout, 5xx, gateway-error or a status code"
                        ));
                    }
                },
            }
        }
        Ok(on)
    }

    pub fn matches(&self, f: Failure) -> bool {
        match f {
            Failure::ConnectFailure => self.connect_failure,
            Failure::Reset => self.reset,
            Failure::Timeout => self.timeout,
            Failure::Status(s) => self.statuses.contains(&s),
        }
    }
}

/// Full-jitter exponential backoff: uniform in [0, min(max, base × 2^(retry-1))].
pub fn backoff_ms(base_ms: u64, max_ms: u64, retry: u32, unit_random: f64) -> u64 {
    let cap = base_ms.saturating_mul(1u64 << retry.saturating_sub(1).min(20)).min(max_ms);
    (cap as f64 * unit_random.clamp(0.0, 1.0)) as u64
}

/// Retries allowed over the last 10 s: `ratio × requests + min_per_sec × 10`.
/// Like Linkerd's/Finagle's budget: with an upstream failing 100%, attempts per request
/// settle near `1 + ratio` instead of `attempts`.
#[derive(Debug, Clone)]
pub struct Budget {
    ratio: f64,
    min_per_sec: u32,
    /// [requests, retries]
    window: Window<10>,
}

impl Budget {
    pub fn new(ratio: f64, min_per_sec: u32) -> Budget {
        Budget { ratio, min_per_sec, window: Window::new(10_000) }
    }

    pub fn record_request(&mut self, now_ms: u64) {
        self.window.add(now_ms, 0, 1);
    }

    /// Take one retry from the budget if there is one left.
    pub fn try_withdraw(&mut self, now_ms: u64) -> bool {
        let [requests, retries] = self.window.totals(now_ms);
        let secs = self.window.span_ms() as f64 / 1000.0;
        let allowed = self.ratio * requests as f64 + self.min_per_sec as f64 * secs;
        if (retries as f64) < allowed.floor() {
            self.window.add(now_ms, 1, 1);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_conditions() {
        let on = RetryOn::parse(&["connect-failure".into(), "503".into(), "gateway-error".into()]).unwrap();
        assert!(on.matches(Failure::ConnectFailure));
        assert!(on.matches(Failure::Status(504)));
        assert!(!on.matches(Failure::Status(500)));
        assert!(!on.matches(Failure::Reset));
        let e = RetryOn::parse(&["sometimes".into()]).unwrap_err();
        assert!(e.contains("sometimes"));
        assert!(RetryOn::parse(&["999".into()]).is_err());
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        assert_eq!(backoff_ms(25, 250, 1, 1.0), 25);
        assert_eq!(backoff_ms(25, 250, 2, 1.0), 50);
        assert_eq!(backoff_ms(25, 250, 10, 1.0), 250);
        assert_eq!(backoff_ms(25, 250, 64, 0.5), 125);
        assert_eq!(backoff_ms(25, 250, 3, 0.0), 0);
    }

    #[test]
    fn budget_caps_retry_ratio() {
        let mut b = Budget::new(0.2, 0);
        let mut retries = 0;
        for i in 0..10_000u64 {
            let now = i; // 10,000 requests within 10 s
            b.record_request(now);
            if b.try_withdraw(now) {
                retries += 1;
            }
        }
        assert!((1_900..=2_000).contains(&retries), "retries {retries}");
    }

    #[test]
    fn min_per_sec_lets_quiet_services_retry() {
        let mut b = Budget::new(0.0, 1);
        let granted = (0..20).filter(|i| b.try_withdraw(*i)).count();
        assert_eq!(granted, 10, "1/s over a 10 s window");
    }
}

//! Inference-aware endpoint picking (`lb: inference`): the model servers' own load signals
//! ([`metrics`], scraped by the sidecar), what the request asks ([`request`]: model or adapter,
//! prompt length, leading blocks), where which prompt prefix was sent ([`prefix`]), and the
//! picker that weighs them ([`pick`]). All pure; the proxy owns the scraping and the state.

pub mod metrics;
pub mod pick;
pub mod prefix;
pub mod request;

/// The signals if they were scraped within `stale_after_ms` of `now_ms`: older ones say
/// nothing about the server now, and the picker treats the endpoint as unknown.
pub fn fresh(scraped: Option<&(metrics::Signals, u64)>, now_ms: u64, stale_after_ms: u64) -> Option<&metrics::Signals> {
    scraped.filter(|(_, at)| now_ms.saturating_sub(*at) <= stale_after_ms).map(|(s, _)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_age_out() {
        let s = (metrics::Signals { waiting: 9.0, ..Default::default() }, 1_000);
        assert!(fresh(Some(&s), 1_400, 500).is_some());
        assert!(fresh(Some(&s), 1_501, 500).is_none(), "older than stale_after");
        assert!(fresh(None, 0, 500).is_none());
    }
}

//! Per-variant isolation: at most `max_concurrency` requests in flight to a variant and at most
//! `max_pending` waiting for a slot. Anything beyond is shed at once (503 + `x-weft-shed`),
//! so a slow variant cannot queue requests without bound or starve its sibling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct Limiter {
    slots: Option<Arc<Semaphore>>,
    stats: Arc<VariantStats>,
    max_pending: u32,
    pending: AtomicU32,
    /// `experiment="e",variant="v"`, for the metrics.
    labels: String,
}

/// A variant's counts, shared by the limiters of successive configs (a reload that changes the
/// limits builds a new limiter while requests still hold the old one's slots).
#[derive(Debug, Default)]
pub struct VariantStats {
    /// Requests holding a slot right now (`weft_variant_requests_in_flight`; the load reports
    /// carry it too).
    active: AtomicU32,
    /// Requests refused (`weft_shed_total`).
    shed: AtomicU64,
}

/// Held for the whole life of the request, response stream included.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    stats: Arc<VariantStats>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.active.fetch_sub(1, Relaxed);
    }
}

/// Read at scrape time, so a variant removed from the config leaves `/metrics`.
impl crate::series::Live for Limiter {
    fn samples(&self, _now_ms: u64, out: &mut Vec<(&'static str, String, f64)>) {
        out.push(("weft_variant_requests_in_flight", self.labels.clone(), self.stats.active.load(Relaxed) as f64));
        out.push(("weft_shed_total", self.labels.clone(), self.stats.shed.load(Relaxed) as f64));
    }
}

impl Limiter {
    /// `max_concurrency` 0 = unlimited. `stats`: the previous limiter's of the same variant.
    pub fn new(max_concurrency: u32, max_pending: u32, labels: String, stats: Arc<VariantStats>) -> Limiter {
        let slots = (max_concurrency > 0).then(|| Arc::new(Semaphore::new(max_concurrency as usize)));
        Limiter { slots, stats, max_pending, pending: AtomicU32::new(0), labels }
    }

    /// The counts to hand to the next limiter of this variant.
    pub fn stats(&self) -> &Arc<VariantStats> {
        &self.stats
    }

    fn slot(&self, permit: Option<OwnedSemaphorePermit>) -> Slot {
        self.stats.active.fetch_add(1, Relaxed);
        Slot { _permit: permit, stats: self.stats.clone() }
    }

    /// Requests waiting for a slot now.
    pub fn pending(&self) -> u32 {
        self.pending.load(Relaxed)
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> u32 {
        self.stats.active.load(Relaxed)
    }

    /// A slot, waiting if the pending queue has room; `None` = shed.
    pub async fn acquire(&self) -> Option<Slot> {
        let Some(slots) = &self.slots else { return Some(self.slot(None)) };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Some(self.slot(Some(p)));
        }
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            self.stats.shed.fetch_add(1, Relaxed);
            return None;
        }
        let _leave = PendingGuard(&self.pending);
        slots.clone().acquire_owned().await.ok().map(|p| self.slot(Some(p)))
    }
}

/// Leaves the pending queue even when the waiting request is cancelled.
struct PendingGuard<'a>(&'a AtomicU32);
impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sheds_beyond_pending() {
        let l = Arc::new(Limiter::new(1, 1, String::new(), Arc::default()));
        let held = l.acquire().await.unwrap();
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire().await.is_some() });
        tokio::task::yield_now().await;
        while l.pending() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(l.acquire().await.is_none(), "queue full → shed at once");
        assert_eq!((l.in_flight(), l.pending()), (1, 1), "the load report's gauges");
        drop(held);
        assert!(waiter.await.unwrap(), "the queued request gets the slot");
        assert_eq!((l.in_flight(), l.pending()), (0, 0));
        assert!(Limiter::new(0, 0, String::new(), Arc::default()).acquire().await.is_some(), "0 = unlimited");
    }
}

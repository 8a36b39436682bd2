//! Per-variant isolation: at most `max_concurrency` requests in flight to a variant and at most
//! `max_pending` waiting for a slot. Anything beyond is shed at once (503 + `x-weft-shed`),
//! so a slow variant cannot queue requests without bound or starve its sibling.

use metrics::{Counter, Gauge};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct Limiter {
    slots: Option<Arc<Semaphore>>,
    /// Requests holding a slot right now (`weft_variant_requests_in_flight`).
    in_flight: Gauge,
    /// The same count, readable (a metrics gauge is write-only): the load reports carry it.
    active: Arc<AtomicU32>,
    max_pending: u32,
    pending: AtomicU32,
    /// Requests refused (`weft_shed_total`).
    shed: Counter,
}

/// Held for the whole life of the request, response stream included.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    in_flight: Gauge,
    active: Arc<AtomicU32>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.in_flight.decrement(1.0);
        self.active.fetch_sub(1, Relaxed);
    }
}

impl Limiter {
    /// `max_concurrency` 0 = unlimited.
    pub fn new(max_concurrency: u32, max_pending: u32, in_flight: Gauge, shed: Counter) -> Limiter {
        let slots = (max_concurrency > 0).then(|| Arc::new(Semaphore::new(max_concurrency as usize)));
        Limiter { slots, in_flight, active: Arc::default(), max_pending, pending: AtomicU32::new(0), shed }
    }

    fn slot(&self, permit: Option<OwnedSemaphorePermit>) -> Slot {
        self.in_flight.increment(1.0);
        self.active.fetch_add(1, Relaxed);
        Slot { _permit: permit, in_flight: self.in_flight.clone(), active: self.active.clone() }
    }

    /// Requests waiting for a slot now.
    pub fn pending(&self) -> u32 {
        self.pending.load(Relaxed)
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> u32 {
        self.active.load(Relaxed)
    }

    /// A slot, waiting if the pending queue has room; `None` = shed.
    pub async fn acquire(&self) -> Option<Slot> {
        let Some(slots) = &self.slots else { return Some(self.slot(None)) };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Some(self.slot(Some(p)));
        }
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            self.shed.increment(1);
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
        let l = Arc::new(Limiter::new(1, 1, Gauge::noop(), Counter::noop()));
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
        assert!(Limiter::new(0, 0, Gauge::noop(), Counter::noop()).acquire().await.is_some(), "0 = unlimited");
    }
}

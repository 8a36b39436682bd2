//! Request deadlines on reused timers.
//!
//! Why: every proxied try runs under its route timeout (60 s by default) and almost never
//! reaches it. `tokio::time::timeout_at` files a fresh timer in the runtime's wheel for each
//! try and takes it out again when the response comes, both under the time driver's lock:
//! ≈ 900 of weft's ≈ 21.3k instructions per proxied request (callgrind, the bench config with
//! and without `timeout: 0s`). A timer kept after its try ended and reset to the next try's
//! later deadline only moves its expiry forward (one atomic compare-exchange in tokio's
//! `TimerEntry::reset`); the wheel sees it again only when the old expiry passes, and re-files
//! it then. So each worker thread keeps the timers of its finished tries for the next ones.
//!
//! What the reuse costs: a kept timer that no try took since still fires at its last deadline,
//! waking the task that last waited on it for nothing (a spurious poll), and until then it holds
//! that task's waker, so a closed connection's task allocation lives on until the timer fires
//! or is reused; at most [`KEEP`] per worker. A deadline earlier than a kept timer's (a short
//! per-try timeout) re-files the timer, as a fresh one would.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Instant;
use tokio::runtime::{Handle, Id};
use tokio::time::Sleep;

/// Timers kept per worker thread: about the requests a worker has in flight at once.
const KEEP: usize = 64;

struct Kept {
    /// The runtime the kept timers belong to: a timer must not be polled from another (a
    /// thread that runs several runtimes one after the other, as tests do).
    runtime: Option<Id>,
    timers: Vec<Pin<Box<Sleep>>>,
}

thread_local! {
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept { runtime: None, timers: Vec::new() }) };
}

/// `f`'s output, or `None` if `deadline` passes first (`tokio::time::timeout_at`, on a reused
/// timer). The timer is only taken once `f` has been pending, so a future that is ready at once
/// costs none.
pub async fn within<F: Future>(deadline: Instant, f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    let mut timer: Option<Timer> = None;
    poll_fn(|cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        timer.get_or_insert_with(|| Timer::take(deadline)).poll(cx).map(|()| None)
    })
    .await
}

/// A timer taken from this thread's kept ones (or made), given back when dropped.
struct Timer {
    /// Always `Some` until the drop gives it back.
    sleep: Option<Pin<Box<Sleep>>>,
    runtime: Id,
}

impl Timer {
    fn take(deadline: Instant) -> Timer {
        // Panics outside a runtime, as `tokio::time::sleep_until` does.
        let runtime = Handle::current().id();
        let kept = KEPT
            .try_with(|k| {
                let mut k = k.try_borrow_mut().ok()?;
                if k.runtime != Some(runtime) {
                    k.timers.clear();
                    k.runtime = Some(runtime);
                }
                k.timers.pop()
            })
            .ok()
            .flatten();
        let sleep = match kept {
            Some(mut s) => {
                s.as_mut().reset(deadline.into());
                s
            }
            None => Box::pin(tokio::time::sleep_until(deadline.into())),
        };
        Timer { sleep: Some(sleep), runtime }
    }

    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        match self.sleep.as_mut() {
            Some(s) => s.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let (Some(sleep), runtime) = (self.sleep.take(), self.runtime) else { return };
        let _ = KEPT.try_with(move |k| {
            if let Ok(mut k) = k.try_borrow_mut()
                && k.runtime == Some(runtime)
                && k.timers.len() < KEEP
            {
                k.timers.push(sleep);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn the_future_wins_or_the_deadline_does() {
        let now = Instant::now();
        assert_eq!(within(now + Duration::from_secs(5), async { 7 }).await, Some(7));
        let slow = within(now + Duration::from_millis(20), std::future::pending::<()>()).await;
        assert_eq!(slow, None);
        assert!(now.elapsed() >= Duration::from_millis(20), "never before the deadline");
    }

    /// A kept timer extended to a later deadline fires at the new one, not at the expiry it
    /// was filed with; and one reset to an earlier deadline fires at that.
    #[tokio::test(flavor = "current_thread")]
    async fn a_reused_timer_keeps_the_new_deadline() {
        let t0 = Instant::now();
        let quick = within(t0 + Duration::from_millis(30), tokio::time::sleep(Duration::from_millis(1))).await;
        assert_eq!(quick, Some(()), "done well before its deadline; the timer is kept");
        assert_eq!(KEPT.with(|k| k.borrow().timers.len()), 1);
        let t1 = Instant::now();
        assert_eq!(within(t1 + Duration::from_millis(200), std::future::pending::<()>()).await, None);
        assert!(t1.elapsed() >= Duration::from_millis(200), "fired at the old 30 ms expiry: {:?}", t1.elapsed());
        let t2 = Instant::now();
        let long = within(t2 + Duration::from_secs(30), tokio::time::sleep(Duration::from_millis(1))).await;
        assert_eq!(long, Some(()));
        let t3 = Instant::now();
        let early = tokio::time::timeout(
            Duration::from_secs(10),
            within(t3 + Duration::from_millis(20), std::future::pending::<()>()),
        )
        .await;
        assert_eq!(early, Ok(None), "a timer kept at 30 s, reset to 20 ms, fires at 20 ms");
    }

    /// Timers kept by one runtime are not handed to the next one on the same thread.
    #[test]
    fn timers_do_not_cross_runtimes() {
        for _ in 0..3 {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            rt.block_on(async {
                let t = Instant::now();
                assert_eq!(within(t + Duration::from_millis(5), std::future::pending::<()>()).await, None);
                assert_eq!(within(t + Duration::from_secs(5), async { 1 }).await, Some(1));
            });
            drop(rt);
        }
    }
}

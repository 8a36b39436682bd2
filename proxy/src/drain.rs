//! Graceful shutdown of one worker's downstream connections, at no cost per request.
//!
//! hyper-util's `GracefulShutdown` polls a watch channel every time a connection is polled
//! (about four times per request): callgrind put it at ≈560 instructions per proxied request,
//! 1.5% of weft's whole request path. Here a connection reads one atomic flag per poll and
//! hands its task's waker over once, on its first poll; `shutdown` sets the flag and wakes
//! every connection, which then finishes its in-flight requests and closes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A connection that can be asked to finish its in-flight exchanges and close.
pub trait Graceful: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

pin_project_lite::pin_project! {
    /// A connection's future with the flag it checks between exchanges: set by
    /// [`Graceful::graceful_shutdown`], which then polls it (see [`Watched`]).
    pub struct Closable<F> {
        #[pin]
        fut: F,
        closing: Arc<AtomicBool>,
    }
}

impl<F> Closable<F> {
    pub fn new(fut: F, closing: Arc<AtomicBool>) -> Closable<F> {
        Closable { fut, closing }
    }
}

impl<F: Future> Future for Closable<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().fut.poll(cx)
    }
}

impl<F: Future> Graceful for Closable<F> {
    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.closing.store(true, Ordering::Release);
    }
}

/// The connections of one worker.
#[derive(Default)]
pub struct Drain {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    draining: AtomicBool,
    state: Mutex<State>,
    /// Signalled when the last connection ends while draining.
    idle: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// The waker of each connection's task, by connection id (registered on first poll).
    wakers: HashMap<u64, Waker>,
    next_id: u64,
    live: usize,
}

impl Drain {
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Wrap `conn` so that [`Drain::shutdown`] reaches it. Poll the result from one task only
    /// (spawn it): the task's waker is taken once, on the first poll.
    pub fn watch<C: Graceful>(&self, conn: C) -> Watched<C> {
        let id = {
            let mut st = self.inner.state.lock().unwrap();
            st.live += 1;
            st.next_id += 1;
            st.next_id
        };
        Watched { conn: Box::pin(conn), inner: self.inner.clone(), id, registered: false, closing: false }
    }

    /// Ask every connection to close after its in-flight requests, and wait until all have.
    pub async fn shutdown(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = self.inner.state.lock().unwrap().wakers.drain().map(|(_, w)| w).collect();
        wakers.into_iter().for_each(Waker::wake);
        loop {
            let idle = self.inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.inner.state.lock().unwrap().live == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// A connection watched by a [`Drain`].
pub struct Watched<C> {
    conn: Pin<Box<C>>,
    inner: Arc<Inner>,
    id: u64,
    registered: bool,
    closing: bool,
}

impl<C: Graceful> Future for Watched<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        if !self.closing {
            let mut draining = self.inner.draining.load(Ordering::Acquire);
            if !draining && !self.registered {
                let mut st = self.inner.state.lock().unwrap();
                // Checked again under the lock: `shutdown` sets the flag before it takes the
                // wakers, so either it finds ours or we see the flag.
                draining = self.inner.draining.load(Ordering::Acquire);
                if !draining {
                    st.wakers.insert(self.id, cx.waker().clone());
                }
                drop(st);
                self.registered = true;
            }
            if draining {
                self.closing = true;
                self.conn.as_mut().graceful_shutdown();
            }
        }
        self.conn.as_mut().poll(cx)
    }
}

impl<C> Drop for Watched<C> {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock().unwrap();
        st.wakers.remove(&self.id);
        st.live -= 1;
        if st.live == 0 && self.inner.draining.load(Ordering::Acquire) {
            self.inner.idle.notify_waiters();
        }
    }
}

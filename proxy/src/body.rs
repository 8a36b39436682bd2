//! Body types on both sides of the proxy. Bodies stream frame by frame; nothing buffers a
//! whole body except the bounded replay copy kept for retries and shadowing (`Recorder`).

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::time::Sleep;

use crate::usage::{StreamInfo, Tail};

/// A bounded copy of a request body as it streams upstream, so the request can be replayed
/// to another endpoint (retry) or copied to a shadow. Recording stops, and the copy is
/// dropped, as soon as the body outgrows `limit` or carries trailers.
#[derive(Debug)]
pub struct Recorder {
    limit: usize,
    state: Mutex<Rec>,
    done: Notify,
}

#[derive(Debug, Default)]
struct Rec {
    chunks: Vec<Bytes>,
    len: usize,
    status: RecStatus,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum RecStatus {
    #[default]
    Recording,
    Complete,
    Overflow,
}

impl Recorder {
    pub fn new(limit: usize) -> Arc<Recorder> {
        Arc::new(Recorder { limit, state: Mutex::new(Rec::default()), done: Notify::new() })
    }

    fn push(&self, b: &Bytes) {
        let mut s = self.state.lock().unwrap();
        if s.status != RecStatus::Recording {
            return;
        }
        if s.len + b.len() > self.limit {
            *s = Rec { status: RecStatus::Overflow, ..Rec::default() };
            drop(s);
            self.done.notify_waiters();
            return;
        }
        s.len += b.len();
        s.chunks.push(b.clone());
    }

    fn end(&self, status: RecStatus) {
        let mut s = self.state.lock().unwrap();
        if s.status == RecStatus::Recording {
            s.status = status;
            if status == RecStatus::Overflow {
                s.chunks.clear();
            }
        }
        drop(s);
        self.done.notify_waiters();
    }

    /// The body's length, once it was read to the end within the limit.
    pub fn complete_len(&self) -> Option<usize> {
        let s = self.state.lock().unwrap();
        (s.status == RecStatus::Complete).then_some(s.len)
    }

    /// The whole body, if it was read to the end within the limit.
    pub fn replay(&self) -> Option<Bytes> {
        let s = self.state.lock().unwrap();
        (s.status == RecStatus::Complete).then(|| concat(&s.chunks))
    }

    /// Wait (bounded) until the body has been read to the end; None on overflow or timeout.
    pub async fn wait_complete(&self, timeout: Duration) -> Option<Bytes> {
        let wait = async {
            loop {
                // Register for the wake-up before looking, so an end in between is not missed.
                let notified = self.done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let status = self.state.lock().unwrap().status;
                match status {
                    RecStatus::Recording => notified.await,
                    RecStatus::Complete => return self.replay(),
                    RecStatus::Overflow => return None,
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}

fn concat(chunks: &[Bytes]) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => {
            let mut b = BytesMut::with_capacity(many.iter().map(|c| c.len()).sum());
            for c in many {
                b.extend_from_slice(c);
            }
            b.freeze()
        }
    }
}

pin_project_lite::pin_project! {
    /// The body sent upstream: the downstream stream (maybe recorded) or a replayed copy.
    #[project = ReqProj]
    pub enum ReqBody {
        Full { data: Option<Bytes> },
        Stream { #[pin] inner: DownBody, recorder: Option<Arc<Recorder>> },
    }
}

impl ReqBody {
    pub fn full(data: Bytes) -> ReqBody {
        ReqBody::Full { data: (!data.is_empty()).then_some(data) }
    }

    pub fn stream(inner: DownBody, recorder: Option<Arc<Recorder>>) -> ReqBody {
        ReqBody::Stream { inner, recorder }
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            ReqProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ReqProj::Stream { mut inner, recorder } => {
                let frame = ready!(inner.as_mut().poll_frame(cx));
                // With a content-length, hyper stops polling once the body is complete, so the
                // end is seen with the last data frame, not as a `None` frame (over HTTP/2 the
                // end of stream may come in a later frame: the remaining length says it too).
                let ended = match &frame {
                    None => true,
                    Some(Ok(_)) => inner.is_end_stream() || inner.size_hint().exact() == Some(0),
                    Some(Err(_)) => false,
                };
                if let Some(rec) = recorder.as_ref() {
                    match &frame {
                        Some(Ok(f)) => match f.data_ref() {
                            Some(d) => {
                                rec.push(d);
                                if ended {
                                    rec.end(RecStatus::Complete);
                                }
                            }
                            None => rec.end(RecStatus::Overflow), // trailers: not replayable
                        },
                        Some(Err(_)) => rec.end(RecStatus::Overflow),
                        None => rec.end(RecStatus::Complete),
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Full { data } => data.is_none(),
            ReqBody::Stream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Full { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            ReqBody::Stream { inner, .. } => inner.size_hint(),
        }
    }
}

/// How a response body stream ended, for accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Read to the end: the upstream connection can be reused.
    Complete,
    /// The upstream failed mid-stream or went silent past the idle timeout.
    Error,
    /// The downstream went away before the end.
    Cancelled,
}

/// Called exactly once when a proxied response body ends, however it ends, with what the
/// stream showed (first byte, token usage).
pub type OnEnd = Box<dyn FnOnce(End, StreamInfo) + Send>;

/// `Body` for an enum whose every variant holds a body of `Bytes`: each call goes to the
/// variant's own body, errors boxed.
macro_rules! either_body {
    ($name:ident { $($v:ident),+ }) => {
        impl Body for $name {
            type Data = Bytes;
            type Error = BoxError;

            fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
                match self.get_mut() {
                    $($name::$v(b) => Pin::new(b).poll_frame(cx).map_err(BoxError::from),)+
                }
            }

            fn is_end_stream(&self) -> bool {
                match self {
                    $($name::$v(b) => b.is_end_stream(),)+
                }
            }

            fn size_hint(&self) -> SizeHint {
                match self {
                    $($name::$v(b) => b.size_hint(),)+
                }
            }
        }
    };
}

/// A response body as it comes from upstream: read from weft's own HTTP/1.1 connection, or
/// from a hyper HTTP/2 stream.
pub enum UpBody {
    H1(crate::h1::Body),
    H2(Incoming),
}

either_body!(UpBody { H1, H2 });

impl UpBody {
    /// The header fields of an HTTP/1.1 response, which are not in its map (see
    /// [`crate::h1::fields`]); `None` for HTTP/2, or once taken.
    pub fn fields(&self) -> Option<&crate::h1::Fields> {
        match self {
            UpBody::H1(b) => b.fields(),
            UpBody::H2(_) => None,
        }
    }

    pub fn take_fields(&mut self) -> Option<Box<crate::h1::Fields>> {
        match self {
            UpBody::H1(b) => b.take_fields(),
            UpBody::H2(_) => None,
        }
    }
}

/// A request body as it comes from downstream: none, read by weft's own HTTP/1.1 server, or
/// from a hyper HTTP/2 stream.
pub enum DownBody {
    Empty(http_body_util::Empty<Bytes>),
    H1(crate::h1::server::Body),
    H2(Incoming),
}

either_body!(DownBody { Empty, H1, H2 });

impl DownBody {
    pub fn empty() -> DownBody {
        DownBody::Empty(http_body_util::Empty::new())
    }
}

pin_project_lite::pin_project! {
    /// The body sent downstream: a local (error) response, or an upstream stream that tracks
    /// idleness and reports its end.
    #[project = RespProj]
    pub enum RespBody {
        Local { data: Option<Bytes> },
        Upstream {
            #[pin] inner: UpBody,
            idle: Option<Duration>,
            timer: Option<Pin<Box<Sleep>>>,
            on_end: Option<OnEnd>,
            first_byte: Option<Instant>,
            // The body's end, scanned for token usage (JSON and SSE responses only).
            tail: Option<Tail>,
        },
    }

    impl PinnedDrop for RespBody {
        fn drop(this: Pin<&mut Self>) {
            if let RespProj::Upstream { on_end, first_byte, tail, .. } = this.project()
                && let Some(f) = on_end.take() {
                    f(End::Cancelled, info(*first_byte, tail.as_ref()));
                }
        }
    }
}

impl RespBody {
    pub fn local(data: impl Into<Bytes>) -> RespBody {
        let data: Bytes = data.into();
        RespBody::Local { data: (!data.is_empty()).then_some(data) }
    }
    /// `scan_usage`: keep the body's tail to read token usage from (see [`crate::usage`]).
    pub fn upstream(inner: UpBody, idle: Option<Duration>, scan_usage: bool, on_end: OnEnd) -> RespBody {
        let tail = scan_usage.then(Tail::default);
        let mut b = RespBody::Upstream { inner, idle, timer: None, on_end: Some(on_end), first_byte: None, tail };
        if b.is_end_stream() {
            b.finish(End::Complete);
        }
        b
    }
    /// An HTTP/1.1 upstream's header fields, which belong in the response's head beside its
    /// map's (see [`crate::h1::fields`]).
    pub fn fields(&self) -> Option<&crate::h1::Fields> {
        match self {
            RespBody::Upstream { inner, .. } => inner.fields(),
            RespBody::Local { .. } => None,
        }
    }

    /// Take [`RespBody::fields`] (to put them in the map, for HTTP/2).
    pub fn take_fields(&mut self) -> Option<Box<crate::h1::Fields>> {
        match self {
            RespBody::Upstream { inner, .. } => inner.take_fields(),
            RespBody::Local { .. } => None,
        }
    }

    fn finish(&mut self, how: End) {
        if let RespBody::Upstream { on_end, first_byte, tail, .. } = self
            && let Some(f) = on_end.take() {
                f(how, info(*first_byte, tail.as_ref()));
            }
    }
}

fn info(first_byte: Option<Instant>, tail: Option<&Tail>) -> StreamInfo {
    StreamInfo { first_byte, tokens: tail.and_then(Tail::tokens) }
}

/// The error a stream ends with when the upstream goes silent.
#[derive(Debug)]
pub struct IdleTimeout;
impl std::fmt::Display for IdleTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream idle timeout")
    }
}
impl std::error::Error for IdleTimeout {}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            RespProj::Local { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            RespProj::Upstream { mut inner, idle, timer, on_end, first_byte, tail } => {
                let polled = inner.as_mut().poll_frame(cx);
                let out = match polled {
                    Poll::Pending => {
                        let Some(limit) = *idle else { return Poll::Pending };
                        let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                        if t.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        Some(Err(Box::new(IdleTimeout) as BoxError))
                    }
                    Poll::Ready(frame) => {
                        if let (Some(limit), Some(t)) = (*idle, timer.as_mut()) {
                            t.as_mut().reset(tokio::time::Instant::now() + limit);
                        }
                        if let Some(Ok(f)) = &frame
                            && let Some(d) = f.data_ref()
                            && !d.is_empty()
                        {
                            first_byte.get_or_insert_with(Instant::now);
                            if let Some(t) = tail.as_mut() {
                                t.push(d);
                            }
                        }
                        frame
                    }
                };
                let end = match &out {
                    None => Some(End::Complete),
                    Some(Err(_)) => Some(End::Error),
                    Some(Ok(_)) if inner.is_end_stream() => Some(End::Complete),
                    Some(Ok(_)) => None,
                };
                // Taken only at the end: a stream's middle frames must leave it in place.
                if let Some(how) = end
                    && let Some(f) = on_end.take()
                {
                    f(how, info(*first_byte, tail.as_ref()));
                }
                Poll::Ready(out)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Local { data } => data.is_none(),
            RespBody::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Local { data } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            RespBody::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}

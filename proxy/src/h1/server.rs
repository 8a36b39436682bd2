//! weft's downstream HTTP/1.1 server: one task per client connection reads each request head,
//! runs the proxy's handler on it, and writes the response back, one exchange after another.
//!
//! Why not hyper's server: to own the per-request path end to end, as the upstream side
//! already is ([`super`]). Outside the handler, hyper's HTTP/1 dispatcher (its connection state
//! machine, buffered IO, head parsing and encoding) came to ≈7,700 of the ≈21,400 instructions
//! weft spent per proxied request. This loop parses with httparse into a recycled header map,
//! awaits the handler, and writes the head and a small body already in hand in one write(2),
//! with two reads and two writes per proxied request and no read that ends in EAGAIN. Measured
//! (bench/README.md, "Stop 30"): parsing and writing cost about what hyper's did (httparse and
//! http's header map dominate both); the whole path went from 21,395 to 20,998 instructions.
//!
//! A request body reads from the connection as the handler polls it, possibly from another
//! task (an upload that outlives its response head runs on its own, see [`super`]): it takes
//! the connection's read side along and gives it back when it ends, through a [`Slot`]. Once
//! the response is written the connection carries another request only if the body came back
//! complete, or what is left of it can be read and dropped at once; otherwise it closes,
//! lingering ([`crate::linger`]), so a client still uploading reads its answer.
//!
//! HTTP/2 (h2c prior knowledge) stays on hyper: [`crate::server`] looks at the first bytes.

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Request, Response, Version};
use http_body::{Body as _, Frame, SizeHint};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::net::TcpStream;

use super::codec::{self, Decoded, Decoder};
use super::request::{self, Out, ReqHead, RespHead};
use super::{Error, FIRST_READ, MAX_FRAME, grow_reads, make_room, poll_write_all};
use crate::body::{DownBody, RespBody};
use crate::Shared;

/// Body frames up to this size are copied behind what is already queued (the head, a chunk
/// line) so they leave in one write; larger ones are written from their own buffer.
const COPY_UP_TO: usize = 16 * 1024;
/// Queued output is written once it reaches this size, even while the body has more ready.
const FLUSH_AT: usize = 64 * 1024;
/// Buffers above this capacity are dropped for fresh ones between requests.
const SHRINK_ABOVE: usize = 64 * 1024;
/// What is left of an unread request body is read and dropped, to keep the connection, only
/// while it is at most this large and already arrived.
const DRAIN_UP_TO: usize = 64 * 1024;

/// One listener's settings for its connections.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Largest request head (request line and headers); larger gets 431.
    pub max_head: usize,
    /// Close a connection whose request head has not arrived whole this long after it began
    /// (after its first byte; a new connection's first head, from the accept).
    pub header_timeout: Option<Duration>,
    /// Close a kept-alive connection that stays idle this long between requests.
    pub keepalive_timeout: Option<Duration>,
    /// When the connection was accepted.
    pub accepted: tokio::time::Instant,
}

/// The connection's read side: the socket, and what was read but not yet consumed.
struct Reader {
    tcp: Arc<TcpStream>,
    buf: BytesMut,
    next_read: usize,
}

impl Reader {
    /// Read once into the buffer's free room.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let room = make_room(&mut self.buf, self.next_read);
        loop {
            ready!(self.tcp.poll_read_ready(cx))?;
            match self.tcp.try_read_buf(&mut self.buf) {
                Ok(n) => {
                    grow_reads(n, room, &mut self.next_read);
                    // A read that did not fill the room drained the socket (epoll): forget its
                    // readiness now, as tokio's own `poll_read` does, instead of finding out
                    // with one more read(2) that fails with EAGAIN — once per request.
                    if n > 0 && n < room {
                        let _ = self.tcp.try_io(tokio::io::Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Where a request body hands the read side back.
#[derive(Default)]
struct Slot {
    /// The read side, and whether the body was read to its end.
    back: Mutex<Option<(Box<Reader>, Decoder)>>,
    /// Who writes the `100 Continue`, and how much of it is out.
    interim: Mutex<Interim>,
}

/// The `100 Continue` a body owes, shared by the body (which writes it when first read) and
/// the response (whose head may go first, an early answer).
#[derive(Default)]
struct Interim {
    /// The response head is queued: a `100 Continue` not yet begun would come too late.
    responded: bool,
    /// Bytes of [`request::CONTINUE`] written so far.
    written: usize,
}

impl Slot {
    /// The response head is about to be queued: from now on the body writes nothing. Returns
    /// the rest of a `100 Continue` the body began but could not finish (a full socket
    /// buffer), which must go out first, or the head would land inside it.
    fn respond(&self) -> &'static [u8] {
        let mut st = self.interim.lock().unwrap();
        st.responded = true;
        let rest = &request::CONTINUE[st.written..];
        st.written = request::CONTINUE.len();
        if rest.len() == request::CONTINUE.len() { &[] } else { rest }
    }
}

/// Serve HTTP/1.1 on `tcp` until the client closes, an exchange cannot be followed by another,
/// or `closing` is set (drain: the exchange in flight finishes first). `first` holds bytes
/// already read from the connection.
pub async fn serve(sh: Arc<Shared>, li: usize, tcp: TcpStream, first: BytesMut, settings: Settings, closing: Arc<AtomicBool>) {
    let tcp = Arc::new(tcp);
    let mut conn = Conn { reader: Some(Box::new(Reader { tcp: tcp.clone(), buf: first, next_read: FIRST_READ })), tcp, out: Output::default(), settings, first: true, idle: None };
    let linger = loop {
        let head = match conn.read_head(&closing).await {
            Ok(Some(h)) => h,
            Ok(None) => break false,
            Err(r) => {
                let bytes = request::reject_response(&r);
                let mut done = 0;
                let _ = poll_fn(|cx| poll_write_all(&conn.tcp, cx, &bytes, &mut done)).await;
                break true;
            }
        };
        let keep = head.keep_alive;
        let (method, version, upgrade) = (head.method.clone(), head.version, head.upgrade);
        let (mut req, fields, slot) = conn.request(head);
        if upgrade {
            req.extensions_mut().insert(super::UpgradeRequest);
        }
        let resp = match crate::proxy::handle(sh.clone(), li, req, fields).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        if upgrade && resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
            let up = resp.extensions().get::<super::Upgraded>().and_then(super::Upgraded::take);
            let settings = resp.extensions().get::<crate::tunnel::Settings>().cloned();
            if conn.respond(resp, false, version, true, None).await.is_none() {
                return;
            }
            if let (Some((up, up_buf, _place)), Some(settings), Some((down, down_buf))) = (up, settings, conn.into_socket()) {
                crate::tunnel::run(down, down_buf, up, up_buf, &settings, &closing).await;
            }
            return;
        }
        let keep_alive = keep && !closing.load(Ordering::Acquire);
        let Some(keep_alive) = conn.respond(resp, method == Method::HEAD, version, keep_alive, slot.as_deref()).await else {
            // Writing failed (the client went away), or the response was cut: end it now,
            // even while a request body elsewhere still holds the socket.
            let _ = socket2::SockRef::from(&*conn.tcp).shutdown(std::net::Shutdown::Both);
            return;
        };
        match conn.take_back(slot.as_deref()) {
            Back::Reusable if keep_alive => {}
            Back::Reusable | Back::Unfinished => break true,
            // The body still reads from the socket in another task (an upload that outlived
            // its response): only it may read, so the connection ends by shutting its write
            // side; the socket closes once that task lets go of the body.
            Back::HeldElsewhere => {
                let _ = socket2::SockRef::from(&*conn.tcp).shutdown(std::net::Shutdown::Write);
                return;
            }
        }
    };
    if linger {
        crate::linger::close(&conn.tcp).await;
    }
}

/// What became of a request body's read side after the response.
enum Back {
    /// Back, and the body read to its end: the connection can carry another request.
    Reusable,
    /// Back with body bytes still to come.
    Unfinished,
    /// Still with the body, in another task.
    HeldElsewhere,
}

struct Conn {
    /// `None` while a request body has it.
    reader: Option<Box<Reader>>,
    tcp: Arc<TcpStream>,
    out: Output,
    settings: Settings,
    /// No request has been read yet.
    first: bool,
    /// The keep-alive timer, made once per connection (see [`idle_expired`]).
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Conn {
    /// Wait for the next request head. `Ok(None)`: the client closed (or the connection is
    /// draining, or stalled past the header timeout) between requests.
    async fn read_head(&mut self, closing: &AtomicBool) -> Result<Option<ReqHead>, request::Reject> {
        let Some(r) = self.reader.as_mut() else { return Ok(None) };
        // A buffer grown for one large exchange goes back to its first size while the
        // connection waits (a kept-alive connection may wait an hour).
        if r.buf.is_empty() && r.buf.capacity() > SHRINK_ABOVE {
            r.buf = BytesMut::new();
            r.next_read = FIRST_READ;
        }
        if self.out.buf.capacity() > SHRINK_ABOVE {
            self.out.buf = Vec::new();
        }
        let max_head = self.settings.max_head;
        // The first head's time counts from the accept.
        let mut timer = self.settings.header_timeout.filter(|_| self.first).map(|t| Box::pin(tokio::time::sleep_until(self.settings.accepted + t)));
        let timeout = self.settings.header_timeout;
        self.first = false;
        // The keep-alive timeout runs from now while nothing of the next request has come.
        let idle_from = self.settings.keepalive_timeout.map(|t| tokio::time::Instant::now() + t);
        let idle = &mut self.idle;
        poll_fn(|cx| {
            loop {
                // Draining: a connection between requests, or in the middle of a head (which
                // might never end), closes now.
                if closing.load(Ordering::Acquire) {
                    return Poll::Ready(Ok(None));
                }
                if !r.buf.is_empty() {
                    if let Some(h) = request::parse_request(&mut r.buf, max_head)? {
                        return Poll::Ready(Ok(Some(h)));
                    }
                    if let (None, Some(t)) = (&timer, timeout) {
                        timer = Some(Box::pin(tokio::time::sleep(t)));
                    }
                }
                if let Some(t) = timer.as_mut()
                    && t.as_mut().poll(cx).is_ready()
                {
                    return Poll::Ready(Ok(None));
                }
                match r.poll_fill(cx) {
                    Poll::Ready(Ok(0)) if r.buf.is_empty() => return Poll::Ready(Ok(None)),
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(request::Reject { status: http::StatusCode::BAD_REQUEST, why: "connection closed in the middle of the request head".into() })),
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(_)) => return Poll::Ready(Ok(None)),
                    Poll::Pending => {
                        if let (true, Some(deadline)) = (r.buf.is_empty(), idle_from)
                            && idle_expired(idle, deadline, cx)
                        {
                            return Poll::Ready(Ok(None));
                        }
                        return Poll::Pending;
                    }
                }
            }
        })
        .await
    }

    /// The request the handler sees, and its header fields (which are not in its map: see
    /// [`super::fields`]). A body takes the read side along, to give it back through the
    /// returned slot.
    fn request(&mut self, head: ReqHead) -> (Request<DownBody>, Option<super::Fields>, Option<Arc<Slot>>) {
        let (body, slot) = match head.body {
            None => (DownBody::empty(), None),
            Some(framing) => {
                let slot = Arc::new(Slot::default());
                let reader = self.reader.take();
                let body = Body { reader, decoder: Decoder::new(framing), slot: slot.clone(), expect_continue: head.expect_continue };
                (DownBody::H1(body), Some(slot))
            }
        };
        let mut req = Request::new(body);
        *req.method_mut() = head.method;
        *req.uri_mut() = head.uri;
        *req.version_mut() = head.version;
        (req, Some(head.fields), slot)
    }

    /// Write the response. Returns whether the connection may carry another exchange as far
    /// as the response goes, or `None` once writing failed.
    async fn respond(&mut self, resp: Response<RespBody>, head_request: bool, version: Version, keep_alive: bool, slot: Option<&Slot>) -> Option<bool> {
        let (parts, mut body) = resp.into_parts();
        let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>().map(|r| r.as_bytes());
        // Taken, not borrowed: the fields hold the upstream's head (and the read buffer it
        // shares), which must not live as long as a stream's body.
        let fields = body.take_fields();
        let head = RespHead { status: parts.status, version, headers: &parts.headers, fields: fields.as_deref(), reason };
        let (framing, add) = request::response_framing(&head, head_request, body.size_hint().exact());
        let keep_alive = keep_alive && framing != Out::Close;
        self.out.buf.clear();
        if let Some(s) = slot {
            self.out.buf.extend_from_slice(s.respond());
        }
        request::encode_response_head(&mut self.out.buf, &head, framing, add, keep_alive);
        let trailers = match framing {
            Out::Chunked => codec::trailers_named(head.get_all(&header::TRAILER)),
            _ => Vec::new(),
        };
        crate::headers::recycle(parts.headers);
        drop(fields);
        let left = if let Out::Length(n) = framing { n } else { 0 };
        let mut sent = BodyOut { framing, left, trailers, ended: false };
        let ok = poll_fn(|cx| self.poll_body(cx, Pin::new(&mut body), &mut sent)).await.is_ok();
        ok.then_some(keep_alive)
    }

    /// Move the response body out until it ends (`Ok`) or fails.
    fn poll_body(&mut self, cx: &mut Context<'_>, mut body: Pin<&mut RespBody>, sent: &mut BodyOut) -> Poll<Result<(), ()>> {
        loop {
            if sent.ended {
                return self.out.poll_flush(&self.tcp, cx).map_err(drop);
            }
            if self.out.len() >= FLUSH_AT {
                ready!(self.out.poll_flush(&self.tcp, cx)).map_err(drop)?;
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        sent.push(&mut self.out, data)?;
                        // A body that knows it is complete is not polled again for its `None`
                        // (it reported its end with this frame).
                        if body.is_end_stream() {
                            sent.end(&mut self.out, None)?;
                        }
                    }
                    Err(frame) => sent.end(&mut self.out, frame.trailers_ref())?,
                },
                Poll::Ready(None) => sent.end(&mut self.out, None)?,
                // The upstream failed mid-body: the client must not take a cut body for a
                // whole one, so the connection closes without the body's proper end.
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "response body failed; closing the downstream connection");
                    let _ = self.out.poll_flush(&self.tcp, cx);
                    return Poll::Ready(Err(()));
                }
                Poll::Pending => {
                    // Whatever is queued goes out now: a stream's chunks must not wait.
                    ready!(self.out.poll_flush(&self.tcp, cx)).map_err(drop)?;
                    return Poll::Pending;
                }
            }
        }
    }

    /// After a response: take the read side back from the request's body, if it had one.
    /// `false`: the connection cannot carry another request (the body is still held elsewhere,
    /// or what is left of it is not all here).
    fn take_back(&mut self, slot: Option<&Slot>) -> Back {
        let Some(slot) = slot else { return Back::Reusable };
        let Some((mut reader, mut decoder)) = slot.back.lock().unwrap().take() else { return Back::HeldElsewhere };
        // Drop what is left of the body, as far as it already arrived.
        let mut dropped = 0;
        while !decoder.is_done() {
            match decoder.decode(&mut reader.buf, MAX_FRAME) {
                Ok(Decoded::Data(d)) => dropped += d.len(),
                Ok(Decoded::Trailers(_) | Decoded::End) => break,
                Ok(Decoded::NeedMore) => {
                    let mut cx = Context::from_waker(std::task::Waker::noop());
                    match reader.poll_fill(&mut cx) {
                        Poll::Ready(Ok(n)) if n > 0 && dropped <= DRAIN_UP_TO => {}
                        _ => return self.keep(reader, Back::Unfinished),
                    }
                }
                Err(_) => return self.keep(reader, Back::Unfinished),
            }
        }
        self.keep(reader, Back::Reusable)
    }

    /// The socket and what the client sent after the last request head, once nothing else
    /// holds it (a request without a body leaves the read side here): the connection is
    /// leaving HTTP (an upgrade).
    fn into_socket(self) -> Option<(TcpStream, BytesMut)> {
        let reader = self.reader?;
        let Reader { tcp, buf, .. } = *reader;
        drop(tcp);
        Some((Arc::try_unwrap(self.tcp).ok()?, buf))
    }

    /// Hold the read side again (lingering reads from it).
    fn keep(&mut self, reader: Box<Reader>, back: Back) -> Back {
        self.reader = Some(reader);
        back
    }
}

/// Whether a connection waiting for its next request has been idle until `deadline`, by the
/// keep-alive timer `t`. The timer is made and registered once per connection, and looked at
/// again only once it fired: resetting it on every request would cost a timer-wheel update each
/// time. A firing at a deadline set for an earlier wait moves it on to `deadline`.
fn idle_expired(t: &mut Option<Pin<Box<tokio::time::Sleep>>>, deadline: tokio::time::Instant, cx: &mut Context<'_>) -> bool {
    let t = match t {
        Some(t) if !t.is_elapsed() => return false,
        Some(t) => {
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
            t.as_mut().reset(deadline);
            t
        }
        None => t.insert(Box::pin(tokio::time::sleep_until(deadline))),
    };
    // Registers this task's waker with the timer. Outside the task's coop budget: a timer
    // polled on a spent budget is left unregistered, and this one is not polled again until
    // it fires.
    let mut registered = tokio::task::coop::unconstrained(t.as_mut());
    Pin::new(&mut registered).poll(cx).is_ready()
}

/// Output queued for the client: small pieces copied into one buffer, large body frames kept
/// as they came, written in order.
#[derive(Default)]
struct Output {
    buf: Vec<u8>,
    /// Large frames, each after the part of `buf` queued before it (`buf[..at]`).
    big: std::collections::VecDeque<(usize, Bytes)>,
    /// Bytes of `buf` already written.
    done: usize,
}

impl Output {
    fn len(&self) -> usize {
        self.buf.len() - self.done + self.big.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    fn push_big(&mut self, data: Bytes) {
        self.big.push_back((self.buf.len(), data));
    }

    /// Write everything queued.
    fn poll_flush(&mut self, tcp: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((at, _)) = self.big.front() {
            let at = *at;
            ready!(poll_write_all(tcp, cx, &self.buf[..at], &mut self.done))?;
            let (_, data) = self.big.front_mut().expect("checked above");
            let mut written = 0;
            let r = poll_write_all(tcp, cx, data, &mut written);
            bytes::Buf::advance(data, written);
            ready!(r)?;
            self.big.pop_front();
        }
        ready!(poll_write_all(tcp, cx, &self.buf, &mut self.done))?;
        self.buf.clear();
        self.done = 0;
        Poll::Ready(Ok(()))
    }
}

/// A response body on its way out, encoded per its framing.
struct BodyOut {
    framing: Out,
    /// Bytes still due under a content-length.
    left: u64,
    /// Trailer fields the response declared (`Trailer`); only these are sent.
    trailers: Vec<http::HeaderName>,
    /// The body has ended; what is left is queued.
    ended: bool,
}

impl BodyOut {
    fn push(&mut self, out: &mut Output, data: Bytes) -> Result<(), ()> {
        // A HEAD answer (or 204, 304) sends no body bytes, whatever its body holds.
        if data.is_empty() || self.framing == Out::None {
            return Ok(());
        }
        match self.framing {
            Out::Length(_) => {
                let n = data.len() as u64;
                if n > self.left {
                    tracing::debug!(extra = n - self.left, "response body longer than its content-length; closing");
                    return Err(());
                }
                self.left -= n;
            }
            Out::Chunked => {
                let (line, len) = codec::chunk_size_line(data.len());
                out.buf.extend_from_slice(&line[..len]);
            }
            Out::Close | Out::None => {}
        }
        if data.len() <= COPY_UP_TO {
            out.buf.extend_from_slice(&data);
        } else {
            out.push_big(data);
        }
        if self.framing == Out::Chunked {
            out.buf.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    /// The body ended (with `trailers`, maybe).
    fn end(&mut self, out: &mut Output, trailers: Option<&http::HeaderMap>) -> Result<(), ()> {
        match self.framing {
            Out::Chunked => out.buf.extend_from_slice(&codec::chunked_end(trailers, &self.trailers)),
            Out::Length(_) if self.left > 0 => {
                tracing::debug!(missing = self.left, "response body shorter than its content-length; closing");
                return Err(());
            }
            _ => {}
        }
        self.ended = true;
        Ok(())
    }
}

/// A request body read from its client connection.
pub struct Body {
    /// Taken when the body ends or is dropped: back to the connection through `slot`.
    reader: Option<Box<Reader>>,
    decoder: Decoder,
    slot: Arc<Slot>,
    /// A `100 Continue` is owed: sent on the first poll, unless the response went out first
    /// (progress in the slot's [`Interim`]).
    expect_continue: bool,
}

impl Body {
    fn give_back(&mut self) {
        if let Some(r) = self.reader.take() {
            let decoder = std::mem::replace(&mut self.decoder, Decoder::Length(0));
            *self.slot.back.lock().unwrap() = Some((r, decoder));
        }
    }

    fn fail(&mut self, why: String) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        // The connection is past saving: nothing goes back.
        self.reader = None;
        Poll::Ready(Some(Err(Error(why))))
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        let Some(reader) = this.reader.as_mut() else { return Poll::Ready(None) };
        if this.expect_continue {
            let mut st = this.slot.interim.lock().unwrap();
            // Not once the response went first, nor when the client sent the body anyway.
            if !st.responded
                && (st.written > 0 || reader.buf.is_empty())
                && let Err(e) = ready!(poll_write_all(&reader.tcp, cx, request::CONTINUE, &mut st.written))
            {
                drop(st);
                return this.fail(format!("error writing 100 Continue: {e}"));
            }
            drop(st);
            this.expect_continue = false;
        }
        loop {
            let decoded = match this.decoder.decode(&mut reader.buf, MAX_FRAME) {
                Ok(d) => d,
                Err(e) => return this.fail(format!("invalid request body: {}", e.0)),
            };
            match decoded {
                Decoded::Data(b) => {
                    if this.decoder.is_done() {
                        this.give_back();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Decoded::Trailers(t) => {
                    this.give_back();
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Decoded::End => {
                    this.give_back();
                    return Poll::Ready(None);
                }
                Decoded::NeedMore => match ready!(reader.poll_fill(cx)) {
                    Ok(0) => return this.fail("the client closed the connection in the middle of the request body".into()),
                    Ok(_) => {}
                    Err(e) => return this.fail(format!("error reading the request body: {e}")),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader.is_none() || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.exact_remaining().map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_finishes_a_partly_written_100_continue_before_its_head() {
        let slot = Slot::default();
        assert_eq!(slot.respond(), b"", "not begun: never sent once the answer goes first");
        let slot = Slot::default();
        slot.interim.lock().unwrap().written = 10;
        assert_eq!(slot.respond(), &request::CONTINUE[10..], "begun: the rest goes ahead of the head");
        let st = slot.interim.lock().unwrap();
        assert!(st.responded && st.written == request::CONTINUE.len(), "and the body writes no more of it");
        let slot = Slot::default();
        slot.interim.lock().unwrap().written = request::CONTINUE.len();
        assert_eq!(slot.respond(), b"", "already whole");
    }
}

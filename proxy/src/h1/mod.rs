//! The HTTP/1.1 upstream client, driven inside the request's own task.
//!
//! Why not hyper's client: hyper runs every upstream connection as a task of its own, so each
//! proxied request crossed tasks three times (the request into the connection's channel, the
//! response head back through a oneshot, the body through a second channel), and paid the
//! connection task's own polling. callgrind put that at a third of weft's instructions per
//! request (bench/README.md, "Stop 23"). Here the task serving the downstream request writes
//! the request and reads the response itself, and the response body reads straight from the
//! upstream socket as the downstream side polls it: a connection is only ever touched by the
//! one request it carries, or sits idle in its endpoint's pool.
//!
//! A request body streams while the response is awaited. If the response head comes first
//! (an echo server, or a 413 before the upload ends), the rest of the upload gets a task of
//! its own on the socket's write half, as hyper's connection task did, so it never waits on
//! the downstream reading the response; once the response has ended it lingers at most
//! [`LINGER`], and once the upstream stops reading it reads and drops the client's body (as
//! nginx's lingering close), so a client still uploading can read its answer; when the
//! downstream connection then closes, it closes lingering too ([`crate::linger`]). A
//! connection goes back to the pool only when both directions finished cleanly and the
//! upstream keeps it alive; anything else closes it. HTTP/2 upstreams stay on hyper.
//!
//! Framing rules (pure) are in [`codec`].

pub mod codec;
pub mod fields;
pub mod request;
pub mod server;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, Method, Response};
use http_body::{Body as _, Frame, SizeHint};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::body::ReqBody;
use crate::cluster::Endpoint;
use crate::pool::ConnSlot;
use crate::stream::{ReadHalf, Stream};
use codec::{Decoded, Decoder, ReqFraming};
pub use fields::Fields;

/// Room kept free in the read buffer before each read; below it, the buffer grows.
const MIN_READ_ROOM: usize = 1024;
/// Read buffer size while messages are small; it doubles, up to [`MAX_READ`], while reads fill it.
const FIRST_READ: usize = 8 * 1024;
const MAX_READ: usize = 256 * 1024;
/// Request bodies up to this size are copied behind the head and go out in one write.
const INLINE_BODY: usize = 16 * 1024;
/// Largest data frame handed downstream at once.
const MAX_FRAME: usize = 1 << 20;
/// How long an upload goes on after its response ended (see the module doc).
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// One upstream HTTP/1.1 connection, idle (in a pool) or carrying one request. Boxed for the
/// connection's life: the request's futures and its response body move it around, and a
/// pointer is cheaper to move than the socket and buffers (one allocation per connection,
/// none per request).
pub struct Conn(Box<Inner>);

struct Inner {
    io: Io,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    next_read: usize,
    /// The cluster's `max_connections` place, given back when the connection closes.
    _slot: ConnSlot,
}

/// A request head to write: the request's own headers, and `set`, headers the proxy sets per
/// try, written instead of any the request carries under the same names.
pub struct Head<'a> {
    pub method: &'a Method,
    /// Origin form: path and query.
    pub target: &'a str,
    pub headers: &'a crate::headers::ReqHeaders,
    pub set: &'a [(&'a HeaderName, &'a [u8])],
    /// Ask to switch to this protocol (`Upgrade`, with `Connection: upgrade`): the client's
    /// WebSocket handshake, carried on.
    pub upgrade: Option<&'a [u8]>,
}

/// A request extension set by weft's HTTP/1.1 server: the request asks to switch protocols
/// (`Connection: upgrade` with an `Upgrade`, no body), and the server can join the connections
/// if the upstream agrees.
#[derive(Clone, Copy, Debug)]
pub struct UpgradeRequest;

/// A response extension: the upstream agreed to switch protocols (`101`), and this connection
/// now carries the new protocol. It never goes back to a pool; it holds its cluster's
/// `max_connections` place until dropped. (Shared, taken once: response extensions must be
/// `Clone`.)
#[derive(Clone)]
pub struct Upgraded(Arc<std::sync::Mutex<Option<Conn>>>);

impl Upgraded {
    /// The socket, what the upstream sent after its `101` head (already the new protocol's),
    /// and the cluster place; `None` once taken.
    pub fn take(&self) -> Option<(Stream, BytesMut, ConnSlot)> {
        let Inner { io, rbuf, _slot, .. } = *self.0.lock().unwrap().take()?.0;
        match io {
            Io::Whole(t) => Some((t, rbuf, _slot)),
            // An upgrade request has no body, so no upload ever split the socket.
            Io::Read(_) | Io::Gone => None,
        }
    }
}

/// Where a connection goes when its exchange ends cleanly.
pub struct Home {
    pub endpoint: Arc<Endpoint>,
    pub max_idle: usize,
}

/// A failed exchange.
pub enum SendError {
    /// Nothing reached the upstream (the connection was found closed on the first write):
    /// the body comes back, untouched, for another connection.
    Unsent(ReqBody, String),
    Failed(String),
}

/// The upstream failed while the response body was being read.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Error {}

impl Conn {
    pub fn new(io: Stream, slot: ConnSlot) -> Conn {
        Conn(Box::new(Inner { io: Io::Whole(io), rbuf: BytesMut::new(), wbuf: Vec::new(), next_read: FIRST_READ, _slot: slot }))
    }

    /// Whether an idle connection can carry a request: the upstream has neither closed it nor
    /// sent anything unasked. Costs no system call unless the socket became readable, which an
    /// idle connection only does when the upstream closed it (or misbehaves).
    pub fn is_usable(&mut self) -> bool {
        let c = &mut self.0;
        let Io::Whole(io) = &mut c.io else { return false };
        c.rbuf.is_empty() && io.is_idle_usable()
    }

    /// Send one request and wait for the response head. The response body then reads from
    /// this connection, which it takes along; at its end the connection goes `home` if it can
    /// carry another request.
    pub async fn send(self, head: Head<'_>, body: ReqBody, home: Home) -> Result<Response<Body>, SendError> {
        let mut c = self.0;
        let method = head.method;
        let (framing, add) = codec::request_framing(method, head.headers, body.is_end_stream(), body.size_hint().exact());
        c.wbuf.clear();
        codec::encode_request_head(&mut c.wbuf, &head, framing, add);
        // A small body already in hand goes out with the head, in one write.
        let inline = match (&body, framing) {
            (ReqBody::Full { data: Some(d) }, ReqFraming::Length(n)) if d.len() <= INLINE_BODY && d.len() as u64 == n => {
                c.wbuf.extend_from_slice(d);
                true
            }
            _ => false,
        };
        let mut written = 0;
        let Io::Whole(io) = &mut c.io else { return Err(SendError::Failed("connection already split".into())) };
        if let Err(e) = poll_fn(|cx| io.poll_write_all(cx, &c.wbuf, &mut written)).await {
            return Err(match written {
                0 => SendError::Unsent(body, format!("connection closed: {e}")),
                _ => SendError::Failed(format!("error writing the request: {e}")),
            });
        }
        let mut upload = match framing {
            ReqFraming::Empty => None,
            _ if inline => None,
            f => Some(Box::new(Upload::new(body, f, codec::trailers_named(head.headers.get_all(&http::header::TRAILER))))),
        };
        let head_request = method == Method::HEAD;
        let upgrade = head.upgrade.is_some();
        let mut write_error = None;
        let head = poll_fn(|cx| {
            if let (Some(up), Io::Whole(io)) = (upload.as_mut(), &mut c.io) {
                match up.poll(cx, io) {
                    Poll::Ready(Ok(())) => upload = None,
                    // The client's own body failed: nothing valid can reach the upstream.
                    Poll::Ready(Err(UploadError::Body(e))) => return Poll::Ready(Err(e)),
                    // The upstream stopped reading; it may still have answered (413, 401).
                    Poll::Ready(Err(UploadError::Write(e))) => {
                        write_error = Some(e);
                        upload = None;
                    }
                    Poll::Pending => {}
                }
            }
            c.poll_head(cx, head_request, upgrade, write_error.as_deref())
        })
        .await
        .map_err(SendError::Failed)?;
        if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
            let mut resp = Response::new(Body { decoder: Decoder::new(head.framing), conn: None, upload_done: None, reusable: false, home: None, fields: Some(Box::new(head.fields)) });
            *resp.status_mut() = head.status;
            *resp.headers_mut() = crate::headers::reuse(2);
            resp.extensions_mut().insert(Upgraded(Arc::new(std::sync::Mutex::new(Some(Conn(c))))));
            return Ok(resp);
        }
        // An upload cut short, or still going, leaves the connection unusable for another
        // request; one still going carries on in its own task.
        let reusable = head.keep_alive && write_error.is_none() && upload.is_none();
        let upload_done = upload.map(|up| c.io.hand_off(up));
        let mut resp = Response::new(Body {
            decoder: Decoder::new(head.framing),
            conn: Some(Conn(c)),
            upload_done,
            reusable,
            home: Some(home),
            fields: Some(Box::new(head.fields)),
        });
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        // Only what the proxy adds goes in the map (`x-weft-variant`); the downstream
        // connection hands it back to the spares after the head is written.
        *resp.headers_mut() = crate::headers::reuse(2);
        if let Some(r) = head.reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r).ok()) {
            resp.extensions_mut().insert(r);
        }
        let body = resp.body_mut();
        if body.decoder.is_done() {
            body.finish();
        }
        Ok(resp)
    }
}

impl Inner {
    fn poll_head(&mut self, cx: &mut Context<'_>, head_request: bool, upgrade: bool, write_error: Option<&str>) -> Poll<Result<codec::Head, String>> {
        loop {
            // Parsed only once bytes came (an empty buffer is the usual case before a read).
            if !self.rbuf.is_empty()
                && let Some(head) = codec::parse_response(&mut self.rbuf, head_request, upgrade).map_err(|e| e.to_string())?
            {
                return Poll::Ready(Ok(head));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => {
                    let why = write_error.map_or(String::new(), |e| format!(" (writing the request body: {e})"));
                    return Poll::Ready(Err(format!("connection closed before the response{why}")));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(format!("error reading the response: {e}"))),
            }
        }
    }

    /// Read once from the socket into the buffer's free room.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let room = make_room(&mut self.rbuf, self.next_read);
        let n = ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf))?;
        grow_reads(n, room, &mut self.next_read);
        Poll::Ready(Ok(n))
    }
}

/// Keep at least [`MIN_READ_ROOM`] free in a read buffer (growing it by `next_read`); returns
/// the room there is for the next read.
fn make_room(buf: &mut BytesMut, next_read: usize) -> usize {
    if buf.capacity() - buf.len() < MIN_READ_ROOM {
        buf.reserve(next_read);
    }
    buf.capacity() - buf.len()
}

/// A read of `n` that filled all its `room` means a large body: read more at a time, up to
/// [`MAX_READ`].
fn grow_reads(n: usize, room: usize, next_read: &mut usize) {
    if n == room && *next_read < MAX_READ {
        *next_read *= 2;
    }
}

/// The connection's socket: whole, or only its read half once the rest of an upload went to a
/// task of its own.
enum Io {
    Whole(Stream),
    Read(ReadHalf),
    /// Only while being split.
    Gone,
}

impl Io {
    /// Move the rest of `up` to its own task on the write half; the returned sender, dropped
    /// when the response ends, starts the upload's [`LINGER`].
    fn hand_off(&mut self, mut up: Box<Upload>) -> oneshot::Sender<()> {
        let (done, ended) = oneshot::channel::<()>();
        if let Io::Whole(s) = std::mem::replace(self, Io::Gone) {
            let (r, mut w) = s.into_split();
            *self = Io::Read(r);
            tokio::spawn(async move {
                // An upstream that stopped reading (it answered and closed) gets no more; the
                // client's body is then read and dropped, so that it can finish sending and
                // read its answer instead of meeting a reset.
                let upload = poll_fn(|cx| loop {
                    match ready!(up.poll(cx, &mut w)) {
                        Err(UploadError::Write(_)) => up.discard(),
                        _ => return Poll::Ready(()),
                    }
                });
                tokio::pin!(upload);
                tokio::select! {
                    _ = &mut upload => return,
                    _ = ended => {}
                }
                let _ = tokio::time::timeout(LINGER, upload).await;
                // Dropping the write half sends FIN: an upstream still reading sees the end.
            });
        }
        done
    }
}

impl tokio::io::AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Whole(s) => Pin::new(s).poll_read(cx, buf),
            Io::Read(r) => Pin::new(r).poll_read(cx, buf),
            Io::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

/// Write `buf` from `done` on, counting in `done` what was written. Takes the socket shared
/// (readiness, then `try_write`): weft's server writes to a socket a request body also holds.
pub(crate) fn poll_write_all(tcp: &TcpStream, cx: &mut Context<'_>, buf: &[u8], done: &mut usize) -> Poll<io::Result<()>> {
    while *done < buf.len() {
        ready!(tcp.poll_write_ready(cx))?;
        match tcp.try_write(&buf[*done..]) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => *done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
    Poll::Ready(Ok(()))
}

enum UploadError {
    /// Reading the downstream's body failed.
    Body(String),
    /// Writing to the upstream failed.
    Write(String),
}

/// A request body on its way upstream, encoded per its framing.
struct Upload {
    body: ReqBody,
    framing: ReqFraming,
    /// Trailer fields the request declared (`Trailer`); only these are sent.
    trailers: Vec<HeaderName>,
    /// Bytes encoded and not yet written.
    out: VecDeque<Bytes>,
    /// The upstream stopped reading: the body is read to its end and dropped.
    discard: bool,
    /// The body has ended; what is left is in `out`.
    ended: bool,
}

impl Upload {
    fn new(body: ReqBody, framing: ReqFraming, trailers: Vec<HeaderName>) -> Upload {
        Upload { body, framing, trailers, out: VecDeque::new(), discard: false, ended: false }
    }

    /// Move the body along until it is all written (`Ready(Ok)`), fails, or waits.
    fn poll<W: AsyncWrite + Unpin>(&mut self, cx: &mut Context<'_>, io: &mut W) -> Poll<Result<(), UploadError>> {
        loop {
            if !self.out.is_empty() {
                ready!(self.poll_flush(cx, io)).map_err(|e| UploadError::Write(e.to_string()))?;
                continue;
            }
            if self.ended {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None if self.discard => return Poll::Ready(Ok(())),
                None => {
                    self.ended = true;
                    match self.framing {
                        ReqFraming::Chunked => self.out.push_back(Bytes::from(codec::chunked_end(None, &[]))),
                        ReqFraming::Length(0) | ReqFraming::Empty => {}
                        ReqFraming::Length(n) => {
                            return Poll::Ready(Err(UploadError::Body(format!("request body ended {n} bytes short of its content-length"))));
                        }
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(UploadError::Body(format!("error reading the request body: {e}")))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.encode(data)?,
                    Err(frame) => {
                        // Trailers end the body; only the chunked coding can carry them.
                        self.ended = true;
                        if self.framing == ReqFraming::Chunked && !self.discard {
                            self.out.push_back(Bytes::from(codec::chunked_end(frame.trailers_ref(), &self.trailers)));
                        }
                    }
                },
            }
        }
    }

    fn discard(&mut self) {
        self.discard = true;
        self.out.clear();
    }

    fn encode(&mut self, data: Bytes) -> Result<(), UploadError> {
        if data.is_empty() || self.discard {
            return Ok(());
        }
        match &mut self.framing {
            ReqFraming::Length(left) => {
                let n = data.len() as u64;
                if n > *left {
                    return Err(UploadError::Body(format!("request body longer than its content-length (by {} bytes)", n - *left)));
                }
                *left -= n;
                // Complete: the body may not say so until polled again, which a
                // content-length makes needless.
                self.ended = *left == 0;
                self.out.push_back(data);
            }
            ReqFraming::Chunked => {
                let (line, len) = codec::chunk_size_line(data.len());
                self.out.push_back(Bytes::copy_from_slice(&line[..len]));
                self.out.push_back(data);
                self.out.push_back(Bytes::from_static(b"\r\n"));
            }
            ReqFraming::Empty => {}
        }
        Ok(())
    }

    fn poll_flush<W: AsyncWrite + Unpin>(&mut self, cx: &mut Context<'_>, io: &mut W) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let mut slices = [IoSlice::new(&[]); 8];
            let k = slices.iter_mut().zip(&self.out).map(|(s, b)| *s = IoSlice::new(b)).count();
            let mut n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            while n > 0 {
                let front = self.out.front_mut().expect("written bytes were queued");
                if n >= front.len() {
                    n -= front.len();
                    self.out.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            }
        }
        // TLS may hold what it was given (`crate::stream`); TCP returns at once.
        Pin::new(&mut *io).poll_flush(cx)
    }
}

/// A response body read from its upstream connection.
pub struct Body {
    /// Taken when the body ends: back to the pool, or closed.
    conn: Option<Conn>,
    decoder: Decoder,
    /// An upload still going in its own task: dropped when the body ends, which starts its
    /// linger.
    upload_done: Option<oneshot::Sender<()>>,
    /// The upstream keeps the connection alive, and the whole request went out before the
    /// response came.
    reusable: bool,
    home: Option<Home>,
    /// The response's header fields (see [`fields`]: they are not in the response's map).
    /// Boxed: the body moves through every layer of the proxy, and is three times the size
    /// with them inline (callgrind counted the extra copying at ≈ 280 instructions per
    /// request, more than the box's allocation).
    fields: Option<Box<Fields>>,
}

impl Body {
    /// The response's header fields, which travel with the body rather than in the
    /// response's map; `None` once taken.
    pub fn fields(&self) -> Option<&Fields> {
        self.fields.as_deref()
    }

    pub fn take_fields(&mut self) -> Option<Box<Fields>> {
        self.fields.take()
    }

    /// The body is complete: the connection goes back to its pool if both directions ended
    /// cleanly and nothing unasked follows, else it closes.
    fn finish(&mut self) {
        self.upload_done = None;
        let (Some(conn), Some(home)) = (self.conn.take(), self.home.take()) else { return };
        if self.reusable && self.decoder.is_done() && conn.0.rbuf.is_empty() {
            home.endpoint.pool().checkin(conn, home.max_idle);
        }
    }

    fn fail(&mut self, why: String) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.conn = None;
        Poll::Ready(Some(Err(Error(why))))
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        let Some(Conn(conn)) = this.conn.as_mut() else { return Poll::Ready(None) };
        loop {
            let decoded = match this.decoder.decode(&mut conn.rbuf, MAX_FRAME) {
                Ok(d) => d,
                Err(e) => return this.fail(e.to_string()),
            };
            match decoded {
                Decoded::Data(b) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Decoded::Trailers(t) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Decoded::End => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Decoded::NeedMore => match ready!(conn.poll_fill(cx)) {
                    Ok(0) => match &mut this.decoder {
                        Decoder::Close { eof } => *eof = true,
                        _ => return this.fail("upstream closed the connection in the middle of the response body".into()),
                    },
                    Ok(_) => {}
                    Err(e) => return this.fail(format!("error reading the response body: {e}")),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done() || matches!(self.decoder, Decoder::Close { eof: true })
    }

    fn size_hint(&self) -> SizeHint {
        self.decoder.exact_remaining().map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

//! HTTP/1.1 message framing for the upstream client, without IO: the request head and body
//! framing we write (RFC 9112 §6), the response head we parse (status, headers, how its body
//! is delimited, whether the connection can be reused), and chunked transfer coding both ways.
//! Kept apart from the socket code so every rule here is tested on byte strings.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use std::mem::MaybeUninit;

use super::Head as ReqHead;
use super::fields::{Fields, Kind};
use crate::headers::ReqHeaders;

/// Most headers a response head may carry (hyper's default too).
pub const MAX_HEADERS: usize = 100;
/// Largest response head (status line and headers) we buffer before giving up.
pub const MAX_HEAD_BYTES: usize = 400 * 1024;
/// Largest trailer section of a chunked response.
const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// Most bytes of chunk extensions (and leading zeros) skipped over in one body, as hyper.
const MAX_CHUNK_EXT_BYTES: usize = 16 * 1024;

/// Why a response could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid response from upstream: {}", self.0)
    }
}
impl std::error::Error for ParseError {}

fn err<T>(what: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(what.into()))
}

/// How a request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqFraming {
    /// No body at all.
    Empty,
    Length(u64),
    Chunked,
}

/// Choose the request's framing, as hyper's client does: a valid `content-length` the request
/// already carries is kept; otherwise the body's own exact length, or chunked when unknown.
/// GET, HEAD and CONNECT from an HTTP/2 client with a body of unknown length are sent without
/// one (they almost never have bodies, and a `0` chunk on a GET confuses servers); from an
/// HTTP/1.1 client, whose own framing says a body follows, it goes on chunked. Returns the
/// framing and whether `content-length` / `transfer-encoding: chunked` must be added to the head.
pub fn request_framing(method: &Method, headers: &ReqHeaders, end_of_stream: bool, exact: Option<u64>) -> (ReqFraming, bool) {
    if let Some(n) = content_length(headers) {
        return (ReqFraming::Length(n), false);
    }
    if end_of_stream {
        return (ReqFraming::Empty, false);
    }
    match exact {
        Some(n) => (ReqFraming::Length(n), true),
        // An HTTP/1.1 client's (it has fields) framed its body itself: it has one, which goes
        // on (a search query in a GET); only an HTTP/2 stream left open says nothing.
        None if headers.fields.is_none() && matches!(*method, Method::GET | Method::HEAD | Method::CONNECT) => (ReqFraming::Empty, false),
        None => (ReqFraming::Chunked, true),
    }
}

/// Append the request head: `METHOD target HTTP/1.1`, the headers as given (hop-by-hop ones
/// were removed by the caller) except those named in `head.set`, which are written with the
/// values given there, and the framing header when `add_framing`. A `content-length` that is
/// not the one framing the body (invalid, or beside our own) is left out.
pub fn encode_request_head(out: &mut Vec<u8>, head: &ReqHead<'_>, framing: ReqFraming, add_framing: bool) {
    let (method, target, h) = (head.method.as_str(), head.target, head.headers);
    let size: usize = h.map.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>() + h.fields.as_ref().map_or(0, Fields::wire_len);
    let set_size: usize = head.set.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    out.reserve(method.len() + target.len() + size + set_size + 48);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(if target.is_empty() { b"/" } else { target.as_bytes() });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let keep_length = !add_framing && matches!(framing, ReqFraming::Length(_));
    let mut put = |k: &[u8], v: &[u8]| {
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    };
    let set_here = |k: &[u8]| head.set.iter().any(|(s, _)| s.as_str().len() == k.len() && s.as_str().as_bytes().eq_ignore_ascii_case(k));
    for (k, v) in &h.map {
        if k == header::TRANSFER_ENCODING || (k == header::CONTENT_LENGTH && !keep_length) || head.set.iter().any(|(s, _)| *s == k) {
            continue;
        }
        put(k.as_str().as_bytes(), v.as_bytes());
    }
    // The client's fields (hop-by-hop ones left out as they were read), except those the map
    // or the set replace.
    for (kind, k, v) in h.fields.iter().flat_map(Fields::entries) {
        if (kind == Kind::ContentLength && !keep_length) || set_here(k) || crate::headers::holds(&h.map, k) {
            continue;
        }
        put(k, v);
    }
    for &(k, v) in head.set {
        put(k.as_str().as_bytes(), v);
    }
    if let Some(protocol) = head.upgrade {
        put(b"connection", b"upgrade");
        put(b"upgrade", protocol);
    }
    if add_framing {
        match framing {
            ReqFraming::Length(n) => {
                out.extend_from_slice(b"content-length: ");
                push_decimal(out, n);
                out.extend_from_slice(b"\r\n");
            }
            ReqFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            ReqFraming::Empty => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

pub(super) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The line that opens one chunk of `len` bytes: its size in hex and CRLF.
pub fn chunk_size_line(len: usize) -> ([u8; 18], usize) {
    let mut line = [0u8; 18];
    let hex = b"0123456789abcdef";
    let digits = if len == 0 { 1 } else { (usize::BITS - len.leading_zeros()).div_ceil(4) as usize };
    for i in 0..digits {
        line[digits - 1 - i] = hex[(len >> (4 * i)) & 0xf];
    }
    line[digits] = b'\r';
    line[digits + 1] = b'\n';
    (line, digits + 2)
}

/// The end of a chunked body: the last chunk, then the trailers the request declared in its
/// `Trailer` header (`allowed`), then the blank line. As hyper's client: undeclared trailers,
/// and fields that must never be trailers (framing, routing, auth), are not sent.
pub fn chunked_end(trailers: Option<&HeaderMap>, allowed: &[HeaderName]) -> Vec<u8> {
    let mut out = b"0\r\n".to_vec();
    let sent = |k: &HeaderName| allowed.contains(k) && allowed_trailer(k);
    for (k, v) in trailers.into_iter().flatten().filter(|(k, _)| sent(k)) {
        out.extend_from_slice(k.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Fields never sent as trailers (RFC 9110 §6.5.1; hyper's list).
pub(super) fn allowed_trailer(name: &HeaderName) -> bool {
    use header::*;
    ![AUTHORIZATION, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, HOST, MAX_FORWARDS, SET_COOKIE, TRAILER, TRANSFER_ENCODING, TE]
        .contains(name)
}

/// The trailer fields the `Trailer` header values `values` name.
pub fn trailers_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<HeaderName> {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .filter_map(|n| HeaderName::from_bytes(n.trim_ascii()).ok())
        .collect()
}

/// A request's `content-length`, if it has a valid one (several equal values count as one).
fn content_length(headers: &ReqHeaders) -> Option<u64> {
    let mut values = headers.get_all(&header::CONTENT_LENGTH);
    let first = parse_length(values.next()?).ok()?;
    values.all(|v| parse_length(v) == Ok(first)).then_some(first)
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespFraming {
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection (which then cannot be reused).
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    /// The header fields to forward (hop-by-hop ones left out), unparsed: see [`Fields`].
    pub fields: Fields,
    pub framing: RespFraming,
    /// The upstream lets the connection carry another request after this response.
    pub keep_alive: bool,
    /// The reason phrase, when it is not the status code's canonical one.
    pub reason: Option<Bytes>,
}

/// Parse a response head from the front of `buf`, consuming it (and any informational 1xx
/// heads before it). `Ok(None)`: more bytes are needed. `head_request`: the request was HEAD,
/// so the response has no body whatever its headers say. `upgrade`: the request asked to
/// switch protocols, so a `101` is the answer (no body; the connection is the new protocol's
/// from its end on). The fields share `buf`'s memory.
pub fn parse_response(buf: &mut BytesMut, head_request: bool, upgrade: bool) -> Result<Option<Head>, ParseError> {
    loop {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, &mut slots);
        let len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => return err("response head too large"),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return err(format!("more than {MAX_HEADERS} headers")),
            Err(e) => return err(e.to_string()),
        };
        let code = resp.code.unwrap_or(0);
        let status = StatusCode::from_u16(code).map_err(|_| ParseError(format!("status {code}")))?;
        let version = if resp.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
        if code == 101 && !upgrade {
            return err("101 Switching Protocols, but no upgrade was asked for");
        }
        if (100..200).contains(&code) && code != 101 {
            buf.advance(len);
            continue; // informational (100 Continue, 103 Early Hints): the real answer follows
        }
        let mut seen = Framing::default();
        let list = Fields::read(buf, resp.headers, &mut seen);
        // A reason phrase other than the status's own goes on downstream as it came.
        let reason = resp.reason.filter(|r| !r.is_empty() && Some(*r) != status.canonical_reason()).map(|r| Bytes::copy_from_slice(r.as_bytes()));
        let mut fields = Fields::new(buf.split_to(len).freeze(), list);
        if code == 101 {
            // No body: what follows the head is the new protocol's.
            if !seen.upgrade_protocol {
                return err("101 Switching Protocols without an Upgrade header");
            }
            return Ok(Some(Head { status, version, fields, framing: RespFraming::Length(0), keep_alive: false, reason }));
        }
        let framing = seen.framing(status, version, head_request)?;
        if seen.both_framings() {
            // Not forwarded: the chunks frame the body.
            fields.drop_content_length();
        } else if seen.length_listed {
            fields.single_content_length();
        }
        let keep_alive = framing != RespFraming::Close && seen.persists(version) && !seen.both_framings();
        return Ok(Some(Head { status, version, fields, framing, keep_alive, reason }));
    }
}


/// Where a header's name and value lie in its message head: (name start, name end, value
/// start, value end).
pub(super) type Span = (u32, u32, u32, u32);

/// What a message's headers say about its framing and its connection, noted as the headers
/// are read (so none is looked up again).
#[derive(Default)]
pub(super) struct Framing {
    pub(super) transfer_encoding: bool,
    /// How many `chunked` codings the `transfer-encoding` lines list, all lines together.
    pub(super) chunked: u8,
    /// The last coding listed is `chunked`.
    pub(super) chunked_last: bool,
    /// A coding other than `chunked` is listed: the proxy would decode only the chunks and
    /// pass the body on with that coding still applied but no longer named.
    pub(super) other_coding: bool,
    /// Every `content-length` value seen agrees (RFC 9110 §8.6); `Err` once one does not.
    pub(super) length: Option<Result<u64, ()>>,
    /// The length came as a list (`5, 5`) or on more than one line: valid when the values
    /// agree, but it must not be forwarded so (RFC 9110 §8.6); it goes on as one field with one
    /// value ([`Fields::single_content_length`]).
    pub(super) length_listed: bool,
    /// How many `host` lines (requests: more than one is refused, RFC 9112 §3.2).
    pub(super) hosts: u8,
    pub(super) close: bool,
    pub(super) keep_alive: bool,
    /// `expect: 100-continue` (requests only).
    pub(super) expect_continue: bool,
    /// `Connection` lists `upgrade`.
    pub(super) upgrade: bool,
    /// An `Upgrade` field names a protocol.
    pub(super) upgrade_protocol: bool,
}

impl Framing {
    pub(super) fn note(&mut self, kind: Kind, value: &[u8]) {
        match kind {
            Kind::ContentLength => {
                let n = if is_plain_length(value) {
                    Ok(plain_length(value))
                } else {
                    self.length_listed = true;
                    parse_length(value)
                };
                self.length_listed |= self.length.is_some();
                self.length = Some(match (self.length, n) {
                    (None, n) => n,
                    (Some(Ok(a)), Ok(b)) if a == b => Ok(a),
                    _ => Err(()),
                });
            }
            Kind::TransferEncoding => {
                self.transfer_encoding = true;
                // `identity` (RFC 2616's "no coding") changes nothing and is passed over.
                let codings = value.split(|&b| b == b',').map(<[u8]>::trim_ascii);
                for coding in codings.filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity")) {
                    let chunked = coding.eq_ignore_ascii_case(b"chunked");
                    self.chunked = self.chunked.saturating_add(u8::from(chunked));
                    self.other_coding |= !chunked;
                    self.chunked_last = chunked;
                }
            }
            Kind::Connection => {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    self.close |= token.eq_ignore_ascii_case(b"close");
                    self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                    self.upgrade |= token.eq_ignore_ascii_case(b"upgrade");
                }
            }
            Kind::Expect => self.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue"),
            Kind::Host => self.hosts = self.hosts.saturating_add(1),
            Kind::Upgrade => self.upgrade_protocol = true,
            Kind::Other | Kind::Date | Kind::Te | Kind::Hop => {}
        }
    }

    /// What is wrong with the `transfer-encoding` of a message that has one, if anything:
    /// the only coding weft takes is `chunked`, once (RFC 9112 §6.1 forbids applying it
    /// twice; a body framed so is read one way here and another way by the next hop).
    /// `Ok(())`: the body is chunked.
    pub(super) fn coding_error(&self) -> Result<(), CodingError> {
        if self.chunked > 1 {
            Err(CodingError::ChunkedTwice)
        } else if self.other_coding {
            Err(CodingError::Unsupported)
        } else if !self.chunked_last {
            Err(CodingError::NotChunked)
        } else {
            Ok(())
        }
    }

    fn framing(&self, status: StatusCode, version: Version, head_request: bool) -> Result<RespFraming, ParseError> {
        if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
            return Ok(RespFraming::Length(0));
        }
        if self.transfer_encoding {
            if version == Version::HTTP_10 {
                return err("transfer-encoding in an HTTP/1.0 response");
            }
            return match self.coding_error() {
                Ok(()) => Ok(RespFraming::Chunked),
                Err(CodingError::NotChunked) => Ok(RespFraming::Close),
                Err(e) => err(e.to_string()),
            };
        }
        match self.length {
            Some(Ok(n)) => Ok(RespFraming::Length(n)),
            Some(Err(())) => err("invalid content-length"),
            None => Ok(RespFraming::Close),
        }
    }

    /// Whether the connection stays open after this response (RFC 9112 §9.3): a `close`
    /// anywhere wins; HTTP/1.0 persists only when asked to.
    pub(super) fn persists(&self, version: Version) -> bool {
        !self.close && (version != Version::HTTP_10 || self.keep_alive)
    }

    /// Both `transfer-encoding` and `content-length`: the coding frames the body, and the
    /// length must not be forwarded (RFC 9112 §6.3); the connection is not reused after it.
    pub(super) fn both_framings(&self) -> bool {
        self.transfer_encoding && self.length.is_some()
    }
}

/// Why a `transfer-encoding` is refused ([`Framing::coding_error`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CodingError {
    ChunkedTwice,
    /// A coding other than chunked (gzip, deflate, compress, an extension).
    Unsupported,
    /// No coding but `identity`, or none at all: nothing frames the body. A request must
    /// then be refused (RFC 9112 §6.3); a response runs to the close.
    NotChunked,
}

impl std::fmt::Display for CodingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CodingError::ChunkedTwice => "transfer-encoding applies chunked more than once",
            CodingError::Unsupported => "transfer-encoding lists a coding other than chunked, which weft does not decode",
            CodingError::NotChunked => "transfer-encoding does not end with chunked",
        })
    }
}

/// A `content-length` value of plain digits: nearly every one.
fn is_plain_length(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit)
}

/// The value of a [`is_plain_length`] one.
fn plain_length(v: &[u8]) -> u64 {
    v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
}

/// One `content-length` value: digits, or a comma-separated list of equal ones.
pub(super) fn parse_length(v: &[u8]) -> Result<u64, ()> {
    // Nearly every value is plain digits: read them without splitting.
    if is_plain_length(v) {
        return Ok(plain_length(v));
    }
    let mut found = None;
    for part in v.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n = plain_length(part);
        if found.is_some_and(|f| f != n) {
            return Err(());
        }
        found = Some(n);
    }
    found.ok_or(())
}

/// What the body decoder produced from the buffered bytes.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// Read more from the connection.
    NeedMore,
}

/// A response body decoder over the connection's read buffer.
#[derive(Debug)]
pub enum Decoder {
    Length(u64),
    Chunked(Chunked),
    /// Everything until the upstream closes; `eof` is set by the reader.
    Close { eof: bool },
}

impl Decoder {
    pub fn new(f: RespFraming) -> Decoder {
        match f {
            RespFraming::Length(n) => Decoder::Length(n),
            RespFraming::Chunked => Decoder::Chunked(Chunked::default()),
            RespFraming::Close => Decoder::Close { eof: false },
        }
    }

    /// Take what the buffer holds of the body, up to `max` bytes in one data frame.
    pub fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, ParseError> {
        match self {
            Decoder::Length(0) => Ok(Decoded::End),
            Decoder::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = (*left).min(buf.len() as u64).min(max as u64) as usize;
                *left -= n as u64;
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Decoder::Chunked(c) => c.decode(buf, max),
            Decoder::Close { eof } => match (buf.is_empty(), *eof) {
                (false, _) => {
                    let n = buf.len().min(max);
                    Ok(Decoded::Data(buf.split_to(n).freeze()))
                }
                (true, true) => Ok(Decoded::End),
                (true, false) => Ok(Decoded::NeedMore),
            },
        }
    }

    /// No more body will come (so the connection's next bytes are the next response's).
    pub fn is_done(&self) -> bool {
        match self {
            Decoder::Length(n) => *n == 0,
            Decoder::Chunked(c) => c.state == ChunkState::Done,
            Decoder::Close { .. } => false,
        }
    }

    /// The body's remaining length, when the framing says it.
    pub fn exact_remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Chunked(c) if c.state == ChunkState::Done => Some(0),
            _ => None,
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading the hex size of the next chunk.
    #[default]
    Size,
    /// After the size: optional whitespace, then `;extensions` or CRLF.
    SizeWs,
    /// `;extensions`, up to CRLF.
    Ext,
    Data,
    /// The CRLF after a chunk's data.
    DataEnd,
    /// After the last (zero-size) chunk: trailer fields, then a blank line.
    Trailers,
    Done,
}

/// The chunked transfer coding, decoded incrementally: data is handed on as soon as it
/// arrives, whatever the chunk boundaries.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    /// Digits of the size seen, and how many of them count (leading zeros do not).
    digits: u8,
    significant: u8,
    /// Extension bytes skipped so far in this body.
    ext: usize,
    /// The size line ended (CR seen, waiting for LF).
    cr: bool,
}

impl Chunked {
    fn decode(&mut self, buf: &mut BytesMut, max: usize) -> Result<Decoded, ParseError> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(Decoded::End),
                ChunkState::Size | ChunkState::SizeWs | ChunkState::Ext => {
                    let Some(&b) = buf.first() else { return Ok(Decoded::NeedMore) };
                    buf.advance(1);
                    self.size_line_byte(b)?;
                }
                ChunkState::Data => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = self.size.min(buf.len() as u64).min(max as u64) as usize;
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return err("chunk data not followed by CRLF");
                    }
                    buf.advance(2);
                    *self = Chunked { ext: self.ext, ..Chunked::default() };
                }
                ChunkState::Trailers => return self.trailers(buf),
            }
        }
    }

    fn size_line_byte(&mut self, b: u8) -> Result<(), ParseError> {
        if self.cr {
            if b != b'\n' {
                return err("chunk size line not ended by CRLF");
            }
            self.cr = false;
            self.state = if self.size == 0 { ChunkState::Trailers } else { ChunkState::Data };
            return Ok(());
        }
        match (self.state, b) {
            (ChunkState::Size, b) if b.is_ascii_hexdigit() => {
                self.digits = self.digits.saturating_add(1);
                if self.size > 0 || b != b'0' {
                    if self.significant == 16 {
                        return err("chunk size too large");
                    }
                    self.significant += 1;
                } else {
                    self.count_ext()?; // a leading zero: bounded like extensions
                }
                self.size = self.size << 4 | u64::from((b as char).to_digit(16).unwrap_or(0));
            }
            (_, _) if self.state == ChunkState::Size && self.digits == 0 => return err("chunk without a size"),
            (ChunkState::Size | ChunkState::SizeWs, b'\r') => self.cr = true,
            (ChunkState::Size | ChunkState::SizeWs, b' ' | b'\t') => {
                self.state = ChunkState::SizeWs;
                self.count_ext()?;
            }
            (ChunkState::Size | ChunkState::SizeWs, b';') => self.state = ChunkState::Ext,
            (ChunkState::Size | ChunkState::SizeWs, _) => return err("invalid chunk size"),
            (_, b'\r') => self.cr = true,
            // Extension bytes: visible ASCII, whitespace, obs-text; no control characters.
            (_, b) if b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80 => self.count_ext()?,
            _ => return err("invalid byte in a chunk extension"),
        }
        Ok(())
    }

    fn count_ext(&mut self) -> Result<(), ParseError> {
        self.ext += 1;
        if self.ext > MAX_CHUNK_EXT_BYTES {
            return err("chunk extensions too long");
        }
        Ok(())
    }

    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Decoded, ParseError> {
        match buf.first() {
            None => return Ok(Decoded::NeedMore),
            Some(b'\n') => return err("chunked body not ended by CRLF"),
            Some(_) if buf.len() < 2 => return Ok(Decoded::NeedMore),
            Some(_) => {}
        }
        if &buf[..2] == b"\r\n" {
            buf.advance(2);
            self.state = ChunkState::Done;
            return Ok(Decoded::End);
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let (len, fields) = match httparse::parse_headers(buf, &mut slots) {
            Ok(httparse::Status::Complete(done)) => done,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_TRAILER_BYTES => return err("trailers too large"),
            Ok(httparse::Status::Partial) => return Ok(Decoded::NeedMore),
            Err(e) => return err(format!("trailers: {e}")),
        };
        let mut map = HeaderMap::with_capacity(fields.len());
        for f in fields.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| ParseError("invalid trailer name".into()))?;
            let value = HeaderValue::from_bytes(f.value).map_err(|_| ParseError(format!("invalid value of trailer {name}")))?;
            map.append(name, value);
        }
        buf.advance(len);
        self.state = ChunkState::Done;
        Ok(Decoded::Trailers(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of(raw: &str, head_request: bool) -> (Result<Option<Head>, ParseError>, BytesMut) {
        let mut b = BytesMut::from(raw.as_bytes());
        (parse_response(&mut b, head_request, false), b)
    }

    fn decode_all(d: &mut Decoder, raw: &[u8], step: usize) -> Result<(Vec<u8>, Option<HeaderMap>), ParseError> {
        let mut buf = BytesMut::new();
        let (mut body, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        loop {
            match d.decode(&mut buf, 7)? {
                Decoded::Data(b) => body.extend_from_slice(&b),
                Decoded::Trailers(t) => trailers = Some(t),
                Decoded::End => return Ok((body, trailers)),
                Decoded::NeedMore if fed >= raw.len() => return err("truncated"),
                Decoded::NeedMore => {
                    let n = step.min(raw.len() - fed);
                    buf.extend_from_slice(&raw[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn request_heads_carry_the_framing_the_body_needs() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("svc"));
        let framing = |m: &Method, h: &HeaderMap, eos, exact| request_framing(m, &ReqHeaders::new(h.clone(), None), eos, exact);
        assert_eq!(framing(&Method::GET, &h, true, Some(0)), (ReqFraming::Empty, false));
        assert_eq!(framing(&Method::POST, &h, false, Some(5)), (ReqFraming::Length(5), true));
        assert_eq!(framing(&Method::POST, &h, false, None), (ReqFraming::Chunked, true));
        // A GET whose HTTP/1.1 client sent it a chunked body (the client's fields are there)
        // keeps it; an HTTP/2 GET left open is sent without one.
        let from_h1 = ReqHeaders::new(HeaderMap::new(), Some(Fields::default()));
        assert_eq!(request_framing(&Method::GET, &from_h1, false, None), (ReqFraming::Chunked, true));
        assert_eq!(request_framing(&Method::GET, &from_h1, true, None), (ReqFraming::Empty, false));
        assert_eq!(framing(&Method::GET, &h, false, None), (ReqFraming::Empty, false));
        assert_eq!(framing(&Method::GET, &h, false, None), (ReqFraming::Empty, false));
        let encode = |method: &Method, target: &str, headers: &HeaderMap, (f, add): (ReqFraming, bool)| {
            let mut out = Vec::new();
            encode_request_head(&mut out, &ReqHead { method, target, headers: &ReqHeaders::new(headers.clone(), None), set: &[], upgrade: None }, f, add);
            out
        };
        let out = encode(&Method::POST, "/v2/models/m/infer?x=1", &h, (ReqFraming::Length(5), true));
        assert_eq!(out, b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nhost: svc\r\ncontent-length: 5\r\n\r\n");

        // The request's own content-length frames the body; a stray transfer-encoding is dropped.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let (f, add) = framing(&Method::PUT, &h, false, None);
        assert_eq!((f, add), (ReqFraming::Length(12), false));
        let out = encode(&Method::PUT, "", &h, (f, add));
        assert_eq!(out, b"PUT / HTTP/1.1\r\nhost: svc\r\ncontent-length: 12\r\n\r\n");

        // An invalid content-length is not forwarded beside the one we add.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12, 13"));
        let (f, add) = framing(&Method::PUT, &h, false, Some(3));
        let out = encode(&Method::PUT, "/", &h, (f, add));
        assert_eq!(out, b"PUT / HTTP/1.1\r\nhost: svc\r\ncontent-length: 3\r\n\r\n");
    }

    #[test]
    fn headers_the_proxy_sets_replace_the_requests_own() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("svc"));
        h.insert("traceparent", HeaderValue::from_static("from-the-client"));
        h.insert("x-weft-variant", HeaderValue::from_static("forced"));
        h.insert("x-user-id", HeaderValue::from_static("7"));
        let (tp, v) = (HeaderName::from_static("traceparent"), HeaderName::from_static("x-weft-variant"));
        let set: [(&HeaderName, &[u8]); 2] = [(&tp, b"00-ab-cd-01"), (&v, b"b")];
        let mut out = Vec::new();
        encode_request_head(&mut out, &ReqHead { method: &Method::GET, target: "/", headers: &ReqHeaders::new(h, None), set: &set, upgrade: None }, ReqFraming::Empty, false);
        assert_eq!(out, b"GET / HTTP/1.1\r\nhost: svc\r\nx-user-id: 7\r\ntraceparent: 00-ab-cd-01\r\nx-weft-variant: b\r\n\r\n");
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex() {
        for (n, s) in [(0, "0\r\n"), (1, "1\r\n"), (15, "f\r\n"), (16, "10\r\n"), (65535, "ffff\r\n"), (1 << 20, "100000\r\n")] {
            let (line, len) = chunk_size_line(n);
            assert_eq!(&line[..len], s.as_bytes(), "{n}");
        }
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("x-undeclared", HeaderValue::from_static("1"));
        t.insert(header::HOST, HeaderValue::from_static("other"));
        let mut h = HeaderMap::new();
        h.insert(header::TRAILER, HeaderValue::from_static("grpc-status, host"));
        let allowed = trailers_named(h.get_all(header::TRAILER).iter().map(HeaderValue::as_bytes));
        assert_eq!(chunked_end(Some(&t), &allowed), b"0\r\ngrpc-status: 0\r\n\r\n", "declared and allowed only");
        assert_eq!(chunked_end(Some(&t), &[]), b"0\r\n\r\n");
        assert_eq!(chunked_end(None, &allowed), b"0\r\n\r\n");
    }

    #[test]
    fn a_response_head_gives_status_headers_and_framing() {
        let (h, rest) = head_of("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello", false);
        let h = h.unwrap().unwrap();
        assert_eq!((h.status, h.version, h.framing, h.keep_alive), (StatusCode::OK, Version::HTTP_11, RespFraming::Length(5), true));
        assert_eq!(h.fields.get_all("x-a").collect::<Vec<_>>(), [&b"1"[..], b"2"]);
        assert_eq!(&rest[..], b"hello");

        let (h, _) = head_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n", false);
        let h = h.unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (RespFraming::Chunked, false));
        // A listed length is valid but goes downstream as one value, written by the proxy.
        for listed in ["Content-Length: 5, 5", "Content-Length: 5\r\ncontent-length: 5", "Content-Length:  5 ,5,  5"] {
            for head_request in [false, true] {
                let (h, _) = head_of(&format!("HTTP/1.1 200 OK\r\n{listed}\r\n\r\n"), head_request);
                let h = h.unwrap().unwrap();
                let lengths: Vec<_> = h.fields.iter().collect();
                assert_eq!(lengths, [(&b"Content-Length"[..], &b"5"[..])], "{listed}");
                assert_eq!(h.framing, RespFraming::Length(if head_request { 0 } else { 5 }), "{listed}");
            }
        }
        // `identity` changes nothing: with no other coding, the body runs to the close.
        let (h, _) = head_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().framing, RespFraming::Close);
        let (h, _) = head_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, chunked\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().framing, RespFraming::Chunked);
        let (h, _) = head_of("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false);
        assert!(!h.unwrap().unwrap().keep_alive, "HTTP/1.0 closes unless asked to keep alive");
        let (h, _) = head_of("HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: Keep-Alive\r\n\r\n", false);
        assert!(h.unwrap().unwrap().keep_alive);
        for both in ["Connection: keep-alive\r\nConnection: close", "Connection: close, keep-alive"] {
            let (h, _) = head_of(&format!("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n{both}\r\n\r\n"), false);
            assert!(!h.unwrap().unwrap().keep_alive, "close wins: {both}");
        }
        // Both framings: the coding frames the body, the length is not forwarded, no reuse.
        let (h, _) = head_of("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", false);
        let h = h.unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive, h.fields.get("content-length").is_some()), (RespFraming::Chunked, false, false));
        // Reason phrases: kept only when they are not the canonical one.
        let (h, _) = head_of("HTTP/1.1 499 Client Closed Request\r\nContent-Length: 0\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().reason.as_deref(), Some(&b"Client Closed Request"[..]));
        let (h, _) = head_of("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().reason, None);
        let (h, _) = head_of("HTTP/1.1 200 OK\r\n\r\n", false);
        let h = h.unwrap().unwrap();
        assert_eq!((h.framing, h.keep_alive), (RespFraming::Close, false));
        // No body after HEAD, 204 and 304, whatever the headers say.
        let (h, _) = head_of("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", true);
        assert_eq!(h.unwrap().unwrap().framing, RespFraming::Length(0));
        let (h, _) = head_of("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().framing, RespFraming::Length(0));
    }

    #[test]
    fn informational_heads_are_skipped_and_partial_heads_wait() {
        let (h, rest) = head_of("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", false);
        assert_eq!(h.unwrap().unwrap().status, StatusCode::CREATED);
        assert!(rest.is_empty());
        let (h, rest) = head_of("HTTP/1.1 200 OK\r\nContent-Len", false);
        assert!(h.unwrap().is_none());
        assert_eq!(rest.len(), "HTTP/1.1 200 OK\r\nContent-Len".len(), "a partial head is left in the buffer");
    }

    #[test]
    fn a_101_is_the_answer_only_to_an_upgrade_and_leaves_what_follows_unread() {
        let raw = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n\x01\x02hi";
        let mut b = BytesMut::from(raw.as_bytes());
        let h = parse_response(&mut b, false, true).unwrap().unwrap();
        assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
        assert!(!h.keep_alive, "the connection is the new protocol's now");
        assert_eq!(h.fields.get("upgrade"), Some(&b"websocket"[..]));
        assert!(h.fields.forwards("sec-websocket-accept") && !h.fields.forwards("upgrade"));
        assert_eq!(&b[..], b"\x01\x02hi", "the first frame stays in the buffer");
        let mut b = BytesMut::from("HTTP/1.1 101 Switching Protocols\r\n\r\n");
        assert!(parse_response(&mut b, false, true).unwrap_err().to_string().contains("Upgrade"));
    }

    #[test]
    fn malformed_heads_are_errors_naming_the_fault() {
        for (raw, what) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "content-length"),
            ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "content-length"),
            ("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0"),
            // Decoding only the chunks would pass the body on still gzipped but no longer
            // saying so; applied twice, the next hop would read it differently.
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "other than chunked"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "other than chunked"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "more than once"),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "more than once"),
            ("HTTP/1.1 101 Switching Protocols\r\n\r\n", "101"),
            ("HTTP/1.1 2000 OK\r\n\r\n", "status"),
            ("SMTP ready\r\n\r\n", "version"),
        ] {
            let e = head_of(raw, false).0.unwrap_err();
            assert!(e.0.contains(what), "{raw:?}: {e}");
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        assert!(head_of(&format!("HTTP/1.1 200 OK\r\n{many}\r\n"), false).0.is_err());
        let big = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert!(head_of(&big, false).0.unwrap_err().0.contains("too large"));
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_boundaries() {
        let raw = b"5\r\nhello\r\n1;name=value\r\n \r\n10\r\n0123456789abcdef\r\n0\r\ngrpc-status: 0\r\n\r\n";
        for step in [1, 2, 3, 7, raw.len()] {
            let (body, trailers) = decode_all(&mut Decoder::new(RespFraming::Chunked), raw, step).unwrap();
            assert_eq!(body, b"hello 0123456789abcdef", "step {step}");
            assert_eq!(trailers.unwrap().get("grpc-status").unwrap(), "0");
        }
        let (body, trailers) = decode_all(&mut Decoder::new(RespFraming::Chunked), b"3\r\nabc\r\n0\r\n\r\n", 4).unwrap();
        assert_eq!((body.as_slice(), trailers), (&b"abc"[..], None));
        for bad in [
            &b"x\r\n"[..],
            b"3\r\nabcX\r\n",
            b"\r\n",
            b"11111111111111111\r\n",
            b"3\nabc",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"5;a\x00b\r\nhello\r\n0\r\n\r\n",
            b"0\r\n\n",
        ] {
            assert!(decode_all(&mut Decoder::new(RespFraming::Chunked), bad, 1).is_err(), "{bad:?}");
        }
        // Leading zeros are not size digits; whitespace before `;` is allowed.
        let (body, _) = decode_all(&mut Decoder::new(RespFraming::Chunked), b"00000000000000005 ;x\r\nhello\r\n0\r\n\r\n", 3).unwrap();
        assert_eq!(body, b"hello");
        // Extensions are bounded over the whole body, not per chunk.
        let mut many = Vec::new();
        for _ in 0..2000 {
            many.extend_from_slice(b"1;0123456789\r\nx\r\n");
        }
        many.extend_from_slice(b"0\r\n\r\n");
        let e = decode_all(&mut Decoder::new(RespFraming::Chunked), &many, 4096).unwrap_err();
        assert!(e.0.contains("extensions too long"), "{e}");
    }

    #[test]
    fn length_and_close_bodies_stop_where_they_should() {
        let mut d = Decoder::new(RespFraming::Length(4));
        let mut buf = BytesMut::from(&b"abcdEXTRA"[..]);
        assert_eq!(d.decode(&mut buf, 3).unwrap(), Decoded::Data(Bytes::from_static(b"abc")));
        assert_eq!(d.decode(&mut buf, 3).unwrap(), Decoded::Data(Bytes::from_static(b"d")));
        assert!(d.is_done());
        assert_eq!(d.decode(&mut buf, 3).unwrap(), Decoded::End);
        assert_eq!(&buf[..], b"EXTRA", "bytes past the body stay for the connection to judge");
        let mut d = Decoder::new(RespFraming::Close);
        let mut buf = BytesMut::new();
        assert_eq!(d.decode(&mut buf, 3).unwrap(), Decoded::NeedMore);
        d = Decoder::Close { eof: true };
        assert_eq!(d.decode(&mut buf, 3).unwrap(), Decoded::End);
        assert!(!d.is_done(), "a close-delimited body never leaves a reusable connection");
    }
}

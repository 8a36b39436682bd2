//! The server side of HTTP/1.1 framing, without IO: request heads read from downstream clients
//! (RFC 9112 §2–§6: request line, headers, how the body is delimited, whether the connection
//! persists), and the response heads written back to them. The client side is [`super::codec`],
//! whose header and body code this shares.

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Uri, Version};
use std::mem::MaybeUninit;

use super::codec::{self, CodingError, MAX_HEADERS, RespFraming};
use super::fields::{Fields, Kind};

/// A parsed request head.
#[derive(Debug)]
pub struct ReqHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    /// The header fields to forward (hop-by-hop ones left out), unparsed: see [`Fields`].
    pub fields: Fields,
    /// How the body is delimited; `None`: the request has no body.
    pub body: Option<RespFraming>,
    /// The client lets the connection carry another request after this one.
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before it sends the body.
    pub expect_continue: bool,
    /// The client asks to switch protocols (`Connection: upgrade` and an `Upgrade`, on an
    /// HTTP/1.1 request without a body: a WebSocket handshake). The proxy asks the upstream the
    /// same, and joins the two connections if it agrees ([`crate::tunnel`]).
    pub upgrade: bool,
}

/// Why a request head is refused: the status to answer with, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: StatusCode,
    pub why: String,
}

fn bad<T>(why: impl Into<String>) -> Result<T, Reject> {
    Err(Reject { status: StatusCode::BAD_REQUEST, why: why.into() })
}

fn too_large<T>(why: impl Into<String>) -> Result<T, Reject> {
    Err(Reject { status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, why: why.into() })
}

/// Parse a request head from the front of `buf`, consuming it. `Ok(None)`: more bytes are
/// needed (and fewer than `max_head` arrived). Empty lines before the request line are skipped
/// (RFC 9112 §2.2). The fields share `buf`'s memory.
pub fn parse_request(buf: &mut BytesMut, max_head: usize) -> Result<Option<ReqHead>, Reject> {
    let blank = buf.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
    if blank > 0 {
        let _ = buf.split_to(blank);
    }
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, buf, &mut slots) {
        Ok(httparse::Status::Complete(n)) if n > max_head => return too_large(format!("request head of {n} bytes, above {max_head}")),
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => return too_large(format!("request head above {max_head} bytes")),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return too_large(format!("more than {MAX_HEADERS} headers")),
        Err(e) => return bad(e.to_string()),
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes()).map_err(|_| Reject { status: StatusCode::BAD_REQUEST, why: "invalid method".into() })?;
    let version = if req.version == Some(0) { Version::HTTP_10 } else { Version::HTTP_11 };
    let target = req.path.unwrap_or_default();
    let (t0, t1) = {
        let start = target.as_ptr() as usize - buf.as_ptr() as usize;
        (start, start + target.len())
    };
    let mut seen = codec::Framing::default();
    let list = Fields::read(buf, req.headers, &mut seen);
    let head = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(t0..t1)).map_err(|_| Reject { status: StatusCode::BAD_REQUEST, why: "invalid request target".into() })?;
    let mut fields = Fields::new(head, list);
    if seen.hosts > 1 {
        // RFC 9112 §3.2: which one names the target is anyone's guess, and a hop that picks
        // the other one routes the request somewhere else.
        return bad(format!("{} Host headers; a request carries one", seen.hosts));
    }
    // RFC 9112 §6.3: a transfer coding frames the body, and only chunked can (once, RFC 9112
    // §6.1); with a content-length beside it the length goes (it could smuggle a second
    // request) and the connection closes after this exchange.
    let body = if seen.transfer_encoding {
        if version == Version::HTTP_10 {
            return bad("transfer-encoding in an HTTP/1.0 request");
        }
        match seen.coding_error() {
            Ok(()) => {}
            // RFC 9112 §6.1: a coding the server does not understand is answered 501.
            Err(e @ CodingError::Unsupported) => return Err(Reject { status: StatusCode::NOT_IMPLEMENTED, why: e.to_string() }),
            Err(e) => return bad(e.to_string()),
        }
        if seen.both_framings() {
            fields.drop_content_length();
        }
        Some(RespFraming::Chunked)
    } else {
        match seen.length {
            None | Some(Ok(0)) => None,
            Some(Ok(n)) => Some(RespFraming::Length(n)),
            Some(Err(())) => return bad("invalid content-length"),
        }
    };
    if seen.length_listed && !seen.both_framings() {
        // `5, 5` or two equal lines: valid, but forwarded only as one value (RFC 9110 §8.6).
        fields.single_content_length();
    }
    let keep_alive = seen.persists(version) && !seen.both_framings();
    let expect_continue = seen.expect_continue && version == Version::HTTP_11 && body.is_some();
    let upgrade = seen.upgrade && seen.upgrade_protocol && version == Version::HTTP_11 && body.is_none();
    Ok(Some(ReqHead { method, uri, version, fields, body, keep_alive, expect_continue, upgrade }))
}

/// How a response body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// No body bytes at all (HEAD, 204, 304), whatever the headers say.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, length unknown).
    Close,
}

/// Choose a response's framing: the body's exact length (`exact`) when it knows it, written
/// as our own `content-length` (any the headers carry is dropped, so the length sent is the
/// one the body has); else a valid `content-length` the response carries; else chunked for
/// HTTP/1.1 clients and the connection's close for 1.0. Returns the framing and whether
/// `content-length` / `transfer-encoding` must be added.
pub fn response_framing(resp: &RespHead<'_>, head_request: bool, exact: Option<u64>) -> (Out, bool) {
    let (status, version) = (resp.status, resp.version);
    let bodiless = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED || status.is_informational();
    if head_request || bodiless {
        return (Out::None, false);
    }
    if let Some(n) = exact {
        return (Out::Length(n), true);
    }
    let mut values = resp.get_all(&header::CONTENT_LENGTH);
    if let Some(first) = values.next()
        && let Ok(n) = codec::parse_length(first)
        && values.all(|v| codec::parse_length(v) == Ok(n))
    {
        return (Out::Length(n), false);
    }
    match version {
        Version::HTTP_10 => (Out::Close, false),
        _ => (Out::Chunked, true),
    }
}

/// Append a response head: the status line (`reason` when the upstream sent its own), the
/// headers except framing and connection ones, which are written here: the `framing` header
/// when `add_framing`, `connection: close` when the connection ends after this response (or
/// `keep-alive` for an HTTP/1.0 client that keeps it), and `date` when absent.
pub fn encode_response_head(out: &mut Vec<u8>, resp: &RespHead<'_>, framing: Out, add_framing: bool, keep_alive: bool) {
    let size: usize = resp.headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    out.reserve(size + resp.fields.map_or(0, Fields::wire_len) + 128);
    out.extend_from_slice(if resp.version == Version::HTTP_10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    out.extend_from_slice(resp.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or(resp.status.canonical_reason().unwrap_or("<unknown status code>").as_bytes()));
    out.extend_from_slice(b"\r\n");
    let mut date = false;
    // A content-length that frames the body is kept; any other is dropped (ours replaces it).
    let keep_length = !add_framing && matches!(framing, Out::Length(_));
    // A HEAD or 304 answer keeps the length it describes; 204 and 1xx must not carry one
    // (RFC 9110 §8.6).
    let bodiless_status = resp.status == StatusCode::NO_CONTENT || resp.status.is_informational();
    let drop_length = (!keep_length && framing != Out::None) || bodiless_status;
    let mut put = |k: &[u8], v: &[u8]| {
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    };
    for (k, v) in resp.headers {
        if k == header::TRANSFER_ENCODING || k == header::CONNECTION || k == "keep-alive" {
            continue;
        }
        if k == header::CONTENT_LENGTH && drop_length {
            continue;
        }
        date |= k == header::DATE;
        put(k.as_str().as_bytes(), v.as_bytes());
    }
    // The upstream's fields (hop-by-hop ones already left out), except those the map replaces.
    for (kind, k, v) in resp.fields.into_iter().flat_map(Fields::entries) {
        if (kind == Kind::ContentLength && drop_length) || crate::headers::holds(resp.headers, k) {
            continue;
        }
        date |= kind == Kind::Date;
        put(k, v);
    }
    if add_framing {
        match framing {
            Out::Length(n) => {
                out.extend_from_slice(b"content-length: ");
                codec::push_decimal(out, n);
                out.extend_from_slice(b"\r\n");
            }
            Out::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            Out::None | Out::Close => {}
        }
    }
    match (keep_alive, resp.version) {
        // The switch the `upgrade` header (in the map) names.
        _ if resp.status == StatusCode::SWITCHING_PROTOCOLS => out.extend_from_slice(b"connection: upgrade\r\n"),
        (false, Version::HTTP_11) => out.extend_from_slice(b"connection: close\r\n"),
        (true, Version::HTTP_10) => out.extend_from_slice(b"connection: keep-alive\r\n"),
        _ => {}
    }
    if !date {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&http_date());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The parts of a response its head is written from.
pub struct RespHead<'a> {
    pub status: StatusCode,
    pub version: Version,
    pub headers: &'a HeaderMap,
    /// An HTTP/1.1 upstream's fields, written after the map's (see [`Fields`]).
    pub fields: Option<&'a Fields>,
    /// The upstream's own reason phrase, when it was not the status's canonical one.
    pub reason: Option<&'a [u8]>,
}

impl RespHead<'_> {
    /// Every value of `name` the head will carry: the map's, then the forwarded fields'.
    pub fn get_all<'b>(&'b self, name: &'b header::HeaderName) -> impl Iterator<Item = &'b [u8]> + 'b {
        let fields = self.fields.into_iter().flat_map(move |f| f.get_all(name.as_str()));
        self.headers.get_all(name).iter().map(HeaderValue::as_bytes).chain(fields)
    }
}

/// The current time as an HTTP date, formatted once per second per thread: a response that
/// did not come with a `date` gets one (RFC 9110 §6.6.1), and formatting it costs more than
/// the rest of a small head.
fn http_date() -> [u8; 29] {
    use std::cell::Cell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: Cell<(u64, [u8; 29])> = const { Cell::new((u64::MAX, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let (at, text) = c.get();
        if at == secs {
            return text;
        }
        let mut fresh = [0u8; 29];
        let s = httpdate::fmt_http_date(now);
        fresh.copy_from_slice(&s.as_bytes()[..29]);
        c.set((secs, fresh));
        fresh
    })
}

/// The interim response a client that sent `expect: 100-continue` waits for.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A refused request's answer: its status, a JSON body naming what was wrong, and the
/// connection's close (nothing after a malformed head can be trusted to be a request).
pub fn reject_response(r: &Reject) -> Vec<u8> {
    let code = match r.status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "headers_too_large",
        StatusCode::NOT_IMPLEMENTED => "unsupported_transfer_coding",
        _ => "malformed_request",
    };
    // The shape of the proxy's other local answers (`proxy::Local`).
    let body = serde_json::json!({ "error": code, "message": r.why }).to_string() + "\n";
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("x-weft-error", HeaderValue::from_static(code));
    let mut out = Vec::new();
    let head = RespHead { status: r.status, version: Version::HTTP_11, headers: &headers, fields: None, reason: None };
    encode_response_head(&mut out, &head, Out::Length(body.len() as u64), true, false);
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<ReqHead>, Reject> {
        parse_request(&mut BytesMut::from(s), 64 * 1024)
    }

    #[test]
    fn an_upgrade_is_asked_only_with_connection_upgrade_and_a_protocol_on_a_bodiless_1_1_request() {
        let ws = "GET /chat HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n";
        let h = parse(ws).unwrap().unwrap();
        assert!(h.upgrade);
        assert_eq!(h.fields.get("upgrade"), Some(&b"websocket"[..]), "read by the proxy");
        assert!(!h.fields.forwards("upgrade"), "but never forwarded as it came");
        for not in [
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc",
        ] {
            assert!(!parse(not).unwrap().unwrap().upgrade, "{not:?}");
        }
    }

    #[test]
    fn a_101_says_connection_upgrade() {
        let mut map = HeaderMap::new();
        map.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let head = RespHead { status: StatusCode::SWITCHING_PROTOCOLS, version: Version::HTTP_11, headers: &map, fields: None, reason: None };
        let (framing, add) = response_framing(&head, false, Some(0));
        let mut out = Vec::new();
        encode_response_head(&mut out, &head, framing, add, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"), "{text}");
        assert!(text.contains("upgrade: websocket\r\n") && text.contains("connection: upgrade\r\n"), "{text}");
        assert!(!text.contains("content-length") && !text.contains("close"), "{text}");
    }

    #[test]
    fn a_get_has_no_body_and_persists() {
        let mut buf = BytesMut::from("\r\nGET /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: ranker\r\nX-A: 1\r\n\r\nGET /next");
        let h = parse_request(&mut buf, 1024).unwrap().unwrap();
        assert_eq!((h.method, h.version, h.body, h.keep_alive), (Method::GET, Version::HTTP_11, None, true));
        assert_eq!(h.uri.path(), "/v2/models/m/infer");
        assert_eq!(h.uri.query(), Some("x=1"));
        assert_eq!(h.fields.get("host"), Some(&b"ranker"[..]));
        assert_eq!(h.fields.get("x-a"), Some(&b"1"[..]));
        assert_eq!(&buf[..], b"GET /next", "only the head is consumed");
    }

    #[test]
    fn partial_heads_wait_and_oversized_ones_get_431() {
        assert!(parse("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let big = format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(2000));
        assert_eq!(parse_request(&mut BytesMut::from(big.as_str()), 1024).unwrap_err().status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let r = parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
        assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "{r:?}");
    }

    #[test]
    fn malformed_heads_get_400_naming_the_problem() {
        for (input, why) in [
            ("GET / HTTP/1.1\r\nHost ranker\r\n\r\n", "header"),
            ("GET / HTTP/1.1\r\nContent-Length: 5x\r\n\r\n", "content-length"),
            ("GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "content-length"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "more than once"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n", "more than once"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: ,\r\n\r\n", "does not end with chunked"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n", "does not end with chunked"),
            ("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", "2 Host headers"),
            ("GET / HTTP/1.1\r\nHost: a\r\nHOST: a\r\n\r\n", "2 Host headers"),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0"),
            ("\x00\x01garbage\r\n\r\n", ""),
        ] {
            let r = parse(input).unwrap_err();
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{input:?}");
            assert!(r.why.contains(why), "{input:?}: {}", r.why);
        }
    }

    #[test]
    fn body_framing_and_persistence() {
        let h = parse("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.body, h.keep_alive, h.expect_continue), (Some(RespFraming::Length(10)), true, false));
        let h = parse("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nExpect: 100-Continue\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.body, h.keep_alive, h.expect_continue), (Some(RespFraming::Chunked), true, true));
        let h = parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.body, h.keep_alive), (Some(RespFraming::Chunked), false), "both framings: chunked, then close");
        assert!(h.fields.get("content-length").is_none());
        let h = parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes unless asked");
        let h = parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap().unwrap();
        assert!(h.keep_alive);
        let h = parse("GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").unwrap().unwrap();
        assert!(!h.expect_continue, "no body, nothing to wait for");
    }

    #[test]
    fn codings_other_than_chunked_get_501() {
        for te in ["gzip", "gzip, chunked", "chunked, gzip", "x-custom, chunked"] {
            let r = parse(&format!("POST / HTTP/1.1\r\nTransfer-Encoding: {te}\r\n\r\n")).unwrap_err();
            assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{te}");
            assert!(r.why.contains("other than chunked"), "{te}: {}", r.why);
            assert!(String::from_utf8_lossy(&reject_response(&r)).contains("unsupported_transfer_coding"));
        }
    }

    #[test]
    fn a_listed_length_frames_the_body_but_is_not_forwarded_as_a_list() {
        for listed in ["Content-Length: 5, 5", "Content-Length: 5\r\nContent-Length: 5"] {
            let h = parse(&format!("POST / HTTP/1.1\r\n{listed}\r\nX-A: 1\r\n\r\n")).unwrap().unwrap();
            assert_eq!((h.body, h.keep_alive), (Some(RespFraming::Length(5)), true), "{listed}");
            assert_eq!(h.fields.iter().collect::<Vec<_>>(), [(&b"Content-Length"[..], &b"5"[..]), (b"X-A", b"1")], "{listed}");
        }
        // No body, and still a length for the upstream (some answer 411 without one).
        let h = parse("POST / HTTP/1.1\r\nContent-Length: 0, 0\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.body, h.fields.get_all("content-length").collect::<Vec<_>>()), (None, vec![&b"0"[..]]));
        let h = parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.fields.get("content-length"), Some(&b"5"[..]), "a plain length goes as it came");
    }

    #[test]
    fn te_trailers_goes_on_in_any_case() {
        let h = parse("POST / HTTP/1.1\r\nTE: Trailers\r\nContent-Length: 1\r\n\r\n").unwrap().unwrap();
        assert!(h.fields.forwards("te"));
        let mut map = HeaderMap::new();
        h.fields.copy_into(&mut map);
        assert_eq!(map.get(header::TE).unwrap(), "trailers", "HTTP/2 takes only the lowercase token");
        let h = parse("POST / HTTP/1.1\r\nTE: trailers, deflate\r\nContent-Length: 1\r\n\r\n").unwrap().unwrap();
        assert!(!h.fields.forwards("te"), "any other TE is hop-by-hop");
    }

    #[test]
    fn absolute_and_asterisk_targets_parse() {
        let h = parse("GET http://ranker:8080/a?b HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.uri.authority().map(|a| a.as_str()), h.uri.path()), (Some("ranker:8080"), "/a"));
        let h = parse("OPTIONS * HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.uri, "*");
    }

    fn head(status: u16, headers: &[(&str, &str)], version: Version, framing: Out, add: bool, keep_alive: bool) -> String {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        let mut out = Vec::new();
        let r = RespHead { status: StatusCode::from_u16(status).unwrap(), version, headers: &map, fields: None, reason: None };
        encode_response_head(&mut out, &r, framing, add, keep_alive);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn response_heads_carry_our_framing_and_connection_headers() {
        let h = head(200, &[("content-type", "text/plain"), ("transfer-encoding", "chunked"), ("connection", "x")], Version::HTTP_11, Out::Chunked, true, true);
        assert!(h.starts_with("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\ndate: "), "{h}");
        assert!(h.ends_with(" GMT\r\n\r\n") && !h.contains("connection"), "{h}");
        let h = head(404, &[("date", "then")], Version::HTTP_11, Out::Length(5), true, false);
        assert_eq!(h, "HTTP/1.1 404 Not Found\r\ndate: then\r\ncontent-length: 5\r\nconnection: close\r\n\r\n");
        let h = head(200, &[("content-length", "7"), ("date", "d")], Version::HTTP_10, Out::Length(7), false, true);
        assert_eq!(h, "HTTP/1.0 200 OK\r\ncontent-length: 7\r\ndate: d\r\nconnection: keep-alive\r\n\r\n");
        let h = head(200, &[("content-length", "7"), ("date", "d")], Version::HTTP_11, Out::None, false, true);
        assert_eq!(h, "HTTP/1.1 200 OK\r\ncontent-length: 7\r\ndate: d\r\n\r\n", "a HEAD answer keeps the length");
        let h = head(204, &[("content-length", "0"), ("date", "d")], Version::HTTP_11, Out::None, false, true);
        assert_eq!(h, "HTTP/1.1 204 No Content\r\ndate: d\r\n\r\n", "a 204 carries no length");
    }

    #[test]
    fn framing_prefers_the_header_then_the_exact_length() {
        let mut h = HeaderMap::new();
        let v11 = Version::HTTP_11;
        let framing = |status, h: &HeaderMap, head_request, version, exact| {
            response_framing(&RespHead { status, version, headers: h, fields: None, reason: None }, head_request, exact)
        };
        assert_eq!(framing(StatusCode::OK, &h, false, v11, Some(3)), (Out::Length(3), true));
        assert_eq!(framing(StatusCode::OK, &h, false, v11, None), (Out::Chunked, true));
        assert_eq!(framing(StatusCode::OK, &h, false, Version::HTTP_10, None), (Out::Close, false));
        assert_eq!(framing(StatusCode::NO_CONTENT, &h, false, v11, None), (Out::None, false));
        assert_eq!(framing(StatusCode::OK, &h, true, v11, Some(3)), (Out::None, false));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        assert_eq!(framing(StatusCode::OK, &h, false, v11, None), (Out::Length(9), false));
        assert_eq!(framing(StatusCode::OK, &h, false, v11, Some(2)), (Out::Length(2), true), "the body's own length wins");
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("x"));
        assert_eq!(framing(StatusCode::OK, &h, false, v11, None), (Out::Chunked, true), "an invalid length is not trusted");
    }

    /// An upstream response's fields as `parse_response` leaves them.
    fn upstream_fields(raw: &str) -> Fields {
        let mut b = BytesMut::from(raw.as_bytes());
        codec::parse_response(&mut b, false, false).unwrap().unwrap().fields
    }

    #[test]
    fn upstream_fields_go_out_as_they_came_unless_the_map_replaces_them() {
        let f = upstream_fields("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Weft-Variant: up\r\nConnection: keep-alive\r\nSet-Cookie: a\r\nset-cookie: b\r\nDate: then\r\nContent-Length: 4\r\n\r\n");
        let mut map = HeaderMap::new();
        map.insert("x-weft-variant", HeaderValue::from_static("b"));
        let head = RespHead { status: StatusCode::OK, version: Version::HTTP_11, headers: &map, fields: Some(&f), reason: None };
        let mut out = Vec::new();
        encode_response_head(&mut out, &head, Out::Length(4), true, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nx-weft-variant: b\r\nContent-Type: text/plain\r\nSet-Cookie: a\r\nset-cookie: b\r\nDate: then\r\ncontent-length: 4\r\n\r\n",
            "the proxy's variant replaces the upstream's; our own length replaces theirs; no hop-by-hop field"
        );
        // A HEAD answer keeps the length the upstream gave; a 204 carries none.
        let f = upstream_fields("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n");
        let empty = HeaderMap::new();
        let head = RespHead { status: StatusCode::OK, version: Version::HTTP_11, headers: &empty, fields: Some(&f), reason: None };
        assert_eq!(response_framing(&head, true, Some(0)), (Out::None, false));
        let mut out = Vec::new();
        encode_response_head(&mut out, &head, Out::None, false, true);
        assert!(String::from_utf8(out).unwrap().starts_with("HTTP/1.1 200 OK\r\nContent-Length: 9\r\ndate: "));
        // Without an exact length, a valid one among the fields frames the body and stays.
        assert_eq!(response_framing(&head, false, None), (Out::Length(9), false));
        let head = RespHead { status: StatusCode::NO_CONTENT, ..head };
        let mut out = Vec::new();
        encode_response_head(&mut out, &head, Out::None, false, true);
        assert!(!String::from_utf8(out).unwrap().contains("Content-Length"));
    }

    #[test]
    fn rejects_are_json_and_close() {
        let out = String::from_utf8(reject_response(&Reject { status: StatusCode::BAD_REQUEST, why: "invalid header name".into() })).unwrap();
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        assert!(out.contains("connection: close\r\n") && out.contains("x-weft-error: malformed_request\r\n") && out.ends_with("{\"error\":\"malformed_request\",\"message\":\"invalid header name\"}\n"), "{out}");
    }
}

//! A message's header fields as they arrived over HTTP/1.1 (a response from an upstream, a
//! request from a client): the head's bytes and where each field lies, not parsed into a
//! `HeaderMap`.
//!
//! Why: a map costs ≈ 570 instructions per field to build (the name's lookup, the value's
//! check, hashing it in; callgrind, stop 31), and a message going from HTTP/1.1 to HTTP/1.1
//! only needs its fields looked at a few times and copied out again. httparse has already
//! checked every name (a token) and every value (the byte set `HeaderValue` allows), so they
//! can be written as they came. A map is built only where one is needed: for HTTP/2
//! ([`Fields::copy_into`]).
//!
//! Hop-by-hop fields (RFC 9110 §7.6.1) are left out as the head is read, the rule
//! `strip_hop_by_hop` applies to maps. The fields `Connection` names are kept but marked: they
//! are not forwarded, yet the proxy still reads them ([`Fields::get`]), as it did when a map's
//! were stripped only after routing (a client's `Connection: host` must not lose it its
//! route). Fields in a map beside these (those the proxy sets, such as `x-weft-variant`)
//! replace the same-named ones here.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::codec::{Framing, Span};


/// What a field's name means to the framing and forwarding rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Other,
    ContentLength,
    TransferEncoding,
    Connection,
    Expect,
    Date,
    Host,
    Te,
    /// Hop-by-hop: never forwarded as it came, but read, since an upgrade the proxy carries
    /// out (WebSocket) writes the protocol it names on the next hop itself.
    Upgrade,
    /// Hop-by-hop, not otherwise special: keep-alive, proxy-connection, proxy-authenticate.
    Hop,
}

impl Kind {
    /// The kind of the field named `name` (ASCII case-insensitive; the length picks the one
    /// name to compare with).
    pub(super) fn of(name: &[u8]) -> Kind {
        match name.len() {
            2 if name.eq_ignore_ascii_case(b"te") => Kind::Te,
            // Every request has a Host and most responses a Date: one folded word for both.
            4 => match u32::from_le_bytes(name.try_into().unwrap_or_default()) | 0x2020_2020 {
                w if w == u32::from_le_bytes(*b"host") => Kind::Host,
                w if w == u32::from_le_bytes(*b"date") => Kind::Date,
                _ => Kind::Other,
            },
            6 if name.eq_ignore_ascii_case(b"expect") => Kind::Expect,
            7 if name.eq_ignore_ascii_case(b"upgrade") => Kind::Upgrade,
            10 if folded_eq(name, b"connection") => Kind::Connection,
            10 if folded_eq(name, b"keep-alive") => Kind::Hop,
            14 if folded_eq(name, b"content-length") => Kind::ContentLength,
            16 if folded_eq(name, b"proxy-connection") => Kind::Hop,
            17 if folded_eq(name, b"transfer-encoding") => Kind::TransferEncoding,
            18 if folded_eq(name, b"proxy-authenticate") => Kind::Hop,
            _ => Kind::Other,
        }
    }
}

/// `name == lower`, ASCII case-insensitive, eight bytes at a time, for `lower` of at least 8
/// bytes made of lowercase letters and `-` only. Setting bit 5 lowercases a letter and leaves
/// `-` as it is; of the bytes a name may hold (tokens), only a letter's two cases land on a
/// lowercase letter, and only `-` on `-`. Every field name of every message is classified, and
/// this costs a third of a byte-wise case-folding compare.
fn folded_eq(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(name.len() == lower.len() && lower.len() >= 8);
    let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let fold = 0x2020_2020_2020_2020u64;
    let last = lower.len() - 8;
    let mut at = 0;
    loop {
        let at_now = at.min(last);
        if word(name, at_now) | fold != word(lower, at_now) {
            return false;
        }
        if at_now == last {
            return true;
        }
        at += 8;
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Field {
    span: Span,
    kind: Kind,
    /// `Connection` names it: read, never forwarded.
    listed: bool,
}

/// A message's forwardable header fields, sharing the memory of its frozen head.
#[derive(Debug, Default, Clone)]
pub struct Fields {
    head: Bytes,
    list: Vec<Field>,
}

impl Fields {
    /// The fields httparse found in `buf` (`headers` borrow from it), noting what they say
    /// about framing and the connection in `seen`; hop-by-hop ones are noted but not kept, and
    /// those `Connection` names are marked. Where they lie is kept, to be read from `buf` once
    /// frozen ([`Fields::new`]).
    pub(super) fn read(buf: &[u8], headers: &[httparse::Header<'_>], seen: &mut Framing) -> Vec<Field> {
        let base = buf.as_ptr() as usize;
        let mut list = Vec::with_capacity(headers.len());
        let mut names_others = false;
        for h in headers {
            let (name, value) = (h.name.as_bytes(), h.value);
            let kind = Kind::of(name);
            seen.note(kind, value);
            match kind {
                Kind::TransferEncoding | Kind::Hop => continue,
                Kind::Connection => {
                    names_others |= connection_names(value).next().is_some();
                    continue;
                }
                // gRPC needs `te: trailers` end to end (the token in any case); any other TE
                // value is hop-by-hop.
                Kind::Te if !value.trim_ascii().eq_ignore_ascii_case(b"trailers") => continue,
                _ => {}
            }
            let (n, v) = ((name.as_ptr() as usize - base) as u32, (value.as_ptr() as usize - base) as u32);
            // `Upgrade` is kept to be read (`get`), marked so it is not forwarded.
            list.push(Field { span: (n, n + name.len() as u32, v, v + value.len() as u32), kind, listed: kind == Kind::Upgrade });
        }
        if names_others {
            // Rare: mark the fields the `Connection` header names.
            let named: Vec<&[u8]> = headers
                .iter()
                .filter(|h| Kind::of(h.name.as_bytes()) == Kind::Connection)
                .flat_map(|h| connection_names(h.value))
                .collect();
            for f in &mut list {
                f.listed = f.kind == Kind::Upgrade || named.iter().any(|n| n.eq_ignore_ascii_case(&buf[f.span.0 as usize..f.span.1 as usize]));
            }
        }
        list
    }

    /// The fields `list` ([`Fields::read`]) of the head `head`, frozen from the same bytes.
    pub(super) fn new(head: Bytes, list: Vec<Field>) -> Fields {
        Fields { head, list }
    }

    /// Leave out every `content-length` (the coding frames the body instead).
    pub(super) fn drop_content_length(&mut self) {
        self.list.retain(|f| f.kind != Kind::ContentLength);
    }

    /// Make an agreeing `content-length` (`5, 5`, or on several lines) one field holding one
    /// value (RFC 9110 §8.6), so that a message whose length is not rewritten (HEAD and 304
    /// answers, a request's `0`) still carries it: the first field keeps its first element,
    /// the others go.
    pub(super) fn single_content_length(&mut self) {
        let head = &self.head;
        let mut first = true;
        self.list.retain_mut(|f| {
            if f.kind != Kind::ContentLength {
                return true;
            }
            if !std::mem::take(&mut first) {
                return false;
            }
            let value = &head[f.span.2 as usize..f.span.3 as usize];
            let element = value.split(|&b| b == b',').next().unwrap_or_default().trim_ascii();
            let at = f.span.2 + (element.as_ptr() as usize - value.as_ptr() as usize) as u32;
            f.span.2 = at;
            f.span.3 = at + element.len() as u32;
            true
        });
    }

    /// How many fields are forwarded.
    pub fn len(&self) -> usize {
        self.forwarded().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn forwarded(&self) -> impl Iterator<Item = &Field> {
        self.list.iter().filter(|f| !f.listed)
    }

    /// Each forwarded field's kind, name (as the peer spelled it) and value, in order.
    pub(super) fn entries(&self) -> impl Iterator<Item = (Kind, &[u8], &[u8])> {
        let h = &self.head;
        self.forwarded().map(move |f| {
            let s = f.span;
            (f.kind, &h[s.0 as usize..s.1 as usize], &h[s.2 as usize..s.3 as usize])
        })
    }

    /// Each forwarded field's name and value, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.entries().map(|(_, n, v)| (n, v))
    }

    /// [`Fields::get`], sharing the head's memory.
    pub fn get_shared(&self, name: &str) -> Option<Bytes> {
        let f = self.list.iter().find(|f| named(&self.head, f, name))?;
        Some(self.head.slice(f.span.2 as usize..f.span.3 as usize))
    }

    /// Leave out every field named `name`.
    pub fn remove(&mut self, name: &str) {
        let head = &self.head;
        self.list.retain(|f| !named(head, f, name));
    }

    /// The first value of the field named `name` (ASCII case-insensitive), forwarded or not
    /// (one that `Connection` names is read too: routing, trace context and tenant saw it
    /// when maps were stripped only after them).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let f = self.list.iter().find(|f| named(&self.head, f, name))?;
        Some(&self.head[f.span.2 as usize..f.span.3 as usize])
    }

    /// Every forwarded value of the field named `name` (ASCII case-insensitive), in order: what
    /// framing and declared trailers are decided on, since it is what the peer will see.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.forwarded().filter(move |f| named(&self.head, f, name)).map(|f| &self.head[f.span.2 as usize..f.span.3 as usize])
    }

    /// Whether a field named `name` is forwarded.
    pub fn forwards(&self, name: &str) -> bool {
        self.forwarded().any(|f| named(&self.head, f, name))
    }

    /// Bytes the forwarded fields take as `name: value\r\n` lines.
    pub(super) fn wire_len(&self) -> usize {
        self.forwarded().map(|f| (f.span.1 - f.span.0 + f.span.3 - f.span.2) as usize + 4).sum()
    }

    /// Append the forwarded fields to `map`, except those whose name `map` already holds (its
    /// own replace them). Values share the head's memory.
    pub fn copy_into(&self, map: &mut HeaderMap) {
        let own: Vec<HeaderName> = map.keys().cloned().collect();
        for f in self.forwarded() {
            let s = f.span;
            // Both checks passed in httparse already (a token; `HeaderValue`'s byte set); a
            // field that still fails (a name over http's 64 KiB) cannot be sent and is left out.
            let Ok(name) = HeaderName::from_bytes(&self.head[s.0 as usize..s.1 as usize]) else { continue };
            if own.contains(&name) {
                continue;
            }
            if f.kind == Kind::Te {
                // HTTP/2 allows `te` only as exactly `trailers` (RFC 9113 §8.2.2), and h2
                // servers compare it byte for byte; this client may have sent `Trailers`.
                map.append(name, HeaderValue::from_static("trailers"));
            } else if let Ok(value) = HeaderValue::from_maybe_shared(self.head.slice(s.2 as usize..s.3 as usize)) {
                map.append(name, value);
            }
        }
    }
}

/// Whether `f` of `head` is named `name` (ASCII case-insensitive). Every request looks up half
/// a dozen names, most of them absent: the lengths differ for nearly every field, and are
/// compared first.
fn named(head: &[u8], f: &Field, name: &str) -> bool {
    (f.span.1 - f.span.0) as usize == name.len() && head[f.span.0 as usize..f.span.1 as usize].eq_ignore_ascii_case(name.as_bytes())
}

/// The field names a `Connection` value lists, besides its `close` and `keep-alive` options.
fn connection_names(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of a head given as `name: value` lines, as parse_response reads them.
    fn read(lines: &[&str]) -> (Fields, Framing) {
        let text: String = lines.iter().map(|l| format!("{l}\r\n")).collect::<String>() + "\r\n";
        let head = Bytes::from(text);
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let Ok(httparse::Status::Complete((_, headers))) = httparse::parse_headers(&head, &mut slots) else { panic!("bad test head") };
        let mut seen = Framing::default();
        let list = Fields::read(&head, headers, &mut seen);
        (Fields::new(head.clone(), list), seen)
    }

    #[test]
    fn the_eight_byte_compare_agrees_with_case_folding_for_every_token_byte() {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        let four = |n: &[u8]| u32::from_le_bytes(n.try_into().unwrap()) | 0x2020_2020;
        for target in [b"host", b"date"] {
            for at in 0..4 {
                for b in (0..=255u8).filter(|&b| token(b)) {
                    let mut name = *target;
                    name[at] = b;
                    assert_eq!(four(&name) == four(target), name.eq_ignore_ascii_case(target), "{:?}", String::from_utf8_lossy(&name));
                }
            }
        }
        for target in [&b"connection"[..], b"keep-alive", b"content-length", b"proxy-connection", b"transfer-encoding", b"proxy-authenticate"] {
            for at in 0..target.len() {
                for b in (0..=255u8).filter(|&b| token(b)) {
                    let mut name = target.to_vec();
                    name[at] = b;
                    assert_eq!(folded_eq(&name, target), name.eq_ignore_ascii_case(target), "{:?}", String::from_utf8_lossy(&name));
                }
            }
        }
    }

    #[test]
    fn names_are_classified_whatever_their_case() {
        for (n, k) in [
            ("Content-Length", Kind::ContentLength),
            ("TRANSFER-ENCODING", Kind::TransferEncoding),
            ("connection", Kind::Connection),
            ("Keep-Alive", Kind::Hop),
            ("Upgrade", Kind::Upgrade),
            ("Proxy-Connection", Kind::Hop),
            ("proxy-authenticate", Kind::Hop),
            ("TE", Kind::Te),
            ("Date", Kind::Date),
            ("HOST", Kind::Host),
            ("expect", Kind::Expect),
            ("content-type", Kind::Other),
            ("x-connection", Kind::Other),
            ("content_length", Kind::Other),
            ("Content-Lengtx", Kind::Other),
            ("xontent-length", Kind::Other),
            ("transfer-encodinG", Kind::TransferEncoding),
            ("transfer-encodin_", Kind::Other),
            ("", Kind::Other),
        ] {
            assert_eq!(Kind::of(n.as_bytes()), k, "{n}");
        }
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_not_forwarded() {
        let (f, seen) = read(&[
            "Content-Type: text/plain",
            "Connection: keep-alive, X-Private",
            "Keep-Alive: timeout=5",
            "x-private: secret",
            "Transfer-Encoding: chunked",
            "Upgrade: h2c",
            "TE: gzip",
            "Set-Cookie: a=1",
            "set-cookie: b=2",
        ]);
        let kept: Vec<(&[u8], &[u8])> = f.iter().collect();
        assert_eq!(kept, [(&b"Content-Type"[..], &b"text/plain"[..]), (b"Set-Cookie", b"a=1"), (b"set-cookie", b"b=2")]);
        assert!(seen.chunked == 1 && seen.chunked_last && seen.keep_alive && !seen.close, "the framing was still read from them");
        assert_eq!(f.get("content-type"), Some(&b"text/plain"[..]));
        assert_eq!(f.get_all("SET-COOKIE").collect::<Vec<_>>(), [&b"a=1"[..], b"b=2"]);
        assert_eq!(f.get("x-private"), Some(&b"secret"[..]), "a field Connection names is still read");
        assert_eq!(f.get_all("x-private").count(), 0, "but not forwarded");
        assert_eq!(f.len(), 3);
        let mut map = HeaderMap::new();
        f.copy_into(&mut map);
        assert!(!map.contains_key("x-private"));
        assert_eq!(f.wire_len(), "Content-Type: text/plain\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\n".len());

        let (f, _) = read(&["TE: trailers", "Connection: close"]);
        assert_eq!(f.iter().collect::<Vec<_>>(), [(&b"TE"[..], &b"trailers"[..])], "te: trailers goes end to end (gRPC)");
    }

    #[test]
    fn a_map_gets_every_field_but_those_it_already_holds() {
        let (f, _) = read(&["X-Weft-Variant: upstream", "Set-Cookie: a=1", "Set-Cookie: b=2", "Content-Length: 3"]);
        let mut map = HeaderMap::new();
        map.insert("x-weft-variant", HeaderValue::from_static("a"));
        f.copy_into(&mut map);
        assert_eq!(map.get_all("x-weft-variant").iter().collect::<Vec<_>>(), ["a"], "the map's own value wins");
        assert_eq!(map.get_all("set-cookie").iter().collect::<Vec<_>>(), ["a=1", "b=2"], "repeated fields all arrive");
        assert_eq!(map["content-length"], "3");
    }

    #[test]
    fn fields_can_be_looked_up_shared_and_removed_by_name() {
        let (mut f, _) = read(&["Host: ranker", "X-Weft-Variant: b", "x-weft-variant: c", "Accept: */*"]);
        assert_eq!(f.get_shared("host").as_deref(), Some(&b"ranker"[..]));
        f.remove("x-weft-variant");
        assert_eq!(f.iter().map(|(n, _)| n).collect::<Vec<_>>(), [&b"Host"[..], b"Accept"]);
        assert_eq!(f.get_shared("x-weft-variant"), None);
    }

    #[test]
    fn content_length_can_be_dropped_alone() {
        let (mut f, seen) = read(&["Content-Length: 3", "Date: x"]);
        assert_eq!(seen.length, Some(Ok(3)));
        f.drop_content_length();
        assert_eq!(f.entries().map(|e| e.0).collect::<Vec<_>>(), [Kind::Date]);
        assert_eq!(f.len(), 1);
    }
}

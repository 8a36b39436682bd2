//! Header helpers for the per-request path: lookups and map reuse tuned for the small maps
//! real requests and responses carry (a handful of headers), and [`ReqHeaders`], a request's
//! fields whether they came in a map (HTTP/2) or as weft's HTTP/1.1 server read them.

use http::{HeaderMap, HeaderName, HeaderValue};
use std::cell::RefCell;

use crate::h1::Fields;

/// Maps up to this many values are searched by comparing names instead of hashing.
const SCAN_UP_TO: usize = 12;

/// `h.get(name)`: the first value of `name`. A small map is scanned: comparing a few names
/// (a length check, then the bytes, or one tag for a standard name) costs less than hashing
/// `name` byte by byte (`http`'s FNV) and probing, and every request looks up half a dozen
/// names (trace context, tenant, unit id, override, model version). callgrind: ≈125
/// instructions per `get` against ≈30 for a scan of 3 headers.
pub fn find<'a>(h: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if h.len() <= SCAN_UP_TO {
        // `iter` yields each name's first value before its extra ones, as `get` returns.
        h.iter().find_map(|(n, v)| (n == name).then_some(v))
    } else {
        h.get(name)
    }
}

/// Whether `map` holds a field named `name` (ASCII case-insensitive; map names are lowercase).
pub fn holds(map: &HeaderMap, name: &[u8]) -> bool {
    !map.is_empty() && map.keys().any(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// `v` as text, if it is visible ASCII (and tabs), as `HeaderValue::to_str` has it.
pub fn visible(v: &[u8]) -> Option<&str> {
    v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)).then(|| std::str::from_utf8(v).ok()).flatten()
}

/// A request's header fields on their way through the proxy: the client's as weft's HTTP/1.1
/// server read them ([`Fields`]: not parsed into a map, see `h1::fields`), and a map for the
/// rest: all of an HTTP/2 request's, and those the proxy adds (a missing `Host`, the shadow
/// marker). A name in the map hides the same name among the fields.
#[derive(Debug, Default, Clone)]
pub struct ReqHeaders {
    pub map: HeaderMap,
    pub fields: Option<Fields>,
}

impl ReqHeaders {
    pub fn new(map: HeaderMap, fields: Option<Fields>) -> ReqHeaders {
        ReqHeaders { map, fields }
    }

    /// The first value of `name`.
    pub fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        // An HTTP/1.1 request's map is empty unless the proxy added to it.
        if !self.map.is_empty()
            && let Some(v) = find(&self.map, name)
        {
            return Some(v.as_bytes());
        }
        self.fields.as_ref()?.get(name.as_str())
    }

    /// [`ReqHeaders::get`] as text, if it is visible ASCII.
    pub fn get_str(&self, name: &HeaderName) -> Option<&str> {
        self.get(name).and_then(visible)
    }

    /// The first value of `name`, sharing the head's memory when it is among the fields (a
    /// map's value is copied).
    pub fn get_shared(&self, name: &HeaderName) -> Option<bytes::Bytes> {
        if !self.map.is_empty()
            && let Some(v) = find(&self.map, name)
        {
            return Some(bytes::Bytes::copy_from_slice(v.as_bytes()));
        }
        self.fields.as_ref()?.get_shared(name.as_str())
    }

    /// Whether the proxy sees a value of `name` (forwarded or not: see [`Fields::get`]).
    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// Whether a value of `name` goes upstream.
    pub fn forwards(&self, name: &HeaderName) -> bool {
        (!self.map.is_empty() && self.map.contains_key(name)) || self.fields.as_ref().is_some_and(|f| f.forwards(name.as_str()))
    }

    /// Every forwarded value of `name`, the map's first.
    pub fn get_all<'a>(&'a self, name: &'a HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        let hidden = !self.map.is_empty() && self.map.contains_key(name);
        let fields = self.fields.iter().filter(move |_| !hidden).flat_map(move |f| f.get_all(name.as_str()));
        self.map.get_all(name).into_iter().map(HeaderValue::as_bytes).chain(fields)
    }

    /// Every field as (name, value): the map's, then those of the client the map does not hide.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let map = self.map.iter().map(|(k, v)| (k.as_str().as_bytes(), v.as_bytes()));
        map.chain(self.fields.iter().flat_map(|f| f.iter()).filter(|(n, _)| !holds(&self.map, n)))
    }

    /// Set `name` to `value`, hiding the client's.
    pub fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        self.map.insert(name, value);
    }

    /// Leave out every value of `name`.
    pub fn remove(&mut self, name: &HeaderName) {
        self.map.remove(name);
        if let Some(f) = &mut self.fields {
            f.remove(name.as_str());
        }
    }

    /// All of them in one map (for an HTTP/2 upstream).
    pub fn to_map(&self) -> HeaderMap {
        let mut map = self.map.clone();
        if let Some(f) = &self.fields {
            f.copy_into(&mut map);
        }
        map
    }

    /// [`ReqHeaders::to_map`], taking them.
    pub fn into_map(mut self) -> HeaderMap {
        let mut map = std::mem::take(&mut self.map);
        if let Some(f) = self.fields.take() {
            f.copy_into(&mut map);
        }
        map
    }
}

/// How many emptied maps each worker thread keeps for reuse.
const SPARE_MAPS: usize = 8;
/// A map with room for more headers than this is freed rather than kept.
const LARGEST_KEPT: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// Keep `h`'s allocation for [`reuse`]: a request's header map is dropped once its exchange
/// ended, and the upstream response parsed next on the same worker needs a map of about that
/// size. Reusing it saves two allocations and two frees per proxied request (the map's index
/// table and its entries). At most [`SPARE_MAPS`] are kept; a map grown large (a request with
/// many headers) is freed instead, so the spares stay small.
pub fn recycle(mut h: HeaderMap) {
    if h.capacity() == 0 || h.capacity() > LARGEST_KEPT {
        return;
    }
    h.clear();
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARE_MAPS
        {
            s.push(h);
        }
    });
}

/// An empty map with room for at least `room` headers: a recycled one when one is spare and
/// large enough, else a new one.
pub fn reuse(room: usize) -> HeaderMap {
    let spare = SPARE
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten()
        .filter(|h| h.capacity() >= room);
    spare.unwrap_or_else(|| HeaderMap::with_capacity(room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    #[test]
    fn find_agrees_with_get_on_small_and_large_maps() {
        for n in [0usize, 1, 3, SCAN_UP_TO, SCAN_UP_TO + 1, 40] {
            let mut h = HeaderMap::new();
            for i in 0..n {
                h.append(HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(), HeaderValue::from(i));
            }
            h.append("x-dup", HeaderValue::from_static("first"));
            h.append(header::HOST, HeaderValue::from_static("a"));
            h.append("x-dup", HeaderValue::from_static("second"));
            for name in ["x-dup", "host", "x-h0", "x-absent", "traceparent"] {
                let name = HeaderName::from_static(name);
                assert_eq!(find(&h, &name), h.get(&name), "{name} in a map of {}", h.len());
            }
            assert_eq!(find(&h, &HeaderName::from_static("x-dup")).unwrap(), "first");
        }
    }

    #[test]
    fn request_headers_read_the_map_first_and_the_fields_it_does_not_hide() {
        let mut b = bytes::BytesMut::from(&b"HTTP/1.1 200 OK\r\nHost: a\r\nX-Tenant: t1\r\nSet-Cookie: 1\r\nset-cookie: 2\r\nX-Bin: caf\xc3\xa9\r\nContent-Length: 0\r\n\r\n"[..]);
        let fields = crate::h1::codec::parse_response(&mut b, false, false).unwrap().unwrap().fields;
        let mut h = ReqHeaders::new(HeaderMap::new(), Some(fields));
        let (tenant, cookie, host) = (HeaderName::from_static("x-tenant"), header::SET_COOKIE, header::HOST);
        assert_eq!(h.get_str(&tenant), Some("t1"));
        assert_eq!(h.get_str(&HeaderName::from_static("x-bin")), None, "not visible ASCII, as HeaderValue::to_str");
        assert_eq!(h.get_all(&cookie).collect::<Vec<_>>(), [&b"1"[..], b"2"]);
        assert_eq!(h.get_shared(&host).as_deref(), Some(&b"a"[..]));
        h.insert(host.clone(), HeaderValue::from_static("b"));
        assert_eq!(h.get_shared(&host).as_deref(), Some(&b"b"[..]), "the map hides the client's");
        assert_eq!(h.iter().filter(|(n, _)| n.eq_ignore_ascii_case(b"host")).count(), 1);
        h.remove(&cookie);
        assert!(!h.contains(&cookie));
        let map = h.clone().into_map();
        assert_eq!((map["host"].to_str().unwrap(), map["x-tenant"].to_str().unwrap(), map.len()), ("b", "t1", 4));
        assert_eq!(h.to_map(), map);
    }

    #[test]
    fn a_recycled_map_comes_back_empty_and_large_ones_are_not_kept() {
        let mut h = HeaderMap::with_capacity(16);
        h.insert(header::HOST, HeaderValue::from_static("a"));
        recycle(h);
        let got = reuse(4);
        assert!(got.is_empty() && got.capacity() >= 16, "a spare map, emptied");
        let big = HeaderMap::with_capacity(500);
        recycle(big);
        assert!(reuse(4).capacity() < 500, "a large map is freed, not kept");
        recycle(HeaderMap::with_capacity(8));
        assert!(reuse(100).capacity() >= 100, "a spare too small for the ask is not handed out");
    }
}

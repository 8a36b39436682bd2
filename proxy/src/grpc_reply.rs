//! Local replies to gRPC requests. A gRPC client reads the call's outcome from `grpc-status`,
//! not from the HTTP status: a 404 or 503 with a JSON body reaches the application as
//! UNIMPLEMENTED or UNKNOWN with the reason lost. So an error the sidecar answers itself is sent
//! to a gRPC caller the way Envoy does it: HTTP 200, `content-type: application/grpc`, and the
//! status in a trailers-only response (`grpc-status` and `grpc-message` in the only HEADERS
//! frame, no body). Pure: the mapping and the encoding.

use http::HeaderMap;
use http::header::CONTENT_TYPE;

/// Whether a request is a gRPC call (`application/grpc`, `application/grpc+proto`, ...).
/// gRPC-Web (`application/grpc-web`) is not: its status travels in the body.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    // Called for every request: no allocation, one header lookup.
    const GRPC: &[u8] = b"application/grpc";
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let ct = v.as_bytes().trim_ascii();
        ct.len() >= GRPC.len()
            && ct[..GRPC.len()].eq_ignore_ascii_case(GRPC)
            && matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
    })
}

/// The gRPC status code for a local reply: by weft's error kind where it says more than the
/// HTTP status (a missing route is NOT_FOUND, a full breaker or queue RESOURCE_EXHAUSTED), else
/// by the HTTP status as the gRPC spec maps it (`doc/http-grpc-status-mapping.md`).
pub fn code(kind: &str, status: u16) -> u32 {
    const INVALID_ARGUMENT: u32 = 3;
    const DEADLINE_EXCEEDED: u32 = 4;
    const NOT_FOUND: u32 = 5;
    const PERMISSION_DENIED: u32 = 7;
    const RESOURCE_EXHAUSTED: u32 = 8;
    const UNIMPLEMENTED: u32 = 12;
    const INTERNAL: u32 = 13;
    const UNAVAILABLE: u32 = 14;
    const UNAUTHENTICATED: u32 = 16;
    const UNKNOWN: u32 = 2;
    match kind {
        "unknown_host" | "no_route" => NOT_FOUND,
        "missing_host" | "invalid_host" => INVALID_ARGUMENT,
        "overflow" | "variant_overloaded" => RESOURCE_EXHAUSTED,
        "timeout" | "upstream_timeout" => DEADLINE_EXCEEDED,
        "no_healthy_endpoint" | "upstream_connect_failure" | "upstream_reset" => UNAVAILABLE,
        _ => match status {
            400 => INTERNAL,
            401 => UNAUTHENTICATED,
            403 => PERMISSION_DENIED,
            404 => UNIMPLEMENTED,
            429 | 502 | 503 | 504 => UNAVAILABLE,
            _ => UNKNOWN,
        },
    }
}

/// `grpc-message` as the spec wants it: percent-encoded outside printable ASCII, and `%`.
pub fn encode_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_requests_are_told_by_content_type() {
        let with = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            is_grpc(&h)
        };
        assert!(with("application/grpc") && with("application/grpc+proto") && with("Application/GRPC"));
        assert!(!with("application/grpc-web") && !with("application/json") && !is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn codes_follow_the_kind_then_the_http_status() {
        assert_eq!(code("no_route", 404), 5);
        assert_eq!(code("overflow", 503), 8);
        assert_eq!(code("upstream_connect_failure", 503), 14);
        assert_eq!(code("timeout", 504), 4);
        assert_eq!(code("something_new", 404), 12);
        assert_eq!(code("something_new", 503), 14);
        assert_eq!(code("something_new", 418), 2);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(encode_message("cannot connect to 10.0.0.1:80: refused"), "cannot connect to 10.0.0.1:80: refused");
        assert_eq!(encode_message("100% über\n"), "100%25 %C3%BCber%0A");
    }
}

//! Token usage and time to first byte of a response stream, for LLM serving: the sidecar keeps
//! the last few KiB of a JSON or SSE response body and, when it ends, reads the `usage` object
//! an OpenAI-compatible server (vLLM, TGI, llama.cpp, OpenAI) puts in the body or in the last
//! stream chunk: `prompt_tokens`/`completion_tokens`, or `input_tokens`/`output_tokens`.
//! Nothing is buffered beyond that bounded tail, and other content types are not looked at.

use std::time::Instant;

/// Bytes of the body's end kept for the scan: a usage object is a few hundred bytes, and an
/// SSE stream ends with it in the last chunk or two.
pub const TAIL: usize = 4096;

/// Tokens a response reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

/// What the sidecar learned from a response stream by the time it ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamInfo {
    /// When the first body byte went through (none: an empty or failed body).
    pub first_byte: Option<Instant>,
    pub tokens: Option<Tokens>,
}

/// Whether a response with this `content-type` is scanned for usage.
/// (Per response on the request path: compares bytes, allocates nothing.)
pub fn scanned(content_type: Option<&[u8]>) -> bool {
    let Some(ct) = content_type else { return false };
    let starts = |p: &[u8]| ct.len() >= p.len() && ct[..p.len()].eq_ignore_ascii_case(p);
    starts(b"application/json") || starts(b"text/event-stream") || starts(b"application/x-ndjson")
}

/// The last [`TAIL`] bytes of a body.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    pub fn push(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL {
            self.buf.clear();
            self.buf.extend_from_slice(&chunk[chunk.len() - TAIL..]);
            return;
        }
        let over = (self.buf.len() + chunk.len()).saturating_sub(TAIL);
        self.buf.drain(..over);
        self.buf.extend_from_slice(chunk);
    }

    pub fn tokens(&self) -> Option<Tokens> {
        parse(&self.buf)
    }
}

/// The token counts of the last `"usage"` object in `text`, if it has them.
pub fn parse(text: &[u8]) -> Option<Tokens> {
    let at = rfind(text, b"\"usage\"")?;
    let rest = &text[at..];
    let input = number_after(rest, b"\"prompt_tokens\"").or_else(|| number_after(rest, b"\"input_tokens\""))?;
    let output = number_after(rest, b"\"completion_tokens\"").or_else(|| number_after(rest, b"\"output_tokens\"")).unwrap_or(0);
    Some(Tokens { input, output })
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// The integer after `key` and its colon (`"key": 123`).
fn number_after(text: &[u8], key: &[u8]) -> Option<u64> {
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &text[at..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let digits: Vec<u8> = rest[colon + 1..].iter().skip_while(|b| b.is_ascii_whitespace()).take_while(|b| b.is_ascii_digit()).copied().collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_bodies_and_stream_tails_give_their_usage() {
        let body = br#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens": 12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(parse(body), Some(Tokens { input: 12, output: 34 }));
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":100}}\n\ndata: [DONE]\n\n";
        assert_eq!(parse(sse), Some(Tokens { input: 7, output: 100 }));
        let anthropic = br#"{"usage": {"input_tokens": 5, "output_tokens": 9}}"#;
        assert_eq!(parse(anthropic), Some(Tokens { input: 5, output: 9 }));
        assert_eq!(parse(br#"{"usage": null}"#), None);
        assert_eq!(parse(b"no usage here"), None);
        assert_eq!(parse(br#"{"usage":{"prompt_tokens":"many"}}"#), None);
    }

    #[test]
    fn the_tail_is_bounded_and_keeps_the_end() {
        let mut t = Tail::default();
        t.push(&vec![b'x'; 10_000]);
        t.push(br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#);
        assert!(t.buf.len() <= TAIL);
        assert_eq!(t.tokens(), Some(Tokens { input: 3, output: 4 }));
        for _ in 0..100 {
            t.push(&[b'y'; 100]);
        }
        assert_eq!(t.buf.len(), TAIL);
        assert_eq!(t.tokens(), None, "the usage scrolled out");
        assert!(scanned(Some(b"text/event-stream; charset=utf-8")) && !scanned(Some(b"image/png")) && !scanned(None));
    }
}

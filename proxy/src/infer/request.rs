//! What the picker needs from an OpenAI-style request body (`/v1/completions`,
//! `/v1/chat/completions`): the model (a base model or an adapter's name), the prompt's
//! leading blocks hashed for prefix affinity, and the prompt's length in estimated tokens.
//! Pure: the proxy hands it the bytes it buffered; a body it cannot read gives `None` and the
//! request is picked on load alone.

use serde::Deserialize;
use serde_json::Value;

/// Characters per prefix block, and at most how many leading blocks are hashed (GIE's
/// defaults: 64 and 256, so the first 16 KiB of a prompt).
pub const BLOCK_CHARS: usize = 64;
pub const MAX_BLOCKS: usize = 256;
/// Estimated characters per token (OpenAI's rule of thumb for English text and code).
pub const CHARS_PER_TOKEN: f64 = 4.0;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest {
    pub model: Option<String>,
    /// Chained hashes of the prompt's full leading blocks: `blocks[k]` stands for the first
    /// `(k + 1) · BLOCK_CHARS` bytes, so two prompts share `blocks[..n]` exactly when they
    /// share their first `n` blocks.
    pub blocks: Vec<u64>,
    /// The whole prompt's estimated length in tokens.
    pub prompt_tokens: f64,
}

#[derive(Deserialize)]
struct Body {
    model: Option<String>,
    prompt: Option<Value>,
    messages: Option<Vec<Message>>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

/// The prompt as the server will see it, near enough for affinity: a completion's prompt
/// (the first one if a list), or the chat messages one per line as `role: text`.
fn prompt_text(body: &Body) -> String {
    fn text(v: &Value) -> String {
        match v {
            Value::String(s) => s.clone(),
            // Chat content parts: [{"type": "text", "text": "..."}, {"type": "image_url", ...}]
            Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str).or(p.as_str())).collect::<Vec<_>>().join("\n"),
            _ => String::new(),
        }
    }
    if let Some(messages) = &body.messages {
        return messages.iter().map(|m| format!("{}: {}\n", m.role, text(&m.content))).collect();
    }
    match &body.prompt {
        Some(Value::Array(list)) => list.first().map(text).unwrap_or_default(),
        Some(p) => text(p),
        None => String::new(),
    }
}

/// FNV-1a over `bytes`, continuing from `h` (so each block's hash covers every byte before it).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// Chained hashes of the full leading `block_chars`-byte blocks of `prompt`, at most `max`.
pub fn blocks(prompt: &[u8], block_chars: usize, max: usize) -> Vec<u64> {
    let mut h = 0xcbf29ce484222325;
    prompt
        .chunks_exact(block_chars.max(1))
        .take(max)
        .map(|b| {
            h = fnv(h, b);
            h
        })
        .collect()
}

/// Reads a whole JSON body; `None` when it is not a completion or chat request's JSON.
pub fn parse(body: &[u8]) -> Option<InferRequest> {
    let b: Body = serde_json::from_slice(body).ok()?;
    if b.prompt.is_none() && b.messages.is_none() {
        return None;
    }
    let prompt = prompt_text(&b);
    Some(InferRequest {
        model: b.model,
        blocks: blocks(prompt.as_bytes(), BLOCK_CHARS, MAX_BLOCKS),
        prompt_tokens: prompt.chars().count() as f64 / CHARS_PER_TOKEN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_and_chat_give_model_blocks_and_length() {
        let system = "You are a careful assistant. ".repeat(10); // 290 chars
        let a = parse(format!(r#"{{"model": "sql-lora", "prompt": "{system}list the tables"}}"#).as_bytes()).unwrap();
        assert_eq!(a.model.as_deref(), Some("sql-lora"));
        assert_eq!(a.blocks.len(), (290 + 15) / BLOCK_CHARS);
        assert!((a.prompt_tokens - 305.0 / 4.0).abs() < 1e-9);
        let chat = format!(r#"{{"model": "m", "messages": [{{"role": "system", "content": "{system}"}}, {{"role": "user", "content": [{{"type": "text", "text": "hi"}}]}}]}}"#);
        let c = parse(chat.as_bytes()).unwrap();
        assert!(c.blocks.len() >= 4, "{:?}", c.blocks.len());
    }

    #[test]
    fn prompts_sharing_a_prefix_share_exactly_its_blocks() {
        let shared = "x".repeat(3 * BLOCK_CHARS);
        let a = blocks(format!("{shared}{}", "a".repeat(BLOCK_CHARS)).as_bytes(), BLOCK_CHARS, MAX_BLOCKS);
        let b = blocks(format!("{shared}{}", "b".repeat(BLOCK_CHARS)).as_bytes(), BLOCK_CHARS, MAX_BLOCKS);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        // A change in the first byte changes every later hash (they are chained), even where
        // the blocks themselves are equal.
        let c = blocks(format!("y{}{}", &shared[1..], "a".repeat(BLOCK_CHARS)).as_bytes(), BLOCK_CHARS, MAX_BLOCKS);
        assert!(c.iter().zip(&a).all(|(x, y)| x != y));
        assert_eq!(blocks(&[b'z'; 10 * BLOCK_CHARS], BLOCK_CHARS, 3).len(), 3, "at most max blocks");
    }

    #[test]
    fn bodies_that_are_not_completions_are_not_read() {
        assert_eq!(parse(b"not json"), None);
        assert_eq!(parse(br#"{"inputs": [1, 2]}"#), None);
        assert_eq!(parse(br#"{"prompt": ["first", "second"]}"#).unwrap().prompt_tokens, 5.0 / 4.0);
    }
}

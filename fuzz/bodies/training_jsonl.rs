//! Fuzzes the training-data reader (`hexlora train --data`): arbitrary
//! text read as JSONL in its three forms (prompt/completion, messages,
//! token ids), encoded by a byte-level encoder with a chat template,
//! truncated, and checked against a model's vocabulary and positions, with
//! and without an encoder. The first byte picks `--max-len`.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run training_jsonl

use hexlora::train::data::{parse_jsonl, Bounds, Encoder, Message};

/// Byte-level tokens (ids 0-255) and a ChatML-like template.
struct Bytes;

impl Encoder for Bytes {
    fn encode(&self, text: &str) -> hexlora::Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> hexlora::Result<String> {
        let mut s: String = messages.iter().map(|m| format!("<|{}|>{}<|end|>", m.role, m.content)).collect();
        if add_generation_prompt {
            s.push_str("<|assistant|>");
        }
        Ok(s)
    }
    fn end_of_turn(&self) -> String {
        "<|end|>".into()
    }
}

const BOUNDS: Bounds = Bounds { vocab_size: 200, positions: 96 };

pub fn run(bytes: &[u8]) {
    let Some((&max_len, text)) = bytes.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let max_len = max_len as usize + 1;
    if let Ok((batches, _)) = parse_jsonl(text, "fuzz.jsonl", Some(&Bytes), max_len, BOUNDS) {
        for b in &batches {
            assert!(b.input_ids[0].len() <= max_len.min(BOUNDS.positions), "an example longer than its bounds");
            assert!(b.input_ids[0].iter().all(|&t| (t as usize) < BOUNDS.vocab_size), "an id beyond the vocabulary");
        }
    }
    let _ = parse_jsonl(text, "fuzz.jsonl", None, max_len, BOUNDS);
}

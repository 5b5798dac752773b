//! Training data: JSONL, one example per line, in one of three forms:
//! - `{"prompt": "...", "completion": "..."}`: loss on the completion only;
//! - `{"messages": [{"role": ..., "content": ...}, ...]}`: chat, loss on the
//!   last assistant message only;
//! - `{"input_ids": [...], "labels": [...]}`: already tokenized (labels
//!   aligned with the ids, -100 ignored; without labels every token counts).
//!
//! Text forms need an [`Encoder`] (tokenizer + chat template of the model).
use super::graph::Batch;
use crate::{Error, Result};
use serde::Deserialize;
use std::path::Path;

pub use crate::model::chat::Message;

/// Turns text examples into token ids.
pub trait Encoder {
    /// Token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// The model's chat template applied to `messages`, with the assistant
    /// prefix appended when `add_generation_prompt`.
    fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String>;
    /// Text that ends an assistant turn (e.g. `<|im_end|>`), appended to completions.
    fn end_of_turn(&self) -> String;
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Tokens { input_ids: Vec<u32>, labels: Option<Vec<i64>> },
    Pair { prompt: String, completion: String },
    Chat { messages: Vec<Message> },
}

/// `ids = prompt ++ completion`, labels `-100` over the prompt.
fn join(prompt: Vec<u32>, completion: Vec<u32>) -> (Vec<u32>, Vec<i64>) {
    let labels = prompt.iter().map(|_| -100).chain(completion.iter().map(|&t| t as i64)).collect();
    ([prompt, completion].concat(), labels)
}

fn encode_line(line: Line, enc: Option<&dyn Encoder>, what: &str) -> Result<(Vec<u32>, Vec<i64>)> {
    let need = || enc.ok_or_else(|| Error::invalid(what, "text examples need a model with a tokenizer (or give input_ids)"));
    match line {
        Line::Tokens { input_ids, labels } => {
            let labels = labels.unwrap_or_else(|| input_ids.iter().map(|&t| t as i64).collect());
            if labels.len() != input_ids.len() {
                return Err(Error::invalid(what, "labels and input_ids differ in length"));
            }
            Ok((input_ids, labels))
        }
        Line::Pair { prompt, completion } => {
            let enc = need()?;
            Ok(join(enc.encode(&prompt)?, enc.encode(&format!("{completion}{}", enc.end_of_turn()))?))
        }
        Line::Chat { messages } => {
            let enc = need()?;
            let last = messages.last().filter(|m| m.role == "assistant").ok_or_else(|| Error::invalid(what, "chat example must end with an assistant message"))?;
            let prompt = enc.render_chat(&messages[..messages.len() - 1], true)?;
            Ok(join(enc.encode(&prompt)?, enc.encode(&format!("{}{}", last.content, enc.end_of_turn()))?))
        }
    }
}

/// Reads a JSONL file into one-row batches, truncated to `max_len` tokens.
/// Examples with no target left after truncation are skipped with a count.
pub fn load_jsonl(path: &Path, enc: Option<&dyn Encoder>, max_len: usize) -> Result<(Vec<Batch>, usize)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    let mut skipped = 0;
    for (i, raw) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let what = format!("{}:{}", path.display(), i + 1);
        let line: Line = serde_json::from_str(raw).map_err(|e| Error::format(&what, format!("{e} (expected prompt/completion, messages or input_ids)")))?;
        let (mut ids, mut labels) = encode_line(line, enc, &what)?;
        ids.truncate(max_len);
        labels.truncate(max_len);
        if labels.iter().skip(1).all(|&l| l < 0) {
            skipped += 1;
            continue;
        }
        out.push(Batch { input_ids: vec![ids], labels: vec![labels] });
    }
    if out.is_empty() {
        return Err(Error::invalid(path.display().to_string(), "no usable training examples"));
    }
    Ok((out, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-level encoder with a ChatML-like template (real, if simple).
    struct Bytes;
    impl Encoder for Bytes {
        fn encode(&self, text: &str) -> Result<Vec<u32>> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn render_chat(&self, messages: &[Message], gen: bool) -> Result<String> {
            let mut s: String = messages.iter().map(|m| format!("<{}>{}|", m.role, m.content)).collect();
            if gen {
                s.push_str("<assistant>");
            }
            Ok(s)
        }
        fn end_of_turn(&self) -> String {
            "|".into()
        }
    }

    #[test]
    fn all_three_forms_put_loss_on_the_completion_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        let lines = [
            r#"{"prompt": "ab", "completion": "c"}"#,
            r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}"#,
            r#"{"input_ids": [5, 6, 7]}"#,
            "",
        ];
        std::fs::write(&p, lines.join("\n")).unwrap();
        let (b, skipped) = load_jsonl(&p, Some(&Bytes), 100).unwrap();
        assert_eq!(skipped, 0);
        assert_eq!(b[0].input_ids[0], b"abc|".iter().map(|&c| c as u32).collect::<Vec<_>>());
        assert_eq!(b[0].labels[0], vec![-100, -100, 'c' as i64, '|' as i64]);
        let prompt_len = "<user>x|<assistant>".len();
        assert!(b[1].labels[0][..prompt_len].iter().all(|&l| l == -100));
        assert_eq!(b[1].labels[0][prompt_len..], ['y' as i64, '|' as i64]);
        assert_eq!(b[2].labels[0], vec![5, 6, 7]);
        assert!(load_jsonl(&p, None, 100).unwrap_err().to_string().contains("tokenizer"));
        std::fs::write(&p, "{\"prompt\": 3}\n").unwrap();
        assert!(load_jsonl(&p, Some(&Bytes), 100).unwrap_err().to_string().contains("d.jsonl:1"));
        std::fs::write(&p, r#"{"prompt": "abcdef", "completion": "g"}"#).unwrap();
        assert!(load_jsonl(&p, Some(&Bytes), 4).is_err(), "completion truncated away: nothing to train on");
    }
}

//! Training data: JSONL, one example per line, in one of three forms:
//! - `{"prompt": "...", "completion": "..."}`: loss on the completion only;
//! - `{"messages": [{"role": ..., "content": ...}, ...]}`: chat, loss on the
//!   last assistant message only;
//! - `{"input_ids": [...], "labels": [...]}`: already tokenized (labels
//!   aligned with the ids, -100 ignored; without labels every token counts).
//!
//! Text forms need an [`Encoder`] (tokenizer + chat template of the model).
use crate::autograd::graph::Batch;
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

/// What the model accepts of an example.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Token ids must be below this (`vocab_size`).
    pub vocab_size: usize,
    /// Examples may hold at most this many tokens (`max_position_embeddings`).
    pub positions: usize,
}

impl Bounds {
    /// The bounds of a model.
    pub fn of(config: &crate::model::config::ModelConfig) -> Bounds {
        Bounds { vocab_size: config.vocab_size, positions: config.max_position_embeddings }
    }

    /// Checks a ready batch (`hexlora grad --batch`) before the model runs:
    /// equal row lengths, ids in the vocabulary, rows within the positions.
    pub fn check(&self, batch: &Batch, what: &str) -> Result<()> {
        let (_, seq) = batch.dims().map_err(|e| Error::invalid(what, e.to_string()))?;
        if seq > self.positions {
            return Err(Error::invalid(what, format!("rows of {seq} tokens, but the model holds {} positions (max_position_embeddings)", self.positions)));
        }
        let ids = batch.input_ids.iter().enumerate().flat_map(|(r, row)| row.iter().enumerate().map(move |(k, &t)| ("input_ids", r, k, t as i64)));
        let labels = batch.labels.iter().enumerate().flat_map(|(r, row)| row.iter().enumerate().map(move |(k, &t)| ("labels", r, k, t)));
        if let Some((field, r, k, t)) = ids.chain(labels).find(|&(_, _, _, t)| t >= self.vocab_size as i64) {
            return Err(Error::invalid(what, format!("{field}[{r}][{k}] = {t} is beyond the model's vocabulary of {} ids", self.vocab_size)));
        }
        Ok(())
    }
}

enum Line {
    Tokens { input_ids: Vec<u32>, labels: Option<Vec<i64>> },
    Pair { prompt: String, completion: String },
    Chat { messages: Vec<Message> },
}

#[derive(Deserialize)]
struct PairLine {
    prompt: String,
    completion: String,
}

#[derive(Deserialize)]
struct ChatLine {
    messages: Vec<Message>,
}

/// The ids of array `field`: integers >= 0 (and -100, ignored, where
/// `ignore` allows it), each error naming the element.
fn token_ids(v: &serde_json::Value, field: &str, ignore: bool, what: &str) -> Result<Vec<i64>> {
    let a = v.as_array().ok_or_else(|| Error::format(what, format!("{field} must be an array of token ids, got {v}")))?;
    let rule = if ignore { "a token id (integer >= 0) or -100" } else { "a token id (integer >= 0)" };
    a.iter()
        .enumerate()
        .map(|(i, x)| x.as_i64().filter(|&t| t >= 0 || (ignore && t == -100)).ok_or_else(|| Error::format(what, format!("{field}[{i}] = {x} is not {rule}"))))
        .collect()
}

/// One line in whichever form its fields name; errors name the field.
fn parse_line(raw: &str, what: &str) -> Result<Line> {
    const FORMS: &str = "expected prompt/completion, messages or input_ids";
    let v: serde_json::Value = serde_json::from_str(raw).map_err(|e| Error::format(what, format!("{e} ({FORMS})")))?;
    let Some(obj) = v.as_object() else {
        return Err(Error::format(what, format!("not a JSON object ({FORMS})")));
    };
    if let Some(ids) = obj.get("input_ids") {
        let input_ids = token_ids(ids, "input_ids", false, what)?.into_iter().map(|t| u32::try_from(t).map_err(|_| Error::format(what, format!("input_ids: token id {t} is too large")))).collect::<Result<_>>()?;
        let labels = obj.get("labels").filter(|l| !l.is_null()).map(|l| token_ids(l, "labels", true, what)).transpose()?;
        return Ok(Line::Tokens { input_ids, labels });
    }
    let field = |e: serde_json::Error| Error::format(what, format!("{e} ({FORMS})"));
    if obj.contains_key("messages") {
        let c: ChatLine = serde_json::from_value(v).map_err(field)?;
        return Ok(Line::Chat { messages: c.messages });
    }
    let p: PairLine = serde_json::from_value(v).map_err(field)?;
    Ok(Line::Pair { prompt: p.prompt, completion: p.completion })
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
            if completion.trim().is_empty() {
                return Err(Error::invalid(what, "completion is empty: nothing to learn (drop the line)"));
            }
            let enc = need()?;
            Ok(join(enc.encode(&prompt)?, enc.encode(&format!("{completion}{}", enc.end_of_turn()))?))
        }
        Line::Chat { messages } => {
            let enc = need()?;
            for (i, m) in messages.iter().enumerate() {
                crate::model::chat::check_role(&m.role).map_err(|e| Error::invalid(what, format!("messages[{i}]: {e}")))?;
            }
            let last = messages.last().filter(|m| m.role == "assistant").ok_or_else(|| Error::invalid(what, "chat example must end with an assistant message"))?;
            if last.content.trim().is_empty() {
                return Err(Error::invalid(what, format!("messages[{}]: the assistant's answer is empty: nothing to learn (drop the line)", messages.len() - 1)));
            }
            let prompt = enc.render_chat(&messages[..messages.len() - 1], true)?;
            Ok(join(enc.encode(&prompt)?, enc.encode(&format!("{}{}", last.content, enc.end_of_turn()))?))
        }
    }
}

/// Reads a JSONL file into one-row batches, truncated to `max_len` tokens.
/// Examples with no target left after truncation are skipped with a count.
/// Every id must be in the model's vocabulary and every truncated example
/// must fit its positions; errors name the file, line and field.
pub fn load_jsonl(path: &Path, enc: Option<&dyn Encoder>, max_len: usize, bounds: Bounds) -> Result<(Vec<Batch>, usize)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_jsonl(&text, &path.display().to_string(), enc, max_len, bounds)
}

/// [`load_jsonl`] of text already read; `name` names the file in errors.
pub fn parse_jsonl(text: &str, name: &str, enc: Option<&dyn Encoder>, max_len: usize, bounds: Bounds) -> Result<(Vec<Batch>, usize)> {
    let mut out = Vec::new();
    // Skipped examples: `unlabelled + cut`.
    let (mut unlabelled, mut cut, mut lines) = (0, 0, 0);
    for (i, raw) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let what = format!("{name}:{}", i + 1);
        lines += 1;
        let line = parse_line(raw, &what)?;
        let (mut ids, mut labels) = encode_line(line, enc, &what)?;
        let vocab = bounds.vocab_size as i64;
        let beyond = |field: &str, k: usize, t: i64| Err(Error::invalid(&what, format!("{field}[{k}] = {t} is beyond the model's vocabulary of {vocab} ids")));
        if let Some(k) = ids.iter().position(|&t| t as i64 >= vocab) {
            return beyond("input_ids", k, ids[k] as i64);
        }
        if let Some(k) = labels.iter().position(|&t| t >= vocab) {
            return beyond("labels", k, labels[k]);
        }
        let had_target = labels.iter().skip(1).any(|&l| l >= 0);
        ids.truncate(max_len);
        labels.truncate(max_len);
        if ids.len() > bounds.positions {
            let msg = format!("{} tokens after --max-len {max_len}, but the model holds {} positions (max_position_embeddings): lower --max-len", ids.len(), bounds.positions);
            return Err(Error::invalid(&what, msg));
        }
        if labels.iter().skip(1).all(|&l| l < 0) {
            if had_target {
                cut += 1;
            } else {
                unlabelled += 1;
            }
            continue;
        }
        out.push(Batch { input_ids: vec![ids], labels: vec![labels] });
    }
    if out.is_empty() {
        let mut why = format!("no usable training examples among {lines} lines");
        if cut > 0 {
            why += &format!("; {cut} lose every answer token to --max-len {max_len} (the prompt alone is that long: raise --max-len)");
        }
        if unlabelled > 0 {
            why += &format!("; {unlabelled} have no labelled token after the first (labels all -100, or one token)");
        }
        return Err(Error::invalid(name, why));
    }
    Ok((out, unlabelled + cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: Bounds = Bounds { vocab_size: 256, positions: 64 };

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
        let (b, skipped) = load_jsonl(&p, Some(&Bytes), 100, BYTES).unwrap();
        assert_eq!(skipped, 0);
        assert_eq!(b[0].input_ids[0], b"abc|".iter().map(|&c| c as u32).collect::<Vec<_>>());
        assert_eq!(b[0].labels[0], vec![-100, -100, 'c' as i64, '|' as i64]);
        let prompt_len = "<user>x|<assistant>".len();
        assert!(b[1].labels[0][..prompt_len].iter().all(|&l| l == -100));
        assert_eq!(b[1].labels[0][prompt_len..], ['y' as i64, '|' as i64]);
        assert_eq!(b[2].labels[0], vec![5, 6, 7]);
        assert!(load_jsonl(&p, None, 100, BYTES).unwrap_err().to_string().contains("tokenizer"));
        std::fs::write(&p, "{\"prompt\": 3}\n").unwrap();
        assert!(load_jsonl(&p, Some(&Bytes), 100, BYTES).unwrap_err().to_string().contains("d.jsonl:1"));
        std::fs::write(&p, r#"{"prompt": "abcdef", "completion": "g"}"#).unwrap();
        assert!(load_jsonl(&p, Some(&Bytes), 4, BYTES).is_err(), "completion truncated away: nothing to train on");
    }

    #[test]
    fn bad_token_ids_name_the_line_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        let err = |line: &str| {
            std::fs::write(&p, format!("{{\"input_ids\": [1, 2]}}\n{line}\n")).unwrap();
            load_jsonl(&p, Some(&Bytes), 100, BYTES).unwrap_err().to_string()
        };
        let e = err(r#"{"input_ids": [1, -1]}"#);
        assert!(e.contains("d.jsonl:2") && e.contains("input_ids[1] = -1"), "{e}");
        let e = err(r#"{"input_ids": [1, 2.5]}"#);
        assert!(e.contains("input_ids[1] = 2.5"), "{e}");
        let e = err(r#"{"input_ids": [1, 300]}"#);
        assert!(e.contains("input_ids[1] = 300") && e.contains("vocabulary of 256"), "{e}");
        let e = err(r#"{"input_ids": [1, 2], "labels": [-7, 2]}"#);
        assert!(e.contains("labels[0] = -7"), "{e}");
        let e = err(r#"{"prompt": "a"}"#);
        assert!(e.contains("d.jsonl:2") && e.contains("completion"), "{e}");
        let long = format!(r#"{{"input_ids": {:?}}}"#, vec![1; 80]);
        let e = err(&long);
        assert!(e.contains("d.jsonl:2") && e.contains("max_position_embeddings"), "{e}");
    }
}

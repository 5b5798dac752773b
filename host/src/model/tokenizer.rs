//! Text <-> token ids, over the `tokenizers` crate.
//!
//! Two sources:
//! - a Hugging Face `tokenizer.json` (plus `tokenizer_config.json` /
//!   `config.json` for the bos/eos/pad ids), loaded as is;
//! - GGUF metadata (`tokenizer.ggml.*`), from which the byte-level BPE
//!   pipeline is built: vocabulary and merges from the file, the split
//!   regex named by `tokenizer.ggml.pre`, CONTROL tokens as special added
//!   tokens and USER_DEFINED ones as plain added tokens (what transformers'
//!   GGUF loader and llama.cpp do). SentencePiece GGUFs
//!   (`tokenizer.ggml.model = llama`) are not supported yet.
//!
//! ```no_run
//! use hexlora::model::{gguf::Gguf, tokenizer::Tokenizer};
//! let g = Gguf::open("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let tok = Tokenizer::from_gguf(&g)?;
//! let ids = tok.encode("<|im_start|>user\nHi<|im_end|>")?;
//! assert_eq!(tok.decode(&ids, false)?, "<|im_start|>user\nHi<|im_end|>");
//! # Ok::<(), hexlora::Error>(())
//! ```
use crate::model::gguf::Gguf;
use crate::model::sentencepiece;
use crate::{Error, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// Llama 3 (`llama-bpe`): digits in runs of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 / Qwen3: single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: letters include combining marks.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF `tokenizer.ggml.token_type` values.
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

/// A tokenizer with the ids a generation loop needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Beginning-of-sequence id, if the model has one.
    pub bos_id: Option<u32>,
    /// End-of-sequence id (generation stops here).
    pub eos_id: Option<u32>,
    /// Padding id.
    pub pad_id: Option<u32>,
    /// Whether [`Tokenizer::encode`] prepends `bos_id` (GGUF
    /// `tokenizer.ggml.add_bos_token`; a `tokenizer.json` does this in its
    /// own post-processor instead).
    add_bos: bool,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.get_str("tokenizer.ggml.model")?;
        // Only SentencePiece vocabularies depend on it; tokenizer-only files may lack it.
        let arch = g.get_str("general.architecture").unwrap_or("");
        match model {
            "gpt2" => {}
            "llama" if matches!(arch, "gemma" | "gemma2" | "gemma3") => {}
            "llama" => {
                return Err(Error::Unsupported(format!(
                    "SentencePiece GGUF tokenizers (tokenizer.ggml.model = llama) are not supported yet for \
                     architecture {arch:?} (only Gemma's are read); use the model's tokenizer.json"
                )))
            }
            other => return Err(Error::Unsupported(format!("GGUF tokenizer model {other:?}"))),
        }
        let tokens = g.get_str_array("tokenizer.ggml.tokens")?;
        let types = match g.value("tokenizer.ggml.token_type") {
            Some(_) => g.get_i32_array("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        };
        let id = |key: &str| -> Result<Option<u32>> {
            let Some(_) = g.value(key) else { return Ok(None) };
            let id = g.get_u32(key)?;
            if id as usize >= tokens.len() {
                return Err(Error::format(key, format!("token id {id} outside the vocabulary of {}", tokens.len())));
            }
            Ok(Some(id))
        };
        let mut inner = if model == "gpt2" {
            let pre = match g.value("tokenizer.ggml.pre") {
                Some(_) => g.get_str("tokenizer.ggml.pre")?,
                None => "default",
            };
            let mut t = byte_level_bpe(&tokens, &g.get_str_array("tokenizer.ggml.merges")?)?;
            set_pre_tokenizer(&mut t, pre)?;
            t
        } else {
            let unk = id("tokenizer.ggml.unknown_token_id")?.map_or("<unk>", |i| tokens[i as usize]);
            sentencepiece::gemma(&tokens, unk)?
        };
        add_gguf_added_tokens(&mut inner, &tokens, &types, model == "gpt2")?;
        // SentencePiece files without the flag get a BOS (llama.cpp's default, and transformers').
        let add_bos = match g.value("tokenizer.ggml.add_bos_token") {
            Some(_) => g.get_bool("tokenizer.ggml.add_bos_token")?,
            None => model == "llama",
        };
        Ok(Tokenizer {
            inner,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            add_bos,
        })
    }

    /// Loads `dir/tokenizer.json`; bos/eos/pad come from
    /// `tokenizer_config.json` (token strings) or `config.json` (ids).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::format(dir.display().to_string(), "no tokenizer.json"));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
        let tok_config = read_json_if_present(&dir.join("tokenizer_config.json"))?;
        let config = read_json_if_present(&dir.join("config.json"))?;
        let id = |name: &str| -> Option<u32> {
            let by_token = tok_config.get(name).and_then(|v| v.as_str().or_else(|| v.get("content")?.as_str()));
            if let Some(id) = by_token.and_then(|t| inner.token_to_id(t)) {
                return Some(id);
            }
            // config.json's eos_token_id may be a list; the first is the primary one.
            let v = config.get(format!("{name}_id"))?;
            v.as_u64().or_else(|| v.as_array()?.first()?.as_u64()).map(|x| x as u32)
        };
        Ok(Tokenizer {
            bos_id: id("bos_token"),
            eos_id: id("eos_token"),
            pad_id: id("pad_token"),
            inner,
            add_bos: false,
        })
    }

    /// Token ids of `text`. Special tokens written in the text
    /// (`<|im_start|>`) become their ids; `bos_id` is prepended when the
    /// model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| Error::invalid("text to encode", e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`; special tokens are dropped when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let n = self.vocab_size() as u32;
        if let Some(bad) = ids.iter().find(|&&i| i >= n) {
            return Err(Error::invalid("token id", format!("{bad} outside the vocabulary of {n}")));
        }
        self.inner.decode(ids, skip_special).map_err(|e| Error::invalid("token ids", e.to_string()))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Ids that end an answer: the model's `eos_token_ids`, the
    /// tokenizer's end-of-sequence id and the end of a chat turn (ChatML's
    /// `<|im_end|>`, Gemma's `<end_of_turn>`), where present.
    pub fn stop_ids(&self, model_eos: &[u32]) -> Vec<u32> {
        let mut ids = model_eos.to_vec();
        ids.extend(self.eos_id);
        ids.extend(self.token_to_id("<|im_end|>"));
        ids.extend(self.token_to_id("<end_of_turn>"));
        ids
    }

    /// Id of one token spelled exactly `token` (e.g. `<|im_end|>`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Spelling of token `id` (byte-level alphabet for BPE vocabularies).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// GPT-2's reversible byte -> printable char table: printable Latin-1 bytes
/// map to themselves, the rest to U+0100 onwards in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let keep = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        table[b as usize] = if keep(b) {
            char::from_u32(b).expect("Latin-1")
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below the surrogates")
        };
    }
    table
}

/// The BPE model from the vocabulary and merges; tokens not already spelled
/// in the byte alphabet are re-spelled byte by byte (as transformers does).
fn byte_level_bpe(tokens: &[&str], merges: &[&str]) -> Result<tokenizers::Tokenizer> {
    let table = bytes_to_unicode();
    let in_alphabet = |c: char| table.contains(&c);
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let spelled = if t.chars().all(in_alphabet) {
                t.to_string()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            };
            (spelled, i as u32)
        })
        .collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| {
                Error::format("tokenizer.ggml.merges", format!("merge #{i} {m:?} is not two tokens"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| Error::format("tokenizer.ggml.merges", e.to_string()))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(t)
}

/// Installs the pre-tokenizer `tokenizer.ggml.pre` names.
fn set_pre_tokenizer(t: &mut tokenizers::Tokenizer, pre: &str) -> Result<()> {
    let byte_level = |use_regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, use_regex));
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(SplitPattern::Regex(re.into()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| Error::format("tokenizer.ggml.pre", e.to_string()))?;
        Ok(PreTokenizerWrapper::Split(s))
    };
    let steps = match pre {
        "default" | "gpt2" | "gpt-2" => vec![byte_level(true)],
        // SmolLM's own tokenizer.json: isolate every digit, then GPT-2's split.
        "smollm" => vec![PreTokenizerWrapper::Digits(Digits::new(true)), byte_level(true)],
        "llama3" | "llama-v3" | "llama-bpe" => vec![split(LLAMA3_SPLIT)?, byte_level(false)],
        "qwen2" | "deepseek-r1-qwen" => vec![split(QWEN2_SPLIT)?, byte_level(false)],
        "qwen35" => vec![split(QWEN35_SPLIT)?, byte_level(false)],
        other => {
            return Err(Error::Unsupported(format!(
                "GGUF pre-tokenizer {other:?} (known: gpt2, smollm, llama-bpe, qwen2, qwen35)"
            )))
        }
    };
    if matches!(pre, "qwen2" | "deepseek-r1-qwen" | "qwen35") {
        // Qwen's tokenizer.json composes text to NFC before splitting.
        t.with_normalizer(Some(NFC)).map_err(|e| Error::format("tokenizer", e.to_string()))?;
    }
    t.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(())
}

/// CONTROL tokens become special added tokens, USER_DEFINED ones that the
/// vocabulary spells as the file does plain added tokens; both are then
/// matched whole in the input text. In a byte-level vocabulary a CONTROL
/// token spelled outside the byte alphabet is a llama.cpp mislabel and
/// skipped.
fn add_gguf_added_tokens(t: &mut tokenizers::Tokenizer, tokens: &[&str], types: &[i32], byte_level: bool) -> Result<()> {
    let table = bytes_to_unicode();
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (tok, &ty) in tokens.iter().zip(types) {
        if ty == TOKEN_CONTROL && (!byte_level || tok.chars().all(|c| table.contains(&c))) {
            special.push(AddedToken::from(tok.to_string(), true).normalized(false));
        } else if ty == TOKEN_USER_DEFINED && t.token_to_id(tok).is_some() {
            user.push(AddedToken::from(tok.to_string(), false).normalized(false));
        }
    }
    let err = |e: tokenizers::Error| Error::format("tokenizer.ggml.token_type", e.to_string());
    t.add_special_tokens(special).map_err(err)?;
    t.add_tokens(user).map_err(err)?;
    Ok(())
}

fn read_json_if_present(path: &Path) -> Result<serde_json::Value> {
    if !path.is_file() {
        return Ok(serde_json::Value::Null);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path.display().to_string(), format!("invalid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2s() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        let mut all: Vec<char> = t.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}

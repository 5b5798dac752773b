//! SentencePiece vocabularies from GGUF metadata (`tokenizer.ggml.model =
//! llama`), built as transformers builds them from the same file, so the
//! token ids are transformers'. Only Gemma's files (architectures `gemma`,
//! `gemma2`, `gemma3`) are read so far.
//!
//! Gemma's pipeline (transformers' `GemmaTokenizer` over the vocabulary of
//! the file): spaces become `▁`, no pre-split (the split on spaces finds
//! none left), a BPE model with byte fallback (`<0xXX>` tokens) whose
//! merges are not in the file but rebuilt from the vocabulary: every way
//! to cut a token into two tokens, ordered by the token's position in the
//! file (Gemma's scores do not follow its merge order), longer left parts
//! first. Tokens of two or more spaces are stored as real spaces and
//! renamed `▁▁...`. CONTROL tokens are matched whole as special tokens,
//! USER_DEFINED ones (`\n\n`, `[multimodal]`) as plain added tokens.
use crate::{Error, Result};
use std::collections::HashSet;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::SplitDelimiterBehavior;

/// SentencePiece's word-boundary mark, which stands for a space.
const SPACE_MARK: &str = "\u{2581}";

/// The BPE tokenizer of a Gemma GGUF vocabulary (`tokens` in file order;
/// `unk` the unknown token's spelling). Added tokens are not included.
pub fn gemma(tokens: &[&str], unk: &str) -> Result<tokenizers::Tokenizer> {
    let spelled: Vec<String> = tokens.iter().map(|t| respell_spaces(t)).collect();
    let err = |e: tokenizers::Error| Error::format("tokenizer.ggml.tokens", e.to_string());
    // A later duplicate wins, as in a Python dict built from the list.
    let vocab: Vocab = spelled.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = merges_by_position(&spelled, &vocab);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token(unk.to_string())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(err)?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_normalizer(Some(Replace::new(" ", SPACE_MARK).map_err(err)?)).map_err(err)?;
    let split = Split::new(SplitPattern::String(" ".into()), SplitDelimiterBehavior::MergedWithPrevious, false).map_err(err)?;
    t.with_pre_tokenizer(Some(split));
    let decoders = vec![
        DecoderWrapper::Replace(Replace::new(SPACE_MARK, " ").map_err(err)?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    t.with_decoder(Some(Sequence::new(decoders)));
    Ok(t)
}

/// A token of spaces (and other whitespace) only, holding at least one
/// space, spelled as that many `▁` (transformers' rename, lengths in
/// characters); other tokens as they are.
fn respell_spaces(token: &str) -> String {
    // Python's str.strip() also strips U+001C..U+001F.
    let blank = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    if token.contains(' ') && token.chars().all(blank) {
        SPACE_MARK.repeat(token.chars().count())
    } else {
        token.to_string()
    }
}

/// transformers' `generate_merges` with each token scored by minus its
/// position: for every token (first occurrence order), every cut into two
/// tokens of `vocab`, the cuts of one token ordered by the halves' ids;
/// then all cuts by the token's score, descending, then by the lengths of
/// the left and right parts, descending (a stable sort).
fn merges_by_position(spelled: &[String], vocab: &Vocab) -> Vec<(String, String)> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(spelled.len());
    // (score, left length, right length, left, right)
    let mut cuts: Vec<(i64, usize, usize, &str, &str)> = Vec::new();
    for token in spelled {
        if !seen.insert(token) {
            continue;
        }
        let score = -(vocab[token.as_str()] as i64);
        let mut local: Vec<(i64, usize, usize, &str, &str)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| vocab.contains_key(*l) && vocab.contains_key(*r))
            .map(|(l, r)| (score, l.chars().count(), r.chars().count(), l, r))
            .collect();
        local.sort_by_key(|c| (vocab[c.3], vocab[c.4]));
        cuts.extend(local);
    }
    cuts.sort_by(|a, b| (b.0, b.1, b.2).cmp(&(a.0, a.1, a.2)));
    cuts.into_iter().map(|(_, _, _, l, r)| (l.to_string(), r.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_tokens_are_respelled() {
        assert_eq!(respell_spaces("  "), "\u{2581}\u{2581}");
        assert_eq!(respell_spaces(" \n"), "\u{2581}\u{2581}");
        assert_eq!(respell_spaces("\n\n"), "\n\n");
        assert_eq!(respell_spaces(" a"), " a");
    }

    /// A four-token vocabulary: "abc" (position 3) is cut "ab|c" and
    /// "a|bc"; "ab" (position 4) sorts after it, the longer left part of
    /// "abc" first.
    #[test]
    fn merges_follow_positions_then_left_length() {
        let spelled: Vec<String> = ["a", "b", "c", "abc", "ab", "bc"].iter().map(|s| s.to_string()).collect();
        let vocab: Vocab = spelled.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let m = merges_by_position(&spelled, &vocab);
        let pairs: Vec<(&str, &str)> = m.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        assert_eq!(pairs, [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c")]);
    }
}

//! ROUGE-1/2/L F-measures exactly as Python `rouge-score` 0.1.2 computes them
//! with `use_stemmer=True` (lowercase, keep `[a-z0-9]`, NLTK's Porter stemmer
//! on tokens longer than 3 characters, ROUGE-L by LCS).
//!
//! The scoring is the `rougers` crate, a port of rouge-score and of NLTK's
//! stemmer; `tests/suite/eval_rouge.rs` checks it against rouge-score itself on a
//! committed fixture of more than 1000 pairs, so a crate update that drifts
//! fails the build instead of silently changing results.
use rougers::{RougeScorer, RougeType};
use serde::{Deserialize, Serialize};

/// F-measures of one (reference, prediction) pair, in `[0, 1]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RougeScores {
    /// Unigram overlap F1.
    pub rouge1: f64,
    /// Bigram overlap F1.
    pub rouge2: f64,
    /// Longest-common-subsequence F1.
    #[serde(rename = "rougeL")]
    pub rouge_l: f64,
}

/// A reusable scorer (holds the stemmer's tables).
pub struct Rouge {
    scorer: RougeScorer,
}

impl Default for Rouge {
    fn default() -> Self {
        Self::new()
    }
}

impl Rouge {
    /// A scorer for rouge1, rouge2 and rougeL with stemming on.
    pub fn new() -> Self {
        let scorer = RougeScorer::new(["rouge1", "rouge2", "rougeL"], true)
            .expect("rouge1, rouge2 and rougeL are valid rouge types");
        Rouge { scorer }
    }

    /// Scores `prediction` against `reference` (rouge-score's `score(target, prediction)`).
    pub fn score(&self, reference: &str, prediction: &str) -> RougeScores {
        let scores = self.scorer.score(reference, prediction);
        let f = |t| scores.get(t).map_or(0.0, |s| s.fmeasure);
        RougeScores {
            rouge1: f(RougeType::N(1)),
            rouge2: f(RougeType::N(2)),
            rouge_l: f(RougeType::L),
        }
    }

    /// The tokens rouge-score would compare (lowercased, stemmed).
    pub fn tokens(&self, text: &str) -> Vec<String> {
        self.scorer.tokenizer().tokenize(text)
    }
}

/// One line of a `--pairs` file.
#[derive(Deserialize)]
struct Pair {
    prediction: String,
    reference: String,
}

/// Scores every `{"prediction", "reference"}` line of `input` and writes one
/// `{"rouge1", "rouge2", "rougeL"}` line per pair to `out`, in input order.
/// Blank lines are skipped; a malformed line is an error naming `what` and
/// its line number. Returns the number of pairs scored.
pub fn score_jsonl(
    input: impl std::io::BufRead,
    what: &str,
    mut out: impl std::io::Write,
) -> crate::Result<usize> {
    let rouge = Rouge::new();
    let mut n = 0;
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| crate::Error::io(what, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let pair: Pair = serde_json::from_str(&line)
            .map_err(|e| crate::Error::format(format!("{what} line {}", i + 1), e.to_string()))?;
        let scores = rouge.score(&pair.reference, &pair.prediction);
        serde_json::to_writer(&mut out, &scores)
            .map_err(|e| crate::Error::io("stdout", e.into()))?;
        writeln!(out).map_err(|e| crate::Error::io("stdout", e))?;
        n += 1;
    }
    Ok(n)
}

//! ROUGE must equal Python rouge-score 0.1.2 (use_stemmer=True) on the pairs
//! in fixtures/eval/rouge_pairs.jsonl, made by make_rouge_pairs.py.
use crate::support;
use hexlora::eval::rouge::{score_jsonl, Rouge, RougeScores};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval").join(name)
}

#[derive(serde::Deserialize)]
struct Expected {
    prediction: String,
    reference: String,
    rouge1: f64,
    rouge2: f64,
    #[serde(rename = "rougeL")]
    rouge_l: f64,
}

fn expected() -> Vec<Expected> {
    let text = std::fs::read_to_string(fixture("rouge_pairs.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn assert_close(got: RougeScores, want: &Expected, i: usize) {
    let pairs = [(got.rouge1, want.rouge1), (got.rouge2, want.rouge2), (got.rouge_l, want.rouge_l)];
    for (name, (g, w)) in ["rouge1", "rouge2", "rougeL"].iter().zip(pairs) {
        assert!(
            (g - w).abs() <= 1e-6,
            "pair {i} {name}: got {g}, rouge-score {w}\n  ref: {:?}\n  pred: {:?}",
            want.reference,
            want.prediction
        );
    }
}

#[test]
fn matches_rouge_score_on_fixture_pairs() {
    let want = expected();
    assert!(want.len() >= 1000, "fixture has only {} pairs", want.len());
    assert!(want.iter().any(|e| e.reference.is_empty()), "fixture lacks empty strings");
    assert!(want.iter().any(|e| !e.reference.is_ascii()), "fixture lacks unicode");
    assert!(want.iter().filter(|e| e.rouge2 > 0.0 && e.rouge2 < 1.0).count() > 300);
    let rouge = Rouge::new();
    for (i, e) in want.iter().enumerate() {
        assert_close(rouge.score(&e.reference, &e.prediction), e, i);
    }
}

#[test]
fn tokens_match_rouge_score_tokenizer_and_stemmer() {
    let text = std::fs::read_to_string(fixture("rouge_tokens.jsonl")).unwrap();
    let rouge = Rouge::new();
    let mut n = 0;
    for line in text.lines() {
        #[derive(serde::Deserialize)]
        struct Row {
            text: String,
            tokens: Vec<String>,
        }
        let row: Row = serde_json::from_str(line).unwrap();
        assert_eq!(rouge.tokens(&row.text), row.tokens, "text {:?}", row.text);
        n += 1;
    }
    assert!(n > 500);
}

#[test]
fn score_jsonl_keeps_input_order_and_names_bad_lines() {
    let want = expected();
    let input = std::fs::read(fixture("rouge_pairs.jsonl")).unwrap();
    let mut out = Vec::new();
    let n = score_jsonl(&input[..], "fixture", &mut out).unwrap();
    assert_eq!(n, want.len());
    let got: Vec<RougeScores> =
        String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for (i, (g, w)) in got.into_iter().zip(&want).enumerate() {
        assert_close(g, w, i);
    }

    let bad = b"{\"prediction\": \"a\", \"reference\": \"a\"}\n\n{\"prediction\": \"a\"}\n";
    let err = score_jsonl(&bad[..], "bad.jsonl", Vec::new()).unwrap_err().to_string();
    assert!(err.contains("bad.jsonl line 3") && err.contains("reference"), "{err}");
}

#[test]
fn cli_writes_one_line_per_pair() {
    let out = support::hexlora()
        .args(["rouge", "--pairs"])
        .arg(fixture("rouge_pairs.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let want = expected();
    assert_eq!(stdout.lines().count(), want.len());
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    let keys: Vec<_> = first.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["rouge1", "rouge2", "rougeL"]);

    let missing = support::hexlora()
        .args(["rouge", "--pairs", "/nonexistent/pairs.jsonl"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/pairs.jsonl"));
}

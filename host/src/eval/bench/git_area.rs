//! `git-area`: which area of git does an author's commit subject touch? The
//! LaMP-2 analogue built from the upstream shortlog that Debian ships as
//! `usr/share/doc/git/changelog.gz` (package `git` 1:2.39.5-0+deb12u3):
//! `Version vX; changes since vY:` blocks, newest first, each a list of
//! `Author Name (N):` lines followed by 6-space indented commit subjects.
//!
//! The input is the subject without its `area:` prefix, the label the
//! normalized area ([`normalize_area`]), among the [`NUM_LABELS`] most common
//! areas. Users are authors with at least [`DEF`]`.min_items` labelled
//! commits; their latest commits (release order, file order within a
//! release) are the questions, the earlier ones the profile. Authors with
//! 4 to 9 form the `pool` split: more users to train the hypernetwork on,
//! none of them in train, dev or test.
use super::{build, count_drop, BenchDef, Built, HoldOut, SourceItem};
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Where `toolchain/fetch-bench-data.sh` puts the gunzipped changelog.
pub const DEFAULT_PATH: &str = "data/gitlogs/git.txt";

/// The source, as written to the manifest.
pub const SOURCE: &str = "Debian package git 1:2.39.5-0+deb12u3, usr/share/doc/git/changelog.gz (upstream shortlog)";

/// Size of the label set: the most common normalized areas.
pub const NUM_LABELS: usize = 15;

/// The benchmark definition. Half the users are test users so the test
/// split has over 1,000 questions (issue requirement).
pub const DEF: BenchDef = BenchDef {
    name: "git-area",
    input_field: "text",
    output_field: "category",
    min_items: 10,
    max_queries: 30,
    max_profile: 100,
    prompt,
    hold_out: HoldOut::Latest,
    shares: (0.3, 0.2),
    pool_min: Some(4),
};

fn prompt(subject: &str, labels: Option<&[String]>) -> String {
    let labels = labels.unwrap_or(&[]).join(", ");
    format!(
        "Which area of git does this commit subject belong to among the following areas? \
         Just answer with the area name without further explanation. \
         areas: [{labels}] subject: {subject}"
    )
}

/// One commit subject of the shortlog.
#[derive(Clone, Debug, PartialEq)]
pub struct Subject {
    /// Index of the release block in release order (oldest is 0).
    pub release: usize,
    /// The author as written in the shortlog.
    pub author: String,
    /// The subject line, trimmed.
    pub subject: String,
}

/// Parses the shortlog into subjects in release order (the file lists the
/// newest release first; within a release the file order is kept).
pub fn parse_shortlog(text: &str) -> Vec<Subject> {
    let mut releases: Vec<Vec<(String, String)>> = Vec::new();
    let mut author: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("Version ") {
            releases.push(Vec::new());
            author = None;
        } else if let Some(name) = author_line(line) {
            author = Some(name);
        } else if line.starts_with("      ") && !line.trim().is_empty() {
            if let (Some(a), Some(r)) = (&author, releases.last_mut()) {
                r.push((a.clone(), line.trim().to_string()));
            }
        } else if line.trim().is_empty() {
            continue;
        } else if !line.starts_with('-') {
            author = None;
        }
    }
    releases
        .into_iter()
        .rev()
        .enumerate()
        .flat_map(|(i, r)| r.into_iter().map(move |(author, subject)| Subject { release: i, author, subject }))
        .collect()
}

/// `Name (N):` at column 0: the name.
fn author_line(line: &str) -> Option<String> {
    if line.starts_with(char::is_whitespace) {
        return None;
    }
    let rest = line.strip_suffix("):")?;
    let open = rest.rfind(" (")?;
    let count = &rest[open + 2..];
    (!count.is_empty() && count.bytes().all(|b| b.is_ascii_digit())).then(|| rest[..open].trim().to_string())
}

/// Bots and automated committers (dependabot, GitHub Actions, Transifex,
/// Weblate, renovate, names with a `bot` word or `[bot]`).
pub fn is_bot(name: &str) -> bool {
    let lower = name.to_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric() && c != '[' && c != ']').collect();
    ["dependabot", "github actions", "github-actions", "transifex", "weblate", "renovate"].iter().any(|b| lower.contains(b))
        || lower.contains("[bot]")
        || words.iter().any(|w| *w == "bot" || *w == "robot")
}

/// Merge commits (`Merge branch`, `Merge pull request`, `Merge tag`, ...).
pub fn is_merge(subject: &str) -> bool {
    let s = subject.to_lowercase();
    ["merge branch", "merge pull request", "merge tag", "merge remote", "merge commit", "merge git://", "merge http", "merge '", "merge \""]
        .iter()
        .any(|p| s.starts_with(p))
}

/// `Revert "..."` commits.
pub fn is_revert(subject: &str) -> bool {
    let s = subject.to_lowercase();
    s.starts_with("revert \"") || s.starts_with("revert '") || s.starts_with("revert commit")
}

/// Release and version-bump commits: `Git 2.39`, `GIT 1.5.0-rc1`,
/// `Release 0.24.1`, `libxcb 1.15`, `1.16.0 release`, `6.0.0`, `Bump
/// version to ...`, `Update draft release notes ...`, `Start the 2.39 cycle`,
/// `Sync with 2.38.4`, `Prepare for 2.39.1`.
pub fn is_release(subject: &str) -> bool {
    let s = subject.to_lowercase();
    let s = s.trim_end_matches('.');
    let prefixes = ["bump version", "update version", "version bump", "update draft release notes", "draft release notes", "prepare for ", "sync with ", "release notes for", "post-release version bump"];
    if prefixes.iter().any(|p| s.starts_with(p)) || (s.starts_with("start the ") && s.ends_with(" cycle")) {
        return true;
    }
    let words: Vec<&str> = s.split_whitespace().collect();
    let version = |w: &str| {
        let w = w.trim_start_matches('v');
        w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.') && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    };
    match words.as_slice() {
        [v] => version(v),
        [a, v] => version(v) && !a.ends_with(':') || version(a) && *v == "release",
        [a, v, r] => version(v) && *r == "release" && !a.ends_with(':') || (*a == "release" || *a == "version") && version(r),
        _ => (2..=4).contains(&words.len()) && (words[0] == "release" || words[0] == "version") && words.iter().any(|w| version(w)),
    }
}

/// The `area: text` split of a subject: `None` when there is no prefix of at
/// most three words before `": "`, or nothing after it.
pub fn split_area(subject: &str) -> Option<(&str, &str)> {
    let (area, text) = subject.split_once(": ")?;
    let text = text.trim();
    (!area.trim().is_empty() && area.split_whitespace().count() <= 3 && area.len() <= 40 && !text.is_empty()).then_some((area.trim(), text))
}

/// Normalizes an area: lowercase; a path keeps its first component
/// (`t/lib-httpd` -> `t`, `Documentation/git.txt` -> `documentation`), except
/// under `builtin/` and `contrib/`, which keep the second (`builtin/am.c` ->
/// `am.c`, `contrib/completion` -> `completion`); options are dropped
/// (`rebase -i` -> `rebase`); `doc`, `docs` -> `documentation`; `t`,
/// `test`, `test-lib` -> `tests`; `.c`/`.h`/`.sh`/`.perl` suffixes are
/// dropped (`diff.c` -> `diff`). Single test scripts (`t3404`) stay their
/// own areas, as in the issue's analysis: merged, `tests` held 38% of the
/// questions and left less of each author's own habit to learn.
pub fn normalize_area(area: &str) -> String {
    let mut a = area.trim().to_lowercase();
    if a.contains('/') {
        let parts: Vec<&str> = a.split('/').filter(|p| !p.is_empty()).collect();
        a = match parts.as_slice() {
            [first, second, ..] if *first == "builtin" || *first == "contrib" => second.to_string(),
            [first, ..] => first.to_string(),
            [] => String::new(),
        };
    }
    let mut a = a.split_whitespace().next().unwrap_or("").to_string();
    for ext in [".c", ".h", ".sh", ".perl", ".txt"] {
        if let Some(stem) = a.strip_suffix(ext) {
            a = stem.to_string();
        }
    }
    match a.as_str() {
        "doc" | "docs" | "documentation" => "documentation".into(),
        "t" | "test" | "tests" | "test-lib" => "tests".into(),
        _ => a,
    }
}

/// Translation areas (batches of `.po` updates), dropped.
pub fn is_translation_area(area: &str) -> bool {
    matches!(area, "l10n" | "po" | "i18n/po" | "translations" | "translation")
}

/// Reads the gunzipped changelog and builds the splits.
pub fn build_from_path(path: &Path, seed: u64) -> Result<Built> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    build_from_text(&String::from_utf8_lossy(&bytes), seed)
}

/// The labelled items of the shortlog (ids sort in release order), the
/// label set and the drop counts.
pub fn items_from_text(text: &str) -> (Vec<SourceItem>, Vec<String>, BTreeMap<String, usize>) {
    let mut dropped = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut labelled = Vec::new();
    for (i, s) in parse_shortlog(text).into_iter().enumerate() {
        let why = if is_bot(&s.author) {
            Some("bot")
        } else if is_merge(&s.subject) {
            Some("merge")
        } else if is_revert(&s.subject) {
            Some("revert")
        } else if is_release(&s.subject) {
            Some("release")
        } else if !seen.insert((s.author.clone(), s.subject.clone())) {
            Some("duplicate (same author and subject in an earlier release)")
        } else {
            None
        };
        if let Some(why) = why {
            count_drop(&mut dropped, why);
            continue;
        }
        let Some((area, text)) = split_area(&s.subject) else {
            count_drop(&mut dropped, "no area: prefix");
            continue;
        };
        let area = normalize_area(area);
        if is_translation_area(&area) {
            count_drop(&mut dropped, "translation (l10n, po)");
            continue;
        }
        labelled.push(SourceItem { id: format!("ga{i:06}"), user: s.author, input: text.to_string(), output: area });
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for it in &labelled {
        *counts.entry(&it.output).or_default() += 1;
    }
    let mut ranked: Vec<(&str, usize)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut labels: Vec<String> = ranked.iter().take(NUM_LABELS).map(|(a, _)| a.to_string()).collect();
    labels.sort();
    let (items, rare): (Vec<_>, Vec<_>) = labelled.into_iter().partition(|it| labels.contains(&it.output));
    dropped.insert(format!("area outside the {NUM_LABELS} most common"), rare.len());
    (items, labels, dropped)
}

/// Builds the splits from the changelog text.
pub fn build_from_text(text: &str, seed: u64) -> Result<Built> {
    let (items, labels, dropped) = items_from_text(text);
    if items.is_empty() {
        return Err(Error::invalid("git-area", "no labelled commit subjects (run toolchain/fetch-bench-data.sh)"));
    }
    build(&DEF, items, Some(labels), seed, SOURCE, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORTLOG: &str = r#"Version v2.39.1; changes since v2.39.0:
---------------------------------------

Jeff King (3):
      t/lib-httpd: bump required apache version to 2.2
      Revert "core.hooksPath: add some protection while cloning"
      Merge branch 'jk/fix' into maint

Junio C Hamano (2):
      Git 2.39.1
      Documentation: fix a typo


Version v2.39.0; changes since v2.39.0-rc2:
-------------------------------------------

Jeff King (2):
      rebase -i: fix the todo list
      Add a helper without an area

Junio C Hamano (1):
      Documentation: fix a typo

dependabot[bot] (1):
      ci: bump actions/checkout
"#;

    #[test]
    fn shortlog_is_read_oldest_release_first_in_file_order() {
        let s = parse_shortlog(SHORTLOG);
        let got: Vec<(usize, &str, &str)> = s.iter().map(|s| (s.release, s.author.as_str(), s.subject.as_str())).collect();
        assert_eq!(got[0], (0, "Jeff King", "rebase -i: fix the todo list"));
        assert_eq!(got[1], (0, "Jeff King", "Add a helper without an area"));
        assert_eq!(got[3], (0, "dependabot[bot]", "ci: bump actions/checkout"));
        assert_eq!(got[4], (1, "Jeff King", "t/lib-httpd: bump required apache version to 2.2"));
        assert_eq!(got.len(), 9);
        assert_eq!(author_line("Ævar Arnfjörð Bjarmason (12):"), Some("Ævar Arnfjörð Bjarmason".to_string()));
        assert_eq!(author_line("      fix (2):"), None);
        assert_eq!(author_line("Version v2.39.1; changes since v2.39.0:"), None);
    }

    #[test]
    fn cleaning_drops_each_kind_once_and_labels_the_rest() {
        let (items, labels, dropped) = items_from_text(SHORTLOG);
        let got: Vec<(&str, &str, &str)> = items.iter().map(|i| (i.user.as_str(), i.input.as_str(), i.output.as_str())).collect();
        assert_eq!(
            got,
            [
                ("Jeff King", "fix the todo list", "rebase"),
                ("Junio C Hamano", "fix a typo", "documentation"),
                ("Jeff King", "bump required apache version to 2.2", "tests"),
            ]
        );
        assert_eq!(labels, ["documentation", "rebase", "tests"]);
        for (why, n) in [("bot", 1), ("merge", 1), ("revert", 1), ("release", 1), ("no area: prefix", 1)] {
            assert_eq!(dropped[why], n, "{why}");
        }
        assert_eq!(dropped["duplicate (same author and subject in an earlier release)"], 1);
        // Ids sort in release order.
        assert!(items.windows(2).all(|w| w[0].id < w[1].id));
    }

    #[test]
    fn areas_normalize_and_releases_are_recognized() {
        for (raw, want) in [("Doc", "documentation"), ("docs", "documentation"), ("t3404", "t3404"), ("t/t5516-fetch.sh", "tests"), ("test-lib", "tests"), ("builtin/am.c", "am"), ("contrib/completion", "completion"), ("diff.c", "diff"), ("rebase -i", "rebase"), ("Documentation/git-log.txt", "documentation")] {
            assert_eq!(normalize_area(raw), want, "{raw}");
        }
        for s in ["Git 2.39", "GIT 1.5.0-rc1", "Release 0.24.1", "libxcb 1.15", "1.16.0 release", "6.0.0", "Bump version to 2.13.91", "Start the 2.39 cycle", "Sync with 2.38.4", "Update draft release notes to 2.39"] {
            assert!(is_release(s), "{s}");
        }
        for s in ["t0411: add tests", "Add 2.0 support to foo bar baz", "config: 1.5"] {
            assert!(!is_release(s), "{s}");
        }
        assert!(!is_release("") && !is_release("   "));
        assert_eq!(split_area("Add a helper without an area"), None);
        assert_eq!(split_area("Fix this: and that thing in the very long description here"), Some(("Fix this", "and that thing in the very long description here")));
        assert!(is_bot("dependabot[bot]") && is_bot("GitHub Actions") && is_bot("Transifex") && !is_bot("Talbot Smith"));
    }
}

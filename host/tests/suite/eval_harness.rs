//! The harness on hand-made splits: scores, sample averaging, the baselines'
//! answers, seeds per sample, and result comparison.
use hexlora::eval::baselines;
use hexlora::eval::dataset::{ProfileItem, Query, Split, User};
use hexlora::eval::harness::{normalize_label, run};
use hexlora::eval::method::{Decoding, Method, UserPrep, SAMPLES_AT_POSITIVE_T};
use hexlora::eval::result::{compare, RunResult};
use hexlora::eval::task::{TaskKind, TaskSpec};
use std::collections::BTreeMap;

fn item(id: &str, text: &str, answer: &str, out_field: &str) -> ProfileItem {
    ProfileItem { id: id.into(), fields: BTreeMap::from([("text".to_string(), text.to_string()), (out_field.to_string(), answer.to_string())]) }
}

fn query(id: &str, input: &str, gold: &str) -> Query {
    Query { id: id.into(), input: input.into(), gold: Some(gold.into()) }
}

fn quotes_split() -> Split {
    let labels = vec!["art".to_string(), "law".to_string(), "love".to_string()];
    let spec = TaskSpec::for_task("quotes-tag", Some(labels)).unwrap();
    let c = "category";
    let users = vec![
        User {
            id: "ann".into(),
            profile: vec![item("a1", "paint the wall", "art", c), item("a2", "judge and jury", "law", c), item("a3", "sculpt clay", "art", c)],
            queries: vec![query("qa1", "a painting of clay", "art"), query("qa2", "judge ruled", "law")],
        },
        User {
            id: "bob".into(),
            profile: vec![item("b1", "my heart", "love", c), item("b2", "a kiss", "love", c)],
            queries: vec![query("qb1", "sweet heart", "love"), query("qb2", "court case", "law"), query("qb3", "another kiss", "love")],
        },
    ];
    Split { spec, users }
}

#[test]
fn majority_user_scores_by_hand() {
    let split = quotes_split();
    let mut m = baselines::by_name("majority-user").unwrap();
    let r = run(m.as_mut(), Some(&split), &split, "test", &Decoding::greedy(8)).unwrap();
    // ann -> "art" for both (1/2 right); bob -> "love" (2/3 right).
    assert_eq!(r.users[0].queries[1].predictions, ["art"]);
    assert_eq!(r.summary.accuracy, Some(3.0 / 5.0));
    assert!((r.summary.depth - (0.5 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
    // Labels: art P=1/2 R=1 -> 2/3; law never predicted -> 0; love P=2/3 R=1 -> 4/5.
    assert!((r.summary.macro_f1.unwrap() - (2.0 / 3.0 + 0.8) / 3.0).abs() < 1e-12);
    assert_eq!(r.summary.primary_metric, "accuracy");
}

#[test]
fn nearest_profile_retrieves_by_rouge1_and_majority_global_uses_train() {
    let split = quotes_split();
    let mut m = baselines::by_name("nearest-profile").unwrap();
    let r = run(m.as_mut(), None, &split, "test", &Decoding::greedy(8)).unwrap();
    let answers: Vec<&str> = r.users.iter().flat_map(|u| u.queries.iter().map(|q| q.predictions[0].as_str())).collect();
    assert_eq!(answers, ["art", "law", "love", "love", "love"]);
    let mut g = baselines::by_name("majority-global").unwrap();
    // Train profiles: art 2, love 2, law 1 -> tie broken alphabetically: "art".
    let r = run(g.as_mut(), Some(&split), &split, "test", &Decoding::greedy(8)).unwrap();
    assert_eq!(r.summary.accuracy, Some(1.0 / 5.0));
    let mut g = baselines::by_name("majority-global").unwrap();
    let err = run(g.as_mut(), None, &split, "test", &Decoding::greedy(8)).unwrap_err().to_string();
    assert!(err.contains("train split"), "{err}");
}

/// A method answering from a fixed script, to check how the harness
/// averages samples (a test of the harness, not a stand-in for a model).
struct Scripted {
    answers: Vec<&'static str>,
    seeds: Vec<u64>,
}

impl Method for Scripted {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn prepare_user(&mut self, _spec: &TaskSpec, user: &User) -> hexlora::Result<UserPrep> {
        Ok(UserPrep { seconds: 0.5, tokens: user.profile.len() as u64, loss_curve: vec![2.0, 1.0] })
    }
    fn predict(&mut self, _s: &TaskSpec, _u: &User, q: &Query, d: &Decoding) -> hexlora::Result<Vec<String>> {
        self.seeds.extend((0..d.samples).map(|i| d.sample_seed(&q.id, i)));
        Ok((0..d.samples).map(|i| self.answers[i % self.answers.len()].to_string()).collect())
    }
}

#[test]
fn samples_at_positive_temperature_are_averaged() {
    let spec = TaskSpec::for_task("mail-subject", None).unwrap();
    assert_eq!(spec.kind, TaskKind::Generation);
    let split = Split {
        spec,
        users: vec![User { id: "u".into(), profile: vec![item("p", "x", "y", "title")], queries: vec![query("q", "body", "lunch on friday")] }],
    };
    let mut m = Scripted { answers: vec!["lunch on friday", "dinner"], seeds: vec![] };
    let d = Decoding::at(0.7, 16, 3);
    assert_eq!(d.samples, SAMPLES_AT_POSITIVE_T);
    let r = run(&mut m, None, &split, "dev", &d).unwrap();
    // Half the samples are exact (ROUGE 1), half share nothing (0).
    assert!((r.summary.rouge1.unwrap() - 0.5).abs() < 1e-12);
    assert!((r.summary.rouge_l.unwrap() - 0.5).abs() < 1e-12);
    assert_eq!(r.users[0].queries[0].predictions.len(), 10);
    assert_eq!(r.users[0].prep.loss_curve, [2.0, 1.0]);
    // Seeds differ per sample and are reproducible.
    let mut seeds = m.seeds.clone();
    seeds.dedup();
    assert_eq!(seeds.len(), 10);
    assert_eq!(d.sample_seed("q", 0), Decoding::at(0.7, 16, 3).sample_seed("q", 0));
    assert_ne!(d.sample_seed("q", 0), Decoding::at(0.7, 16, 4).sample_seed("q", 0));
    // FNV-1a 64 of b"q" + 0u64 little-endian with seed 0, computed in Python.
    assert_eq!(Decoding::greedy(1).sample_seed("q", 0), 0xf68a_2e68_6d03_573c);
    // A method returning the wrong number of samples is an error.
    let err = run(&mut OneAnswer, None, &split, "dev", &d).unwrap_err().to_string();
    assert!(err.contains("returned 1 answers") && err.contains("expected 10"), "{err}");
}

/// Always one answer, whatever the decoding asks for.
struct OneAnswer;

impl Method for OneAnswer {
    fn name(&self) -> String {
        "one-answer".into()
    }
    fn predict(&mut self, _s: &TaskSpec, _u: &User, _q: &Query, _d: &Decoding) -> hexlora::Result<Vec<String>> {
        Ok(vec!["x".into()])
    }
}

#[test]
fn labels_are_normalized_before_scoring() {
    let labels: Vec<String> = ["art", "men-women"].iter().map(|s| s.to_string()).collect();
    assert_eq!(normalize_label("  Men-Women.\n", &labels), "men-women");
    assert_eq!(normalize_label("\"art\"", &labels), "art");
    assert_eq!(normalize_label("sculpture", &labels), "sculpture");
}

#[test]
fn comparison_gives_breadth_mcnemar_and_bootstrap_and_rejects_mismatches() {
    let split = quotes_split();
    let run_named = |name: &str| -> RunResult {
        let mut m = baselines::by_name(name).unwrap();
        run(m.as_mut(), Some(&split), &split, "test", &Decoding::greedy(8)).unwrap()
    };
    let user = run_named("majority-user");
    let global = run_named("majority-global");
    let c = compare(&user, &global, 1).unwrap();
    // ann: 1/2 vs 1/2 (tie); bob: 2/3 vs 0 (improved).
    assert_eq!((c.breadth.improved, c.breadth.tied, c.breadth.worse), (1, 1, 0));
    let m = c.mcnemar.unwrap();
    assert_eq!((m.method_only, m.baseline_only), (2, 0));
    assert!((m.p_value - 0.5).abs() < 1e-12);
    assert!((c.bootstrap_queries.mean_diff - 0.4).abs() < 1e-12);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    user.write(&path).unwrap();
    let back = RunResult::read(&path).unwrap();
    assert_eq!((&back.users, &back.method, back.summary.accuracy), (&user.users, &user.method, user.summary.accuracy));
    assert!((back.summary.macro_f1.unwrap() - user.summary.macro_f1.unwrap()).abs() < 1e-15);
    std::fs::write(&path, "{\"schema\": \"other\"}").unwrap();
    assert!(RunResult::read(&path).unwrap_err().to_string().contains("r.json"));

    let mut other = global.clone();
    other.users.pop();
    assert!(compare(&user, &other, 1).is_err());
}

/// A sweep interrupted after its first user resumes from the progress file:
/// the done user's results come from the file (a value edited there shows
/// up in the result, so it was not run again), the rest are run, a torn
/// last line (a crash while writing it) is dropped, and a resume with other
/// settings is refused.
#[test]
fn a_sweep_resumes_from_its_progress_file() {
    use hexlora::eval::harness::{fingerprint, run_sweep_with};
    use hexlora::eval::progress::Progress;
    let split = quotes_split();
    let decodings = [Decoding::greedy(8), Decoding::sweep(&[0.7], 8, 3)[0]];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.jsonl");
    let mut m = baselines::by_name("majority-user").unwrap();
    let fp = fingerprint(m.as_ref(), &split, "test", &decodings);
    let mut p = Progress::start(&path, fp.clone()).unwrap();
    let full = run_sweep_with(m.as_mut(), Some(&split), &split, "test", &decodings, Some(&mut p)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "a line per user");
    // Keep ann's line with her greedy mean edited, then half of bob's.
    let edited = lines[0].replacen("\"mean\":0.5", "\"mean\":0.25", 1);
    assert_ne!(edited, lines[0]);
    std::fs::write(&path, format!("{edited}\n{}", &lines[1][..lines[1].len() / 2])).unwrap();
    let mut p = Progress::resume(&path, fp.clone()).unwrap();
    assert_eq!(p.len(), 1);
    let resumed = run_sweep_with(m.as_mut(), Some(&split), &split, "test", &decodings, Some(&mut p)).unwrap();
    assert_eq!(resumed[0].users[0].mean, 0.25, "ann's result must come from the file");
    assert_eq!(resumed[0].users[1], full[0].users[1], "bob runs again, to the same result");
    assert_eq!(resumed[1].users, full[1].users, "the sampled decoding's users");
    // Another temperature is another sweep.
    let other = fingerprint(m.as_ref(), &split, "test", &[Decoding::greedy(8)]);
    let err = Progress::resume(&path, other).err().expect("other settings").to_string();
    assert!(err.contains("other settings") && err.contains("--force"), "{err}");
    // A damaged line that is not the last is an error naming the line.
    std::fs::write(&path, format!("garbage\n{edited}\n")).unwrap();
    let err = Progress::resume(&path, fp).err().expect("damaged").to_string();
    assert!(err.contains("p.jsonl:1"), "{err}");
}

//! The eval subcommands end to end through the binary: bench build on a
//! hand-made fortune directory, eval on it and on a LongLaMP file, report.
use crate::support;
use std::path::{Path, PathBuf};
use std::process::Output;

fn hexlora(args: &[&str]) -> Output {
    support::hexlora().args(args).output().unwrap()
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Two category files; 10 authors with 6 quotes each, and one author with
/// only 2 (dropped), enough for a 60/20/20 user split.
fn fortune_dir(dir: &Path) {
    for (cat, offset) in [("love", 0), ("work", 3)] {
        let mut text = String::new();
        for a in 0..10 {
            for i in 0..3 {
                text.push_str(&format!("Quote {} of author {a} about {cat}.\n\t\t-- Author {a}, \"Book\"\n%\n", i + offset));
            }
        }
        text.push_str(&format!("Lonely {cat}.\n\t-- Rare Writer\n%\n"));
        std::fs::write(dir.join(cat), text).unwrap();
    }
    std::fs::write(dir.join("love.dat"), b"\0binary index").unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn bench_build_eval_and_report_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let fortunes = tmp.path().join("fortunes");
    std::fs::create_dir(&fortunes).unwrap();
    fortune_dir(&fortunes);
    let out = tmp.path().join("bench");
    let printed = ok(hexlora(&["bench", "build", "--only", "quotes-tag", "--out", s(&out), "--fortunes-dir", s(&fortunes)]));
    assert!(printed.contains("quotes-tag: dev 2 users"), "{printed}");
    let labels = std::fs::read_to_string(out.join("quotes-tag/labels.json")).unwrap();
    assert!(labels.contains("love") && labels.contains("work"));
    // An existing benchmark is replaced only with --force.
    let again = ["bench", "build", "--only", "quotes-tag", "--out", s(&out), "--fortunes-dir", s(&fortunes)];
    let err = hexlora(&again);
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("pass --force"), "{}", String::from_utf8_lossy(&err.stderr));
    ok(hexlora(&[&again[..], &["--force"]].concat()));

    let results = tmp.path().join("results");
    let printed = ok(hexlora(&[
        "eval", "--bench", s(&out.join("quotes-tag")), "--split", "test", "--method", "majority-user",
        "--temperature", "0,1", "--out", s(&results),
    ]));
    assert_eq!(printed.lines().count(), 2, "{printed}");
    let hot: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("quotes-tag-majority-user-test-T1.json")).unwrap()).unwrap();
    assert_eq!(hot["decoding"]["samples"], 10);
    assert_eq!(hot["users"][0]["queries"][0]["predictions"].as_array().unwrap().len(), 10);

    let err = hexlora(&["eval", "--bench", s(&out.join("quotes-tag")), "--method", "telepathy", "--out", s(&results)]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("unknown method \"telepathy\""));
    let err = hexlora(&["bench", "build", "--only", "quotes", "--out", s(&out)]);
    assert!(String::from_utf8_lossy(&err.stderr).contains("unknown benchmark"));

    // A finished run leaves no progress file; an interrupted one's progress
    // must be resumed (or --force'd), and --resume needs one.
    let progress = results.join("quotes-tag-majority-user-test.progress.jsonl");
    assert!(!progress.exists(), "a finished run removes its progress file");
    let qt = out.join("quotes-tag");
    let again = ["eval", "--bench", s(&qt), "--split", "test", "--method", "majority-user", "--out", s(&results)];
    std::fs::remove_file(results.join("quotes-tag-majority-user-test-T0.json")).unwrap();
    let err = hexlora(&[&again[..], &["--resume"]].concat());
    assert!(String::from_utf8_lossy(&err.stderr).contains("holds no progress to resume"), "{}", String::from_utf8_lossy(&err.stderr));
    std::fs::write(&progress, "").unwrap();
    let err = hexlora(&again);
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("pass --resume to continue it"), "{}", String::from_utf8_lossy(&err.stderr));
    ok(hexlora(&[&again[..], &["--resume"]].concat()));
    assert!(results.join("quotes-tag-majority-user-test-T0.json").exists() && !progress.exists());

    ok(hexlora(&["eval", "--bench", s(&out.join("quotes-tag")), "--split", "test", "--method", "majority-global", "--out", s(&results)]));
    if Path::new(hexlora::eval::plot::DEFAULT_FONT).exists() {
        let files: Vec<PathBuf> = ["majority-user", "majority-global"].iter().map(|m| results.join(format!("quotes-tag-{m}-test-T0.json"))).collect();
        let report = tmp.path().join("report");
        let printed = ok(hexlora(&["report", s(&files[0]), s(&files[1]), "--baseline", "majority-global", "--out", s(&report)]));
        assert!(printed.trim().ends_with("report.md"));
        assert!(std::fs::read_to_string(report.join("report.md")).unwrap().contains("| majority-user |"));
        // An existing report is replaced only with --force.
        let again = ["report", s(&files[0]), s(&files[1]), "--baseline", "majority-global", "--out", s(&report)];
        let err = hexlora(&again);
        assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("pass --force"), "{}", String::from_utf8_lossy(&err.stderr));
        ok(hexlora(&[&again[..], &["--force"]].concat()));
        // Two runs of one method need a name each: a variant is NAME=PATH.
        let err = hexlora(&["report", s(&files[0]), s(&files[0]), "--out", s(&tmp.path().join("twice"))]);
        let said = String::from_utf8_lossy(&err.stderr);
        assert!(!err.status.success() && said.contains("a second run named \"majority-user\"") && said.contains("NAME="), "{said}");
        let variant = format!("majority-user-again={}", s(&files[0]));
        ok(hexlora(&["report", s(&files[0]), &variant, s(&files[1]), "--baseline", "majority-global", "--out", s(&tmp.path().join("twice"))]));
        let md = std::fs::read_to_string(tmp.path().join("twice/report.md")).unwrap();
        assert!(md.contains("| majority-user |") && md.contains("| majority-user-again |"), "{md}");
    } else {
        support::skip(&format!("the report part: no font at {} (toolchain/install.sh installs fonts-dejavu-core)", hexlora::eval::plot::DEFAULT_FONT));
    }
}

#[test]
fn eval_reads_longlamp_files() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eval/lamp/product_review_user.json");
    let tmp = tempfile::tempdir().unwrap();
    let printed = ok(hexlora(&[
        "eval", "--longlamp", fixture, "--longlamp-task", "product_review_user", "--method", "nearest-profile",
        "--out", s(tmp.path()),
    ]));
    assert!(printed.contains("LongLaMP_product_review") && printed.contains("2 users / 3 queries"), "{printed}");
}

/// `fortune_dir` with `authors` authors of 6 quotes each (3 a category).
fn fortune_authors(dir: &Path, authors: usize) {
    for (cat, offset) in [("love", 0), ("work", 3)] {
        let mut text = String::new();
        for a in 0..authors {
            for i in 0..3 {
                text.push_str(&format!("Quote {} of author {a} about {cat}, said on day {}.\n\t\t-- Author {a}, \"Book\"\n%\n", i + offset, 7 * a + i));
            }
        }
        std::fs::write(dir.join(cat), text).unwrap();
    }
}

/// Every user's predictions and scores in a result file.
fn answers(path: &Path) -> Vec<(String, Vec<(String, serde_json::Value, f64)>)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let q = u["queries"].as_array().unwrap().iter();
            (u["user"].as_str().unwrap().to_string(), q.map(|q| (q["id"].as_str().unwrap().to_string(), q["predictions"].clone(), q["score"].as_f64().unwrap())).collect())
        })
        .collect()
}

/// SIGTERM between users (per-user training on the tiny model, so each
/// user takes long enough to be interrupted): the evaluation stops after
/// the user in hand, keeps the finished users, exits 0 saying how to go
/// on, and `--resume` ends with every prediction and score of an
/// uninterrupted run.
#[test]
fn sigterm_stops_between_users_and_resume_ends_as_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let fortunes = tmp.path().join("fortunes");
    std::fs::create_dir(&fortunes).unwrap();
    fortune_authors(&fortunes, 40);
    let bench = tmp.path().join("bench");
    ok(hexlora(&["bench", "build", "--only", "quotes-tag", "--out", s(&bench), "--fortunes-dir", s(&fortunes)]));
    let model = support::root().join("tests/fixtures/hyper/eval-model");
    let qt = bench.join("quotes-tag");
    let args = |out: &Path| -> Vec<String> {
        let a = ["eval", "--bench", s(&qt), "--model", s(&model), "--split", "test", "--train-split", "train", "--method", "user-lora-f32"];
        let work = out.join("work");
        let b = ["--common-steps", "2", "--user-epochs", "8", "--max-len", "64", "--work-dir", s(&work), "--out", s(out)];
        a.iter().chain(b.iter()).map(|x| x.to_string()).collect()
    };
    let whole = tmp.path().join("whole");
    ok(support::hexlora().args(args(&whole)).output().unwrap());
    let result = |dir: &Path| dir.join("quotes-tag-user-lora-f32-test-T0.json");
    let users = answers(&result(&whole)).len();
    assert!(users >= 6, "{users} test users: too few to stop between them");

    let stopped = tmp.path().join("stopped");
    std::fs::create_dir_all(&stopped).unwrap();
    let err_log = tmp.path().join("stopped.stderr");
    let child = support::hexlora().args(args(&stopped)).stdout(std::process::Stdio::piped()).stderr(std::fs::File::create(&err_log).unwrap()).spawn().unwrap();
    let progress = stopped.join("quotes-tag-user-lora-f32-test.progress.jsonl");
    let start = std::time::Instant::now();
    // One line per finished user.
    while std::fs::read_to_string(&progress).map_or(0, |t| t.lines().count()) < 1 {
        assert!(start.elapsed() < std::time::Duration::from_secs(300), "no user finished");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}\n{}", std::fs::read_to_string(&err_log).unwrap_or_default());
    let done = std::fs::read_to_string(&progress).unwrap().lines().count();
    assert!(done < users, "the run finished before SIGTERM arrived; make a user slower");
    assert!(log.contains(&format!("SIGTERM: stopped after {done} of {users} users")) && log.contains("--resume"), "{log}");
    assert!(!result(&stopped).exists(), "no result file from a stopped run");

    let mut resume = args(&stopped);
    resume.push("--resume".into());
    let out = support::hexlora().args(&resume).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains(&format!("resuming: {done} of {users} users done")), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(answers(&result(&stopped)), answers(&result(&whole)), "the resumed run's answers differ from an uninterrupted run's");
    assert!(!progress.exists(), "a finished run removes its progress file");
}

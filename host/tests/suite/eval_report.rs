//! `hexlora report` on results of the model-free baselines over a
//! hand-made split: the table's numbers, the plots, and bad inputs.
use hexlora::eval::baselines;
use hexlora::eval::dataset::{ProfileItem, Query, Split, User};
use hexlora::eval::harness::run;
use hexlora::eval::method::Decoding;
use hexlora::eval::plot::DEFAULT_FONT;
use hexlora::eval::report::{group, read_metrics_jsonl, write_report};
use hexlora::eval::result::RunResult;
use hexlora::eval::task::TaskSpec;
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::support;

fn split() -> Split {
    let labels = vec!["art".to_string(), "law".to_string(), "love".to_string()];
    let item = |id: &str, cat: &str| ProfileItem {
        id: id.into(),
        fields: BTreeMap::from([("text".to_string(), format!("text {id}")), ("category".to_string(), cat.to_string())]),
    };
    let q = |id: &str, gold: &str| Query { id: id.into(), input: format!("quote {id}"), gold: Some(gold.into()) };
    Split {
        spec: TaskSpec::for_task("quotes-tag", Some(labels)).unwrap(),
        users: vec![
            User { id: "ann".into(), profile: vec![item("a1", "art"), item("a2", "art")], queries: vec![q("qa1", "art"), q("qa2", "law")] },
            User { id: "bob".into(), profile: vec![item("b1", "love"), item("b2", "law"), item("b3", "love")], queries: vec![q("qb1", "love")] },
        ],
    }
}

fn results() -> Vec<RunResult> {
    let s = split();
    ["majority-global", "majority-user"]
        .iter()
        .map(|name| {
            let mut m = baselines::by_name(name).unwrap();
            run(m.as_mut(), Some(&s), &s, "test", &Decoding::greedy(4)).unwrap()
        })
        .collect()
}

fn png_size(path: &PathBuf) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn report_table_and_plots() {
    if !std::path::Path::new(DEFAULT_FONT).exists() && std::env::var("HEXLORA_FONT").is_err() {
        return support::skip(&format!("no font at {DEFAULT_FONT} and HEXLORA_FONT is not set (toolchain/install.sh installs fonts-dejavu-core)"));
    }
    let results = results();
    // Train profiles: art 2, love 2, law 1 -> global "art": 1/3 right; user: ann art (1/2), bob love (1/1).
    assert_eq!(results[0].summary.accuracy, Some(1.0 / 3.0));
    assert_eq!(results[1].summary.accuracy, Some(2.0 / 3.0));
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    std::fs::write(&metrics, "{\"step\":1,\"loss\":2.0,\"lr\":0.1}\n{\"step\":2,\"loss\":1.5}\n").unwrap();
    let out = dir.path().join("report");
    let md_path = write_report(&out, &results, Some("majority-global"), &[("common".into(), metrics)]).unwrap();
    let md = std::fs::read_to_string(&md_path).unwrap();
    assert!(md.contains("### quotes-tag / test / T=0"), "{md}");
    assert!(md.contains("| majority-global | 2 | 3 | 33.33 |"), "{md}");
    // ann tied (1/2 vs 1/2), bob improved (1 vs 0): 50%; McNemar b=1, c=0 -> p = 1.
    assert!(md.contains("| majority-user | 2 | 3 | 66.67 |") && md.contains("| 50% (1/1/0) | 1.0000 |"), "{md}");
    for png in ["quotes-tag-test-T0-by-method.png", "quotes-tag-test-T0-majority-user-vs-majority-global.png", "loss-curves.png"] {
        assert!(md.contains(png), "report does not link {png}");
        assert_eq!(png_size(&out.join(png)), (900, 540));
    }
    // Same inputs, same report text.
    let again = write_report(&dir.path().join("again"), &results, Some("majority-global"), &[]).unwrap();
    let md2 = std::fs::read_to_string(again).unwrap();
    let tables = md.split("### Loss curves").next().unwrap();
    assert_eq!(md2, tables, "the report without metrics is the same up to the loss section");
}

#[test]
fn groups_split_by_task_split_and_temperature() {
    let mut results = results();
    let mut hot = results[1].clone();
    hot.decoding = Decoding::at(1.0, 4, 0);
    results.push(hot);
    let groups = group(&results);
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].runs.len(), 2);
    assert_eq!(groups[1].temperature, 1.0);
}

#[test]
fn bad_inputs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.jsonl");
    std::fs::write(&m, "{\"step\":1,\"loss\":2.0}\n{\"step\":2}\n").unwrap();
    let err = read_metrics_jsonl(&m).unwrap_err().to_string();
    assert!(err.contains("m.jsonl line 2") && err.contains("loss"), "{err}");
    assert!(write_report(dir.path(), &[], None, &[]).is_err());
    // Results over different users cannot be compared.
    let mut results = results();
    results[1].users.pop();
    let err = write_report(&dir.path().join("r"), &results, Some("majority-global"), &[]).unwrap_err().to_string();
    assert!(err.contains("same task, split, users and queries"), "{err}");
}

/// The "answers moved" table: against majority-global (art for every
/// query), a run that answers bob's qb1 with his usual label (love) and
/// ann's qa2 with law (not her usual art) changed two answers, one to the
/// user's most frequent label, both right after and wrong before.
#[test]
fn moved_answers_count_changes_toward_the_usual_label() {
    use hexlora::eval::report::{group_markdown, moved, Moved};
    let mut results = results();
    let mut x = results[0].clone();
    x.method = "x".into();
    for q in x.users.iter_mut().flat_map(|u| &mut u.queries) {
        let answer = match q.id.as_str() {
            "qb1" => "love",
            "qa2" => "law",
            _ => continue,
        };
        q.predictions = vec![answer.into()];
        q.score = 1.0;
    }
    let m = moved(&x, &results[0], &results[1]).unwrap();
    assert_eq!(m, Moved { changed: 2, to_usual: 1, right_now: 2, right_before: 0 });
    results.push(x);
    let md = group_markdown(&group(&results)[0], Some("majority-global")).unwrap();
    assert!(md.contains("gives it for 66.7% of the queries"), "{md}");
    assert!(md.contains("| x | 2 | 1 (50%) | 2 | 0 |"), "{md}");
    assert!(!md.contains("| majority-user | 1 |"), "the usual-label run is not compared with itself: {md}");
    // No majority-user run, no table.
    let md = group_markdown(&group(&results[..1])[0], Some("majority-global")).unwrap();
    assert!(!md.contains("answers changed"), "{md}");
}

//! LaMP and LongLaMP readers on small hand-made files in the published
//! formats, plus the errors malformed files must produce.
use hexlora::eval::lamp::{read_lamp, read_lamp_dir, write_lamp_split, QuestionRow};
use hexlora::eval::longlamp::{read_longlamp, LongLampTask};
use hexlora::eval::task::{TaskKind, LAMP2_TAGS};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval/lamp").join(name)
}

#[test]
fn lamp2_questions_and_outputs_become_users_with_golds() {
    let split = read_lamp(
        &fixture("LaMP_2_dev_questions.json"),
        Some(&fixture("LaMP_2_dev_outputs.json")),
        None,
        None,
    )
    .unwrap();
    assert_eq!(split.spec.name, "LaMP_2");
    assert_eq!(split.spec.labels().unwrap().len(), 15);
    assert_eq!(split.spec.labels().unwrap()[14], LAMP2_TAGS[14]);
    assert_eq!(split.users.len(), 2);
    let u = &split.users[0];
    assert_eq!(u.id, "110");
    assert_eq!(u.queries[0].gold.as_deref(), Some("sci-fi"));
    assert!(u.queries[0].input.ends_with("against a galactic empire."));
    assert_eq!(u.profile.len(), 2);
    assert_eq!(u.profile[1].id, "1101");
    let (input, output) = u.profile[0].pair(&split.spec);
    assert_eq!(input, "Astronauts travel through a wormhole to find a new home.");
    assert_eq!(output, "sci-fi");
    assert_eq!(split.users[1].queries[0].gold.as_deref(), Some("romance"));
    assert_eq!(split.num_queries(), 2);
}

#[test]
fn lamp5_is_generation_from_abstract_to_title() {
    let split = read_lamp(
        &fixture("LaMP_5_dev_questions.json"),
        Some(&fixture("LaMP_5_dev_outputs.json")),
        Some("LaMP_5"),
        None,
    )
    .unwrap();
    assert_eq!(split.spec.kind, TaskKind::Generation);
    let u = &split.users[0];
    assert_eq!(u.profile[0].pair(&split.spec).1, "Fast Matrix Products on DSPs");
    assert_eq!(u.queries[0].gold.as_deref(), Some("Personal Adapters on the Phone"));
}

#[test]
fn hidden_test_split_needs_task_name_and_has_no_golds() {
    let q = fixture("LaMP_5_dev_questions.json");
    let err = read_lamp(&q, None, None, None).unwrap_err().to_string();
    assert!(err.contains("task name"), "{err}");
    let split = read_lamp(&q, None, Some("LaMP_5"), None).unwrap();
    assert_eq!(split.users[0].queries[0].gold, None);
}

#[test]
fn longlamp_product_review_groups_rows_by_reviewer() {
    let split = read_longlamp(&fixture("product_review_user.json"), LongLampTask::ProductReview).unwrap();
    assert_eq!(split.users.len(), 2);
    assert_eq!(split.users[0].id, "A1B2");
    assert_eq!(split.users[0].queries.len(), 2);
    assert_eq!(split.users[0].queries[1].gold.as_deref(), Some("One side burns, the other stays pale."));
    let (input, output) = split.users[0].profile[0].pair(&split.spec);
    assert_eq!(input, "4.0\nA cast iron pan\nSolid pan");
    assert_eq!(output, "Heats evenly, a bit heavy.");
}

#[test]
fn longlamp_topic_writing_jsonl_and_abstract_generation() {
    let topic = read_longlamp(&fixture("topic_writing_user.jsonl"), LongLampTask::parse("topic_writing_user").unwrap()).unwrap();
    assert_eq!(topic.users.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["u_writer", "u_other"]);
    assert_eq!(topic.users[1].profile[1].pair(&topic.spec), ("Rain gear".into(), "A cape beats a jacket.".into()));
    let abs = read_longlamp(&fixture("abstract_generation_user.json"), LongLampTask::AbstractGeneration).unwrap();
    assert_eq!(abs.users[0].id, "Ada Lovelace");
    assert_eq!(abs.users[0].profile[0].fields["year"], "1842");
    assert_eq!(abs.users[0].profile[0].pair(&abs.spec).1, "A survey of mechanical calculators.");
    // The wrong task names the missing user field.
    let err = read_longlamp(&fixture("abstract_generation_user.json"), LongLampTask::ProductReview).unwrap_err().to_string();
    assert!(err.contains("reviewerId"), "{err}");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn lamp_err(questions: &str, outputs: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let q = write(dir.path(), "q.json", questions);
    let o = write(dir.path(), "o.json", outputs);
    read_lamp(&q, Some(&o), None, None).unwrap_err().to_string()
}

#[test]
fn malformed_lamp_files_get_errors_naming_the_problem() {
    let good_q = r#"[{"id": "1", "input": "x", "profile": [{"id": "a", "tag": "comedy", "description": "d"}]}]"#;
    let good_o = r#"{"task": "LaMP_2", "golds": [{"id": "1", "output": "comedy"}]}"#;
    let cases = [
        ("[{\"id\": \"1\"", good_o, "not valid JSON"),
        (r#"{"id": "1"}"#, good_o, "list of questions"),
        (r#"[{"id": "1", "profile": []}]"#, good_o, "missing field `input`"),
        (r#"[{"id": "1", "input": "x", "profile": {}}]"#, good_o, "must be a list"),
        (r#"[{"id": "1", "input": "x", "profile": [3]}]"#, good_o, "not an object"),
        (good_q, r#"{"task": "LaMP_2", "golds": [{"id": "2", "output": "comedy"}]}"#, "no gold output"),
        (good_q, r#"{"task": "LaMP_2", "golds": [{"id": "1", "output": "comedy"}, {"id": "9", "output": "comedy"}]}"#, "matches no question"),
        (good_q, r#"{"task": "LaMP_2", "golds": [{"id": "1", "output": "musical"}]}"#, "not one of the task's labels"),
        (good_q, r#"{"task": "LaMP_9", "golds": []}"#, "LaMP_9"),
        (good_q, r#"{"golds": []}"#, "task"),
        (r#"[{"id": "1", "input": "x", "profile": []}, {"id": "1", "input": "y", "profile": []}]"#,
         r#"{"task": "LaMP_5", "golds": [{"id": "1", "output": "t"}]}"#, "duplicate"),
    ];
    for (q, o, want) in cases {
        let err = lamp_err(q, o);
        assert!(err.contains(want), "expected {want:?} in error {err:?}");
        assert!(err.contains("q.json") || err.contains("o.json"), "error names no file: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let err = read_lamp(&dir.path().join("missing.json"), None, Some("LaMP_5"), None).unwrap_err().to_string();
    assert!(err.contains("missing.json"), "{err}");
}

#[test]
fn malformed_longlamp_rows_name_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "r.jsonl", "{\"author\": \"a\", \"input\": \"i\", \"output\": \"o\", \"profile\": []}\n{broken\n");
    let err = read_longlamp(&p, LongLampTask::TopicWriting).unwrap_err().to_string();
    assert!(err.contains("r.jsonl line 2"), "{err}");
    let p = write(dir.path(), "s.json", r#"[{"author": "a", "input": "i", "output": "o", "profile": [{"summary": "s"}]}]"#);
    let err = read_longlamp(&p, LongLampTask::TopicWriting).unwrap_err().to_string();
    assert!(err.contains("`content`"), "{err}");
    assert!(LongLampTask::parse("email").is_err());
}

#[test]
fn written_split_reads_back_with_user_ids_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let item = |id: &str, text: &str, cat: &str| {
        BTreeMap::from([("id".to_string(), id.to_string()), ("text".into(), text.into()), ("category".into(), cat.into())])
    };
    let profile = vec![item("p1", "a quote", "love"), item("p2", "another", "law")];
    let rows: Vec<(QuestionRow, String)> = ["q1", "q2"]
        .iter()
        .map(|id| {
            let q = QuestionRow { id: id.to_string(), input: format!("quote {id}"), profile: profile.clone(), user_id: "Twain".into() };
            (q, "love".to_string())
        })
        .collect();
    write_lamp_split(dir.path(), "dev", "quotes-tag", &rows).unwrap();
    std::fs::write(dir.path().join("labels.json"), r#"["law", "love"]"#).unwrap();
    let split = read_lamp_dir(dir.path(), "dev", None).unwrap();
    assert_eq!(split.users.len(), 1);
    assert_eq!(split.users[0].id, "Twain");
    assert_eq!(split.users[0].queries.len(), 2);
    assert_eq!(split.users[0].profile[1].pair(&split.spec), ("another".into(), "law".into()));
    // A benchmark classification task without its label file is rejected.
    std::fs::remove_file(dir.path().join("labels.json")).unwrap();
    let err = read_lamp_dir(dir.path(), "dev", None).unwrap_err().to_string();
    assert!(err.contains("labels.json"), "{err}");
}

//! `hexlora hypertrain --bench`: hand-made LaMP splits (fixtures/hyper/lamp)
//! become users whose pairs carry the benchmark's own question prompts,
//! written out literally here (not rebuilt from the code under test);
//! target examples are token-for-token what the evaluation's trainers build;
//! and the command trains from a split with a held-out log whose untrained
//! entry reproduces the common LoRA's loss.
use crate::support;
use hexlora::base::counter_rng;
use hexlora::eval::lamp::read_lamp_dir;
use hexlora::eval::model_runtime::EvalModel;
use hexlora::hyper::users::{render_example, split_users, Pair};
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::model::chat::Message;
use hexlora::train::text_encoder::ModelText;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper")
}

fn pair(query: &str, response: &str) -> Pair {
    Pair { query: query.into(), response: response.into() }
}

const MAIL: &str = "Generate a subject line for the following email: ";

#[test]
fn mail_subject_users_are_profile_items_and_answered_questions_in_the_task_prompt() {
    let split = read_lamp_dir(&fixtures().join("lamp/mail-subject"), "train", None).unwrap();
    let (users, skipped) = split_users(&split, 700, "mail").unwrap();
    assert_eq!(skipped, vec!["cid".to_string()], "a user with one example cannot give context and target");
    assert_eq!(users.iter().map(|u| u.user.as_str()).collect::<Vec<_>>(), ["ann", "bob"]);
    let ann = &users[0].examples;
    assert_eq!(
        ann,
        &vec![
            pair(&format!("{MAIL}Lunch on Friday? Bring the slides for the review."), "lunch friday"),
            pair(&format!("{MAIL}The build is red again, the linker fails on arm."), "red build"),
            pair(&format!("{MAIL}Can we move the review to Monday?"), "review monday"),
            pair(&format!("{MAIL}Slides attached, comments welcome."), "slides"),
        ]
    );
    assert_eq!(users[1].examples.len(), 2);
    // --max-prompt-chars cuts the query as `hexlora eval` does: characters, from the end.
    let (cut, _) = split_users(&split, 54, "mail").unwrap();
    assert_eq!(cut[0].examples[0].query, format!("{MAIL}Lunch"));
    assert_eq!(cut[0].examples[0].response, "lunch friday");
}

#[test]
fn quotes_tag_users_carry_the_label_list_prompt_and_category_answers() {
    let split = read_lamp_dir(&fixtures().join("lamp/quotes-tag"), "train", None).unwrap();
    let (users, skipped) = split_users(&split, 700, "quotes").unwrap();
    assert!(skipped.is_empty());
    let prompt = "Which category does this quote belong to among the following categories? Just answer with the category name without further explanation. categories: [art, law, love] quote: ";
    assert_eq!(users[0].user, "fay");
    assert_eq!(
        users[0].examples,
        vec![
            pair(&format!("{prompt}Every canvas is a journey all its own."), "art"),
            pair(&format!("{prompt}The law is reason, free from passion."), "law"),
            pair(&format!("{prompt}Art washes away the dust of everyday life."), "art"),
        ]
    );
    assert_eq!(users[1].examples.iter().map(|p| p.response.as_str()).collect::<Vec<_>>(), ["love", "love", "love"]);
}

#[test]
fn a_population_of_fewer_than_two_users_is_refused() {
    let mut split = read_lamp_dir(&fixtures().join("lamp/quotes-tag"), "train", None).unwrap();
    split.users.truncate(1);
    let err = split_users(&split, 700, "one user").unwrap_err().to_string();
    assert!(err.contains("at least two users"), "{err}");
}

/// The hypernetwork's target examples are the evaluation trainers' examples:
/// same chat rendering, same answer tokens, prompt cut from the left.
#[test]
fn target_examples_equal_the_evaluation_trainers_examples() {
    let dir = fixtures().join("eval-model");
    let m = EvalModel::open(&dir).unwrap();
    let text = ModelText::open(&dir).unwrap();
    let long = format!("{MAIL}{}", "the quarterly numbers are late again ".repeat(8));
    for (query, max_len) in [("short mail", 200), (long.as_str(), 200), (long.as_str(), 40)] {
        let p = pair(query, "numbers late");
        let ours = render_example(&text, &p, max_len).unwrap();
        let theirs = m.example(&[Message::new("user", query)], "numbers late", max_len).unwrap();
        assert_eq!(ours.ids, theirs.input_ids[0], "{max_len}");
        assert_eq!(ours.labels, theirs.labels[0], "{max_len}");
        assert!(ours.ids.len() <= max_len);
    }
    let cut = render_example(&text, &pair(&long, "numbers late"), 40).unwrap();
    let answer = m.answer_ids("numbers late").unwrap();
    assert_eq!(cut.ids[cut.ids.len() - answer.len()..], answer[..], "the whole answer survives the cut");
}

/// A common LoRA with non-zero B (so it differs from the base model).
fn write_common(m: &EvalModel, dir: &Path) {
    let targets = ["q_proj", "v_proj"].map(String::from).to_vec();
    let config = LoraConfig { r: 2, alpha: 4.0, target_modules: targets, dropout: 0.0, use_rslora: false, base_model: String::new() };
    let mut ad = Adapter::init(config, &m.graph.projections(), 3).unwrap();
    for (k, module) in ad.modules.iter_mut().enumerate() {
        let s = counter_rng::derive(5, k as u64);
        module.b.data.iter_mut().enumerate().for_each(|(i, v)| *v = 0.3 * counter_rng::normal(s, i as u64));
    }
    ad.save(dir).unwrap();
}

#[test]
fn hypertrain_reads_a_bench_split_and_logs_held_out_loss() {
    let work = tempfile::tempdir().unwrap();
    let model = fixtures().join("eval-model");
    let common = work.path().join("common");
    write_common(&EvalModel::open(&model).unwrap(), &common);
    let out = work.path().join("run");
    let status = support::hexlora()
        .args(["hypertrain", "--model"])
        .arg(&model)
        .arg("--bench")
        .arg(fixtures().join("lamp/mail-subject"))
        .args(["--split", "train", "--dev-split", "dev", "--dev-every", "1", "--simcse-steps", "1", "--steps", "2"])
        .args(["--users-per-step", "2", "--target-examples", "1", "--embed-rank", "2", "--bottleneck", "3"])
        .args(["--context-tokens", "60", "--max-len", "64", "--quiet", "--keep-dev-checkpoints", "--common-lora"])
        .arg(&common)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{stderr}");
    assert!(stderr.contains("2 users, 6 examples (1 users with fewer than two examples left out)"), "{stderr}");
    assert!(out.join("hypernet/hypernet.json").exists());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(out.join("heldout.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5, "header, then steps 0..=3");
    assert_eq!(lines[0]["users"], 2);
    assert_eq!(lines.iter().skip(1).map(|l| l["step"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // The untrained network synthesizes the common LoRA: same loss, same tokens.
    let (common_loss, untrained) = (lines[0]["common_lora"].as_f64().unwrap(), lines[1]["hypernet"].as_f64().unwrap());
    assert!((common_loss - untrained).abs() < 1e-6, "{common_loss} vs {untrained}");
    assert!(lines[4]["hypernet"].as_f64().unwrap().is_finite());
    // hypernet-best/ holds the step of the lowest held-out loss (the first of equals).
    let best = lines[1..].iter().min_by(|a, b| a["hypernet"].as_f64().unwrap().total_cmp(&b["hypernet"].as_f64().unwrap())).unwrap();
    let kept: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("hypernet-best/best.json")).unwrap()).unwrap();
    assert_eq!((kept["step"].as_u64(), kept["heldout_loss"].as_f64()), (best["step"].as_u64(), best["hypernet"].as_f64()));
    assert!(out.join("hypernet-best/hypernet.safetensors").exists() && out.join("hypernet-best/hypernet.json").exists());
    // --keep-dev-checkpoints: every checked network, with the loss heldout.jsonl logged for it.
    for line in &lines[1..] {
        let dir = out.join(format!("hypernet-step{}", line["step"]));
        let info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("checkpoint.json")).unwrap()).unwrap();
        assert_eq!((info["step"].as_u64(), info["heldout_loss"].as_f64()), (line["step"].as_u64(), line["hypernet"].as_f64()));
        assert!(dir.join("hypernet.safetensors").exists() && dir.join("hypernet.json").exists());
    }
    // The last one is the network the run ends with.
    let last = |d: &str| std::fs::read(out.join(d).join("hypernet.safetensors")).unwrap();
    assert!(last("hypernet-step3") == last("hypernet"), "hypernet-step3 differs from hypernet/");
    // The same directory again without --resume is refused, not overwritten.
    let again = support::hexlora().args(["hypertrain", "--model"]).arg(&model).arg("--bench").arg(fixtures().join("lamp/mail-subject")).arg("--out").arg(&out).arg("--quiet").output().unwrap();
    assert!(!again.status.success());
}

#[test]
fn hypertrain_without_data_or_with_a_missing_split_says_so() {
    let model = fixtures().join("eval-model");
    let none = support::hexlora().args(["hypertrain", "--model"]).arg(&model).args(["--out", "/nonexistent/x"]).output().unwrap();
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("--bench"));
    let missing = support::hexlora()
        .args(["hypertrain", "--model"])
        .arg(&model)
        .arg("--bench")
        .arg(fixtures().join("lamp/quotes-tag"))
        .args(["--split", "test", "--out", "/nonexistent/x"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("test_questions.json"), "{}", String::from_utf8_lossy(&missing.stderr));
}

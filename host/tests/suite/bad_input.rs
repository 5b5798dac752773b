//! Hostile input to the `hexlora` binary: every case ends with a non-zero
//! exit, no panic, and an error naming the option, field or file at fault,
//! before any large allocation or any overwritten output. The models are
//! the tiny fixtures (`tests/fixtures/training/llama`: 128 ids, 256
//! positions; `tests/fixtures/hyper/eval-model`: a tokenizer, 512 positions).
use crate::support;
use hexlora::model::gguf::Value;
use hexlora::model::gguf_writer::GgufWriter;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn llama() -> PathBuf {
    support::root().join("tests/fixtures/training/llama")
}

fn eval_model() -> PathBuf {
    support::root().join("tests/fixtures/hyper/eval-model")
}

/// Asserts the run failed cleanly and its stderr names every one of `names`.
fn refused(out: &Output, names: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "exit 0; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    for name in names {
        assert!(stderr.contains(name), "{name:?} is not named in: {stderr}");
    }
    stderr
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// Six token-id examples the llama fixture accepts.
fn token_data(dir: &Path) -> PathBuf {
    let p = dir.join("data.jsonl");
    let lines: Vec<String> = (0..6).map(|i| format!(r#"{{"input_ids": [{}, 5, 9, 17, 33, 2]}}"#, 10 + i)).collect();
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

/// `hexlora train` over the llama fixture, rank 2, quiet.
fn train(data: &Path, out: &Path) -> Command {
    train_on(&llama().join("model"), data, out)
}

/// `hexlora train` over `model`, rank 2, quiet.
fn train_on(model: &Path, data: &Path, out: &Path) -> Command {
    let mut cmd = support::hexlora();
    cmd.arg("train").arg("--model").arg(model).arg("--data").arg(data).arg("--out").arg(out);
    cmd.args(["--quiet", "--rank", "2", "--frozen-dtype", "f32"]);
    cmd
}

/// A copy of model or adapter directory `src` with `edit` applied to its
/// JSON file `file`.
fn edited_copy(src: &Path, file: &str, dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dst = dir.join(src.file_name().unwrap());
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dst.join(file)).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(dst.join(file), serde_json::to_string_pretty(&json).unwrap()).unwrap();
    dst
}

#[test]
fn numeric_options_are_checked_when_parsed() {
    // clap refuses these before a file is opened: the paths need not exist.
    let cases = [
        "--lr=nan",
        "--lr=inf",
        "--lr=0",
        "--weight-decay=nan",
        "--max-grad-norm=-1",
        "--mezo-eps=0",
        "--rank=0",
        "--alpha=nan",
        "--alpha=-2",
        "--dropout=1.0",
        "--dropout=-0.1",
        "--steps=0",
        "--grad-accum=0",
        "--max-len=0",
        "--max-len=18446744073709551615",
        "--head-chunk=0",
        "--activation-cap-mb=18446744073709551615",
    ];
    let option = |case: &str| case.split('=').next().unwrap().to_string();
    for case in cases {
        let out = run(train(Path::new("/nonexistent/data.jsonl"), Path::new("/nonexistent/out")).arg(case));
        refused(&out, &[&option(case)]);
    }
    let generate = [
        "--max-tokens=18446744073709551615",
        "--max-tokens=1000000000000",
        "--max-tokens=0",
        "--temperature=nan",
        "--temperature=-1",
        "--top-p=0",
        "--top-p=1.5",
        "--adapter-scale=inf",
    ];
    for case in generate {
        let out = run(support::hexlora().args(["generate", "--model", "/nonexistent", "--adapter", "/nonexistent", "--prompt", "hi"]).arg(case));
        refused(&out, &[&option(case)]);
    }
    for case in ["--hypernet-strength=nan", "--hypernet-strength=-0.5"] {
        let out = run(support::hexlora().args(["eval", "--bench", "/nonexistent", "--method", "hypernet", "--out", "/nonexistent"]).arg(case));
        refused(&out, &[&option(case)]);
    }
    for case in ["--strength=inf", "--strength=-1"] {
        let out = run(support::hexlora().args(["synth", "--hypernet", "/nonexistent", "--context", "/nonexistent", "--out", "/nonexistent"]).arg(case));
        refused(&out, &[&option(case)]);
    }
}

#[test]
fn generate_bounds_max_tokens_by_the_model_positions() {
    // 600 cannot fit beside any prompt (refused before the model loads);
    // 500 does not fit after this prompt of 20 tokens.
    for (max, named) in [("600", "no room for a prompt"), ("500", "20-token prompt")] {
        let out = run(support::hexlora().arg("generate").arg("--model").arg(eval_model()).args(["--prompt", "hi", "--max-tokens", max]));
        refused(&out, &["--max-tokens", "max_position_embeddings", named]);
    }
}

#[test]
fn grad_accum_beyond_the_examples_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = token_data(dir.path());
    for optimizer in ["adamw", "mezo"] {
        let out = run(train(&data, &dir.path().join("run")).args(["--grad-accum", "1000000", "--optimizer", optimizer]));
        refused(&out, &["--grad-accum", "6 examples"]);
    }
}

#[test]
fn unknown_target_modules_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(train(&token_data(dir.path()), &dir.path().join("run")).args(["--steps", "1", "--targets", "q_proj,bogus_proj"]));
    refused(&out, &["bogus_proj", "--targets"]);
    assert!(!dir.path().join("run/adapter").exists());
}

#[test]
fn outputs_no_commit_owns_are_not_overwritten_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let data = token_data(dir.path());
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(run_dir.join("adapter")).unwrap();
    std::fs::write(run_dir.join("adapter/adapter_config.json"), "{}").unwrap();
    std::fs::write(run_dir.join("metrics.jsonl"), "mine\n").unwrap();
    let out = run(train(&data, &run_dir).args(["--steps", "1"]));
    refused(&out, &["--out", "adapter", "metrics.jsonl", "--force"]);
    assert_eq!(std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap(), "mine\n");
    // --resume does not make a run of outputs without a commit either.
    refused(&run(train(&data, &run_dir).args(["--steps", "1", "--resume"])), &["--force"]);
    let forced = run(train(&data, &run_dir).args(["--steps", "1", "--force"]));
    assert!(forced.status.success(), "{}", String::from_utf8_lossy(&forced.stderr));
    // Now a commit owns them: the same command resumes (nothing left to do).
    let again = run(train(&data, &run_dir).args(["--steps", "1", "--resume"]));
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    // The nightly job refuses the same way, before planning or writing routes.json.
    let fresh = dir.path().join("nightly");
    std::fs::create_dir_all(fresh.join("adapter")).unwrap();
    let mut personalize = support::hexlora();
    personalize.arg("personalize").arg("--model").arg(llama().join("model")).arg("--data").arg(&data).arg("--out").arg(&fresh);
    personalize.args(["--device", "cpu", "--no-plan-cache", "--quiet", "--rank", "2", "--steps", "1"]);
    refused(&run(&mut personalize), &["--out", "adapter", "--force"]);
    assert!(!fresh.join("routes.json").exists());
    // An --out that cannot be a directory is refused before training.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    refused(&run(train(&data, &file).args(["--steps", "1"])), &["a-file"]);
}

#[test]
fn bad_token_ids_and_long_examples_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let data = token_data(dir.path());
    let good = std::fs::read_to_string(&data).unwrap();
    let cases = [
        (r#"{"input_ids": [1, -5, 3]}"#, "input_ids[1] = -5"),
        (r#"{"input_ids": [1, "x"]}"#, "input_ids[1] = \"x\""),
        (r#"{"input_ids": [1, 500]}"#, "input_ids[1] = 500"),
        (r#"{"input_ids": [1, 2], "labels": [1, 900]}"#, "labels[1] = 900"),
        (r#"{"input_ids": 7}"#, "input_ids must be an array"),
    ];
    for (line, named) in cases {
        std::fs::write(&data, format!("{good}\n{line}\n")).unwrap();
        let out = run(train(&data, &dir.path().join("run")).args(["--steps", "1"]));
        refused(&out, &["data.jsonl:7", named]);
    }
    // 300 tokens for a model of 256 positions.
    let long: Vec<String> = (0..300).map(|i| (i % 100).to_string()).collect();
    std::fs::write(&data, format!("{good}\n{{\"input_ids\": [{}]}}\n", long.join(", "))).unwrap();
    let out = run(train(&data, &dir.path().join("run")).args(["--steps", "1"]));
    refused(&out, &["data.jsonl:7", "max_position_embeddings", "--max-len"]);
}

#[test]
fn a_batch_beyond_the_model_positions_or_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let row: Vec<String> = (0..300).map(|i| (i % 100).to_string()).collect();
    let batch = dir.path().join("batch.json");
    std::fs::write(&batch, format!(r#"{{"input_ids": [[{0}]], "labels": [[{0}]]}}"#, row.join(", "))).unwrap();
    let grad = |batch: &Path| {
        let mut cmd = support::hexlora();
        cmd.arg("grad").arg("--model").arg(llama().join("model")).arg("--adapter").arg(llama().join("adapter"));
        cmd.arg("--batch").arg(batch).arg("--out").arg(dir.path().join("grads.safetensors"));
        run(&mut cmd)
    };
    refused(&grad(&batch), &["batch.json", "max_position_embeddings"]);
    std::fs::write(&batch, r#"{"input_ids": [[1, 2, 300]], "labels": [[1, 2, 3]]}"#).unwrap();
    refused(&grad(&batch), &["batch.json", "input_ids[0][2] = 300"]);
    assert!(!dir.path().join("grads.safetensors").exists());
}

#[test]
fn adapter_configs_are_checked_by_type_range_and_against_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Box<dyn Fn(&mut serde_json::Value)>, &str)> = vec![
        ("string alpha", Box::new(|j| j["lora_alpha"] = "32".into()), "lora_alpha"),
        ("negative alpha", Box::new(|j| j["lora_alpha"] = (-8).into()), "lora_alpha"),
        ("rank 0", Box::new(|j| j["r"] = 0.into()), "field r"),
        ("unknown target", Box::new(|j| j["target_modules"] = serde_json::json!(["q_proj", "bogus_proj"])), "bogus_proj"),
    ];
    for (k, (what, edit, named)) in cases.into_iter().enumerate() {
        let case_dir = dir.path().join(k.to_string());
        let adapter = edited_copy(&llama().join("adapter"), "adapter_config.json", &case_dir, edit);
        let mut cmd = support::hexlora();
        cmd.arg("grad").arg("--model").arg(llama().join("model")).arg("--adapter").arg(&adapter);
        cmd.arg("--batch").arg(llama().join("batch.json")).arg("--out").arg(case_dir.join("g.safetensors"));
        let stderr = refused(&run(&mut cmd), &[named]);
        eprintln!("{what}: {stderr}");
        assert!(stderr.contains("adapter"), "{what}: {stderr}");
    }
}

#[test]
fn model_configs_are_bounded_before_anything_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("num_hidden_layers", 10_000_000.into()),
        ("num_hidden_layers", 0.into()),
        ("vocab_size", 1u64.wrapping_shl(40).into()),
        ("hidden_size", 1u64.wrapping_shl(40).into()),
        ("max_position_embeddings", 0.into()),
    ];
    for (k, (field, value)) in cases.into_iter().enumerate() {
        let model = edited_copy(&llama().join("model"), "config.json", &dir.path().join(k.to_string()), |j| j[field] = value);
        let out = run(train_on(&model, &token_data(dir.path()), &dir.path().join("run")).args(["--steps", "1"]));
        refused(&out, &[field]);
    }
    // A GGUF whose block_count is 0.
    let gguf = dir.path().join("empty.gguf");
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(0))
        .kv("llama.embedding_length", Value::U32(64))
        .kv("llama.attention.head_count", Value::U32(4))
        .kv("llama.vocab_size", Value::U32(128))
        .kv("llama.feed_forward_length", Value::U32(96))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.write(&gguf).unwrap();
    let out = run(support::hexlora().arg("generate").arg("--model").arg(&gguf).args(["--prompt", "hi"]));
    refused(&out, &["block_count"]);
}

/// Writes a NaN over element `element` of f32 tensor `name` in the
/// safetensors file `path`.
fn put_nan(path: &Path, name: &str, element: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(header[name]["dtype"], "F32", "{name}");
    let start = 8 + header_len + header[name]["data_offsets"][0].as_u64().unwrap() as usize + 4 * element;
    bytes[start..start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_nan_in_the_weights_is_named_when_the_loss_is_not_finite() {
    let dir = tempfile::tempdir().unwrap();
    let model = edited_copy(&llama().join("model"), "config.json", dir.path(), |_| {});
    let name = "model.layers.1.mlp.down_proj.weight";
    put_nan(&model.join("model.safetensors"), name, 3);
    let data = token_data(dir.path());
    let out = run(train_on(&model, &data, &dir.path().join("run")).args(["--steps", "1"]));
    refused(&out, &[name, "element 3", "non-finite"]);
    let mut personalize = support::hexlora();
    personalize.arg("personalize").arg("--model").arg(&model).arg("--data").arg(&data).arg("--out").arg(dir.path().join("nightly"));
    personalize.args(["--device", "cpu", "--no-plan-cache", "--quiet", "--rank", "2", "--steps", "1"]);
    refused(&run(&mut personalize), &[name, "element 3", "non-finite"]);
    // generate: the logits turn non-finite, and the weight is named.
    let gen_model = edited_copy(&eval_model(), "config.json", &dir.path().join("gen"), |_| {});
    let name = "model.layers.0.mlp.down_proj.weight";
    put_nan(&gen_model.join("model.safetensors"), name, 3);
    let out = run(support::hexlora().arg("generate").arg("--model").arg(&gen_model).args(["--prompt", "hi", "--max-tokens", "4"]));
    refused(&out, &[name, "element 3", "logits"]);
}

#[test]
fn eval_keeps_its_result_files_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let bench = support::root().join("tests/fixtures/hyper/lamp/quotes-tag");
    let eval = |extra: &[&str]| {
        let mut cmd = support::hexlora();
        cmd.arg("eval").arg("--bench").arg(&bench).args(["--split", "train", "--train-split", "none", "--method", "majority-user", "--out"]);
        run(cmd.arg(dir.path()).args(extra))
    };
    assert!(eval(&[]).status.success());
    let result = dir.path().join("quotes-tag-majority-user-train-T0.json");
    std::fs::write(&result, "mine").unwrap();
    refused(&eval(&[]), &["--out", "quotes-tag-majority-user-train-T0.json", "--force"]);
    assert_eq!(std::fs::read_to_string(&result).unwrap(), "mine");
    assert!(eval(&["--force"]).status.success());
    refused(&eval(&["--temperature=nan"]), &["--temperature"]);
}

#[test]
fn a_nan_in_an_adapter_is_named_when_it_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = edited_copy(&llama().join("adapter"), "adapter_config.json", dir.path(), |_| {});
    let name = "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight";
    put_nan(&adapter.join("adapter_model.safetensors"), name, 5);
    let mut cmd = support::hexlora();
    cmd.arg("grad").arg("--model").arg(llama().join("model")).arg("--adapter").arg(&adapter);
    cmd.arg("--batch").arg(llama().join("batch.json")).arg("--out").arg(dir.path().join("g.safetensors"));
    refused(&run(&mut cmd), &["adapter_model.safetensors", name, "element 5"]);
    let mut init = train(&token_data(dir.path()), &dir.path().join("run"));
    refused(&run(init.args(["--steps", "1", "--init-adapter"]).arg(&adapter)), &["--init-adapter", name, "element 5"]);
}

/// XORs byte `at` of `path` with `x`.
fn flip(path: &Path, at: usize, x: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= x;
    std::fs::write(path, bytes).unwrap();
}

/// Byte offset of the first `needle` in `path`.
fn find(path: &Path, needle: &str) -> usize {
    let bytes = std::fs::read(path).unwrap();
    bytes.windows(needle.len()).position(|w| w == needle.as_bytes()).unwrap_or_else(|| panic!("{needle} not in {}", path.display()))
}

#[test]
fn a_damaged_commit_is_never_trained_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = token_data(dir.path());
    let ok = |out: &Output| assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // One commit only: a flipped byte in its last tensor is refused, naming it.
    let one = dir.path().join("one");
    ok(&run(train(&data, &one).args(["--steps", "1"])));
    let commit = one.join("commit.safetensors");
    flip(&commit, std::fs::metadata(&commit).unwrap().len() as usize - 1, 0x10);
    refused(&run(train(&data, &one).args(["--steps", "1", "--resume"])), &["commit.safetensors", "tensor adapter/", "checksum", "no previous commit"]);
    // Two commits kept: the run resumes from the previous one, says so, and
    // ends with the same adapter as the run before the damage.
    let two = dir.path().join("two");
    ok(&run(train(&data, &two).args(["--steps", "3"])));
    let adapter = std::fs::read(two.join("adapter/adapter_model.safetensors")).unwrap();
    let commit = two.join("commit.safetensors");
    flip(&commit, find(&commit, "adam_v/") + 3, 0x01);
    let out = run(train(&data, &two).args(["--steps", "3", "--resume"]));
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("WARNING") && stderr.contains("commit.prev.safetensors") && stderr.contains("commit.corrupt.safetensors"), "{stderr}");
    assert_eq!(std::fs::read(two.join("adapter/adapter_model.safetensors")).unwrap(), adapter);
    // A step counter that says 9 of the run's 6 (no previous commit to fall
    // back to): the header field is named.
    let six = dir.path().join("six");
    ok(&run(train(&data, &six).args(["--steps", "6"])));
    std::fs::remove_file(six.join("commit.prev.safetensors")).unwrap();
    let commit = six.join("commit.safetensors");
    flip(&commit, find(&commit, r#"\"adamw_step\":6"#) + 15, b'6' ^ b'9');
    refused(&run(train(&data, &six).args(["--steps", "6", "--resume"])), &["commit.safetensors", "header field hexlora_train_state", "checksum"]);
}

/// `--resume` where there is no commit is refused (it used to start a fresh
/// run without a word); a resume with other options names what differs.
#[test]
fn resume_needs_a_commit_and_names_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let data = token_data(dir.path());
    for out in [dir.path().join("missing"), dir.path().to_path_buf().join("empty")] {
        if out.ends_with("empty") {
            std::fs::create_dir_all(&out).unwrap();
        }
        refused(&run(train(&data, &out).args(["--steps", "2", "--resume"])), &["--resume", "nothing to resume"]);
        assert!(!out.join("commit.safetensors").exists());
    }
    let out = dir.path().join("run");
    let first = run(train(&data, &out).args(["--steps", "1", "--lr", "1e-3"]));
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let msg = refused(&run(train(&data, &out).args(["--steps", "1", "--lr", "2e-3", "--resume"])), &["--resume", "different inputs"]);
    assert!(msg.contains("0.001") && msg.contains("0.002") && msg.contains("lr"), "names the learning rate: {msg}");
    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, r#"{"input_ids": [3, 4, 5]}"#).unwrap();
    refused(&run(train(&other, &out).args(["--steps", "1", "--lr", "1e-3", "--resume"])), &["the data (hash, items)", "(6 items), now", "(1 items)"]);
}

/// Degenerate training data, by the rule `grad` and `synth` follow too: an
/// empty answer or an unknown chat role is refused naming line and field;
/// when no example is left, the error says which rule dropped them.
#[test]
fn degenerate_training_data_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = eval_model();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let empty = write("empty.jsonl", "{\"prompt\": \"Say hi\", \"completion\": \"hi\"}\n{\"prompt\": \"Say\", \"completion\": \"  \"}\n");
    refused(&run(train_on(&model, &empty, &dir.path().join("a")).args(["--steps", "1"])), &["empty.jsonl:2", "completion is empty"]);
    let chat = write("chat.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"\"}]}\n");
    refused(&run(train_on(&model, &chat, &dir.path().join("b")).args(["--steps", "1"])), &["chat.jsonl:1", "messages[1]", "answer is empty"]);
    let role = write("role.jsonl", "{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n");
    refused(&run(train_on(&model, &role, &dir.path().join("c")).args(["--steps", "1"])), &["role.jsonl:1", "messages[0]", "\"robot\"", "system, user, assistant"]);
    let long = write("long.jsonl", &format!("{{\"prompt\": \"{}\", \"completion\": \"yes\"}}\n", "word ".repeat(200)));
    refused(&run(train_on(&model, &long, &dir.path().join("d")).args(["--steps", "1", "--max-len", "16"])), &["no usable training examples among 1 lines", "--max-len 16", "raise --max-len"]);
    let ignored = write("ignored.jsonl", "{\"input_ids\": [3, 4, 5], \"labels\": [-100, -100, -100]}\n");
    refused(&run(train(&ignored, &dir.path().join("e")).args(["--steps", "1"])), &["no usable training examples", "1 have no labelled token"]);
}

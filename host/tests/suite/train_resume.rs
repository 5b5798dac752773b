//! The training loop on the tiny Llama fixture: determinism, in-process
//! stop + resume, `kill -9` of `hexlora train` at random points + resume,
//! all bit-identical to one uninterrupted run; and the loss goes down.
use crate::support;
use hexlora::lora::LoraConfig;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::train::commit::TrainState;
use hexlora::model::llama::DecoderGraph;
use hexlora::autograd::graph::Batch;
use hexlora::train::trainer::{train, RunOptions, TrainConfig};
use std::path::{Path, PathBuf};
use std::process::Command;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/llama/model")
}

/// Token examples with a repeated pattern (learnable), prompt part ignored.
fn data() -> Vec<Batch> {
    (0..6u32)
        .map(|i| {
            let ids: Vec<u32> = (0..16).map(|t| (i * 7 + t * 3) % 128).collect();
            let labels = ids.iter().enumerate().map(|(t, &x)| if t < 4 { -100 } else { x as i64 }).collect();
            Batch { input_ids: vec![ids], labels: vec![labels] }
        })
        .collect()
}

fn config(steps: u64) -> TrainConfig {
    TrainConfig {
        lora: LoraConfig { r: 4, alpha: 8.0, target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()], dropout: 0.1, use_rslora: false, base_model: String::new() },
        adamw: AdamWConfig { weight_decay: 0.01, ..Default::default() },
        schedule: Schedule { lr: 3e-2, warmup: 2, total: steps, decay: Decay::Cosine },
        grad_accum: 2,
        max_grad_norm: Some(1.0),
        seed: 11,
        activation_cap: None,
        head_chunk: 8,
    }
}

fn quiet() -> RunOptions<'static> {
    RunOptions::quiet()
}

fn assert_same(a: &TrainState, b: &TrainState) {
    let losses = |s: &TrainState| s.history.iter().map(|r| r.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(losses(a), losses(b));
    assert_eq!(a.adapter, b.adapter);
    assert_eq!(a.adamw.m, b.adamw.m);
    assert_eq!(a.adamw.v, b.adamw.v);
    assert_eq!(a.cursor, b.cursor);
}

#[test]
fn runs_are_deterministic_resumable_and_learn() {
    let model = DecoderGraph::open(&model_dir()).unwrap();
    let (d1, d2, d3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = train(&model, &data(), &config(12), d1.path(), quiet()).unwrap();
    let b = train(&model, &data(), &config(12), d2.path(), quiet()).unwrap();
    assert_same(&a, &b);
    let first = train(&model, &data(), &config(12), d3.path(), RunOptions { stop_after: Some(5), ..quiet() }).unwrap();
    assert_eq!(first.step(), 5);
    assert!(train(&model, &data(), &config(12), d3.path(), quiet()).is_err(), "an existing commit needs --resume");
    let c = train(&model, &data(), &config(12), d3.path(), RunOptions { resume: true, ..quiet() }).unwrap();
    assert_same(&a, &c);
    let losses: Vec<f32> = a.history.iter().map(|r| r.loss).collect();
    let (head, tail) = (losses[..3].iter().sum::<f32>(), losses[9..].iter().sum::<f32>());
    assert!(tail < 0.85 * head, "loss did not go down: {losses:?}");
    for f in ["adapter/adapter_config.json", "adapter/adapter_model.safetensors", "loss.svg", "metrics.jsonl"] {
        assert!(d1.path().join(f).exists(), "{f}");
    }
    let mut other = config(12);
    other.seed = 12;
    let err = train(&model, &data(), &other, d3.path(), RunOptions { resume: true, ..quiet() }).unwrap_err();
    assert!(err.to_string().contains("different inputs: seed: was 11, now 12"), "names the field: {err}");
}

fn write_jsonl(path: &Path) {
    let lines: Vec<String> = data()
        .iter()
        .map(|b| serde_json::json!({"input_ids": b.input_ids[0], "labels": b.labels[0]}).to_string())
        .collect();
    std::fs::write(path, lines.join("\n")).unwrap();
}

fn cli(data: &Path, out: &Path, resume: bool) -> Command {
    let mut c = support::hexlora();
    c.args(["train", "--quiet", "--steps", "10", "--rank", "4", "--alpha", "8", "--lr", "5e-3", "--seed", "3", "--targets", "q_proj,v_proj,down_proj"]);
    c.arg("--model").arg(model_dir()).arg("--data").arg(data).arg("--out").arg(out);
    if resume {
        c.arg("--resume");
    }
    c
}

#[test]
fn kill_9_at_random_points_then_resume_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_jsonl(&data);
    let (whole, killed) = (dir.path().join("whole"), dir.path().join("killed"));
    let started = std::time::Instant::now();
    assert!(cli(&data, &whole, false).status().unwrap().success());
    // Kill delays scale with how long a whole run takes on this machine; when
    // a run still finishes before enough kills landed after a commit, start
    // over with shorter delays, so the test exercises resume on a fast idle
    // machine as well as on a loaded one.
    let mut scale_ms = started.elapsed().as_millis() as u64;
    let (mut kills, mut kills_after_commit) = (0, 0);
    let mut resume = false;
    let mut finished = false;
    let mut misses = 0u64;
    for round in 0..80u64 {
        let mut child = cli(&data, &killed, resume).stdout(std::process::Stdio::null()).spawn().unwrap();
        let delay = 1 + scale_ms * (1 + round * 7919 % 13) / 45;
        std::thread::sleep(std::time::Duration::from_millis(delay));
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success());
            if kills_after_commit >= 2 {
                finished = true;
                break;
            }
            std::fs::remove_dir_all(&killed).unwrap();
            (kills, kills_after_commit, resume) = (0, 0, false);
            scale_ms = (scale_ms / 2).max(1);
            continue;
        }
        child.kill().unwrap(); // SIGKILL: mid-step, mid-commit or before the first commit
        child.wait().unwrap();
        kills += 1;
        kills_after_commit += resume as usize;
        resume = killed.join("commit.safetensors").exists();
        // Kills that keep landing before the first commit (a slow start,
        // as under qemu on a loaded machine) mean the delays are too short
        // for this machine: lengthen them.
        misses = if resume { 0 } else { misses + 1 };
        if misses > 0 && misses % 6 == 0 {
            scale_ms *= 2;
        }
    }
    // The last run may have died after its final commit but before writing
    // the adapter: resuming must finish that too.
    if !finished {
        assert!(cli(&data, &killed, resume).status().unwrap().success());
    }
    eprintln!("{kills} kills, {kills_after_commit} after a commit");
    assert!(kills >= 3, "only {kills} kills landed; the test did not exercise resume");
    assert!(kills_after_commit >= 2, "only {kills_after_commit} kills hit a run that had committed");
    let (a, b) = (TrainState::load(&whole).unwrap().unwrap(), TrainState::load(&killed).unwrap().unwrap());
    assert_same(&a, &b);
    let bytes = |d: &Path| std::fs::read(d.join("adapter/adapter_model.safetensors")).unwrap();
    assert_eq!(bytes(&whole), bytes(&killed));
}

/// SIGTERM stops `train` after the step in progress, with that step
/// committed and exit 0; `--resume` then finishes bit-identical to a run
/// never stopped.
#[test]
fn sigterm_stops_train_at_a_commit_and_resume_finishes_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    write_jsonl(&data);
    let run = |out: &Path, resume: bool| {
        let mut c = support::hexlora();
        c.args(["train", "--quiet", "--steps", "400", "--rank", "4", "--alpha", "8", "--lr", "5e-3", "--seed", "3", "--targets", "q_proj,v_proj"]);
        c.arg("--model").arg(model_dir()).arg("--data").arg(&data).arg("--out").arg(out);
        if resume {
            c.arg("--resume");
        }
        c
    };
    let (whole, stopped) = (dir.path().join("whole"), dir.path().join("stopped"));
    assert!(run(&whole, false).status().unwrap().success());
    let child = run(&stopped, false).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let start = std::time::Instant::now();
    while !stopped.join("commit.safetensors").exists() {
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "no commit appeared");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{log}");
    let at = TrainState::load(&stopped).unwrap().unwrap().step();
    assert!(at < 400, "the run finished before SIGTERM arrived");
    assert!(log.contains(&format!("SIGTERM: stopped after step {at} (committed)")), "{log}");
    assert!(!stopped.join("adapter").exists());
    assert!(run(&stopped, true).status().unwrap().success());
    assert_same(&TrainState::load(&whole).unwrap().unwrap(), &TrainState::load(&stopped).unwrap().unwrap());
}

//! `hexlora hypertrain` as a federated worker: rounds of `--init-hypernet
//! DIR --start-step S --local-steps N`, each given back the previous round's
//! `hypernet/`, end bit-identical to one uninterrupted run of the same steps
//! (the reference is that run, made by the same command without the worker
//! options); `--local-steps 0` writes the seeded network untrained; a round
//! at the wrong step and a shard too small are refused, naming the option.
use crate::support;
use hexlora::base::tensor_file::TensorFile;
use std::path::{Path, PathBuf};
use std::process::Output;

const TRAIN: &[&str] = &[
    "--simcse-steps", "1", "--steps", "3", "--users-per-step", "2", "--target-examples", "1", "--embed-rank", "2",
    "--bottleneck", "3", "--context-tokens", "60", "--max-len", "48", "--lr", "2e-2", "--warmup", "1", "--seed", "3", "--quiet",
];

fn users(dir: &Path) -> PathBuf {
    let styles = ["ok.", "LOUD!", "please, thanks", "terse", "so so good"];
    let lines: Vec<String> = styles
        .iter()
        .enumerate()
        .map(|(u, style)| {
            let ex: Vec<_> = (0..4).map(|i| serde_json::json!({"query": format!("note {i} on topic {}", (7 * i + 3 * u) % 11), "response": format!("{style} {i}")})).collect();
            serde_json::json!({"user": format!("u{u}"), "examples": ex}).to_string()
        })
        .collect();
    let path = dir.join("users.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

fn hypertrain(data: &Path, out: &Path, extra: &[&str]) -> Output {
    let model = support::root().join("tests/fixtures/hyper/eval-model");
    support::hexlora().arg("hypertrain").arg("--model").arg(&model).arg("--data").arg(data).args(TRAIN).arg("--out").arg(out).args(extra).output().unwrap()
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn bits(dir: &Path) -> Vec<(String, Vec<u32>)> {
    let f = TensorFile::read(&dir.join("hypernet.safetensors")).unwrap();
    f.tensors.into_iter().map(|(k, t)| (k, t.data.iter().map(|v| v.to_bits()).collect())).collect()
}

fn worker_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("worker.json")).unwrap()).unwrap()
}

#[test]
fn worker_rounds_equal_one_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = users(tmp.path());
    ok(hypertrain(&data, &tmp.path().join("single"), &[]));
    let init = tmp.path().join("init");
    ok(hypertrain(&data, &init, &["--local-steps", "0"]));
    assert_eq!(worker_json(&init)["step"], 0);
    assert!(worker_json(&init)["loss"].is_null(), "no step, no loss");

    // Round 1 from the untrained network; round 2 from a copy of round 1's
    // output (what a server sends back), resuming the worker's moments.
    let w = tmp.path().join("worker");
    let init_net = init.join("hypernet");
    ok(hypertrain(&data, &w, &["--init-hypernet", init_net.to_str().unwrap(), "--start-step", "0", "--local-steps", "2"]));
    let summary = worker_json(&w);
    assert_eq!((summary["start_step"].as_u64(), summary["step"].as_u64(), summary["users"].as_u64(), summary["examples"].as_u64()), (Some(0), Some(2), Some(5), Some(20)));
    assert!(summary["loss"].as_f64().unwrap().is_finite());
    let sent = tmp.path().join("round1");
    std::fs::create_dir_all(&sent).unwrap();
    for f in ["hypernet.json", "hypernet.safetensors"] {
        std::fs::copy(w.join("hypernet").join(f), sent.join(f)).unwrap();
    }
    let late = hypertrain(&data, &w, &["--init-hypernet", sent.to_str().unwrap(), "--start-step", "1", "--local-steps", "2", "--resume"]);
    assert!(!late.status.success());
    let err = String::from_utf8_lossy(&late.stderr);
    assert!(err.contains("--start-step") && err.contains("at step 2"), "{err}");
    ok(hypertrain(&data, &w, &["--init-hypernet", sent.to_str().unwrap(), "--start-step", "2", "--local-steps", "2", "--resume"]));
    assert_eq!(worker_json(&w)["step"], 4);
    assert_eq!(bits(&w.join("hypernet")), bits(&tmp.path().join("single/hypernet")));
    // The untrained network is the seeded init, and training moved it.
    assert_ne!(bits(&init_net), bits(&w.join("hypernet")));
}

#[test]
fn a_shard_too_small_is_refused_naming_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let data = users(tmp.path());
    let o = hypertrain(&data, &tmp.path().join("run"), &["--shard", "0/3", "--local-steps", "1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--shard") && err.contains("0/3 holds 1 of the 5 users"), "{err}");
    ok(hypertrain(&data, &tmp.path().join("run2"), &["--shard", "1/2", "--local-steps", "1"]));
    assert_eq!(worker_json(&tmp.path().join("run2"))["users"], 3);
}

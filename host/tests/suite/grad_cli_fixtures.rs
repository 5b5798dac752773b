//! The `hexlora` binary's `grad` (CPU backend) against the PyTorch + PEFT
//! fixtures (`host/tests/fixtures/training`): loss, logits and every LoRA
//! gradient within 1e-4, per-tensor max-normalised. The binary is the one
//! under test (`support::hexlora`): `ci/aarch64-test.sh` runs this with the
//! aarch64 build and with the static musl build under qemu-aarch64.
use crate::support;
use hexlora::base::tensor_file::TensorFile;

fn check(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("grads.safetensors");
    let run = support::grad_command(arch, &out).args(["--device", "cpu"]).output().unwrap();
    assert!(run.status.success(), "hexlora grad on {arch}: {}", String::from_utf8_lossy(&run.stderr));
    let got = TensorFile::read(&out).unwrap();
    let want = TensorFile::read(&support::root().join("tests/fixtures/training").join(arch).join("expected.safetensors")).unwrap();
    assert_eq!(got.tensors.len(), want.tensors.len(), "{arch}: tensors written");
    for (key, w) in &want.tensors {
        let g = &got.tensors[key];
        assert_eq!(g.shape, w.shape, "{arch} {key}");
        let scale = w.data.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-12);
        let err = g.data.iter().zip(&w.data).fold(0f64, |m, (g, w)| m.max((*g as f64 - *w as f64).abs())) / scale;
        assert!(err < 1e-4, "{arch} {key}: max-normalised error {err}");
    }
}

#[test]
fn llama_grad_matches_pytorch_peft() {
    check("llama");
}

#[test]
fn qwen3_grad_matches_pytorch_peft() {
    check("qwen3");
}

/// Sliding-window and global attention layers, sandwich norms, GeGLU.
#[test]
fn gemma3_grad_matches_pytorch_peft() {
    check("gemma3");
}

/// Gated DeltaNet layers, 70-token rows (past one 64-token chunk).
#[test]
fn qwen35_grad_matches_pytorch_peft() {
    check("qwen35");
}

/// A missing model is one line naming the path and the reason, once.
#[test]
fn a_missing_model_names_the_path_and_the_reason_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model");
    let run = support::hexlora().arg("grad").arg("--model").arg(&missing).args(["--adapter", "a", "--batch", "b", "--out", "c"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&missing.display().to_string()) && stderr.contains("No such file or directory"), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 1, "the reason twice: {stderr}");
}

/// The first `len` tokens of the fixture's row 0, every one labelled.
fn prefix_batch(arch: &str, len: usize, path: &std::path::Path) {
    let text = std::fs::read_to_string(support::root().join("tests/fixtures/training").join(arch).join("batch.json")).unwrap();
    let b: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u64> = b["input_ids"][0].as_array().unwrap()[..len].iter().map(|v| v.as_u64().unwrap()).collect();
    std::fs::write(path, serde_json::json!({"input_ids": [ids], "labels": [ids]}).to_string()).unwrap();
}

/// `hexlora grad` of `batch` with the adapter in `adapter`.
fn grad_of(arch: &str, adapter: &std::path::Path, batch: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    let model = support::root().join("tests/fixtures/training").join(arch).join("model");
    support::hexlora().arg("grad").arg("--model").arg(model).arg("--adapter").arg(adapter).arg("--batch").arg(batch).arg("--out").arg(out).arg("--force").output().unwrap()
}

/// Sequences of 1, 2 and 3 tokens (a one-key attention once panicked in
/// the backward): one token has no target and is refused by name; two and
/// three give PyTorch's logits (row 0's first positions of the fixture:
/// causal attention makes a prefix's logits the full row's) and gradients
/// equal to central differences of the loss on the largest coordinates.
fn short_sequences(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = support::root().join("tests/fixtures/training").join(arch);
    let batch = dir.path().join("batch.json");
    let out = dir.path().join("grads.safetensors");
    prefix_batch(arch, 1, &batch);
    let run = grad_of(arch, &fixture.join("adapter"), &batch, &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.contains("no labelled target") && stderr.contains("batch.json"), "{arch} one token: {stderr}");

    let want = TensorFile::read(&fixture.join("expected.safetensors")).unwrap();
    let full = &want.tensors["logits"];
    let vocab = *full.shape.last().unwrap();
    for len in [2, 3] {
        prefix_batch(arch, len, &batch);
        let run = grad_of(arch, &fixture.join("adapter"), &batch, &out);
        assert!(run.status.success(), "{arch} {len} tokens: {}", String::from_utf8_lossy(&run.stderr));
        let got = TensorFile::read(&out).unwrap();
        let logits = &got.tensors["logits"].data;
        let err = logits.iter().zip(&full.data[..len * vocab]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err < 1e-4, "{arch} {len} tokens: logits differ from PyTorch's by {err}");

        // Central differences on the three largest gradient entries.
        let mut entries: Vec<(String, usize, f32)> = got
            .tensors
            .iter()
            .filter(|(k, _)| k.contains("lora_"))
            .flat_map(|(k, t)| t.data.iter().enumerate().map(move |(i, &g)| (k.clone(), i, g)))
            .collect();
        entries.sort_by(|a, b| b.2.abs().total_cmp(&a.2.abs()));
        let weights_file = fixture.join("adapter/adapter_model.safetensors");
        for (key, i, g) in entries.into_iter().take(3) {
            let loss_at = |delta: f32| {
                let adapter = dir.path().join(format!("adapter{delta}"));
                std::fs::create_dir_all(&adapter).unwrap();
                std::fs::copy(fixture.join("adapter/adapter_config.json"), adapter.join("adapter_config.json")).unwrap();
                let mut weights = TensorFile::read(&weights_file).unwrap();
                let t = weights.tensors.get_mut(&key).unwrap_or_else(|| panic!("{key} not in the adapter"));
                t.data[i] += delta;
                weights.write_atomic(&adapter.join("adapter_model.safetensors")).unwrap();
                let o = dir.path().join("probe.safetensors");
                assert!(grad_of(arch, &adapter, &batch, &o).status.success());
                TensorFile::read(&o).unwrap().tensors["loss"].data[0] as f64
            };
            let h = 1e-2f32;
            let fd = (loss_at(h) - loss_at(-h)) / (2.0 * h as f64);
            let tol = 2e-2 * (g.abs() as f64).max(1e-2);
            assert!((fd - g as f64).abs() <= tol, "{arch} {len} tokens {key}[{i}]: gradient {g} vs central difference {fd}");
        }
    }
}

#[test]
fn short_sequences_llama() {
    short_sequences("llama");
}

#[test]
fn short_sequences_gemma3() {
    short_sequences("gemma3");
}

#[test]
fn short_sequences_qwen35() {
    short_sequences("qwen35");
}

//! The `hexlora` binary's `grad` (CPU backend) against the PyTorch + PEFT
//! fixtures (`host/tests/fixtures/training`): loss, logits and every LoRA
//! gradient within 1e-4, per-tensor max-normalised. The binary is the one
//! under test (`support::hexlora`): `ci/aarch64-test.sh` runs this with the
//! aarch64 build and with the static musl build under qemu-aarch64.
use crate::support;
use hexlora::lora::tensor_file::TensorFile;

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

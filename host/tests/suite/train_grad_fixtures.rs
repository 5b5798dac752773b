//! LoRA gradients against PyTorch + PEFT (fixtures made by
//! `host/tests/fixtures/training/make_grad_fixtures.py`): loss, logits and
//! every adapter gradient within 1e-4, per-tensor max-normalised.
use hexlora::base::tensor_file::TensorFile;
use hexlora::lora::Adapter;
use hexlora::train::grad::compute_grads;
use hexlora::autograd::graph::{Batch, GraphOptions, TrainableModel};
use std::path::PathBuf;

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training").join(arch)
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs() as f64)).max(1e-12);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((*g as f64 - *w as f64).abs())) / scale
}

fn load(arch: &str) -> (Box<dyn TrainableModel>, Adapter, Batch, TensorFile) {
    let dir = fixture(arch);
    let model = hexlora::train::open_trainable(&dir.join("model")).unwrap();
    let adapter = Adapter::load(&dir.join("adapter")).unwrap();
    let batch: Batch = serde_json::from_str(&std::fs::read_to_string(dir.join("batch.json")).unwrap()).unwrap();
    let expected = TensorFile::read(&dir.join("expected.safetensors")).unwrap();
    (model, adapter, batch, expected)
}

fn check_arch(arch: &str, modules: usize) {
    let (model, adapter, batch, expected) = load(arch);
    let model = model.as_ref();
    assert_eq!(adapter.modules.len(), modules, "{arch}: every projection of every layer");
    let r = compute_grads(model, &adapter, &batch, &GraphOptions::default(), true).unwrap();
    let want_loss = expected.tensors["loss"].data[0];
    assert!(((r.loss - want_loss) / want_loss).abs() < 1e-5, "{arch}: loss {} vs {want_loss}", r.loss);
    let logits = r.logits.unwrap();
    assert_eq!(logits.shape, expected.tensors["logits"].shape);
    let e = rel_err(&logits.data, &expected.tensors["logits"].data);
    assert!(e < 1e-4, "{arch}: logits rel err {e}");
    assert_eq!(r.grads.tensors.len(), 2 * modules);
    for (key, g) in &r.grads.tensors {
        let want = expected.get(key, arch).unwrap();
        assert_eq!(g.shape, want.shape, "{key}");
        let e = rel_err(&g.data, &want.data);
        assert!(e < 1e-4, "{arch} {key}: rel err {e}");
    }
    // Recomputing every layer in the backward gives the same bits.
    let opts = GraphOptions { recompute_layers: vec![true; model.layer_count()], ..Default::default() };
    let again = compute_grads(model, &adapter, &batch, &opts, false).unwrap();
    assert_eq!(again.loss.to_bits(), r.loss.to_bits());
    for (key, g) in &again.grads.tensors {
        let bits = |t: &hexlora::tensor::Tensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g), bits(&r.grads.tensors[key]), "{arch} {key} with recompute");
    }
}

#[test]
fn llama_lora_gradients_match_pytorch_peft() {
    check_arch("llama", 14);
}

#[test]
fn qwen3_lora_gradients_match_pytorch_peft() {
    check_arch("qwen3", 14);
}

/// Gemma 3: three local layers with a 5-position window over 24-token
/// rows around a global one, sandwich norms, GeGLU, scaled embeddings;
/// LoRA on all 7 projections of the 4 layers.
#[test]
fn gemma3_lora_gradients_match_pytorch_peft() {
    check_arch("gemma3", 4 * 7);
}

/// Gated DeltaNet + gated attention, 70-token rows (past one 64-token
/// chunk, not a multiple of the 16-token state checkpoints), LoRA on all
/// 8 GDN-layer and 7 attention-layer projections.
#[test]
fn qwen35_lora_gradients_match_pytorch_peft() {
    check_arch("qwen35", 2 * 8 + 7);
}

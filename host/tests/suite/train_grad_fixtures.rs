//! LoRA gradients against PyTorch + PEFT (fixtures made by
//! `host/tests/fixtures/training/make_grad_fixtures.py`): loss, logits and
//! every adapter gradient within 1e-4, per-tensor max-normalised.
use hexlora::base::tensor_file::TensorFile;
use hexlora::lora::Adapter;
use hexlora::train::grad::compute_grads;
use hexlora::autograd::graph::{Batch, GraphOptions, TrainableModel};

use crate::support::{rel_err, training_fixture as fixture};

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

fn bits(t: &hexlora::tensor::Tensor) -> Vec<u32> {
    t.data.iter().map(|v| v.to_bits()).collect()
}

/// The fused projection + LoRA node and the unfused pair give the same
/// bits: loss, logits and every adapter gradient (PyTorch fixture model,
/// non-zero A and B on all 7 projections of both layers).
#[test]
fn fused_and_unfused_lora_are_bit_identical() {
    let (model, adapter, batch, _) = load("llama");
    let model = model.as_ref();
    let fused = compute_grads(model, &adapter, &batch, &GraphOptions::default(), true).unwrap();
    let unfused = compute_grads(model, &adapter, &batch, &GraphOptions { unfused_lora: true, ..Default::default() }, true).unwrap();
    assert_eq!(fused.loss.to_bits(), unfused.loss.to_bits());
    assert_eq!(bits(fused.logits.as_ref().unwrap()), bits(unfused.logits.as_ref().unwrap()));
    assert_eq!(fused.grads.tensors.len(), 28);
    for (key, g) in &fused.grads.tensors {
        assert!(g.data.iter().any(|&v| v != 0.0), "{key} has a gradient");
        assert_eq!(bits(g), bits(&unfused.grads.tensors[key]), "{key}");
    }
}

/// Frozen weights in bf16 (projections, embeddings and tied head) train
/// the tiny PyTorch-fixture Llama like f32 does: loss within 0.1% and
/// every adapter gradient within cosine 0.99 of the f32 graph's.
/// (bf16 keeps 8 significant bits, a relative rounding of at most 2^-9
/// per weight and per activation entering a frozen product. Where AMX
/// carries the LoRA branch on the frozen product's pass, the branch's
/// down products read that rounded activation too (its own factors
/// keep ~16 bits). Attention's products round their operands to bf16
/// too where AMX runs them. Measured: loss 3.3e-4 relative, worst
/// gradient cosine 0.9973; with attention in f32 it was 2.6e-5 and
/// 0.9948 (layer 0's k_proj A, the far end of the backward), with the
/// branch in f32 as well 1.0e-4 and 0.9980.)
#[test]
fn bf16_frozen_weights_train_like_f32() {
    use hexlora::ops::cpu_projection::FrozenDtype;
    let (f32_model, adapter, batch, _) = load("llama");
    let ckpt = hexlora::model::checkpoint::Checkpoint::open(&fixture("llama").join("model")).unwrap();
    let bf16_model = hexlora::train::trainable(&ckpt, FrozenDtype::Bf16, false).unwrap();
    let full = compute_grads(f32_model.as_ref(), &adapter, &batch, &GraphOptions::default(), false).unwrap();
    let half = compute_grads(bf16_model.as_ref(), &adapter, &batch, &GraphOptions::default(), false).unwrap();
    let rel = ((half.loss - full.loss) / full.loss).abs();
    eprintln!("loss f32 {} bf16 {} (relative {rel:.2e})", full.loss, half.loss);
    assert!(rel < 1e-3, "loss f32 {} vs bf16 {}", full.loss, half.loss);
    let mut worst = 1f64;
    for (key, g) in &full.grads.tensors {
        let h = &half.grads.tensors[key];
        let dot: f64 = g.data.iter().zip(&h.data).map(|(a, b)| *a as f64 * *b as f64).sum();
        let norm = |t: &hexlora::tensor::Tensor| t.data.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        worst = worst.min(dot / (norm(g) * norm(h)));
    }
    eprintln!("worst adapter-gradient cosine {worst:.6}");
    assert!(worst > 0.99, "worst gradient cosine {worst}");
}

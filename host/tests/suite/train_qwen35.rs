//! Training Qwen3.5 (Gated DeltaNet + gated attention) end to end on the tiny
//! fixture: the loss goes down, and recomputing every layer in the backward
//! (activation budget 0) gives bit-identical step losses and adapters, with
//! dropout on every projection including the GDN ones.
use hexlora::lora::LoraConfig;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::autograd::graph::Batch;
use hexlora::train::trainer::{train, RunOptions, TrainConfig};
use std::path::PathBuf;

const TARGETS: [&str; 12] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"];

/// 40-token rows (two full 16-token state pieces and a partial one) with a
/// learnable pattern; the first 6 labels ignored.
fn data() -> Vec<Batch> {
    (0..4u32)
        .map(|i| {
            let ids: Vec<u32> = (0..40).map(|t| (i * 5 + t * 3) % 128).collect();
            let labels = ids.iter().enumerate().map(|(t, &x)| if t < 6 { -100 } else { x as i64 }).collect();
            Batch { input_ids: vec![ids], labels: vec![labels] }
        })
        .collect()
}

fn config(activation_cap: Option<u64>) -> TrainConfig {
    TrainConfig {
        lora: LoraConfig { r: 4, alpha: 8.0, target_modules: TARGETS.map(String::from).to_vec(), dropout: 0.1, use_rslora: false, base_model: String::new() },
        adamw: AdamWConfig::default(),
        schedule: Schedule { lr: 2e-2, warmup: 1, total: 10, decay: Decay::Cosine },
        grad_accum: 2,
        max_grad_norm: Some(1.0),
        seed: 5,
        activation_cap,
        head_chunk: 16,
    }
}

#[test]
fn qwen35_trains_and_recompute_is_bit_identical() {
    let model = hexlora::train::open_trainable(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/qwen35/model")).unwrap();
    assert_eq!(model.projections().len(), 2 * 8 + 7);
    let quiet = || RunOptions::quiet();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let kept = train(model.as_ref(), &data(), &config(None), d1.path(), quiet()).unwrap();
    let recomputed = train(model.as_ref(), &data(), &config(Some(0)), d2.path(), quiet()).unwrap();
    let bits = |s: &hexlora::train::commit::TrainState| s.history.iter().map(|r| r.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&kept), bits(&recomputed), "step losses with and without recompute");
    assert_eq!(kept.adapter, recomputed.adapter);
    assert_eq!(kept.adapter.modules.len(), 23);
    let losses: Vec<f32> = kept.history.iter().map(|r| r.loss).collect();
    eprintln!("Qwen3.5 step losses: {losses:?}");
    let (head, tail) = (losses[..2].iter().sum::<f32>(), losses[8..].iter().sum::<f32>());
    assert!(tail < 0.8 * head, "loss did not go down: {losses:?}");
}

/// A Qwen3.5 GGUF (llama.cpp's conventions, rewritten on load) trains as
/// its Hugging Face directory does: the same step losses to f32 rounding
/// (the rewrites `-exp(A_log)` and `1 + w` round once each way).
#[test]
fn qwen35_trains_from_gguf_as_from_its_hf_directory() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-qwen35-gguf");
    let quiet = || RunOptions::quiet();
    let mut cfg = config(None);
    cfg.schedule.total = 4;
    let run = |path: &std::path::Path| {
        let model = hexlora::train::open_trainable(path).unwrap();
        let out = tempfile::tempdir().unwrap();
        let state = train(model.as_ref(), &data(), &cfg, out.path(), quiet()).unwrap();
        state.history.iter().map(|r| r.loss).collect::<Vec<f32>>()
    };
    let (hf, gguf) = (run(&dir), run(&dir.join("model.gguf")));
    assert_eq!(hf.len(), 4);
    for (a, b) in hf.iter().zip(&gguf) {
        assert!(((a - b) / a).abs() < 1e-5, "step losses from HF {hf:?} and GGUF {gguf:?}");
    }
}

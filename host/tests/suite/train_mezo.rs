//! MeZO training loop on the tiny Llama fixture: it lowers the loss, runs
//! are deterministic, and a run stopped after a commit and resumed is
//! bit-identical to an uninterrupted one.
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::mezo::Mezo;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::model::llama::DecoderGraph;
use hexlora::train::grad::evaluate;
use hexlora::autograd::graph::{Batch, TrainableModel};
use hexlora::train::mezo_loop::{train_mezo, MezoConfig, MezoState, RunOptions};
use hexlora::train::trainer::TrainConfig;
use std::path::PathBuf;

fn model() -> DecoderGraph {
    DecoderGraph::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/training/llama/model")).unwrap()
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

fn config(steps: u64, lr: f32) -> MezoConfig {
    MezoConfig {
        train: TrainConfig {
            lora: LoraConfig { r: 4, alpha: 8.0, target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() },
            adamw: AdamWConfig::default(),
            schedule: Schedule { lr, warmup: 0, total: steps, decay: Decay::Linear },
            grad_accum: 6,
            max_grad_norm: None,
            seed: 3,
            activation_cap: None,
            head_chunk: 8,
        },
        mezo: Mezo { eps: 1e-3, weight_decay: 0.0 },
    }
}

fn quiet() -> RunOptions<'static> {
    RunOptions::quiet()
}

fn bits(s: &MezoState) -> (Vec<u32>, Vec<Vec<u32>>) {
    let losses = s.history.iter().map(|r| r.loss.to_bits()).collect();
    let params = s.adapter.modules.iter().flat_map(|m| [&m.a, &m.b]).map(|t| t.data.iter().map(|v| v.to_bits()).collect()).collect();
    (losses, params)
}

#[test]
fn mezo_lowers_the_training_loss() {
    let (m, d) = (model(), data());
    let cfg = config(60, 2e-2);
    let start = Adapter::init(cfg.train.lora.clone(), &m.projections(), 0).unwrap();
    let before = evaluate(&m, &start, &d).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = train_mezo(&m, &d, &cfg, dir.path(), quiet()).unwrap();
    let after = evaluate(&m, &s.adapter, &d).unwrap();
    eprintln!("MeZO, 60 steps: training-set loss {before:.4} -> {after:.4}");
    assert!(after < before - 0.05, "loss {before} -> {after}");
    for f in ["adapter/adapter_config.json", "adapter/adapter_model.safetensors", "loss.svg", "metrics.jsonl", "commit.safetensors"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    let reloaded = Adapter::load(&dir.path().join("adapter")).unwrap();
    for m in &s.adapter.modules {
        assert_eq!(reloaded.module(&m.name), Some(m), "{} after the PEFT round trip", m.name);
    }
}

#[test]
fn mezo_resume_after_a_commit_is_bit_identical() {
    let (m, d) = (model(), data());
    let cfg = config(8, 2e-2);
    let (d1, d2, d3) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let whole = train_mezo(&m, &d, &cfg, d1.path(), quiet()).unwrap();
    let again = train_mezo(&m, &d, &cfg, d2.path(), quiet()).unwrap();
    assert_eq!(bits(&whole), bits(&again), "two runs differ");
    let first = train_mezo(&m, &d, &cfg, d3.path(), RunOptions { stop_after: Some(3), ..quiet() }).unwrap();
    assert_eq!(first.step, 3);
    assert!(train_mezo(&m, &d, &cfg, d3.path(), quiet()).is_err(), "an existing commit needs --resume");
    let resumed = train_mezo(&m, &d, &cfg, d3.path(), RunOptions { resume: true, ..quiet() }).unwrap();
    assert_eq!(bits(&whole), bits(&resumed));
    assert_eq!(whole.cursor, resumed.cursor);
    let mut other = cfg.clone();
    other.mezo.eps = 2e-3;
    let err = train_mezo(&m, &d, &other, d3.path(), RunOptions { resume: true, ..quiet() }).unwrap_err();
    assert!(err.to_string().contains("different inputs: Mezo.eps: was 0.001, now 0.002"), "names the field: {err}");
}

//! The hypernetwork on every architecture it can be given by `arch::of`.
//!
//! It reads a model only through `TrainableModel`: the hidden states of its
//! layers and final norm, and the vocabulary head. That path is checked
//! against PyTorch + PEFT's logits on the gradient fixtures of Llama,
//! Qwen3, Gemma 3 and Qwen3.5 (`host/tests/fixtures/training/make_grad_fixtures.py`),
//! and on Gemma 3 and Qwen3.5 the whole road runs: an untrained network
//! synthesizes exactly the common LoRA it starts from, two `hypertrain`
//! steps (one SimCSE, one end to end) move it, and the saved network
//! reloads and synthesizes what the trained one does.
use hexlora::autograd::graph::{lora_params, Batch, LoraVars, TrainableModel};
use hexlora::autograd::Tape;
use hexlora::base::tensor_file::TensorFile;
use hexlora::hyper::commit::Stage;
use hexlora::hyper::trainer::{hypertrain, Guides, HyperRun, HyperTrainConfig};
use hexlora::hyper::users::{Context, Pair, UserRecord};
use hexlora::hyper::HyperNet;
use hexlora::lora::Adapter;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::Decay;
use hexlora::projection::Direction;

use crate::support::{hyper_net_config, rel_err, training_fixture as fixture, ByteText};

/// The model (CPU f32, through `arch::of`) and the PEFT adapter of a fixture.
fn load(arch: &str) -> (Box<dyn TrainableModel>, Adapter) {
    let dir = fixture(arch);
    (hexlora::train::open_trainable(&dir.join("model")).unwrap(), Adapter::load(&dir.join("adapter")).unwrap())
}

/// Logits of the hidden-state path: layers and final norm on the tape,
/// then the head as the hypernetwork's distillation loss applies it.
fn logits_via_hidden_states(model: &dyn TrainableModel, adapter: &Adapter, ids: &[Vec<u32>]) -> Vec<f32> {
    let mut tape = Tape::new();
    let (factors, _) = lora_params(&mut tape, &adapter.modules);
    let lora = LoraVars { factors, scaling: adapter.config.scaling(), dropout: 0.0, dropout_seed: 0 };
    let h = model.hidden_states(&mut tape, ids, &lora, &[], true).unwrap();
    let x = tape.value(h).data.clone();
    let rows = x.len() / model.hidden_size();
    let head = model.head();
    let mut out = vec![0.0f32; rows * head.info().out_features];
    head.apply(Direction::Forward, &x, rows, &mut out).unwrap();
    out
}

#[test]
fn hidden_states_and_head_give_pytorch_logits_on_every_architecture() {
    for arch in ["llama", "qwen3", "gemma3", "qwen35"] {
        let (model, adapter) = load(arch);
        let batch: Batch = serde_json::from_str(&std::fs::read_to_string(fixture(arch).join("batch.json")).unwrap()).unwrap();
        let expected = TensorFile::read(&fixture(arch).join("expected.safetensors")).unwrap();
        let want = &expected.tensors["logits"];
        let got = logits_via_hidden_states(model.as_ref(), &adapter, &batch.input_ids);
        let e = rel_err(&got, &want.data);
        assert!(e < 1e-4, "{arch}: logits through hidden_states + head, rel err {e}");
    }
}

/// Causal states of the tokens before the last do not depend on the last
/// token (bit for bit); with the embedder's full view the first token's
/// state does, also on Qwen3.5, whose attention layer sees the whole
/// sequence while its recurrent layers read only the past.
#[test]
fn the_embedders_full_view_lets_early_tokens_see_later_ones() {
    for arch in ["llama", "gemma3", "qwen35"] {
        let (model, _) = load(arch);
        let d = model.hidden_size();
        let states = |last: u32, causal: bool| {
            let mut ids: Vec<u32> = (0..24u32).map(|i| (i * 7 + 3) % 64).collect();
            *ids.last_mut().unwrap() = last;
            let mut tape = Tape::new();
            let lora = LoraVars { factors: Default::default(), scaling: 1.0, dropout: 0.0, dropout_seed: 0 };
            let h = model.hidden_states(&mut tape, &[ids], &lora, &[], causal).unwrap();
            tape.value(h).data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let (a, b) = (states(5, true), states(50, true));
        assert_eq!(a[..23 * d], b[..23 * d], "{arch}: a causal state saw the last token");
        assert_ne!(a[23 * d..], b[23 * d..], "{arch}");
        let (a, b) = (states(5, false), states(50, false));
        assert_ne!(a[..d], b[..d], "{arch}: with the full view the first token still ignores the last");
    }
}

fn users() -> Vec<UserRecord> {
    ["short", "LOUD!", "polite please", "terse."]
        .iter()
        .enumerate()
        .map(|(u, style)| UserRecord {
            user: format!("u{u}"),
            examples: (0..4).map(|i| Pair { query: format!("q{i} about {}", i * 7 + u), response: format!("{style} {i}") }).collect(),
        })
        .collect()
}

fn train_config() -> HyperTrainConfig {
    HyperTrainConfig {
        simcse_steps: 1,
        e2e_steps: 1,
        users_per_step: 2,
        target_examples: 1,
        max_len: 40,
        kl_weight: 0.5,
        simcse_lr: 1e-3,
        lr: 1e-2,
        warmup: 0,
        decay: Decay::Cosine,
        adamw: AdamWConfig::default(),
        max_grad_norm: Some(1.0),
        seed: 3,
        recompute: false,
        freeze_common: false,
        freeze_embedder: false,
        recon_weight: 0.0,
        end_to_end: true,
    }
}

#[test]
fn the_hypernetwork_trains_and_synthesizes_on_gemma3_and_qwen35() {
    for arch in ["gemma3", "qwen35"] {
        let (model, common) = load(arch);
        let model = model.as_ref();
        let fresh = HyperNet::init(hyper_net_config(&common), model, Some(&common), 1).unwrap();
        let ctx = Context::all((0..30u32).map(|i| (i * 5) % 100 + 4).collect());
        // W2 = 0 at init: every user gets the common LoRA, bit for bit.
        let untrained = fresh.synthesize(model, &ctx).unwrap();
        for m in &common.modules {
            let got = untrained.module(&m.name).unwrap_or_else(|| panic!("{arch}: no {}", m.name));
            assert_eq!((&got.a.data, &got.b.data), (&m.a.data, &m.b.data), "{arch} {}", m.name);
        }

        let out = tempfile::tempdir().unwrap();
        let run = HyperRun { resume: false, progress: false, stop_after: None, commit_every: 1, hooks: None };
        let state = hypertrain(model, &ByteText, &users(), fresh, Guides::teacher(Some(&common)), &train_config(), out.path(), run).unwrap();
        let stages: Vec<_> = state.history.iter().map(|r| r.stage).collect();
        assert_eq!(stages, [Stage::Simcse, Stage::EndToEnd], "{arch}");
        assert!(state.history.iter().all(|r| r.loss.is_finite() && r.grad_norm > 0.0), "{arch}: {:?}", state.history);
        assert!(state.history[1].ce > 0.0 && state.history[1].kl >= 0.0, "{arch}");

        let trained = state.net.synthesize(model, &ctx).unwrap();
        assert_ne!(trained, untrained, "{arch}: two steps moved nothing");
        let loaded = HyperNet::load(&out.path().join("hypernet"), model).unwrap();
        assert_eq!(loaded.synthesize(model, &ctx).unwrap(), trained, "{arch}: the saved network synthesizes another adapter");
    }
}

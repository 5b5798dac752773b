//! The hypernetwork's whole pipeline against an independent PyTorch (f64)
//! implementation (`host/tests/fixtures/hyper/make_hyper_fixture.py`):
//! bidirectional embedder with its LoRA, mean pooling, heads (parallel and
//! shared trunk), generated LoRA on the frozen tiny Llama, CE + KL to an ICL
//! teacher. Loss, embedding and the gradient of every parameter within 1e-4
//! (per-tensor max-normalised).
use hexlora::hyper::end_to_end::{user_loss_and_grads, E2eOptions, Example, UserBatch};
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet};
use hexlora::lora::tensor_file::TensorFile;
use hexlora::lora::Adapter;
use hexlora::model::config::ModelConfig;
use hexlora::model::hf_dir::HfDir;
use hexlora::model::llama::DecoderGraph;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper")
}

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs() as f64)).max(1e-12);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((*g as f64 - *w as f64).abs())) / scale
}

fn config(variant: HeadVariant) -> HyperConfig {
    HyperConfig {
        embed_rank: 2,
        embed_alpha: 4.0,
        embed_dropout: 0.0,
        embed_targets: ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
        out_rank: 2,
        out_alpha: 4.0,
        out_targets: ["q_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
        bottleneck: 3,
        variant,
        ..HyperConfig::default()
    }
}

fn user() -> UserBatch {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir().join("batch.json")).unwrap()).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> { x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect() };
    let examples = v["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| Example { ids: ids(&e["ids"]), labels: e["labels"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect() })
        .collect();
    UserBatch { context: ids(&v["context"]), examples, teacher_prefix: ids(&v["teacher_prefix"]) }
}

pub fn model() -> DecoderGraph {
    let src = HfDir::open(&dir().join("model")).unwrap();
    DecoderGraph::load(&src, ModelConfig::from_hf_json(src.config()).unwrap()).unwrap()
}

fn check(variant: HeadVariant, file: &str) {
    let model = model();
    let expected = TensorFile::read(&dir().join(file)).unwrap();
    let mut net = HyperNet::init(config(variant), &model, None, 0).unwrap();
    let names = net.param_names();
    assert_eq!(names.len() * 2 + 4, expected.tensors.len(), "{file}: parameter count");
    let params = names.iter().map(|n| expected.get(&format!("param/{n}"), file).unwrap().clone()).collect();
    net.set_params(params).unwrap();
    let common = Adapter::load(&dir().join("common")).unwrap();
    let opts = E2eOptions { kl_weight: 0.5, teacher_lora: Some(&common), dropout_seed: None, recompute: vec![], head_chunk: 4 };
    let mut grads = net.zero_grads();
    let loss = user_loss_and_grads(&model, &net, &user(), &opts, 1.0, &mut grads).unwrap();
    for (what, got) in [("loss", loss.total), ("ce", loss.ce), ("kl", loss.kl)] {
        let want = expected.tensors[what].data[0] as f64;
        assert!(((got - want) / want).abs() < 1e-5, "{file} {what}: {got} vs {want}");
    }
    let pass = hexlora::hyper::embedder::embed_forward(&model, &net.embedder, &user().context, None, false, &[]).unwrap();
    let e = rel_err(&pass.embedding, &expected.tensors["embedding"].data);
    assert!(e < 1e-5, "{file} embedding rel err {e}");
    let mut worst = (0f64, String::new());
    for (name, g) in names.iter().zip(&grads) {
        let want = expected.get(&format!("grad/{name}"), file).unwrap();
        assert_eq!(g.shape, want.shape, "{name}");
        assert!(want.data.iter().any(|&v| v != 0.0), "{name}: the reference gradient is zero, the test would prove nothing");
        let e = rel_err(&g.data, &want.data);
        eprintln!("{name}: {e:.2e}");
        if e > worst.0 {
            worst = (e, name.clone());
        }
    }
    assert!(worst.0 < 1e-4, "{file} {}: rel err {}", worst.1, worst.0);
    eprintln!("{file}: worst gradient rel err {:.2e} ({})", worst.0, worst.1);
    // Recomputing every layer in the backward changes nothing.
    let opts = E2eOptions { recompute: vec![true; 2], ..opts };
    let mut again = net.zero_grads();
    user_loss_and_grads(&model, &net, &user(), &opts, 1.0, &mut again).unwrap();
    for (a, b) in again.iter().zip(&grads) {
        assert_eq!(a.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

#[test]
fn parallel_heads_pipeline_gradients_match_pytorch() {
    check(HeadVariant::Parallel, "parallel.safetensors");
}

#[test]
fn shared_trunk_pipeline_gradients_match_pytorch() {
    check(HeadVariant::SharedTrunk, "shared.safetensors");
}

/// An untrained hypernetwork (W2 = 0) emits exactly the common LoRA it was
/// initialised from, whatever the context.
#[test]
fn untrained_hypernetwork_reproduces_the_common_lora() {
    let model = model();
    let common = Adapter::load(&dir().join("common")).unwrap();
    for variant in [HeadVariant::Parallel, HeadVariant::SharedTrunk] {
        let net = HyperNet::init(config(variant), &model, Some(&common), 3).unwrap();
        for context in [user().context, vec![1, 2, 3]] {
            let out = net.synthesize(&model, &context).unwrap();
            assert_eq!(out.modules.len(), common.modules.len());
            for m in &common.modules {
                let got = out.module(&m.name).unwrap();
                assert_eq!(got.a, m.a, "{variant:?} {}", m.name);
                assert_eq!(got.b, m.b, "{variant:?} {}", m.name);
            }
        }
    }
}

/// Central finite differences of the loss itself (f32 forward, Richardson)
/// agree with the analytic gradient on the largest-gradient element of
/// every parameter tensor: embedder LoRA, head W1/b1/W2/b2, trunk embeddings.
#[test]
fn pipeline_gradients_match_finite_differences() {
    let model = model();
    let common = Adapter::load(&dir().join("common")).unwrap();
    let expected = TensorFile::read(&dir().join("shared.safetensors")).unwrap();
    let mut net = HyperNet::init(config(HeadVariant::SharedTrunk), &model, None, 0).unwrap();
    let names = net.param_names();
    net.set_params(names.iter().map(|n| expected.get(&format!("param/{n}"), "shared").unwrap().clone()).collect()).unwrap();
    let opts = E2eOptions { kl_weight: 0.5, teacher_lora: Some(&common), dropout_seed: None, recompute: vec![], head_chunk: 4 };
    let mut grads = net.zero_grads();
    user_loss_and_grads(&model, &net, &user(), &opts, 1.0, &mut grads).unwrap();
    let loss_at = |params: Vec<hexlora::tensor::Tensor>| -> f64 {
        let mut n = net.clone();
        n.set_params(params).unwrap();
        let mut g = n.zero_grads();
        user_loss_and_grads(&model, &n, &user(), &opts, 1.0, &mut g).unwrap().total
    };
    // Richardson extrapolation of two central differences cancels the h^2 term.
    let central = |p: usize, i: usize, h: f32| -> f64 {
        let (mut plus, mut minus) = (net.params(), net.params());
        plus[p].data[i] += h;
        minus[p].data[i] -= h;
        (loss_at(plus) - loss_at(minus)) / (2.0 * h as f64)
    };
    let mut checked = 0;
    for (p, (name, g)) in names.iter().zip(&grads).enumerate() {
        let i = (0..g.data.len()).max_by(|&a, &b| g.data[a].abs().total_cmp(&g.data[b].abs())).unwrap();
        let fd = (4.0 * central(p, i, 2e-3) - central(p, i, 4e-3)) / 3.0;
        let an = g.data[i] as f64;
        eprintln!("{name}[{i}]: fd {fd} analytic {an}");
        assert!((fd - an).abs() < 2e-2 * an.abs().max(1e-2), "{name}[{i}]: finite difference {fd} vs analytic {an}");
        checked += 1;
    }
    assert_eq!(checked, names.len());
}

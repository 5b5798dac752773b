//! The hypernetwork's whole pipeline against an independent PyTorch (f64)
//! implementation (`host/tests/fixtures/hyper/make_hyper_fixture.py`):
//! bidirectional embedder with its LoRA, mean pooling, heads (parallel and
//! shared trunk, parallel heads centred on a running mean, and centred,
//! standardized heads behind pooling over marked context tokens), generated
//! LoRA on the frozen tiny Llama, CE + KL to an ICL teacher. Loss, embedding
//! and the gradient of every parameter within 1e-4 (per-tensor max-normalised).
use hexlora::hyper::end_to_end::{user_loss_and_grads, E2eOptions, Example, UserBatch};
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet};
use hexlora::hyper::users::Context;
use hexlora::base::tensor_file::TensorFile;
use hexlora::lora::Adapter;
use hexlora::model::config::ModelConfig;
use hexlora::model::hf_dir::HfDir;
use hexlora::model::llama::DecoderGraph;
use std::path::PathBuf;

use crate::support::rel_err;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper")
}

fn config(variant: HeadVariant, center: bool) -> HyperConfig {
    config_std(variant, center, false)
}

fn config_std(variant: HeadVariant, center: bool, standardize: bool) -> HyperConfig {
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
        center,
        standardize,
        ..HyperConfig::default()
    }
}

/// The fixture's user; `pooled` marks the context tokens batch.json lists
/// for the standardized variant (else every token is pooled).
fn user_with(pooled: bool) -> UserBatch {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir().join("batch.json")).unwrap()).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> { x.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect() };
    let examples = v["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| Example { ids: ids(&e["ids"]), labels: e["labels"].as_array().unwrap().iter().map(|t| t.as_i64().unwrap()).collect() })
        .collect();
    let marks = pooled.then(|| v["context_pooled"].as_array().unwrap().iter().map(|b| b.as_bool().unwrap()).collect());
    UserBatch { context: Context { ids: ids(&v["context"]), pooled: marks }, examples, teacher_prefix: ids(&v["teacher_prefix"]) }
}

fn user() -> UserBatch {
    user_with(false)
}

pub fn model() -> DecoderGraph {
    let src = HfDir::open(&dir().join("model")).unwrap();
    DecoderGraph::load(&src, ModelConfig::from_hf_json(src.config()).unwrap()).unwrap()
}

fn check(variant: HeadVariant, center: bool, file: &str) {
    check_std(variant, center, false, file)
}

fn check_std(variant: HeadVariant, center: bool, standardize: bool, file: &str) {
    let model = model();
    let expected = TensorFile::read(&dir().join(file)).unwrap();
    let mut net = HyperNet::init(config_std(variant, center, standardize), &model, None, 0).unwrap();
    let user = || user_with(standardize);
    let names = net.param_names();
    assert_eq!(names.len() * 2 + 4, expected.tensors.len(), "{file}: parameter count");
    let params = names.iter().map(|n| expected.get(&format!("param/{n}"), file).unwrap().clone()).collect();
    net.set_params(params).unwrap();
    let common = Adapter::load(&dir().join("common")).unwrap();
    let opts = E2eOptions { kl_weight: 0.5, teacher_lora: Some(&common), dropout_seed: None, recompute: vec![], head_chunk: 4, train_embedder: true, end_to_end: true, reconstruct: None };
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
        if name.starts_with("heads/center.") || name.starts_with("heads/embed.") {
            // A buffer: no gradient moves it (the reference writes zeros).
            assert!(g.data.iter().chain(&want.data).all(|&v| v == 0.0), "{name}: a buffer got a gradient");
            continue;
        }
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
    // A frozen embedder: the same loss and heads' gradients (PyTorch's, as
    // checked above), the embedder's gradients zero.
    let frozen = E2eOptions { train_embedder: false, ..opts };
    let mut heads_only = net.zero_grads();
    let l = user_loss_and_grads(&model, &net, &user(), &frozen, 1.0, &mut heads_only).unwrap();
    assert_eq!(l.total.to_bits(), loss.total.to_bits(), "{file}: the frozen embedder changed the loss");
    let e = net.embedder_len();
    assert!(heads_only[..e].iter().all(|g| g.data.iter().all(|&v| v == 0.0)), "{file}: a frozen embedder got a gradient");
    for (a, b) in heads_only[e..].iter().zip(&grads[e..]) {
        assert_eq!(a.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
}

#[test]
fn parallel_heads_pipeline_gradients_match_pytorch() {
    check(HeadVariant::Parallel, false, "parallel.safetensors");
}

#[test]
fn centred_heads_pipeline_gradients_match_pytorch() {
    check(HeadVariant::Parallel, true, "parallel-centered.safetensors");
}

#[test]
fn standardized_heads_and_marked_pooling_gradients_match_pytorch() {
    check_std(HeadVariant::Parallel, true, true, "parallel-standardized.safetensors");
}

#[test]
fn shared_trunk_pipeline_gradients_match_pytorch() {
    check(HeadVariant::SharedTrunk, false, "shared.safetensors");
}

/// An untrained hypernetwork (W2 = 0) emits exactly the common LoRA it was
/// initialised from, whatever the context.
#[test]
fn untrained_hypernetwork_reproduces_the_common_lora() {
    let model = model();
    let common = Adapter::load(&dir().join("common")).unwrap();
    for variant in [HeadVariant::Parallel, HeadVariant::SharedTrunk] {
        let net = HyperNet::init(config(variant, false), &model, Some(&common), 3).unwrap();
        for context in [user().context, Context::all(vec![1, 2, 3])] {
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
    let mut net = HyperNet::init(config(HeadVariant::SharedTrunk, false), &model, None, 0).unwrap();
    let names = net.param_names();
    net.set_params(names.iter().map(|n| expected.get(&format!("param/{n}"), "shared").unwrap().clone()).collect()).unwrap();
    let opts = E2eOptions { kl_weight: 0.5, teacher_lora: Some(&common), dropout_seed: None, recompute: vec![], head_chunk: 4, train_embedder: true, end_to_end: true, reconstruct: None };
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

/// The running centre after three steps of 2, 3 and 1 users is the
/// exponential mean of the steps' user means with momentum 0.9 and Adam's
/// bias correction, `sum_t m^(T-t) mean_t / sum_t m^(T-t)`, here in f64;
/// standardized heads keep the embedding's mean and mean square the same way.
#[test]
fn centre_is_the_bias_corrected_running_mean() {
    let model = model();
    let mut net = HyperNet::init(config_std(HeadVariant::Parallel, true, true), &model, None, 0).unwrap();
    let n = net.heads.specs.len() * net.heads.k;
    let batch = |s: f64, users: usize| -> Vec<Vec<f64>> { (0..users).map(|u| (0..n).map(|i| ((i * 7 + u * 3) as f64 * s).sin()).collect()).collect() };
    let steps = [batch(0.3, 2), batch(1.1, 3), batch(-0.7, 1)];
    let e_dim = net.heads.embed_dim;
    let embeds = |b: &Vec<Vec<f64>>| -> Vec<Vec<f32>> { b.iter().map(|h| h[..e_dim].iter().map(|&v| v as f32).collect()).collect() };
    for b in &steps {
        net.heads.update_center(&b.iter().map(|h| h.iter().map(|&v| v as f32).collect()).collect::<Vec<_>>());
        net.heads.update_embed_norm(&embeds(b));
    }
    let names = net.param_names();
    let at = |name: &str| net.params()[names.iter().position(|n| n == name).unwrap()].data.clone();
    let (sum, weight) = (at("heads/center.sum"), at("heads/center.weight")[0]);
    let (e_sum, e_sumsq, e_weight) = (at("heads/embed.sum"), at("heads/embed.sumsq")[0], at("heads/embed.weight")[0]);
    let m = 0.9f64;
    let decay: Vec<f64> = (0..3).map(|t| m.powi(2 - t)).collect();
    for i in 0..n {
        let mean = |b: &Vec<Vec<f64>>| b.iter().map(|h| h[i]).sum::<f64>() / b.len() as f64;
        let want = steps.iter().zip(&decay).map(|(b, d)| d * mean(b)).sum::<f64>() / decay.iter().sum::<f64>();
        let got = sum[i] as f64 / weight as f64;
        assert!((got - want).abs() < 1e-5, "centre[{i}]: {got} vs {want}");
        if i < e_dim {
            let got = e_sum[i] as f64 / e_weight as f64;
            assert!((got - want).abs() < 1e-5, "embedding mean[{i}]: {got} vs {want}");
        }
    }
    let mean_sq = |b: &Vec<Vec<f64>>| b.iter().map(|h| h[..e_dim].iter().map(|v| v * v).sum::<f64>() / e_dim as f64).sum::<f64>() / b.len() as f64;
    let want = steps.iter().zip(&decay).map(|(b, d)| d * mean_sq(b)).sum::<f64>() / decay.iter().sum::<f64>();
    let got = e_sumsq as f64 / e_weight as f64;
    assert!((got - want).abs() < 1e-5, "embedding mean square: {got} vs {want}");
}

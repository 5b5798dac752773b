//! `hypertrain` on the tiny fixture Llama: both stages run, a run stopped
//! after any step and resumed (twice) ends bit-identical to an uninterrupted
//! one (every step loss and every parameter), the saved hypernetwork
//! reloads and synthesizes the same adapter, and bad state is refused.
use hexlora::hyper::commit::Stage;
use hexlora::hyper::trainer::{hypertrain, Guides, HyperRun, HyperTrainConfig};
use hexlora::hyper::users::{Context, Pair, UserRecord};
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet};
use hexlora::model::config::ModelConfig;
use hexlora::model::hf_dir::HfDir;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::Decay;
use hexlora::model::llama::DecoderGraph;
use std::path::Path;

use crate::support::ByteText;
use hexlora::train::data::Encoder;

fn model() -> DecoderGraph {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper/model");
    let src = HfDir::open(&dir).unwrap();
    DecoderGraph::load(&src, ModelConfig::from_hf_json(src.config()).unwrap()).unwrap()
}

fn users() -> Vec<UserRecord> {
    let styles = ["short", "LOUD!", "polite please", "terse."];
    styles
        .iter()
        .enumerate()
        .map(|(u, style)| UserRecord {
            user: format!("u{u}"),
            examples: (0..4).map(|i| Pair { query: format!("q{i} about {}", i * 7 + u), response: format!("{style} {i}") }).collect(),
        })
        .collect()
}

fn configs() -> (HyperConfig, HyperTrainConfig) {
    let net = HyperConfig {
        embed_rank: 2,
        embed_alpha: 4.0,
        embed_dropout: 0.1,
        out_rank: 2,
        out_alpha: 4.0,
        bottleneck: 3,
        variant: HeadVariant::SharedTrunk,
        context_tokens: 40,
        ..HyperConfig::default()
    };
    let train = HyperTrainConfig {
        simcse_steps: 2,
        e2e_steps: 3,
        users_per_step: 2,
        target_examples: 1,
        max_len: 32,
        kl_weight: 0.5,
        simcse_lr: 1e-3,
        lr: 1e-2,
        warmup: 1,
        decay: Decay::Cosine,
        adamw: AdamWConfig::default(),
        max_grad_norm: Some(1.0),
        seed: 5,
        recompute: false,
        freeze_common: false,
        freeze_embedder: false,
        recon_weight: 0.0,
        end_to_end: true,
    };
    (net, train)
}

fn run(out: &Path, resume: bool, stop_after: Option<u64>) -> hexlora::Result<hexlora::hyper::commit::HyperState> {
    run_committing(out, resume, stop_after, 1)
}

fn run_committing(out: &Path, resume: bool, stop_after: Option<u64>, commit_every: u64) -> hexlora::Result<hexlora::hyper::commit::HyperState> {
    run_centred(out, resume, stop_after, commit_every, false)
}

fn run_centred(out: &Path, resume: bool, stop_after: Option<u64>, commit_every: u64, center: bool) -> hexlora::Result<hexlora::hyper::commit::HyperState> {
    let model = model();
    let (net, train) = configs();
    let net = HyperConfig { center, ..net };
    let fresh = HyperNet::init(net, &model, None, 1).unwrap();
    hypertrain(&model, &ByteText, &users(), fresh, Guides::default(), &train, out, HyperRun { resume, progress: false, stop_after, commit_every, hooks: None })
}

fn bits(net: &HyperNet) -> Vec<Vec<u32>> {
    net.params().iter().map(|t| t.data.iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn stopped_and_resumed_runs_are_bit_identical() {
    let whole = tempfile::tempdir().unwrap();
    let a = run(whole.path(), false, None).unwrap();
    assert_eq!(a.history.len(), 5);
    assert_eq!(a.history.iter().filter(|r| r.stage == Stage::Simcse).count(), 2);
    assert!(a.history.iter().all(|r| r.loss.is_finite() && r.grad_norm > 0.0));
    assert!(a.history[2..].iter().all(|r| r.ce > 0.0 && r.kl >= 0.0));

    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), false, Some(2)).unwrap();
    assert!(run(parts.path(), false, None).is_err(), "an existing commit needs --resume");
    run(parts.path(), true, Some(1)).unwrap();
    let b = run(parts.path(), true, None).unwrap();
    let losses = |s: &hexlora::hyper::commit::HyperState| s.history.iter().map(|r| (r.loss.to_bits(), r.lr.to_bits())).collect::<Vec<_>>();
    assert_eq!(losses(&a), losses(&b));
    assert_eq!(bits(&a.net), bits(&b.net));

    // Committing every 2nd step: a run stopped after step 3 resumes from
    // step 2's commit, redoes step 3, and still ends bit-identical.
    let sparse = tempfile::tempdir().unwrap();
    run_committing(sparse.path(), false, Some(3), 2).unwrap();
    let c = run_committing(sparse.path(), true, None, 2).unwrap();
    assert_eq!(losses(&a), losses(&c));
    assert_eq!(bits(&a.net), bits(&c.net));

    // The saved hypernetwork reloads and synthesizes what the trained one does.
    let model = model();
    let loaded = HyperNet::load(&whole.path().join("hypernet"), &model).unwrap();
    assert_eq!(bits(&loaded), bits(&a.net));
    let ctx = Context::all((0..20).map(|i| (i * 5 % 64) as u32).collect());
    assert_eq!(loaded.synthesize(&model, &ctx).unwrap(), a.net.synthesize(&model, &ctx).unwrap());
    // Training moved the heads away from their init (W2 = 0).
    let fresh = HyperNet::init(configs().0, &model, None, 1).unwrap();
    assert_ne!(fresh.synthesize(&model, &ctx).unwrap(), a.net.synthesize(&model, &ctx).unwrap());
}

/// Centred heads: the centre travels in the commits (a resumed run is
/// bit-identical), no optimizer step moves it, its weight after the three
/// end-to-end steps is 1 - 0.9^3, and the saved network synthesizes what
/// the trained one does.
#[test]
fn centred_runs_resume_bit_identically() {
    let whole = tempfile::tempdir().unwrap();
    let a = run_centred(whole.path(), false, None, 1, true).unwrap();
    let parts = tempfile::tempdir().unwrap();
    run_centred(parts.path(), false, Some(3), 1, true).unwrap();
    let b = run_centred(parts.path(), true, None, 1, true).unwrap();
    assert_eq!(bits(&a.net), bits(&b.net));
    let names = a.net.param_names();
    let weight = &a.net.params()[names.iter().position(|n| n == "heads/center.weight").unwrap()].data[0];
    assert!((*weight as f64 - (1.0 - 0.9f64.powi(3))).abs() < 1e-6, "centre weight {weight}");
    let sum = &a.net.params()[names.iter().position(|n| n == "heads/center.sum").unwrap()];
    assert!(sum.data.iter().any(|&v| v != 0.0), "the centre never moved");
    let model = model();
    let loaded = HyperNet::load(&whole.path().join("hypernet"), &model).unwrap();
    assert!(loaded.config.center);
    let ctx = Context::all((0..20).map(|i| (i * 5 % 64) as u32).collect());
    assert_eq!(loaded.synthesize(&model, &ctx).unwrap(), a.net.synthesize(&model, &ctx).unwrap());
}

#[test]
fn bad_state_and_bad_input_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("commit.safetensors"), b"not a commit").unwrap();
    assert!(run(dir.path(), true, None).is_err());
    let model = model();
    let net = HyperNet::init(configs().0, &model, None, 0).unwrap();
    let err = net.synthesize(&model, &Context::all(vec![])).unwrap_err().to_string();
    assert!(err.contains("context"), "{err}");
    net.save(dir.path()).unwrap();
    let mut f = hexlora::base::tensor_file::TensorFile::read(&dir.path().join("hypernet.safetensors")).unwrap();
    let key = f.tensors.keys().next().unwrap().clone();
    f.tensors.get_mut(&key).unwrap().data[0] = f32::NAN;
    std::fs::write(dir.path().join("hypernet.safetensors"), f.to_bytes().unwrap()).unwrap();
    let err = HyperNet::load(dir.path(), &model).unwrap_err().to_string();
    assert!(err.contains("non-finite"), "{err}");
    let bad = HyperConfig { template: "no placeholders".into(), ..configs().0 };
    assert!(HyperNet::init(bad, &model, None, 0).is_err());
}

/// Scored examples and context are disjoint; an example whose prompt alone
/// overflows `max_len` is scored with its prompt cut from the left (the
/// whole response kept); the context respects its budget.
#[test]
fn user_split_is_disjoint_and_cuts_long_prompts_from_the_left() {
    use hexlora::hyper::users::{render_example, sample_user};
    let mut user = users().remove(0);
    user.examples.push(Pair { query: "x".repeat(100), response: "long".into() });
    let n = user.examples.len();
    for seed in 0..20 {
        let cfg = HyperConfig { template: "Q {query} R {response};".into(), context_tokens: 30, ..HyperConfig::default() };
        let b = sample_user(&ByteText, &cfg, &user, seed, 2, 40).unwrap();
        assert_eq!(b.examples.len(), 2);
        assert!(b.context.len() <= 30 && !b.context.is_empty());
        let scored: Vec<usize> = (0..n).filter(|&i| b.examples.contains(&render_example(&ByteText, &user.examples[i], 40).unwrap())).collect();
        assert_eq!(scored.len(), 2, "seed {seed}");
        for &i in &scored {
            let rendered = ByteText.encode(&format!("Q {} R {};", user.examples[i].query, user.examples[i].response)).unwrap();
            assert!(!b.context.ids.windows(rendered.len()).any(|w| w == rendered.as_slice()), "seed {seed}: scored example {i} also in the context");
        }
    }
    // "<user>xxx...<assistant>" is 117 bytes, "long|" 5: 35 prompt bytes survive, the last ones.
    let long = render_example(&ByteText, &user.examples[n - 1], 40).unwrap();
    let want = ByteText.encode(&format!("{}<assistant>long|", "x".repeat(24))).unwrap();
    assert_eq!(long.ids, want);
    assert_eq!(long.labels.iter().filter(|&&l| l >= 0).count(), 5);
    assert!(long.labels[..35].iter().all(|&l| l == -100));
}

/// `Pool::Responses` pools exactly the responses' bytes of the rendered
/// context, `context_query_chars` keeps each query's last characters, and
/// the budget cuts ids and marks alike (byte-level text: one token a byte).
#[test]
fn response_pooling_marks_exactly_the_responses() {
    use hexlora::hyper::users::render_context;
    use hexlora::hyper::Pool;
    let pairs = [Pair { query: "abcdef".into(), response: "XY".into() }, Pair { query: "gh".into(), response: "Z".into() }];
    let refs: Vec<&Pair> = pairs.iter().collect();
    let mut cfg = HyperConfig { template: "Q {query} R {response};".into(), context_tokens: 100, context_query_chars: Some(3), pool: Pool::Responses, ..HyperConfig::default() };
    let ctx = render_context(&ByteText, &cfg, &refs).unwrap();
    let text = "Q def R XY;Q gh R Z;";
    assert_eq!(ctx.ids, ByteText.encode(text).unwrap());
    let marked: String = text.chars().zip(ctx.pooled.as_ref().unwrap()).filter(|(_, &m)| m).map(|(c, _)| c).collect();
    assert_eq!(marked, "XYZ");
    cfg.pool = Pool::Mean;
    assert_eq!(render_context(&ByteText, &cfg, &refs).unwrap(), Context::all(ByteText.encode(text).unwrap()));
    cfg.pool = Pool::Responses;
    cfg.context_tokens = 9;
    let cut = render_context(&ByteText, &cfg, &refs).unwrap();
    assert_eq!((cut.ids.len(), cut.pooled.unwrap()), (9, [false; 8].into_iter().chain([true]).collect::<Vec<_>>()));
}

/// What `hexlora synth` reports as "from N of M examples": the pairs the
/// budget keeps whole, and whether one more was cut, under both poolings.
/// "Q def R XY;" is 11 bytes, "Q gh R Z;" 9 (byte-level text).
#[test]
fn the_context_counts_only_the_examples_it_holds() {
    use hexlora::hyper::users::{render_context_fitted, Fitted};
    use hexlora::hyper::Pool;
    let pairs = [Pair { query: "abcdef".into(), response: "XY".into() }, Pair { query: "gh".into(), response: "Z".into() }];
    let refs: Vec<&Pair> = pairs.iter().collect();
    for pool in [Pool::Responses, Pool::Mean] {
        for (budget, whole, cut) in [(100, 2, false), (20, 2, false), (19, 1, true), (11, 1, false), (9, 0, true)] {
            let cfg = HyperConfig { template: "Q {query} R {response};".into(), context_tokens: budget, context_query_chars: Some(3), pool, ..HyperConfig::default() };
            let (ctx, fitted) = render_context_fitted(&ByteText, &cfg, &refs).unwrap();
            assert_eq!(fitted, Fitted { whole, cut }, "budget {budget}, {pool:?}");
            assert_eq!(ctx.len(), budget.min(20));
        }
    }
}

/// `freeze_common`: stage 1b leaves every head's output bias (the LoRA an
/// untrained network emits for everyone) bit for bit as it started, and
/// still trains the rest; without it the biases move.
#[test]
fn freeze_common_keeps_the_output_biases() {
    let model = model();
    let (net, train) = configs();
    let fresh = HyperNet::init(net.clone(), &model, None, 1).unwrap();
    let biases = |n: &HyperNet| n.heads.output_biases().map(|i| n.heads.params[i].data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
    let others = |n: &HyperNet| {
        let b: Vec<usize> = n.heads.output_biases().collect();
        (0..n.heads.params.len()).filter(|i| !b.contains(i)).map(|i| n.heads.params[i].data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let mut runs = Vec::new();
    for freeze in [true, false] {
        let out = tempfile::tempdir().unwrap();
        let cfg = HyperTrainConfig { freeze_common: freeze, ..train.clone() };
        let run = HyperRun { resume: false, progress: false, stop_after: None, commit_every: 1, hooks: None };
        runs.push(hypertrain(&model, &ByteText, &users(), fresh.clone(), Guides::default(), &cfg, out.path(), run).unwrap().net);
    }
    assert!(biases(&fresh).iter().any(|b| b.iter().any(|&v| v != 0)), "the fixture's biases are PEFT's init, not all zero");
    assert_eq!(biases(&runs[0]), biases(&fresh), "frozen biases moved");
    assert_ne!(others(&runs[0]), others(&fresh), "nothing else trained");
    assert_ne!(biases(&runs[1]), biases(&fresh), "without freeze_common the biases train");
}

/// `freeze_embedder`: stage 1b leaves the embedder LoRA bit for bit as
/// SimCSE (stage 1a) left it and still trains the heads; without it the
/// embedder moves in 1b.
#[test]
fn freeze_embedder_keeps_the_embedder_of_stage_1a() {
    let model = model();
    let (net, train) = configs();
    let fresh = HyperNet::init(net.clone(), &model, None, 1).unwrap();
    let bits = |n: &HyperNet, r: std::ops::Range<usize>| n.params()[r].iter().map(|t| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>();
    let e = fresh.embedder_len();
    let all = e + fresh.heads.params.len();
    let go = |freeze: bool, stop_after: Option<u64>| {
        let out = tempfile::tempdir().unwrap();
        let cfg = HyperTrainConfig { freeze_embedder: freeze, ..train.clone() };
        let run = HyperRun { resume: false, progress: false, stop_after, commit_every: 1, hooks: None };
        hypertrain(&model, &ByteText, &users(), fresh.clone(), Guides::default(), &cfg, out.path(), run).unwrap().net
    };
    let after_1a = go(true, Some(train.simcse_steps));
    assert_ne!(bits(&after_1a, 0..e), bits(&fresh, 0..e), "SimCSE trained the embedder");
    let frozen = go(true, None);
    assert_eq!(bits(&frozen, 0..e), bits(&after_1a, 0..e), "the frozen embedder moved in stage 1b");
    assert_ne!(bits(&frozen, e..all), bits(&after_1a, e..all), "the heads did not train");
    let free = go(false, None);
    assert_ne!(bits(&free, 0..e), bits(&after_1a, 0..e), "without freeze_embedder the embedder trains in 1b");
}

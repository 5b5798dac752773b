//! The methods that train adapters inside `hexlora eval`.
//!
//! `user-lora` trains each user's LoRA through the split runtime, as
//! `personalize` does (every frozen product routed to the in-process DSP
//! service at the default precision policy, Q8_0 for attention and MLP),
//! and `user-lora-f32` the same steps with the frozen products in f32 on
//! the CPU. On the tiny ChatML Llama (fixtures/hyper/eval-model): the split
//! run must really route products to the DSP, and move the common LoRA the
//! way the f32 run does: its update may differ by the Q8_0 weights' error
//! (the planner's tolerance is 3e-2 per product), not by more.
//!
//! `metaicl-lora` trains the common LoRA with each example preceded by its
//! user's ICL prefix: with no profile items in the prefix (k = 0) its
//! examples, and so its adapter, are exactly `common-lora`'s; with k = 2
//! they are not.
use hexlora::base::counter_rng;
use hexlora::eval::dataset::{ProfileItem, Query, Split, User};
use hexlora::eval::harness;
use hexlora::eval::method::Method;
use hexlora::eval::model_methods::{self, Budget, ModelMethodConfig};
use hexlora::eval::model_runtime::{EvalModel, LabelScore};
use hexlora::eval::task::TaskSpec;
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::npu::{Precision, PrecisionPolicy};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// q, v and up read the 32-wide hidden state: whole Q8_0 blocks, so the
/// DSP can hold them.
const TARGETS: [&str; 3] = ["q_proj", "v_proj", "up_proj"];

fn common(m: &EvalModel) -> Adapter {
    let config = LoraConfig { r: 2, alpha: 4.0, target_modules: TARGETS.map(String::from).to_vec(), dropout: 0.0, use_rslora: false, base_model: String::new() };
    let mut ad = Adapter::init(config, &m.graph.projections(), 3).unwrap();
    for (k, module) in ad.modules.iter_mut().enumerate() {
        let s = counter_rng::derive(4, k as u64);
        module.b.data.iter_mut().enumerate().for_each(|(i, v)| *v = 0.5 * counter_rng::normal(s, i as u64));
    }
    ad
}

fn cfg(work: &Path, common_adapter: Option<PathBuf>) -> ModelMethodConfig {
    ModelMethodConfig {
        icl_k: 0,
        max_prompt_chars: 300,
        max_len: 64,
        rank: 2,
        alpha: 4.0,
        targets: TARGETS.map(String::from).to_vec(),
        common: Budget { steps: 4, lr: 1e-2 },
        user: Budget { steps: 6, lr: 2e-2 },
        mezo_lr: 0.0,
        mezo_eps: 0.0,
        seed: 5,
        work_dir: work.join("runs"),
        common_adapter,
        label_score: LabelScore::Mean,
        split_policy: Default::default(),
    }
}

fn user() -> User {
    let item = |id: &str, text: &str, tag: &str| ProfileItem { id: id.into(), fields: BTreeMap::from([("text".to_string(), text.to_string()), ("tag".to_string(), tag.to_string())]) };
    User {
        id: "ann".into(),
        profile: vec![item("a1", "paint the wall", "art"), item("a2", "judge and jury", "law"), item("a3", "a clay bust", "art")],
        queries: vec![Query { id: "q1".into(), input: "a painting of clay".into(), gold: Some("art".into()) }],
    }
}

/// The tiny eval model and a quotes-tag split of [`user`] with two labels.
fn model_and_split() -> (Arc<EvalModel>, Split) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper/eval-model");
    let labels = vec!["art".to_string(), "law".to_string()];
    (Arc::new(EvalModel::open(&dir).unwrap()), Split { spec: TaskSpec::for_task("quotes-tag", Some(labels)).unwrap(), users: vec![user()] })
}

/// Every factor's bits, for exact comparisons.
fn bits(a: &Adapter) -> Vec<u32> {
    a.modules.iter().flat_map(|m| m.a.data.iter().chain(&m.b.data).map(|v| v.to_bits())).collect()
}

/// Every factor of `a` minus `b`, flattened.
fn delta(a: &Adapter, b: &Adapter) -> Vec<f64> {
    a.modules.iter().zip(&b.modules).flat_map(|(x, y)| [(&x.a, &y.a), (&x.b, &y.b)]).flat_map(|(x, y)| x.data.iter().zip(&y.data).map(|(p, q)| (*p - *q) as f64).collect::<Vec<_>>()).collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

#[test]
fn user_lora_through_the_split_runtime_moves_the_adapter_as_the_f32_run_does() {
    let (model, split) = model_and_split();
    let work = tempfile::tempdir().unwrap();
    let (start, common_dir) = saved_common(&model, work.path());
    let train = |name| train_first_user(&model, &split, (&start, &common_dir), work.path(), name, PrecisionPolicy::default());
    let (frozen, on_dsp) = train("user-lora");
    assert!(frozen.contains("routes on the DSP") && !frozen.contains(" 0 of "), "{frozen}");
    let (frozen, f32_run) = train("user-lora-f32");
    assert_eq!(frozen, "CPU f32");
    let gap: Vec<f64> = on_dsp.iter().zip(&f32_run).map(|(a, b)| a - b).collect();
    println!("update norm: f32 {:.3e}, split {:.3e}, their difference {:.3e}", norm(&f32_run), norm(&on_dsp), norm(&gap));
    assert!(norm(&f32_run) > 1e-3, "the user's steps must move the adapter");
    assert!(norm(&gap) < 0.1 * norm(&f32_run), "the split run's update strays from the f32 run's");
}

/// The common LoRA the per-user runs start from, saved as a PEFT
/// directory under `work` for `--common-adapter`.
fn saved_common(model: &EvalModel, work: &Path) -> (Adapter, PathBuf) {
    let dir = work.join("common");
    let start = common(model);
    start.save(&dir).unwrap();
    (start, dir)
}

/// Trains method `name` on the first user from the saved common LoRA at
/// `policy`, under `work/runs`: the result's `frozen_products` and the
/// adapter's update from the common LoRA.
fn train_first_user(model: &Arc<EvalModel>, split: &Split, (start, common_dir): (&Adapter, &Path), work: &Path, name: &str, policy: PrecisionPolicy) -> (String, Vec<f64>) {
    let mut cfg = cfg(work, Some(common_dir.to_path_buf()));
    cfg.split_policy = policy;
    let mut m = model_methods::by_name(name, model.clone(), cfg).unwrap();
    m.prepare_population(split).unwrap();
    m.prepare_user(&split.spec, &split.users[0]).unwrap();
    let frozen = m.config()["frozen_products"].as_str().unwrap().to_string();
    println!("{name}: {frozen}");
    let adapter_dir = work.join("runs").join(name).join("ann").join("adapter");
    (frozen, delta(&Adapter::load(&adapter_dir).unwrap(), start))
}

/// `--precision f16` keeps the frozen weights resident in f16 instead of
/// the default policy's Q8_0: the split run's `frozen_products` names that
/// policy, and its update comes closer to the f32 run's than the default
/// policy's does (f16 holds the model's weights nearly exactly; Q8_0 rounds
/// them to 8 bits a block).
#[test]
fn user_lora_at_f16_precision_strays_less_from_f32_than_at_the_default_policy() {
    let (model, split) = model_and_split();
    let work = tempfile::tempdir().unwrap();
    let (start, common_dir) = saved_common(&model, work.path());
    let train = |name, policy: PrecisionPolicy, tag| {
        let (frozen, update) = train_first_user(&model, &split, (&start, &common_dir), &work.path().join(tag), name, policy);
        if name == "user-lora" {
            assert!(frozen.contains(&format!("precision policy {policy}")), "{frozen}");
        }
        update
    };
    let f32_run = train("user-lora-f32", PrecisionPolicy::default(), "f32");
    let q8 = train("user-lora", PrecisionPolicy::default(), "default");
    let f16 = train("user-lora", PrecisionPolicy::uniform(Precision::Fp16), "f16");
    let gap = |a: &[f64]| norm(&a.iter().zip(&f32_run).map(|(x, y)| x - y).collect::<Vec<_>>());
    println!("gap to the f32 update: default policy {:.3e}, f16 {:.3e} (f32 update {:.3e})", gap(&q8), gap(&f16), norm(&f32_run));
    assert!(gap(&f16) < gap(&q8), "f16-resident weights must stray less from f32 than Q8_0 ones");
    assert!(gap(&f16) < 0.01 * norm(&f32_run), "an f16 split run must follow the f32 run closely");
}

/// The policy is part of `user-lora`'s config, and so of the sweep's
/// fingerprint: `eval --resume` at another `--precision` refuses the
/// progress file instead of mixing the two policies' users.
#[test]
fn user_loras_precision_policy_is_in_its_config_and_fingerprint() {
    let (model, split) = model_and_split();
    let work = tempfile::tempdir().unwrap();
    let mut f16 = cfg(work.path(), None);
    f16.split_policy = PrecisionPolicy::uniform(Precision::Fp16);
    let default = model_methods::by_name("user-lora", model.clone(), cfg(work.path(), None)).unwrap();
    let f16 = model_methods::by_name("user-lora", model.clone(), f16).unwrap();
    assert_eq!(default.config()["split_policy"], "attention=q8_0,mlp=q8_0,recurrent=f16");
    assert_eq!(f16.config()["split_policy"], "attention=f16,mlp=f16,recurrent=f16");
    let print = |m: &dyn Method| harness::fingerprint(m, &split, "test", &[]);
    assert_ne!(print(&default), print(&f16));
    let f32_run = model_methods::by_name("user-lora-f32", model, cfg(work.path(), None)).unwrap();
    assert!(f32_run.config().get("split_policy").is_none(), "the f32 path has no resident policy");
}

/// `hexlora eval --train-split none --common-adapter DIR`: the harness
/// skips `prepare_population` (no train split), and the per-user run must
/// still start from the given adapter, exactly as when the split is there.
#[test]
fn a_given_common_adapter_needs_no_train_split() {
    let (model, split) = model_and_split();
    let mut trained = Vec::new();
    for with_split in [true, false] {
        let work = tempfile::tempdir().unwrap();
        let common_dir = work.path().join("common");
        common(&model).save(&common_dir).unwrap();
        let mut m = model_methods::by_name("user-lora-f32", model.clone(), cfg(work.path(), Some(common_dir))).unwrap();
        if with_split {
            m.prepare_population(&split).unwrap();
        }
        m.prepare_user(&split.spec, &split.users[0]).unwrap();
        trained.push(Adapter::load(&work.path().join("runs/user-lora-f32/ann/adapter")).unwrap());
    }
    assert_eq!(bits(&trained[0]), bits(&trained[1]), "the given adapter must start the user's run as it does with the split");
}

#[test]
fn metaicl_lora_without_icl_items_is_common_lora_and_with_them_is_not() {
    let (model, train) = model_and_split();
    let work = tempfile::tempdir().unwrap();
    let mut trained = Vec::new();
    for (name, k) in [("common-lora", 0), ("metaicl-lora", 0), ("metaicl-lora", 2)] {
        let mut c = cfg(&work.path().join(format!("{name}-{k}")), None);
        // long enough to keep the prefix (sequences are cut from the left)
        c.max_len = 400;
        c.icl_k = k;
        let mut m = model_methods::by_name(name, model.clone(), c.clone()).unwrap();
        m.prepare_population(&train).unwrap();
        trained.push(Adapter::load(&c.work_dir.join(name).join("adapter")).unwrap());
    }
    assert_eq!(bits(&trained[0]), bits(&trained[1]), "metaicl-lora with k = 0 must train exactly common-lora");
    let moved = norm(&delta(&trained[2], &trained[0]));
    println!("metaicl-lora k = 2 against common-lora: factor difference norm {moved:.3e}");
    assert!(moved > 1e-4, "the ICL prefix must change what metaicl-lora trains on");
}

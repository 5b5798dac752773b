//! The `hypernet` evaluation method on a tiny random Llama with a ChatML
//! tokenizer (fixtures/hyper/eval-model, from make_eval_model.py). An
//! untrained hypernetwork has zero second-layer head weights and the common
//! LoRA as head biases, so whatever the user's profile, it must synthesize
//! the common LoRA bit for bit, and the whole evaluation (greedy and
//! sampled, classification and generation) must equal `common-lora`'s with
//! that adapter. The common LoRA has non-zero B, and the test checks it
//! moves the scores away from the base model's, so equality is not the
//! trivial "no adapter applied either way".
use hexlora::base::counter_rng;
use hexlora::eval::dataset::{ProfileItem, Query, Split, User};
use hexlora::eval::harness::run_sweep;
use hexlora::eval::method::{Decoding, Method};
use hexlora::eval::model_methods::{self, Budget, ModelMethodConfig};
use hexlora::eval::model_runtime::EvalModel;
use hexlora::eval::task::TaskSpec;
use hexlora::hyper::eval_method::HypernetMethod;
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet};
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::model::chat::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper/eval-model")
}

const TARGETS: [&str; 3] = ["q_proj", "v_proj", "down_proj"];

/// A common LoRA whose B is non-zero, so it changes the model's outputs.
fn common(m: &EvalModel) -> Adapter {
    let config = LoraConfig { r: 2, alpha: 4.0, target_modules: TARGETS.map(String::from).to_vec(), dropout: 0.0, use_rslora: false, base_model: String::new() };
    let mut ad = Adapter::init(config, &m.graph.projections(), 3).unwrap();
    for (k, module) in ad.modules.iter_mut().enumerate() {
        let s = counter_rng::derive(4, k as u64);
        module.b.data.iter_mut().enumerate().for_each(|(i, v)| *v = 0.5 * counter_rng::normal(s, i as u64));
    }
    ad
}

fn hyper_config() -> HyperConfig {
    HyperConfig {
        embed_rank: 2,
        embed_alpha: 4.0,
        out_rank: 2,
        out_alpha: 4.0,
        out_targets: TARGETS.map(String::from).to_vec(),
        bottleneck: 3,
        variant: HeadVariant::Parallel,
        context_tokens: 60,
        ..HyperConfig::default()
    }
}

fn item(id: &str, text: &str, answer: &str, out: &str) -> ProfileItem {
    ProfileItem { id: id.into(), fields: BTreeMap::from([("text".to_string(), text.to_string()), (out.to_string(), answer.to_string())]) }
}

fn query(id: &str, input: &str, gold: &str) -> Query {
    Query { id: id.into(), input: input.into(), gold: Some(gold.into()) }
}

/// Two users with different profiles (so their contexts, and embeddings, differ).
fn split(task: &str, labels: Option<Vec<String>>, out: &str) -> Split {
    let users = vec![
        User {
            id: "ann".into(),
            profile: vec![item("a1", "paint the wall", "art", out), item("a2", "judge and jury", "law", out)],
            queries: vec![query("qa1", "a painting of clay", "art"), query("qa2", "judge ruled", "law")],
        },
        User {
            id: "bob".into(),
            profile: vec![item("b1", "my heart is yours", "love", out)],
            queries: vec![query("qb1", "sweet heart", "love")],
        },
    ];
    Split { spec: TaskSpec::for_task(task, labels).unwrap(), users }
}

fn common_lora(model: Arc<EvalModel>, adapter_dir: &Path, work: &Path) -> Box<dyn Method> {
    let cfg = ModelMethodConfig {
        icl_k: 0,
        max_prompt_chars: 300,
        max_len: 64,
        rank: 2,
        alpha: 4.0,
        targets: TARGETS.map(String::from).to_vec(),
        common: Budget { steps: 0, lr: 0.0 },
        user: Budget { steps: 0, lr: 0.0 },
        mezo_lr: 0.0,
        mezo_eps: 0.0,
        seed: 0,
        work_dir: work.to_path_buf(),
        common_adapter: Some(adapter_dir.to_path_buf()),
        label_score: hexlora::eval::model_runtime::LabelScore::Mean, // as HypernetMethod scores by default
        split_policy: Default::default(),
    };
    Box::new(model_methods::by_name("common-lora", model, cfg).unwrap())
}

#[test]
fn untrained_hypernetwork_evaluates_exactly_like_the_common_lora() {
    let tmp = tempfile::tempdir().unwrap();
    let model = Arc::new(EvalModel::open(&model_dir()).unwrap());
    let common = common(&model);
    let adapter_dir = tmp.path().join("common");
    common.save(&adapter_dir).unwrap();
    let net_dir = tmp.path().join("hypernet");
    HyperNet::init(hyper_config(), &*model.graph, Some(&common), 9).unwrap().save(&net_dir).unwrap();

    let mut hyper = HypernetMethod::open(model.clone(), &model_dir(), &net_dir, 300).unwrap();
    let mut baseline = common_lora(model.clone(), &adapter_dir, tmp.path());
    let labels = ["art", "law", "love"].map(String::from).to_vec();
    let decodings = Decoding::sweep(&[0.0, 0.7], 6, 1);
    for split in [split("quotes-tag", Some(labels.clone()), "category"), split("mail-subject", None, "title")] {
        // The synthesized adapter itself: the common LoRA, bit for bit, for every user.
        let net = HyperNet::load(&net_dir, &*model.graph).unwrap();
        for user in &split.users {
            let ctx = hyper.context(&split.spec, user).unwrap();
            assert!(!ctx.is_empty());
            let got = net.synthesize(&*model.graph, &ctx).unwrap();
            assert_eq!(got.modules.len(), common.modules.len());
            for (g, c) in got.modules.iter().zip(&common.modules) {
                assert_eq!((&g.name, &g.a.data, &g.b.data), (&c.name, &c.a.data, &c.b.data));
            }
        }
        // The train split only makes common-lora load its adapter.
        let h = run_sweep(&mut hyper, Some(&split), &split, "test", &decodings).unwrap();
        let c = run_sweep(baseline.as_mut(), Some(&split), &split, "test", &decodings).unwrap();
        assert_eq!(h.len(), 2);
        for (h, c) in h.iter().zip(&c) {
            assert_eq!(h.method, "hypernet");
            for (hu, cu) in h.users.iter().zip(&c.users) {
                assert_eq!(hu.queries, cu.queries, "{} T={}", split.spec.name, h.decoding.temperature);
                assert!(hu.prep.tokens > 0, "synthesis consumed the context");
            }
        }
    }

    // The identity is not vacuous: the common LoRA moves the label scores.
    let prompt = model.prompt_ids(&[Message::new("user", "sweet heart")]).unwrap();
    model.set_adapter(None).unwrap();
    let base = model.answer_logprobs(&prompt, &labels).unwrap();
    model.set_adapter(Some(&common)).unwrap();
    let tuned = model.answer_logprobs(&prompt, &labels).unwrap();
    assert!(base.iter().zip(&tuned).any(|(b, t)| (b - t).abs() > 1e-3), "{base:?} vs {tuned:?}");
}

#[test]
fn a_missing_or_mismatched_hypernetwork_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let model = Arc::new(EvalModel::open(&model_dir()).unwrap());
    let missing = HypernetMethod::open(model.clone(), &model_dir(), &tmp.path().join("nope"), 300).err().expect("no directory");
    assert!(missing.to_string().contains("hypernet.json"), "{missing}");
    let dir = tmp.path().join("bad");
    HyperNet::init(hyper_config(), &*model.graph, None, 1).unwrap().save(&dir).unwrap();
    std::fs::write(dir.join("hypernet.safetensors"), b"not a tensor file").unwrap();
    let corrupt = HypernetMethod::open(model, &model_dir(), &dir, 300).err().expect("corrupt weights");
    assert!(corrupt.to_string().contains("hypernet.safetensors"), "{corrupt}");
}

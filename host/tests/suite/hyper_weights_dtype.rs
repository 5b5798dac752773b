//! A hypernetwork stored in f16 (`hypertrain --weights-dtype f16`) is half
//! the size and synthesizes the f32 network's LoRA within a stated bound:
//! every synthesized entry within 2e-3 of the f32 one relative to the
//! largest entry of its matrix (f16 rounds each weight by at most 2^-11
//! relative; the heads sum k = 8 such products plus a bias).
use hexlora::base::counter_rng;
use hexlora::eval::model_runtime::EvalModel;
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet, WeightsDtype};
use hexlora::hyper::users::Context;
use hexlora::lora::{Adapter, LoraConfig};
use std::path::Path;

fn trained_like(model: &EvalModel, variant: HeadVariant) -> HyperNet {
    let targets = ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec();
    let lora = LoraConfig { r: 2, alpha: 4.0, target_modules: targets.clone(), dropout: 0.0, use_rslora: false, base_model: String::new() };
    let mut common = Adapter::init(lora, &*model.graph.projections(), 3).unwrap();
    for (k, m) in common.modules.iter_mut().enumerate() {
        m.b.data.iter_mut().enumerate().for_each(|(i, v)| *v = 0.01 * counter_rng::normal(counter_rng::derive(9, k as u64), i as u64));
    }
    let config = HyperConfig { embed_rank: 2, embed_alpha: 4.0, out_rank: 2, out_alpha: 4.0, out_targets: targets, bottleneck: 8, variant, context_tokens: 60, ..HyperConfig::default() };
    let mut net = HyperNet::init(config, &*model.graph, Some(&common), 1).unwrap();
    // Trained weights are not the init (second layers are zero there): give
    // every parameter a random part of the size training produces.
    let params = net
        .params()
        .into_iter()
        .enumerate()
        .map(|(j, mut t)| {
            t.data.iter_mut().enumerate().for_each(|(i, v)| *v += 0.02 * counter_rng::normal(counter_rng::derive(11, j as u64), i as u64));
            t
        })
        .collect();
    net.set_params(params).unwrap();
    net
}

fn size(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("hypernet.safetensors")).unwrap().len()
}

#[test]
fn f16_storage_halves_the_file_and_keeps_synthesis_within_the_bound() {
    let model = EvalModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper/eval-model")).unwrap();
    for variant in [HeadVariant::Parallel, HeadVariant::SharedTrunk] {
        let net = trained_like(&model, variant);
        let dir = tempfile::tempdir().unwrap();
        let (full, half) = (dir.path().join("f32"), dir.path().join("f16"));
        net.save(&full).unwrap();
        net.save_as(&half, WeightsDtype::F16).unwrap();
        // Two bytes fewer per weight; the JSON headers differ only in offset digits.
        let n: u64 = net.params().iter().map(|t| t.data.len() as u64).sum();
        let saved = size(&full) - size(&half);
        assert!(saved.abs_diff(2 * n) <= 512, "{variant:?}: {saved} bytes saved for {n} weights");
        let (a, b) = (HyperNet::load(&full, &*model.graph).unwrap(), HyperNet::load(&half, &*model.graph).unwrap());
        // Every stored weight is the f32 one rounded to f16.
        for (x, y) in a.params().iter().zip(b.params()) {
            for (&u, &v) in x.data.iter().zip(&y.data) {
                assert!((u - v).abs() <= u.abs() * 2f32.powi(-11) + 3e-8, "{u} stored as {v}");
            }
        }
        for seed in 0..3u64 {
            let ctx = Context::all((0..40).map(|i| (counter_rng::bits(seed, i) % 100) as u32).collect());
            let (la, lb) = (a.synthesize(&*model.graph, &ctx).unwrap(), b.synthesize(&*model.graph, &ctx).unwrap());
            for (ma, mb) in la.modules.iter().zip(&lb.modules) {
                for (x, y) in [(&ma.a, &mb.a), (&ma.b, &mb.b)] {
                    let scale = x.data.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let worst = x.data.iter().zip(&y.data).fold(0f32, |m, (u, v)| m.max((u - v).abs()));
                    assert!(worst <= 2e-3 * scale, "{variant:?} {}: {worst} vs scale {scale}", ma.name);
                }
            }
        }
    }
}

/// `hexlora hyper-average` of two networks of one configuration: every
/// weight of the result, loaded as a network, is the f64 mean of the two;
/// `--out` naming one of the checkpoints is refused and leaves it intact;
/// an unreadable checkpoint is named and leaves no `--out`.
#[test]
fn hyper_average_writes_the_weight_wise_mean_as_a_loadable_network() {
    let model = EvalModel::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hyper/eval-model")).unwrap();
    let a = trained_like(&model, HeadVariant::Parallel);
    let mut b = a.clone();
    let shifted = b.params().into_iter().enumerate().map(|(j, mut t)| {
        t.data.iter_mut().enumerate().for_each(|(i, v)| *v += 0.05 * counter_rng::normal(counter_rng::derive(13, j as u64), i as u64));
        t
    });
    b.set_params(shifted.collect()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (da, db, out) = (dir.path().join("step100"), dir.path().join("step150"), dir.path().join("mean"));
    a.save(&da).unwrap();
    b.save(&db).unwrap();
    let run = crate::support::hexlora().arg("hyper-average").arg(&da).arg(&db).arg("--out").arg(&out).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let mean = HyperNet::load(&out, &*model.graph).unwrap();
    assert_eq!(mean.config, a.config);
    for ((x, y), m) in a.params().iter().zip(b.params()).zip(mean.params()) {
        for ((&u, &v), &w) in x.data.iter().zip(&y.data).zip(&m.data) {
            assert_eq!(w, ((u as f64 + v as f64) / 2.0) as f32);
        }
    }
    let before = std::fs::read(db.join("hypernet.safetensors")).unwrap();
    let run = crate::support::hexlora().arg("hyper-average").arg(&da).arg(&db).arg("--out").arg(&db).arg("--force").output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("--out") && err.contains("checkpoint"), "{err}");
    assert_eq!(std::fs::read(db.join("hypernet.safetensors")).unwrap(), before);
    // A checkpoint that cannot be read is named, and no --out is left behind.
    let (missing, refused) = (dir.path().join("step999"), dir.path().join("refused"));
    let run = crate::support::hexlora().arg("hyper-average").arg(&da).arg(&missing).arg("--out").arg(&refused).output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("step999"), "{err}");
    assert!(!refused.exists(), "a refused average left {}", refused.display());
}

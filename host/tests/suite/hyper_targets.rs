//! Training the hypernetwork toward each user's own LoRA (`--lora-targets`).
//!
//! The targets are the fixture's common LoRA plus a different random
//! direction per user, all of one length, so the test knows without the
//! code what the loss is at the start: the mean squared distance `D` is that
//! length squared and every user's reconstruction term is exactly 1 while
//! the heads emit the common LoRA. Reconstruction alone must then pull each
//! user's synthesized LoRA toward its own target and no pass through the LLM
//! may run (no cross-entropy). The CLI refuses a missing target, naming the
//! user and where it looked.
use hexlora::autograd::graph::TrainableModel;
use hexlora::eval::dataset::user_dir_name;
use hexlora::hyper::targets::load_targets;
use hexlora::hyper::trainer::{hypertrain, Guides, HyperRun, HyperTrainConfig};
use hexlora::hyper::users::{render_context, Pair, UserRecord};
use hexlora::hyper::HyperNet;
use hexlora::lora::Adapter;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::Decay;
use std::path::Path;

use crate::support::{self, hyper_net_config, training_fixture, ByteText};

const LENGTH: f64 = 0.5;

fn users() -> Vec<UserRecord> {
    ["short", "LOUD!", "polite please", "terse."]
        .iter()
        .enumerate()
        .map(|(u, style)| UserRecord {
            user: format!("user {u}/x"),
            examples: (0..4).map(|i| Pair { query: format!("q{i} about {}", i * 7 + u), response: format!("{style} {i}") }).collect(),
        })
        .collect()
}

/// `common` moved by a pseudo-random direction of length [`LENGTH`] (seeded by `u`).
fn target(common: &Adapter, u: u64) -> Adapter {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (u + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let mut out = common.clone();
    let dirs: Vec<Vec<f64>> = out.modules.iter().flat_map(|m| [m.a.data.len(), m.b.data.len()]).map(|n| (0..n).map(|_| next()).collect()).collect();
    let norm = dirs.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
    let mut d = dirs.iter();
    for m in &mut out.modules {
        for t in [&mut m.a, &mut m.b] {
            t.data.iter_mut().zip(d.next().unwrap()).for_each(|(v, dv)| *v = (*v as f64 + LENGTH * dv / norm) as f32);
        }
    }
    out
}

/// Over modules matched by name (the heads emit them in the model's order,
/// a PEFT file holds them in key order).
fn squared_distance(a: &Adapter, b: &Adapter) -> f64 {
    assert_eq!(a.modules.len(), b.modules.len());
    a.modules.iter().map(|x| (x, b.module(&x.name).unwrap_or_else(|| panic!("no {}", x.name)))).flat_map(|(x, y)| x.a.data.iter().zip(&y.a.data).chain(x.b.data.iter().zip(&y.b.data))).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum()
}

fn write_targets(dir: &Path, common: &Adapter, users: &[UserRecord]) -> Vec<Adapter> {
    users
        .iter()
        .enumerate()
        .map(|(u, r)| {
            let t = target(common, u as u64);
            t.save(&dir.join(user_dir_name(&r.user)).join("adapter")).unwrap();
            t
        })
        .collect()
}

fn net(model: &dyn TrainableModel, common: &Adapter) -> HyperNet {
    HyperNet::init(hyper_net_config(common), model, Some(common), 1).unwrap()
}

fn recon_only(steps: u64) -> HyperTrainConfig {
    HyperTrainConfig {
        simcse_steps: 0,
        e2e_steps: steps,
        users_per_step: 4,
        target_examples: 1,
        max_len: 40,
        kl_weight: 0.5,
        simcse_lr: 1e-3,
        lr: 3e-3,
        warmup: 0,
        decay: Decay::Constant,
        adamw: AdamWConfig { weight_decay: 0.0, ..Default::default() },
        max_grad_norm: None,
        seed: 3,
        recompute: false,
        freeze_common: false,
        freeze_embedder: true,
        recon_weight: 1.0,
        end_to_end: false,
    }
}

#[test]
fn reconstruction_alone_pulls_each_users_lora_toward_its_own() {
    let dir = training_fixture("llama");
    let model = hexlora::train::open_trainable(&dir.join("model")).unwrap();
    let model = model.as_ref();
    let common = Adapter::load(&dir.join("adapter")).unwrap();
    let users = users();
    let tmp = tempfile::tempdir().unwrap();
    let written = write_targets(tmp.path(), &common, &users);
    let fresh = net(model, &common);

    let targets = load_targets(tmp.path(), &users, &fresh.heads, &fresh.config.out_lora(), &common).unwrap();
    let d = written.iter().map(|t| squared_distance(t, &common)).sum::<f64>() / users.len() as f64;
    assert!((d - LENGTH * LENGTH).abs() < 1e-6, "the targets are {d} from the common LoRA, not {}", LENGTH * LENGTH);
    assert!((targets.inv_norm * d - 1.0).abs() < 1e-9, "1/D = {} for D = {d}", targets.inv_norm);

    let out = tempfile::tempdir().unwrap();
    let run = HyperRun { resume: false, progress: false, stop_after: None, commit_every: 10, hooks: None };
    let guides = Guides { teacher: Some(&common), targets: Some(&targets) };
    let state = hypertrain(model, &ByteText, &users, fresh, guides, &recon_only(40), out.path(), run).unwrap();
    let h = &state.history;
    // Step 1 sees the common LoRA for every user: each term exactly 1 (f32 sums).
    assert!((h[0].recon - 1.0).abs() < 1e-4, "first reconstruction term {}", h[0].recon);
    assert!(h.iter().all(|r| r.ce == 0.0 && r.kl == 0.0), "reconstruction alone ran the LLM: {h:?}");
    assert!(h.iter().all(|r| (r.loss - r.recon).abs() < 1e-12), "loss is not the reconstruction term");
    let last = h.last().unwrap().recon;
    assert!(last < 0.5, "40 steps left the reconstruction term at {last} (from {})", h[0].recon);

    // Each user's synthesized LoRA (from all their examples) is nearer its own target than the common LoRA is.
    for (u, t) in users.iter().zip(&written) {
        let pairs: Vec<&Pair> = u.examples.iter().collect();
        let ctx = render_context(&ByteText, &state.net.config, &pairs).unwrap();
        let got = state.net.synthesize(model, &ctx).unwrap();
        let (now, before) = (squared_distance(&got, t), squared_distance(&common, t));
        assert!(now < 0.5 * before, "{}: {now} from its target, the common LoRA {before}", u.user);
    }
}

#[test]
fn a_user_without_a_target_is_refused_naming_the_user_and_the_place() {
    let dir = training_fixture("llama");
    let model = hexlora::train::open_trainable(&dir.join("model")).unwrap();
    let common = Adapter::load(&dir.join("adapter")).unwrap();
    let users = users();
    let tmp = tempfile::tempdir().unwrap();
    write_targets(tmp.path(), &common, &users[..2]);
    let fresh = net(model.as_ref(), &common);
    let err = load_targets(tmp.path(), &users, &fresh.heads, &fresh.config.out_lora(), &common).unwrap_err().to_string();
    assert!(err.contains("--lora-targets") && err.contains("user 2/x") && err.contains("user_2_x"), "{err}");

    // A target of another rank is refused, naming its file.
    let other = tmp.path().join("other");
    let mut wrong = common.clone();
    wrong.config.alpha *= 2.0;
    for u in &users {
        wrong.save(&other.join(user_dir_name(&u.user)).join("adapter")).unwrap();
    }
    let err = load_targets(&other, &users, &fresh.heads, &fresh.config.out_lora(), &common).unwrap_err().to_string();
    assert!(err.contains("user_0_x") && err.contains("alpha"), "{err}");
}

/// Through the binary: `--lora-targets` needs `--common-lora`, and a
/// missing user's adapter stops the run before any step.
#[test]
fn hypertrain_cli_refuses_missing_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let model = support::root().join("tests/fixtures/hyper/eval-model");
    let data = tmp.path().join("users.jsonl");
    let lines: Vec<String> = users().iter().map(|u| serde_json::json!({"user": u.user, "examples": u.examples.iter().map(|p| serde_json::json!({"query": p.query, "response": p.response})).collect::<Vec<_>>()}).to_string()).collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let run = |extra: &[&str]| {
        let o = support::hexlora().arg("hypertrain").arg("--model").arg(&model).arg("--data").arg(&data).args(["--simcse-steps", "0", "--steps", "1", "--quiet", "--context-tokens", "40", "--max-len", "40"]).arg("--out").arg(tmp.path().join("run")).args(extra).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let targets = tmp.path().join("targets");
    std::fs::create_dir_all(&targets).unwrap();
    let (ok, err) = run(&["--lora-targets", targets.to_str().unwrap()]);
    assert!(!ok && err.contains("--common-lora"), "{err}");
    let common = support::root().join("tests/fixtures/hyper/common");
    let (ok, err) = run(&["--common-lora", common.to_str().unwrap(), "--lora-targets", targets.to_str().unwrap(), "--recon-only"]);
    assert!(!ok && err.contains("--lora-targets") && err.contains("user 0/x"), "{err}");
    assert!(!tmp.path().join("run/commit.safetensors").exists(), "a refused run committed");
}

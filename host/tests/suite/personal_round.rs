//! The personal loop as a library (`hexlora::personal`) on the tiny Llama
//! fixture: a round trains the live adapter on the new examples and the
//! gate lets it go live; a round stopped at a step boundary and continued
//! ends bit-identical to one run straight through; the gate keeps aside a
//! candidate trained on another user's examples; the held-out examples are
//! trained on in the next round.
use crate::support;
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::personal::round::{self, Outcome, RoundConfig};
use hexlora::personal::{Limits, User};
use hexlora::train::commit::TrainState;
use hexlora::train::data::{Bounds, Encoder, Message};
use hexlora::autograd::graph::TrainableModel;
use hexlora::train::learner::StepHooks;
use hexlora::train::trainer::TrainConfig;
use serde_json::json;
use std::path::Path;

const LIMITS: Limits = Limits { max_examples: 100, keep: 10 };
const BOUNDS: Bounds = Bounds { vocab_size: 128, positions: 256 };

fn model() -> Box<dyn TrainableModel> {
    hexlora::train::open_trainable(&support::root().join("tests/fixtures/training/llama/model")).unwrap()
}

/// Token-id examples need no tokenizer; this one is never asked.
struct NoText;
impl Encoder for NoText {
    fn encode(&self, _: &str) -> hexlora::Result<Vec<u32>> {
        unreachable!("token examples")
    }
    fn render_chat(&self, _: &[Message], _: bool) -> hexlora::Result<String> {
        unreachable!("token examples")
    }
    fn end_of_turn(&self) -> String {
        unreachable!("token examples")
    }
}

fn config() -> RoundConfig {
    let lora = LoraConfig { r: 4, alpha: 8.0, target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()], dropout: 0.0, use_rslora: false, base_model: "fixture".into() };
    let train = TrainConfig {
        lora,
        adamw: AdamWConfig::default(),
        schedule: Schedule { lr: 2e-2, warmup: 0, total: 1, decay: Decay::Cosine },
        grad_accum: 1,
        max_grad_norm: Some(1.0),
        seed: 3,
        activation_cap: None,
        head_chunk: 64,
    };
    RoundConfig { train, epochs: 2, max_len: 64, min_new: 4 }
}

/// A user whose answer after prompt `k` is always `answer` (labels on the answer only).
fn example(k: u64, answer: &[u32]) -> serde_json::Value {
    let prompt = [3 + k as u32 % 50, 60, 61, 62];
    let ids: Vec<u32> = prompt.iter().chain(answer).copied().collect();
    let labels: Vec<i64> = prompt.iter().map(|_| -100).chain(answer.iter().map(|&t| t as i64)).collect();
    json!({"input_ids": ids, "labels": labels})
}

const MINE: [u32; 4] = [70, 71, 72, 73];
const THEIRS: [u32; 4] = [90, 12, 101, 44];

fn user(dir: &Path, m: &dyn TrainableModel) -> User {
    let start = Adapter::init(config().train.lora, &m.projections(), 7).unwrap();
    User::create(dir, &start, "fresh", LIMITS).unwrap()
}

/// Stops the round before step `at`.
struct StopAt(u64);
impl StepHooks<TrainState> for StopAt {
    fn before_step(&mut self, next: u64) -> bool {
        next < self.0
    }
}

fn done(o: Outcome) -> hexlora::personal::versions::Version {
    match o {
        Outcome::Done(v) => v,
        other => panic!("expected a finished round, got {other:?}"),
    }
}

#[test]
fn a_round_goes_live_resumes_bit_identically_and_the_gate_refuses_another_users_examples() {
    let m = model();
    let cfg = config();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ua, ub) = (user(a.path(), &*m), user(b.path(), &*m));
    for k in 0..10 {
        ua.append(example(k, &MINE)).unwrap();
        ub.append(example(k, &MINE)).unwrap();
    }
    assert_eq!(round::run(&ua, &*m, &NoText, BOUNDS, &RoundConfig { min_new: 11, ..cfg.clone() }, None).unwrap(), Outcome::Nothing { unseen: 10 });

    // Straight through, and stopped before step 5 then continued.
    let va = done(round::run(&ua, &*m, &NoText, BOUNDS, &cfg, None).unwrap());
    let paused = round::run(&ub, &*m, &NoText, BOUNDS, &cfg, Some(&mut StopAt(5))).unwrap();
    assert_eq!(paused, Outcome::Paused { step: 4, total: 16 });
    assert_eq!(ub.versions.live().unwrap(), Some(1), "the live version answers while a round is paused");
    let vb = done(round::run(&ub, &*m, &NoText, BOUNDS, &cfg, None).unwrap());
    assert_eq!((va.version, va.accepted), (2, true), "{va:?}");
    assert_eq!(ua.versions.live().unwrap(), Some(2));
    let (ha, hb) = (va.heldout.clone().unwrap(), vb.heldout.clone().unwrap());
    assert_eq!((ha.ids.clone(), ha.candidate_loss.to_bits(), ha.live_loss.to_bits()), (hb.ids, hb.candidate_loss.to_bits(), hb.live_loss.to_bits()));
    assert!(ha.candidate_loss < ha.live_loss, "{ha:?}");
    let adapter = |u: &User| Adapter::load(&u.versions.live_adapter().unwrap()).unwrap();
    assert_eq!(adapter(&ua), adapter(&ub), "a resumed round ends where an uninterrupted one does");
    assert_eq!(ha.ids, [9, 10], "the newest fifth is held out");
    assert_eq!(va.trained.as_ref().unwrap().through_id, 8);
    assert!(!a.path().join(round::ROUND_DIR).exists());

    // Another user's answers, then three of mine (the held-out): kept aside.
    for k in 0..10 {
        ua.append(example(k, &THEIRS)).unwrap();
    }
    for k in 0..3 {
        ua.append(example(k, &MINE)).unwrap();
    }
    let refused = done(round::run(&ua, &*m, &NoText, BOUNDS, &cfg, None).unwrap());
    assert!(!refused.accepted, "{refused:?}");
    assert_eq!(refused.trained.as_ref().unwrap().from_id, 9, "last round's held-out examples are trained on now");
    assert_eq!(ua.versions.live().unwrap(), Some(2), "a refused candidate changes nothing");
    assert_eq!(ua.unseen().unwrap().len(), 3);
}

//! One learning round for one user: the examples no round has consumed
//! (the newest fifth held out), AdamW from the live adapter with a commit
//! after every step, the [`gate`](super::gate), a new version, live if it
//! passed. A round is resumable: `round/round.json` fixes its examples,
//! parent and version number when it starts, so a round stopped (a
//! request to answer, SIGTERM) or killed continues with the same inputs;
//! every write after training is idempotent, so a kill between writing the
//! version and making it live is finished by the next call.
use super::gate;
use super::store::Stored;
use super::versions::{unix_now, Heldout, Trained, Version};
use super::User;
use crate::lora::Adapter;
use crate::base::atomic_write::write_atomic;
use crate::train::commit::has_commit;
use crate::train::data::{parse_jsonl, Bounds, Encoder};
use crate::autograd::graph::{Batch, TrainableModel};
use crate::train::learner::StepHooks;
use crate::train::trainer::{commit_start, epoch_steps, train, RunOptions, TrainConfig};
use crate::train::commit::TrainState;
use crate::{Error, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The round's folder in a user's directory.
pub const ROUND_DIR: &str = "round";

/// How rounds train.
#[derive(Clone, Debug)]
pub struct RoundConfig {
    /// Optimizer, schedule and seed; its `lora` is replaced by the live
    /// adapter's and its `schedule.total` by `epochs` of the examples.
    pub train: TrainConfig,
    /// Passes over the round's examples.
    pub epochs: u64,
    /// Examples are cut to this many tokens.
    pub max_len: usize,
    /// A round starts only with at least this many new examples (>= 2:
    /// one to train on, one to hold out).
    pub min_new: usize,
}

/// What a round did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Too few new examples.
    Nothing {
        /// New examples waiting.
        unseen: usize,
    },
    /// Stopped between steps (resumes at the next call).
    Paused {
        /// Steps done of the round.
        step: u64,
        /// Steps in the round.
        total: u64,
    },
    /// A new version, live if it passed the gate.
    Done(Version),
}

/// The round's fixed inputs, written when it starts.
struct Plan {
    parent: u64,
    version: u64,
    train: Vec<Stored>,
    heldout: Vec<Stored>,
}

/// Runs (or continues) a round for `user`: trains, judges, writes the
/// version. `hooks` see every step boundary (a server pauses the round
/// there while it answers; returning false stops it, resumable).
pub fn run(user: &User, model: &dyn TrainableModel, enc: &dyn Encoder, bounds: Bounds, config: &RoundConfig, hooks: Option<&mut dyn StepHooks<TrainState>>) -> Result<Outcome> {
    let dir = user.dir.join(ROUND_DIR);
    let live = user.versions.live()?.ok_or_else(|| Error::invalid(user.dir.display().to_string(), "no live version"))?;
    let (plan, fresh) = match read_plan(&dir)? {
        // A rollback since the round started: its parent is no longer
        // what it would replace, so it starts over from the live version.
        Some(p) if p.parent == live || user.versions.list()?.iter().any(|v| v.version == p.version) => (p, false),
        _ => match new_plan(user, live, config.min_new)? {
            Ok(p) => (p, true),
            Err(unseen) => return Ok(Outcome::Nothing { unseen }),
        },
    };
    if let Some(v) = user.versions.list()?.into_iter().find(|v| v.version == plan.version) {
        // Written before a kill: finish what the kill interrupted.
        return finish(user, &dir, v);
    }
    let parent = Adapter::load(&user.versions.adapter_dir(plan.parent))?;
    let train_set = batches(&plan.train, enc, bounds, config.max_len)?;
    let cfg = round_config(config, &parent, train_set.len());
    if fresh {
        start(&dir, &plan, &parent, &train_set, &cfg, model)?;
    }
    let run = RunOptions { resume: true, hooks, ..RunOptions::quiet() };
    let state = train(model, &train_set, &cfg, &dir, run)?;
    if state.step() < cfg.schedule.total {
        return Ok(Outcome::Paused { step: state.step(), total: cfg.schedule.total });
    }
    // The live adapter now, which a rollback may have changed.
    let live_now = user.versions.live()?.unwrap_or(plan.parent);
    let live_adapter = Adapter::load(&user.versions.adapter_dir(live_now))?;
    let heldout = batches(&plan.heldout, enc, bounds, config.max_len)?;
    let verdict = gate::judge(model, &live_adapter, &state.adapter, &heldout)?;
    let last_loss = state.history.last().map_or(f32::NAN, |r| r.loss);
    let meta = Version {
        version: plan.version,
        parent: Some(plan.parent),
        created: unix_now(),
        origin: "learned".into(),
        trained: Some(Trained {
            from_id: plan.train.first().map_or(0, |s| s.id),
            through_id: plan.train.last().map_or(0, |s| s.id),
            examples: plan.train.len(),
            steps: state.step(),
            last_loss,
        }),
        heldout: Some(Heldout { ids: plan.heldout.iter().map(|s| s.id).collect(), live_loss: verdict.live_loss, candidate_loss: verdict.candidate_loss }),
        accepted: verdict.accepted,
        reason: verdict.reason,
    };
    user.changing(|versions| versions.add(&meta, &state.adapter))?;
    super::kill_point("version-written");
    finish(user, &dir, meta)
}

/// Makes an accepted version live and removes the round.
fn finish(user: &User, dir: &Path, v: Version) -> Result<Outcome> {
    user.changing(|versions| if v.accepted && versions.live()? != Some(v.version) { versions.set_live(v.version) } else { Ok(()) })?;
    super::kill_point("live-set");
    std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    Ok(Outcome::Done(v))
}

/// The unseen examples split into training and held-out, or how many
/// are waiting when too few.
fn new_plan(user: &User, live: u64, min_new: usize) -> Result<std::result::Result<Plan, usize>> {
    let unseen = user.unseen()?;
    if unseen.len() < min_new.max(2) {
        return Ok(Err(unseen.len()));
    }
    let k = gate::heldout_count(unseen.len());
    let (train, heldout) = unseen.split_at(unseen.len() - k);
    Ok(Ok(Plan { parent: live, version: user.versions.next_number()?, train: train.to_vec(), heldout: heldout.to_vec() }))
}

/// Writes the plan, then the round's first commit (the parent adapter,
/// fresh optimizer moments).
fn start(dir: &Path, plan: &Plan, parent: &Adapter, train_set: &[Batch], cfg: &TrainConfig, model: &dyn TrainableModel) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    parent.check(&model.projections())?;
    let items = |v: &[Stored]| v.iter().map(|s| json!({"id": s.id, "example": s.example})).collect::<Vec<_>>();
    let text = json!({"parent": plan.parent, "version": plan.version, "train": items(&plan.train), "heldout": items(&plan.heldout)});
    commit_start(parent, cfg, train_set, dir)?;
    super::kill_point("round-started");
    // Last: a round.json means a complete start.
    write_atomic(&plan_path(dir), text.to_string().as_bytes())
}

fn plan_path(dir: &Path) -> PathBuf {
    dir.join("round.json")
}

fn read_plan(dir: &Path) -> Result<Option<Plan>> {
    let path = plan_path(dir);
    if !path.is_file() || !has_commit(dir) {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let bad = |msg: &str| Error::format(path.display().to_string(), msg.to_string());
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let items = |key: &str| -> Result<Vec<Stored>> {
        let list = v.get(key).and_then(Value::as_array).ok_or_else(|| bad(&format!("no {key:?} list")))?;
        list.iter()
            .map(|s| Ok(Stored { id: s.get("id").and_then(Value::as_u64).ok_or_else(|| bad("an item without id"))?, example: s.get("example").cloned().ok_or_else(|| bad("an item without example"))? }))
            .collect()
    };
    let num = |key: &str| v.get(key).and_then(Value::as_u64).ok_or_else(|| bad(&format!("no {key:?} number")));
    Ok(Some(Plan { parent: num("parent")?, version: num("version")?, train: items("train")?, heldout: items("heldout")? }))
}

/// One batch per stored example (each was checked when it was stored).
fn batches(items: &[Stored], enc: &dyn Encoder, bounds: Bounds, max_len: usize) -> Result<Vec<Batch>> {
    let mut out = Vec::with_capacity(items.len());
    for s in items {
        let (mut b, _) = parse_jsonl(&s.example.to_string(), &format!("feedback example {}", s.id), Some(enc), max_len, bounds)?;
        out.append(&mut b);
    }
    Ok(out)
}

/// The round's training configuration: the parent's LoRA shape, `epochs`
/// passes.
fn round_config(config: &RoundConfig, parent: &Adapter, examples: usize) -> TrainConfig {
    let mut c = config.train.clone();
    c.lora = parent.config.clone();
    c.grad_accum = c.grad_accum.clamp(1, examples.max(1));
    c.schedule.total = epoch_steps(examples, c.grad_accum) * config.epochs.max(1);
    c
}

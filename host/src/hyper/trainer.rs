//! The population training loop (off device): stage 1a (SimCSE on the
//! embedder LoRA) then stage 1b (end to end with distillation), AdamW with
//! warm-up + decay and clipping per stage, driven by the training loop's
//! [`Learner`] (commits, metrics, progress, hooks).
//! Users, context splits and dropout derive from (seed, step), so a resumed
//! run continues exactly where the killed one committed.
use super::commit::{HyperRecord, HyperState, Stage};
use super::embedder::{embed_backward, embed_forward, view_seed};
use super::end_to_end::{user_loss_and_grads, E2eOptions};
use super::hypernet::HyperNet;
use super::targets::{LoraTargets, Reconstruct};
use super::simcse::{simcse_forward_backward, TEMPERATURE};
use super::users::{permutation, render_context, sample_user, UserRecord};
use crate::base::counter_rng;
use crate::lora::Adapter;
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::optim::schedule::{clip_grad_norm, Decay, Schedule};
use crate::tensor::Tensor;
use crate::train::data::Encoder;
use crate::autograd::graph::TrainableModel;
use crate::train::learner::{open_state, Learner, RunOptions};
use crate::train::trainer::example_index;
use crate::{Error, Result};
use std::path::Path;
use std::time::Instant;

/// Everything that defines a hypernetwork training run (besides the network's own config).
#[derive(Clone, Debug)]
pub struct HyperTrainConfig {
    /// Stage 1a steps.
    pub simcse_steps: u64,
    /// Stage 1b steps.
    pub e2e_steps: u64,
    /// Users sampled per step (SimCSE in-batch negatives; averaged in 1b).
    pub users_per_step: usize,
    /// Scored examples per user in 1b (the rest is context).
    pub target_examples: usize,
    /// Target example length cap in tokens.
    pub max_len: usize,
    /// Weight of the KL to the ICL teacher (0 = off).
    pub kl_weight: f32,
    /// Peak learning rate of stage 1a.
    pub simcse_lr: f32,
    /// Peak learning rate of stage 1b.
    pub lr: f32,
    /// Warm-up steps of each stage.
    pub warmup: u64,
    /// Decay after warm-up.
    pub decay: Decay,
    /// Optimizer.
    pub adamw: AdamWConfig,
    /// Clip the global gradient norm.
    pub max_grad_norm: Option<f32>,
    /// Run seed.
    pub seed: u64,
    /// Recompute every layer in the backward (memory for time).
    pub recompute: bool,
    /// Stage 1b keeps the heads' output biases (`b2`: the common LoRA the
    /// network starts from) as they are, so only what depends on the
    /// user's embedding trains and the network cannot drift into a second
    /// common LoRA.
    pub freeze_common: bool,
    /// Stage 1b keeps the embedder LoRA as stage 1a left it (no backward
    /// through the embedding pass): end to end training otherwise pulls
    /// users' embeddings together (on git-area the pairwise cosine went
    /// from 0.89 after SimCSE to 0.98 a hundred steps later) and the heads
    /// learn one more common LoRA instead of what differs between users.
    pub freeze_embedder: bool,
    /// Weight of the distance to the user's own LoRA in stage 1b, with
    /// targets ([`Guides::targets`]).
    pub recon_weight: f32,
    /// Stage 1b scores the generated LoRA on the user's examples (false:
    /// reconstruction alone, no pass through the LLM beyond the embedding).
    pub end_to_end: bool,
}

/// What stage 1b learns from besides the user's examples.
#[derive(Clone, Copy, Debug, Default)]
pub struct Guides<'a> {
    /// The ICL teacher's adapter (the common LoRA); `None` = the base model.
    pub teacher: Option<&'a Adapter>,
    /// Each user's own LoRA, aligned with the users ([`super::targets`]).
    pub targets: Option<&'a LoraTargets>,
}

impl<'a> Guides<'a> {
    /// Only a teacher.
    pub fn teacher(teacher: Option<&'a Adapter>) -> Self {
        Guides { teacher, targets: None }
    }
}

/// The options of a hypernetwork run. Its commits hold the network and
/// both Adam moments, three times the checkpoint: `commit_every` > 1 keeps
/// their writing from costing more than the steps. A hook's `after_step`
/// sees the whole state (the held-out evaluation).
pub type HyperRun<'a> = RunOptions<'a, HyperState>;

fn fingerprint(config: &HyperTrainConfig, net: &HyperNet, users: &[UserRecord], targets: Option<&LoraTargets>) -> String {
    let h = crate::train::fingerprint::hash(|eat| {
        for u in users {
            eat(u.user.as_bytes());
            u.examples.iter().for_each(|p| eat(format!("{}\u{1}{}\u{2}", p.query, p.response).as_bytes()));
        }
        // Each target's squared norm: a different LoRA all but surely differs
        // in it, at a fraction of hashing every weight.
        for f in targets.iter().flat_map(|t| &t.factors) {
            let norm: f64 = f.iter().flat_map(|t| &t.data).map(|&v| v as f64 * v as f64).sum();
            eat(&norm.to_le_bytes());
        }
    });
    crate::train::fingerprint::make(h, users.len(), &[config, &net.config])
}

/// Runs (or resumes) hypernetwork training into `out`: `commit.safetensors`
/// every `run.commit_every` steps, `metrics.jsonl`, and at the end `hypernet/` and
/// `loss.svg`. `fresh` builds the initial network.
#[allow(clippy::too_many_arguments)]
pub fn hypertrain(
    model: &dyn TrainableModel,
    enc: &dyn Encoder,
    users: &[UserRecord],
    fresh: HyperNet,
    guides: Guides<'_>,
    config: &HyperTrainConfig,
    out: &Path,
    run: HyperRun<'_>,
) -> Result<HyperState> {
    check_targets(users, guides)?;
    let fp = fingerprint(config, &fresh, users, guides.targets);
    let loaded = HyperState::load(out, model)?;
    let state = open_state(out, &fp, run.resume, loaded, || Ok(fresh_state(config, fresh, 0, &fp)))?;
    run_steps(model, enc, users, guides, config, out, run, state)
}

fn check_targets(users: &[UserRecord], guides: Guides<'_>) -> Result<()> {
    match guides.targets {
        Some(t) if t.factors.len() != users.len() => Err(Error::invalid("LoRA targets", format!("{} for {} users", t.factors.len(), users.len()))),
        _ => Ok(()),
    }
}

/// Where a worker's round starts: given parameters at a global step (the
/// step fixes the users, dropout and learning rate, as in one long run).
#[derive(Clone, Debug)]
pub struct StartFrom {
    /// The parameters (and configuration) to start from.
    pub net: HyperNet,
    /// Global steps already done by the population.
    pub step: u64,
}

/// [`hypertrain`] from `start` instead of a fresh network. Resuming, the
/// commit in `out` must be at `start.step`: it keeps its AdamW moments and
/// takes `start`'s parameters, so one worker given back its own parameters
/// every round runs exactly the uninterrupted single-process steps.
#[allow(clippy::too_many_arguments)]
pub fn hypertrain_from(
    model: &dyn TrainableModel,
    enc: &dyn Encoder,
    users: &[UserRecord],
    start: StartFrom,
    guides: Guides<'_>,
    config: &HyperTrainConfig,
    out: &Path,
    run: HyperRun<'_>,
) -> Result<HyperState> {
    check_targets(users, guides)?;
    let fp = fingerprint(config, &start.net, users, guides.targets);
    let params = start.net.params();
    let loaded = HyperState::load(out, model)?;
    let step = start.step;
    let mut state = open_state(out, &fp, run.resume, loaded, || Ok(fresh_state(config, start.net, step, &fp)))?;
    if state.step != step {
        let msg = format!("is {step} but the commit in {} is at step {}", out.display(), state.step);
        return Err(Error::invalid("--start-step", msg));
    }
    state.net.set_params(params)?;
    run_steps(model, enc, users, guides, config, out, run, state)
}

fn fresh_state(config: &HyperTrainConfig, net: HyperNet, step: u64, fp: &str) -> HyperState {
    HyperState { adamw: AdamW::new(config.adamw, &net.params()), net, step, seed: config.seed, history: Vec::new(), fingerprint: fp.to_string() }
}

#[allow(clippy::too_many_arguments)]
fn run_steps(model: &dyn TrainableModel, enc: &dyn Encoder, users: &[UserRecord], guides: Guides<'_>, config: &HyperTrainConfig, out: &Path, run: HyperRun<'_>, state: HyperState) -> Result<HyperState> {
    let recompute = vec![config.recompute; model.layer_count()];
    let learner = Learner { out, total: config.simcse_steps + config.e2e_steps, title: "hypernetwork training loss" };
    learner.run(state, run, |state| {
        if state.step == config.simcse_steps && config.simcse_steps > 0 {
            // Stage 1b starts with fresh moments: the heads had none in 1a.
            state.adamw = AdamW::new(config.adamw, &state.net.params());
        }
        step(model, enc, users, guides, config, &recompute, state)
    })
}

/// The users of step `step` (a fresh permutation every epoch), by index.
fn step_users(users: usize, seed: u64, step: u64, n: usize) -> Vec<usize> {
    (0..n as u64).map(|j| example_index(seed, step * n as u64 + j, users)).collect()
}

/// Indices into [`HyperNet::params`] a step leaves as they are (put back
/// after the update: AdamW's weight decay moves a parameter even without a
/// gradient): stage 1a trains the embedder only; stage 1b never moves the
/// heads' buffers (the centre has its own update) and, with
/// `freeze_common`, keeps the heads' output biases; with `freeze_embedder`,
/// the embedder LoRA.
fn frozen(net: &HyperNet, simcse: bool, config: &HyperTrainConfig) -> Vec<usize> {
    let e = net.embedder_len();
    if simcse {
        return (e..e + net.heads.params.len()).collect();
    }
    let mut kept: Vec<usize> = net.heads.buffers().into_iter().map(|i| e + i).collect();
    if config.freeze_common {
        kept.extend(net.heads.output_biases().map(|i| e + i));
    }
    if config.freeze_embedder {
        kept.extend(0..e);
    }
    kept
}

fn step(model: &dyn TrainableModel, enc: &dyn Encoder, users: &[UserRecord], guides: Guides<'_>, config: &HyperTrainConfig, recompute: &[bool], state: &mut HyperState) -> Result<HyperRecord> {
    let start = Instant::now();
    let n = config.users_per_step.clamp(2, users.len());
    let ids = step_users(users.len(), state.seed, state.step, n);
    let picks: Vec<&UserRecord> = ids.iter().map(|&i| &users[i]).collect();
    let mut grads = state.net.zero_grads();
    let simcse = state.step < config.simcse_steps;
    let (mut coefficients, mut embeddings) = (Vec::new(), Vec::new());
    let (loss, ce, kl, recon) = if simcse {
        (simcse_step(model, enc, &picks, recompute, state, &mut grads)?, 0.0, 0.0, 0.0)
    } else {
        let (mut loss, mut ce, mut kl, mut recon) = (0.0, 0.0, 0.0, 0.0);
        for (j, (u, &i)) in picks.iter().zip(&ids).enumerate() {
            let s = counter_rng::derive(counter_rng::derive(state.seed, state.step), j as u64);
            let cfg = &state.net.config;
            let batch = sample_user(enc, cfg, u, s, config.target_examples, config.max_len)?;
            let dropout_seed = (cfg.embed_dropout > 0.0).then(|| view_seed(state.seed, state.step, j as u64, 0));
            let train_embedder = !config.freeze_embedder;
            let reconstruct = guides.targets.map(|t| Reconstruct { target: &t.factors[i], inv_norm: t.inv_norm, weight: config.recon_weight });
            let opts = E2eOptions { kl_weight: config.kl_weight, teacher_lora: guides.teacher, dropout_seed, recompute: recompute.to_vec(), head_chunk: 64, train_embedder, end_to_end: config.end_to_end, reconstruct };
            let l = user_loss_and_grads(model, &state.net, &batch, &opts, 1.0 / n as f32, &mut grads)?;
            loss += l.total / n as f64;
            ce += l.ce / n as f64;
            kl += l.kl / n as f64;
            recon += l.recon / n as f64;
            coefficients.push(l.coefficients);
            embeddings.push(l.embedding);
        }
        (loss, ce, kl, recon)
    };
    if !loss.is_finite() || !grads.iter().all(|g| crate::tensor::all_finite(&g.data)) {
        return Err(Error::NonFinite(format!("hypernetwork loss or gradients at step {}", state.step + 1)));
    }
    let grad_norm = clip_grad_norm(&mut grads, config.max_grad_norm.unwrap_or(f32::INFINITY));
    let (lr, local, stage_steps) = match simcse {
        true => (config.simcse_lr, state.step, config.simcse_steps),
        false => (config.lr, state.step - config.simcse_steps, config.e2e_steps),
    };
    let lr = Schedule { lr, warmup: config.warmup, total: stage_steps, decay: config.decay }.lr_at(local);
    let mut params = state.net.params();
    let kept: Vec<(usize, Tensor)> = frozen(&state.net, simcse, config).into_iter().map(|i| (i, params[i].clone())).collect();
    state.adamw.update(&mut params, &grads, lr)?;
    for (i, t) in kept {
        params[i] = t;
    }
    state.net.set_params(params)?;
    // The centre moves after the update, from the coefficients the step's
    // loss was computed with (a constant within each step).
    state.net.heads.update_center(&coefficients);
    state.net.heads.update_embed_norm(&embeddings);
    state.step += 1;
    let stage = if simcse { Stage::Simcse } else { Stage::EndToEnd };
    Ok(HyperRecord { step: state.step, stage, loss, ce, kl, recon, lr, grad_norm, seconds: start.elapsed().as_secs_f64() })
}

/// Stage 1a: two dropout views of each picked user's context, InfoNCE over
/// the batch, gradients into the embedder LoRA.
fn simcse_step(model: &dyn TrainableModel, enc: &dyn Encoder, picks: &[&UserRecord], recompute: &[bool], state: &HyperState, grads: &mut [Tensor]) -> Result<f64> {
    let cfg = &state.net.config;
    let mut passes = Vec::with_capacity(2 * picks.len());
    for (j, u) in picks.iter().enumerate() {
        let order = permutation(counter_rng::derive(counter_rng::derive(state.seed, state.step), j as u64), u.examples.len());
        let pairs: Vec<_> = order.iter().map(|&i| &u.examples[i]).collect();
        let context = render_context(enc, cfg, &pairs)?;
        for view in 0..2 {
            let seed = Some(view_seed(state.seed, state.step, j as u64, view));
            passes.push(embed_forward(model, &state.net.embedder, &context, seed, true, recompute)?);
        }
    }
    let z1: Vec<Vec<f32>> = passes.iter().step_by(2).map(|p| p.embedding.clone()).collect();
    let z2: Vec<Vec<f32>> = passes.iter().skip(1).step_by(2).map(|p| p.embedding.clone()).collect();
    let out = simcse_forward_backward(&z1, &z2, TEMPERATURE)?;
    for (i, pass) in passes.iter_mut().enumerate() {
        let dz = if i % 2 == 0 { &out.dz1[i / 2] } else { &out.dz2[i / 2] };
        for (g, d) in grads.iter_mut().zip(embed_backward(pass, dz)?) {
            g.data.iter_mut().zip(&d.data).for_each(|(g, d)| *g += d);
        }
    }
    Ok(out.loss)
}

//! The training loop: micro-batches accumulated into optimizer steps, AdamW
//! with warm-up + decay and clipping, a commit after every step, progress
//! and metrics. Everything that influences the numbers (data order, dropout
//! masks) derives from the seed and the step, so a resumed run continues
//! exactly where the killed one committed.
use super::budget;
use super::commit::{StepRecord, TrainState};
use crate::autograd::graph::lora_params;
use crate::autograd::graph::{Batch, GraphOptions, LoraVars, TrainableModel};
use super::learner::{self, Learner};
use crate::base::counter_rng;
use crate::autograd::{Tape};
use crate::lora::{Adapter, LoraConfig};
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::optim::schedule::{clip_grad_norm, Schedule};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::path::Path;
use std::time::Instant;

/// Everything that defines a run.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Adapter hyper-parameters.
    pub lora: LoraConfig,
    /// Optimizer.
    pub adamw: AdamWConfig,
    /// Learning-rate schedule; `total` is the number of optimizer steps.
    pub schedule: Schedule,
    /// Micro-batches (examples) per optimizer step.
    pub grad_accum: usize,
    /// Clip the global gradient norm to this.
    pub max_grad_norm: Option<f32>,
    /// Data order, adapter init and dropout.
    pub seed: u64,
    /// Activation memory cap in bytes (the budget also respects MemAvailable).
    pub activation_cap: Option<u64>,
    /// Token rows per vocabulary-head chunk.
    pub head_chunk: usize,
}

/// The data's hash and the configuration ([`super::fingerprint`]), so
/// `--resume` refuses to continue a run with different inputs and says
/// which differ.
pub fn fingerprint(config: &TrainConfig, data: &[Batch]) -> String {
    let h = super::fingerprint::hash(|eat| {
        for b in data {
            b.input_ids.iter().flatten().for_each(|t| eat(&t.to_le_bytes()));
            b.labels.iter().flatten().for_each(|t| eat(&t.to_le_bytes()));
        }
    });
    super::fingerprint::make(h, data.len(), &[config])
}

/// Index of the `cursor`-th example in the seeded stream (a fresh
/// permutation every epoch).
pub fn example_index(seed: u64, cursor: u64, n: usize) -> usize {
    let (epoch, i) = (cursor / n as u64, (cursor % n as u64) as usize);
    let s = counter_rng::derive(seed, epoch);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| (counter_rng::bits(s, j as u64), j));
    order[i]
}

fn fresh_state(model: &dyn TrainableModel, config: &TrainConfig, fp: String) -> Result<TrainState> {
    let adapter = Adapter::init(config.lora.clone(), &model.projections(), counter_rng::derive(config.seed, u64::MAX))?;
    let params: Vec<Tensor> = adapter.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
    Ok(TrainState { adamw: AdamW::new(config.adamw, &params), adapter, cursor: 0, seed: config.seed, history: Vec::new(), fingerprint: fp })
}

/// Makes `init` (a common LoRA, last night's adapter) the start of a run
/// in `out`: its first commit, with fresh optimizer moments, which
/// [`train`] then resumes. `config.lora` must describe `init`.
pub fn commit_start(init: &Adapter, config: &TrainConfig, data: &[Batch], out: &Path) -> Result<()> {
    let params: Vec<Tensor> = init.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
    let state = TrainState {
        adapter: init.clone(),
        adamw: AdamW::new(config.adamw, &params),
        cursor: 0,
        seed: config.seed,
        history: Vec::new(),
        fingerprint: fingerprint(config, data),
    };
    state.commit(out)
}

/// The options of an AdamW run.
pub type RunOptions<'a> = learner::RunOptions<'a, TrainState>;

/// The number of optimizer steps in one epoch of `examples`.
pub fn epoch_steps(examples: usize, grad_accum: usize) -> u64 {
    (examples / grad_accum.max(1)).max(1) as u64
}

/// A step takes `grad_accum` distinct examples of the data: more than
/// there are would repeat examples within a step (and with a huge value
/// never end the first one).
pub fn check_grad_accum(grad_accum: usize, examples: usize) -> Result<()> {
    if grad_accum == 0 || grad_accum > examples {
        return Err(Error::invalid("--grad-accum", format!("{grad_accum}; it must be 1 to the {examples} examples of the training data")));
    }
    Ok(())
}

/// Runs (or resumes) training into `out`: `commit.safetensors` after every
/// step, `metrics.jsonl`, and at the end `adapter/` (PEFT) and `loss.svg`.
/// `run.hooks` may pace the run and end it early (resumable).
pub fn train(model: &dyn TrainableModel, data: &[Batch], config: &TrainConfig, out: &Path, run: RunOptions<'_>) -> Result<TrainState> {
    check_grad_accum(config.grad_accum, data.len())?;
    let fp = fingerprint(config, data);
    let loaded = TrainState::load(out)?;
    let state = learner::open_state(out, &fp, run.resume, loaded, || fresh_state(model, config, fp.clone()))?;
    let tokens_per_step = data.iter().map(|b| b.input_ids[0].len()).max().unwrap_or(0) as u64;
    let per_layer = (model.activation_bytes_per_token_layer() as u64) * tokens_per_step;
    let opts = GraphOptions {
        recompute_layers: budget::plan_recompute(model.layer_count(), per_layer, budget::budget(config.activation_cap)),
        head_chunk: config.head_chunk,
        loss_denominator: None,
        ..Default::default()
    };
    let learner = Learner { out, total: config.schedule.total, title: "training loss" };
    learner.run(state, run, |state| step(model, data, config, &opts, state))
}

/// One optimizer step: `grad_accum` micro-batches, clip, AdamW.
fn step(model: &dyn TrainableModel, data: &[Batch], config: &TrainConfig, opts: &GraphOptions, state: &mut TrainState) -> Result<StepRecord> {
    let start = Instant::now();
    let accum = config.grad_accum.max(1);
    let picks: Vec<&Batch> = (0..accum as u64).map(|j| &data[example_index(state.seed, state.cursor + j, data.len())]).collect();
    let denom = picks.iter().map(|b| b.target_count()).sum::<usize>().max(1) as f32;
    let opts = GraphOptions { loss_denominator: Some(denom), ..opts.clone() };
    // Summed micro-batch gradients, allocated only after a backward (not
    // resident next to the activations at the peak).
    let mut sums: Vec<Option<Tensor>> = (0..2 * state.adapter.modules.len()).map(|_| None).collect();
    let (mut loss, mut tokens) = (0f32, 0u64);
    for (j, batch) in picks.iter().enumerate() {
        let mut tape = Tape::new();
        let (factors, order) = lora_params(&mut tape, &state.adapter.modules);
        let dropout_seed = counter_rng::derive(state.seed, state.cursor + j as u64);
        let lora = LoraVars { factors, scaling: config.lora.scaling(), dropout: config.lora.dropout, dropout_seed };
        let l = model.loss(&mut tape, batch, &lora, &opts, None)?;
        tape.backward(l)?;
        loss += tape.value(l).data[0];
        tokens += batch.input_ids.iter().map(|r| r.len() as u64).sum::<u64>();
        for (g, v) in sums.iter_mut().zip(order.iter().flat_map(|&(a, b)| [a, b])) {
            match (g.as_mut(), tape.take_grad(v)) {
                (Some(g), Some(d)) => crate::tensor::add_assign(&mut g.data, &d.data),
                // 0 + d, as summing into zeros did (turns -0.0 into +0.0)
                (None, Some(mut d)) => {
                    crate::tensor::add_zero(&mut d.data);
                    *g = Some(d);
                }
                (_, None) => {}
            }
        }
    }
    let shapes = state.adapter.modules.iter().flat_map(|m| [&m.a.shape, &m.b.shape]);
    let mut grads: Vec<Tensor> = sums.into_iter().zip(shapes).map(|(g, shape)| g.unwrap_or_else(|| Tensor::zeros(shape))).collect();
    if !loss.is_finite() || !grads.iter().all(|g| crate::tensor::all_finite(&g.data)) {
        let lr = config.schedule.lr_at(state.step());
        return Err(Error::NonFinite(format!("loss or gradients at step {} (learning rate {lr:e})", state.step() + 1)));
    }
    let grad_norm = match config.max_grad_norm {
        Some(max) => clip_grad_norm(&mut grads, max),
        None => clip_grad_norm(&mut grads, f32::INFINITY),
    };
    let lr = config.schedule.lr_at(state.step());
    // The factors move out and back (not cloned: 18 MB per step at r16).
    let take = |t: &mut Tensor| std::mem::replace(t, Tensor::zeros(&[0]));
    let mut params: Vec<Tensor> = state.adapter.modules.iter_mut().flat_map(|m| [take(&mut m.a), take(&mut m.b)]).collect();
    let updated = state.adamw.update(&mut params, &grads, lr);
    for (m, pair) in state.adapter.modules.iter_mut().zip(params.chunks_exact_mut(2)) {
        m.a = take(&mut pair[0]);
        m.b = take(&mut pair[1]);
    }
    updated?;
    state.cursor += accum as u64;
    Ok(StepRecord { step: state.step(), loss, lr, grad_norm, tokens, seconds: start.elapsed().as_secs_f64() })
}

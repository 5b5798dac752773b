//! The MeZO training loop (`hexlora train --optimizer mezo`): forward-only
//! steps ([`crate::optim::mezo::Mezo`]), each over `grad_accum` examples of
//! the seeded example stream, driven by the same [`Learner`] as the AdamW
//! loop (commits, metrics, loss plot, progress bar, hooks). The perturbation of step `n` derives from
//! the run seed and `n`, so the committed adapter, cursor and history are the
//! whole state: a resumed run is bit-identical to an uninterrupted one.
//!
//! Memory is that of inference: factors are tape constants, nothing is
//! differentiated, and no optimizer moments exist.
use super::commit::{read_commit, write_commit, StepRecord};
use crate::autograd::graph::{Batch, GraphOptions, LoraVars, TrainableModel};
use super::learner::{self, Learner};
use super::trainer::{example_index, fingerprint, TrainConfig};
use crate::base::counter_rng;
use crate::autograd::{Tape};
use crate::lora::peft::peft_key;
use crate::lora::{Adapter, LoraConfig, LoraModule};
use crate::optim::mezo::Mezo;
use crate::tensor::Tensor;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Metadata key of a MeZO commit (an AdamW commit has another, so one run
/// directory cannot be resumed with the other optimizer by mistake).
const STATE_KEY: &str = "hexlora_mezo_state";

/// A MeZO run: the shared training configuration (its `adamw` field is
/// unused; `schedule`, `grad_accum`, `seed`, `lora`, `head_chunk` apply) and
/// the perturbation settings.
#[derive(Clone, Debug)]
pub struct MezoConfig {
    /// Adapter, schedule, examples per step, seed.
    pub train: TrainConfig,
    /// Perturbation scale and weight decay.
    pub mezo: Mezo,
}

/// Everything a resumed MeZO run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct MezoState {
    /// The adapter being trained.
    pub adapter: Adapter,
    /// Optimizer steps done.
    pub step: u64,
    /// Examples consumed so far.
    pub cursor: u64,
    /// Per-step records so far (`grad_norm` holds `|projected gradient|`).
    pub history: Vec<StepRecord>,
    /// Identifies configuration and data; resume refuses a mismatch.
    pub fingerprint: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    step: u64,
    cursor: u64,
    lora: serde_json::Value,
    history: Vec<StepRecord>,
    fingerprint: String,
    modules: Vec<String>,
}

impl MezoState {
    /// Writes `dir/commit.safetensors` atomically.
    pub fn commit(&self, dir: &Path) -> Result<()> {
        let mut f = self.adapter.to_tensor_file();
        f.metadata.clear();
        let header = Header {
            step: self.step,
            cursor: self.cursor,
            lora: self.adapter.config.to_json(),
            history: self.history.clone(),
            fingerprint: self.fingerprint.clone(),
            modules: self.adapter.modules.iter().map(|m| m.name.clone()).collect(),
        };
        write_commit(dir, STATE_KEY, f, &header)
    }

    /// Reads the last MeZO commit of a run directory, if there is one.
    pub fn load(dir: &Path) -> Result<Option<MezoState>> {
        let not_ours = "not a MeZO commit (an AdamW run? resume it with the optimizer it was started with)";
        let Some((f, header, what)) = read_commit::<Header>(dir, STATE_KEY, not_ours)? else {
            return Ok(None);
        };
        let config = LoraConfig::from_json(&header.lora, &what)?;
        let modules = header
            .modules
            .iter()
            .map(|name| Ok(LoraModule { name: name.clone(), a: f.get(&peft_key(name, "A"), &what)?.clone(), b: f.get(&peft_key(name, "B"), &what)?.clone() }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(MezoState { adapter: Adapter { config, modules }, step: header.step, cursor: header.cursor, history: header.history, fingerprint: header.fingerprint }))
    }
}

learner::adapter_run_checkpointed!(MezoState, |s| s.step);

fn run_fingerprint(config: &MezoConfig, data: &[Batch]) -> String {
    format!("{}; {:?}", fingerprint(&config.train, data), config.mezo)
}

fn fresh_state(model: &dyn TrainableModel, config: &MezoConfig, fp: String) -> Result<MezoState> {
    let seed = counter_rng::derive(config.train.seed, u64::MAX);
    let adapter = Adapter::init(config.train.lora.clone(), &model.projections(), seed)?;
    Ok(MezoState { adapter, step: 0, cursor: 0, history: Vec::new(), fingerprint: fp })
}

/// The options of a MeZO run.
pub type RunOptions<'a> = learner::RunOptions<'a, MezoState>;

/// Runs (or resumes) MeZO training into `out`: `commit.safetensors` after
/// every step, `metrics.jsonl`, and at the end `adapter/` (PEFT) and
/// `loss.svg`, by the same [`Learner`] as the AdamW loop.
pub fn train_mezo(model: &dyn TrainableModel, data: &[Batch], config: &MezoConfig, out: &Path, run: RunOptions<'_>) -> Result<MezoState> {
    if data.is_empty() {
        return Err(Error::invalid("training data", "no examples"));
    }
    super::trainer::check_grad_accum(config.train.grad_accum, data.len())?;
    if !(config.mezo.eps.is_finite() && config.mezo.eps > 0.0) {
        return Err(Error::invalid("--mezo-eps", format!("{}; it must be finite and > 0", config.mezo.eps)));
    }
    let fp = run_fingerprint(config, data);
    let state = learner::open_state(out, &fp, run.resume, MezoState::load(out)?, || fresh_state(model, config, fp.clone()))?;
    let learner = Learner { out, total: config.train.schedule.total, title: "training loss (MeZO)" };
    learner.run(state, run, |state| mezo_step(model, data, config, state))
}

/// Mean token loss of `picks` (one denominator over all of them) with the
/// adapter factors `params` (`[A0, B0, A1, B1, ...]` in module order).
fn forward_loss(model: &dyn TrainableModel, modules: &[LoraModule], scaling: f32, params: &[Tensor], picks: &[&Batch], opts: &GraphOptions) -> Result<f32> {
    let mut total = 0f32;
    for batch in picks {
        let mut tape = Tape::new();
        let factors = modules
            .iter()
            .zip(params.chunks_exact(2))
            .map(|(m, ab)| (m.name.clone(), (tape.constant(ab[0].clone()), tape.constant(ab[1].clone()))))
            .collect();
        let lora = LoraVars { factors, scaling, dropout: 0.0, dropout_seed: 0 };
        let l = model.loss(&mut tape, batch, &lora, opts, None)?;
        total += tape.value(l).data[0];
    }
    if !total.is_finite() {
        return Err(Error::NonFinite("MeZO loss".into()));
    }
    Ok(total)
}

/// One MeZO step over the next `grad_accum` examples of the seeded stream:
/// the one step of every MeZO run (`train --optimizer mezo`, the
/// evaluation's per-user `mezo`).
pub fn mezo_step(model: &dyn TrainableModel, data: &[Batch], config: &MezoConfig, state: &mut MezoState) -> Result<StepRecord> {
    let start = Instant::now();
    let accum = config.train.grad_accum.max(1);
    let picks: Vec<&Batch> = (0..accum as u64).map(|j| &data[example_index(config.train.seed, state.cursor + j, data.len())]).collect();
    let denom = picks.iter().map(|b| b.target_count()).sum::<usize>().max(1) as f32;
    let opts = GraphOptions { loss_denominator: Some(denom), head_chunk: config.train.head_chunk, ..Default::default() };
    let lr = config.train.schedule.lr_at(state.step);
    let mut params: Vec<Tensor> = state.adapter.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
    let step_seed = counter_rng::derive(counter_rng::derive(config.train.seed, 0x6d657a6f), state.step);
    let scaling = config.train.lora.scaling();
    let modules = &state.adapter.modules;
    let step = config.mezo.step_measured(&mut params, step_seed, lr, |p| forward_loss(model, modules, scaling, p, &picks, &opts)).map_err(|e| match e {
        Error::NonFinite(what) => Error::NonFinite(format!("{what} at step {} (learning rate {lr:e}, eps {:e})", state.step + 1, config.mezo.eps)),
        e => e,
    })?;
    for (m, pair) in state.adapter.modules.iter_mut().zip(params.chunks_exact_mut(2)) {
        m.a = std::mem::replace(&mut pair[0], Tensor::zeros(&[0]));
        m.b = std::mem::replace(&mut pair[1], Tensor::zeros(&[0]));
    }
    state.step += 1;
    state.cursor += accum as u64;
    let tokens = 2 * picks.iter().map(|b| b.input_ids.iter().map(|r| r.len() as u64).sum::<u64>()).sum::<u64>();
    Ok(StepRecord { step: state.step, loss: step.loss, lr, grad_norm: step.projected_grad.abs(), tokens, seconds: start.elapsed().as_secs_f64() })
}

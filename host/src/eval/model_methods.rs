//! The model-backed methods, one [`MethodKind`] each: base model zero-shot,
//! ICL with k retrieved profile items, one common LoRA for all users,
//! per-user LoRA by backprop (Adam, initialised from the common LoRA), and
//! per-user MeZO on the same examples. They share [`answer`] (how a prompt
//! and an optional adapter become `decoding.samples` answers), so a new
//! method (the hypernetwork) only has to say which adapter a user gets.
//!
//! Training uses the real engine: [`crate::train::trainer::train`] on the
//! architecture's training graph ([`EvalModel::graph`]) and the training
//! loop's MeZO step ([`crate::train::mezo_loop::mezo_step`]).
use super::bench::{commit_subject, git_area, mail, quotes, sotu};
use super::dataset::{ProfileItem, Query, Split, User};
use super::method::{Decoding, Method, UserPrep};
use super::model_runtime::{EvalModel, LabelScore};
use super::rouge::Rouge;
use super::task::{TaskKind, TaskSpec};
use crate::base::counter_rng;
use crate::lora::{Adapter, LoraConfig};
use crate::model::chat::Message;
use crate::model::checkpoint::Checkpoint;
use crate::npu::{NpuClient, NpuOptions, PrecisionPolicy, TransportKind};
use crate::optim::adamw::AdamWConfig;
use crate::runtime::plan_cache::PlanCache;
use crate::runtime::planner::Buckets;
use crate::runtime::split_model::{load_split, DspSide, SplitModel};
use crate::optim::mezo::Mezo;
use crate::optim::schedule::{Decay, Schedule};
use crate::train::grad::evaluate;
use crate::autograd::graph::{Batch, TrainableModel};
use crate::train::commit::StepRecord;
use crate::train::learner::{self, Learner};
use crate::train::mezo_loop::{mezo_step, MezoConfig, MezoState};
use crate::train::trainer::{commit_start, train, RunOptions, TrainConfig};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Names of the model-backed methods (`icl` takes its k from the config).
pub const NAMES: [&str; 7] = ["base", "icl", "common-lora", "metaicl-lora", "user-lora", "user-lora-f32", "mezo"];

/// Optimizer steps of one training run (one example per step).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Budget {
    /// Optimizer steps.
    pub steps: u64,
    /// Peak learning rate (cosine decay, no warm-up).
    pub lr: f32,
}

/// Everything the model-backed methods are configured with (written into
/// each result file's `config`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelMethodConfig {
    /// Profile items shown to `icl`.
    pub icl_k: usize,
    /// Prompts (query and profile items) are cut to this many characters;
    /// the personal text sits at the end of every bundled prompt, so this
    /// shortens the text, not the instruction.
    pub max_prompt_chars: usize,
    /// Training sequences are cut to this many tokens (prompt cut from the left).
    pub max_len: usize,
    /// LoRA rank (all adapters of a comparison share it).
    pub rank: usize,
    /// LoRA alpha.
    pub alpha: f32,
    /// Target module suffixes.
    pub targets: Vec<String>,
    /// The common LoRA's training on the train split.
    pub common: Budget,
    /// Per-user training (backprop and MeZO take the same examples).
    pub user: Budget,
    /// MeZO learning rate and perturbation scale.
    pub mezo_lr: f32,
    /// MeZO perturbation scale.
    pub mezo_eps: f32,
    /// Data order, adapter init, dropout, MeZO directions.
    pub seed: u64,
    /// Training runs go here (`common-lora/`, `user-lora/<user>/`).
    pub work_dir: PathBuf,
    /// Load the common LoRA from this PEFT directory instead of training it.
    pub common_adapter: Option<PathBuf>,
    /// How classification scores its labels.
    pub label_score: LabelScore,
    /// Resident precision of `user-lora`'s frozen products on the DSP
    /// (`PrecisionPolicy::default()` is the mission's, as `personalize`'s).
    /// `user-lora`'s `config()` carries it (`split_policy`).
    #[serde(skip)]
    pub split_policy: PrecisionPolicy,
}

/// Which adapter (if any) a method answers with, and how it gets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodKind {
    /// The base model, zero-shot.
    Base,
    /// The base model with k retrieved profile items as previous chat turns.
    Icl,
    /// One LoRA trained on the train split's users.
    CommonLora,
    /// One LoRA trained on the train split's users with each example
    /// preceded by its user's ICL prefix (k profile items as chat turns),
    /// and answering with that prefix: the seed's MetaICL-style baseline.
    MetaIclLora,
    /// The common LoRA fine-tuned on the user's profile by backprop + Adam,
    /// trained through the split runtime as `personalize` trains: every
    /// frozen product routed to the DSP service (the firmware in process)
    /// at the default precision policy, the planner's probes deciding.
    UserLora,
    /// The same training with every frozen product on the CPU in f32 (the
    /// reference the seed calls "GPU-trained").
    UserLoraF32,
    /// The common LoRA fine-tuned on the user's profile by MeZO.
    Mezo,
}

/// One model-backed method.
pub struct ModelMethod {
    kind: MethodKind,
    model: Arc<EvalModel>,
    cfg: ModelMethodConfig,
    common: Option<Adapter>,
    user: Option<Adapter>,
    rouge: Rouge,
    /// Label log-likelihoods of the current user's queries, reused across
    /// a sweep's decodings (same adapter, same prompt).
    scored: HashMap<String, Vec<f64>>,
    /// Per-user steps as epochs over the user's profile (0: `cfg.user.steps`).
    user_epochs: u64,
    /// `user-lora`'s training graph, routed by the split runtime (made at
    /// the first user).
    split: Option<(DspSide, SplitModel)>,
}

/// Token buckets `user-lora`'s planner validates (`personalize`'s default).
const SPLIT_BUCKETS: &str = "32,64,128,256,512";

/// At most this many train examples are held out to measure the common
/// LoRA's loss before and after training.
const HELD_OUT: usize = 32;

/// The method called `name`, or `None` if it is not a model-backed method.
pub fn by_name(name: &str, model: Arc<EvalModel>, cfg: ModelMethodConfig) -> Option<ModelMethod> {
    let kind = match name {
        "base" => MethodKind::Base,
        "icl" => MethodKind::Icl,
        "common-lora" => MethodKind::CommonLora,
        "metaicl-lora" => MethodKind::MetaIclLora,
        "user-lora" => MethodKind::UserLora,
        "user-lora-f32" => MethodKind::UserLoraF32,
        "mezo" => MethodKind::Mezo,
        _ => return None,
    };
    Some(ModelMethod { kind, model, cfg, common: None, user: None, rouge: Rouge::new(), scored: HashMap::new(), user_epochs: 0, split: None })
}

/// Every `n / HELD_OUT`-th example (at least every 2nd) taken out of
/// `data`: (training examples, held-out examples). Deterministic, spread
/// over all train users rather than the last few.
fn hold_out(data: Vec<Batch>) -> (Vec<Batch>, Vec<Batch>) {
    let stride = (data.len() / HELD_OUT).max(2);
    let (mut train, mut held) = (Vec::new(), Vec::new());
    for (i, b) in data.into_iter().enumerate() {
        if i % stride == stride - 1 && held.len() < HELD_OUT {
            held.push(b);
        } else {
            train.push(b);
        }
    }
    (train, held)
}

/// The question prompt a bundled benchmark builds from an item's input
/// (the same text its queries carry); other tasks use the input as is.
pub fn item_prompt(spec: &TaskSpec, input: &str) -> String {
    let labels = spec.labels();
    match spec.name.as_str() {
        "quotes-tag" => (quotes::DEF.prompt)(input, labels),
        "mail-subject" => (mail::DEF.prompt)(input, labels),
        "sotu-continue" => (sotu::DEF.prompt)(input, labels),
        "git-area" => (git_area::DEF.prompt)(input, labels),
        "commit-subject" => (commit_subject::DEF.prompt)(input, labels),
        _ => input.to_string(),
    }
}

/// The ICL turns for `input`: the `k` profile items of `user` (but `skip`)
/// sharing the most ROUGE-1 with it, most similar last, each prompt cut at
/// `max_chars` (what `icl` and `metaicl-lora` put before the question).
pub fn icl_turns(rouge: &Rouge, spec: &TaskSpec, user: &User, input: &str, skip: Option<&str>, k: usize, max_chars: usize) -> Vec<Message> {
    let mut scored: Vec<(f64, &ProfileItem)> = user
        .profile
        .iter()
        .filter(|p| Some(p.id.as_str()) != skip)
        .map(|p| (rouge.score(&p.pair(spec).0, input).rouge1, p))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let mut turns = Vec::new();
    for (_, item) in scored.into_iter().take(k).rev() {
        let (input, output) = item.pair(spec);
        turns.push(Message::new("user", &cut(&item_prompt(spec, &input), max_chars)));
        turns.push(Message::new("assistant", &output));
    }
    turns
}

/// `text` cut to at most `max` characters.
pub(crate) fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// `decoding.samples` answers to `messages` with whatever adapter is set.
/// Classification scores every label by its log-likelihood (see
/// [`classify`]); generation decodes freely.
pub fn answer(model: &EvalModel, spec: &TaskSpec, query: &Query, messages: &[Message], decoding: &Decoding, score: LabelScore) -> Result<Vec<String>> {
    let prompt = model.prompt_ids(messages)?;
    match &spec.kind {
        TaskKind::Classification { labels } => Ok(classify(labels, &model.answer_scores(&prompt, labels, score)?, query, decoding)),
        TaskKind::Generation => {
            let seeds: Vec<u64> = (0..decoding.samples).map(|i| decoding.sample_seed(&query.id, i)).collect();
            model.generate_samples(&prompt, decoding.temperature, &seeds, decoding.max_new_tokens)
        }
    }
}

/// Labels chosen from their log-likelihoods `logp`: greedy takes the best,
/// T > 0 draws each sample from `softmax(logp / T)` over the labels (the
/// model's sampling distribution restricted to valid answers).
pub fn classify(labels: &[String], logp: &[f64], query: &Query, decoding: &Decoding) -> Vec<String> {
    (0..decoding.samples).map(|i| labels[pick(logp, decoding.temperature, decoding.sample_seed(&query.id, i))].clone()).collect()
}

/// Index drawn from `softmax(logp / t)` with seed `seed`; argmax at t = 0.
fn pick(logp: &[f64], t: f32, seed: u64) -> usize {
    let best = (0..logp.len()).fold(0, |b, i| if logp[i] > logp[b] { i } else { b });
    if t <= 0.0 {
        return best;
    }
    let w: Vec<f64> = logp.iter().map(|&l| ((l - logp[best]) / t as f64).exp()).collect();
    let u = counter_rng::uniform(seed, 0) as f64 * w.iter().sum::<f64>();
    let mut acc = 0.0;
    for (i, wi) in w.iter().enumerate() {
        acc += wi;
        if u < acc {
            return i;
        }
    }
    best
}

impl ModelMethod {
    /// Per-user training (user-lora and mezo) takes `epochs` passes over
    /// each user's profile instead of a fixed `cfg.user.steps` (0 = fixed).
    pub fn with_user_epochs(mut self, epochs: u64) -> Self {
        self.user_epochs = epochs;
        self
    }

    /// The per-user budget for a profile of `n` examples.
    fn user_budget(&self, n: usize) -> Budget {
        match self.user_epochs {
            0 => self.cfg.user,
            e => Budget { steps: e * n as u64, lr: self.cfg.user.lr },
        }
    }

    fn lora_config(&self) -> LoraConfig {
        LoraConfig {
            r: self.cfg.rank,
            alpha: self.cfg.alpha,
            target_modules: self.cfg.targets.clone(),
            dropout: 0.0,
            use_rslora: false,
            base_model: String::new(),
        }
    }

    fn train_config(&self, budget: Budget, seed: u64) -> TrainConfig {
        TrainConfig {
            lora: self.lora_config(),
            adamw: AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() },
            schedule: Schedule { lr: budget.lr, warmup: 0, total: budget.steps, decay: Decay::Cosine },
            grad_accum: 1,
            max_grad_norm: Some(1.0),
            seed,
            activation_cap: None,
            head_chunk: 64,
        }
    }

    /// The chat turns for one question: the (cut) query, preceded for ICL by
    /// the k profile items sharing the most ROUGE-1 with it (most similar last).
    fn messages(&self, spec: &TaskSpec, user: &User, query: &Query) -> Vec<Message> {
        let mut turns = Vec::new();
        if matches!(self.kind, MethodKind::Icl | MethodKind::MetaIclLora) {
            turns = self.icl_prefix(spec, user, &query.input, None);
        }
        turns.push(Message::new("user", &cut(&query.input, self.cfg.max_prompt_chars)));
        turns
    }

    /// The ICL turns for `input`: the k profile items of `user` (but
    /// `skip`) sharing the most ROUGE-1 with it, most similar last.
    fn icl_prefix(&self, spec: &TaskSpec, user: &User, input: &str, skip: Option<&str>) -> Vec<Message> {
        icl_turns(&self.rouge, spec, user, input, skip, self.cfg.icl_k, self.cfg.max_prompt_chars)
    }

    /// A common-LoRA training example: `input` (already in prompt form)
    /// answered by `answer`, after the user's ICL prefix for `metaicl-lora`
    /// (profile item `skip` left out of it: an example never shows itself).
    fn population_example(&self, spec: &TaskSpec, user: &User, input: &str, answer: &str, skip: Option<&str>) -> Result<Batch> {
        let mut msgs = if self.kind == MethodKind::MetaIclLora { self.icl_prefix(spec, user, input, skip) } else { Vec::new() };
        msgs.push(Message::new("user", &cut(input, self.cfg.max_prompt_chars)));
        self.model.example(&msgs, answer, self.cfg.max_len)
    }

    /// A training example from one (input, answer) pair.
    fn example(&self, spec: &TaskSpec, input: &str, answer: &str) -> Result<Batch> {
        let msg = [Message::new("user", &cut(&item_prompt(spec, input), self.cfg.max_prompt_chars))];
        self.model.example(&msg, answer, self.cfg.max_len)
    }

    fn profile_examples(&self, spec: &TaskSpec, user: &User) -> Result<Vec<Batch>> {
        user.profile.iter().map(|p| {
            let (input, output) = p.pair(spec);
            self.example(spec, &input, &output)
        }).collect()
    }

    /// Trains from `init` (fresh PEFT init when `None`) into `dir` with the
    /// trainer; a start from an existing adapter is written as the run's
    /// first commit, which the trainer then resumes.
    fn train_into(&self, data: &[Batch], budget: Budget, seed: u64, init: Option<&Adapter>, dir: &Path) -> Result<(Adapter, UserPrep)> {
        let graph: &dyn TrainableModel = match &self.split {
            Some((_, split)) if self.kind == MethodKind::UserLora => &*split.graph,
            _ => &*self.model.graph,
        };
        let start = Instant::now();
        fresh_dir(dir)?;
        let config = self.train_config(budget, seed);
        if let Some(init) = init {
            commit_start(init, &config, data, dir)?;
        }
        let run = RunOptions { resume: init.is_some(), ..RunOptions::quiet() };
        let state = train(graph, data, &config, dir, run)?;
        Ok((state.adapter, prep_of(&state.history, start)))
    }

    /// MeZO from the common LoRA over the same example stream as backprop,
    /// one example a step, run by the training loop into `dir` with the
    /// training loop's step ([`mezo_step`]).
    fn mezo(&self, data: &[Batch], steps: u64, seed: u64, dir: &Path) -> Result<(Adapter, UserPrep)> {
        let start = Instant::now();
        fresh_dir(dir)?;
        let adapter = self.common_adapter()?.clone();
        let config = MezoConfig {
            train: TrainConfig {
                lora: adapter.config.clone(),
                adamw: AdamWConfig::default(),
                schedule: Schedule { lr: self.cfg.mezo_lr, warmup: 0, total: steps, decay: Decay::Cosine },
                grad_accum: 1,
                max_grad_norm: None,
                seed,
                activation_cap: None,
                head_chunk: 64,
            },
            mezo: Mezo { eps: self.cfg.mezo_eps, weight_decay: 0.0 },
        };
        let state = MezoState { adapter, step: 0, cursor: 0, history: Vec::new(), fingerprint: format!("eval mezo {seed:016x}") };
        let learner = Learner { out: dir, total: steps, title: "per-user MeZO loss" };
        let state = learner.run(state, learner::RunOptions::quiet(), |s| mezo_step(&*self.model.graph, data, &config, s))?;
        Ok((state.adapter, prep_of(&state.history, start)))
    }

    /// Routes `user-lora`'s training graph through the split runtime once:
    /// the in-process DSP service, the configured precision policy and the
    /// token buckets `personalize` validates, every route probed afresh.
    fn ensure_split(&mut self) -> Result<()> {
        if self.kind != MethodKind::UserLora || self.split.is_some() {
            return Ok(());
        }
        let ckpt = Checkpoint::open(&self.model.path)?;
        let client = NpuClient::connect(TransportKind::InProcess, &NpuOptions::default())?;
        let side = DspSide::Npu { client, policy: self.cfg.split_policy };
        let buckets = Arc::new(Buckets::parse(SPLIT_BUCKETS)?);
        let split = load_split(&ckpt, &side, buckets, false, &PlanCache::disabled())?;
        self.split = Some((side, split));
        Ok(())
    }

    /// Loads `--common-adapter`, if given, the first time a user needs it:
    /// the one place it is read, since `prepare_population` does not run
    /// without a train split (`--train-split none`).
    fn load_given_common(&mut self) -> Result<()> {
        if let (Some(dir), None) = (&self.cfg.common_adapter, &self.common) {
            self.common = Some(Adapter::load(dir)?);
        }
        Ok(())
    }

    fn common_adapter(&self) -> Result<&Adapter> {
        self.common.as_ref().ok_or_else(|| Error::invalid(self.name(), "needs the common LoRA: give the train split or --common-adapter"))
    }

    /// A seed per user, fixed by the run seed and the user id.
    fn user_seed(&self, user: &User) -> u64 {
        user.id.bytes().fold(counter_rng::derive(self.cfg.seed, 1), |h, b| counter_rng::derive(h, b as u64))
    }

    fn user_dir(&self, user: &User) -> PathBuf {
        self.cfg.work_dir.join(self.name()).join(super::dataset::user_dir_name(&user.id))
    }
}

/// A user's preparation figures from the run's step records.
fn prep_of(history: &[StepRecord], start: Instant) -> UserPrep {
    UserPrep {
        seconds: start.elapsed().as_secs_f64(),
        tokens: history.iter().map(|r| r.tokens).sum(),
        loss_curve: history.iter().map(|r| r.loss as f64).collect(),
    }
}

/// Empties `dir` for a new run (a user's previous run is not resumed).
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
}

/// `held_out.json` next to the common LoRA's metrics: mean token loss of
/// the held-out train examples under the base model and the trained LoRA.
fn write_held_out(dir: &Path, trained_on: usize, held: usize, before: f32, after: f32) -> Result<()> {
    let v = serde_json::json!({ "trained_on": trained_on, "held_out": held, "loss_base": before, "loss_common_lora": after });
    let path = dir.join("held_out.json");
    std::fs::write(&path, v.to_string()).map_err(|e| Error::io(&path, e))?;
    eprintln!("common LoRA held-out loss ({held} examples): base {before:.4} -> trained {after:.4}");
    Ok(())
}

impl Method for ModelMethod {
    fn name(&self) -> String {
        match self.kind {
            MethodKind::Base => "base".into(),
            MethodKind::Icl => format!("icl-k{}", self.cfg.icl_k),
            MethodKind::CommonLora => "common-lora".into(),
            MethodKind::MetaIclLora => "metaicl-lora".into(),
            MethodKind::UserLora => "user-lora".into(),
            MethodKind::UserLoraF32 => "user-lora-f32".into(),
            MethodKind::Mezo => "mezo".into(),
        }
    }

    fn config(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.cfg).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("user_epochs".into(), self.user_epochs.into());
            let frozen = match (&self.split, self.kind) {
                (Some((_, split)), _) => format!("split runtime: in-process DSP service, precision policy {}, buckets {SPLIT_BUCKETS}; {}", self.cfg.split_policy, split.routes.summary()),
                (None, MethodKind::UserLora) => "split runtime (not yet routed: no user trained)".into(),
                _ => "CPU f32".into(),
            };
            obj.insert("frozen_products".into(), frozen.into());
            if self.kind == MethodKind::UserLora {
                // Part of the sweep's fingerprint: a resume at another
                // policy must not mix its users with this one's.
                obj.insert("split_policy".into(), self.cfg.split_policy.to_string().into());
            }
        }
        v
    }

    fn prepare_population(&mut self, train: &Split) -> Result<()> {
        if matches!(self.kind, MethodKind::Base | MethodKind::Icl) {
            return Ok(());
        }
        if self.cfg.common_adapter.is_some() {
            // given, not trained: prepare_user loads it (with or without a train split)
            return Ok(());
        }
        // Profile items and answered questions of the train users.
        let spec = &train.spec;
        let mut data = Vec::new();
        for user in &train.users {
            for p in &user.profile {
                let (input, output) = p.pair(spec);
                data.push(self.population_example(spec, user, &item_prompt(spec, &input), &output, Some(&p.id))?);
            }
            for q in &user.queries {
                if let Some(gold) = &q.gold {
                    data.push(self.population_example(spec, user, &q.input, gold, None)?);
                }
            }
        }
        if data.is_empty() {
            return Err(Error::invalid("train split", "no examples to train the common LoRA on"));
        }
        let (data, held) = hold_out(data);
        let dir = self.cfg.work_dir.join(if self.kind == MethodKind::MetaIclLora { "metaicl-lora" } else { "common-lora" });
        // A fresh PEFT adapter has B = 0: its loss is the base model's.
        let fresh = Adapter::init(self.lora_config(), &*self.model.graph.projections(), 0)?;
        let before = evaluate(&*self.model.graph, &fresh, &held)?;
        let (adapter, _) = self.train_into(&data, self.cfg.common, self.cfg.seed, None, &dir)?;
        let after = evaluate(&*self.model.graph, &adapter, &held)?;
        write_held_out(&dir, data.len(), held.len(), before, after)?;
        self.common = Some(adapter);
        Ok(())
    }

    fn prepare_user(&mut self, spec: &TaskSpec, user: &User) -> Result<UserPrep> {
        self.user = None;
        self.scored.clear();
        if !matches!(self.kind, MethodKind::Base | MethodKind::Icl) {
            self.load_given_common()?;
        }
        if !matches!(self.kind, MethodKind::UserLora | MethodKind::UserLoraF32 | MethodKind::Mezo) {
            return Ok(UserPrep::default());
        }
        self.ensure_split()?;
        let data = self.profile_examples(spec, user)?;
        if data.is_empty() {
            // Nothing to personalise on: the user keeps the common LoRA.
            return Ok(UserPrep::default());
        }
        let seed = self.user_seed(user);
        let (adapter, prep) = match self.kind {
            MethodKind::UserLora | MethodKind::UserLoraF32 => {
                let common = self.common_adapter()?.clone();
                self.train_into(&data, self.user_budget(data.len()), seed, Some(&common), &self.user_dir(user))?
            }
            _ => self.mezo(&data, self.user_budget(data.len()).steps, seed, &self.user_dir(user))?,
        };
        self.user = Some(adapter);
        Ok(prep)
    }

    fn predict(&mut self, spec: &TaskSpec, user: &User, query: &Query, decoding: &Decoding) -> Result<Vec<String>> {
        let adapter = match self.kind {
            MethodKind::Base | MethodKind::Icl => None,
            MethodKind::CommonLora | MethodKind::MetaIclLora => Some(self.common_adapter()?),
            MethodKind::UserLora | MethodKind::UserLoraF32 | MethodKind::Mezo => Some(self.user.as_ref().map_or_else(|| self.common_adapter(), Ok)?),
        };
        self.model.set_adapter(adapter)?;
        let messages = self.messages(spec, user, query);
        let Some(labels) = spec.labels() else { return answer(&self.model, spec, query, &messages, decoding, self.cfg.label_score) };
        if !self.scored.contains_key(&query.id) {
            let lp = self.model.answer_scores(&self.model.prompt_ids(&messages)?, labels, self.cfg.label_score)?;
            self.scored.insert(query.id.clone(), lp);
        }
        Ok(classify(labels, &self.scored[&query.id], query, decoding))
    }
}

#[cfg(test)]
mod tests {
    use super::{hold_out, pick, HELD_OUT};
    use crate::autograd::graph::Batch;

    #[test]
    fn hold_out_keeps_every_example_once_and_caps_the_held_set() {
        for n in [0usize, 1, 3, 10, 64, 65, 1000] {
            let data: Vec<Batch> = (0..n).map(|i| Batch { input_ids: vec![vec![i as u32]], labels: vec![vec![i as i64]] }).collect();
            let (train, held) = hold_out(data);
            assert!(held.len() <= HELD_OUT && held.len() <= n / 2, "n={n}: {} held", held.len());
            let mut seen: Vec<u32> = train.iter().chain(&held).map(|b| b.input_ids[0][0]).collect();
            seen.sort();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
            if n >= 2 * HELD_OUT {
                assert_eq!(held.len(), HELD_OUT, "n={n}");
            }
        }
    }

    #[test]
    fn pick_is_argmax_at_zero_and_follows_softmax_above() {
        let lp = [-3.0, -0.5, -1.0];
        assert_eq!(pick(&lp, 0.0, 7), 1);
        let mut counts = [0usize; 3];
        for s in 0..20000 {
            counts[pick(&lp, 1.0, s)] += 1;
        }
        let z: f64 = lp.iter().map(|l: &f64| l.exp()).sum();
        for i in 0..3 {
            let p = lp[i].exp() / z;
            assert!((counts[i] as f64 / 20000.0 - p).abs() < 0.015, "{counts:?}");
        }
    }
}

//! The hypernetwork as an evaluation method (`hexlora eval --method
//! hypernet --hypernet DIR`): per user, one forward pass of a trained
//! hypernetwork turns the user's profile into a LoRA, which then answers
//! exactly like the other model-backed methods
//! ([`crate::eval::model_methods::answer`], same prompts, same scoring).
//!
//! The profile becomes context the way `hexlora hypertrain --bench` data
//! does ([`super::users::profile_pairs`]): each item's input wrapped in the
//! task's question prompt as the query, its output as the response,
//! rendered with the hypernetwork's template and cut at its token budget.
//!
//! With [`HypernetMethod::over`] the user's part of the synthesized LoRA
//! (synthesized minus the network's common LoRA) is added in weight space to
//! another adapter, and every question is asked after the user's `k` most
//! similar profile items: the hypernetwork on top of `metaicl-lora`.
use super::users::{profile_pairs, render_context, Context, Pair};
use super::HyperNet;
use crate::eval::dataset::{Query, Split, User};
use crate::eval::method::{Decoding, Method, UserPrep};
use crate::eval::model_methods::{answer, classify, cut, icl_turns};
use crate::eval::rouge::Rouge;
use crate::eval::model_runtime::{EvalModel, LabelScore};
use crate::eval::task::TaskSpec;
use crate::lora::Adapter;
use crate::model::chat::Message;
use crate::train::text_encoder::ModelText;
use crate::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Name of the method on the command line and in result files.
pub const NAME: &str = "hypernet";

/// A trained hypernetwork answering through the LoRA it synthesizes per user.
pub struct HypernetMethod {
    model: Arc<EvalModel>,
    net: HyperNet,
    text: ModelText,
    dir: PathBuf,
    max_prompt_chars: usize,
    /// Scale of each user's part of the synthesized LoRA (1: as trained).
    strength: f32,
    /// How classification scores its labels.
    label_score: LabelScore,
    /// The current user's synthesized LoRA (`None`: no profile, base model).
    user: Option<Adapter>,
    /// Label log-likelihoods of the current user's queries, reused across a sweep.
    scored: HashMap<String, Vec<f64>>,
    /// Answer with another base adapter and ICL turns (`None`: as trained).
    over: Option<Over>,
}

/// What [`HypernetMethod::over`] sets: the user's LoRA is
/// `base + (synthesized - common)`, the question follows `icl_k` profile items.
struct Over {
    base: Adapter,
    path: PathBuf,
    common: Adapter,
    icl_k: usize,
    rouge: Rouge,
}

impl HypernetMethod {
    /// Loads the hypernetwork in `dir` for `model` (opened from
    /// `model_path`, whose tokenizer renders the context).
    pub fn open(model: Arc<EvalModel>, model_path: &Path, dir: &Path, max_prompt_chars: usize) -> Result<Self> {
        let net = HyperNet::load(dir, &*model.graph)?;
        let text = ModelText::open(model_path)?;
        Ok(HypernetMethod { model, net, text, dir: dir.to_path_buf(), max_prompt_chars, strength: 1.0, label_score: LabelScore::Mean, user: None, scored: HashMap::new(), over: None })
    }

    /// Scores classification labels as `score` says (default: per token).
    pub fn with_label_score(mut self, score: LabelScore) -> Self {
        self.label_score = score;
        self
    }

    /// Scales each user's part of the synthesized LoRA by `strength`
    /// ([`HyperNet::synthesize_with_strength`]; 1 = as trained).
    pub fn with_strength(mut self, strength: f32) -> Self {
        self.strength = strength;
        self
    }

    /// Adds each user's part of the synthesized LoRA to the PEFT adapter in
    /// `base` (weight space, [`Adapter::stack`]) and asks every question after
    /// the user's `icl_k` profile items most similar to it
    /// ([`icl_turns`], as `metaicl-lora` answers). The base must adapt the
    /// projections the network emits.
    pub fn over(mut self, base: &Path, icl_k: usize) -> Result<Self> {
        let adapter = Adapter::load(base)?;
        let common = self.net.common()?;
        Adapter::stack(&[(&adapter, 1.0), (&common, -1.0)]).map_err(|e| crate::Error::invalid(base.display().to_string(), format!("cannot carry the hypernetwork's LoRA: {e}")))?;
        self.over = Some(Over { base: adapter, path: base.to_path_buf(), common, icl_k, rouge: Rouge::new() });
        Ok(self)
    }

    /// The loaded hypernetwork.
    pub fn net(&self) -> &HyperNet {
        &self.net
    }

    /// The hypernetwork's input for `user`: token ids of the rendered profile.
    pub fn context(&self, spec: &TaskSpec, user: &User) -> Result<Context> {
        let pairs = profile_pairs(spec, user, self.max_prompt_chars);
        let refs: Vec<&Pair> = pairs.iter().collect();
        render_context(&self.text, &self.net.config, &refs)
    }
}

impl Method for HypernetMethod {
    fn name(&self) -> String {
        NAME.into()
    }

    fn config(&self) -> serde_json::Value {
        serde_json::json!({
            "hypernet": self.dir.display().to_string(),
            "hyper_config": self.net.config,
            "max_prompt_chars": self.max_prompt_chars,
            "strength": self.strength,
            "label_score": self.label_score,
            "over": self.over.as_ref().map(|o| serde_json::json!({ "adapter": o.path.display().to_string(), "icl_k": o.icl_k })),
        })
    }

    /// The hypernetwork was trained beforehand (`hexlora hypertrain`).
    fn prepare_population(&mut self, _train: &Split) -> Result<()> {
        Ok(())
    }

    /// Synthesis is the whole per-user cost: its time is the prep time.
    fn prepare_user(&mut self, spec: &TaskSpec, user: &User) -> Result<UserPrep> {
        self.user = None;
        self.scored.clear();
        let start = Instant::now();
        let context = self.context(spec, user)?;
        if context.is_empty() {
            return Ok(UserPrep::default());
        }
        let synthesized = self.net.synthesize_with_strength(&*self.model.graph, &context, self.strength)?;
        self.user = Some(match &self.over {
            None => synthesized,
            Some(o) => Adapter::stack(&[(&o.base, 1.0), (&synthesized, 1.0), (&o.common, -1.0)])?,
        });
        Ok(UserPrep { seconds: start.elapsed().as_secs_f64(), tokens: context.len() as u64, loss_curve: Vec::new() })
    }

    fn predict(&mut self, spec: &TaskSpec, user: &User, query: &Query, decoding: &Decoding) -> Result<Vec<String>> {
        self.model.set_adapter(self.user.as_ref().or(self.over.as_ref().map(|o| &o.base)))?;
        let mut messages = match &self.over {
            Some(o) => icl_turns(&o.rouge, spec, user, &query.input, None, o.icl_k, self.max_prompt_chars),
            None => Vec::new(),
        };
        messages.push(Message::new("user", &cut(&query.input, self.max_prompt_chars)));
        let Some(labels) = spec.labels() else { return answer(&self.model, spec, query, &messages, decoding, self.label_score) };
        if !self.scored.contains_key(&query.id) {
            let lp = self.model.answer_scores(&self.model.prompt_ids(&messages)?, labels, self.label_score)?;
            self.scored.insert(query.id.clone(), lp);
        }
        Ok(classify(labels, &self.scored[&query.id], query, decoding))
    }
}

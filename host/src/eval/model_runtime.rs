//! One loaded model as the model-backed methods use it: the inference
//! [`Model`] (generation, answer log-likelihoods) with swappable LoRA slots,
//! the architecture's training graph ([`crate::model::arch::of`]) over the
//! *same* frozen projections, and the
//! model's tokenizer and chat template.
use crate::lora::slots::AdapterSlots;
use crate::lora::Adapter;
use crate::model::chat::{ChatTemplate, Message};
use crate::model::decoder::{cpu_projection, Model, SharedProjections};
use crate::model::generate::{decode, generate, prefill, Sampling};
use crate::model::checkpoint::Checkpoint;
use crate::model::source::RawTensor;
use crate::model::tokenizer::Tokenizer;
use crate::projection::ProjectionInfo;
use crate::autograd::graph::{Batch, TrainableModel};
use crate::{Error, Result};
use std::cell::RefCell;
use std::path::Path;

/// How a label's log-likelihood becomes its score when a classification
/// task picks or samples among its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabelScore {
    /// The mean log-probability of the tokens of `label <|im_end|>`: a
    /// label's length does not count against it.
    Mean,
    /// Their sum, the probability of generating exactly the label and
    /// stopping: favours labels of fewer tokens.
    Sum,
}

/// A model ready for evaluation and per-user training.
pub struct EvalModel {
    /// The checkpoint it was opened from.
    pub path: std::path::PathBuf,
    /// Inference model; its projections carry adapter slots.
    pub model: Model,
    /// Training graph sharing the frozen projections with `model`.
    pub graph: Box<dyn TrainableModel>,
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    slots: AdapterSlots,
    /// `<|im_end|>`: closes an assistant answer.
    end_of_turn: u32,
    stop: Vec<u32>,
}

impl EvalModel {
    /// Opens a GGUF file or a Hugging Face directory (ChatML models only).
    pub fn open(path: &Path) -> Result<Self> {
        let ckpt = Checkpoint::open(path)?;
        Self::build(path, &ckpt, ckpt.tokenizer()?, ckpt.template()?)
    }

    fn build(path: &Path, ckpt: &Checkpoint, tokenizer: Tokenizer, chat: ChatTemplate) -> Result<Self> {
        let (src, cfg) = (ckpt.tensors(), ckpt.config.clone());
        // Each frozen weight is dequantized once and shared by both models.
        let shared = SharedProjections::new(&cpu_projection);
        let get = |info: ProjectionInfo, raw: &RawTensor<'_>| shared.get(info, raw);
        let graph = crate::model::arch::of(&cfg).training_graph(ckpt, &get, crate::ops::cpu_projection::FrozenDtype::F32, false)?;
        let slots = RefCell::new(AdapterSlots::default());
        let wrap = |info: ProjectionInfo, raw: &RawTensor<'_>| Ok(slots.borrow_mut().wrap(get(info, raw)?));
        let model = Model::load(cfg, src, &wrap)?;
        let end_of_turn = tokenizer
            .token_to_id("<|im_end|>")
            .ok_or_else(|| Error::Unsupported("evaluation needs a ChatML model (no <|im_end|> token)".into()))?;
        let stop = tokenizer.stop_ids(&model.config.eos_token_ids);
        Ok(EvalModel { path: path.to_path_buf(), model, graph, tokenizer, chat, slots: slots.into_inner(), end_of_turn, stop })
    }

    /// Puts `adapter` into the inference model; `None` restores the base model.
    pub fn set_adapter(&self, adapter: Option<&Adapter>) -> Result<()> {
        self.slots.set(adapter)
    }

    /// Token ids of `messages` in the chat template, ending with the
    /// opening of the assistant's turn.
    pub fn prompt_ids(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.tokenizer.encode(&self.chat.render(messages, true))
    }

    /// Token ids of an assistant answer, closed by `<|im_end|>`.
    pub fn answer_ids(&self, answer: &str) -> Result<Vec<u32>> {
        let mut ids = self.tokenizer.encode(answer)?;
        ids.push(self.end_of_turn);
        Ok(ids)
    }

    /// A training example: loss on the answer (and its `<|im_end|>`) only.
    /// The prompt is cut from the left to keep the sequence within `max_len`
    /// tokens with the whole answer (answers are short: tags, subjects).
    pub fn example(&self, messages: &[Message], answer: &str, max_len: usize) -> Result<Batch> {
        let answer = self.answer_ids(answer)?;
        let mut prompt = self.prompt_ids(messages)?;
        let keep = max_len.saturating_sub(answer.len()).max(1);
        if prompt.len() > keep {
            prompt.drain(..prompt.len() - keep);
        }
        let labels = prompt.iter().map(|_| -100).chain(answer.iter().map(|&t| t as i64)).collect();
        Ok(Batch { input_ids: vec![[prompt, answer].concat()], labels: vec![labels] })
    }

    /// One generated answer (greedy at temperature 0, else seeded sampling
    /// over the full distribution), special tokens removed.
    pub fn generate(&self, prompt: &[u32], temperature: f32, seed: u64, max_new: usize) -> Result<String> {
        let sampling = Sampling { temperature, top_p: 1.0, seed };
        let ids = generate(&self.model, prompt, max_new, &sampling, &self.stop, |_| {})?;
        Ok(self.tokenizer.decode(&ids, true)?.trim().to_string())
    }

    /// One answer per seed, each equal to `generate(prompt, temperature,
    /// seed, max_new)`, but the prompt is run once and its state forked per
    /// sample (10 samples at T > 0 would otherwise prefill it 10 times).
    pub fn generate_samples(&self, prompt: &[u32], temperature: f32, seeds: &[u64], max_new: usize) -> Result<Vec<String>> {
        let (state, first) = prefill(&self.model, prompt)?;
        seeds
            .iter()
            .map(|&seed| {
                let sampling = Sampling { temperature, top_p: 1.0, seed };
                sampling.validate()?;
                let ids = decode(&self.model, &mut state.clone(), first.clone(), max_new, &sampling, &self.stop, |_| {})?;
                Ok(self.tokenizer.decode(&ids, true)?.trim().to_string())
            })
            .collect()
    }

    /// `log p(answer <|im_end|> | prompt)` for each answer: the prompt is run
    /// once and its state forked per answer. Summed over the answer's tokens,
    /// so it is the probability of generating exactly that answer and stopping.
    pub fn answer_logprobs(&self, prompt: &[u32], answers: &[String]) -> Result<Vec<f64>> {
        self.answer_scores(prompt, answers, LabelScore::Sum)
    }

    /// Each answer's score: its log-likelihood ([`Self::answer_logprobs`])
    /// as `score` says, summed or per token.
    pub fn answer_scores(&self, prompt: &[u32], answers: &[String], score: LabelScore) -> Result<Vec<f64>> {
        let (state, first) = prefill(&self.model, prompt)?;
        answers
            .iter()
            .map(|a| {
                let ids = self.answer_ids(a)?;
                let mut fork = state.clone();
                let hidden = self.model.forward(&ids[..ids.len() - 1], &mut fork)?;
                let rest = self.model.logits(&hidden)?;
                let vocab = first.len();
                let rows = std::iter::once(&first[..]).chain(rest.chunks_exact(vocab));
                let mut total = 0.0;
                for (row, &t) in rows.zip(&ids) {
                    total += log_softmax_at(row, t as usize)?;
                }
                Ok(match score {
                    LabelScore::Sum => total,
                    LabelScore::Mean => total / ids.len() as f64,
                })
            })
            .collect()
    }
}

/// `log softmax(row)[i]` in f64.
fn log_softmax_at(row: &[f32], i: usize) -> Result<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    if !max.is_finite() {
        return Err(Error::NonFinite("logits while scoring an answer".into()));
    }
    let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    Ok(row[i] as f64 - max - z.ln())
}

#[cfg(test)]
mod tests {
    use super::log_softmax_at;

    #[test]
    fn log_softmax_matches_the_definition() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        for i in 0..3 {
            assert!((log_softmax_at(&row, i).unwrap() - ((row[i] as f64).exp() / z).ln()).abs() < 1e-12);
        }
        assert!(log_softmax_at(&[f32::NAN, f32::NEG_INFINITY], 0).is_err());
    }
}

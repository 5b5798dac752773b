//! The one interface every compared method implements, and the decoding
//! settings it is asked to answer under.
//!
//! A method is one entry: base model zero-shot, ICL with k profile items,
//! common LoRA, per-user LoRA (backprop), per-user MeZO, the hypernetwork,
//! and the model-free baselines in [`super::baselines`]. The harness
//! ([`super::harness`]) calls, in order: [`Method::prepare_population`] once
//! with the train split, then per user [`Method::prepare_user`] followed by
//! [`Method::predict`] for each of that user's queries.
use super::dataset::{Query, Split, User};
use super::task::TaskSpec;
use crate::Result;
use serde::{Deserialize, Serialize};

/// How to decode one answer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decoding {
    /// Sampling temperature; 0 means greedy.
    pub temperature: f32,
    /// Answers drawn per query: 1 when greedy, [`SAMPLES_AT_POSITIVE_T`] otherwise.
    pub samples: usize,
    /// Generation length limit in tokens.
    pub max_new_tokens: usize,
    /// Base seed; sample `i` of query `q` uses [`Decoding::sample_seed`].
    pub seed: u64,
}

/// Samples per query at T > 0, whose scores are averaged (as in the
/// hypernetwork paper's evaluation).
pub const SAMPLES_AT_POSITIVE_T: usize = 10;

impl Decoding {
    /// Greedy decoding (one answer).
    pub fn greedy(max_new_tokens: usize) -> Self {
        Decoding { temperature: 0.0, samples: 1, max_new_tokens, seed: 0 }
    }

    /// Decoding at `temperature`: greedy at 0, else [`SAMPLES_AT_POSITIVE_T`] samples.
    pub fn at(temperature: f32, max_new_tokens: usize, seed: u64) -> Self {
        let samples = if temperature > 0.0 { SAMPLES_AT_POSITIVE_T } else { 1 };
        Decoding { temperature, samples, max_new_tokens, seed }
    }

    /// The decodings of a temperature sweep, in the given order.
    pub fn sweep(temperatures: &[f32], max_new_tokens: usize, seed: u64) -> Vec<Self> {
        temperatures.iter().map(|&t| Self::at(t, max_new_tokens, seed)).collect()
    }

    /// The seed of sample `sample` of the query with id `query_id`: fixed by
    /// (base seed, query, sample) alone, so a rerun, or a run of a different
    /// method, draws with the same seeds (FNV-1a, stable across Rust versions).
    pub fn sample_seed(&self, query_id: &str, sample: usize) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ self.seed;
        for b in query_id.bytes().chain((sample as u64).to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}

/// The text-generation capability a model-backed method needs: one answer to
/// one prompt. Implemented by the models' generate API; at T = 0 it must be
/// greedy, at T > 0 it samples with the given seed (same seed, same text).
pub trait Generator {
    /// Generates up to `decoding.max_new_tokens` tokens after `prompt`.
    fn generate(&mut self, prompt: &str, decoding: &Decoding, seed: u64) -> Result<String>;
}

/// What preparing one user cost and produced (recorded in the result file).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserPrep {
    /// Wall-clock seconds spent preparing the user.
    pub seconds: f64,
    /// Tokens processed while preparing (training tokens, context tokens).
    pub tokens: u64,
    /// Training loss per optimizer step, if the method trains.
    pub loss_curve: Vec<f64>,
}

/// One compared method.
pub trait Method {
    /// Short stable name used in result files and tables (`base`, `icl-k4`,
    /// `common-lora`, `user-lora`, `mezo`, `hypernet`, ...).
    fn name(&self) -> String;

    /// The settings that define this method's numbers (recorded in result
    /// files). Default: none.
    fn config(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Once per run, before any user: population-level work (e.g. train the
    /// common LoRA on the train split). Default: nothing.
    fn prepare_population(&mut self, _train: &Split) -> Result<()> {
        Ok(())
    }

    /// Per-user work from the user's profile only (train a personal adapter,
    /// choose ICL examples, run the hypernetwork). Default: nothing.
    fn prepare_user(&mut self, _spec: &TaskSpec, _user: &User) -> Result<UserPrep> {
        Ok(UserPrep::default())
    }

    /// The answers to one query of the user last prepared: exactly
    /// `decoding.samples` strings.
    fn predict(&mut self, spec: &TaskSpec, user: &User, query: &Query, decoding: &Decoding) -> Result<Vec<String>>;
}

//! What defines a hypernetwork: the embedder LoRA, the generated LoRA, the
//! heads and the context rendering. Saved next to the weights as
//! `hypernet.json`, so `hexlora synth` needs nothing else.
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// How the embedding becomes LoRA matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeadVariant {
    /// One 2-layer bottleneck MLP per (layer, module, A or B).
    Parallel,
    /// One shared first layer plus learned layer and module-type embeddings,
    /// and one second layer per module type (Text-to-LoRA / Profile-to-PEFT).
    SharedTrunk,
}

/// Which context tokens the embedder's mean pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pool {
    /// Every token of the rendered context.
    #[default]
    Mean,
    /// Only the tokens of the responses (what the user wrote): the queries
    /// of a LaMP task repeat the task's instructions, which every user's
    /// context shares, so an all-token mean is mostly the same for everyone.
    Responses,
}

/// Hypernetwork hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HyperConfig {
    /// Rank of the trainable embedder LoRA on the frozen LLM.
    pub embed_rank: usize,
    /// Its `lora_alpha`.
    pub embed_alpha: f32,
    /// Its dropout (the two SimCSE views differ by this).
    pub embed_dropout: f32,
    /// Modules the embedder LoRA adapts.
    pub embed_targets: Vec<String>,
    /// Rank of the generated LoRA.
    pub out_rank: usize,
    /// `lora_alpha` of the generated LoRA.
    pub out_alpha: f32,
    /// Modules the generated LoRA adapts.
    pub out_targets: Vec<String>,
    /// Bottleneck width `k` of every head.
    pub bottleneck: usize,
    /// Parallel heads or the shared trunk.
    pub variant: HeadVariant,
    /// Context rendering of one (query, response) example; `{query}` and
    /// `{response}` are replaced.
    pub template: String,
    /// Context token budget (the concatenated examples are cut here).
    pub context_tokens: usize,
    /// Model the hypernetwork was built for (recorded in adapters).
    pub base_model: String,
    /// The heads subtract a running population mean from their coefficients
    /// (`out = b2 + W2 (h - c)`), so `W2` carries only what differs between
    /// users and the common part stays in `b2`. Absent in networks saved
    /// before it existed, which read as `false`.
    #[serde(default)]
    pub center: bool,
    /// The heads read the embedding centred on its running population mean
    /// and scaled to unit mean variance across users, so what differs
    /// between users reaches `W1` at O(1) instead of the few percent of the
    /// embedding it is. Absent = `false`.
    #[serde(default)]
    pub standardize: bool,
    /// Which context tokens are pooled into the embedding. Absent = all.
    #[serde(default)]
    pub pool: Pool,
    /// Each context query is cut to its last N characters (the personal
    /// text ends the bundled prompts), so more of a user's examples fit the
    /// token budget. Absent = whole queries.
    #[serde(default)]
    pub context_query_chars: Option<usize>,
}

impl Default for HyperConfig {
    fn default() -> Self {
        let attn = ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec();
        HyperConfig {
            embed_rank: 8,
            embed_alpha: 16.0,
            embed_dropout: 0.1,
            embed_targets: attn.clone(),
            out_rank: 4,
            out_alpha: 8.0,
            out_targets: attn,
            bottleneck: 16,
            variant: HeadVariant::Parallel,
            template: "Input: {query}\nOutput: {response}\n\n".into(),
            context_tokens: 512,
            base_model: String::new(),
            center: false,
            standardize: false,
            pool: Pool::Mean,
            context_query_chars: None,
        }
    }
}

impl HyperConfig {
    /// Rejects sizes that cannot work.
    pub fn check(&self) -> Result<()> {
        let positive = [("embed_rank", self.embed_rank), ("out_rank", self.out_rank), ("bottleneck", self.bottleneck), ("context_tokens", self.context_tokens)];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::invalid(*name, "must be positive"));
        }
        if !(0.0..1.0).contains(&self.embed_dropout) {
            return Err(Error::invalid("embed_dropout", format!("{} is outside [0, 1)", self.embed_dropout)));
        }
        if !self.template.contains("{query}") || !self.template.contains("{response}") {
            return Err(Error::invalid("template", "must contain {query} and {response}"));
        }
        if self.context_query_chars == Some(0) {
            return Err(Error::invalid("context_query_chars", "must be positive"));
        }
        if self.out_targets.is_empty() {
            return Err(Error::invalid("out_targets", "names no module"));
        }
        Ok(())
    }

    /// The embedder LoRA as a PEFT configuration.
    pub fn embed_lora(&self) -> crate::lora::LoraConfig {
        crate::lora::LoraConfig {
            r: self.embed_rank,
            alpha: self.embed_alpha,
            target_modules: self.embed_targets.clone(),
            dropout: self.embed_dropout,
            use_rslora: false,
            base_model: self.base_model.clone(),
        }
    }

    /// The generated LoRA as a PEFT configuration.
    pub fn out_lora(&self) -> crate::lora::LoraConfig {
        crate::lora::LoraConfig {
            r: self.out_rank,
            alpha: self.out_alpha,
            target_modules: self.out_targets.clone(),
            dropout: 0.0,
            use_rslora: false,
            base_model: self.base_model.clone(),
        }
    }
}

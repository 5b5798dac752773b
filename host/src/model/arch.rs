//! The one place that picks an architecture's code for a checkpoint. An
//! architecture is a folder of [`crate::model`] (`llama/`, `qwen35/`,
//! `gemma3/`) holding its training graph, the configuration fields only it
//! has and anything else only it needs (Qwen3.5's GDN block, Qwen3.5's and
//! Gemma 3's GGUF conventions), over the one layer forward
//! ([`crate::model::layer`], run for decoding by [`crate::model::decoder`]
//! and recorded on the tape by the training graphs). Adding one means adding a folder, an
//! [`Architecture`] implementation, a [`Recipe`], an arm in [`by_arch`] and
//! [`recipe`], its names in [`crate::model::config`]'s `model_type` and GGUF
//! tables (and, for its GGUF files, an arm in [`gguf_conventions`]).
use super::blocks::GateAct;
use super::chat::ChatTemplate;
use super::checkpoint::Checkpoint;
use super::gguf_adapter::AdapterLayout;
use super::config::{Arch, ModelConfig};
use crate::ops::cpu_projection::FrozenDtype;
use super::decoder::ProjectionFactory;
use super::gguf::{Conventions, Gguf, Plain, RefusedTensors};
use super::{gemma3, llama, qwen35};
use crate::autograd::graph::TrainableModel;
use crate::ops::rmsnorm::NormWeight;
use crate::Result;
use serde_json::Value;

/// What each architecture supplies.
pub trait Architecture: Sync {
    /// Its name, for messages.
    fn name(&self) -> &'static str;

    /// The training graph of `ckpt`: `make` builds every per-layer frozen
    /// projection (CPU, or routed to the NPU by the split runtime),
    /// `tables` is the precision of embeddings and head, `unfused` records
    /// each adapted projection and its LoRA branch as two nodes.
    fn training_graph(&self, ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> Result<Box<dyn TrainableModel>>;

    /// How llama.cpp lays out its LoRA adapters (`hexlora adapter`'s GGUF
    /// export and import), or why they are not exported.
    fn gguf_adapter(&self, cfg: &ModelConfig) -> Result<AdapterLayout>;

    /// The chat template of a checkpoint that carries none.
    fn default_chat(&self) -> ChatTemplate {
        ChatTemplate::chatml()
    }

    /// The text model's part of a `config.json` and the checkpoint prefix
    /// of its decoder (a multimodal wrapper nests them).
    fn hf_text<'a>(&self, json: &'a Value) -> Result<(&'a Value, &'static str)> {
        Ok((json, "model."))
    }

    /// Reads its own fields of a `config.json`'s text part into `cfg`, whose
    /// shared fields are read; refuses what it does not implement, naming
    /// the field.
    fn read_hf_config(&self, json: &Value, cfg: &mut ModelConfig) -> Result<()>;

    /// The same from GGUF metadata.
    fn read_gguf_config(&self, g: &Gguf, cfg: &mut ModelConfig) -> Result<()>;

    /// Whether its training graph can record each adapted projection and
    /// its LoRA branch as two nodes (`--no-fuse`).
    fn has_unfused_mode(&self) -> bool {
        true
    }
}

/// How an architecture's decoder layers differ from Llama's. Each
/// architecture folder declares its own; the descriptor, the inference
/// decoder and the attention decoders' training graph read it (through
/// [`recipe`]) instead of matching on the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// RMSNorm weights scale as stored (`w`) or as `1 + w`.
    pub norm: NormWeight,
    /// Per-head RMSNorm of q and k (`self_attn.{q,k}_norm.weight`).
    pub qk_norm: bool,
    /// q_proj also emits a sigmoid output gate (twice the rows).
    pub gated_attention: bool,
    /// Sandwich norms: the mixer's and the MLP's outputs are normed before
    /// the residual add (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`), and the MLP's input norm is
    /// `pre_feedforward_layernorm`; otherwise `post_attention_layernorm` is
    /// the MLP's input norm.
    pub sandwich_norms: bool,
    /// The MLP's gate activation.
    pub act: GateAct,
    /// Token embeddings times `sqrt(hidden)`.
    pub scaled_embeddings: bool,
}

impl Recipe {
    /// The name (without `.weight`) of the norm before the MLP.
    pub fn mlp_norm(&self) -> &'static str {
        match self.sandwich_norms {
            true => "pre_feedforward_layernorm",
            false => "post_attention_layernorm",
        }
    }

    /// The embedding rows' factor: `sqrt(hidden)` rounded to f32, as
    /// transformers multiplies in the weights' dtype (f32 here).
    pub fn embed_scale(&self, hidden: usize) -> Option<f32> {
        self.scaled_embeddings.then(|| (hidden as f64).sqrt() as f32)
    }
}

/// The layer recipe of `arch`.
pub fn recipe(arch: Arch) -> &'static Recipe {
    match arch {
        Arch::Llama => &llama::LLAMA,
        Arch::Qwen3 => &llama::QWEN3,
        Arch::Qwen35 => &qwen35::RECIPE,
        Arch::Gemma3 => &gemma3::RECIPE,
    }
}

/// How GGUF files of `general.architecture` = `name` differ from Hugging
/// Face convention (the GGUF reader asks; it names no architecture).
/// `qwen3next` files open, but their fused tensors are refused.
pub fn gguf_conventions(name: &str) -> &'static dyn Conventions {
    match name {
        "llama" => &llama::gguf::LlamaGguf,
        "qwen35" => &qwen35::gguf::Qwen35Gguf,
        "gemma3" => &gemma3::gguf::Gemma3Gguf,
        "qwen3next" => &RefusedTensors,
        _ => &Plain,
    }
}

/// The architecture of a checkpoint with configuration `cfg`.
pub fn of(cfg: &ModelConfig) -> &'static dyn Architecture {
    by_arch(cfg.arch)
}

/// The code of `arch`.
pub fn by_arch(arch: Arch) -> &'static dyn Architecture {
    match arch {
        Arch::Qwen35 => &qwen35::Qwen35,
        Arch::Llama | Arch::Qwen3 => &llama::Llama,
        Arch::Gemma3 => &gemma3::Gemma3,
    }
}

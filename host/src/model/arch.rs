//! The one place that picks an architecture's code for a checkpoint. An
//! architecture is a folder of [`crate::model`] (`llama/`, `qwen35/`,
//! `gemma3/`) holding its training graph and anything only it needs
//! (Qwen3.5's GDN block, Qwen3.5's and Gemma 3's GGUF conventions), over the shared blocks
//! ([`crate::model::blocks`]) and the shared inference decoder
//! ([`crate::model::decoder`]). Adding one means adding a folder, an
//! [`Architecture`] implementation and an arm in [`of`] (and, for its GGUF
//! files, in [`gguf_conventions`]).
use super::checkpoint::Checkpoint;
use super::config::{Arch, ModelConfig};
use crate::ops::cpu_projection::FrozenDtype;
use super::decoder::ProjectionFactory;
use super::gguf::{Conventions, Plain, RefusedTensors};
use super::{gemma3, llama, qwen35};
use crate::autograd::graph::TrainableModel;
use crate::Result;

/// What each architecture supplies.
pub trait Architecture: Sync {
    /// Its name, for messages.
    fn name(&self) -> &'static str;

    /// The training graph of `ckpt`: `make` builds every per-layer frozen
    /// projection (CPU, or routed to the NPU by the split runtime),
    /// `tables` is the precision of embeddings and head, `unfused` records
    /// each adapted projection and its LoRA branch as two nodes.
    fn training_graph(&self, ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> Result<Box<dyn TrainableModel>>;
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
    match cfg.arch {
        Arch::Qwen35 => &qwen35::Qwen35,
        Arch::Llama | Arch::Qwen3 => &llama::Llama,
        Arch::Gemma3 => &gemma3::Gemma3,
    }
}

//! Llama and Qwen3 (attention decoders; Qwen3 adds per-head q/k RMSNorm):
//! the training graph ([`graph::DecoderGraph`]: embeddings, head and loss
//! around the one layer forward of [`crate::model::layer`], which decoding
//! runs too).
pub mod gguf;
pub mod graph;

pub use graph::DecoderGraph;

use super::arch::{Architecture, Recipe};
use super::blocks::GateAct;
use crate::ops::rmsnorm::NormWeight;
use super::checkpoint::Checkpoint;
use super::config::{silu_only, Arch, ModelConfig};
use super::gguf::Gguf;
use super::gguf_adapter::AdapterLayout;
use crate::ops::cpu_projection::FrozenDtype;
use super::decoder::ProjectionFactory;
use crate::autograd::graph::TrainableModel;
use crate::Result;
use serde_json::Value;

/// Llama: pre-norm layers, SwiGLU, plain RMSNorm weights.
pub const LLAMA: Recipe = Recipe {
    norm: NormWeight::Plain,
    qk_norm: false,
    gated_attention: false,
    sandwich_norms: false,
    act: GateAct::Silu,
    scaled_embeddings: false,
};

/// Qwen3: Llama with per-head q/k RMSNorm.
pub const QWEN3: Recipe = Recipe { qk_norm: true, ..LLAMA };

/// The Llama family.
pub struct Llama;

impl Architecture for Llama {
    fn name(&self) -> &'static str {
        "Llama/Qwen3"
    }

    fn training_graph(&self, ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> Result<Box<dyn TrainableModel>> {
        let mut model = DecoderGraph::load_with(ckpt.tensors(), ckpt.config.clone(), make, tables)?;
        model.set_unfused_lora(unfused);
        Ok(Box::new(model))
    }

    /// Only the activation to check: every layer is full attention.
    fn read_hf_config(&self, json: &Value, _cfg: &mut ModelConfig) -> Result<()> {
        silu_only(json)
    }

    /// Llama's metadata keys are the shared ones.
    fn read_gguf_config(&self, _g: &Gguf, _cfg: &mut ModelConfig) -> Result<()> {
        Ok(())
    }

    /// llama.cpp stores Llama's q/k rows in its rotary permutation, not
    /// Qwen3's (NeoX-style rotation in Hugging Face's row order).
    fn gguf_adapter(&self, cfg: &ModelConfig) -> Result<AdapterLayout> {
        Ok(match cfg.arch {
            Arch::Qwen3 => AdapterLayout { arch: "qwen3", permuted_qk: false },
            _ => AdapterLayout { arch: "llama", permuted_qk: true },
        })
    }
}

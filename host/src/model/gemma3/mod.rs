//! Gemma 3 (text): local sliding-window attention layers and a global one
//! every sixth, each with its own RoPE base; per-head q/k RMSNorm; sandwich
//! norms (after attention and around the MLP); GeGLU (tanh GELU); token
//! embeddings scaled by `sqrt(hidden)`; RMSNorm as `(1 + w)`; tied head.
//! Its configuration is read by [`config`], its GGUF conventions undone by
//! [`gguf`]. Its layers run the one layer forward
//! ([`crate::model::layer`]) for decoding and training (in the attention
//! decoders' graph, [`crate::model::llama::DecoderGraph`]), which reads
//! Gemma 3's differences from Llama from its [`RECIPE`] and configuration.
pub mod config;
pub mod gguf;

use super::arch::{Architecture, Recipe};
use super::blocks::GateAct;
use crate::ops::rmsnorm::NormWeight;
use super::chat::ChatTemplate;
use super::checkpoint::Checkpoint;
use super::config::ModelConfig;
use super::gguf::Gguf;
use super::gguf_adapter::AdapterLayout;
use crate::ops::cpu_projection::FrozenDtype;
use super::decoder::ProjectionFactory;
use super::llama::DecoderGraph;
use crate::autograd::graph::TrainableModel;
use crate::Result;
use serde_json::Value;

/// Gemma 3's layers: `(1 + w)` norms, q/k norms, sandwich norms, GeGLU,
/// scaled embeddings (its sliding-window layers and their RoPE base come
/// from its configuration).
pub const RECIPE: Recipe = Recipe {
    norm: NormWeight::OnePlus,
    qk_norm: true,
    gated_attention: false,
    sandwich_norms: true,
    act: GateAct::GeluTanh,
    scaled_embeddings: true,
};

/// Gemma 3.
pub struct Gemma3;

impl Architecture for Gemma3 {
    fn name(&self) -> &'static str {
        "Gemma 3"
    }

    fn training_graph(&self, ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> Result<Box<dyn TrainableModel>> {
        let mut model = DecoderGraph::load_with(ckpt.tensors(), ckpt.config.clone(), make, tables)?;
        model.set_unfused_lora(unfused);
        Ok(Box::new(model))
    }

    fn read_hf_config(&self, json: &Value, cfg: &mut ModelConfig) -> Result<()> {
        config::read_hf(json, cfg)
    }

    fn read_gguf_config(&self, g: &Gguf, cfg: &mut ModelConfig) -> Result<()> {
        config::read_gguf(g, cfg)
    }

    /// Llama's GGUF tensor names; q/k rows not permuted (llama.cpp rotates
    /// Gemma 3 NeoX-style, in Hugging Face's row order).
    fn gguf_adapter(&self, _cfg: &ModelConfig) -> Result<AdapterLayout> {
        Ok(AdapterLayout { arch: "gemma3", permuted_qk: false })
    }

    /// Gemma's turn markers when a file carries no template.
    fn default_chat(&self) -> ChatTemplate {
        ChatTemplate::Gemma
    }
}

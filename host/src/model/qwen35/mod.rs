//! Qwen3.5: Gated DeltaNet layers ([`gdn`], its tape node [`gdn_node`])
//! interleaved with gated full-attention layers, its configuration
//! ([`config`]), its GGUF rewrites ([`gguf`]) and its training graph
//! ([`graph::Qwen35Graph`]). Both kinds of layer run the one layer forward
//! ([`crate::model::layer`]) for decoding and training.
pub mod config;
pub mod gdn;
pub mod gdn_node;
pub mod gguf;
pub mod graph;

pub use gdn::{gdn_decode, GdnState, GdnWeights, L2NORM_EPS};
pub use graph::Qwen35Graph;

use super::arch::{Architecture, Recipe};
use super::blocks::GateAct;
use crate::ops::rmsnorm::NormWeight;
use super::checkpoint::Checkpoint;
use super::config::ModelConfig;
use super::gguf::Gguf;
use super::gguf_adapter::AdapterLayout;
use crate::ops::cpu_projection::FrozenDtype;
use super::decoder::ProjectionFactory;
use crate::autograd::graph::TrainableModel;
use crate::{Error, Result};
use serde_json::Value;

/// Qwen3.5's attention layers (its GDN layers are [`gdn`]'s): `(1 + w)`
/// norms, q/k norms, a gated q_proj, SwiGLU.
pub const RECIPE: Recipe = Recipe {
    norm: NormWeight::OnePlus,
    qk_norm: true,
    gated_attention: true,
    sandwich_norms: false,
    act: GateAct::Silu,
    scaled_embeddings: false,
};

/// Qwen3.5.
pub struct Qwen35;

impl Architecture for Qwen35 {
    fn name(&self) -> &'static str {
        "Qwen3.5"
    }

    /// Embeddings and head stay f32 whatever `tables` says; there is no
    /// unfused mode.
    fn training_graph(&self, ckpt: &Checkpoint, make: &ProjectionFactory<'_>, _tables: FrozenDtype, _unfused: bool) -> Result<Box<dyn TrainableModel>> {
        Ok(Box::new(Qwen35Graph::load_with(ckpt.tensors(), ckpt.config.clone(), make)?))
    }

    fn hf_text<'a>(&self, json: &'a Value) -> Result<(&'a Value, &'static str)> {
        config::hf_text(json)
    }

    fn read_hf_config(&self, json: &Value, cfg: &mut ModelConfig) -> Result<()> {
        config::read_hf(json, cfg)
    }

    fn read_gguf_config(&self, g: &Gguf, cfg: &mut ModelConfig) -> Result<()> {
        config::read_gguf(g, cfg)
    }

    fn gguf_adapter(&self, _cfg: &ModelConfig) -> Result<AdapterLayout> {
        Err(Error::Unsupported("GGUF LoRA adapters for Qwen3.5 (its GGUF rewrites value heads and norms; only Llama, Qwen3 and Gemma 3 are exported)".into()))
    }

    fn has_unfused_mode(&self) -> bool {
        false
    }
}

//! Gemma 3 GGUF files as llama.cpp's converter writes them, read back in
//! Hugging Face convention (as [`crate::model::gguf::Gguf`] hands out every
//! architecture).
//!
//! What the metadata does not say (layer pattern, local RoPE base, score
//! scale) is read as [`super::config::read_gguf`] describes.
//! The converter stores every RMSNorm weight as `1 + w` (llama.cpp
//! multiplies by the stored weight; Gemma's norms multiply by `1 + w`), and
//! names the MLP's sandwich norms `ffn_norm` (before) and `post_ffw_norm`
//! (after). Both are undone here, as transformers' GGUF loader does.
use crate::model::gguf::{Conventions, Gguf, Rewrite, Rewritten};
use crate::model::source::{DType, RawTensor};
use crate::{Error, Result};

/// Hugging Face name (under `model.layers.N.`) of a Gemma 3 layer tensor
/// from its GGUF name after `blk.N.`, where it differs from Llama's.
pub fn hf_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        _ => return None,
    })
}

/// Whether the converter stored this GGUF tensor as `1 + w`: every RMSNorm
/// weight (residual-stream, sandwich, q/k and final norms).
pub fn stores_norm_offset(gguf_name: &str) -> bool {
    gguf_name.ends_with("norm.weight")
}

/// `w` from a stored `1 + w` (f32 `[n]`), as transformers' loader
/// computes it (`weights - 1` in f32).
pub fn undo_norm_offset(stored: &RawTensor<'_>) -> Result<Rewritten> {
    if stored.shape.len() != 1 {
        return Err(Error::format(&stored.name, format!("a norm weight must have one dim, got {:?}", stored.shape)));
    }
    let w: Vec<f32> = stored.to_f32()?.iter().map(|x| x - 1.0).collect();
    Ok(Rewritten { dtype: DType::F32, shape: stored.shape.clone(), bytes: w.iter().flat_map(|v| v.to_le_bytes()).collect() })
}

/// The conventions of `gemma3` files: the MLP norms' names, and every
/// RMSNorm weight stored as `1 + w`.
pub struct Gemma3Gguf;

impl Conventions for Gemma3Gguf {
    fn layer_name(&self, rest: &str) -> Option<&'static str> {
        hf_layer_name(rest)
    }

    fn rewrite(&self, _gguf: &Gguf, gguf_name: &str) -> Result<Option<Box<dyn Rewrite>>> {
        Ok(stores_norm_offset(gguf_name).then(|| Box::new(NormOffset) as Box<dyn Rewrite>))
    }
}

/// A norm weight stored as `1 + w`.
struct NormOffset;

impl Rewrite for NormOffset {
    fn apply(&self, _gguf: &Gguf, stored: &RawTensor<'_>) -> Result<Rewritten> {
        undo_norm_offset(stored)
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::hf_name_with;

    #[test]
    fn the_mlp_norms_have_names_of_their_own() {
        let name = |g: &str| hf_name_with(g, hf_layer_name);
        // ffn_norm comes before the MLP, post_ffw_norm after it.
        assert_eq!(name("blk.4.ffn_norm.weight"), "model.layers.4.pre_feedforward_layernorm.weight");
        assert_eq!(name("blk.4.post_ffw_norm.weight"), "model.layers.4.post_feedforward_layernorm.weight");
        assert_eq!(name("blk.4.post_attention_norm.weight"), "model.layers.4.post_attention_layernorm.weight");
        assert_eq!(name("blk.4.attn_q_norm.weight"), "model.layers.4.self_attn.q_norm.weight");
    }
}


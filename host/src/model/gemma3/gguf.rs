//! Gemma 3 GGUF files as llama.cpp's converter writes them, read back in
//! Hugging Face convention (as [`crate::model::gguf::Gguf`] hands out every
//! architecture).
//!
//! What the metadata does not say (layer pattern, local RoPE base, score
//! scale) is read as [`super::config::Gemma3Shape::from_gguf`] describes.
//! The converter stores every RMSNorm weight as `1 + w` (llama.cpp
//! multiplies by the stored weight; Gemma's norms multiply by `1 + w`), and
//! names the MLP's sandwich norms `ffn_norm` (before) and `post_ffw_norm`
//! (after). Both are undone here, as transformers' GGUF loader does.
use crate::model::qwen35::gguf::Rewritten;
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

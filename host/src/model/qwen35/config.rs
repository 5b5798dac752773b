//! Qwen3.5's configuration beyond the common fields: which layers are
//! Gated DeltaNet, the GDN sizes, the rotary width, from a Hugging Face
//! `config.json` (`qwen3_5_text`, or `qwen3_5` with the text model under
//! `text_config`) or from GGUF metadata as llama.cpp's loader reads it.
use crate::model::config::{check_layers, silu_only, Fields, GdnConfig, LayerKind, ModelConfig};
use crate::model::gguf::Gguf;
use crate::{Error, Result};
use serde_json::Value;

use super::gguf::Heads;

/// The text model's part of a `config.json` and the checkpoint prefix of
/// its decoder: the multimodal `qwen3_5` nests it under `text_config`.
pub fn hf_text(json: &Value) -> Result<(&Value, &'static str)> {
    if json.get("model_type").and_then(Value::as_str) != Some("qwen3_5") {
        return Ok((json, "model."));
    }
    let text = json.get("text_config").ok_or_else(|| Error::invalid("config.json", "qwen3_5 config without text_config"))?;
    Ok((text, "model.language_model."))
}

/// Layer types and GDN sizes of a `config.json`'s text part, into `cfg`
/// (whose common fields are read).
pub fn read_hf(json: &Value, cfg: &mut ModelConfig) -> Result<()> {
    silu_only(json)?;
    let f = Fields { json, what: "config.json" };
    cfg.layer_types = layer_types_from_json(json, cfg.num_layers)?;
    cfg.gdn = Some(GdnConfig {
        conv_kernel: f.usize_or("linear_conv_kernel_dim", 4)?,
        n_k_head: f.usize_or("linear_num_key_heads", 16)?,
        n_v_head: f.usize_or("linear_num_value_heads", 32)?,
        k_dim: f.usize_or("linear_key_head_dim", 128)?,
        v_dim: f.usize_or("linear_value_head_dim", 128)?,
    });
    Ok(())
}

/// `layer_types` (`full_attention` / `linear_attention`), or transformers'
/// default: every `full_attention_interval`-th layer is full attention.
fn layer_types_from_json(json: &Value, num_layers: usize) -> Result<Vec<LayerKind>> {
    match json.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some("full_attention") => Ok(LayerKind::FullAttention),
                Some("linear_attention") => Ok(LayerKind::LinearAttention),
                _ => Err(Error::invalid("config.json", format!("layer_types[{i}] = {v} (full_attention or linear_attention)"))),
            })
            .collect(),
        Some(v) => Err(Error::invalid("config.json", format!("layer_types must be an array, got {v}"))),
        None => {
            let interval = Fields { json, what: "config.json" }.usize_or("full_attention_interval", 4)?;
            Ok(interval_pattern(num_layers, interval))
        }
    }
}

/// Layer `i` is full attention iff `(i + 1) % interval == 0`.
fn interval_pattern(num_layers: usize, interval: usize) -> Vec<LayerKind> {
    (0..num_layers).map(|i| if (i + 1) % interval == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention }).collect()
}

/// Reads `qwen35.*` metadata as llama.cpp's loader does into `cfg`: the
/// decoder layers are `block_count` minus the appended MTP blocks, layer
/// types from `full_attention_interval`, GDN sizes from `ssm.*`, the
/// rotary width from `rope.dimension_count`.
pub fn read_gguf(g: &Gguf, cfg: &mut ModelConfig) -> Result<()> {
    let arch = g.architecture()?;
    let key = |k: &str| format!("{arch}.{k}");
    let optional = |k: &str, default: u32| -> Result<u32> {
        match g.value(&key(k)) {
            Some(_) => g.get_u32(&key(k)),
            None => Ok(default),
        }
    };
    let blocks = g.get_u32(&key("block_count"))? as usize;
    let mtp = optional("nextn_predict_layers", 0)? as usize;
    let interval = optional("full_attention_interval", 4)? as usize;
    if mtp >= blocks || interval == 0 {
        return Err(Error::invalid(
            "GGUF metadata",
            format!("{arch}: block_count {blocks}, nextn_predict_layers {mtp}, full_attention_interval {interval}"),
        ));
    }
    cfg.num_layers = check_layers(blocks - mtp, &key("block_count"))?;
    cfg.layer_types = interval_pattern(cfg.num_layers, interval);
    let h = Heads::from_gguf(g)?;
    cfg.gdn = Some(GdnConfig {
        conv_kernel: g.get_u32(&key("ssm.conv_kernel"))? as usize,
        n_k_head: h.n_k_head,
        n_v_head: h.n_v_head,
        k_dim: h.k_dim,
        v_dim: h.v_dim,
    });
    cfg.rotary_dim = g.get_u32(&key("rope.dimension_count"))? as usize;
    Ok(())
}

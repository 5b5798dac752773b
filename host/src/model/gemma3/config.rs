//! Gemma 3's configuration beyond the common fields, from GGUF metadata or
//! a Hugging Face `config.json` (`model_type = gemma3_text`, transformers'
//! `Gemma3TextConfig`).
//!
//! What a GGUF does not say, llama.cpp's loader fixes for `gemma3`, and
//! transformers' `Gemma3TextConfig` defaults to the same values:
//!
//! - every 6th layer (`(i + 1) % 6 == 0`) is global attention, the others
//!   local (sliding window `attention.sliding_window`);
//! - local layers rotate with RoPE base 10000, global ones with
//!   `rope.freq_base`;
//! - scores are scaled by `query_pre_attn_scalar^-1/2` with
//!   `query_pre_attn_scalar = head_dim`, except for the 62-layer 27B model,
//!   where llama.cpp (after gemma_pytorch) uses `hidden / heads`.
//!
//! Features the decoder does not implement (RoPE scaling, logit
//! soft-capping, bidirectional attention, another activation, value heads
//! of another width) are refused, naming the key.
use crate::model::config::{Fields, LayerKind, ModelConfig, SlidingWindow};
use crate::ops::rope::RopeScaling;
use crate::model::gguf::Gguf;
use crate::{Error, Result};
use serde_json::Value;

/// Every this many layers, one is global (llama.cpp's `set_swa_pattern(6)`,
/// transformers' `sliding_window_pattern` default).
const GLOBAL_EVERY: usize = 6;
/// RoPE base of the local layers (llama.cpp's `rope_freq_base_train_swa`,
/// transformers' default `rope_local_base_freq`).
const LOCAL_ROPE_THETA: f64 = 10_000.0;

/// The parts of a Gemma 3 [`ModelConfig`](crate::model::config::ModelConfig)
/// that the common fields do not carry.
#[derive(Clone, Debug, PartialEq)]
struct Gemma3Shape {
    /// Local and global layers.
    layer_types: Vec<LayerKind>,
    /// The local layers' window and RoPE base.
    sliding: SlidingWindow,
    /// The score scale's `query_pre_attn_scalar`.
    query_pre_attn_scalar: f64,
}

/// Reads a `gemma3_text` `config.json` into `cfg` (whose common fields are
/// read): layer types, window, both RoPE bases, the score scale, and
/// transformers' default of a tied head.
pub fn read_hf(json: &Value, cfg: &mut ModelConfig) -> Result<()> {
    let (shape, global_theta) = Gemma3Shape::from_hf_json(json, cfg.num_layers)?;
    cfg.rope_theta = global_theta;
    cfg.rope_scaling = RopeScaling::Default;
    cfg.rotary_dim = cfg.head_dim;
    cfg.tie_word_embeddings = Fields { json, what: "config.json" }.bool_or("tie_word_embeddings", true)?;
    shape.apply(cfg);
    Ok(())
}

/// Reads `gemma3.*` metadata into `cfg` (whose common fields are read).
pub fn read_gguf(g: &Gguf, cfg: &mut ModelConfig) -> Result<()> {
    Gemma3Shape::from_gguf(g, cfg.num_layers, cfg.hidden_size, cfg.n_head, cfg.head_dim)?.apply(cfg);
    Ok(())
}

/// `(i + 1) % every == 0` global, the rest local.
fn pattern(layers: usize, every: usize) -> Vec<LayerKind> {
    (0..layers).map(|i| if (i + 1) % every == 0 { LayerKind::FullAttention } else { LayerKind::SlidingAttention }).collect()
}

impl Gemma3Shape {
    fn apply(self, cfg: &mut ModelConfig) {
        cfg.layer_types = self.layer_types;
        cfg.sliding = Some(self.sliding);
        cfg.query_pre_attn_scalar = Some(self.query_pre_attn_scalar);
    }

    /// Reads `gemma3.*` metadata for a model of `layers` layers, `hidden`
    /// width and `n_head` heads of `head_dim`.
    fn from_gguf(g: &Gguf, layers: usize, hidden: usize, n_head: usize, head_dim: usize) -> Result<Self> {
        let arch = g.architecture()?;
        let key = |k: &str| format!("{arch}.{k}");
        refuse_unimplemented(g, &key)?;
        let window = g.get_u32(&key("attention.sliding_window"))? as usize;
        if window == 0 {
            return Err(Error::invalid("GGUF metadata", format!("{} is 0", key("attention.sliding_window"))));
        }
        // gemma_pytorch's 27B config scales by hidden / heads (168), every
        // other size by the head width.
        let scalar = if layers == 62 { hidden / n_head } else { head_dim };
        Ok(Gemma3Shape {
            layer_types: pattern(layers, GLOBAL_EVERY),
            sliding: SlidingWindow { window, rope_theta: LOCAL_ROPE_THETA },
            query_pre_attn_scalar: scalar as f64,
        })
    }

    /// Reads a `gemma3_text` `config.json` of `layers` layers; also returns
    /// the global layers' RoPE base.
    fn from_hf_json(json: &Value, layers: usize) -> Result<(Self, f64)> {
        let f = Fields { json, what: "config.json" };
        let act = f.str_or("hidden_activation", "gelu_pytorch_tanh")?;
        if act != "gelu_pytorch_tanh" {
            return Err(Error::Unsupported(format!("config.json: hidden_activation {act:?} (Gemma 3: gelu_pytorch_tanh only)")));
        }
        for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if f.opt(key).is_some() {
                return Err(Error::Unsupported(format!("config.json: {key} (logit soft-capping is not implemented)")));
            }
        }
        if f.bool_or("use_bidirectional_attention", false)? {
            return Err(Error::Unsupported("config.json: use_bidirectional_attention = true".into()));
        }
        let layer_types = match f.opt("layer_types") {
            Some(v) => layer_types(v, layers)?,
            None => pattern(layers, f.usize_or("sliding_window_pattern", GLOBAL_EVERY)?),
        };
        let global = rope_theta(json, "full_attention", "rope_theta", 1_000_000.0)?;
        let local = rope_theta(json, "sliding_attention", "rope_local_base_freq", LOCAL_ROPE_THETA)?;
        let shape = Gemma3Shape {
            layer_types,
            sliding: SlidingWindow { window: f.usize_or("sliding_window", 4096)?, rope_theta: local },
            query_pre_attn_scalar: f.f64_or("query_pre_attn_scalar", 256.0)?,
        };
        Ok((shape, global))
    }
}

/// `layer_types[i]`: `sliding_attention` or `full_attention`, one per layer.
fn layer_types(v: &Value, layers: usize) -> Result<Vec<LayerKind>> {
    let Some(a) = v.as_array().filter(|a| a.len() == layers) else {
        return Err(Error::invalid("config.json", format!("layer_types must be an array of {layers} entries, got {v}")));
    };
    a.iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("sliding_attention") => Ok(LayerKind::SlidingAttention),
            Some("full_attention") => Ok(LayerKind::FullAttention),
            _ => Err(Error::invalid("config.json", format!("layer_types[{i}] = {t} (sliding_attention or full_attention)"))),
        })
        .collect()
}

/// The RoPE base of one layer type: `rope_parameters[kind].rope_theta`
/// (transformers 5), else the older top-level `legacy_key`, else
/// `default`. Only plain RoPE (`rope_type = default`) is implemented.
fn rope_theta(json: &Value, kind: &str, legacy_key: &str, default: f64) -> Result<f64> {
    let top = Fields { json, what: "config.json" };
    let legacy = top.f64_or(legacy_key, default)?;
    let Some(p) = json.get("rope_parameters").and_then(|r| r.get(kind)).filter(|p| p.is_object()) else {
        return Ok(legacy);
    };
    let f = Fields { json: p, what: "config.json rope_parameters" };
    let rope_type = f.str_or("rope_type", "default")?;
    if rope_type != "default" {
        return Err(Error::Unsupported(format!("config.json: rope_parameters.{kind}.rope_type {rope_type:?} (default only)")));
    }
    f.f64_or("rope_theta", legacy)
}

/// Errors for metadata that asks for something the decoder does not do.
fn refuse_unimplemented(g: &Gguf, key: &dyn Fn(&str) -> String) -> Result<()> {
    let unsupported = |k: String, why: &str| Err(Error::Unsupported(format!("GGUF metadata {k}: {why}")));
    if let Some(v) = g.value(&key("rope.scaling.type")) {
        if v.as_str() != Some("none") {
            return unsupported(key("rope.scaling.type"), &format!("{v:?} (Gemma 3 RoPE scaling is not implemented)"));
        }
    }
    for k in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if g.value(&key(k)).is_some() {
            return unsupported(key(k), "logit soft-capping is not implemented (Gemma 3 has none)");
        }
    }
    if let (Some(_), Some(_)) = (g.value(&key("attention.key_length")), g.value(&key("attention.value_length"))) {
        let (k, v) = (g.get_u32(&key("attention.key_length"))?, g.get_u32(&key("attention.value_length"))?);
        if k != v {
            return unsupported(key("attention.value_length"), &format!("{v} differs from key_length {k}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::config::{LayerKind, ModelConfig};
    use serde_json::{json, Value};

    fn gemma3() -> Value {
        json!({"model_type": "gemma3_text", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
               "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
               "sliding_window": 3, "query_pre_attn_scalar": 24,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    }

    /// transformers' defaults where config.json is silent: every 6th layer
    /// global, tied embeddings.
    #[test]
    fn reads_gemma3_text_configs() {
        let c = ModelConfig::from_hf_json(&gemma3()).unwrap();
        assert_eq!(c.layer_types[..5], [LayerKind::SlidingAttention; 5]);
        assert_eq!(c.layer_types[5], LayerKind::FullAttention);
        assert_eq!((c.rope_theta, c.sliding.unwrap().rope_theta, c.sliding.unwrap().window), (1e6, 1e4, 3));
        assert_eq!((c.query_pre_attn_scalar, c.tie_word_embeddings, c.rotary_dim), (Some(24.0), true, 4));
    }

    #[test]
    fn unimplemented_gemma3_features_are_named() {
        let cases: Vec<(Value, &str)> = vec![
            ({ let mut j = gemma3(); j["final_logit_softcapping"] = json!(30.0); j }, "final_logit_softcapping"),
            ({ let mut j = gemma3(); j["hidden_activation"] = json!("gelu"); j }, "hidden_activation \"gelu\""),
            ({ let mut j = gemma3(); j["rope_parameters"]["full_attention"]["rope_type"] = json!("linear"); j }, "rope_parameters.full_attention.rope_type"),
            ({ let mut j = gemma3(); j["layer_types"] = json!(["full_attention"]); j }, "layer_types must be an array of 6"),
            ({ let mut j = gemma3(); j["layer_types"] = json!(vec!["x"; 6]); j }, "layer_types[0]"),
            ({ let mut j = gemma3(); j["use_bidirectional_attention"] = json!(true); j }, "use_bidirectional_attention"),
            ({ let mut j = gemma3(); j["sliding_window"] = json!(0); j }, "sliding_window must be a positive integer"),
            // Gemma 3 4B and larger scale RoPE linearly (an older config.json
            // says so at the top level): refused, never read as plain RoPE.
            ({ let mut j = gemma3(); j.as_object_mut().unwrap().remove("rope_parameters"); j["rope_scaling"] = json!({"rope_type": "linear", "factor": 8.0}); j }, "rope_type \"linear\""),
        ];
        for (cfg, want) in cases {
            let err = ModelConfig::from_hf_json(&cfg).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}

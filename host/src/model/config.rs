//! Architecture hyper-parameters, read from a Hugging Face `config.json` or
//! from GGUF metadata into one [`ModelConfig`]. Every missing or
//! inconsistent field is an error naming it; values we do not implement
//! (biases, other rope types, other activations) are `Unsupported`, never
//! silently ignored.
use crate::model::arch::by_arch;
use crate::model::gguf::Gguf;
use crate::model::source::TensorSource;
use crate::ops::rope::{rope_inv_freq, RopeScaling};
use crate::{Error, Result};
use serde_json::Value;

/// The architectures hexlora runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3 family (SmolLM2, Llama-3.2).
    Llama,
    /// Qwen3: Llama plus per-head q/k RMSNorm.
    Qwen3,
    /// Qwen3.5 text: Gated DeltaNet layers interleaved with gated attention.
    Qwen35,
    /// Gemma 3 text: local (sliding-window) and global attention layers,
    /// sandwich norms, GeGLU, scaled embeddings.
    Gemma3,
}

/// What mixes tokens in one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Softmax attention with a KV cache.
    FullAttention,
    /// Softmax attention over the last [`SlidingWindow::window`] positions
    /// only, with its own RoPE base (Gemma 3's local layers); the KV cache
    /// keeps no more than the window.
    SlidingAttention,
    /// Gated DeltaNet (recurrent state).
    LinearAttention,
}

/// What the [`LayerKind::SlidingAttention`] layers use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query sees, itself included: query `i` attends to keys
    /// `j` with `i - window < j <= i` (transformers' `sliding_window`).
    pub window: usize,
    /// RoPE base of these layers (Gemma 3: 10000, against 1e6 globally).
    pub rope_theta: f64,
}

/// Gated DeltaNet sizes (Qwen3.5 `linear_*` fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnConfig {
    /// Depthwise conv kernel length (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Query/key heads.
    pub n_k_head: usize,
    /// Value heads.
    pub n_v_head: usize,
    /// Key width per head.
    pub k_dim: usize,
    /// Value width per head.
    pub v_dim: usize,
}

impl GdnConfig {
    /// `n_k_head * k_dim`.
    pub fn key_dim(&self) -> usize {
        self.n_k_head * self.k_dim
    }
    /// `n_v_head * v_dim`.
    pub fn value_dim(&self) -> usize {
        self.n_v_head * self.v_dim
    }
    /// Channels of the causal conv: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// Everything a model needs to know about its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Which architecture.
    pub arch: Arch,
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Attention query heads.
    pub n_head: usize,
    /// Attention key/value heads.
    pub n_kv_head: usize,
    /// Attention head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Rotated features per head (`head_dim * partial_rotary_factor`).
    pub rotary_dim: usize,
    /// `lm_head` shares the embedding table.
    pub tie_word_embeddings: bool,
    /// Per-layer token mixer.
    pub layer_types: Vec<LayerKind>,
    /// Gated DeltaNet sizes (Qwen3.5 only).
    pub gdn: Option<GdnConfig>,
    /// Checkpoint name prefix of the decoder (`model.`, or
    /// `model.language_model.` in Qwen3.5's multimodal checkpoints).
    pub prefix: String,
    /// End-of-sequence token ids (generation stops on any).
    pub eos_token_ids: Vec<u32>,
    /// Window and RoPE base of the [`LayerKind::SlidingAttention`] layers.
    pub sliding: Option<SlidingWindow>,
    /// Attention scores are scaled by `query_pre_attn_scalar^-1/2`
    /// (Gemma 3); `None` means `head_dim^-1/2`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Positions the model was trained for (`max_position_embeddings`,
    /// GGUF `context_length`; [`DEFAULT_POSITIONS`] when the file has none):
    /// no prompt, example or answer may be longer.
    pub max_position_embeddings: usize,
}

/// Positions assumed when a checkpoint does not say how many it holds.
pub const DEFAULT_POSITIONS: usize = 8192;

/// Bounds on the sizes a checkpoint may declare, checked before anything is
/// allocated from them (a corrupt `num_hidden_layers` of 10^7 would
/// otherwise cost gigabytes before the missing tensors are noticed).
pub mod limits {
    /// Decoder layers.
    pub const LAYERS: usize = 1024;
    /// Residual width, MLP width, head width.
    pub const WIDTH: usize = 1 << 18;
    /// Attention heads (query or key/value).
    pub const HEADS: usize = 1024;
    /// Vocabulary rows.
    pub const VOCAB: usize = 1 << 22;
    /// Positions.
    pub const POSITIONS: usize = 1 << 24;
}

/// `n` decoder layers as read from `field`, checked against
/// [`limits::LAYERS`] before any per-layer vector is built.
pub fn check_layers(n: usize, field: &str) -> Result<usize> {
    if (1..=limits::LAYERS).contains(&n) {
        Ok(n)
    } else {
        Err(Error::invalid("model config", format!("{field} is {n}; it must be 1 to {}", limits::LAYERS)))
    }
}

/// Field access with errors that name the field.
pub(crate) struct Fields<'a> {
    pub(crate) json: &'a Value,
    pub(crate) what: &'a str,
}

impl Fields<'_> {
    pub(crate) fn opt(&self, key: &str) -> Option<&Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }
    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        let v = self.opt(key).ok_or_else(|| Error::invalid(self.what, format!("missing field {key}")))?;
        v.as_u64()
            .filter(|&x| x > 0)
            .map(|x| x as usize)
            .ok_or_else(|| Error::invalid(self.what, format!("{key} must be a positive integer, got {v}")))
    }
    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        if self.opt(key).is_some() {
            self.usize(key)
        } else {
            Ok(default)
        }
    }
    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| Error::invalid(self.what, format!("{key} must be a finite number, got {v}"))),
        }
    }
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| Error::invalid(self.what, format!("{key} must be a bool, got {v}"))),
        }
    }
    pub(crate) fn str_or<'b>(&'b self, key: &str, default: &'b str) -> Result<&'b str> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| Error::invalid(self.what, format!("{key} must be a string, got {v}"))),
        }
    }
}

/// Refuses a `config.json` whose `hidden_act` is not `silu` (SwiGLU's
/// activation; the Llama family's and Qwen3.5's only one here).
pub(crate) fn silu_only(json: &Value) -> Result<()> {
    let f = Fields { json, what: "config.json" };
    let act = f.str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(Error::Unsupported(format!("config.json: hidden_act {act:?} (only silu)")));
    }
    Ok(())
}

impl ModelConfig {
    /// From a parsed Hugging Face `config.json`: the fields every
    /// architecture shares here, the rest by its folder
    /// ([`crate::model::arch::Architecture::read_hf_config`]).
    pub fn from_hf_json(json: &Value) -> Result<Self> {
        let model_type = json.get("model_type").and_then(Value::as_str).ok_or_else(|| {
            Error::invalid("config.json", "missing model_type (expected llama, qwen3, qwen3_5, qwen3_5_text or gemma3_text)")
        })?;
        let arch = match model_type {
            "llama" => Arch::Llama,
            "gemma3_text" => Arch::Gemma3,
            "qwen3" => Arch::Qwen3,
            "qwen3_5" | "qwen3_5_text" => Arch::Qwen35,
            other => {
                return Err(Error::Unsupported(format!(
                    "model_type {other:?} (hexlora runs llama, qwen3, qwen3_5, qwen3_5_text and gemma3_text)"
                )))
            }
        };
        let reader = by_arch(arch);
        let (text, prefix) = reader.hf_text(json)?;
        let mut cfg = Self::common_from_json(text, arch, prefix)?;
        reader.read_hf_config(text, &mut cfg)?;
        // The top level's tying flag decides: a multimodal wrapper carries it
        // there, and for a plain text config it is the field just read.
        if let Some(t) = json.get("tie_word_embeddings").and_then(Value::as_bool) {
            cfg.tie_word_embeddings = t;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The shared fields of a text model's `config.json`; every layer full
    /// attention until the architecture says otherwise.
    fn common_from_json(json: &Value, arch: Arch, prefix: &str) -> Result<Self> {
        let f = Fields { json, what: "config.json" };
        for flag in ["attention_bias", "mlp_bias"] {
            if f.bool_or(flag, false)? {
                return Err(Error::Unsupported(format!("config.json: {flag} = true")));
            }
        }
        let hidden_size = f.usize("hidden_size")?;
        let n_head = f.usize("num_attention_heads")?;
        let head_dim = f.usize_or("head_dim", hidden_size / n_head)?;
        let num_layers = check_layers(f.usize("num_hidden_layers")?, "num_hidden_layers")?;
        let (rope_theta, rope_scaling, partial) = rope_from_json(json)?;
        Ok(ModelConfig {
            arch,
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_layers,
            n_head,
            n_kv_head: f.usize_or("num_key_value_heads", n_head)?,
            head_dim,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)? as f32,
            rope_theta,
            rope_scaling,
            rotary_dim: (head_dim as f64 * partial) as usize,
            // transformers' class default (a saved config.json omits it).
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            layer_types: vec![LayerKind::FullAttention; num_layers],
            gdn: None,
            prefix: prefix.into(),
            eos_token_ids: eos_from_json(json),
            sliding: None,
            query_pre_attn_scalar: None,
            max_position_embeddings: f.usize_or("max_position_embeddings", DEFAULT_POSITIONS)?,
        })
    }

    /// From GGUF metadata (`general.architecture` = `llama`, `qwen3`,
    /// `qwen35` or `gemma3`): the keys every architecture shares, the rest
    /// by its folder ([`crate::model::arch::Architecture::read_gguf_config`]); `lm_head` is tied
    /// when the file has no `output.weight`.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch_name = g.architecture()?.to_string();
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "qwen3" => Arch::Qwen3,
            "qwen35" => Arch::Qwen35,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(Error::Unsupported(format!(
                    "GGUF architecture {other:?} (hexlora reads llama, qwen3, qwen35 and gemma3 GGUF files)"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let optional_u32 = |k: &str| -> Result<Option<usize>> {
            match g.value(&key(k)) {
                Some(_) => Ok(Some(g.get_u32(&key(k))? as usize)),
                None => Ok(None),
            }
        };
        let hidden_size = g.get_u32(&key("embedding_length"))? as usize;
        let n_head = g.get_u32(&key("attention.head_count"))? as usize;
        if n_head == 0 {
            return Err(Error::invalid("GGUF metadata", format!("{} is 0", key("attention.head_count"))));
        }
        let head_dim = optional_u32("attention.key_length")?.unwrap_or(hidden_size / n_head);
        let vocab_size = match optional_u32("vocab_size")? {
            Some(v) => v,
            None => g.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = match g.value(&key("rope.freq_base")) {
            Some(_) => g.get_f32(&key("rope.freq_base"))? as f64,
            None => 10000.0,
        };
        let num_layers = check_layers(g.get_u32(&key("block_count"))? as usize, &key("block_count"))?;
        let mut cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: g.get_u32(&key("feed_forward_length"))? as usize,
            num_layers,
            n_head,
            n_kv_head: optional_u32("attention.head_count_kv")?.unwrap_or(n_head),
            head_dim,
            rms_norm_eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            // llama3-scaled GGUFs (Llama-3.1/3.2) carry no scaling metadata,
            // only `rope_freqs.weight`.
            rope_scaling: if g.tensor_infos().iter().any(|t| t.name == "rope_freqs.weight") {
                let factors = g.get("rope_freqs.weight")?.to_f32()?;
                llama3_from_freq_factors(&factors, head_dim, rope_theta)?
            } else {
                RopeScaling::Default
            },
            rotary_dim: head_dim,
            tie_word_embeddings: !g.tensor_infos().iter().any(|t| t.name == "output.weight"),
            layer_types: vec![LayerKind::FullAttention; num_layers],
            gdn: None,
            prefix: "model.".into(),
            eos_token_ids: g.get_u32("tokenizer.ggml.eos_token_id").ok().into_iter().collect(),
            sliding: None,
            query_pre_attn_scalar: None,
            max_position_embeddings: optional_u32("context_length")?.unwrap_or(DEFAULT_POSITIONS),
        };
        by_arch(arch).read_gguf_config(g, &mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The factor on attention scores: `query_pre_attn_scalar^-1/2` taken
    /// in f64 then rounded (Gemma 3, as PyTorch), else `head_dim^-1/2`.
    /// The inference decoder and the training graph both read it here.
    pub fn attention_scale(&self) -> f32 {
        self.query_pre_attn_scalar.map_or(1.0 / (self.head_dim as f32).sqrt(), |s| s.powf(-0.5) as f32)
    }

    /// Cross-field checks: heads divide evenly, rotary fits the head.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("model config", msg));
        check_layers(self.num_layers, "the layer count")?;
        let sizes = [
            ("vocab_size", self.vocab_size, limits::VOCAB),
            ("hidden_size", self.hidden_size, limits::WIDTH),
            ("intermediate_size", self.intermediate_size, limits::WIDTH),
            ("head_dim", self.head_dim, limits::WIDTH),
            ("num_attention_heads", self.n_head, limits::HEADS),
            ("num_key_value_heads", self.n_kv_head, limits::HEADS),
            ("max_position_embeddings", self.max_position_embeddings, limits::POSITIONS),
        ];
        for (field, v, max) in sizes {
            if !(1..=max).contains(&v) {
                return bad(format!("{field} is {v}; it must be 1 to {max}"));
            }
        }
        if let Some(g) = &self.gdn {
            for (field, v) in [("linear_num_key_heads", g.n_k_head), ("linear_num_value_heads", g.n_v_head), ("linear_key_head_dim", g.k_dim), ("linear_value_head_dim", g.v_dim)] {
                if !(1..=limits::WIDTH).contains(&v) {
                    return bad(format!("{field} is {v}; it must be 1 to {}", limits::WIDTH));
                }
            }
        }
        if self.n_kv_head == 0 || self.n_head % self.n_kv_head != 0 {
            return bad(format!("num_attention_heads {} is not a multiple of num_key_value_heads {}", self.n_head, self.n_kv_head));
        }
        if self.rotary_dim % 2 != 0 || self.rotary_dim > self.head_dim || self.rotary_dim == 0 {
            return bad(format!("rotary dim {} must be even, non-zero and <= head_dim {}", self.rotary_dim, self.head_dim));
        }
        if self.layer_types.len() != self.num_layers {
            return bad(format!("{} layer_types for {} layers", self.layer_types.len(), self.num_layers));
        }
        if !(self.rms_norm_eps > 0.0) {
            return bad(format!("rms_norm_eps {} must be positive", self.rms_norm_eps));
        }
        let sliding_layers = self.layer_types.iter().any(|k| *k == LayerKind::SlidingAttention);
        match self.sliding {
            None if sliding_layers => return bad("sliding-window layers without a sliding_window".into()),
            Some(s) if !(1..=limits::POSITIONS).contains(&s.window) => {
                return bad(format!("sliding_window is {}; it must be 1 to {}", s.window, limits::POSITIONS))
            }
            Some(s) if !(s.rope_theta.is_finite() && s.rope_theta > 0.0) => {
                return bad(format!("the sliding layers' rope_theta {} must be positive", s.rope_theta))
            }
            _ => {}
        }
        if let Some(q) = self.query_pre_attn_scalar {
            if !(q.is_finite() && q > 0.0) {
                return bad(format!("query_pre_attn_scalar {q} must be positive"));
            }
        }
        if let Some(g) = &self.gdn {
            if g.n_v_head % g.n_k_head != 0 {
                return bad(format!("linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", g.n_v_head, g.n_k_head));
            }
            if g.conv_kernel < 1 {
                return bad("linear_conv_kernel_dim must be >= 1".into());
            }
        }
        Ok(())
    }
}

/// The llama3 scaling behind a GGUF `rope_freqs.weight`.
///
/// llama.cpp's converter stores, per rotary frequency `i`, the divisor
/// `f_i` of `theta^(-2i/rot_dim)`: 1 for short wavelengths, `factor` for
/// long ones, `1 / ((1 - s) / factor + s)` between, where the blend `s` is
/// linear in 1/wavelength. So `factor = max f_i`, and two blended divisors
/// fix the line `s = a / wavelength + b`, which is all the other three
/// llama3 parameters contribute: we take `high - low = 1`, so
/// `original = a`, `low = -b`, `high = 1 - b`. The result is checked by
/// recomputing every frequency; divisors that are not this formula (or
/// have fewer than two blended entries to fit) are refused.
pub fn llama3_from_freq_factors(factors: &[f32], rot_dim: usize, theta: f64) -> Result<RopeScaling> {
    let unsupported = |why: String| Err(Error::Unsupported(format!("GGUF rope_freqs.weight: {why}")));
    if factors.len() != rot_dim / 2 {
        return unsupported(format!("{} values for {} rotary frequencies", factors.len(), rot_dim / 2));
    }
    if factors.iter().any(|f| !(f.is_finite() && *f >= 1.0 - 1e-6)) {
        return unsupported("divisors must be finite and >= 1 (llama3 scaling)".into());
    }
    let factor = factors.iter().fold(1.0f64, |m, &f| m.max(f as f64));
    if factor <= 1.0 + 1e-6 {
        return Ok(RopeScaling::Default);
    }
    let wavelen = |i: usize| 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / rot_dim as f64);
    let blend = |f: f64| (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor);
    let mixed: Vec<usize> =
        (0..factors.len()).filter(|&i| (factors[i] as f64 - 1.0).min(factor - factors[i] as f64) > 1e-4 * factor).collect();
    let (Some(&p), Some(&q)) = (mixed.first(), mixed.last()) else {
        return unsupported("fewer than two blended frequencies: cannot recover the llama3 parameters".into());
    };
    if p == q {
        return unsupported("fewer than two blended frequencies: cannot recover the llama3 parameters".into());
    }
    let (sp, sq) = (blend(factors[p] as f64), blend(factors[q] as f64));
    let a = (sp - sq) / (1.0 / wavelen(p) - 1.0 / wavelen(q));
    let b = sp - a / wavelen(p);
    let scaling = RopeScaling::Llama3 { factor, low_freq_factor: -b, high_freq_factor: 1.0 - b, original_max_position_embeddings: a };
    if !(a > 0.0 && b < 0.0) {
        return unsupported(format!("blend line a={a}, b={b} is not a llama3 scaling"));
    }
    let inv = rope_inv_freq(rot_dim, theta, &scaling);
    for (i, (&got, &f)) in inv.iter().zip(factors).enumerate() {
        let want = 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64) / f as f64;
        if (got as f64 - want).abs() > 1e-5 * want {
            return unsupported(format!("frequency {i} divisor {f} does not follow the llama3 formula"));
        }
    }
    Ok(scaling)
}

/// `(rope_theta, scaling, partial_rotary_factor)` from transformers 5's
/// `rope_parameters` or the older top-level `rope_theta` + `rope_scaling`.
fn rope_from_json(json: &Value) -> Result<(f64, RopeScaling, f64)> {
    let top = Fields { json, what: "config.json" };
    let params = json
        .get("rope_parameters")
        .filter(|v| v.is_object())
        .or_else(|| json.get("rope_scaling").filter(|v| v.is_object()));
    let theta_default = top.f64_or("rope_theta", 10000.0)?;
    let partial_default = top.f64_or("partial_rotary_factor", 1.0)?;
    let Some(p) = params else { return Ok((theta_default, RopeScaling::Default, partial_default)) };
    let f = Fields { json: p, what: "config.json rope_parameters" };
    let theta = f.f64_or("rope_theta", theta_default)?;
    let partial = f.f64_or("partial_rotary_factor", partial_default)?;
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(Error::invalid("config.json", format!("partial_rotary_factor {partial} not in (0, 1]")));
    }
    let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "llama3" => RopeScaling::Llama3 {
            factor: f.f64_or("factor", f64::NAN)?,
            low_freq_factor: f.f64_or("low_freq_factor", f64::NAN)?,
            high_freq_factor: f.f64_or("high_freq_factor", f64::NAN)?,
            original_max_position_embeddings: f.f64_or("original_max_position_embeddings", f64::NAN)?,
        },
        other => return Err(Error::Unsupported(format!("config.json: rope_type {other:?} (default and llama3 only)"))),
    };
    if let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } = scaling {
        let all = [factor, low_freq_factor, high_freq_factor, original_max_position_embeddings];
        if all.iter().any(|x| !x.is_finite() || *x <= 0.0) || high_freq_factor <= low_freq_factor {
            return Err(Error::invalid(
                "config.json rope_parameters",
                "llama3 needs positive factor, low_freq_factor < high_freq_factor, original_max_position_embeddings",
            ));
        }
    }
    Ok((theta, scaling, partial))
}

fn eos_from_json(json: &Value) -> Vec<u32> {
    match json.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn llama() -> Value {
        json!({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    }

    /// A llama GGUF with llama.cpp's `rope_freqs.weight` (Llama-3.2-3B rope
    /// hyper-parameters) gives the inverse frequencies transformers computes
    /// from the HF config (fixture: make_model_fixtures.py rope-freqs).
    #[test]
    fn gguf_rope_freqs_give_transformers_llama3_frequencies() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama3-rope-freqs");
        let want: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        let want: Vec<f64> = want["transformers_inv_freq"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let c = ModelConfig::from_gguf(&Gguf::open(&dir.join("rope.gguf")).unwrap()).unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0), "{:?}", c.rope_scaling);
        let got = rope_inv_freq(c.rotary_dim, c.rope_theta, &c.rope_scaling);
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - w).abs() <= 2e-6 * w, "frequency {i}: {g} vs transformers {w}");
        }
    }

    /// The fixture's Llama-3.2 divisors with divisor `i` scaled by `by`.
    fn llama32_factors_with(i: usize, by: f32) -> Vec<f32> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/llama3-rope-freqs/expected.json");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut f: Vec<f32> = v["rope_freqs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        f[i] *= by;
        f
    }

    #[test]
    fn rope_freqs_that_are_not_llama3_are_refused() {
        let ones = vec![1.0f32; 64];
        assert_eq!(llama3_from_freq_factors(&ones, 128, 500000.0).unwrap(), RopeScaling::Default);
        let mut bumpy = ones.clone();
        bumpy[10] = 2.0;
        bumpy[11] = 1.5;
        bumpy[40] = 3.0;
        let cases: Vec<(Vec<f32>, &str)> = vec![
            (vec![1.0; 10], "10 values for 64"),
            ({ let mut v = ones.clone(); v[3] = f32::NAN; v }, "finite and >= 1"),
            ({ let mut v = ones.clone(); v[3] = 0.5; v }, "finite and >= 1"),
            ({ let mut v = ones.clone(); v[40..].fill(8.0); v }, "fewer than two blended"),
            (bumpy, "is not a llama3 scaling"),
            (llama32_factors_with(31, 1.01), "frequency 31 divisor"),
        ];
        for (factors, want) in cases {
            let err = llama3_from_freq_factors(&factors, 128, 500000.0).unwrap_err().to_string();
            assert!(err.contains("rope_freqs") && err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn reads_older_rope_scaling_layout() {
        let c = ModelConfig::from_hf_json(&llama()).unwrap();
        assert_eq!((c.head_dim, c.rotary_dim, c.rope_theta), (4, 4, 500000.0));
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
        assert!(!c.tie_word_embeddings, "transformers' default");
    }

    #[test]
    fn wrong_configs_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"model_type": "gpt2"}), "model_type \"gpt2\""),
            (json!({"hidden_size": 8}), "missing model_type"),
            ({ let mut j = llama(); j.as_object_mut().unwrap().remove("vocab_size"); j }, "missing field vocab_size"),
            ({ let mut j = llama(); j["num_key_value_heads"] = json!(3); j }, "not a multiple of num_key_value_heads 3"),
            ({ let mut j = llama(); j["hidden_size"] = json!(-8); j }, "hidden_size must be a positive integer"),
            ({ let mut j = llama(); j["attention_bias"] = json!(true); j }, "attention_bias"),
            ({ let mut j = llama(); j["rope_scaling"]["rope_type"] = json!("yarn"); j }, "rope_type \"yarn\""),
            ({ let mut j = llama(); j["rope_scaling"]["factor"] = json!(null); j }, "llama3 needs"),
        ];
        for (cfg, want) in cases {
            let err = ModelConfig::from_hf_json(&cfg).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn qwen35_layer_types_default_and_nested_text_config() {
        let text = json!({"model_type": "qwen3_5_text", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 8, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}});
        let c = ModelConfig::from_hf_json(&json!({"model_type": "qwen3_5", "text_config": text})).unwrap();
        assert_eq!(c.prefix, "model.language_model.");
        assert_eq!(c.rotary_dim, 2);
        let full: Vec<usize> =
            c.layer_types.iter().enumerate().filter(|(_, k)| **k == LayerKind::FullAttention).map(|(i, _)| i).collect();
        assert_eq!(full, [3, 7]);
    }
}

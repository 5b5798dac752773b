//! One declarative description per architecture: which frozen projections a
//! model has (name, shape, kind), which other checkpoint tensors it reads,
//! and the non-projection ops each layer runs. The inference decoder and
//! the training graphs are built from it, and the loader checks a
//! checkpoint against it; the NPU's precision per projection kind is
//! [`crate::npu::PrecisionPolicy`]'s.
use crate::model::arch::{self, Recipe};
use crate::model::blocks::GateAct;
use crate::model::config::{Arch, LayerKind, ModelConfig};
use crate::model::source::TensorSource;
use crate::ops::rmsnorm::NormWeight;
use crate::projection::{ProjectionInfo, ProjectionKind};
use crate::{Error, Result};

/// A non-projection op of a layer, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RMSNorm of the residual stream.
    RmsNorm(NormWeight),
    /// RMSNorm of each attention head (Qwen3 / Qwen3.5 q_norm, k_norm).
    HeadRmsNorm(NormWeight),
    /// Rotary embedding of the first `rotary_dim` features of q and k.
    Rope {
        /// Rotated features per head.
        rotary_dim: usize,
    },
    /// Causal GQA softmax attention with a KV cache.
    Attention,
    /// [`Op::Attention`] over the last `window` positions only.
    SlidingAttention {
        /// Positions each query sees, itself included.
        window: usize,
    },
    /// Attention output times `sigmoid(gate)` (Qwen3.5's q_proj emits the gate).
    OutputGate,
    /// `silu(gate) * up`.
    SwiGlu,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeGlu,
    /// Depthwise causal conv over time, then SiLU.
    CausalConv1dSilu,
    /// L2 normalisation of GDN q and k heads.
    L2Norm,
    /// `g = -exp(A_log) softplus(a + dt_bias)`, `beta = sigmoid(b)`.
    GdnGates,
    /// The gated delta-rule recurrence (f32 state).
    DeltaRule,
    /// RMSNorm (plain `w`) times `silu(z)`.
    GatedRmsNorm,
    /// Adds the block output to the residual stream.
    Residual,
}

/// A checkpoint tensor that is not a projection (norm weights, conv, gates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Full checkpoint name.
    pub name: String,
    /// Expected shape (Hugging Face order).
    pub shape: Vec<usize>,
}

/// One decoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerDesc {
    /// Token mixer.
    pub kind: LayerKind,
    /// Frozen projections, in execution order.
    pub projections: Vec<ProjectionInfo>,
    /// Other tensors the layer reads.
    pub tensors: Vec<TensorSpec>,
    /// Non-projection ops, in execution order.
    pub ops: Vec<Op>,
}

/// A whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    /// Architecture.
    pub arch: Arch,
    /// RMSNorm convention of the residual-stream and q/k norms.
    pub norm: NormWeight,
    /// Token embedding table `[vocab, hidden]`.
    pub embed: TensorSpec,
    /// Final norm weight `[hidden]`.
    pub final_norm: TensorSpec,
    /// Separate `lm_head.weight`, or `None` when tied to the embedding.
    pub lm_head: Option<TensorSpec>,
    /// Decoder layers.
    pub layers: Vec<LayerDesc>,
}

fn proj(name: String, kind: ProjectionKind, in_features: usize, out_features: usize) -> ProjectionInfo {
    ProjectionInfo { name, kind, in_features, out_features }
}

fn spec(name: String, shape: &[usize]) -> TensorSpec {
    TensorSpec { name, shape: shape.to_vec() }
}

impl Descriptor {
    /// The descriptor for `cfg`'s architecture and sizes.
    pub fn new(cfg: &ModelConfig) -> Self {
        let recipe = arch::recipe(cfg.arch);
        let norm = recipe.norm;
        let (h, p) = (cfg.hidden_size, &cfg.prefix);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let lp = format!("{p}layers.{i}.");
                let mut d = match cfg.layer_types[i] {
                    LayerKind::FullAttention | LayerKind::SlidingAttention => attention_layer(cfg, recipe, &lp, cfg.layer_types[i]),
                    LayerKind::LinearAttention => gdn_layer(cfg, &lp),
                };
                d.projections.extend(mlp(cfg, &lp));
                let mlp_op = match recipe.act {
                    GateAct::Silu => Op::SwiGlu,
                    GateAct::GeluTanh => Op::GeGlu,
                };
                if recipe.sandwich_norms {
                    sandwich_norms(cfg, &lp, norm, mlp_op, &mut d);
                } else {
                    pre_norms(cfg, &lp, norm, mlp_op, &mut d);
                }
                d
            })
            .collect();
        Descriptor {
            arch: cfg.arch,
            norm,
            embed: spec(format!("{p}embed_tokens.weight"), &[cfg.vocab_size, h]),
            final_norm: spec(format!("{p}norm.weight"), &[h]),
            lm_head: (!cfg.tie_word_embeddings).then(|| spec("lm_head.weight".into(), &[cfg.vocab_size, h])),
            layers,
        }
    }

    /// Every frozen projection, layer by layer.
    pub fn projections(&self) -> impl Iterator<Item = &ProjectionInfo> {
        self.layers.iter().flat_map(|l| l.projections.iter())
    }

    /// Every checkpoint tensor the model reads, with its expected shape.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut all = vec![self.embed.clone(), self.final_norm.clone()];
        all.extend(self.lm_head.clone());
        for l in &self.layers {
            all.extend(l.projections.iter().map(|p| spec(format!("{}.weight", p.name), &[p.out_features, p.in_features])));
            all.extend(l.tensors.iter().cloned());
        }
        all
    }

    /// Checks that `src` holds every tensor with the expected element count
    /// (GGUF and safetensors agree on counts; conv weights may be stored
    /// `[C, 1, K]` or `[C, K]`). All problems are reported at once.
    pub fn check(&self, src: &dyn TensorSource) -> Result<()> {
        let names: std::collections::HashSet<String> = src.names().into_iter().collect();
        let mut problems = Vec::new();
        for t in self.tensors() {
            if !names.contains(&t.name) {
                problems.push(format!("missing tensor {} (expected shape {:?})", t.name, t.shape));
                continue;
            }
            let raw = src.get(&t.name)?;
            let want: usize = t.shape.iter().product();
            if raw.shape.iter().product::<usize>() != want {
                problems.push(format!("tensor {} has shape {:?}, expected {:?}", t.name, raw.shape, t.shape));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        let shown = problems.len().min(8);
        let more = if problems.len() > shown { format!(" (and {} more)", problems.len() - shown) } else { String::new() };
        Err(Error::format(
            format!("{:?} checkpoint", self.arch),
            format!("{}{more}", problems[..shown].join("; ")),
        ))
    }
}

/// Llama's layer: `x += mixer(norm(x)); x += mlp(norm(x))`, the second
/// norm named `post_attention_layernorm`.
fn pre_norms(cfg: &ModelConfig, lp: &str, norm: NormWeight, mlp_op: Op, d: &mut LayerDesc) {
    let h = cfg.hidden_size;
    d.tensors.insert(0, spec(format!("{lp}input_layernorm.weight"), &[h]));
    d.tensors.push(spec(format!("{lp}post_attention_layernorm.weight"), &[h]));
    d.ops.splice(0..0, [Op::RmsNorm(norm)]);
    d.ops.extend([Op::Residual, Op::RmsNorm(norm), mlp_op, Op::Residual]);
}

/// Gemma's layer: `x += norm(attn(norm(x))); x += norm(mlp(norm(x)))`,
/// with transformers' names for the four norms.
fn sandwich_norms(cfg: &ModelConfig, lp: &str, norm: NormWeight, mlp_op: Op, d: &mut LayerDesc) {
    let h = cfg.hidden_size;
    d.tensors.insert(0, spec(format!("{lp}input_layernorm.weight"), &[h]));
    for name in ["post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
        d.tensors.push(spec(format!("{lp}{name}.weight"), &[h]));
    }
    d.ops.splice(0..0, [Op::RmsNorm(norm)]);
    d.ops.extend([Op::RmsNorm(norm), Op::Residual, Op::RmsNorm(norm), mlp_op, Op::RmsNorm(norm), Op::Residual]);
}

fn attention_layer(cfg: &ModelConfig, recipe: &Recipe, lp: &str, kind: LayerKind) -> LayerDesc {
    let (h, hd, norm) = (cfg.hidden_size, cfg.head_dim, recipe.norm);
    let gated = recipe.gated_attention;
    let q_out = cfg.n_head * hd * if gated { 2 } else { 1 };
    let a = ProjectionKind::Attention;
    let projections = vec![
        proj(format!("{lp}self_attn.q_proj"), a, h, q_out),
        proj(format!("{lp}self_attn.k_proj"), a, h, cfg.n_kv_head * hd),
        proj(format!("{lp}self_attn.v_proj"), a, h, cfg.n_kv_head * hd),
        proj(format!("{lp}self_attn.o_proj"), a, cfg.n_head * hd, h),
    ];
    let mut tensors = Vec::new();
    let mut ops = Vec::new();
    if recipe.qk_norm {
        tensors.push(spec(format!("{lp}self_attn.q_norm.weight"), &[hd]));
        tensors.push(spec(format!("{lp}self_attn.k_norm.weight"), &[hd]));
        ops.push(Op::HeadRmsNorm(norm));
    }
    ops.push(Op::Rope { rotary_dim: cfg.rotary_dim });
    ops.push(match (kind, cfg.sliding) {
        (LayerKind::SlidingAttention, Some(s)) => Op::SlidingAttention { window: s.window },
        _ => Op::Attention,
    });
    if gated {
        ops.push(Op::OutputGate);
    }
    LayerDesc { kind, projections, tensors, ops }
}

fn gdn_layer(cfg: &ModelConfig, lp: &str) -> LayerDesc {
    let g = cfg.gdn.expect("linear-attention layers come with a GDN config");
    let h = cfg.hidden_size;
    let r = ProjectionKind::Recurrent;
    let la = format!("{lp}linear_attn.");
    LayerDesc {
        kind: LayerKind::LinearAttention,
        projections: vec![
            proj(format!("{la}in_proj_qkv"), r, h, g.conv_dim()),
            proj(format!("{la}in_proj_z"), r, h, g.value_dim()),
            proj(format!("{la}in_proj_b"), r, h, g.n_v_head),
            proj(format!("{la}in_proj_a"), r, h, g.n_v_head),
            proj(format!("{la}out_proj"), r, g.value_dim(), h),
        ],
        tensors: vec![
            spec(format!("{la}conv1d.weight"), &[g.conv_dim(), 1, g.conv_kernel]),
            spec(format!("{la}dt_bias"), &[g.n_v_head]),
            spec(format!("{la}A_log"), &[g.n_v_head]),
            spec(format!("{la}norm.weight"), &[g.v_dim]),
        ],
        ops: vec![Op::CausalConv1dSilu, Op::L2Norm, Op::GdnGates, Op::DeltaRule, Op::GatedRmsNorm],
    }
}

fn mlp(cfg: &ModelConfig, lp: &str) -> Vec<ProjectionInfo> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let m = ProjectionKind::Mlp;
    vec![
        proj(format!("{lp}mlp.gate_proj"), m, h, i),
        proj(format!("{lp}mlp.up_proj"), m, h, i),
        proj(format!("{lp}mlp.down_proj"), m, i, h),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen35_describes_gdn_and_gated_attention() {
        let cfg = ModelConfig::from_hf_json(&json!({
            "model_type": "qwen3_5_text", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 3,
            "linear_value_head_dim": 5, "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}))
        .unwrap();
        let d = Descriptor::new(&cfg);
        assert_eq!(d.lm_head, None);
        let names: Vec<&str> = d.projections().map(|p| p.name.as_str()).collect();
        assert_eq!(names.len(), 5 + 3 + 4 + 3);
        let qkv = d.projections().find(|p| p.name.ends_with("in_proj_qkv")).unwrap();
        assert_eq!((qkv.in_features, qkv.out_features, qkv.kind), (8, 3 + 3 + 10, ProjectionKind::Recurrent));
        let q = d.projections().find(|p| p.name == "model.layers.1.self_attn.q_proj").unwrap();
        assert_eq!(q.out_features, 2 * 4 * 2, "query and gate");
        assert_eq!(d.layers[1].ops[..3], [Op::RmsNorm(NormWeight::OnePlus), Op::HeadRmsNorm(NormWeight::OnePlus), Op::Rope { rotary_dim: 2 }]);
        assert!(d.tensors().iter().any(|t| t.name == "model.layers.0.linear_attn.conv1d.weight" && t.shape == [16, 1, 4]));
        // The kinds pick the NPU precision (the policy maps each kind).
        assert_eq!(qkv.kind, crate::projection::ProjectionKind::Recurrent);
        assert_eq!(q.kind, crate::projection::ProjectionKind::Attention);
    }
}

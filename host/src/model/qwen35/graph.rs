//! The training graph of Qwen3.5: Gated DeltaNet layers interleaved with
//! gated full-attention layers, (1 + w) RMSNorms, one recomputable segment
//! per layer and the fused vocabulary head + loss. Per layer (`x: [rows,
//! hidden]`, rows = batch * seq, every sequence from a zero state):
//!
//! ```text
//! h = rmsnorm(x)
//! GDN:        qkv, z, b, a = proj(h) + lora       c = gdn(qkv, z, b, a)    o = proj_out(c) + lora
//! attention:  q_full = proj_q(h) + lora  [rows, n_head * 2 * head_dim] (query | gate per head)
//!             q = rmsnorm(query_of(q_full)), k = rmsnorm(proj_k(h) + lora), v = proj_v(h) + lora
//!             q, k = rope(q), rope(k) on the first rotary_dim features
//!             o = proj_o(attention(q, k, v) * sigmoid(gate)) + lora
//! x1 = x + o        y = x1 + proj_down(swiglu(proj_gate(rmsnorm(x1)), proj_up(..))) + lora
//! ```
//!
//! Frozen projections are built by a [`ProjectionFactory`] (kind
//! `Recurrent` for the GDN ones, from the descriptor), so the split runtime
//! can route them to the NPU with FP16 weights.
use crate::autograd::graph::{layer_lora_params, projection_infos, token_rows, Batch, GraphOptions, LoraVars, TrainableModel};
use super::gdn_node::GdnWeights;
use crate::base::counter_rng;
use crate::autograd::{SegmentFn, Tape, Var};
use crate::model::config::{Arch, LayerKind, ModelConfig};
use crate::ops::cpu_projection::CpuProjection;
use crate::model::decoder::ProjectionFactory;
use crate::model::descriptor::{Descriptor, LayerDesc};
use crate::model::source::TensorSource;
use crate::ops::attention::AttnDims;
use crate::ops::embedding::embedding_forward;
use crate::ops::rmsnorm::NormWeight;
use crate::ops::rope::rope_inv_freq;
use crate::projection::{Projection, ProjectionInfo, ProjectionKind};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::sync::Arc;

/// The token mixer's frozen non-projection weights.
enum Mixer {
    /// Per-head q/k norm weights `[head_dim]` ((1 + w) convention).
    Attention { q_norm: Arc<Vec<f32>>, k_norm: Arc<Vec<f32>> },
    /// Conv, gates and gated norm.
    Gdn(Arc<GdnWeights>),
}

/// Frozen parts of one layer.
struct Layer {
    /// In descriptor order: q, k, v, o (or in_proj_qkv, in_proj_z,
    /// in_proj_b, in_proj_a, out_proj), then gate, up, down.
    proj: Vec<Arc<dyn Projection>>,
    mixer: Mixer,
    input_norm: Arc<Vec<f32>>,
    post_norm: Arc<Vec<f32>>,
}

struct Shared {
    cfg: ModelConfig,
    layers: Vec<Layer>,
    inv_freq: Arc<Vec<f32>>,
}

/// A Qwen3.5 model ready to be differentiated.
pub struct Qwen35Graph {
    shared: Arc<Shared>,
    /// `[vocab, hidden]` token embeddings.
    embed: Arc<Vec<f32>>,
    final_norm: Arc<Vec<f32>>,
    head: Arc<dyn Projection>,
}

fn f32_tensor(src: &dyn TensorSource, name: &str) -> Result<Vec<f32>> {
    src.get(name)?.to_f32()
}

fn load_layer(cfg: &ModelConfig, ld: &LayerDesc, src: &dyn TensorSource, make: &ProjectionFactory<'_>) -> Result<Layer> {
    let proj = ld
        .projections
        .iter()
        .map(|info| make(info.clone(), &src.get(&format!("{}.weight", info.name))?))
        .collect::<Result<Vec<_>>>()?;
    let tensor = |suffix: &str| -> Result<Vec<f32>> {
        let t = ld.tensors.iter().find(|t| t.name.ends_with(suffix)).expect("the descriptor lists it");
        f32_tensor(src, &t.name)
    };
    let mixer = match ld.kind {
        LayerKind::FullAttention => Mixer::Attention { q_norm: Arc::new(tensor(".q_norm.weight")?), k_norm: Arc::new(tensor(".k_norm.weight")?) },
        LayerKind::SlidingAttention => return Err(Error::Unsupported("sliding-window attention in the Qwen3.5 graph".into())),
        LayerKind::LinearAttention => Mixer::Gdn(Arc::new(GdnWeights {
            conv_weight: tensor("conv1d.weight")?,
            dt_bias: tensor("dt_bias")?,
            a_log: tensor("A_log")?,
            norm_weight: tensor("linear_attn.norm.weight")?,
            dims: cfg.gdn.ok_or_else(|| Error::invalid("config", "linear-attention layer without GDN sizes"))?,
            eps: cfg.rms_norm_eps,
        })),
    };
    Ok(Layer { proj, mixer, input_norm: Arc::new(tensor("input_layernorm.weight")?), post_norm: Arc::new(tensor("post_attention_layernorm.weight")?) })
}

impl Qwen35Graph {
    /// Loads a Qwen3.5 checkpoint with CPU f32 projections.
    pub fn load(src: &dyn TensorSource, cfg: ModelConfig) -> Result<Self> {
        Self::load_with(src, cfg, &crate::model::decoder::cpu_projection)
    }

    /// Like [`Qwen35Graph::load`], with `make` building every per-layer
    /// frozen projection. The vocabulary head stays on the CPU.
    pub fn load_with(src: &dyn TensorSource, cfg: ModelConfig, make: &ProjectionFactory<'_>) -> Result<Self> {
        if cfg.arch != Arch::Qwen35 {
            return Err(Error::invalid("Qwen35Graph", format!("{:?} is not a Qwen3.5 model", cfg.arch)));
        }
        let desc = Descriptor::new(&cfg);
        desc.check(src)?;
        let layers = desc.layers.iter().map(|ld| load_layer(&cfg, ld, src, make)).collect::<Result<Vec<_>>>()?;
        let embed = Arc::new(f32_tensor(src, &desc.embed.name)?);
        let head_info = ProjectionInfo { name: "lm_head".into(), kind: ProjectionKind::Mlp, out_features: cfg.vocab_size, in_features: cfg.hidden_size };
        let head_w = match &desc.lm_head {
            Some(t) => f32_tensor(src, &t.name)?,
            None => embed.as_ref().clone(),
        };
        let head: Arc<dyn Projection> = Arc::new(CpuProjection::new(head_info, head_w)?);
        let inv_freq = Arc::new(rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, &cfg.rope_scaling));
        let final_norm = Arc::new(f32_tensor(src, &desc.final_norm.name)?);
        Ok(Qwen35Graph { shared: Arc::new(Shared { cfg, layers, inv_freq }), embed, final_norm, head })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.shared.cfg
    }
}

/// What a layer segment needs besides the tape: the layer, which adapter
/// pair (index into `params`) each projection has, LoRA settings, positions.
struct SegmentCtx {
    shared: Arc<Shared>,
    l: usize,
    names: Vec<Option<usize>>,
    lora: (f32, f32, u64),
    positions: Arc<Vec<usize>>,
    seq: usize,
    /// Attention layers mask the future (`false`: the embedder's full view).
    causal: bool,
}

impl SegmentCtx {
    /// Projection `i` of the layer plus its LoRA branch.
    fn lin(&self, tape: &mut Tape, params: &[Var], i: usize, h: Var) -> Result<Var> {
        let y = tape.projection(h, &self.shared.layers[self.l].proj[i])?;
        let Some(k) = self.names[i] else { return Ok(y) };
        let (scaling, dropout, seed) = self.lora;
        let dropout = (dropout > 0.0).then(|| crate::lora::branch::Dropout { p: dropout, seed: counter_rng::derive(seed, (self.l * 8 + i) as u64) });
        tape.lora_add(y, h, params[2 * k], params[2 * k + 1], scaling, dropout)
    }

    fn attention(&self, tape: &mut Tape, params: &[Var], h: Var, q_norm: &Arc<Vec<f32>>, k_norm: &Arc<Vec<f32>>) -> Result<Var> {
        let cfg = &self.shared.cfg;
        let (hd, eps) = (cfg.head_dim, cfg.rms_norm_eps);
        let q_full = self.lin(tape, params, 0, h)?;
        let q = tape.query_of(q_full, hd)?;
        let (k, v) = (self.lin(tape, params, 1, h)?, self.lin(tape, params, 2, h)?);
        let q = tape.rms_norm(q, q_norm, NormWeight::OnePlus, eps)?;
        let k = tape.rms_norm(k, k_norm, NormWeight::OnePlus, eps)?;
        let q = tape.rope(q, &self.positions, cfg.n_head, hd, &self.shared.inv_freq)?;
        let k = tape.rope(k, &self.positions, cfg.n_kv_head, hd, &self.shared.inv_freq)?;
        let dims = AttnDims { q_len: self.seq, kv_len: self.seq, n_head: cfg.n_head, n_kv_head: cfg.n_kv_head, head_dim: hd, causal: self.causal };
        let a = tape.attention(q, k, v, dims, 1.0 / (hd as f32).sqrt(), crate::ops::attention::Products::F32)?;
        let a = tape.output_gate(a, q_full, hd)?;
        self.lin(tape, params, 3, a)
    }

    fn gdn(&self, tape: &mut Tape, params: &[Var], h: Var, w: &Arc<GdnWeights>) -> Result<Var> {
        let qkv = self.lin(tape, params, 0, h)?;
        let z = self.lin(tape, params, 1, h)?;
        let b = self.lin(tape, params, 2, h)?;
        let a = self.lin(tape, params, 3, h)?;
        let c = tape.gdn(qkv, z, b, a, w, self.seq)?;
        self.lin(tape, params, 4, c)
    }

    fn layer(&self, tape: &mut Tape, x: Var, params: &[Var]) -> Result<Var> {
        let layer = &self.shared.layers[self.l];
        let eps = self.shared.cfg.rms_norm_eps;
        let h = tape.rms_norm(x, &layer.input_norm, NormWeight::OnePlus, eps)?;
        let o = match &layer.mixer {
            Mixer::Attention { q_norm, k_norm } => self.attention(tape, params, h, q_norm, k_norm)?,
            Mixer::Gdn(w) => self.gdn(tape, params, h, w)?,
        };
        let x1 = tape.add(x, o)?;
        let h2 = tape.rms_norm(x1, &layer.post_norm, NormWeight::OnePlus, eps)?;
        let n = layer.proj.len();
        let (g, u) = (self.lin(tape, params, n - 3, h2)?, self.lin(tape, params, n - 2, h2)?);
        let m = tape.swiglu(g, u)?;
        let d = self.lin(tape, params, n - 1, m)?;
        tape.add(x1, d)
    }
}

impl TrainableModel for Qwen35Graph {
    fn projections(&self) -> Vec<ProjectionInfo> {
        projection_infos(self.shared.layers.iter().map(|l| &l.proj[..]))
    }

    fn layer_count(&self) -> usize {
        self.shared.layers.len()
    }

    fn activation_bytes_per_token_layer(&self) -> usize {
        let c = &self.shared.cfg;
        let g = c.gdn.map_or(0, |g| 3 * g.conv_dim() + 4 * g.value_dim() + g.n_v_head * g.k_dim * g.v_dim / super::gdn_node::CHECKPOINT_EVERY);
        let attn = 2 * (2 * c.n_head + 2 * c.n_kv_head) * c.head_dim;
        4 * (8 * c.hidden_size + 4 * c.intermediate_size + g.max(attn))
    }

    fn loss(&self, tape: &mut Tape, batch: &Batch, lora: &LoraVars, opts: &GraphOptions, logits: Option<&mut Vec<f32>>) -> Result<Var> {
        batch.dims()?;
        let h = self.hidden_states(tape, &batch.input_ids, lora, &opts.recompute_layers, true)?;
        let targets = batch.targets();
        let denom = opts.denominator(&targets);
        let chunk = if opts.head_chunk == 0 { 64 } else { opts.head_chunk };
        tape.head_loss(h, &self.head, &targets, denom, chunk, logits)
    }

    fn hidden_size(&self) -> usize {
        self.shared.cfg.hidden_size
    }

    fn hidden_states(&self, tape: &mut Tape, input_ids: &[Vec<u32>], lora: &LoraVars, recompute_layers: &[bool], causal: bool) -> Result<Var> {
        let (b, seq) = token_rows(input_ids)?;
        let cfg = &self.shared.cfg;
        let mut x = Tensor::zeros(&[b * seq, cfg.hidden_size]);
        embedding_forward(&mut x.data, &input_ids.concat(), &self.embed, cfg.hidden_size)?;
        let mut x = tape.constant(x);
        let positions = Arc::new((0..b).flat_map(|_| 0..seq).collect::<Vec<_>>());
        for (l, layer) in self.shared.layers.iter().enumerate() {
            let (params, names) = layer_lora_params(lora, &layer.proj);
            let ctx = SegmentCtx { shared: self.shared.clone(), l, names, lora: (lora.scaling, lora.dropout, lora.dropout_seed), positions: positions.clone(), seq, causal };
            let f: SegmentFn = Arc::new(move |tape: &mut Tape, x: Var, params: &[Var]| ctx.layer(tape, x, params));
            let recompute = recompute_layers.get(l).copied().unwrap_or(false);
            x = tape.segment(&f, x, &params, recompute)?;
        }
        tape.rms_norm(x, &self.final_norm, NormWeight::OnePlus, cfg.rms_norm_eps)
    }

    fn head(&self) -> &Arc<dyn Projection> {
        &self.head
    }
}

//! Qwen3.5's Gated DeltaNet block (transformers' `Qwen3_5GatedDeltaNet`):
//! its weights, its decoding state and its core while decoding. The layer
//! around it (projections, norms, MLP) is [`crate::model::layer`]'s; its
//! tape node is [`super::gdn_node`].
use crate::model::config::GdnConfig;
use crate::ops::activation::silu_forward;
use crate::ops::gdn::{
    conv1d_causal_forward, conv1d_next_history, delta_rule_forward, gated_rmsnorm_forward, gdn_gates_forward,
    l2norm_forward, DeltaDims,
};
use crate::Result;

/// transformers' `l2norm` epsilon (fixed, not `rms_norm_eps`).
pub const L2NORM_EPS: f32 = 1e-6;

/// What a Gated DeltaNet layer carries from one piece of a sequence to the next.
#[derive(Clone, Debug)]
pub struct GdnState {
    /// Last `conv_kernel - 1` conv inputs, `[K - 1, conv_dim]`.
    pub conv: Vec<f32>,
    /// Delta-rule state, f32 `[n_v_head, k_dim, v_dim]`.
    pub recurrent: Vec<f32>,
}

impl GdnState {
    /// The state at sequence start (zeros).
    pub fn new(g: &GdnConfig) -> Self {
        GdnState {
            conv: vec![0.0; (g.conv_kernel - 1) * g.conv_dim()],
            recurrent: vec![0.0; g.n_v_head * g.k_dim * g.v_dim],
        }
    }
}

/// The frozen non-projection weights of one Gated DeltaNet layer: one
/// struct for decoding ([`gdn_decode`]) and training
/// (`model::qwen35::gdn_node`).
#[derive(Clone, Debug)]
pub struct GdnWeights {
    /// Depthwise conv `[conv_dim, K]` (the checkpoint's `[conv_dim, 1, K]`).
    pub conv_weight: Vec<f32>,
    /// `[n_v_head]`.
    pub dt_bias: Vec<f32>,
    /// `[n_v_head]`.
    pub a_log: Vec<f32>,
    /// Gated RMSNorm weight `[v_dim]` (plain `w` convention).
    pub norm_weight: Vec<f32>,
    /// Sizes.
    pub dims: GdnConfig,
    /// Gated RMSNorm epsilon (`rms_norm_eps`).
    pub eps: f32,
}

impl GdnWeights {
    /// Reads the layer's tensors through `tensor`, which maps a name suffix
    /// (`conv1d.weight`, `dt_bias`, `A_log`, `linear_attn.norm.weight`) to
    /// that tensor of the layer.
    pub fn read(tensor: &dyn Fn(&str) -> Result<Vec<f32>>, dims: GdnConfig, eps: f32) -> Result<Self> {
        Ok(GdnWeights {
            conv_weight: tensor("conv1d.weight")?,
            dt_bias: tensor("dt_bias")?,
            a_log: tensor("A_log")?,
            norm_weight: tensor("linear_attn.norm.weight")?,
            dims,
            eps,
        })
    }

    /// Head geometry of the delta rule.
    pub fn delta_dims(&self) -> DeltaDims {
        let d = self.dims;
        DeltaDims { n_k_head: d.n_k_head, n_v_head: d.n_v_head, k_dim: d.k_dim, v_dim: d.v_dim }
    }
}

/// The Gated DeltaNet core while decoding: the input projections' outputs
/// `qkv: [tokens, conv_dim]`, `z: [tokens, value_dim]`, `b`, `a: [tokens,
/// n_v_head]` -> the gated-normed delta-rule output `[tokens, value_dim]`
/// (out_proj's input), continuing from `state`.
pub fn gdn_decode(w: &GdnWeights, qkv: &[f32], z: &[f32], b: &[f32], a: &[f32], tokens: usize, state: &mut GdnState) -> Vec<f32> {
    let d = w.dims;
    let (key_dim, conv_dim) = (d.key_dim(), d.conv_dim());
    let mut conv = vec![0.0; qkv.len()];
    conv1d_causal_forward(&mut conv, qkv, &state.conv, &w.conv_weight, conv_dim);
    state.conv = conv1d_next_history(&state.conv, qkv, conv_dim);
    let mut mixed = vec![0.0; conv.len()];
    silu_forward(&mut mixed, &conv);

    let (mut q, mut k, v) = split_qkv(&mixed, key_dim, conv_dim);
    let mut rnorm = vec![0.0; tokens * d.n_k_head];
    let (q_raw, k_raw) = (q.clone(), k.clone());
    l2norm_forward(&mut q, &mut rnorm, &q_raw, d.k_dim, L2NORM_EPS);
    l2norm_forward(&mut k, &mut rnorm, &k_raw, d.k_dim, L2NORM_EPS);

    let (mut g, mut beta) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    gdn_gates_forward(&mut g, &mut beta, a, b, &w.a_log, &w.dt_bias);

    let mut o = vec![0.0; v.len()];
    delta_rule_forward(&mut o, &mut state.recurrent, &q, &k, &v, &g, &beta, w.delta_dims());

    let mut normed = vec![0.0; o.len()];
    let mut rstd = vec![0.0; tokens * d.n_v_head];
    gated_rmsnorm_forward(&mut normed, &mut rstd, &o, z, &w.norm_weight, w.eps);
    normed
}

/// The q, k and v parts of the conv's output rows `[q | k | v]`
/// (`[tokens, conv_dim]`, q and k `key_dim` wide each).
pub(crate) fn split_qkv(mixed: &[f32], key_dim: usize, conv_dim: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in mixed.chunks_exact(conv_dim) {
        q.extend_from_slice(&row[..key_dim]);
        k.extend_from_slice(&row[key_dim..2 * key_dim]);
        v.extend_from_slice(&row[2 * key_dim..]);
    }
    (q, k, v)
}

//! The blocks every architecture is built from: grouped-query attention with RoPE (Llama;
//! Qwen3 adds per-head q/k RMSNorm; Qwen3.5's full-attention layers add an
//! output gate emitted by q_proj and rotate only part of each head; Gemma
//! 3's local layers see a sliding window and scale scores by its own
//! constant) and the gated MLP (SwiGLU, or Gemma's GeGLU). Frozen weights
//! are only reached through [`Projection`]s.
//!
//! These are inference forwards (generation, fixtures, benchmarks); the
//! training graph composes the same `ops` kernels on its tape.
use crate::model::source::TensorSource;
use crate::ops::activation::sigmoid;
use crate::ops::attention::{attention_forward_window, AttnDims};
use crate::ops::geglu::geglu_forward;
use crate::ops::rmsnorm::{rmsnorm_forward, NormWeight};
use crate::ops::rope::rope_forward;
use crate::ops::swiglu::swiglu_forward;
use crate::projection::{Direction, Projection};
use crate::Result;
use std::sync::Arc;

/// Runs a projection forward on `tokens` rows into a new buffer.
pub fn project(p: &dyn Projection, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
    let mut y = vec![0.0; tokens * p.info().out_features];
    p.apply(Direction::Forward, x, tokens, &mut y)?;
    Ok(y)
}

/// Reads a small non-projection tensor (norm weights, gates) as f32.
pub fn read_vector(src: &dyn TensorSource, name: &str) -> Result<Vec<f32>> {
    src.get(name)?.to_f32()
}

/// The gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAct {
    /// SwiGLU: `silu(gate) * up` (Llama, Qwen).
    Silu,
    /// GeGLU: `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
}

/// `act(gate_proj(x)) * up_proj(x)` then `down_proj`.
pub struct Mlp {
    /// `[intermediate, hidden]`.
    pub gate: Arc<dyn Projection>,
    /// `[intermediate, hidden]`.
    pub up: Arc<dyn Projection>,
    /// `[hidden, intermediate]`.
    pub down: Arc<dyn Projection>,
    /// The gate's activation.
    pub act: GateAct,
}

impl Mlp {
    /// `x: [tokens, hidden] -> [tokens, hidden]`.
    pub fn forward(&self, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
        let gate = project(&*self.gate, x, tokens)?;
        let up = project(&*self.up, x, tokens)?;
        let mut act = vec![0.0; gate.len()];
        match self.act {
            GateAct::Silu => swiglu_forward(&mut act, &gate, &up),
            GateAct::GeluTanh => geglu_forward(&mut act, &gate, &up),
        }
        project(&*self.down, &act, tokens)
    }
}

/// Keys and values of one attention layer: for every position seen so
/// far, or, with a sliding window `w`, for the last positions only (at
/// least `w - 1`, at most `2 w`: the oldest are dropped `w` at a time).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// `[len, n_kv_head, head_dim]` (post-RoPE), the last `len` positions.
    pub k: Vec<f32>,
    /// `[len, n_kv_head, head_dim]`.
    pub v: Vec<f32>,
}

impl KvCache {
    /// Drops the oldest positions once more than `2 window` are held,
    /// keeping the `window - 1` the next query needs. Dropping `w` at a
    /// time moves each key once, not once per token.
    fn bound(&mut self, window: usize, row: usize) {
        let len = self.k.len() / row;
        if len > 2 * window {
            let drop = (len - (window - 1)) * row;
            self.k.drain(..drop);
            self.v.drain(..drop);
        }
    }
}

/// Causal self-attention block.
pub struct Attention {
    /// `[n_head * head_dim (* 2 when gated), hidden]`.
    pub q: Arc<dyn Projection>,
    /// `[n_kv_head * head_dim, hidden]`.
    pub k: Arc<dyn Projection>,
    /// `[n_kv_head * head_dim, hidden]`.
    pub v: Arc<dyn Projection>,
    /// `[hidden, n_head * head_dim]`.
    pub o: Arc<dyn Projection>,
    /// Per-head q/k RMSNorm weights `[head_dim]` (Qwen3, Qwen3.5).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Convention of the q/k norms.
    pub norm: NormWeight,
    /// q_proj emits `[query | gate]` per head and the output is multiplied
    /// by `sigmoid(gate)` (Qwen3.5).
    pub gated: bool,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Score scale (`head_dim^-1/2`, or Gemma's `query_pre_attn_scalar^-1/2`).
    pub scale: f32,
    /// Sliding window: each query sees itself and the `window - 1`
    /// positions before it (Gemma 3's local layers); `None`: all before it.
    pub window: Option<usize>,
}

impl Attention {
    /// `x: [tokens, hidden]` at positions `positions` (consecutive, following
    /// what `cache` holds) `-> [tokens, hidden]`; appends to `cache`.
    pub fn forward(&self, x: &[f32], positions: &[usize], inv_freq: &[f32], cache: &mut KvCache) -> Result<Vec<f32>> {
        let (t, nh, nkv, hd) = (positions.len(), self.n_head, self.n_kv_head, self.head_dim);
        let q_full = project(&*self.q, x, t)?;
        let (mut q, gate) = if self.gated { split_query_gate(&q_full, t * nh, hd) } else { (q_full, Vec::new()) };
        let mut k = project(&*self.k, x, t)?;
        let v = project(&*self.v, x, t)?;
        if let Some((qw, kw)) = &self.qk_norm {
            head_norm(&mut q, qw, self.norm, self.eps);
            head_norm(&mut k, kw, self.norm, self.eps);
        }
        rope_forward(&mut q, positions, nh, hd, inv_freq);
        rope_forward(&mut k, positions, nkv, hd, inv_freq);
        cache.k.extend_from_slice(&k);
        cache.v.extend_from_slice(&v);
        let kv_len = cache.k.len() / (nkv * hd);
        let dims = AttnDims { q_len: t, kv_len, n_head: nh, n_kv_head: nkv, head_dim: hd, causal: true };
        let mut out = vec![0.0; t * nh * hd];
        let mut lse = vec![0.0; t * nh];
        attention_forward_window(&mut out, &mut lse, &q, &cache.k, &cache.v, dims, self.scale, self.window);
        if let Some(w) = self.window {
            cache.bound(w, nkv * hd);
        }
        if self.gated {
            for (o, &g) in out.iter_mut().zip(&gate) {
                *o *= sigmoid(g);
            }
        }
        project(&*self.o, &out, t)
    }
}

/// Splits q_proj's `[rows, 2 * hd]` (query then gate within each head) into
/// query `[rows, hd]` and gate `[rows, hd]`.
fn split_query_gate(q_full: &[f32], rows: usize, hd: usize) -> (Vec<f32>, Vec<f32>) {
    let mut q = Vec::with_capacity(rows * hd);
    let mut gate = Vec::with_capacity(rows * hd);
    for r in q_full.chunks_exact(2 * hd) {
        q.extend_from_slice(&r[..hd]);
        gate.extend_from_slice(&r[hd..]);
    }
    debug_assert_eq!(q.len(), rows * hd);
    (q, gate)
}

/// RMSNorm of each `[head_dim]` row of `x`, in place.
fn head_norm(x: &mut [f32], weight: &[f32], kind: NormWeight, eps: f32) {
    let inp = x.to_vec();
    let mut rstd = vec![0.0; x.len() / weight.len()];
    rmsnorm_forward(x, &mut rstd, &inp, weight, kind, eps);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu_projection::CpuProjection;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    fn projection(out_features: usize, in_features: usize, seed: f32) -> Arc<dyn Projection> {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Attention, out_features, in_features };
        let w = (0..out_features * in_features).map(|i| (i as f32 * seed).sin() * 0.5).collect();
        Arc::new(CpuProjection::new(info, w).unwrap())
    }

    /// A sliding-window layer decoding token by token keeps a bounded
    /// cache (dropped `w` at a time past `2 w`) and still gives what one
    /// call over the whole sequence gives (whose windowed attention
    /// `ops::attention` checks against f64).
    #[test]
    fn sliding_window_cache_stays_bounded_and_decodes_like_one_pass() {
        let (h, nh, nkv, hd, w, t) = (8, 2, 1, 4, 3, 20);
        let attn = Attention {
            q: projection(nh * hd, h, 0.37),
            k: projection(nkv * hd, h, 0.53),
            v: projection(nkv * hd, h, 0.71),
            o: projection(h, nh * hd, 0.29),
            qk_norm: None,
            norm: NormWeight::OnePlus,
            gated: false,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            eps: 1e-6,
            scale: 0.5,
            window: Some(w),
        };
        let inv_freq = [1.0f32, 0.1];
        let x: Vec<f32> = (0..t * h).map(|i| (i as f32 * 0.13).cos()).collect();
        let positions: Vec<usize> = (0..t).collect();
        let whole = attn.forward(&x, &positions, &inv_freq, &mut KvCache::default()).unwrap();
        let mut cache = KvCache::default();
        for p in 0..t {
            let y = attn.forward(&x[p * h..(p + 1) * h], &[p], &inv_freq, &mut cache).unwrap();
            for (a, b) in y.iter().zip(&whole[p * h..(p + 1) * h]) {
                assert!((a - b).abs() < 1e-5, "token {p}: {a} vs {b}");
            }
            let held = cache.k.len() / (nkv * hd);
            assert!(held <= 2 * w && held >= (p + 1).min(w - 1), "token {p}: {held} positions held");
        }
    }
}

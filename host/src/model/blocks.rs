//! The decoding side's small pieces: a projection run into a new buffer,
//! small tensors read as f32, the MLP's gate activation, and the KV cache
//! of an attention layer (bounded for sliding-window layers). The layer
//! forward itself is [`crate::model::layer`]'s, one for decoding and
//! training.
use crate::model::source::TensorSource;
use crate::ops::activation::sigmoid;
use crate::projection::{Direction, Projection};
use crate::Result;

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
    pub(crate) fn bound(&mut self, window: usize, row: usize) {
        let len = self.k.len() / row;
        if len > 2 * window {
            let drop = (len - (window - 1)) * row;
            self.k.drain(..drop);
            self.v.drain(..drop);
        }
    }
}

/// The query half of q_proj's `[rows, 2 * hd]` (each head holds its query,
/// then its gate): `[rows, hd]`. The gate half is read in place by
/// [`output_gate_forward`].
pub(crate) fn query_half(q_full: &[f32], hd: usize) -> Vec<f32> {
    q_full.chunks_exact(2 * hd).flat_map(|h| h[..hd].iter().copied()).collect()
}

/// `attn * sigmoid(gate)` head by head: `attn: [rows, heads * hd]`, the gate
/// the second half of each head of `q_full: [rows, heads * 2 * hd]` (the
/// backward is the tape node's, `qwen35::gdn_node`).
pub(crate) fn output_gate_forward(attn: &[f32], q_full: &[f32], hd: usize) -> Vec<f32> {
    let mut y = attn.to_vec();
    for (o, full) in y.chunks_exact_mut(hd).zip(q_full.chunks_exact(2 * hd)) {
        o.iter_mut().zip(&full[hd..]).for_each(|(o, &g)| *o *= sigmoid(g));
    }
    y
}

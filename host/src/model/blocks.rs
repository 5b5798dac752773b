//! The decoding side's small pieces: a projection run into a new buffer,
//! small tensors read as f32, the MLP's gate activation, and the KV cache
//! of an attention layer (bounded for sliding-window layers). The layer
//! forward itself is [`crate::model::layer`]'s, one for decoding and
//! training.
use crate::model::source::TensorSource;
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

/// Splits q_proj's `[rows, 2 * hd]` (query then gate within each head) into
/// query `[rows, hd]` and gate `[rows, hd]`.
pub(crate) fn split_query_gate(q_full: &[f32], rows: usize, hd: usize) -> (Vec<f32>, Vec<f32>) {
    let mut q = Vec::with_capacity(rows * hd);
    let mut gate = Vec::with_capacity(rows * hd);
    for r in q_full.chunks_exact(2 * hd) {
        q.extend_from_slice(&r[..hd]);
        gate.extend_from_slice(&r[hd..]);
    }
    debug_assert_eq!(q.len(), rows * hd);
    (q, gate)
}

//! The fused LoRA branch, forward and backward as slice functions (llm.c
//! style): `Y += s * drop(X) A^T B^T` (PEFT's `lora_B(lora_A(dropout(x))) *
//! scaling`). The forward saves `xa = drop(X) A^T` (`[T, r]`, tiny); the
//! dropout mask is regenerated from its seed, never stored.
use crate::autograd::counter_rng;
use crate::ops::matmul::{matmul, matmul_at, matmul_bt};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Inverted dropout on the branch input: keep with probability `1 - p`,
/// scale kept values by `1 / (1 - p)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Drop probability in `[0, 1)`.
    pub p: f32,
    /// Mask stream; element `i` of `X` is kept when `uniform(seed, i) >= p`.
    pub seed: u64,
}

/// Token count and the three widths of one branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shapes {
    /// Rows of `X`.
    pub tokens: usize,
    /// `in_features`.
    pub in_f: usize,
    /// LoRA rank `r`.
    pub rank: usize,
    /// `out_features`.
    pub out_f: usize,
}

impl Shapes {
    /// Checks `x: [.., in]`, `a: [r, in]`, `b: [out, r]`.
    pub fn of(x: &Tensor, a: &Tensor, b: &Tensor) -> Result<Shapes> {
        let bad = |what: &str, expected: Vec<usize>, got: &Tensor| {
            Err(Error::Shape { what: format!("lora branch {what}"), expected, got: got.shape.clone() })
        };
        if a.shape.len() != 2 {
            return bad("A (expected [r, in])", vec![0, x.last_dim()], a);
        }
        let (rank, in_f) = (a.shape[0], a.shape[1]);
        if x.last_dim() != in_f {
            return bad("input", vec![x.rows(), in_f], x);
        }
        if b.shape.len() != 2 || b.shape[1] != rank {
            return bad("B (expected [out, r])", vec![0, rank], b);
        }
        Ok(Shapes { tokens: x.rows(), in_f, rank, out_f: b.shape[0] })
    }
}

/// Gradient buffers to fill (each `None` when not wanted).
pub struct Grads {
    /// `[T, in]`.
    pub dx: Option<Vec<f32>>,
    /// `[r, in]`.
    pub da: Option<Vec<f32>>,
    /// `[out, r]`.
    pub db: Option<Vec<f32>>,
}

/// `drop(X)`, or `None` when there is no dropout (use `X` itself).
fn dropped(x: &[f32], dropout: Option<Dropout>) -> Option<Vec<f32>> {
    let d = dropout.filter(|d| d.p > 0.0)?;
    let keep_scale = 1.0 / (1.0 - d.p);
    Some(
        x.iter()
            .enumerate()
            .map(|(i, &v)| if counter_rng::uniform(d.seed, i as u64) >= d.p { v * keep_scale } else { 0.0 })
            .collect(),
    )
}

/// `y: [T, out] += s * drop(x) a^T b^T`; writes `xa: [T, r]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(y: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes) {
    forward_product(y, xa, x, a, b, s, dropout, sh, true);
}

/// `out: [T, out] = s * drop(x) a^T b^T` (overwritten); writes `xa: [T, r]`.
/// The training nodes add `out` to the frozen product themselves, so the
/// fused and the unfused graph round the sum the same way.
#[allow(clippy::too_many_arguments)]
pub fn forward_into(out: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes) {
    forward_product(out, xa, x, a, b, s, dropout, sh, false);
}

#[allow(clippy::too_many_arguments)]
fn forward_product(y: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes, accumulate: bool) {
    let xd = dropped(x, dropout);
    let xd = xd.as_deref().unwrap_or(x);
    matmul_bt(xa, xd, a, (sh.tokens, sh.in_f, sh.rank), 1.0, false);
    matmul_bt(y, xa, b, (sh.tokens, sh.rank, sh.out_f), s, accumulate);
}

/// Given `dy: [T, out]`: `dB = s dY^T xa`, `dxa = s dY B`, `dA = dxa^T drop(X)`,
/// `dX = mask * (dxa A)`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    g: &mut Grads,
    dy: &[f32],
    x: &[f32],
    a: &[f32],
    b: &[f32],
    xa: &[f32],
    s: f32,
    dropout: Option<Dropout>,
    sh: Shapes,
) {
    let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
    if let Some(db) = g.db.as_deref_mut() {
        matmul_at(db, dy, xa, (out_f, t, r), s, false);
    }
    if g.da.is_none() && g.dx.is_none() {
        return;
    }
    let mut dxa = vec![0.0; t * r];
    matmul(&mut dxa, dy, b, (t, out_f, r), s, false);
    if let Some(da) = g.da.as_deref_mut() {
        let xd = dropped(x, dropout);
        matmul_at(da, &dxa, xd.as_deref().unwrap_or(x), (r, t, in_f), 1.0, false);
    }
    if let Some(dx) = g.dx.as_deref_mut() {
        matmul(dx, &dxa, a, (t, r, in_f), 1.0, false);
        if let Some(d) = dropout.filter(|d| d.p > 0.0) {
            let keep_scale = 1.0 / (1.0 - d.p);
            for (i, v) in dx.iter_mut().enumerate() {
                *v = if counter_rng::uniform(d.seed, i as u64) >= d.p { *v * keep_scale } else { 0.0 };
            }
        }
    }
}

//! Vocabulary head + token cross-entropy, fused: forward and backward in one
//! pass, chunked over token rows so the `[T, vocab]` logits never exist at
//! once (a 256-token chunk of a 49k vocabulary is 50 MB; all of a 4k-token
//! batch would be 800 MB). The head is a frozen projection; the chunk's
//! logits come from its forward direction and `dX` from its input-gradient
//! direction, so the head can be served by the NPU like any projection.
//!
//! Rows whose target is ignored (prompt tokens) never touch the head unless
//! their logits were asked for.
use crate::projection::{Direction, Projection};
use crate::{Error, Result};
use rayon::prelude::*;

/// What the fused head + loss produces.
pub struct HeadLoss {
    /// `sum_t -log p_t(target_t) / denom` over valid targets.
    pub loss: f32,
    /// `dLoss/dX: [T, hidden]`, when asked for.
    pub dx: Option<Vec<f32>>,
    /// Number of valid (non-ignored) targets.
    pub targets: usize,
}

/// Per row: turns `logits: [V]` into `dlogits = (softmax - onehot(target)) /
/// denom` in place and returns `-log softmax[target]` (in f64). `target < 0`
/// means ignored: the row's gradient is zero and its loss 0.
pub fn row_forward_backward(logits: &mut [f32], target: i64, denom: f32) -> f64 {
    if target < 0 {
        logits.fill(0.0);
        return 0.0;
    }
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f64 = logits.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let loss = lse - logits[target as usize] as f64;
    let inv = 1.0 / denom as f64;
    for v in logits.iter_mut() {
        *v = (((*v as f64) - lse).exp() * inv) as f32;
    }
    logits[target as usize] -= inv as f32;
    loss
}

fn check_targets(targets: &[i64], rows: usize, vocab: usize) -> Result<()> {
    if targets.len() != rows {
        return Err(Error::Shape { what: "cross-entropy targets".into(), expected: vec![rows], got: vec![targets.len()] });
    }
    if let Some(t) = targets.iter().find(|&&t| t >= vocab as i64) {
        return Err(Error::invalid("target token", format!("{t} is outside the vocabulary of {vocab}")));
    }
    Ok(())
}

/// The fused head + cross-entropy over `x: [rows, hidden]` with shifted
/// `targets: [rows]` (negative = ignored). `chunk` rows go through the head
/// at a time. When `logits` is given, all rows are computed and their logits
/// appended (`[rows, vocab]`, for verification); otherwise only rows with a
/// valid target are.
#[allow(clippy::too_many_arguments)]
pub fn head_forward_backward(
    head: &dyn Projection,
    x: &[f32],
    rows: usize,
    targets: &[i64],
    denom: f32,
    chunk: usize,
    want_dx: bool,
    mut logits: Option<&mut Vec<f32>>,
) -> Result<HeadLoss> {
    let (hidden, vocab) = (head.info().in_features, head.info().out_features);
    check_targets(targets, rows, vocab)?;
    if x.len() != rows * hidden {
        return Err(Error::Shape { what: "head input".into(), expected: vec![rows, hidden], got: vec![x.len()] });
    }
    let active: Vec<usize> = match logits {
        Some(_) => (0..rows).collect(),
        None => (0..rows).filter(|&r| targets[r] >= 0).collect(),
    };
    let n_targets = targets.iter().filter(|&&t| t >= 0).count();
    let mut dx = want_dx.then(|| vec![0.0f32; rows * hidden]);
    let mut total = 0f64;
    let chunk = chunk.max(1);
    let mut xs = vec![0.0f32; chunk * hidden];
    let mut lg = vec![0.0f32; chunk * vocab];
    let mut dxs = vec![0.0f32; chunk * hidden];
    for ids in active.chunks(chunk) {
        let n = ids.len();
        for (i, &r) in ids.iter().enumerate() {
            xs[i * hidden..(i + 1) * hidden].copy_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
        head.apply(Direction::Forward, &xs[..n * hidden], n, &mut lg[..n * vocab])?;
        if let Some(out) = logits.as_deref_mut() {
            out.extend_from_slice(&lg[..n * vocab]);
        }
        let losses: Vec<f64> = lg[..n * vocab]
            .par_chunks_mut(vocab)
            .zip(ids.par_iter())
            .map(|(row, &r)| row_forward_backward(row, targets[r], denom))
            .collect();
        total += losses.iter().sum::<f64>();
        if let Some(dx) = dx.as_deref_mut() {
            head.apply(Direction::InputGrad, &lg[..n * vocab], n, &mut dxs[..n * hidden])?;
            for (i, &r) in ids.iter().enumerate() {
                dx[r * hidden..(r + 1) * hidden].copy_from_slice(&dxs[i * hidden..(i + 1) * hidden]);
            }
        }
    }
    let loss = (total / denom as f64) as f32;
    if !loss.is_finite() {
        return Err(Error::NonFinite("cross-entropy loss (logits overflow or NaN in the model)".into()));
    }
    Ok(HeadLoss { loss, dx, targets: n_targets })
}

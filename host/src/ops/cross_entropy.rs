//! Vocabulary head + token cross-entropy, fused: forward and backward in one
//! pass, chunked over token rows *and* over the vocabulary, so neither the
//! `[T, vocab]` logits nor a `[rows, vocab]` chunk of them ever exists (a
//! 256-row chunk of a 49k vocabulary would be 50 MB; a 4096-wide slice of it
//! is 4 MB). The head is a list of frozen projections, one per vocabulary
//! slice (row windows of the same weight, nothing copied); a slice's logits
//! come from its forward direction and its share of `dX` from its
//! input-gradient direction, so the head can be served by the NPU like any
//! projection.
//!
//! The softmax runs online over the slices (flash-attention style): per row
//! a running max `m` and sum `S = sum exp(z - m)`; each slice turns its logits
//! into `e = exp(z - m)` and adds `e W_slice` to an accumulator rescaled
//! whenever `m` grows. At the end `dX = (acc / S - W[target]) / denom`. The
//! `-W[target]` term is folded into the last slice exactly (its `S` is final
//! by then); rows whose target sits in an earlier slice get it from their
//! slice's row of `W` ([`Projection::scaled_rows`]).
//!
//! Rows whose target is ignored (prompt tokens) never touch the head unless
//! their logits were asked for.
use crate::ops::activation::{exp, exp_shifted};
use crate::ops::softmax::{lane_max, lane_sum};
use crate::projection::{Direction, Projection};
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::Arc;

/// What the fused head + loss produces.
#[derive(Debug)]
pub struct HeadLoss {
    /// `sum_t -log p_t(target_t) / denom` over valid targets.
    pub loss: f32,
    /// `dLoss/dX: [T, hidden]`, when asked for.
    pub dx: Option<Vec<f32>>,
    /// Number of valid (non-ignored) targets.
    pub targets: usize,
}

/// Per-row state of the online softmax over vocabulary slices.
#[derive(Clone, Copy)]
struct RowStats {
    /// Running max of the logits seen so far.
    max: f32,
    /// `sum exp(z - max)` over the logits seen so far.
    sum: f32,
    /// The target's logit once its slice has been seen.
    target_logit: f32,
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

/// Width of one vocabulary slice of the head (see [`slice_rows`]).
pub const VOCAB_SLICE: usize = 4096;

/// Row windows `(first, len)` of a `[vocab, hidden]` head, `VOCAB_SLICE` rows each.
pub fn slice_rows(vocab: usize) -> Vec<(usize, usize)> {
    (0..vocab.div_ceil(VOCAB_SLICE)).map(|i| (i * VOCAB_SLICE, VOCAB_SLICE.min(vocab - i * VOCAB_SLICE))).collect()
}

/// The fused head + cross-entropy over `x: [rows, hidden]` with shifted
/// `targets: [rows]` (negative = ignored). `head` lists the vocabulary slices
/// in order (each `[slice, hidden]`); `chunk` rows go through the head at a
/// time. When `logits` is given, all rows are computed and their logits
/// appended (`[rows, vocab]`, for verification); otherwise only rows with a
/// valid target are.
#[allow(clippy::too_many_arguments)]
pub fn head_forward_backward(
    head: &[Arc<dyn Projection>],
    x: &[f32],
    rows: usize,
    targets: &[i64],
    denom: f32,
    chunk: usize,
    want_dx: bool,
    mut logits: Option<&mut Vec<f32>>,
) -> Result<HeadLoss> {
    let hidden = head.first().map_or(0, |h| h.info().in_features);
    if head.is_empty() || head.iter().any(|h| h.info().in_features != hidden) {
        return Err(Error::invalid("vocabulary head", "needs at least one slice, all of the same input width"));
    }
    let vocab: usize = head.iter().map(|h| h.info().out_features).sum();
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
    let mut xs = Vec::new();
    for ids in active.chunks(chunk.max(1)) {
        xs.clear();
        ids.iter().for_each(|&r| xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]));
        let tg: Vec<i64> = ids.iter().map(|&r| targets[r]).collect();
        let out_logits = logits.as_deref_mut().map(|l| {
            let at = l.len();
            l.resize(at + ids.len() * vocab, 0.0);
            &mut l[at..]
        });
        let (losses, dxs) = chunk_forward_backward(head, &xs, &tg, denom, want_dx, out_logits)?;
        total += losses.iter().sum::<f64>();
        if let (Some(dx), Some(dxs)) = (dx.as_deref_mut(), dxs) {
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

/// One chunk of `n` rows `xs: [n, hidden]` with targets `tg: [n]` through
/// every vocabulary slice. Returns the per-row losses (0 for ignored rows)
/// and, when wanted, `dX: [n, hidden]` (zero rows for ignored targets).
/// `logits`, when given, is `[n, vocab]` and receives the raw logits.
fn chunk_forward_backward(
    head: &[Arc<dyn Projection>],
    xs: &[f32],
    tg: &[i64],
    denom: f32,
    want_dx: bool,
    mut logits: Option<&mut [f32]>,
) -> Result<(Vec<f64>, Option<Vec<f32>>)> {
    let (n, hidden) = (tg.len(), head[0].info().in_features);
    let vocab: usize = head.iter().map(|h| h.info().out_features).sum();
    let mut stats = vec![RowStats { max: f32::NEG_INFINITY, sum: 0.0, target_logit: 0.0 }; n];
    let mut acc = vec![0.0f32; if want_dx { n * hidden } else { 0 }];
    let mut part = vec![0.0f32; acc.len()];
    let mut lg = Vec::new();
    let mut first = 0;
    for (si, slice) in head.iter().enumerate() {
        let width = slice.info().out_features;
        let last = si + 1 == head.len();
        lg.resize(n * width, 0.0);
        slice.apply(Direction::Forward, xs, n, &mut lg)?;
        if let Some(out) = logits.as_deref_mut() {
            for (o, z) in out.chunks_exact_mut(vocab).zip(lg.chunks_exact(width)) {
                o[first..first + width].copy_from_slice(z);
            }
        }
        let (lo, hi) = (first as i64, (first + width) as i64);
        // Per row: fold the slice into the stats, leave e = exp(z - max) in
        // `lg` (the last slice subtracts S at the target: the one-hot term),
        // and return the factor by which older terms shrink.
        let rescale: Vec<f32> = lg
            .par_chunks_mut(width)
            .zip(stats.par_iter_mut())
            .zip(tg.par_iter())
            .map(|((z, st), &t)| {
                if t < 0 {
                    z.fill(0.0);
                    return 1.0;
                }
                let target = (lo..hi).contains(&t).then(|| (t - lo) as usize);
                fold_row(z, st, target, last)
            })
            .collect();
        if want_dx {
            slice.apply(Direction::InputGrad, &lg, n, &mut part)?;
            acc.par_chunks_mut(hidden).zip(part.par_chunks(hidden)).zip(&rescale).for_each(|((a, p), &f)| {
                a.iter_mut().zip(p).for_each(|(a, &p)| *a = *a * f + p);
            });
        }
        first += width;
    }
    let losses = stats.iter().zip(tg).map(|(st, &t)| if t < 0 { 0.0 } else { st.max as f64 + (st.sum as f64).ln() - st.target_logit as f64 }).collect();
    if !want_dx {
        return Ok((losses, None));
    }
    subtract_early_targets(head, &mut acc, &stats, tg)?;
    let inv = 1.0 / denom;
    acc.par_chunks_mut(hidden).zip(&stats).for_each(|(a, st)| {
        let k = if st.sum > 0.0 { inv / st.sum } else { 0.0 };
        a.iter_mut().for_each(|v| *v *= k);
    });
    Ok((losses, Some(acc)))
}

/// Folds one row `z` of a slice's logits into `st`: leaves `z = exp(z - max)`
/// with `max` the running max including this slice, and returns
/// `exp(old max - max)`, the factor by which the row's earlier terms shrink.
/// `target` is the target's index when it lies in this slice; in the last
/// slice the final `S` is subtracted there (the one-hot term of the
/// gradient). Max, exp and sum are the vectorized kernels of
/// [`crate::ops::softmax`] and [`crate::ops::activation`] (fixed lane
/// order: the same bits on every run, thread count and CPU).
fn fold_row(z: &mut [f32], st: &mut RowStats, target: Option<usize>, last: bool) -> f32 {
    if let Some(i) = target {
        st.target_logit = z[i];
    }
    let max = lane_max(z).max(st.max);
    let shrink = if st.max == f32::NEG_INFINITY { 0.0 } else { exp(st.max - max) };
    exp_shifted(z, max);
    st.max = max;
    st.sum = st.sum * shrink + lane_sum(z);
    if let (Some(i), true) = (target, last) {
        z[i] -= st.sum;
    }
    shrink
}

/// `acc[r] -= S_r W[target_r]` for rows whose target lies before the last
/// slice, their slice's rows of `W` read through [`Projection::scaled_rows`].
fn subtract_early_targets(head: &[Arc<dyn Projection>], acc: &mut [f32], stats: &[RowStats], tg: &[i64]) -> Result<()> {
    let hidden = head[0].info().in_features;
    let mut first = 0i64;
    for slice in &head[..head.len() - 1] {
        let width = slice.info().out_features as i64;
        let rows: Vec<usize> = (0..tg.len()).filter(|&r| (first..first + width).contains(&tg[r])).collect();
        if !rows.is_empty() {
            let in_slice: Vec<usize> = rows.iter().map(|&r| (tg[r] - first) as usize).collect();
            let sums: Vec<f32> = rows.iter().map(|&r| stats[r].sum).collect();
            let mut w_t = vec![0.0f32; rows.len() * hidden];
            slice.scaled_rows(&in_slice, &sums, &mut w_t)?;
            for (i, &r) in rows.iter().enumerate() {
                acc[r * hidden..(r + 1) * hidden].iter_mut().zip(&w_t[i * hidden..(i + 1) * hidden]).for_each(|(a, w)| *a -= w);
            }
        }
        first += width;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu_projection::CpuProjection;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    fn slices(w: &Arc<Vec<f32>>, hidden: usize, widths: &[usize]) -> Vec<Arc<dyn Projection>> {
        let mut first = 0;
        widths
            .iter()
            .map(|&n| {
                let info = ProjectionInfo { name: "lm_head".into(), kind: ProjectionKind::Mlp, out_features: n, in_features: hidden };
                let p: Arc<dyn Projection> = Arc::new(CpuProjection::window(info, w.clone(), first).unwrap());
                first += n;
                p
            })
            .collect()
    }

    /// f64 loss and dX of `mean_t -log softmax(x W^T)[t]` over valid targets.
    fn reference(x: &[f32], w: &[f32], tg: &[i64], hidden: usize, vocab: usize, denom: f64) -> (f64, Vec<f64>) {
        let mut dx = vec![0f64; x.len()];
        let mut loss = 0.0;
        for (r, &t) in tg.iter().enumerate() {
            if t < 0 {
                continue;
            }
            let z: Vec<f64> = (0..vocab).map(|v| (0..hidden).map(|i| x[r * hidden + i] as f64 * w[v * hidden + i] as f64).sum()).collect();
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            loss += (lse - z[t as usize]) / denom;
            for v in 0..vocab {
                let g = ((z[v] - lse).exp() - if v == t as usize { 1.0 } else { 0.0 }) / denom;
                (0..hidden).for_each(|i| dx[r * hidden + i] += g * w[v * hidden + i] as f64);
            }
        }
        (loss, dx)
    }

    #[test]
    fn vocabulary_slices_match_f64_and_one_slice() {
        let (hidden, vocab, rows) = (6, 37, 5);
        let w = Arc::new((0..vocab * hidden).map(|i| ((i * 7 % 23) as f32 - 11.0) / 4.0).collect::<Vec<f32>>());
        let x: Vec<f32> = (0..rows * hidden).map(|i| ((i * 5 % 13) as f32 - 6.0) / 3.0).collect();
        // targets in the first, middle and last slice, one ignored row
        let tg = [3i64, 20, -100, 36, 16];
        let (want_loss, want_dx) = reference(&x, &w, &tg, hidden, vocab, 4.0);
        for widths in [vec![37], vec![16, 16, 5], vec![10, 27]] {
            for chunk in [2, 5] {
                let head = slices(&w, hidden, &widths);
                let mut logits = Vec::new();
                let out = head_forward_backward(&head, &x, rows, &tg, 4.0, chunk, true, Some(&mut logits)).unwrap();
                assert!((out.loss as f64 - want_loss).abs() < 1e-5 * want_loss, "{widths:?}: {} vs {want_loss}", out.loss);
                let dx = out.dx.unwrap();
                let scale = want_dx.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (g, w) in dx.iter().zip(&want_dx) {
                    assert!((*g as f64 - w).abs() < 1e-5 * scale, "{widths:?}: {g} vs {w}");
                }
                assert!(dx[2 * hidden..3 * hidden].iter().all(|&v| v == 0.0), "ignored row has no gradient");
                assert_eq!(logits.len(), rows * vocab);
                let z = (0..hidden).map(|i| x[hidden + i] as f64 * w[30 * hidden + i] as f64).sum::<f64>();
                assert!((logits[vocab + 30] as f64 - z).abs() < 1e-5);
            }
        }
        let bad = head_forward_backward(&slices(&w, hidden, &[37]), &x, rows, &[0, 1, 2, 3, 37], 1.0, 2, false, None);
        assert!(bad.unwrap_err().to_string().contains("outside the vocabulary"));
    }
}

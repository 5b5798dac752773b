//! Vocabulary head + token cross-entropy + context distillation, fused and
//! chunked over rows (forward and backward together, the loss ends the graph).
//!
//! Per row `t` with a target `y_t >= 0`, student logits `s = x_t W^T`,
//! teacher logits `u = x'_t W^T` (teacher hidden `x'`, same frozen head):
//!
//! ```text
//! ce_t = -log softmax(s)[y_t]
//! kl_t = sum_v p_u(v) (log p_u(v) - log p_s(v))          (KL(teacher || student), T = 1)
//! loss = sum_t (ce_t + w kl_t) / denom
//! dL/ds = (softmax(s) - onehot(y_t) + w (softmax(s) - p_u)) / denom
//! ```
use crate::projection::{Direction, Projection};
use crate::{Error, Result};

/// Sums of one call (not yet divided by `denom`) and `dL/dx`.
pub struct DistillOut {
    /// `sum_t ce_t`.
    pub ce_sum: f64,
    /// `sum_t kl_t` (0 without a teacher).
    pub kl_sum: f64,
    /// `dLoss/dx: [rows, hidden]` for `loss = (ce_sum + w kl_sum) / denom`.
    pub dx: Vec<f32>,
}

/// `log softmax` of `z` in f64.
fn log_softmax(z: &[f32]) -> Vec<f64> {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

/// Turns `s` (student logits of one row) into `dL/ds` and returns
/// `(ce, kl)`. `u` are the teacher's logits when distilling.
fn row(s: &mut [f32], u: Option<&[f32]>, target: usize, w: f32, denom: f32) -> (f64, f64) {
    let ls = log_softmax(s);
    let inv = 1.0 / denom as f64;
    let ce = -ls[target];
    let mut kl = 0.0;
    let lu = u.map(log_softmax);
    for (v, g) in s.iter_mut().enumerate() {
        let ps = ls[v].exp();
        let mut d = ps;
        if let Some(lu) = &lu {
            let pu = lu[v].exp();
            kl += pu * (lu[v] - ls[v]);
            d += w as f64 * (ps - pu);
        }
        *g = (d * inv) as f32;
    }
    s[target] -= inv as f32;
    (ce, kl)
}

/// The fused loss over `x: [rows, hidden]` (student) and optional
/// `teacher: [rows, hidden]` (aligned rows), `targets: [rows]` (negative =
/// ignored; ignored rows get no loss and no gradient). `chunk` rows at a time.
#[allow(clippy::too_many_arguments)]
pub fn head_ce_kl(head: &dyn Projection, x: &[f32], teacher: Option<&[f32]>, targets: &[i64], kl_weight: f32, denom: f32, chunk: usize) -> Result<DistillOut> {
    let info = head.info();
    let (vocab, hidden) = (info.out_features, info.in_features);
    let rows = targets.len();
    if x.len() != rows * hidden || teacher.is_some_and(|t| t.len() != x.len()) {
        return Err(Error::Shape { what: "distillation head input".into(), expected: vec![rows, hidden], got: vec![x.len()] });
    }
    if let Some(t) = targets.iter().find(|&&t| t >= vocab as i64) {
        return Err(Error::invalid("target token", format!("{t} is outside the vocabulary of {vocab}")));
    }
    let active: Vec<usize> = (0..rows).filter(|&r| targets[r] >= 0).collect();
    let mut out = DistillOut { ce_sum: 0.0, kl_sum: 0.0, dx: vec![0.0; rows * hidden] };
    let gather = |src: &[f32], ids: &[usize]| -> Vec<f32> { ids.iter().flat_map(|&r| src[r * hidden..(r + 1) * hidden].iter().copied()).collect() };
    for ids in active.chunks(chunk.max(1)) {
        let n = ids.len();
        let mut s = vec![0.0f32; n * vocab];
        head.apply(Direction::Forward, &gather(x, ids), n, &mut s)?;
        let u = match teacher {
            Some(t) => {
                let mut u = vec![0.0f32; n * vocab];
                head.apply(Direction::Forward, &gather(t, ids), n, &mut u)?;
                Some(u)
            }
            None => None,
        };
        for (i, &r) in ids.iter().enumerate() {
            let ui = u.as_ref().map(|u| &u[i * vocab..(i + 1) * vocab]);
            let (ce, kl) = row(&mut s[i * vocab..(i + 1) * vocab], ui, targets[r] as usize, kl_weight, denom);
            out.ce_sum += ce;
            out.kl_sum += kl;
        }
        let mut dx = vec![0.0f32; n * hidden];
        head.apply(Direction::InputGrad, &s, n, &mut dx)?;
        for (i, &r) in ids.iter().enumerate() {
            out.dx[r * hidden..(r + 1) * hidden].copy_from_slice(&dx[i * hidden..(i + 1) * hidden]);
        }
    }
    if !out.ce_sum.is_finite() || !out.kl_sum.is_finite() {
        return Err(Error::NonFinite("hypernetwork loss".into()));
    }
    Ok(out)
}

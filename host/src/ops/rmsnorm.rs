//! RMSNorm in both checkpoint conventions:
//! - [`NormWeight::Plain`]: `y = w * x / rms(x)` (Llama, Qwen3, and the gated
//!   norm inside Qwen3.5's Gated DeltaNet);
//! - [`NormWeight::OnePlus`]: `y = (1 + w) * x / rms(x)` (Qwen3.5's decoder
//!   and q/k norms, whose weights are stored centred on zero).
//!
//! `rms(x) = sqrt(mean(x^2) + eps)`; the forward saves `rstd = 1 / rms(x)`
//! per row for the backward.
use rayon::prelude::*;
use crate::ops::activation::simd_fn;

/// How the stored weight scales the normalised row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormWeight {
    /// `w * x_hat`.
    Plain,
    /// `(1 + w) * x_hat`.
    OnePlus,
}

impl NormWeight {
    /// The multiplier actually applied for stored weight `w`.
    #[inline]
    pub fn effective(self, w: f32) -> f32 {
        match self {
            NormWeight::Plain => w,
            NormWeight::OnePlus => 1.0 + w,
        }
    }
}

/// Row statistic: `1 / sqrt(mean(x^2) + eps)`, accumulated in f64 so long
/// rows do not drift from PyTorch's pairwise f32 sum.
#[inline]
pub fn rstd_of(row: &[f32], eps: f32) -> f32 {
    (1.0 / (dot_f64(row, row) / row.len() as f64 + eps as f64).sqrt()) as f32
}

/// f64 accumulator lanes of [`dot_f64`] (one AVX-512 register); fixed, so
/// the summation order does not depend on the CPU.
const LANES: usize = 8;

simd_fn! {
    /// `sum(a * b)` in f64: element `i` into lane `i % 8`, the lanes in
    /// order, then the tail.
    fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
        let mut acc = [0.0f64; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x as f64 * y as f64).sum();
        for (x, y) in ca.zip(cb) {
            for l in 0..LANES {
                acc[l] += x[l] as f64 * y[l] as f64;
            }
        }
        acc.iter().sum::<f64>() + tail
    }
}

simd_fn! {
    /// `out = w * (x * r)` over one row (`w` the effective weight).
    fn scale_row(out: &mut [f32], x: &[f32], weight: &[f32], kind: NormWeight, r: f32) {
        match kind {
            NormWeight::Plain => out.iter_mut().zip(x).zip(weight).for_each(|((o, &x), &w)| *o = w * (x * r)),
            NormWeight::OnePlus => out.iter_mut().zip(x).zip(weight).for_each(|((o, &x), &w)| *o = (1.0 + w) * (x * r)),
        }
    }
}

/// `out[rows, dim] = weight(w) * inp * rstd`, `rstd[rows]` saved.
///
/// `inp`, `out`: `[rows, dim]`; `weight`: `[dim]`.
pub fn rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], kind: NormWeight, eps: f32) {
    let dim = weight.len();
    assert!(dim > 0 && inp.len() % dim == 0, "rmsnorm_forward: input not a multiple of {dim}");
    assert_eq!(out.len(), inp.len(), "rmsnorm_forward output length");
    assert_eq!(rstd.len(), inp.len() / dim, "rmsnorm_forward rstd length");
    let rows = ROWS_PER_TASK;
    out.par_chunks_mut(rows * dim).zip(inp.par_chunks(rows * dim)).zip(rstd.par_chunks_mut(rows)).for_each(|((out, inp), rstd)| {
        for ((o, x), r) in out.chunks_exact_mut(dim).zip(inp.chunks_exact(dim)).zip(rstd.iter_mut()) {
            *r = rstd_of(x, eps);
            scale_row(o, x, weight, kind, *r);
        }
    });
}

/// Rows per rayon task: rows are independent (so results do not depend on
/// the split), and one norm of 256 rows on one thread left the other core
/// idle for ~2% of a training step.
const ROWS_PER_TASK: usize = 16;

simd_fn! {
    /// One row of [`rmsnorm_backward`]; `wdy` is scratch `[dim]`.
    fn rmsnorm_backward_row(di: &mut [f32], wdy: &mut [f32], dy: &[f32], x: &[f32], weight: &[f32], kind: NormWeight, r: f32) {
        match kind {
            NormWeight::Plain => wdy.iter_mut().zip(dy).zip(weight).for_each(|((o, &g), &w)| *o = w * g),
            NormWeight::OnePlus => wdy.iter_mut().zip(dy).zip(weight).for_each(|((o, &g), &w)| *o = (1.0 + w) * g),
        }
        let c = (dot_f64(wdy, x) * (r as f64).powi(3) / x.len() as f64) as f32;
        di.iter_mut().zip(wdy.iter()).zip(x).for_each(|((d, &g), &x)| *d = r * g - c * x);
    }
}

/// Input gradient of [`rmsnorm_forward`] (the weight is frozen):
/// `dinp = rstd * (w dout) - rstd^3 / dim * x * sum(w dout x)`.
///
/// `dinp`, `dout`, `inp`: `[rows, dim]`; `rstd`: `[rows]` from the forward.
pub fn rmsnorm_backward(dinp: &mut [f32], dout: &[f32], inp: &[f32], weight: &[f32], rstd: &[f32], kind: NormWeight) {
    let dim = weight.len();
    assert!(dinp.len() == inp.len() && dout.len() == inp.len() && rstd.len() * dim == inp.len(), "rmsnorm_backward lengths");
    let rows = ROWS_PER_TASK;
    let tasks = dinp.par_chunks_mut(rows * dim).zip(dout.par_chunks(rows * dim)).zip(inp.par_chunks(rows * dim)).zip(rstd.par_chunks(rows));
    tasks.for_each(|(((dinp, dout), inp), rstd)| {
        let mut wdy = vec![0.0f32; dim];
        for (((di, dy), x), &r) in dinp.chunks_exact_mut(dim).zip(dout.chunks_exact(dim)).zip(inp.chunks_exact(dim)).zip(rstd) {
            rmsnorm_backward_row(di, &mut wdy, dy, x, weight, kind, r);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_conventions_match_f64() {
        let dim = 7;
        let inp: Vec<f32> = (0..3 * dim).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.7).collect();
        let w: Vec<f32> = (0..dim).map(|i| 0.1 * i as f32 - 0.2).collect();
        for kind in [NormWeight::Plain, NormWeight::OnePlus] {
            let mut out = vec![0.0; inp.len()];
            let mut rstd = vec![0.0; 3];
            rmsnorm_forward(&mut out, &mut rstd, &inp, &w, kind, 1e-5);
            for r in 0..3 {
                let row = &inp[r * dim..(r + 1) * dim];
                let ms: f64 = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / dim as f64;
                let want_rstd = 1.0 / (ms + 1e-5).sqrt();
                assert!((rstd[r] as f64 - want_rstd).abs() < 1e-6 * want_rstd);
                for c in 0..dim {
                    let scale = if kind == NormWeight::Plain { w[c] as f64 } else { 1.0 + w[c] as f64 };
                    let want = scale * row[c] as f64 * want_rstd;
                    assert!((out[r * dim + c] as f64 - want).abs() < 1e-6, "{kind:?} {r} {c}");
                }
            }
        }
    }
}

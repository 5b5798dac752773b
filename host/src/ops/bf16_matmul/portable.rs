//! The portable kernel: the activations rounded to bf16 (kept as f32), and
//! per 64-wide output panel the matching part of W widened to f32 in a
//! per-thread scratch, multiplied with `matrixmultiply`. Memory stays one
//! bf16 copy of W; each panel is widened once per call.
use super::{round_bits, widen};
use crate::ops::SharedMut;
use rayon::prelude::*;

/// Output columns per panel.
const PANEL: usize = 64;

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| widen(round_bits(v))).collect()
}

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]` bits.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) {
    let x = rounded(x);
    // panel = W[n0 .. n0 + cols, :] as f32 `[cols, k]`, read as B = panel^T
    let widen_rows = |n0: usize, cols: usize, panel: &mut Vec<f32>| {
        panel.clear();
        panel.extend(w[n0 * k..(n0 + cols) * k].iter().map(|&b| widen(b)));
        (1, k)
    };
    panels(out, &x, (tokens, k, n), &widen_rows);
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]` bits.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], rows: usize, cols: usize) {
    let dy = rounded(dy);
    // panel = W[:, c0 .. c0 + width] as f32 `[rows, width]`
    let widen_cols = |c0: usize, width: usize, panel: &mut Vec<f32>| {
        panel.clear();
        for r in 0..rows {
            panel.extend(w[r * cols + c0..r * cols + c0 + width].iter().map(|&b| widen(b)));
        }
        (width, 1)
    };
    panels(out, &dy, (tokens, rows, cols), &widen_cols);
}

/// `out[m, n] = a[m, k] B` where `fill(n0, width, panel)` writes columns
/// `n0 .. n0 + width` of B into `panel` and returns its (row, column) strides.
fn panels(out: &mut [f32], a: &[f32], (m, k, n): (usize, usize, usize), fill: &(dyn Fn(usize, usize, &mut Vec<f32>) -> (usize, usize) + Sync)) {
    if m == 0 || n == 0 {
        return;
    }
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..n.div_ceil(PANEL)).into_par_iter().for_each_init(Vec::new, |panel, p| {
        let out_ptr = out_ptr;
        let (n0, width) = (p * PANEL, PANEL.min(n - p * PANEL));
        let (rs, cs) = fill(n0, width, panel);
        // SAFETY: `a` is [m, k], `panel` holds k x width at strides (rs, cs);
        // the call writes columns n0 .. n0 + width of `out` ([m, n]), which no
        // other panel writes; beta = 0 so `out` is not read.
        unsafe {
            matrixmultiply::sgemm(m, k, width, 1.0, a.as_ptr(), k as isize, 1, panel.as_ptr(), rs as isize, cs as isize, 0.0, out_ptr.0.add(n0), n as isize, 1);
        }
    });
}

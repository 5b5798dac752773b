//! Row softmax (numerically stable) and the vocabulary head's logits.
use crate::ops::activation::{exp_shifted, simd_fn};
use crate::ops::matmul::matmul_bt;

/// Accumulator lanes of [`lane_max`] and [`lane_sum`]: one AVX-512 register.
/// The lane count is fixed, not the CPU's, so the summation order (and the
/// bits) are the same on every machine.
const LANES: usize = 16;

simd_fn! {
    /// Largest element (`-inf` for an empty slice; NaNs are skipped).
    pub fn lane_max(x: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
            }
        }
        tail.iter().chain(&acc).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    }
}

simd_fn! {
    /// Sum in a fixed order: element `i` into lane `i % 16`, the tail, then
    /// the lanes pairwise.
    pub fn lane_sum(x: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let chunks = x.chunks_exact(LANES);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
        let mut width = LANES;
        while width > 1 {
            width /= 2;
            for l in 0..width {
                acc[l] += acc[l + width];
            }
        }
        acc[0] + tail
    }
}

/// In-place softmax over each row of `x: [rows, n]`; returns nothing, the
/// result overwrites `x`. Max-subtracted so large logits do not overflow.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    assert!(n > 0 && x.len() % n == 0, "softmax_rows: length not a multiple of {n}");
    for row in x.chunks_exact_mut(n) {
        let max = lane_max(row);
        exp_shifted(row, max);
        let inv = 1.0 / lane_sum(row);
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Vocabulary head: `logits[rows, vocab] = hidden[rows, dim] · table[vocab, dim]^T`.
/// `table` is `lm_head.weight` (or the tied embedding table).
pub fn logits_forward(logits: &mut [f32], hidden: &[f32], table: &[f32], dim: usize) {
    let rows = hidden.len() / dim;
    let vocab = table.len() / dim;
    matmul_bt(logits, hidden, table, (rows, dim, vocab), 1.0, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_reductions_match_f64() {
        for n in [0usize, 1, 15, 16, 17, 100, 4099] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).sin() * (1.0 + i as f32 * 0.01)).collect();
            let want_sum: f64 = x.iter().map(|&v| v as f64).sum();
            let want_max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(lane_max(&x), want_max, "max of {n}");
            let bound = 1e-6 * x.iter().map(|v| v.abs() as f64).sum::<f64>() + 1e-30;
            assert!((lane_sum(&x) as f64 - want_sum).abs() <= bound, "sum of {n}");
        }
    }

    #[test]
    fn softmax_is_stable_and_normalised() {
        let mut x = vec![1000.0, 1001.0, 1002.0, -1.0, 0.0, 1.0];
        softmax_rows(&mut x, 3);
        let e = [(-2.0f64).exp(), (-1.0f64).exp(), 1.0];
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] as f64 - e[i] / s).abs() < 1e-6);
            assert!((x[3 + i] as f64 - e[i] / s).abs() < 1e-6);
        }
    }
}

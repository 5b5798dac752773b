//! Row softmax (numerically stable) and the vocabulary head's logits.
use crate::ops::matmul::matmul_bt;

/// In-place softmax over each row of `x: [rows, n]`; returns nothing, the
/// result overwrites `x`. Max-subtracted so large logits do not overflow.
pub fn softmax_rows(x: &mut [f32], n: usize) {
    assert!(n > 0 && x.len() % n == 0, "softmax_rows: length not a multiple of {n}");
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
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

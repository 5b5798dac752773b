//! SwiGLU gating of an MLP: `out = silu(gate) * up`. The gate and up
//! projections themselves are frozen [`crate::projection::Projection`]s;
//! backward needs `gate` and `up`.
use crate::ops::activation::{exp, silu, simd_fn};
use rayon::prelude::*;

/// Elements per parallel chunk: each element is independent, so the split
/// (and the thread count) cannot change a bit.
const CHUNK: usize = 1 << 14;

/// `out[n] = silu(gate[n]) * up[n]`.
pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) {
    assert!(out.len() == gate.len() && gate.len() == up.len(), "swiglu_forward lengths");
    out.par_chunks_mut(CHUNK).zip(gate.par_chunks(CHUNK)).zip(up.par_chunks(CHUNK)).for_each(|((o, g), u)| forward_chunk(o, g, u));
}

/// Backward of [`swiglu_forward`], with `s = sigmoid(gate)`:
/// `dup = dout * gate * s`, `dgate = dout * up * s * (1 + gate * (1 - s))`.
pub fn swiglu_backward(dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32]) {
    let n = gate.len();
    assert!(dgate.len() == n && dup.len() == n && dout.len() == n && up.len() == n, "swiglu_backward lengths");
    dgate
        .par_chunks_mut(CHUNK)
        .zip(dup.par_chunks_mut(CHUNK))
        .zip(dout.par_chunks(CHUNK))
        .zip(gate.par_chunks(CHUNK))
        .zip(up.par_chunks(CHUNK))
        .for_each(|((((dg, du), d), g), u)| backward_chunk(dg, du, d, g, u));
}

simd_fn! {
    fn forward_chunk(out: &mut [f32], gate: &[f32], up: &[f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = silu(g) * u;
        }
    }
}

simd_fn! {
    fn backward_chunk(dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32]) {
        let n = gate.len();
        assert!(dgate.len() == n && dup.len() == n && dout.len() == n && up.len() == n);
        for i in 0..n {
            let (d, g, u) = (dout[i], gate[i], up[i]);
            let s = 1.0 / (1.0 + exp(-g));
            dup[i] = d * g * s;
            dgate[i] = d * u * s * (1.0 + g * (1.0 - s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward and backward against f64 over the range where silu bends
    /// and saturates (both tails, and the ±inf limits of the exp).
    #[test]
    fn forward_and_backward_match_f64() {
        let n = 10_007;
        let gate: Vec<f32> = (0..n).map(|i| -120.0 + 240.0 * i as f32 / n as f32).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let dout: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0.0; n];
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        swiglu_forward(&mut out, &gate, &up);
        swiglu_backward(&mut dg, &mut du, &dout, &gate, &up);
        for i in 0..n {
            let (g, u, d) = (gate[i] as f64, up[i] as f64, dout[i] as f64);
            let s = 1.0 / (1.0 + (-g).exp());
            let close = |got: f32, want: f64| (got as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30;
            assert!(close(out[i], g * s * u), "out({g})");
            assert!(close(du[i], d * g * s), "dup({g})");
            // `1 + g (1 - s)` cancels near g = -1.28, and `1 - s` (s rounded
            // to f32) is off by up to an ulp of 1 for large g: bound by both.
            let scale = (d * u * s).abs() * (1e-6 * (1.0 + (g * (1.0 - s)).abs()) + g.abs() * f32::EPSILON as f64);
            assert!((dg[i] as f64 - d * u * s * (1.0 + g * (1.0 - s))).abs() <= scale + 1e-30, "dgate({g})");
        }
    }

    #[test]
    fn matches_definition() {
        let gate = [-2.0f32, 0.0, 1.5];
        let up = [3.0f32, 5.0, -2.0];
        let mut out = [0.0; 3];
        swiglu_forward(&mut out, &gate, &up);
        for i in 0..3 {
            let g = gate[i] as f64;
            let want = g / (1.0 + (-g).exp()) * up[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-6);
        }
    }
}

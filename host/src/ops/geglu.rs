//! GeGLU gating of an MLP (Gemma): `out = gelu_tanh(gate) * up`, with
//! PyTorch's `gelu(approximate="tanh")`:
//! `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, its operations in
//! PyTorch's order (forward and `GeluBackward`'s derivative). The backward
//! needs `gate` and `up`.
use rayon::prelude::*;

/// Elements per parallel chunk: each element is independent, so the split
/// (and the thread count) cannot change a bit.
const CHUNK: usize = 1 << 14;
/// `sqrt(2 / pi)`, as PyTorch spells it (`M_SQRT2 * M_2_SQRTPI * 0.5`).
const BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
const KAPPA: f32 = 0.044715;

/// PyTorch's tanh-approximated GELU.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = BETA * (x + KAPPA * (x * x * x));
    0.5 * x * (1.0 + inner.tanh())
}

/// `d gelu_tanh / dx`, as PyTorch's tanh-GELU backward computes it:
/// `0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2)`, `t = tanh(inner)`.
#[inline]
pub fn gelu_tanh_derivative(x: f32) -> f32 {
    let x_sq = x * x;
    let t = (BETA * (x + KAPPA * (x_sq * x))).tanh();
    let left_derivative = 0.5 * (1.0 + t);
    let inner_derivative = BETA * (1.0 + 3.0 * KAPPA * x_sq);
    left_derivative + 0.5 * x * (1.0 - t * t) * inner_derivative
}

/// Backward of [`geglu_forward`]: `dup = dout gelu_tanh(gate)`,
/// `dgate = dout up gelu_tanh'(gate)`.
pub fn geglu_backward(dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32]) {
    let n = gate.len();
    assert!(dgate.len() == n && dup.len() == n && dout.len() == n && up.len() == n, "geglu_backward lengths");
    dgate
        .par_chunks_mut(CHUNK)
        .zip(dup.par_chunks_mut(CHUNK))
        .zip(dout.par_chunks(CHUNK).zip(gate.par_chunks(CHUNK)).zip(up.par_chunks(CHUNK)))
        .for_each(|((dg, du), ((d, g), u))| {
            for i in 0..g.len() {
                du[i] = d[i] * gelu_tanh(g[i]);
                dg[i] = d[i] * u[i] * gelu_tanh_derivative(g[i]);
            }
        });
}

/// `out[n] = gelu_tanh(gate[n]) * up[n]`.
pub fn geglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) {
    assert!(out.len() == gate.len() && gate.len() == up.len(), "geglu_forward lengths");
    out.par_chunks_mut(CHUNK).zip(gate.par_chunks(CHUNK)).zip(up.par_chunks(CHUNK)).for_each(|((o, g), u)| {
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = gelu_tanh(g) * u;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 function against the formula in f64, over the bend and both
    /// tails (where tanh saturates to +-1 and the output to x or 0). Below
    /// about -3, `1 + tanh` cancels in f32 (in PyTorch too), so the error
    /// is bounded by a few ulp of `x`, not of the result.
    #[test]
    fn gelu_tanh_matches_f64() {
        let gelu64 = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        for i in -20_000..=20_000 {
            let x = i as f32 * 1e-3;
            let (got, want) = (gelu_tanh(x) as f64, gelu64(x as f64));
            let tol = 4.0 * f32::EPSILON as f64 * (want.abs() + (x as f64).abs());
            assert!((got - want).abs() <= tol, "gelu_tanh({x}) = {got}, f64 {want}");
        }
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(-30.0), 0.0);
        assert_eq!(gelu_tanh(30.0), 30.0);
    }

    /// The derivative against the f64 formula's central differences.
    #[test]
    fn gelu_tanh_derivative_matches_f64() {
        let gelu64 = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        for i in -8_000..=8_000 {
            let x = i as f64 * 1e-3;
            let h = 1e-5;
            let want = (gelu64(x + h) - gelu64(x - h)) / (2.0 * h);
            let got = gelu_tanh_derivative(x as f32) as f64;
            assert!((got - want).abs() <= 1e-6 * (1.0 + x.abs()), "gelu_tanh'({x}) = {got}, f64 {want}");
        }
    }

    #[test]
    fn geglu_multiplies_by_up() {
        // black_box: LLVM would fold `gelu_tanh` of constants with the
        // build machine's tanhf, which musl's differs from by an ulp.
        let (gate, up) = std::hint::black_box(([-1.0f32, 0.5, 2.0], [3.0f32, -2.0, 0.25]));
        let mut out = [0.0; 3];
        geglu_forward(&mut out, &gate, &up);
        for i in 0..3 {
            assert_eq!(out[i], gelu_tanh(gate[i]) * up[i]);
        }
    }
}

//! SwiGLU gating of an MLP: `out = silu(gate) * up`. The gate and up
//! projections themselves are frozen [`crate::projection::Projection`]s;
//! backward needs `gate` and `up`.
use crate::ops::activation::silu;

/// `out[n] = silu(gate[n]) * up[n]`.
pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) {
    assert!(out.len() == gate.len() && gate.len() == up.len(), "swiglu_forward lengths");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// Backward of [`swiglu_forward`]: `dup = dout * silu(gate)`,
/// `dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))`.
pub fn swiglu_backward(dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32]) {
    assert!(dgate.len() == gate.len() && dup.len() == up.len() && dout.len() == gate.len(), "swiglu_backward lengths");
    for ((((dg, du), &d), &g), &u) in dgate.iter_mut().zip(dup.iter_mut()).zip(dout).zip(gate).zip(up) {
        let s = crate::ops::activation::sigmoid(g);
        *du = d * g * s;
        *dg = d * u * s * (1.0 + g * (1.0 - s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

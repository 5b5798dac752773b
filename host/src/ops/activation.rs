//! Scalar activations shared by several kernels, written to match PyTorch's
//! definitions (`F.silu`, `torch.sigmoid`, `F.softplus` with threshold 20).

/// `1 / (1 + e^-x)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `log(1 + e^x)`, linear above 20 as `F.softplus` (beta 1, threshold 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `out = silu(inp)`, elementwise. Backward needs `inp`.
pub fn silu_forward(out: &mut [f32], inp: &[f32]) {
    assert_eq!(out.len(), inp.len(), "silu_forward lengths");
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = silu(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_match_f64_definitions() {
        for &x in &[-30.0f32, -5.0, -0.3, 0.0, 0.7, 4.0, 19.9, 25.0] {
            let xd = x as f64;
            let sig = 1.0 / (1.0 + (-xd).exp());
            assert!((sigmoid(x) as f64 - sig).abs() < 1e-7);
            assert!((silu(x) as f64 - xd * sig).abs() < 1e-6 * (1.0 + xd.abs()));
            let sp = if xd > 20.0 { xd } else { (1.0 + xd.exp()).ln() };
            assert!((softplus(x) as f64 - sp).abs() < 1e-6 * (1.0 + sp.abs()), "softplus({x})");
        }
    }
}

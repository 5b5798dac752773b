//! Activations shared by several kernels, written to match PyTorch's
//! definitions (`F.silu`, `torch.sigmoid`, `F.softplus` with threshold 20),
//! and the f32 `exp` they are built on.
//!
//! [`exp`] is branch-free (range reduction by `ln 2`, a degree-7 polynomial,
//! a two-step power-of-two scale so subnormal results round once), so slice
//! loops over it vectorize. It uses plain IEEE adds, multiplies and divides
//! only (no fused multiply-add), so the scalar function, the portable slice
//! loops and their AVX-512 builds (see [`simd_fn!`]) return the same bits:
//! results never depend on which CPU ran them. Error: under 1 ulp (0.98)
//! on the ~74M values the tests compare with f64, which assert <= 2 ulp.

/// `e^x` underflows to 0 below this (e^-104 is under half the smallest
/// subnormal) and the clamp keeps the scale exponents in range.
const EXP_LO: f32 = -104.0;
/// `e^x` overflows to +inf above 88.73; clamping at 89 still overflows.
const EXP_HI: f32 = 89.0;
/// `1.5 * 2^23`: adding it rounds to an integer held in the low mantissa bits.
const SHIFTER: f32 = 12_582_912.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so `n * LN2_HI` is exact for |n| <= 256 (Cephes' C1, C2).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf` polynomial: `e^r ~ 1 + r + r^2 P(r)` on |r| <= ln2 / 2.
const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];

/// `2^n` for `-126 <= n <= 127`, built from its exponent bits.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// `e^x` in f32: 0 below -103.97, +inf above 88.73, NaN for NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Selects, not min/max: a NaN fails both tests and flows through.
    let x_c = if x < EXP_LO { EXP_LO } else { x };
    let x_c = if x_c > EXP_HI { EXP_HI } else { x_c };
    let shifted = x_c * LOG2E + SHIFTER;
    let n_f = shifted - SHIFTER;
    let n = (shifted.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let r = (x_c - n_f * LN2_HI) - n_f * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + c;
    }
    let e_r = p * (r * r) + r + 1.0;
    // n is in [-150, 128]: two halves keep each factor a normal power of
    // two, so only the last multiply rounds (into a subnormal, if need be).
    let n_lo = n >> 1;
    e_r * pow2(n_lo) * pow2(n.wrapping_sub(n_lo))
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `x * sigmoid(x)`. (`x / (1 + e^-x)` rounds differently, and the
/// Qwen3.5 gradient fixtures are sensitive enough to notice.)
#[inline(always)]
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

/// Defines a slice kernel whose body is compiled three times on x86-64,
/// portable, with AVX2 and with AVX-512F enabled, and picks the widest
/// build at run time that the CPU has. The body must be plain f32
/// arithmetic (no `mul_add`): Rust never contracts `a * b + c`, so all
/// builds round identically and return the same bits (NaN payloads
/// aside); only the vector width differs. On aarch64 NEON is part of the
/// base target, so the one build there is already the NEON build
/// (4 lanes), with the same bits again.
macro_rules! simd_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::ops::activation::SimdBuild::detect() {
                    // SAFETY: the CPU reports AVX-512F.
                    $crate::ops::activation::SimdBuild::Avx512 => return unsafe { wide($($arg),*) },
                    // SAFETY: the CPU reports AVX2.
                    $crate::ops::activation::SimdBuild::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::ops::activation::SimdBuild::Base => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use simd_fn;

/// The build of its body a [`simd_fn!`] kernel runs on this CPU.
#[derive(Clone, Copy)]
pub enum SimdBuild {
    /// Compiled with AVX-512F.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Compiled with AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The target's base features (on aarch64 these include NEON).
    Base,
}

impl SimdBuild {
    /// The widest build this CPU has.
    #[inline(always)]
    pub fn detect() -> SimdBuild {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return SimdBuild::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return SimdBuild::Avx2;
            }
        }
        SimdBuild::Base
    }

    /// Its name (`hexlora info`).
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            SimdBuild::Avx512 => "avx512f",
            #[cfg(target_arch = "x86_64")]
            SimdBuild::Avx2 => "avx2",
            SimdBuild::Base if cfg!(target_arch = "aarch64") => "neon (the aarch64 base target)",
            SimdBuild::Base => "portable",
        }
    }
}

simd_fn! {
    /// `x = e^x`, elementwise, in place (the same bits as [`exp`]).
    pub fn exp_slice(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = exp(*v));
    }
}

simd_fn! {
    /// `x = e^(x - shift)`, elementwise, in place: a softmax numerator
    /// with `shift` the row maximum.
    pub fn exp_shifted(x: &mut [f32], shift: f32) {
        x.iter_mut().for_each(|v| *v = exp(*v - shift));
    }
}

simd_fn! {
    /// `out = sigmoid(inp)`, elementwise.
    pub fn sigmoid_forward(out: &mut [f32], inp: &[f32]) {
        assert_eq!(out.len(), inp.len(), "sigmoid_forward lengths");
        out.iter_mut().zip(inp).for_each(|(o, &x)| *o = sigmoid(x));
    }
}

simd_fn! {
    /// `out = silu(inp)`, elementwise. Backward needs `inp`.
    pub fn silu_forward(out: &mut [f32], inp: &[f32]) {
        assert_eq!(out.len(), inp.len(), "silu_forward lengths");
        out.iter_mut().zip(inp).for_each(|(o, &x)| *o = silu(x));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance from `got` to the exact `want`, in f32 ulps at `want`
    /// (subnormal spacing below the normal range).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let exponent = if w == 0.0 || !w.is_normal() { -149 } else { (w.abs().to_bits() >> 23) as i32 - 127 - 23 };
        (got as f64 - want).abs() / 2f64.powi(exponent)
    }

    #[test]
    fn exp_within_two_ulp_of_f64_over_the_whole_range() {
        // Every 61st bit pattern (about 70M values, all exponents and signs)
        // plus a dense sweep of the range where the result is finite.
        let sparse = (0..u32::MAX / 61).map(|i| f32::from_bits(i * 61));
        let dense = (0..4_000_000).map(|i| -104.0 + 193.0 * i as f32 / 4e6);
        let mut worst = (0.0f64, 0.0f32);
        for x in sparse.chain(dense).filter(|x| !x.is_nan()) {
            let want = (x as f64).exp();
            let got = exp(x);
            if want > f32::MAX as f64 {
                // Correct is +inf past MAX + half an ulp, MAX just below it.
                assert!(got == f32::INFINITY || (got == f32::MAX && want < f32::MAX as f64 * (1.0 + 2f64.powi(-24))), "exp({x}) = {got}");
                continue;
            }
            let e = ulps(got, want);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        println!("exp: worst {:.3} ulp at {}", worst.0, worst.1);
        assert!(worst.0 <= 2.0, "exp: {} ulp at {}", worst.0, worst.1);
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(88.72).is_finite() && exp(88.72) > 3.3e38);
        assert!(exp(-103.0) > 0.0 && exp(-103.0) < f32::MIN_POSITIVE, "subnormal result");
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001), f32::from_bits(0xffc1_2345)] {
            assert!(exp(nan).is_nan());
            let mut s = [nan];
            exp_slice(&mut s);
            assert!(s[0].is_nan());
        }
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(-200.0), 0.0);
    }

    /// The slice kernels (the widest build this CPU runs) give the scalar
    /// function's bits, including the loop tails.
    #[test]
    fn slice_kernels_match_scalar_bits() {
        let xs: Vec<f32> = (0..100_003u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))).collect();
        let mut e = xs.clone();
        exp_slice(&mut e);
        let mut shifted = xs.clone();
        exp_shifted(&mut shifted, 1.5);
        let (mut sig, mut si) = (vec![0.0; xs.len()], vec![0.0; xs.len()]);
        sigmoid_forward(&mut sig, &xs);
        silu_forward(&mut si, &xs);
        // NaN in, NaN out; which NaN (sign, payload) is up to the instructions
        let same = |got: f32, want: f32| got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
        for (i, &x) in xs.iter().enumerate() {
            assert!(same(e[i], exp(x)), "exp({x})");
            assert!(same(shifted[i], exp(x - 1.5)), "exp({x} - 1.5)");
            assert!(same(sig[i], sigmoid(x)), "sigmoid({x})");
            assert!(same(si[i], silu(x)), "silu({x})");
        }
    }

    #[test]
    fn activations_match_f64_definitions() {
        for &x in &[-90.0f32, -30.0, -5.0, -0.3, 0.0, 0.7, 4.0, 19.9, 25.0, 95.0] {
            let xd = x as f64;
            let sig = 1.0 / (1.0 + (-xd).exp());
            assert!((sigmoid(x) as f64 - sig).abs() < 1e-7 * sig.max(1e-30), "sigmoid({x})");
            assert!((silu(x) as f64 - xd * sig).abs() < 2e-7 * (xd * sig).abs().max(1e-30), "silu({x})");
            let sp = if xd > 20.0 { xd } else { (1.0 + xd.exp()).ln() };
            assert!((softplus(x) as f64 - sp).abs() < 1e-6 * (1.0 + sp.abs()), "softplus({x})");
        }
    }
}

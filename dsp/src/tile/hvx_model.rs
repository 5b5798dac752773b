//! Bit-level models of the HVX v68+ instructions the HVX float tile engine
//! uses, in plain Rust that runs on any target (natively and under
//! qemu-hexagon, which executes no HVX float: qemu 7.2 lacks it and
//! qemu-hexagon 10 aborts on it).
//!
//! A vector is 32 words (`w[k]`, the 128 bytes in memory order); halfword
//! lane `h[2k]` is the low half of `w[k]` and `h[2k + 1]` the high half, as
//! in the HVX register file (little-endian). A pair's `v[0]` is the low
//! (even-numbered) register, `v[1]` the high one.
//!
//! Reference for the floating-point semantics: the instruction definitions
//! QEMU imports from Qualcomm's architecture library,
//! `target/hexagon/imported/mmvec/ext.idef` (the "KVX - IEEE FP
//! Instructions" block, as of QEMU's HVX IEEE-FP series, 2026), together
//! with `mmvec/hvx_ieee_fp.{c,h}`:
//!
//! - `Vxx32.sf+=vmpy(Vu32.hf,Vv32.hf)`, for each word lane `i`:
//!   `Vxx.v[0].sf[i] = float32_muladd(f16_to_f32(Vu.hf[2i]),
//!   f16_to_f32(Vv.hf[2i]), Vxx.v[0].sf[i])` and the same for `v[1]` with
//!   the odd halfwords `2i + 1`: even products go to the low register, odd
//!   products to the high one; one fused IEEE rounding, to nearest even;
//! - `Vd32.sf=vadd(Vu32.sf,Vv32.sf)`: `float32_add`, to nearest even;
//! - a NaN result is Hexagon's default NaN `0x7FFFFFFF` (`FP32_DEF_NAN`);
//! - subnormal inputs and results are kept (gradual underflow): nothing in
//!   that reference flushes them. This is the reference's behaviour, not
//!   verified on a device.
//!
//! The integer-side instructions follow the HVX Programmer's Reference
//! (80-N2040-61): `Vd=vsplat(Rt)` sets every word to `Rt`; `vzero` clears
//! all bits; `vcombine(Vu,Vv)` makes the pair `v[1] = Vu`, `v[0] = Vv`.
//!
//! Why the fused multiply-add is computed as `p + c` here: both factors are
//! FP16 values widened exactly, so `p = a * b` has at most 22 significant
//! bits, and its exponent stays in f32's normal range (|p| is 0 or in
//! [2^-48, 65504^2 < 2^32]). `p` is therefore exact in f32, and one
//! correctly rounded f32 add of `p` and `c` is the single rounding of
//! `a*b + c` that `float32_muladd` performs. The tests check this against
//! the host's `f32::mul_add` (a real fused multiply-add) bit for bit.
use super::hvx_float::HvxFloat;
use half::f16;

/// Hexagon's default NaN for single precision.
pub const SF_DEFAULT_NAN: u32 = 0x7fff_ffff;

/// One modelled HVX vector: 32 words in memory order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Vector(pub [u32; 32]);

/// One modelled vector pair: `v[0]` (low register), `v[1]` (high register).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Pair(pub [Vector; 2]);

impl Vector {
    /// Halfword lane `k` (0..64).
    pub fn hf(&self, k: usize) -> u16 {
        (self.0[k / 2] >> (16 * (k % 2))) as u16
    }
}

/// `f16_to_f32`: exact widening (every FP16 value, subnormals included, is
/// an f32 value; NaNs stay NaN).
fn hf_to_sf(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// The result of an IEEE single operation as Hexagon stores it.
fn sf_bits(x: f32) -> u32 {
    if x.is_nan() {
        SF_DEFAULT_NAN
    } else {
        x.to_bits()
    }
}

/// `float32_muladd(hf_to_sf(a), hf_to_sf(b), c)` for FP16 `a`, `b` (see the
/// module docs for why one f32 add is the fused operation here).
pub fn sf_mpyacc_hf(c: u32, a: u16, b: u16) -> u32 {
    let p = hf_to_sf(a) * hf_to_sf(b);
    sf_bits(p + f32::from_bits(c))
}

/// `float32_add`.
pub fn sf_add(u: u32, v: u32) -> u32 {
    sf_bits(f32::from_bits(u) + f32::from_bits(v))
}

/// The instruction models as an [`HvxFloat`] implementation.
pub struct Model;

impl HvxFloat for Model {
    type V = Vector;
    type W = Pair;

    fn load_sf(row: &[f32; 32]) -> Vector {
        Vector(core::array::from_fn(|k| row[k].to_bits()))
    }

    fn load_hf(row: &[f16; 64]) -> Vector {
        Vector(core::array::from_fn(|k| {
            u32::from(row[2 * k].to_bits()) | u32::from(row[2 * k + 1].to_bits()) << 16
        }))
    }

    fn store_sf(row: &mut [f32; 32], v: Vector) {
        for (o, w) in row.iter_mut().zip(v.0) {
            *o = f32::from_bits(w);
        }
    }

    fn zero() -> Vector {
        Vector([0; 32])
    }

    fn splat(rt: u32) -> Vector {
        Vector([rt; 32])
    }

    fn combine(hi: Vector, lo: Vector) -> Pair {
        Pair([lo, hi])
    }

    fn lo(w: Pair) -> Vector {
        w.0[0]
    }

    fn hi(w: Pair) -> Vector {
        w.0[1]
    }

    fn vmpyacc_sf_hf(xx: Pair, u: Vector, v: Vector) -> Pair {
        let [x0, x1] = xx.0;
        Pair([
            Vector(core::array::from_fn(|i| {
                sf_mpyacc_hf(x0.0[i], u.hf(2 * i), v.hf(2 * i))
            })),
            Vector(core::array::from_fn(|i| {
                sf_mpyacc_hf(x1.0[i], u.hf(2 * i + 1), v.hf(2 * i + 1))
            })),
        ])
    }

    fn vadd_sf(u: Vector, v: Vector) -> Vector {
        Vector(core::array::from_fn(|i| sf_add(u.0[i], v.0[i])))
    }
}

#[cfg(test)]
mod tests {
    //! The models against independent definitions: the host's fused
    //! multiply-add and f64 arithmetic, on random bit patterns and on the
    //! FP16 extremes (subnormals, the largest finite values, zeros of both
    //! signs, infinities and NaNs).
    use super::*;
    use crate::kernels::testbed::Rng;

    /// FP16 bit patterns worth covering by hand.
    const HF_EDGES: [u16; 14] = [
        0x0000, 0x8000, // +-0
        0x0001, 0x8001, // smallest subnormal
        0x03ff, 0x83ff, // largest subnormal
        0x0400, // smallest normal
        0x3c00, 0xbc00, // +-1
        0x7bff, 0xfbff, // +-65504
        0x7c00, 0xfc00, // +-inf
        0x7e00, // NaN
    ];

    fn hf_cases() -> impl Iterator<Item = u16> {
        let mut rng = Rng(0x5eed);
        HF_EDGES
            .into_iter()
            .chain((0..400).map(move |_| rng.next_u64() as u16))
    }

    /// The reference operation: one fused rounding, default NaN.
    fn reference_mpyacc(c: u32, a: u16, b: u16) -> u32 {
        let r = hf_to_sf(a).mul_add(hf_to_sf(b), f32::from_bits(c));
        if r.is_nan() {
            SF_DEFAULT_NAN
        } else {
            r.to_bits()
        }
    }

    #[test]
    fn mpyacc_equals_a_fused_multiply_add_bit_for_bit() {
        let mut rng = Rng(7);
        let mut accs: Vec<u32> =
            vec![0, 0x8000_0000, 0x3f80_0000, 0x0000_0001, 0x7f7f_ffff, 0xff80_0000, 0x7fc0_0000];
        accs.extend((0..40).map(|_| rng.next_u64() as u32));
        // Accumulators near the products' scale, where cancellation and
        // rounding ties happen.
        accs.extend((0..40).map(|_| (rng.unit() * 4.0).to_bits()));
        let hfs: Vec<u16> = hf_cases().collect();
        let mut checked = 0;
        for &c in &accs {
            for &a in hfs.iter().step_by(3) {
                for &b in hfs.iter().step_by(5) {
                    assert_eq!(
                        sf_mpyacc_hf(c, a, b),
                        reference_mpyacc(c, a, b),
                        "c={c:#x} a={a:#x} b={b:#x}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn products_of_fp16_values_are_exact_in_f32() {
        for a in hf_cases() {
            for b in hf_cases().step_by(7) {
                let (x, y) = (f16::from_bits(a).to_f64(), f16::from_bits(b).to_f64());
                let p = hf_to_sf(a) * hf_to_sf(b);
                if (x * y).is_finite() {
                    assert_eq!(p as f64, x * y, "{a:#x} * {b:#x}");
                }
            }
        }
    }

    #[test]
    fn add_rounds_to_nearest_even_and_returns_the_default_nan() {
        // 1 + 2^-24 is a tie: to even is 1.0; 1 + 3*2^-24 rounds up.
        assert_eq!(
            sf_add(1f32.to_bits(), 2f32.powi(-24).to_bits()),
            1f32.to_bits()
        );
        assert_eq!(
            sf_add(1f32.to_bits(), (3.0 * 2f32.powi(-24)).to_bits()),
            (1.0 + 2f32.powi(-22)).to_bits()
        );
        assert_eq!(
            sf_add(f32::INFINITY.to_bits(), f32::NEG_INFINITY.to_bits()),
            SF_DEFAULT_NAN
        );
        // Subnormals are kept: the smallest subnormal plus itself.
        assert_eq!(sf_add(1, 1), 2);
        let mut rng = Rng(11);
        for _ in 0..10_000 {
            let (u, v) = (rng.unit() * 1e3, rng.unit() * 1e-3);
            let exact = u as f64 + v as f64;
            let got = f32::from_bits(sf_add(u.to_bits(), v.to_bits())) as f64;
            // Correct rounding: within half an ulp of the exact sum.
            let ulp = (got.abs() * f32::EPSILON as f64).max(f64::MIN_POSITIVE);
            assert!((got - exact).abs() <= ulp / 2.0, "{u} + {v}");
        }
    }

    #[test]
    fn vmpyacc_sends_even_halfwords_to_the_low_register() {
        // u.hf[k] = k + 1, v.hf[k] = 1: the low register must see the odd
        // numbers 1, 3, 5, ... (even lanes), the high one 2, 4, 6, ...
        let mut u_row = [f16::ZERO; 64];
        for (k, x) in u_row.iter_mut().enumerate() {
            *x = f16::from_f32(k as f32 + 1.0);
        }
        let u = Model::load_hf(&u_row);
        let v = Model::load_hf(&[f16::ONE; 64]);
        let acc = Model::combine(Model::splat(100f32.to_bits()), Model::zero());
        let out = Model::vmpyacc_sf_hf(acc, u, v);
        for i in 0..32 {
            assert_eq!(f32::from_bits(Model::lo(out).0[i]), (2 * i + 1) as f32);
            assert_eq!(
                f32::from_bits(Model::hi(out).0[i]),
                100.0 + (2 * i + 2) as f32
            );
        }
    }

    #[test]
    fn splat_of_an_fp16_pair_fills_even_and_odd_halfwords() {
        let v = Model::splat(0xbc00_3c00); // hf pair (1.0, -1.0)
        for k in 0..64 {
            assert_eq!(v.hf(k), if k % 2 == 0 { 0x3c00 } else { 0xbc00 });
        }
    }
}

//! Q4_0, Q4_1 and Q8_0 weights decoded straight to bf16 bits: the values
//! `Bf16Matrix::from_f32` makes of `dequantize`'s f32, bit for bit, without
//! the f32 in between.
//!
//! Why: training holds its frozen weights in bf16 (half of f32), ~203 MiB
//! for SmolLM2-135M's layers. Their Q4 blocks are ~63 MiB. A projection
//! that keeps the blocks and decodes them as a kernel packs its panels (or
//! into a scratch table before each product) computes exactly what the
//! bf16 copy computes, at a fraction of the resident memory
//! (`ops::cpu_projection::Bf16Projection`).
//!
//! A Q4 weight is `d q + m` with an f16 `d`, an f16 or exact `m` and a
//! nibble `q`: `d q` is exact in f32, so one FMA gives the dequantized
//! value. A block has only 16 possible values; the AVX-512 decoder rounds
//! those 16 to bf16 once and picks each nibble's with `vpermw`. Only that
//! decoder exists: elsewhere [`available`] is false and the projections
//! keep their bf16 copies (a portable decoder would cost more time per
//! step than the memory is worth there; not measured).
use crate::base::dtype::DType;
use rayon::prelude::*;

/// Whether this CPU has the decoder (AVX-512 F and BW).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether blocks of `dtype` can be decoded here (Q8_0 also needs
/// AVX512-BF16, whose rounding instruction it uses).
pub fn decodes(dtype: DType) -> bool {
    match dtype {
        DType::Q4_0 | DType::Q4_1 => available(),
        #[cfg(target_arch = "x86_64")]
        DType::Q8_0 => available() && std::arch::is_x86_feature_detected!("avx512bf16"),
        _ => false,
    }
}

/// Bytes of one 32-value block of `dtype` (Q4_0, Q4_1 or Q8_0).
fn block_bytes(dtype: DType) -> usize {
    assert!(matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0), "quant_bf16 decodes Q4_0, Q4_1 and Q8_0, not {dtype:?}");
    dtype.bytes_for(32).expect("one whole block")
}

/// Decodes `bytes` (whole rows of `cols` values of `dtype`) into `out`,
/// one bf16 per value, rows in parallel.
///
/// Panics if [`decodes`] is false for `dtype` or the lengths disagree.
pub fn decode_rows(dtype: DType, bytes: &[u8], cols: usize, out: &mut [u16]) {
    assert!(decodes(dtype), "quant_bf16 cannot decode {dtype:?} on this CPU");
    let row_bytes = dtype.bytes_for(cols).expect("whole blocks per row");
    assert_eq!(bytes.len() / row_bytes * cols, out.len(), "quant_bf16 output length");
    assert_eq!(bytes.len() % row_bytes, 0, "quant_bf16 whole rows");
    let bb = block_bytes(dtype);
    // Tasks of ~64 KB of output: a few per thread for a projection.
    let rows_per_task = (32 * 1024 / cols).max(1);
    out.par_chunks_mut(rows_per_task * cols).zip(bytes.par_chunks(rows_per_task * row_bytes)).for_each(|(o, b)| {
        // SAFETY: `decodes` saw AVX-512 F and BW; `b` holds whole blocks
        // and `o` 32 values for each.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            x86::blocks(dtype, b, bb, o)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no decoder on this architecture ({} bytes, {} values, {bb})", b.len(), o.len());
    });
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use crate::base::dtype::DType;
    use std::arch::x86_64::*;

    /// `bf16::from_f32(v).to_bits()` of 16 lanes, in the low half of each
    /// 32-bit lane (as `bf16_matmul::round_bits`: nearest even, NaN kept
    /// quiet).
    #[inline(always)]
    pub(crate) unsafe fn round_bits(v: __m512) -> __m512i {
        let b = _mm512_castps_si512(v);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))));
        let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fff_ffff)), _mm512_set1_epi32(0x7f80_0000));
        let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x0040));
        _mm512_mask_mov_epi32(rounded, nan, quiet)
    }

    /// The f16 at `p`, exactly, in every lane.
    #[inline(always)]
    unsafe fn splat_f16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_set1_epi16(std::ptr::read_unaligned(p as *const i16)))
    }

    /// Every block of `bytes` (`bb` bytes each, of `dtype`) into 32 bf16
    /// of `out`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn blocks(dtype: DType, bytes: &[u8], bb: usize, out: &mut [u16]) {
        for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(32)) {
            _mm512_storeu_si512(o.as_mut_ptr() as *mut __m512i, block(dtype, blk.as_ptr()));
        }
    }

    /// The 32 bf16 of the `dtype` block (Q4_0, Q4_1 or Q8_0) at `p`, in
    /// order (the AMX and AVX512-BF16 kernels pack their panels from these).
    ///
    /// # Safety
    /// AVX-512 F and BW available; `p` starts a whole block.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub(crate) unsafe fn block(dtype: DType, p: *const u8) -> __m512i {
        match dtype {
            DType::Q8_0 => q8_0(p),
            _ => q4(dtype == DType::Q4_1, p),
        }
    }

    /// A Q8_0 block: `q d` per value, exact in f32 (an 8-bit by 11-bit
    /// product), then rounded to bf16 by `VCVTNE2PS2BF16`: nearest even
    /// and quiet NaNs as `round_bits`, and its flushing of subnormal inputs
    /// never applies (a nonzero `q d` is at least 2^-24, the least f16
    /// subnormal). A third of the instructions of the integer rounding,
    /// which made a tied SmolLM2 head held in Q8_0 cost 3% of a training
    /// step (Zen 4, 2026-12-04).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[inline]
    unsafe fn q8_0(p: *const u8) -> __m512i {
        let d = splat_f16(p);
        let half = |h: usize| _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(2 + 16 * h) as *const __m128i))), d);
        // SAFETY: `__m512bh` and `__m512i` are both 64 bytes of lanes.
        std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(half(1), half(0)))
    }

    /// A Q4_1 (`q4_1`) or Q4_0 block.
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn q4(q4_1: bool, p: *const u8) -> __m512i {
        let iota = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
        let d = splat_f16(p);
        // Q4_1: d q + m, one rounding; Q4_0: d (q - 8), exact (and -0 for
        // d = 0 and q < 8, as dequantize makes it).
        let (values, nibbles) = if q4_1 {
            (_mm512_fmadd_ps(d, iota, splat_f16(p.add(2))), p.add(4))
        } else {
            (_mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0))), p.add(2))
        };
        // vpermw reads 5 index bits: the 16 values in both halves.
        let table = _mm512_broadcast_i64x4(_mm512_cvtepi32_epi16(round_bits(values)));
        let q = _mm256_cvtepu8_epi16(_mm_loadu_si128(nibbles as *const __m128i));
        let lo = _mm256_and_si256(q, _mm256_set1_epi16(0x0f));
        let hi = _mm256_srli_epi16::<4>(q);
        _mm512_permutexvar_epi16(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), table)
    }
}

/// Random Q4_0/Q4_1/Q8_0 rows whose f16 scales are finite, some negative, some
/// tiny, some zero (tests).
#[cfg(test)]
pub(crate) fn random_block_rows(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    use half::f16;
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let n = rows * dtype.bytes_for(cols).unwrap();
    let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
    let bb = block_bytes(dtype);
    let scales = if dtype == DType::Q4_1 { 2 } else { 1 };
    for (i, blk) in b.chunks_exact_mut(bb).enumerate() {
        for f in 0..scales {
            let v = match i % 7 {
                0 => 0.0,
                1 => 3.0e-7,
                _ => (next() % 2000) as f32 / 1000.0 - 1.0,
            };
            blk[2 * f..2 * f + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::dtype::RawTensor;
    use crate::ops::bf16_matmul::round_bits;

    #[test]
    fn blocks_decode_to_the_bf16_rounding_of_dequantize() {
        if !available() {
            return crate::test_skip::skip_allowed_in_ci("no AVX-512 F+BW: the projections keep bf16 copies", crate::test_skip::CPU_CLASS_VARIES);
        }
        // (Q8_0 also needs AVX512-BF16)
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0].into_iter().filter(|&d| decodes(d)) {
            let (rows, cols) = (37, 576);
            let bytes = random_block_rows(dtype, rows, cols, 11);
            let raw = RawTensor { name: "w".into(), dtype, shape: vec![rows, cols], bytes: &bytes };
            let want: Vec<u16> = raw.to_f32().unwrap().iter().map(|&v| round_bits(v)).collect();
            let mut got = vec![0xffffu16; rows * cols];
            decode_rows(dtype, &bytes, cols, &mut got);
            assert_eq!(got, want, "{dtype:?}");
        }
    }
}

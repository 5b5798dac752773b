//! AVX-512 operand packing shared by the two bf16 kernels that pack their
//! operands in registers, AMX (`amx.rs`) and `VDPBF16PS` (`avx512bf16.rs`):
//! a weight's rows read as bf16 bits or decoded from quantized blocks on
//! the way ([`Source`]), activations rounded 16 lanes at a time
//! ([`round16`]), and the register transposes both kernels' layouts need.

use crate::base::dtype::DType;

/// Values of one quantized block, and of one [`Source::load32`].
const BLOCK: usize = 32;

/// A product's B operand as the panels read it: bf16 bits, or a
/// checkpoint's Q4_0/Q4_1/Q8_0 blocks decoded to the same bits as each
/// panel is packed (`crate::ops::quant_bf16`), so the weight is never held
/// or read in bf16.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    /// `[rows, cols]` bf16 bits, row-major.
    Bits(&'a [u16]),
    /// `[rows, cols]` blocks of `dtype` (Q4_0, Q4_1 or Q8_0); `cols` whole blocks.
    Blocks { dtype: DType, bytes: &'a [u8] },
}

impl Source<'_> {
    /// Bytes of `n` values (a whole number of blocks for [`Source::Blocks`]).
    pub(super) fn bytes_of(self, n: usize) -> usize {
        match self {
            Source::Bits(_) => 2 * n,
            Source::Blocks { dtype, .. } => n / BLOCK * dtype.bytes_for(BLOCK).expect("one block"),
        }
    }

    /// Panics unless it holds `[rows, cols]`.
    pub(super) fn check(self, (rows, cols): (usize, usize)) {
        match self {
            Source::Bits(w) => assert!(w.len() >= rows * cols, "bf16 weight length"),
            Source::Blocks { bytes, .. } => assert!(cols.is_multiple_of(BLOCK) && bytes.len() >= self.bytes_of(rows * cols), "block weight length"),
        }
    }

    /// Values `c0 .. c0 + 32` of row `r` of a `[_, cols]` operand, lanes
    /// `mask` leaves out zero (a row of blocks is whole blocks: `c0` starts one).
    ///
    /// # Safety
    /// AVX-512 F and BW available; row `r` exists ([`Source::check`]).
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    pub(super) unsafe fn load32(self, r: usize, cols: usize, c0: usize, mask: u32) -> std::arch::x86_64::__m512i {
        use std::arch::x86_64::*;
        match self {
            // SAFETY: the mask stops at column `cols` of row r.
            Source::Bits(w) => unsafe { _mm512_maskz_loadu_epi16(mask, w.as_ptr().add(r * cols + c0).cast()) },
            Source::Blocks { dtype, bytes } => {
                debug_assert!(c0.is_multiple_of(BLOCK));
                // SAFETY: block (r cols + c0) / 32 of `bytes` exists.
                unsafe { crate::ops::quant_bf16::x86::block(dtype, bytes.as_ptr().add(self.bytes_of(r * cols + c0))) }
            }
        }
    }

    /// Asks for the cache lines of values `c0 .. c0 + width` of row `r`.
    pub(super) fn prefetch(self, r: usize, cols: usize, c0: usize, width: usize) {
        let (base, at) = match self {
            Source::Bits(w) => (w.as_ptr().cast::<u8>(), 2 * (r * cols + c0)),
            Source::Blocks { bytes, .. } => (bytes.as_ptr(), self.bytes_of(r * cols + c0)),
        };
        prefetch_bytes(base.wrapping_add(at) as usize, self.bytes_of(width));
    }
}

/// Asks for the cache lines of `len` bytes from address `start` to be
/// brought into L2 (no fault, no wait).
fn prefetch_bytes(start: usize, len: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    let end = start + len;
    for line in (start & !63..end).step_by(64) {
        // SAFETY: prefetch never faults; the lines belong to `v`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line as *const i8) };
    }
}

/// Lanes `0 .. len` (at most 32) set.
pub(super) fn lanes(len: usize) -> u32 {
    if len >= 32 {
        u32::MAX
    } else {
        (1u32 << len) - 1
    }
}

/// 16x16 transpose of 32-bit values: lane `j` of result row `i` is lane
/// `i` of `r[j]`.
///
/// # Safety
/// AVX-512 F available.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn transpose16(r: &[std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    // 32-bit then 64-bit interleaves within 128-bit lanes: u[4g + j] lane l
    // holds column 4l + j of rows 4g .. 4g + 4.
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let q = &t[4 * g..4 * g + 4];
        u[4 * g] = _mm512_unpacklo_epi64(q[0], q[2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(q[0], q[2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(q[1], q[3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(q[1], q[3]);
    }
    // 4x4 transpose of 128-bit lanes: output row 4l + j = lane l of u[j], u[4 + j], u[8 + j], u[12 + j].
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let a = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
        let b = _mm512_shuffle_i32x4::<0xEE>(u[j], u[4 + j]);
        let c = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
        let d = _mm512_shuffle_i32x4::<0xEE>(u[8 + j], u[12 + j]);
        out[j] = _mm512_shuffle_i32x4::<0x88>(a, c);
        out[4 + j] = _mm512_shuffle_i32x4::<0xDD>(a, c);
        out[8 + j] = _mm512_shuffle_i32x4::<0x88>(b, d);
        out[12 + j] = _mm512_shuffle_i32x4::<0xDD>(b, d);
    }
    out
}

/// `_mm512_permutex2var_epi16` indices interleaving two rows `a`, `b` of
/// 32 bf16 into pairs: word `i` is `a[16 h + i / 2]` for even `i`, `b[..]`
/// for odd (`h = 1`: the second 16 columns).
pub(super) const fn interleave(h: u16) -> [u16; 32] {
    let mut idx = [0; 32];
    let mut i = 0;
    while i < 32 {
        idx[i] = i as u16 / 2 + 16 * h + if i % 2 == 1 { 32 } else { 0 };
        i += 1;
    }
    idx
}

/// bf16 bits of 16 f32 (given as their bits), rounded as
/// [`super::round_bits`] does (`quant_bf16`'s vector rounding), packed to
/// 16 u16.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) unsafe fn round16(b: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: the caller's features.
    unsafe { _mm512_cvtepi32_epi16(crate::ops::quant_bf16::x86::round_bits(_mm512_castsi512_ps(b))) }
}

//! AVX-512 operand packing shared by the two bf16 kernels that pack their
//! operands in registers, AMX (`amx.rs`) and `VDPBF16PS` (`avx512bf16.rs`):
//! a weight's rows read as bf16 bits or decoded from quantized blocks on
//! the way ([`Source`]), activations rounded 16 lanes at a time
//! ([`round16`]), and the register transposes both kernels' layouts need.

use crate::model::source::DType;

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


/// 8x8 transpose of 32-bit values: lane `j` of result row `i` is lane `i`
/// of `r[j]`.
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn transpose8(r: &[std::arch::x86_64::__m256i; 8]) -> [std::arch::x86_64::__m256i; 8] {
    use std::arch::x86_64::*;
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved (columns 0, 1, 4, 5
    // and 2, 3, 6, 7); u[4g + j] lane l: column j (+ 4 in the high half) of
    // rows 4g .. 4g + 4; then the 128-bit halves meet.
    let mut t = [_mm256_setzero_si256(); 8];
    for i in 0..4 {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm256_setzero_si256(); 8];
    for g in 0..2 {
        let q = &t[4 * g..4 * g + 4];
        u[4 * g] = _mm256_unpacklo_epi64(q[0], q[2]);
        u[4 * g + 1] = _mm256_unpackhi_epi64(q[0], q[2]);
        u[4 * g + 2] = _mm256_unpacklo_epi64(q[1], q[3]);
        u[4 * g + 3] = _mm256_unpackhi_epi64(q[1], q[3]);
    }
    let mut out = [_mm256_setzero_si256(); 8];
    for j in 0..4 {
        out[j] = _mm256_permute2x128_si256::<0x20>(u[j], u[4 + j]);
        out[4 + j] = _mm256_permute2x128_si256::<0x31>(u[j], u[4 + j]);
    }
    out
}

/// bf16 bits of 16 f32 (given as their bits), rounded as
/// [`super::round_bits`] does.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) unsafe fn round16(b: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)));
    let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fff_ffff)), _mm512_set1_epi32(0x7f80_0000));
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
    _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet))
}

//! The portable kernel's fast path on CPUs with AVX2 and FMA but no AMX
//! (measured on an AMD EPYC, Zen 1): both operands packed so that a 4x16
//! register tile streams them with contiguous loads and broadcasts.
//!
//! - The activation, rounded to bf16 once per call (left as it is for f32
//!   weights, `portable::f32_forward`), becomes slivers of 4 rows,
//!   `[m / 4][k][4]` (8x8 transposes in registers, half of each kept): a
//!   tile's 4 broadcasts per reduction step come from 16 bytes.
//! - Per 16 output columns, W (bf16 widened, or f32) becomes a panel
//!   `[k][16]` (two 8x8 transposes per 8 steps for the forward, plain row
//!   copies for the input gradient): two contiguous loads per step.
//! - The tile keeps 8 accumulators (4 rows x 2 halves; each an FMA chain
//!   over `p = 0..k` in order, so results do not depend on how the work is
//!   split or on the tile's shape) and is bound by the FMA units: 8 FMAs
//!   per step against 6 loads. An 8x8 tile (8 broadcasts per 8 FMAs) ran at
//!   81% of the FMA peak with its operands in L1; 4x16 runs at 99%.
//!
//! Everything here runs on the calling thread; `portable.rs` splits the
//! output columns over rayon.
use std::arch::x86_64::*;

/// Rows of a register tile (and of an activation sliver).
pub(super) const MR: usize = 4;
/// Columns of a register tile (and of a weight panel).
pub(super) const NR: usize = 16;

/// Whether this CPU runs the code here.
pub(super) fn available() -> bool {
    crate::ops::matmul::has_avx2_fma()
}

/// `x: [m, k]` into slivers `dst: [m.div_ceil(4)][k][4]`, zero past row
/// `m`; with `round` each value rounded to bf16 (as
/// [`super::round_bits`], kept as f32), else as it is (f32 weights).
///
/// # Safety
/// AVX2 and FMA available ([`available`]).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_rows(dst: &mut [f32], x: &[f32], (m, k): (usize, usize), round: bool) {
    assert!(dst.len() == m.div_ceil(MR) * k * MR && x.len() == m * k);
    let k8 = k / 8 * 8;
    for (s, sliver) in dst.chunks_exact_mut(k * MR).enumerate() {
        let rows = (m - s * MR).min(MR);
        let src = &x[s * MR * k..(s * MR + rows) * k];
        for p in (0..k8).step_by(8) {
            // SAFETY: row i < rows of `src`, columns p .. p + 8 <= k.
            let r: [__m256; 8] = std::array::from_fn(|i| {
                if i >= rows {
                    return _mm256_setzero_ps();
                }
                let v = unsafe { _mm256_loadu_ps(src.as_ptr().add(i * k + p)) };
                if round {
                    round8(v)
                } else {
                    v
                }
            });
            for (pp, v) in transpose8(r).into_iter().enumerate() {
                // SAFETY: step p + pp < k of the sliver; lanes 0..4 are rows 0..4.
                unsafe { _mm_storeu_ps(sliver.as_mut_ptr().add((p + pp) * MR), _mm256_castps256_ps128(v)) };
            }
        }
        for p in k8..k {
            for i in 0..MR {
                let v = if i < rows { src[i * k + p] } else { 0.0 };
                sliver[p * MR + i] = if round { super::widen(super::round_bits(v)) } else { v };
            }
        }
    }
}

/// An element of a stored weight: bf16 bits or f32.
pub(super) trait Weight: Copy {
    /// The value as f32.
    fn value(self) -> f32;
    /// 8 values from `src` as f32.
    ///
    /// # Safety
    /// AVX2 available; `src` holds 8 values.
    unsafe fn load8(src: *const Self) -> __m256;
}

impl Weight for u16 {
    fn value(self) -> f32 {
        super::widen(self)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(src: *const u16) -> __m256 {
        // SAFETY: forwarded.
        unsafe { widen8(src) }
    }
}

impl Weight for f32 {
    fn value(self) -> f32 {
        self
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(src: *const f32) -> __m256 {
        // SAFETY: 32 bytes at `src` (forwarded).
        unsafe { _mm256_loadu_ps(src) }
    }
}

/// `dst[p][j] = rows[j][p]` as f32 (`dst: [k][16]`, `rows: [width <= 16][k]`),
/// zero for `j >= width`: the forward's panel of W.
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_transposed<T: Weight>(dst: &mut [f32], rows: &[T], width: usize, k: usize) {
    assert!(dst.len() == k * NR && rows.len() == width * k && width <= NR);
    let k8 = k / 8 * 8;
    for p in (0..k8).step_by(8) {
        for half in 0..2 {
            // SAFETY: row j < width, columns p .. p + 8 <= k.
            let r: [__m256; 8] = std::array::from_fn(|j| if half * 8 + j < width { unsafe { T::load8(rows.as_ptr().add((half * 8 + j) * k + p)) } } else { _mm256_setzero_ps() });
            for (pp, v) in transpose8(r).into_iter().enumerate() {
                // SAFETY: step p + pp < k of the panel, columns half * 8 .. + 8.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((p + pp) * NR + half * 8), v) };
            }
        }
    }
    for p in k8..k {
        for j in 0..NR {
            dst[p * NR + j] = if j < width { rows[j * k + p].value() } else { 0.0 };
        }
    }
}

/// `dst[o][j] = w[o * cols + c0 + j]` as f32 for `o < rows`, `j < width`
/// (`dst: [rows][16]`), zero for `j >= width`: the input gradient's panel.
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_columns<T: Weight>(dst: &mut [f32], w: &[T], (rows, cols): (usize, usize), c0: usize, width: usize) {
    assert!(dst.len() == rows * NR && w.len() >= rows * cols && c0 + width <= cols && width <= NR);
    for (o, d) in dst.chunks_exact_mut(NR).enumerate() {
        let src = &w[o * cols + c0..o * cols + c0 + width];
        if width == NR {
            // SAFETY: 16 values of row o; `d` is 16 f32.
            unsafe {
                _mm256_storeu_ps(d.as_mut_ptr(), T::load8(src.as_ptr()));
                _mm256_storeu_ps(d.as_mut_ptr().add(8), T::load8(src.as_ptr().add(8)));
            }
        } else {
            d.iter_mut().enumerate().for_each(|(j, v)| *v = src.get(j).map_or(0.0, |&b| b.value()));
        }
    }
}

/// `out[i * ld + j] = sum_p a[p][i] b[p][j]` for `i < rows`, `j < cols`:
/// one 4x16 tile from an activation sliver `a: [k][4]` and a panel
/// `b: [k][16]`.
///
/// # Safety
/// AVX2 and FMA available; `a` and `b` hold `k * 4` and `k * 16` values;
/// `out` has `rows <= 4` rows of `cols <= 16` values, `ld` apart, that
/// nothing else touches meanwhile.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(a: &[f32], b: &[f32], k: usize, out: *mut f32, ld: usize, (rows, cols): (usize, usize)) {
    assert!(a.len() >= k * MR && b.len() >= k * NR);
    // acc[2i + h]: row i, columns 8h .. 8h + 8
    let mut acc = [_mm256_setzero_ps(); 2 * MR];
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    for p in 0..k {
        // SAFETY: step p < k of both.
        unsafe {
            let (b0, b1) = (_mm256_loadu_ps(pb.add(p * NR)), _mm256_loadu_ps(pb.add(p * NR + 8)));
            for i in 0..MR {
                let av = _mm256_broadcast_ss(&*pa.add(p * MR + i));
                acc[2 * i] = _mm256_fmadd_ps(av, b0, acc[2 * i]);
                acc[2 * i + 1] = _mm256_fmadd_ps(av, b1, acc[2 * i + 1]);
            }
        }
    }
    let mut lanes = [0f32; NR];
    for i in 0..rows {
        // SAFETY: `lanes` holds 16 f32; row i < rows of `out`, cols columns.
        unsafe {
            if cols == NR {
                _mm256_storeu_ps(out.add(i * ld), acc[2 * i]);
                _mm256_storeu_ps(out.add(i * ld + 8), acc[2 * i + 1]);
            } else {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[2 * i]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[2 * i + 1]);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.add(i * ld), cols);
            }
        }
    }
}

/// 8 bf16 (bits at `src`) widened to f32.
///
/// # Safety
/// AVX2 available; `src` holds 8 values.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen8(src: *const u16) -> __m256 {
    // SAFETY: 16 bytes at `src`.
    let bits = unsafe { _mm_loadu_si128(src.cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
}

/// 8 f32 rounded to bf16 (kept as f32), nearest even, NaNs quiet: the
/// values of [`super::round_bits`].
#[inline]
#[target_feature(enable = "avx2")]
fn round8(v: __m256) -> __m256 {
    let b = _mm256_castps_si256(v);
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
    let rounded = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), high);
    let nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fff_ffff)), _mm256_set1_epi32(0x7f80_0000));
    let quiet = _mm256_and_si256(_mm256_or_si256(b, _mm256_set1_epi32(0x0040_0000)), high);
    _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan))
}

/// 8x8 transpose: lane `j` of result `c` is lane `c` of `r[j]` (shuffles
/// only: any 32-bit lanes; the AVX512-BF16 kernel's slivers use it too).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // t[2q] holds rows 2q, 2q + 1 interleaved at columns 0, 1 (low half)
    // and 4, 5 (high half); t[2q + 1] the same at 2, 3 / 6, 7
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4g + h]: rows 4g .. 4g + 4 of the columns (0, 4), (2, 6), (1, 5),
    // (3, 7) for h = 0, 1, 2, 3 (low half, high half)
    let u: [__m256; 8] = std::array::from_fn(|i| {
        let (g, h) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + h % 2], t[4 * g + 2 + h % 2]);
        if h < 2 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    // column c: rows 0..4 from u[h], rows 4..8 from u[4 + h]
    std::array::from_fn(|c| {
        let h = [0, 2, 1, 3][c % 4];
        if c < 4 {
            _mm256_permute2f128_ps::<0x20>(u[h], u[4 + h])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[h], u[4 + h])
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::bf16_matmul::{round_bits, widen};

    #[test]
    fn packing_and_tile_match_scalar_definitions() {
        if !available() {
            return crate::test_skip::skip("no AVX2+FMA on this CPU (every CI machine has them)");
        }
        let (m, k) = (13, 21);
        let mut x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        x[8 * k + 5] = f32::NAN; // in a later sliver: the tiles below read the first
        x[6] = f32::from_bits(0x3f80_8000); // halfway between two bf16: down to the even one
        x[7] = f32::from_bits(0x3f81_8000); // halfway: up to the even one
        let mut slivers = vec![f32::NAN; m.div_ceil(MR) * k * MR];
        // SAFETY: checked by `available`.
        unsafe { pack_rows(&mut slivers, &x, (m, k), true) };
        for s in 0..m.div_ceil(MR) {
            for p in 0..k {
                for i in 0..MR {
                    let got = slivers[(s * k + p) * MR + i];
                    let want = if s * MR + i < m { widen(round_bits(x[(s * MR + i) * k + p])) } else { 0.0 };
                    assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "sliver {s} step {p} row {i}: {got} vs {want}");
                }
            }
        }
        // 11 rows of W: both halves of the forward panel, the second partly
        let w: Vec<u16> = (0..11 * k).map(|i| round_bits((i as f32 * 0.11).cos())).collect();
        let mut panel = vec![f32::NAN; k * NR];
        // SAFETY: as above.
        unsafe { pack_transposed(&mut panel, &w, 11, k) };
        for p in 0..k {
            for j in 0..NR {
                let want = if j < 11 { widen(w[j * k + p]) } else { 0.0 };
                assert_eq!(panel[p * NR + j], want, "forward panel step {p} column {j}");
            }
        }
        // the input gradient's panel: columns c0 .. c0 + width of w read as [5, k]
        for (c0, width) in [(3, 6), (4, 16)] {
            let mut cols_panel = vec![f32::NAN; 5 * NR];
            // SAFETY: as above.
            unsafe { pack_columns(&mut cols_panel, &w, (5, k), c0, width) };
            for o in 0..5 {
                for j in 0..NR {
                    let want = if j < width { widen(w[o * k + c0 + j]) } else { 0.0 };
                    assert_eq!(cols_panel[o * NR + j], want, "input-gradient panel row {o} column {j}");
                }
            }
        }
        // tiles of sliver 0 times the forward panel: a partial one and a full one
        let ld = 17;
        for (rows, cols) in [(3, 6), (MR, NR)] {
            let mut out = vec![f32::NAN; rows * ld];
            // SAFETY: `out` is `rows` rows of `ld >= cols`.
            unsafe { tile(&slivers[..k * MR], &panel, k, out.as_mut_ptr(), ld, (rows, cols)) };
            for i in 0..rows {
                for j in 0..ld {
                    let got = out[i * ld + j];
                    if j >= cols {
                        assert!(got.is_nan(), "wrote past the tile");
                        continue;
                    }
                    let want = (0..k).fold(0f32, |s, p| slivers[p * MR + i].mul_add(panel[p * NR + j], s));
                    assert_eq!(got.to_bits(), want.to_bits(), "tile [{i}][{j}]: an FMA chain in step order");
                }
            }
        }
    }
}

//! Dense f32 matrix products. Row-major slices throughout; the `_bt`/`_at`
//! variants read one operand transposed through strides, so nothing is copied.
//!
//! Two crates, chosen by measurement on SmolLM2's projection shapes
//! (single thread, this AVX-512 machine): for many rows (prefill, training)
//! `matrixmultiply` ran 1.3-1.8x faster than `gemm` (e.g. 256x576x192: 46 vs
//! 24 GFLOP/s); for a few rows (decoding) `gemm` ran ~4x faster
//! (1x576x1536: 3.8 vs 1.0 GFLOP/s). Many-row products are split into
//! 16-aligned row or column blocks over rayon; each output element's sum runs
//! in the same order whatever the split, so results do not depend on the
//! thread count.
//!
//! Note `gemm`'s argument order: `dst = alpha * dst + beta * lhs * rhs`, the
//! reverse of BLAS's alpha/beta naming.
use crate::ops::SharedMut;
use gemm::{gemm, Parallelism};

/// Products below this many multiply-adds run on the calling thread: rayon's
/// fork/join costs more than it saves there.
const PARALLEL_MIN_MACS: usize = 1 << 17;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    let threads = rayon::current_num_threads();
    if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN_MACS && threads > 1 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// Handles the products with nothing to multiply (an empty output, or
/// `k == 0`: the sum is 0); returns whether `out` is final.
fn empty_product(out: &mut [f32], (m, k, n): (usize, usize, usize), accumulate: bool) -> bool {
    if k == 0 && !accumulate {
        out.fill(0.0);
    }
    m == 0 || n == 0 || k == 0
}

/// `scale * lhs[m,k] · rhs[k,n]`, each operand read through (row stride,
/// column stride), added to the output when `accumulate`.
#[derive(Clone, Copy)]
struct Product<'a> {
    lhs: &'a [f32],
    lhs_strides: (usize, usize),
    rhs: &'a [f32],
    rhs_strides: (usize, usize),
    /// `(m, k, n)`.
    dims: (usize, usize, usize),
    scale: f32,
    accumulate: bool,
}

/// `out[m,n] = (accumulate ? out : 0) + scale * lhs[m,k] · rhs[k,n]`.
fn product(out: &mut [f32], p: Product<'_>) {
    let Product { lhs, lhs_strides: (lrs, lcs), rhs, rhs_strides: (rrs, rcs), dims: (m, k, n), scale, accumulate } = p;
    assert_eq!(out.len(), m * n, "matmul output length");
    if empty_product(out, (m, k, n), accumulate) {
        return;
    }
    assert!(lhs.len() > (m - 1) * lrs + (k - 1) * lcs, "matmul lhs length");
    assert!(rhs.len() > (k - 1) * rrs + (n - 1) * rcs, "matmul rhs length");
    if m >= MANY_ROWS {
        return product_blocks(out, p);
    }
    // SAFETY: the asserts bound every index gemm reads (row * rs + col * cs)
    // inside the slices; `out` is exclusively borrowed and `m * n` long.
    unsafe {
        gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lcs as isize,
            lrs as isize,
            rhs.as_ptr(),
            rcs as isize,
            rrs as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism(m, n, k),
        );
    }
}

/// From this many rows on, `matrixmultiply` beats `gemm`.
const MANY_ROWS: usize = 16;

/// matrixmultiply's AVX-512 tile is 16 x 16: blocks that start on a multiple
/// of 16 cut the output into exactly the tiles an unsplit call uses, so every
/// element takes the same kernel path (full or edge tile) whatever the split.
const TILE: usize = 16;

/// [`product`] for many rows: `matrixmultiply::sgemm` on one block per rayon
/// thread, split along the larger of `m` and `n`. sgemm packs the right-hand
/// operand per call, so splitting rows made every thread pack the whole
/// weight (18% of a training step went to packing); splitting the wider
/// dimension packs each operand part once.
fn product_blocks(out: &mut [f32], p: Product<'_>) {
    use rayon::prelude::*;
    let Product { lhs, lhs_strides: (lrs, lcs), rhs, rhs_strides: (rrs, rcs), dims: (m, k, n), scale, accumulate } = p;
    let threads = if m * n * k >= PARALLEL_MIN_MACS { rayon::current_num_threads() } else { 1 };
    let split_cols = n > m;
    let len = if split_cols { n } else { m };
    let block = len.div_ceil(threads).next_multiple_of(TILE).max(MANY_ROWS);
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..len.div_ceil(block)).into_par_iter().for_each(|b| {
        let out_ptr = out_ptr;
        let (start, size) = (b * block, block.min(len - b * block));
        let (rows, cols, lhs_off, rhs_off, out_off) =
            if split_cols { (m, size, 0, start * rcs, start) } else { (size, n, start * lrs, 0, start * n) };
        // SAFETY: the caller checked that `lhs` and `rhs` cover every index
        // (r * rs + c * cs) of the whole product; a block reads a sub-range of
        // rows (of lhs) or columns (of rhs). Blocks write disjoint row or
        // column ranges of `out` (m * n long, exclusively borrowed for the
        // call). With beta = 0 sgemm does not read `out`.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                cols,
                scale,
                lhs.as_ptr().add(lhs_off),
                lrs as isize,
                lcs as isize,
                rhs.as_ptr().add(rhs_off),
                rrs as isize,
                rcs as isize,
                if accumulate { 1.0 } else { 0.0 },
                out_ptr.0.add(out_off),
                n as isize,
                1,
            );
        }
    });
}

/// `out[m,n] (+)= scale * a[m,k] · b[k,n]`.
pub fn matmul(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), scale: f32, accumulate: bool) {
    product(out, Product { lhs: a, lhs_strides: (k, 1), rhs: b, rhs_strides: (n, 1), dims: (m, k, n), scale, accumulate });
}

/// `out[m,n] (+)= scale * a[m,k] · b[n,k]^T`: the `nn.Linear` forward,
/// `Y = X W^T` with `W: [out, in]`.
pub fn matmul_bt(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), scale: f32, accumulate: bool) {
    product(out, Product { lhs: a, lhs_strides: (k, 1), rhs: b, rhs_strides: (1, k), dims: (m, k, n), scale, accumulate });
}

/// `out[m,n] (+)= scale * a[k,m]^T · b[k,n]`: the weight-gradient shape.
pub fn matmul_at(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), scale: f32, accumulate: bool) {
    product(out, Product { lhs: a, lhs_strides: (1, m), rhs: b, rhs_strides: (n, 1), dims: (m, k, n), scale, accumulate });
}

/// Output rows per register tile of [`matmul_unpacked`]; callers that split
/// rows over threads align their blocks to it so every tile stays full.
pub const TILE_ROWS: usize = 8;

/// f32 lanes of one AVX-512 register: the tile width unit.
const LANES: usize = 16;

/// `out[m,n] (+)= scale * lhs(m,k) · rhs[k,n]` on the calling thread, with
/// `lhs(i,p) = lhs[i * rs + p * cs]` and `rhs`, `out` row-major.
///
/// For products with one narrow side (the LoRA rank): packing costs as much
/// as such a product (matrixmultiply, gemm), so this streams the operands as
/// they are. Each `TILE_ROWS x 16`/`x 32` tile of `out` is held in
/// registers; every step over `p` loads one row of `rhs` and broadcasts one
/// `lhs` element per tile row. Each output element is one `mul_add` chain
/// over `p = 0..k`, then `* scale`, then `+ out`: the same bits whichever
/// tile (full or edge) or code path (AVX-512 or portable) computes it, so
/// callers may split `m` anywhere.
pub fn matmul_unpacked(
    out: &mut [f32],
    lhs: &[f32],
    (rs, cs): (usize, usize),
    rhs: &[f32],
    (m, k, n): (usize, usize, usize),
    scale: f32,
    accumulate: bool,
) {
    assert_eq!(out.len(), m * n, "matmul_unpacked output length");
    if empty_product(out, (m, k, n), accumulate) {
        return;
    }
    assert!(lhs.len() > (m - 1) * rs + (k - 1) * cs, "matmul_unpacked lhs length");
    assert!(rhs.len() >= k * n, "matmul_unpacked rhs length");
    let p = Unpacked { out: out.as_mut_ptr(), lhs: lhs.as_ptr(), rs, cs, rhs: rhs.as_ptr(), m, k, n, rhs_stride: n, out_stride: n, scale, accumulate };
    // SAFETY: checked above.
    unsafe { run_unpacked(p) }
}

/// [`matmul_unpacked`] over a block of columns: `out[i * out_stride + j] =
/// scale * sum_p lhs[i * rs + p * cs] * rhs[p * rhs_stride + j]` for
/// `i < m`, `j < n`, where `rhs` and `out` are row-major and wider than
/// `n` (the same arithmetic and bits as [`matmul_unpacked`] without
/// `accumulate`). `out` is a raw pointer so that parallel column blocks of
/// one matrix can each write their own.
///
/// # Safety
/// `out.add(i * out_stride + j)` for `i < m`, `j < n` is valid for writes
/// and written by no one else during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_unpacked_columns(
    out: *mut f32,
    out_stride: usize,
    lhs: &[f32],
    (rs, cs): (usize, usize),
    rhs: &[f32],
    rhs_stride: usize,
    (m, k, n): (usize, usize, usize),
    scale: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(n <= out_stride && n <= rhs_stride, "matmul_unpacked_columns strides");
    if k == 0 {
        // SAFETY: the caller's contract, row by row.
        (0..m).for_each(|i| unsafe { std::slice::from_raw_parts_mut(out.add(i * out_stride), n).fill(0.0) });
        return;
    }
    assert!(lhs.len() > (m - 1) * rs + (k - 1) * cs, "matmul_unpacked_columns lhs length");
    assert!(rhs.len() >= (k - 1) * rhs_stride + n, "matmul_unpacked_columns rhs length");
    let p = Unpacked { out, lhs: lhs.as_ptr(), rs, cs, rhs: rhs.as_ptr(), m, k, n, rhs_stride, out_stride, scale, accumulate: false };
    // SAFETY: `lhs`, `rhs` checked above, `out` by the caller; the tiles
    // write only columns < n of each row.
    unsafe { run_unpacked(p) }
}

/// The forms of the register tiles behind [`matmul_unpacked`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiles {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
    Portable,
}

impl Tiles {
    /// The widest form this CPU runs: AVX-512, AVX2+FMA, NEON, else portable.
    fn detect() -> Tiles {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            return Tiles::Avx512;
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            return Tiles::Avx2;
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Tiles::Neon;
        }
        Tiles::Portable
    }
}

/// The widest tiles the CPU has (see [`Tiles::detect`]).
///
/// # Safety
/// `p` describes valid, exclusively borrowed buffers (see [`Unpacked`]).
unsafe fn run_unpacked(p: Unpacked) {
    // SAFETY (every arm): the detected features are present; the callers'
    // asserts bound every index the tiles touch (see `Unpacked`).
    match Tiles::detect() {
        #[cfg(target_arch = "x86_64")]
        Tiles::Avx512 => unsafe { avx512::tiles(p) },
        #[cfg(target_arch = "x86_64")]
        Tiles::Avx2 => unsafe { avx2::tiles(p) },
        #[cfg(target_arch = "aarch64")]
        Tiles::Neon => unsafe { neon::tiles(p) },
        Tiles::Portable => unsafe { tiles(p) },
    }
}

/// Which form of the register tiles [`matmul_unpacked`] runs on this CPU
/// (`hexlora info`).
pub fn unpacked_tiles_name() -> &'static str {
    match Tiles::detect() {
        #[cfg(target_arch = "x86_64")]
        Tiles::Avx512 => "avx512-fma",
        #[cfg(target_arch = "x86_64")]
        Tiles::Avx2 => "avx2-fma",
        #[cfg(target_arch = "aarch64")]
        Tiles::Neon => "neon-fma",
        Tiles::Portable => "portable",
    }
}

/// Whether the CPU has AVX2 and FMA (the [`avx2`] tiles here and the
/// bf16 kernel's packed ones).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Arguments of [`matmul_unpacked`] after its checks: `out` covers `m`
/// rows of `out_stride` (`n` used) and is exclusively borrowed, `lhs`
/// covers `(m-1) * rs + (k-1) * cs`, `rhs` covers `k` rows of
/// `rhs_stride` (`n` used).
#[derive(Clone, Copy)]
struct Unpacked {
    out: *mut f32,
    lhs: *const f32,
    rs: usize,
    cs: usize,
    rhs: *const f32,
    m: usize,
    k: usize,
    n: usize,
    /// Row strides of `rhs` and `out` (`n` when contiguous).
    rhs_stride: usize,
    out_stride: usize,
    scale: f32,
    accumulate: bool,
}

/// Narrow outputs (the rank side) take 16-wide tiles, wide ones 32-wide
/// (16 accumulators: enough independent chains to hide the FMA latency).
/// This portable form serves CPUs without FMA vectors; [`avx512`] and
/// [`avx2`] are the same arithmetic in intrinsics (auto-vectorized
/// `[f32; 16]` arrays kept the accumulators in memory, and without the
/// `fma` target feature each `mul_add` here is a call into libm: on an
/// AVX2 machine that made the LoRA products 70% of a training step).
#[inline(always)]
unsafe fn tiles(p: Unpacked) {
    if p.n <= LANES {
        tiles_of::<TILE_ROWS, 1>(p)
    } else {
        tiles_of::<TILE_ROWS, 2>(p)
    }
}

#[inline(always)]
unsafe fn tiles_of<const MR: usize, const NV: usize>(p: Unpacked) {
    let width = NV * LANES;
    let full_rows = p.m - p.m % MR;
    for i0 in (0..full_rows).step_by(MR) {
        for j0 in (0..p.n).step_by(width) {
            let cols = width.min(p.n - j0);
            if cols == width {
                tile::<MR, NV, true>(p, i0, j0, MR, cols);
            } else {
                tile::<MR, NV, false>(p, i0, j0, MR, cols);
            }
        }
    }
    // Leftover rows one at a time (decoding has one): a padded tile would
    // repeat the row up to MR times.
    for i0 in full_rows..p.m {
        for j0 in (0..p.n).step_by(width) {
            tile::<1, NV, false>(p, i0, j0, 1, width.min(p.n - j0));
        }
    }
}

/// One `rows x cols` tile at `(i0, j0)`; `FULL` when it is `MR x 16 NV`.
/// An edge tile zero-pads `rhs` beyond `cols` and stores only its real
/// elements (and would repeat its last row if `rows < MR`).
#[inline(always)]
unsafe fn tile<const MR: usize, const NV: usize, const FULL: bool>(p: Unpacked, i0: usize, j0: usize, rows: usize, cols: usize) {
    let mut acc = [[[0f32; LANES]; NV]; MR];
    let row_off: [usize; MR] = std::array::from_fn(|i| (i0 + if FULL { i } else { i.min(rows - 1) }) * p.rs);
    for q in 0..p.k {
        let src = p.rhs.add(q * p.rhs_stride + j0);
        let mut b = [[0f32; LANES]; NV];
        if FULL {
            b = std::ptr::read_unaligned(src.cast::<[[f32; LANES]; NV]>());
        } else {
            for c in 0..cols {
                b[c / LANES][c % LANES] = *src.add(c);
            }
        }
        for i in 0..MR {
            let a = *p.lhs.add(row_off[i] + q * p.cs);
            for v in 0..NV {
                for l in 0..LANES {
                    acc[i][v][l] = a.mul_add(b[v][l], acc[i][v][l]);
                }
            }
        }
    }
    for (i, acc) in acc.iter().enumerate().take(rows) {
        let dst = p.out.add((i0 + i) * p.out_stride + j0);
        for c in 0..cols {
            let r = p.scale * acc[c / LANES][c % LANES];
            *dst.add(c) = if p.accumulate { *dst.add(c) + r } else { r };
        }
    }
}

/// [`tiles`] in AVX-512 intrinsics: one `__m512` per 16 accumulators,
/// masked loads and stores at the right edge.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Unpacked, LANES, TILE_ROWS};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn tiles(p: Unpacked) {
        if p.n <= LANES {
            tiles_of::<{ 2 * TILE_ROWS }, 1>(p)
        } else {
            tiles_of::<TILE_ROWS, 2>(p)
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    unsafe fn tiles_of<const MR: usize, const NV: usize>(p: Unpacked) {
        let width = NV * LANES;
        let full_rows = p.m - p.m % MR;
        for j0 in (0..p.n).step_by(width) {
            let masks: [__mmask16; NV] = std::array::from_fn(|v| lane_mask((p.n - j0).saturating_sub(v * LANES)));
            for i0 in (0..full_rows).step_by(MR) {
                tile::<MR, NV>(p, i0, j0, MR, masks);
            }
            // Leftover rows one at a time (decoding has one): a padded tile
            // would repeat the row up to MR times.
            for i0 in full_rows..p.m {
                tile::<1, NV>(p, i0, j0, 1, masks);
            }
        }
    }

    /// The first `valid` of 16 lanes.
    fn lane_mask(valid: usize) -> __mmask16 {
        if valid >= LANES {
            0xffff
        } else {
            ((1u32 << valid) - 1) as __mmask16
        }
    }

    /// One tile at `(i0, j0)` with `rows <= MR` real rows (the others
    /// would repeat the last row and are not stored) and `masks` selecting
    /// the real columns of each vector.
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn tile<const MR: usize, const NV: usize>(p: Unpacked, i0: usize, j0: usize, rows: usize, masks: [__mmask16; NV]) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let row_off: [usize; MR] = std::array::from_fn(|i| (i0 + i.min(rows - 1)) * p.rs);
        for q in 0..p.k {
            let src = p.rhs.add(q * p.rhs_stride + j0);
            let b: [__m512; NV] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], src.add(v * LANES)));
            let lhs = p.lhs.add(q * p.cs);
            for i in 0..MR {
                let a = _mm512_set1_ps(*lhs.add(row_off[i]));
                for v in 0..NV {
                    acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
                }
            }
        }
        let scale = _mm512_set1_ps(p.scale);
        for (i, acc) in acc.iter().enumerate().take(rows) {
            let dst = p.out.add((i0 + i) * p.out_stride + j0);
            for v in 0..NV {
                let dst = dst.add(v * LANES);
                let mut r = _mm512_mul_ps(scale, acc[v]);
                if p.accumulate {
                    r = _mm512_add_ps(_mm512_maskz_loadu_ps(masks[v], dst), r);
                }
                _mm512_mask_storeu_ps(dst, masks[v], r);
            }
        }
    }
}

/// [`tiles`] in AVX2 intrinsics for CPUs without AVX-512: 4 x 16 tiles,
/// masked loads and stores at the right edge. Each output element is the
/// same `fmadd` chain over `p` as in the other two forms, so all three
/// give the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Unpacked, LANES};
    use std::arch::x86_64::*;

    /// Rows per tile: callers split rows in blocks of 8 (`TILE_ROWS`), and
    /// the rank side has 16, so 4 (8 accumulators, still more chains than
    /// the FMA latency needs) keeps every tile full where 6 left a 2-row
    /// tile streaming the whole right-hand side for two rows.
    const MR: usize = 4;
    /// f32 lanes of one AVX register.
    const HALF: usize = LANES / 2;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tiles(p: Unpacked) {
        let full_rows = p.m - p.m % MR;
        for j0 in (0..p.n).step_by(LANES) {
            if p.n - j0 >= LANES {
                rows_of::<true>(p, j0, full_rows);
            } else {
                rows_of::<false>(p, j0, full_rows);
            }
        }
    }

    /// Every row of the 16 columns from `j0`; `FULL` when all 16 are real
    /// (plain loads: the masks would take two of the 16 registers, and
    /// with them the accumulators spilled).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_of<const FULL: bool>(p: Unpacked, j0: usize, full_rows: usize) {
        let masks: [__m256i; 2] = std::array::from_fn(|v| lane_mask((p.n - j0).saturating_sub(v * HALF)));
        for i0 in (0..full_rows).step_by(MR) {
            tile::<MR, FULL>(p, i0, j0, masks);
        }
        // the leftover rows as one shorter tile (the rank side has 16)
        match p.m - full_rows {
            0 => {}
            1 => tile::<1, FULL>(p, full_rows, j0, masks),
            2 => tile::<2, FULL>(p, full_rows, j0, masks),
            _ => tile::<3, FULL>(p, full_rows, j0, masks),
        }
    }

    /// The first `valid` of 8 lanes (as `maskload` wants: sign bits).
    #[target_feature(enable = "avx2")]
    fn lane_mask(valid: usize) -> __m256i {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid.min(HALF) as i32), lanes)
    }

    /// One `R x 16` tile at `(i0, j0)`, `masks` selecting the real columns
    /// (all of them when `FULL`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const FULL: bool>(p: Unpacked, i0: usize, j0: usize, masks: [__m256i; 2]) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let row_off: [usize; R] = std::array::from_fn(|i| (i0 + i) * p.rs);
        for q in 0..p.k {
            let src = p.rhs.add(q * p.rhs_stride + j0);
            let b: [__m256; 2] = std::array::from_fn(|v| if FULL { _mm256_loadu_ps(src.add(v * HALF)) } else { _mm256_maskload_ps(src.add(v * HALF), masks[v]) });
            let lhs = p.lhs.add(q * p.cs);
            for i in 0..R {
                let a = _mm256_broadcast_ss(&*lhs.add(row_off[i]));
                for v in 0..2 {
                    acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
                }
            }
        }
        let scale = _mm256_set1_ps(p.scale);
        for (i, acc) in acc.iter().enumerate() {
            let dst = p.out.add((i0 + i) * p.out_stride + j0);
            for v in 0..2 {
                let dst = dst.add(v * HALF);
                let mut r = _mm256_mul_ps(scale, acc[v]);
                if FULL {
                    if p.accumulate {
                        r = _mm256_add_ps(_mm256_loadu_ps(dst), r);
                    }
                    _mm256_storeu_ps(dst, r);
                } else {
                    if p.accumulate {
                        r = _mm256_add_ps(_mm256_maskload_ps(dst, masks[v]), r);
                    }
                    _mm256_maskstore_ps(dst, masks[v], r);
                }
            }
        }
    }
}

/// [`tiles`] in NEON intrinsics (the phone's CPU): 4 x 16 tiles, 16
/// accumulators of 4 lanes (of the 32 NEON registers; 8 x 16 would need
/// all 32 for accumulators alone). Each output element is the same fused
/// multiply-add chain over `p` (`vfmaq_n_f32`), then `* scale`, then
/// `+ out`, as in the portable form: the same bits.
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::{Unpacked, LANES};
    use std::arch::aarch64::*;

    /// Rows per tile (see `avx2::MR`: row blocks of 8 and a rank of 16
    /// keep every 4-row tile full).
    const MR: usize = 4;
    /// f32 lanes of one NEON register.
    const Q: usize = 4;
    /// Registers per 16 columns.
    const V: usize = LANES / Q;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn tiles(p: Unpacked) {
        let full_rows = p.m - p.m % MR;
        for j0 in (0..p.n).step_by(LANES) {
            let cols = LANES.min(p.n - j0);
            if cols == LANES {
                rows_of::<true>(p, j0, full_rows, cols);
            } else {
                rows_of::<false>(p, j0, full_rows, cols);
            }
        }
    }

    /// Every row of the `cols` (<= 16) columns from `j0`.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn rows_of<const FULL: bool>(p: Unpacked, j0: usize, full_rows: usize, cols: usize) {
        for i0 in (0..full_rows).step_by(MR) {
            tile::<MR, FULL>(p, i0, j0, cols);
        }
        match p.m - full_rows {
            0 => {}
            1 => tile::<1, FULL>(p, full_rows, j0, cols),
            2 => tile::<2, FULL>(p, full_rows, j0, cols),
            _ => tile::<3, FULL>(p, full_rows, j0, cols),
        }
    }

    /// 16 columns from `src`, the ones past `cols` zero (`FULL`: all 16).
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load<const FULL: bool>(src: *const f32, cols: usize) -> [float32x4_t; V] {
        if FULL {
            std::array::from_fn(|v| vld1q_f32(src.add(v * Q)))
        } else {
            let mut row = [0f32; LANES];
            std::ptr::copy_nonoverlapping(src, row.as_mut_ptr(), cols);
            std::array::from_fn(|v| vld1q_f32(row.as_ptr().add(v * Q)))
        }
    }

    /// One `R x 16` tile at `(i0, j0)`, `cols` of its columns real.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn tile<const R: usize, const FULL: bool>(p: Unpacked, i0: usize, j0: usize, cols: usize) {
        let mut acc = [[vdupq_n_f32(0.0); V]; R];
        let row_off: [usize; R] = std::array::from_fn(|i| (i0 + i) * p.rs);
        for q in 0..p.k {
            let b = load::<FULL>(p.rhs.add(q * p.rhs_stride + j0), cols);
            let lhs = p.lhs.add(q * p.cs);
            for i in 0..R {
                let a = *lhs.add(row_off[i]);
                for v in 0..V {
                    acc[i][v] = vfmaq_n_f32(acc[i][v], b[v], a);
                }
            }
        }
        let scale = vdupq_n_f32(p.scale);
        for (i, acc) in acc.iter().enumerate() {
            let mut r = [0f32; LANES];
            for v in 0..V {
                vst1q_f32(r.as_mut_ptr().add(v * Q), vmulq_f32(scale, acc[v]));
            }
            let dst = p.out.add((i0 + i) * p.out_stride + j0);
            for (c, &r) in r.iter().enumerate().take(cols) {
                *dst.add(c) = if p.accumulate { *dst.add(c) + r } else { r };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
            }
        }
        out
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..cols).flat_map(|c| (0..rows).map(move |r| x[r * cols + c])).collect()
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }

    #[test]
    fn layouts_match_f64_products_serial_and_parallel() {
        // few rows (gemm), many rows (matrixmultiply), many rows in rayon blocks
        for (m, k, n) in [(3, 40, 50), (37, 19, 70), (96, 80, 130)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let want = naive(&a, &b, m, k, n);
            let mut out = vec![0.0; m * n];
            matmul(&mut out, &a, &b, (m, k, n), 1.0, false);
            assert_close(&out, &want);
            matmul_bt(&mut out, &a, &transpose(&b, k, n), (m, k, n), 1.0, false);
            assert_close(&out, &want);
            matmul_at(&mut out, &transpose(&a, m, k), &b, (m, k, n), 1.0, false);
            assert_close(&out, &want);
            matmul(&mut out, &a, &b, (m, k, n), 2.0, true);
            assert_close(&out, &want.iter().map(|w| 3.0 * w).collect::<Vec<_>>());
        }
    }

    /// Edge tiles (rows not a multiple of 8, widths not of 16), both tile
    /// widths, a transposed lhs, and row splits at odd places.
    #[test]
    fn unpacked_matches_f64_and_row_splits_are_bit_identical() {
        for (m, k, n) in [(1, 7, 3), (13, 40, 16), (29, 33, 21), (16, 5, 70), (9, 64, 40)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
            let want = naive(&a, &b, m, k, n);
            let mut out = vec![0.0; m * n];
            matmul_unpacked(&mut out, &a, (k, 1), &b, (m, k, n), 1.0, false);
            assert_close(&out, &want);
            let at = transpose(&a, m, k);
            let mut out_t = vec![0.0; m * n];
            matmul_unpacked(&mut out_t, &at, (1, m), &b, (m, k, n), 1.0, false);
            assert_eq!(out, out_t, "the lhs layout does not change the sums");
            matmul_unpacked(&mut out, &a, (k, 1), &b, (m, k, n), 2.0, true);
            assert_close(&out, &want.iter().map(|w| 3.0 * w).collect::<Vec<_>>());
            let mut whole = vec![0.0; m * n];
            matmul_unpacked(&mut whole, &a, (k, 1), &b, (m, k, n), 0.7, false);
            for split in [1, m / 2, m.saturating_sub(3)].into_iter().filter(|&s| s > 0 && s < m) {
                let mut parts = vec![0.0; m * n];
                let (top, bottom) = parts.split_at_mut(split * n);
                matmul_unpacked(top, &a, (k, 1), &b, (split, k, n), 0.7, false);
                matmul_unpacked(bottom, &a[split * k..], (k, 1), &b, (m - split, k, n), 0.7, false);
                assert_eq!(parts, whole, "split at row {split} of {m}");
            }
        }
    }

    /// `simd` against the portable tiles (fused `mul_add` chains): the
    /// same bits, edges and accumulation included.
    fn assert_tiles_equal_portable(simd: unsafe fn(Unpacked)) {
        for (m, k, n) in [(1, 7, 3), (13, 40, 16), (29, 33, 21), (16, 5, 70), (7, 64, 9)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i as f32) * 0.11).cos()).collect();
            for accumulate in [false, true] {
                let run = |tiles: unsafe fn(Unpacked)| {
                    let mut out: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
                    let p = Unpacked { out: out.as_mut_ptr(), lhs: a.as_ptr(), rs: k, cs: 1, rhs: b.as_ptr(), m, k, n, rhs_stride: n, out_stride: n, scale: 0.7, accumulate };
                    // SAFETY: the buffers are exactly m x k, k x n, m x n;
                    // the caller checked the CPU runs `simd`.
                    unsafe { tiles(p) };
                    out
                };
                assert_eq!(run(simd), run(super::tiles), "{m}x{k}x{n} accumulate {accumulate}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_tiles_equal_portable_tiles_bit_for_bit() {
        if !has_avx2_fma() {
            return crate::test_skip::skip("no AVX2+FMA on this CPU (every CI machine has them)");
        }
        assert_tiles_equal_portable(avx2::tiles);
    }

    /// NEON is part of every aarch64 Linux target: nothing to check first.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_tiles_equal_portable_tiles_bit_for_bit() {
        assert_tiles_equal_portable(neon::tiles);
    }

    #[test]
    fn row_blocks_do_not_change_results() {
        for (m, k, n) in [(200, 300, 96), (40, 300, 333)] {
            check_split_independence(m, k, n);
        }
    }

    fn check_split_independence(m: usize, k: usize, n: usize) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0.0; m * n];
            pool.install(|| {
                matmul_bt(&mut out, &a, &b, (m, k, n), 1.0, false);
                matmul(&mut out, &a, &b, (m, k, n), 0.3, true);
            });
            out
        };
        assert_eq!(run(1), run(3), "bit-identical across thread counts");
    }
}

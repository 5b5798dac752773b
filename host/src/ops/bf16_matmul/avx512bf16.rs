//! The AVX512-BF16 kernel, for CPUs that have `VDPBF16PS` but no AMX tiles
//! (AMD Zen 4 and later; Intel parts where the OS does not grant AMX).
//! `VDPBF16PS` multiplies 16 pairs of bf16 and adds each pair's two
//! products to an f32 lane: twice the multiply-adds of an f32 FMA per
//! instruction, read straight from bf16 operands.
//!
//! Operands are packed so that a pair runs along the reduction: the
//! activation (rounded to bf16 once per call) into slivers of [`MR`] rows,
//! `[pairs][MR]` dwords of two bf16 each; per 32-column output panel the
//! weight into `[pairs][32]` dwords, read as bf16 bits or decoded from its
//! Q4/Q8_0 blocks on the way (so such a weight is never held in bf16),
//! half the bytes of the f32 kernels' panels. Both are packed in AVX-512 registers
//! (`avx512_pack.rs`): rounding 16 values at a time, then a register
//! transpose (as scalar loops they took ~15% of a Zen 4 training step). A
//! register tile of `MR x 32` outputs broadcasts one activation dword per
//! row and multiplies it with the panel's two 16-lane vectors of the same
//! pair. An odd reduction length pads the last pair with a zero.
//!
//! Each output element is one lane of one accumulator, fed the pairs in
//! order, and one thread computes it: results do not depend on the thread
//! count (tested). They differ from the f32-FMA kernels' in summation order
//! only (pairs), so the tests compare against f64 of the rounded operands.
//!
//! A LoRA branch of rank <= 16 rides on the frozen product as on AMX
//! (`mod.rs`, `forward_lora`): each sliver, once packed and still in L1,
//! gives the branch's down product (`xa` or `dxa`) through one extra tile
//! against the factor's hi and lo bf16 halves, and the up product runs as
//! `3r` extra reduction elements of every tile, so no separate `[T, out]`
//! pass exists.
use super::avx2::transpose8;
use super::avx512_pack::{interleave, lanes, round16, transpose16, Source};
use super::portable::grown;
use super::{round_bits, widen};
use crate::ops::SharedMut;
use rayon::prelude::*;
use std::arch::x86_64::*;

/// Rows of a register tile.
pub(super) const MR: usize = 8;
/// Columns of a register tile: two vectors of 16 f32 lanes (one panel).
pub(super) const NR: usize = 32;

/// Whether this CPU has AVX-512 F, BW and BF16 (every AVX512-BF16 CPU
/// has BW, which the packing uses).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512bf16")
}

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]`.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: Source<'_>, n: usize, k: usize) {
    w.check((n, k));
    // SAFETY: `available()` was checked by the dispatcher; `w` holds [n, k].
    run(out, x, (tokens, k, n), &|n0, width, panel| unsafe { rows_down(w, (n, k), n0, width, panel) }, None);
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]`.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: Source<'_>, rows: usize, cols: usize) {
    w.check((rows, cols));
    // SAFETY: `available()` was checked by the dispatcher; `w` holds [rows, cols].
    run(out, dy, (tokens, rows, cols), &|c0, width, panel| unsafe { row_pairs(w, (rows, cols), c0, width, panel) }, None);
}

/// [`forward`] carrying a LoRA branch (`a2 = [A_hi; A_lo]: [2r, k]`, `b3 =
/// [B_hi | B_hi | B_lo]: [n, 3r]`, bf16 bits; `2r <= NR`): `xa[tokens, r] =
/// bf16(x) A^T`, then `out = bf16(x) W^T + scale xa B^T`, the branch's up
/// product riding as `3r` extra reduction elements of the same tiles.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_lora(out: &mut [f32], x: &[f32], tokens: usize, w: Source<'_>, (n, k): (usize, usize), (a2, b3, r): (&[u16], &[u16], usize), scale: f32, xa: &mut [f32]) {
    w.check((n, k));
    let (a2, b3) = (Source::Bits(a2), Source::Bits(b3));
    a2.check((2 * r, k));
    b3.check((n, 3 * r));
    let mut side_panel = vec![0; k.div_ceil(2) * NR];
    // SAFETY (the three panel fills): `available()` was checked by the
    // dispatcher; each operand holds the shape it is read as (checked above).
    unsafe { rows_down(a2, (2 * r, k), 0, 2 * r, &mut side_panel) };
    let ext = |n0: usize, width: usize, panel: &mut [u32]| unsafe { rows_down(b3, (n, 3 * r), n0, width, panel) };
    let carry = Carry { side_panel, rank: r, side_scale: 1.0, side: xa, ext_scale: scale, ext_fill: &ext };
    run(out, x, (tokens, k, n), &|n0, width, panel| unsafe { rows_down(w, (n, k), n0, width, panel) }, Some(carry));
}

/// [`input_grad`] carrying a LoRA branch (`a3 = [A_hi; A_hi; A_lo]: [3r,
/// cols]`, `b2 = [B_hi | B_lo]: [rows, 2r]`, bf16 bits; `2r <= NR`):
/// `dxa[tokens, r] = scale bf16(dy) B`, then `out = bf16(dy) W + dxa A`.
#[allow(clippy::too_many_arguments)]
pub(super) fn input_grad_lora(
    out: &mut [f32],
    dy: &[f32],
    tokens: usize,
    w: Source<'_>,
    (rows, cols): (usize, usize),
    (a3, b2, r): (&[u16], &[u16], usize),
    scale: f32,
    dxa: &mut [f32],
) {
    w.check((rows, cols));
    let (a3, b2) = (Source::Bits(a3), Source::Bits(b2));
    a3.check((3 * r, cols));
    b2.check((rows, 2 * r));
    let mut side_panel = vec![0; rows.div_ceil(2) * NR];
    // SAFETY (the three panel fills): `available()` was checked by the
    // dispatcher; each operand holds the shape it is read as (checked above).
    unsafe { row_pairs(b2, (rows, 2 * r), 0, 2 * r, &mut side_panel) };
    let ext = |c0: usize, width: usize, panel: &mut [u32]| unsafe { row_pairs(a3, (3 * r, cols), c0, width, panel) };
    let carry = Carry { side_panel, rank: r, side_scale: scale, side: dxa, ext_scale: 1.0, ext_fill: &ext };
    run(out, dy, (tokens, rows, cols), &|c0, width, panel| unsafe { row_pairs(w, (rows, cols), c0, width, panel) }, Some(carry));
}

/// Panel of the forward: `panel[p][j] = (W[n0 + j][2p], W[n0 + j][2p + 1])`
/// for `w: [n, k]`, row `j` of W written down column `j` (columns past
/// `width` are zero): per 32 values of the reduction, 16 rows loaded (or
/// decoded) and transposed as 16x16 dwords.
///
/// # Safety
/// AVX-512 F, BW and BF16 available; `w` holds `[n, k]`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn rows_down(w: Source<'_>, (n, k): (usize, usize), n0: usize, width: usize, panel: &mut [u32]) {
    let kp = k.div_ceil(2);
    assert!(panel.len() == kp * NR && n0 + width <= n && width <= NR, "forward panel");
    let dst = panel.as_mut_ptr();
    for c0 in (0..k).step_by(2 * 16) {
        let (p0, mask) = (c0 / 2, lanes(k - c0));
        for j0 in [0, 16] {
            let mut r = [_mm512_setzero_si512(); 16];
            for (j, v) in r.iter_mut().enumerate().take(width.saturating_sub(j0)) {
                // SAFETY: row n0 + j0 + j < n of `w`.
                *v = unsafe { w.load32(n0 + j0 + j, k, c0, mask) };
            }
            // SAFETY: as above; pair p0 + i < kp, so each store of 16
            // dwords at column j0 <= 16 stays inside `panel`.
            unsafe {
                for (i, row) in transpose16(&r).iter().enumerate().take(kp - p0) {
                    _mm512_storeu_si512(dst.add((p0 + i) * NR + j0).cast(), *row);
                }
            }
        }
    }
}

/// Panel of the input gradient: `panel[p][j] = (W[2p][c0 + j],
/// W[2p + 1][c0 + j])` for `w: [rows, cols]`: two rows' 32 values loaded (or decoded)
/// and interleaved in registers; the padding (columns past `width`, a row
/// past the last) is zero.
///
/// # Safety
/// AVX-512 F, BW and BF16 available; `w` holds `[rows, cols]`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn row_pairs(w: Source<'_>, (rows, cols): (usize, usize), c0: usize, width: usize, panel: &mut [u32]) {
    assert!(panel.len() == rows.div_ceil(2) * NR && c0 + width <= cols && width <= NR, "input-gradient panel");
    let mask = lanes(width);
    // SAFETY: row o < rows of `w`; the mask stops at column c0 + width.
    let load = |o: usize| if o < rows { unsafe { w.load32(o, cols, c0, mask) } } else { _mm512_setzero_si512() };
    // SAFETY: 32 u16 each.
    let (lo, hi) = unsafe { (_mm512_loadu_si512(interleave(0).as_ptr().cast()), _mm512_loadu_si512(interleave(1).as_ptr().cast())) };
    for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
        let (a, b) = (load(2 * p), load(2 * p + 1));
        let dst = dst.as_mut_ptr().cast::<__m512i>();
        // SAFETY: `dst` holds NR = 32 dwords.
        unsafe {
            _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(dst.add(1), _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/// Rows `a: [rows <= MR, k]` into a sliver's first `kp` pairs: `dst[p][r] =
/// (bf16(a[r][2p]), bf16(a[r][2p + 1]))` ([`round_bits`]), an odd last
/// element paired with zero, rows past `rows` zero. Per 16 values: each
/// row rounded in one register, the 8 rows transposed as 8x8 dwords.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn pack_sliver(a: &[f32], (rows, k): (usize, usize), dst: &mut [u32]) {
    let kp = k.div_ceil(2);
    assert!(rows <= MR && a.len() == rows * k && dst.len() == kp * MR, "sliver lengths");
    let mut v = [_mm256_setzero_si256(); MR];
    for p0 in (0..kp).step_by(8) {
        let c0 = 2 * p0;
        let mask = lanes(k - c0) as u16;
        for (r, v) in v.iter_mut().enumerate().take(rows) {
            // SAFETY: the mask stops at the end of row r (masked lanes never fault).
            *v = unsafe { round16(_mm512_castps_si512(_mm512_maskz_loadu_ps(mask, a.as_ptr().add(r * k + c0)))) };
        }
        // (the AVX2 kernel's transpose of f32 lanes: shuffles move bits)
        let t = transpose8(v.map(|r| _mm256_castsi256_ps(r))).map(|r| _mm256_castps_si256(r));
        let at = dst.as_mut_ptr().wrapping_add(p0 * MR);
        if kp - p0 >= 8 {
            // SAFETY: pairs p0 .. p0 + 8 lie inside `dst`. (One write of the
            // whole array: as a store loop the compiler made it a call to
            // memcpy, with a vzeroupper, on every pass.)
            unsafe { at.cast::<[__m256i; 8]>().write_unaligned(t) };
        } else {
            for (i, pair) in t.iter().enumerate().take(kp - p0) {
                // SAFETY: pair p0 + i < kp: inside `dst`.
                unsafe { _mm256_storeu_si256(at.add(i * MR).cast(), *pair) };
            }
        }
    }
}

/// A LoRA branch carried on a product `out = bf16(a) B`: the side product
/// `side = side_scale (bf16(a) S)` (S's `2r` columns are the branch factor's
/// hi and lo bf16 halves, so `side` sums them), then `ext_scale side`
/// split into `[hi, lo, hi]` bf16 as `3r` extra reduction elements of each
/// activation row, against `ext_fill`'s `3r` extra rows of B's panels.
struct Carry<'a> {
    /// `[pairs][NR]` dwords: S as a panel (columns past `2r` zero).
    side_panel: Vec<u32>,
    rank: usize,
    side_scale: f32,
    /// `[m, rank]`, written.
    side: &'a mut [f32],
    ext_scale: f32,
    /// Columns `n0 .. n0 + width` of the extra rows as `[ext pairs][NR]`.
    ext_fill: &'a (dyn Fn(usize, usize, &mut [u32]) + Sync),
}

/// Writes the bf16 bits `row` down `cells` in pairs: elements `2p` and
/// `2p + 1` as cell `p`'s dword (low half first, as `VDPBF16PS` pairs
/// them), an odd last element with a zero high half, and zero in the cells
/// past the row (a carried branch's few extra pairs per sliver row).
fn pairs_down<'a>(row: &[u16], mut cells: impl Iterator<Item = &'a mut u32>) {
    let (pairs, odd) = row.split_at(row.len() & !1);
    // (pairs first: zip stops on it without taking a cell)
    for (two, d) in pairs.chunks_exact(2).zip(cells.by_ref()) {
        *d = two[0] as u32 | (two[1] as u32) << 16;
    }
    if let [last] = odd {
        cells.next().into_iter().for_each(|d| *d = *last as u32);
    }
    cells.for_each(|d| *d = 0);
}

/// `out[m, n] = bf16(a[m, k]) B`, where `fill(n0, width, panel)` packs
/// columns `n0 .. n0 + width` of B as `[pairs][NR]` dwords; with a
/// [`Carry`], plus its branch.
fn run(out: &mut [f32], a: &[f32], (m, k, n): (usize, usize, usize), fill: &(dyn Fn(usize, usize, &mut [u32]) + Sync), mut carry: Option<Carry<'_>>) {
    if m == 0 || n == 0 {
        return;
    }
    let kp = k.div_ceil(2);
    if kp == 0 {
        out.fill(0.0);
        return;
    }
    // the carried branch's 3r extra reduction elements, in pairs after W's
    let ep = carry.as_ref().map_or(0, |c| (3 * c.rank).div_ceil(2));
    let kpt = kp + ep;
    let mut sliver_buf = SLIVERS.take();
    let slivers = grown(&mut sliver_buf, m.div_ceil(MR) * kpt * MR);
    // sliver[s][p][r] = (bf16(a[s * MR + r][2p]), bf16(a[s * MR + r][2p + 1]))
    // (rows past m are zero), then the branch's pairs
    let pack = |s: usize, dst: &mut [u32]| {
        let rows = (m - s * MR).min(MR);
        // SAFETY: `available()` was checked by the dispatcher.
        unsafe { pack_sliver(&a[s * MR * k..(s * MR + rows) * k], (rows, k), &mut dst[..kp * MR]) };
    };
    match carry.as_mut() {
        None => slivers.par_chunks_mut(kpt * MR).enumerate().for_each(|(s, dst)| pack(s, dst)),
        Some(c) => {
            let (side_panel, rank, scales) = (&c.side_panel[..], c.rank, (c.side_scale, c.ext_scale));
            let sides = c.side.par_chunks_mut(MR * rank);
            slivers.par_chunks_mut(kpt * MR).zip(sides).enumerate().for_each(|(s, (dst, side))| {
                pack(s, dst);
                // the sliver is in L1 now: its side product and extra pairs
                carry_sliver(dst, (kp, rank), side_panel, side, scales);
            });
        }
    }
    let slivers = &*slivers;
    let ext_fill = carry.as_ref().map(|c| c.ext_fill);
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..n.div_ceil(NR)).into_par_iter().for_each(|q| {
        let out_ptr = out_ptr;
        let (n0, width) = (q * NR, NR.min(n - q * NR));
        let mut panel_buf = PANEL_BUF.take();
        let panel = grown(&mut panel_buf, kpt * NR);
        let (main, ext) = panel.split_at_mut(kp * NR);
        fill(n0, width, main);
        if let Some(ext_fill) = ext_fill {
            ext_fill(n0, width, ext);
        }
        for (s, sliver) in slivers.chunks_exact(kpt * MR).enumerate() {
            let rows = (m - s * MR).min(MR);
            // SAFETY: `available()` was checked by the dispatcher; the tile
            // writes rows s * MR .. + rows and columns n0 .. n0 + width of
            // `out` ([m, n]), which only this panel writes.
            unsafe { tile(sliver, panel, kpt, out_ptr.0.add(s * MR * n + n0), n, (rows, width)) };
        }
        PANEL_BUF.set(panel_buf);
    });
    SLIVERS.set(sliver_buf);
}

/// One sliver's share of a carried branch: `side[r][j] = side_scale (t[r][j]
/// + t[r][rank + j])` with `t = sliver S` (its first `kp` pairs), and
/// `ext_scale side[r]` as `[hi, lo, hi]` bf16 in the sliver's pairs from
/// `kp` on. `side` holds the sliver's rows that exist (`[rows, rank]`).
fn carry_sliver(sliver: &mut [u32], (kp, rank): (usize, usize), side_panel: &[u32], side: &mut [f32], (side_scale, ext_scale): (f32, f32)) {
    let mut t = [0f32; MR * NR];
    // SAFETY: `available()` was checked by the dispatcher; `t` is MR x NR.
    unsafe { tile(sliver, side_panel, kp, t.as_mut_ptr(), NR, (MR, NR)) };
    let mut ext = [0u16; 3 * NR / 2];
    for (r, side) in side.chunks_exact_mut(rank).enumerate() {
        let t = &t[r * NR..(r + 1) * NR];
        for (j, v) in side.iter_mut().enumerate() {
            *v = side_scale * (t[j] + t[rank + j]);
            let e = ext_scale * *v;
            let hi = round_bits(e);
            let lo = round_bits(e - widen(hi));
            (ext[j], ext[rank + j], ext[2 * rank + j]) = (hi, lo, hi);
        }
        pairs_down(&ext[..3 * rank], sliver[kp * MR + r..].iter_mut().step_by(MR));
    }
}

/// One `MR x NR` tile: `out[r][j] = sum_p dot(sliver[p][r], panel[p][j])`
/// for `r < rows`, `j < cols` (row stride `ld`), the pairs in order.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn tile(sliver: &[u32], panel: &[u32], kp: usize, out: *mut f32, ld: usize, (rows, cols): (usize, usize)) {
    debug_assert!(sliver.len() >= kp * MR && panel.len() >= kp * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (s, w) = (sliver.as_ptr(), panel.as_ptr());
    for p in 0..kp {
        // SAFETY (all loads): within the lengths asserted above.
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(p * NR).cast()));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(p * NR + 16).cast()));
        for (r, acc) in acc.iter_mut().enumerate() {
            let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(*s.add(p * MR + r) as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], a, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], a, b1);
        }
    }
    // SAFETY: as the caller promises.
    unsafe { store(&acc, out, ld, (rows, cols), None) };
}

/// Rows `..rows` and columns `..cols` of a register tile's accumulators
/// into `out` (row stride `ld`), times `alpha` if given.
///
/// # Safety
/// AVX-512 F available; `out` holds those rows and columns, which nothing
/// else touches meanwhile.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store(acc: &[[__m512; 2]; MR], out: *mut f32, ld: usize, (rows, cols): (usize, usize), alpha: Option<f32>) {
    let (m0, m1) = (lanes(cols.min(16)) as u16, lanes(cols.saturating_sub(16)) as u16);
    let scaled = |v: __m512| alpha.map_or(v, |a| _mm512_mul_ps(v, _mm512_set1_ps(a)));
    for (r, acc) in acc.iter().enumerate().take(rows) {
        // SAFETY: masked-off lanes are not touched; the caller owns the rest.
        unsafe {
            _mm512_mask_storeu_ps(out.add(r * ld), m0, scaled(acc[0]));
            _mm512_mask_storeu_ps(out.add(r * ld + 16), m1, scaled(acc[1]));
        }
    }
}

/// `out[r][j] = alpha sum_p dot(A[r][p], B[p][j])` for `r < rows <= MR`,
/// `j < cols <= NR`, over `chunks` chunks of 16 pairs, on the layouts of
/// the attention operands (`operands.rs`, built for AMX tiles): A row-major
/// (row `r`'s pairs from `a + r * a_stride` dwords; MR rows readable), B
/// one 32-column panel of VNNI tile pairs, per chunk two 16x16-dword tiles
/// (columns 0..16, then 16..32), whose row `p` is pair `p`'s 16 columns:
/// the vector [`tile`] multiplies. Pairs in order, one accumulator lane
/// per output, as in [`tile`].
///
/// # Safety
/// AVX-512 F and BF16 available; `a` holds MR rows of `16 chunks` dwords
/// `a_stride` apart, `b` `chunks` tile pairs; `out` holds `rows` rows of
/// `cols` values, `ld` apart, that nothing else touches meanwhile.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn vnni_block(a: *const u32, a_stride: usize, b: *const u32, chunks: usize, out: *mut f32, ld: usize, (rows, cols): (usize, usize), alpha: f32) {
    const TILE: usize = 16 * 16;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for c in 0..chunks {
        for p in 0..16 {
            // SAFETY (all loads): inside the operands, as the caller promises.
            let (b0, b1): (__m512bh, __m512bh) = unsafe {
                let row = b.add(2 * TILE * c + 16 * p);
                let pair = |at: *const u32| std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at.cast()));
                (pair(row), pair(row.add(TILE)))
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let a: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(*a.add(r * a_stride + 16 * c + p) as i32)) };
                acc[0] = _mm512_dpbf16_ps(acc[0], a, b0);
                acc[1] = _mm512_dpbf16_ps(acc[1], a, b1);
            }
        }
    }
    // SAFETY: as the caller promises.
    unsafe { store(&acc, out, ld, (rows, cols), Some(alpha)) };
}

thread_local! {
    /// The packed activation of the current product (taken during a call).
    static SLIVERS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    /// This thread's weight panel.
    static PANEL_BUF: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::super::kernel_check::Direct;
    use super::*;

    /// Against f64 of the bf16-rounded operands, edges in every dimension
    /// (odd reductions, partial tiles and panels); and bit for bit the same
    /// on one thread as on several.
    #[test]
    fn matches_f64_of_rounded_operands_and_is_independent_of_threads() {
        if !available() {
            assert!(std::env::var_os("HEXLORA_REQUIRE_AVX512BF16").is_none(), "HEXLORA_REQUIRE_AVX512BF16 is set but this CPU lacks AVX512-BF16");
            return crate::test_skip::skip_allowed_in_ci(
                "no AVX512-BF16 on this CPU (the dispatcher never picks this kernel here)",
                crate::test_skip::CPU_CLASS_VARIES,
            );
        }
        let shapes = [(1, 3, 5), (13, 40, 21), (37, 70, 96), (256, 33, 64), (9, 576, 1536)];
        let (fwd, grad): (Direct, Direct) = (|o, x, t, w, n, k| forward(o, x, t, Source::Bits(w), n, k), |o, x, t, w, n, k| input_grad(o, x, t, Source::Bits(w), n, k));
        super::super::kernel_check::check_kernel(fwd, grad, &shapes, |got, want, _, k| {
            (got as f64 - want).abs() < 1e-6 * (k as f64).sqrt() * (1.0 + want.abs())
        });
    }

    /// Bit patterns of every kind: a hash of the index (NaNs, infinities,
    /// subnormals, both signs), with exact rounding ties mixed in.
    fn patterns(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| if i % 5 == 0 { 0x3f80_8000 | (i & 1) << 16 } else { (i ^ seed).wrapping_mul(2_654_435_761).rotate_left(i % 32) }).collect()
    }

    /// The vector packing equals its scalar definitions bit for bit: the
    /// activation's slivers ([`round_bits`] in pairs down the rows, zero
    /// padding), the forward's and the input gradient's weight panels.
    #[test]
    fn packing_equals_its_scalar_definition() {
        if !available() {
            return crate::test_skip::skip_allowed_in_ci("no AVX512-BF16 on this CPU", crate::test_skip::CPU_CLASS_VARIES);
        }
        for (rows, k) in [(8, 576), (3, 33), (8, 1), (1, 17), (5, 100), (8, 16)] {
            let a: Vec<f32> = patterns(rows * k, 7).into_iter().map(f32::from_bits).collect();
            let kp = k.div_ceil(2);
            let mut got = vec![0xdead_beef; kp * MR];
            // SAFETY: `available()`.
            unsafe { pack_sliver(&a, (rows, k), &mut got) };
            let at = |r: usize, c: usize| if r < rows && c < k { round_bits(a[r * k + c]) as u32 } else { 0 };
            let want: Vec<u32> = (0..kp * MR).map(|e| at(e % MR, 2 * (e / MR)) | at(e % MR, 2 * (e / MR) + 1) << 16).collect();
            assert_eq!(got, want, "sliver {rows}x{k}");
        }
        for (n, k) in [(70, 101), (32, 576), (5, 32), (40, 48)] {
            let w: Vec<u16> = patterns(n * k, 3).into_iter().map(|b| b as u16).collect();
            let at = |r: usize, c: usize| if r < n && c < k { w[r * k + c] as u32 } else { 0 };
            for n0 in (0..n).step_by(NR) {
                let width = NR.min(n - n0);
                let mut got = vec![0xdead_beef; kp_of(k) * NR];
                // SAFETY: `available()`; `w` holds [n, k].
                unsafe { rows_down(Source::Bits(&w), (n, k), n0, width, &mut got) };
                let want: Vec<u32> = (0..got.len()).map(|e| if e % NR < width { at(n0 + e % NR, 2 * (e / NR)) | at(n0 + e % NR, 2 * (e / NR) + 1) << 16 } else { 0 }).collect();
                assert_eq!(got, want, "forward panel {n}x{k} at {n0}");
            }
            // the same table read as the input gradient's [rows = n, cols = k]
            for c0 in (0..k).step_by(NR) {
                let width = NR.min(k - c0);
                let mut got = vec![0xdead_beef; kp_of(n) * NR];
                // SAFETY: as above.
                unsafe { row_pairs(Source::Bits(&w), (n, k), c0, width, &mut got) };
                let want: Vec<u32> = (0..got.len()).map(|e| if e % NR < width { at(2 * (e / NR), c0 + e % NR) | at(2 * (e / NR) + 1, c0 + e % NR) << 16 } else { 0 }).collect();
                assert_eq!(got, want, "input-gradient panel {n}x{k} at {c0}");
            }
        }
    }

    fn kp_of(k: usize) -> usize {
        k.div_ceil(2)
    }
}

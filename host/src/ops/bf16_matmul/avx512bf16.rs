//! The AVX512-BF16 kernel, for CPUs that have `VDPBF16PS` but no AMX tiles
//! (AMD Zen 4 and later; Intel parts where the OS does not grant AMX).
//! `VDPBF16PS` multiplies 16 pairs of bf16 and adds each pair's two
//! products to an f32 lane: twice the multiply-adds of an f32 FMA per
//! instruction, read straight from bf16 operands.
//!
//! Operands are packed so that a pair runs along the reduction: the
//! activation (rounded to bf16 once per call) into slivers of [`MR`] rows,
//! `[pairs][MR]` dwords of two bf16 each; per 32-column output panel the
//! weight into `[pairs][32]` dwords, widened from nothing (bf16 stays
//! bf16), so a panel is half the bytes of the f32 kernels' panels. A
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
use super::portable::grown;
use super::{round_bits, widen};
use crate::ops::SharedMut;
use rayon::prelude::*;
use std::arch::x86_64::*;

/// Rows of a register tile.
pub(super) const MR: usize = 8;
/// Columns of a register tile: two vectors of 16 f32 lanes (one panel).
pub(super) const NR: usize = 32;

/// Whether this CPU has AVX-512F and AVX512-BF16.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]` bits.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) {
    run(out, x, (tokens, k, n), &|n0, width, panel| rows_down(w, k, n0, width, panel), None);
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]` bits.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], rows: usize, cols: usize) {
    run(out, dy, (tokens, rows, cols), &|c0, width, panel| row_pairs(w, (rows, cols), c0, width, panel), None);
}

/// [`forward`] carrying a LoRA branch (`a2 = [A_hi; A_lo]: [2r, k]`, `b3 =
/// [B_hi | B_hi | B_lo]: [n, 3r]`, bf16 bits; `2r <= NR`): `xa[tokens, r] =
/// bf16(x) A^T`, then `out = bf16(x) W^T + scale xa B^T`, the branch's up
/// product riding as `3r` extra reduction elements of the same tiles.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_lora(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], (n, k): (usize, usize), (a2, b3, r): (&[u16], &[u16], usize), scale: f32, xa: &mut [f32]) {
    let mut side_panel = vec![0; k.div_ceil(2) * NR];
    rows_down(a2, k, 0, 2 * r, &mut side_panel);
    let ext = |n0: usize, width: usize, panel: &mut [u32]| rows_down(b3, 3 * r, n0, width, panel);
    let carry = Carry { side_panel, rank: r, side_scale: 1.0, side: xa, ext_scale: scale, ext_fill: &ext };
    run(out, x, (tokens, k, n), &|n0, width, panel| rows_down(w, k, n0, width, panel), Some(carry));
}

/// [`input_grad`] carrying a LoRA branch (`a3 = [A_hi; A_hi; A_lo]: [3r,
/// cols]`, `b2 = [B_hi | B_lo]: [rows, 2r]`, bf16 bits; `2r <= NR`):
/// `dxa[tokens, r] = scale bf16(dy) B`, then `out = bf16(dy) W + dxa A`.
#[allow(clippy::too_many_arguments)]
pub(super) fn input_grad_lora(
    out: &mut [f32],
    dy: &[f32],
    tokens: usize,
    w: &[u16],
    (rows, cols): (usize, usize),
    (a3, b2, r): (&[u16], &[u16], usize),
    scale: f32,
    dxa: &mut [f32],
) {
    let mut side_panel = vec![0; rows.div_ceil(2) * NR];
    row_pairs(b2, (rows, 2 * r), 0, 2 * r, &mut side_panel);
    let ext = |c0: usize, width: usize, panel: &mut [u32]| row_pairs(a3, (3 * r, cols), c0, width, panel);
    let carry = Carry { side_panel, rank: r, side_scale: scale, side: dxa, ext_scale: 1.0, ext_fill: &ext };
    run(out, dy, (tokens, rows, cols), &|c0, width, panel| row_pairs(w, (rows, cols), c0, width, panel), Some(carry));
}

/// Panel of the forward: `panel[p][j] = (W[n0 + j][2p], W[n0 + j][2p + 1])`
/// for `w: [.., k]`, row `j` of W written down column `j` (a transpose;
/// columns past `width` are zero).
fn rows_down(w: &[u16], k: usize, n0: usize, width: usize, panel: &mut [u32]) {
    for j in 0..NR {
        let row = if j < width { &w[(n0 + j) * k..(n0 + j + 1) * k] } else { &[][..] };
        pairs_down(row, panel[j..].iter_mut().step_by(NR), |b| b);
    }
}

/// Panel of the input gradient: `panel[p][j] = (W[2p][c0 + j], W[2p + 1][c0
/// + j])` for `w: [rows, cols]`, two rows' runs of `width` weights
/// interleaved (a loop the compiler vectorizes); the padding (columns past
/// `width`, a row past the last) is zero.
fn row_pairs(w: &[u16], (rows, cols): (usize, usize), c0: usize, width: usize, panel: &mut [u32]) {
    let run = |o: usize| if o < rows { &w[o * cols + c0..o * cols + c0 + width] } else { &[][..] };
    for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
        // 2p < rows always (the panel has rows.div_ceil(2) pairs); 2p + 1 may not be.
        let (lo, hi) = (run(2 * p), run(2 * p + 1));
        let (cells, pad) = dst.split_at_mut(width);
        pad.fill(0);
        if hi.is_empty() {
            cells.iter_mut().zip(lo).for_each(|(d, &a)| *d = a as u32);
        } else {
            cells.iter_mut().zip(lo).zip(hi).for_each(|((d, &a), &b)| *d = a as u32 | (b as u32) << 16);
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

/// Writes `row` down `cells` in pairs: `bits` of elements `2p` and `2p + 1`
/// as cell `p`'s dword (low half first, as `VDPBF16PS` pairs them), an odd
/// last element with a zero high half, and zero in the cells past the row.
/// Read in order and without per-element bounds checks: the forward's
/// panels and the activation's slivers both pack this way (indexed per
/// element, it took a fifth of a Zen 4 training step).
fn pairs_down<'a, T: Copy>(row: &[T], mut cells: impl Iterator<Item = &'a mut u32>, bits: impl Fn(T) -> u16) {
    let (pairs, odd) = row.split_at(row.len() & !1);
    // (pairs first: zip stops on it without taking a cell)
    for (two, d) in pairs.chunks_exact(2).zip(cells.by_ref()) {
        *d = bits(two[0]) as u32 | (bits(two[1]) as u32) << 16;
    }
    if let [last] = odd {
        cells.next().into_iter().for_each(|d| *d = bits(*last) as u32);
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
        for r in 0..MR {
            let row = s * MR + r;
            let src = if row < m { &a[row * k..(row + 1) * k] } else { &[][..] };
            pairs_down(src, dst[r..].iter_mut().step_by(MR), round_bits);
        }
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
        pairs_down(&ext[..3 * rank], sliver[kp * MR + r..].iter_mut().step_by(MR), |b| b);
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
    let lanes = |n: usize| if n >= 16 { 0xffff } else { ((1u32 << n) - 1) as u16 };
    let (m0, m1) = (lanes(cols.min(16)), lanes(cols.saturating_sub(16)));
    for (r, acc) in acc.iter().enumerate().take(rows) {
        // SAFETY: masked-off lanes are not touched; the caller owns the rest.
        _mm512_mask_storeu_ps(out.add(r * ld), m0, acc[0]);
        _mm512_mask_storeu_ps(out.add(r * ld + 16), m1, acc[1]);
    }
}

thread_local! {
    /// The packed activation of the current product (taken during a call).
    static SLIVERS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    /// This thread's weight panel.
    static PANEL_BUF: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
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
        super::super::kernel_check::check_kernel(forward, input_grad, &shapes, |got, want, _, k| {
            (got as f64 - want).abs() < 1e-6 * (k as f64).sqrt() * (1.0 + want.abs())
        });
    }
}

//! The NEON BF16 kernel, for Arm CPUs with FEAT_BF16 (Armv8.6-A and later
//! cores, e.g. Cortex-A510/A710/X2 onwards). `BFMMLA` multiplies a 2x4 bf16
//! matrix by a 4x2 one and adds the 2x2 f32 product to its accumulator:
//! 16 multiply-adds per instruction, four times an f32 `FMLA`'s, read
//! straight from bf16 operands.
//!
//! Operands are packed so that four consecutive reduction elements of two
//! rows (or two output columns) fill one 128-bit register: the activation
//! (rounded to bf16 once per call) into slivers of [`MR`] rows,
//! `[k / 4][row pair][2][4]`; per 32-column panel the weight into
//! `[tile][k / 4][column pair][2][4]`, bf16 as stored, so a panel is half the
//! bytes of the f32 kernels'. A register tile of `8 x 8` outputs holds 16
//! accumulators (each a 2x2 block) and loads 4 + 4 operand registers per
//! step of 4 along the reduction. A reduction not a multiple of 4 pads
//! with zeros.
//!
//! Arithmetic: the products of two bf16 are exact in f32; Arm defines the
//! adds inside `BFMMLA` with round-to-odd and subnormals flushed to zero
//! (without FEAT_EBF16's extended mode), so results differ from the f32
//! FMA kernels' by rounding, and the tests compare with f64 of the rounded
//! operands. Each output element is one lane of one accumulator, fed the
//! reduction in order, computed by one thread: results do not depend on the
//! thread count (tested).
use super::portable::grown;
use super::round_bits;
use crate::ops::SharedMut;
use rayon::prelude::*;
use std::arch::aarch64::*;

/// Rows of a register tile (4 row pairs).
const MR: usize = 8;
/// Columns of a register tile (4 column pairs).
const NR: usize = 8;
/// Output columns per panel (one rayon task): 4 tiles.
const PANEL: usize = 32;
/// Reduction elements per `BFMMLA`.
const KC: usize = 4;

/// Whether this CPU has the BF16 instructions.
pub(super) fn available() -> bool {
    std::arch::is_aarch64_feature_detected!("bf16")
}

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]` bits.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) {
    // B[p][j] = W[j][p]: a column's four reduction elements are contiguous
    run(out, x, (tokens, k, n), &|p, j| w[j * k + p]);
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]` bits.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], rows: usize, cols: usize) {
    // B[o][j] = W[o][j]
    run(out, dy, (tokens, rows, cols), &|o, j| w[o * cols + j]);
}

/// `out[m, n] = bf16(a[m, k]) B` with `b(p, j)` the bits of `B[p][j]`
/// (`p < k`, `j < n`).
fn run(out: &mut [f32], a: &[f32], (m, k, n): (usize, usize, usize), b: &(dyn Fn(usize, usize) -> u16 + Sync)) {
    if m == 0 || n == 0 {
        return;
    }
    let kc = k.div_ceil(KC);
    if kc == 0 {
        out.fill(0.0);
        return;
    }
    let sliver_len = kc * MR * KC;
    let mut sliver_buf = SLIVERS.take();
    let slivers = grown(&mut sliver_buf, m.div_ceil(MR) * sliver_len);
    // sliver[s][c][rp][h][t] = bf16(a[s * MR + 2 rp + h][c * KC + t])
    slivers.par_chunks_mut(sliver_len).enumerate().for_each(|(s, dst)| {
        for (i, d) in dst.iter_mut().enumerate() {
            let (c, rp, h, t) = (i / (MR * KC), i / (2 * KC) % (MR / 2), i / KC % 2, i % KC);
            let (row, p) = (s * MR + 2 * rp + h, c * KC + t);
            *d = if row < m && p < k { round_bits(a[row * k + p]) } else { 0 };
        }
    });
    let slivers = &*slivers;
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..n.div_ceil(PANEL)).into_par_iter().for_each(|q| {
        let out_ptr = out_ptr;
        let (n0, width) = (q * PANEL, PANEL.min(n - q * PANEL));
        let tiles = width.div_ceil(NR);
        let tile_len = kc * NR * KC;
        let mut panel_buf = PANEL_BUF.take();
        let panel = grown(&mut panel_buf, tiles * tile_len);
        // panel[g][c][cp][h][t] = B[c * KC + t][n0 + g * NR + 2 cp + h]
        for (i, d) in panel.iter_mut().enumerate() {
            let (g, c, cp, h, t) = (i / tile_len, i / (NR * KC) % kc, i / (2 * KC) % (NR / 2), i / KC % 2, i % KC);
            let (j, p) = (g * NR + 2 * cp + h, c * KC + t);
            *d = if j < width && p < k { b(p, n0 + j) } else { 0 };
        }
        for (s, sliver) in slivers.chunks_exact(sliver_len).enumerate() {
            let rows = (m - s * MR).min(MR);
            for (g, part) in panel.chunks_exact(tile_len).enumerate() {
                let cols = (width - g * NR).min(NR);
                // SAFETY: `available()` was checked by the dispatcher; the
                // tile writes rows s * MR .. + rows and columns n0 + g * NR
                // .. + cols of `out` ([m, n]), which only this panel writes.
                unsafe { tile(sliver, part, kc, out_ptr.0.add(s * MR * n + n0 + g * NR), n, (rows, cols)) };
            }
        }
        PANEL_BUF.set(panel_buf);
    });
    SLIVERS.set(sliver_buf);
}

/// One `MR x NR` tile: `out[r][j] = sum_p A[r][p] B[p][j]` for `r < rows`,
/// `j < cols` (row stride `ld`), four reduction elements per step, in order.
#[target_feature(enable = "neon,bf16")]
unsafe fn tile(sliver: &[u16], part: &[u16], kc: usize, out: *mut f32, ld: usize, (rows, cols): (usize, usize)) {
    debug_assert!(sliver.len() >= kc * MR * KC && part.len() >= kc * NR * KC);
    // acc[rp][cp] = [o[2rp][2cp], o[2rp][2cp+1], o[2rp+1][2cp], o[2rp+1][2cp+1]]
    let mut acc = [[vdupq_n_f32(0.0); NR / 2]; MR / 2];
    let (s, w) = (sliver.as_ptr(), part.as_ptr());
    for c in 0..kc {
        // SAFETY (all loads): within the lengths asserted above.
        let a: [uint16x8_t; MR / 2] = std::array::from_fn(|rp| vld1q_u16(s.add((c * MR / 2 + rp) * 2 * KC)));
        let b: [uint16x8_t; NR / 2] = std::array::from_fn(|cp| vld1q_u16(w.add((c * NR / 2 + cp) * 2 * KC)));
        for (acc, a) in acc.iter_mut().zip(a) {
            for (acc, &b) in acc.iter_mut().zip(&b) {
                *acc = bfmmla(*acc, a, b);
            }
        }
    }
    let mut o = [[0f32; NR]; MR];
    for (rp, acc) in acc.iter().enumerate() {
        for (cp, acc) in acc.iter().enumerate() {
            let mut l = [0f32; 4];
            vst1q_f32(l.as_mut_ptr(), *acc);
            o[2 * rp][2 * cp..2 * cp + 2].copy_from_slice(&l[..2]);
            o[2 * rp + 1][2 * cp..2 * cp + 2].copy_from_slice(&l[2..]);
        }
    }
    for (r, o) in o.iter().enumerate().take(rows) {
        // SAFETY: the caller owns columns < cols of rows < rows.
        std::ptr::copy_nonoverlapping(o.as_ptr(), out.add(r * ld), cols);
    }
}

/// `acc + a b^T` for the 2x4 bf16 matrices `a` and `b` (row-major, rows of
/// four): `BFMMLA`. Inline assembly, as its intrinsic (`vbfmmlaq_f32`) is
/// not stable Rust.
#[inline]
#[target_feature(enable = "neon,bf16")]
unsafe fn bfmmla(mut acc: float32x4_t, a: uint16x8_t, b: uint16x8_t) -> float32x4_t {
    // SAFETY: register-only; the caller's CPU has BF16.
    std::arch::asm!(
        "bfmmla {acc:v}.4s, {a:v}.8h, {b:v}.8h",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

thread_local! {
    /// The packed activation of the current product (taken during a call).
    static SLIVERS: std::cell::Cell<Vec<u16>> = const { std::cell::Cell::new(Vec::new()) };
    /// This thread's weight panel.
    static PANEL_BUF: std::cell::Cell<Vec<u16>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against f64 of the bf16-rounded operands, edges in every dimension
    /// (reductions not a multiple of 4, partial tiles and panels), within
    /// `(k / 2 + 4) 2^-23 sum |a b|`: every add in the chain (round-to-odd,
    /// at most one ulp) bounded by the sum of magnitudes; a lost or
    /// misplaced product is of size `sum |a b| / k` and fails it. And bit
    /// for bit the same on one thread as on several. Under qemu-aarch64
    /// `-cpu cortex-a53` (no BF16) it checks that the dispatcher would not
    /// pick it and skips, failing only when `HEXLORA_REQUIRE_BF16` says the
    /// CPU should have had it (ci/aarch64-test.sh sets it under `-cpu max`).
    #[test]
    fn matches_f64_of_rounded_operands_and_is_independent_of_threads() {
        if !available() {
            assert!(std::env::var_os("HEXLORA_REQUIRE_BF16").is_none(), "HEXLORA_REQUIRE_BF16 is set but this CPU lacks FEAT_BF16");
            assert_ne!(super::super::Kernel::detect(), super::super::Kernel::NeonBfmmla);
            return crate::test_skip::skip_allowed_in_ci(
                "no FEAT_BF16 on this CPU (the dispatcher never picks this kernel here)",
                "ci/aarch64-test.sh runs the library tests under -cpu cortex-a53 too; under -cpu max it sets HEXLORA_REQUIRE_BF16",
            );
        }
        let shapes = [(1, 3, 5), (13, 40, 21), (37, 70, 96), (64, 33, 66), (9, 576, 1536)];
        super::super::kernel_check::check_kernel(forward, input_grad, &shapes, |got, want, mag, k| {
            (got as f64 - want).abs() <= (k as f64 / 2.0 + 4.0) * 2f64.powi(-23) * mag + 1e-30
        });
    }
}

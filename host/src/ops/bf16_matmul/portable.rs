//! The portable kernel: the activation rounded to bf16 once per call (kept
//! as f32), and per 32-wide output panel the matching part of W widened to
//! f32 in a per-thread scratch. Where the CPU has AVX2 and FMA both are
//! packed for the 4x16 register tiles of `avx2.rs`; elsewhere the panel is
//! laid out `[reduction][32]` for [`matmul_unpacked_columns`]. Memory stays
//! one bf16 copy of W; each panel is widened once per call. The same
//! packed tiles also take f32 weights without rounding anything
//! ([`f32_forward`], [`f32_input_grad`]: `CpuProjection` on CPUs without
//! AVX-512).
//!
//! This replaced `matrixmultiply`, which packed the activation again for
//! every panel: on an AMD EPYC (Zen 1, AVX2, no AVX-512) the SmolLM2
//! shapes ran at 9 GFLOP/s per thread that way (see `bench.rs`).
#[cfg(target_arch = "x86_64")]
use super::avx2::{pack_columns, pack_transposed, Weight, NR};
use super::{round_bits, widen};
use crate::ops::matmul::matmul_unpacked_columns;
use crate::ops::SharedMut;
use rayon::prelude::*;

/// Output columns per panel (one rayon task).
const PANEL: usize = 32;

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]` bits.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) {
    forward_on(out, x, tokens, w, (n, k), simd_tiles());
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]` bits.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], rows: usize, cols: usize) {
    input_grad_on(out, dy, tokens, w, (rows, cols), simd_tiles());
}

/// Whether the packed AVX2 tiles can run here.
fn simd_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`forward`] on the AVX2 tiles (`avx2`, which the caller checked) or
/// on `matmul_unpacked`'s.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // `avx2`
fn forward_on(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], (n, k): (usize, usize), avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        return packed_forward(out, x, tokens, w, (n, k), true);
    }
    // panel[p][j] = W[n0 + j][p]
    let fill = |n0: usize, width: usize, panel: &mut [f32]| {
        let rows = &w[n0 * k..(n0 + width) * k];
        for (p, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
            dst.iter_mut().take(width).enumerate().for_each(|(j, d)| *d = widen(rows[j * k + p]));
        }
    };
    panels(out, &rounded(x), (tokens, k, n), &fill);
}

/// [`input_grad`] on either tiles, as [`forward_on`].
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))] // `avx2`
fn input_grad_on(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], (rows, cols): (usize, usize), avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        return packed_input_grad(out, dy, tokens, w, (rows, cols), true);
    }
    // panel[o][j] = W[o][c0 + j]
    let fill = |c0: usize, width: usize, panel: &mut [f32]| {
        for (o, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
            let src = &w[o * cols + c0..o * cols + c0 + width];
            dst.iter_mut().zip(src).for_each(|(d, &b)| *d = widen(b));
        }
    };
    panels(out, &rounded(dy), (tokens, rows, cols), &fill);
}

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| widen(round_bits(v))).collect()
}

/// `out[m, n] = a[m, k] B` where `fill(n0, width, panel)` writes columns
/// `n0 .. n0 + width` of B into `panel` (`[k][PANEL]`, row-major).
fn panels(out: &mut [f32], a: &[f32], (m, k, n): (usize, usize, usize), fill: &(dyn Fn(usize, usize, &mut [f32]) + Sync)) {
    if m == 0 || n == 0 {
        return;
    }
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..n.div_ceil(PANEL)).into_par_iter().for_each_init(Vec::new, |panel: &mut Vec<f32>, p| {
        let out_ptr = out_ptr;
        let (n0, width) = (p * PANEL, PANEL.min(n - p * PANEL));
        panel.resize(k * PANEL, 0.0);
        fill(n0, width, panel);
        // SAFETY: `a` is [m, k] and `panel` k rows of PANEL >= width; the
        // call writes columns n0 .. n0 + width of `out` ([m, n]), which no
        // other panel writes.
        unsafe { matmul_unpacked_columns(out_ptr.0.add(n0), n, a, (k, 1), panel, PANEL, (m, k, width), 1.0) };
    });
}

/// `out[tokens, n] = x[tokens, k] W^T` for f32 `w: [n, k]` on the packed
/// AVX2 tiles, nothing rounded: f32 frozen weights on CPUs with AVX2 and
/// FMA. Returns false, leaving `out` alone, where those tiles cannot run.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn f32_forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[f32], (n, k): (usize, usize)) -> bool {
    assert!(x.len() == tokens * k && out.len() == tokens * n && w.len() == n * k, "f32 forward lengths");
    #[cfg(target_arch = "x86_64")]
    if simd_tiles() {
        packed_forward(out, x, tokens, w, (n, k), false);
        return true;
    }
    false
}

/// `out[tokens, cols] = dy[tokens, rows] W` for f32 `w: [rows, cols]`, as
/// [`f32_forward`].
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn f32_input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[f32], (rows, cols): (usize, usize)) -> bool {
    assert!(dy.len() == tokens * rows && out.len() == tokens * cols && w.len() == rows * cols, "f32 input-gradient lengths");
    #[cfg(target_arch = "x86_64")]
    if simd_tiles() {
        packed_input_grad(out, dy, tokens, w, (rows, cols), false);
        return true;
    }
    false
}

/// `out[tokens, n] = x[tokens, k] W^T`, `w: [n, k]` (bf16 bits or f32),
/// on the AVX2 tiles (the caller checked them); `round` rounds `x` to bf16.
#[cfg(target_arch = "x86_64")]
fn packed_forward<T: Weight + Sync>(out: &mut [f32], x: &[f32], tokens: usize, w: &[T], (n, k): (usize, usize), round: bool) {
    // panel[q][p][j] = W[n0 + q * NR + j][p]
    let fill = |n0: usize, width: usize, q: usize, panel: &mut [f32]| {
        let (c0, part) = (n0 + q * NR, width.saturating_sub(q * NR).min(NR));
        // SAFETY: AVX2 and FMA are available.
        unsafe { pack_transposed(panel, &w[c0 * k..(c0 + part) * k], part, k) };
    };
    packed(out, x, (tokens, k, n), round, &fill);
}

/// `out[tokens, cols] = dy[tokens, rows] W`, `w: [rows, cols]`, as
/// [`packed_forward`].
#[cfg(target_arch = "x86_64")]
fn packed_input_grad<T: Weight + Sync>(out: &mut [f32], dy: &[f32], tokens: usize, w: &[T], (rows, cols): (usize, usize), round: bool) {
    // panel[q][o][j] = W[o][c0 + q * NR + j]
    let fill = |c0: usize, width: usize, q: usize, panel: &mut [f32]| {
        let (c, part) = (c0 + q * NR, width.saturating_sub(q * NR).min(NR));
        // SAFETY: AVX2 and FMA are available.
        unsafe { pack_columns(panel, w, (rows, cols), c, part) };
    };
    packed(out, dy, (tokens, rows, cols), round, &fill);
}

/// [`panels`] on the AVX2 tiles: `x` (rounded to bf16 when `round`) into
/// 4-row slivers once, then per panel its two 16-column parts packed by
/// `fill(n0, width, q, part)` (`[k][16]` each) and every sliver multiplied
/// by both while it is in L1.
#[cfg(target_arch = "x86_64")]
fn packed(out: &mut [f32], x: &[f32], (m, k, n): (usize, usize, usize), round: bool, fill: &(dyn Fn(usize, usize, usize, &mut [f32]) + Sync)) {
    use super::avx2::{pack_rows, tile, MR};
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let mut sliver_buf = SLIVERS.take();
    let slivers = grown(&mut sliver_buf, m.div_ceil(MR) * k * MR);
    slivers.par_chunks_mut(4 * k * MR).enumerate().for_each(|(c, dst)| {
        let (r0, r1) = (c * 4 * MR, m.min((c + 1) * 4 * MR));
        // SAFETY: AVX2 and FMA are available (the caller checked).
        unsafe { pack_rows(dst, &x[r0 * k..r1 * k], (r1 - r0, k), round) };
    });
    let slivers = &*slivers;
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..n.div_ceil(PANEL)).into_par_iter().for_each(|p| {
        let out_ptr = out_ptr;
        let (n0, width) = (p * PANEL, PANEL.min(n - p * PANEL));
        let parts = width.div_ceil(NR);
        let mut panel_buf = PANEL_BUF.take();
        let panel = grown(&mut panel_buf, parts * k * NR);
        for (q, part) in panel.chunks_exact_mut(k * NR).enumerate() {
            fill(n0, width, q, part);
        }
        for (s, sliver) in slivers.chunks_exact(k * MR).enumerate() {
            let rows = (m - s * MR).min(MR);
            for (q, part) in panel.chunks_exact(k * NR).enumerate() {
                let cols = (width - q * NR).min(NR);
                // SAFETY: AVX2 and FMA are available; the tile writes rows
                // s * MR .. + rows and columns n0 + q * NR .. + cols of
                // `out` ([m, n]), which only this panel writes.
                unsafe { tile(sliver, part, k, out_ptr.0.add(s * MR * n + n0 + q * NR), n, (rows, cols)) };
            }
        }
        PANEL_BUF.set(panel_buf);
    });
    SLIVERS.set(sliver_buf);
}

thread_local! {
    /// The packed activation of the current product (taken during a call).
    static SLIVERS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// This thread's weight panel.
    static PANEL_BUF: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The first `len` values of `buf`, grown if needed (stale values kept:
/// every caller overwrites what it reads). Scratch lives per thread and
/// never shrinks, as the AMX kernel's does: products of a dozen shapes
/// alternate, and this saves a large allocation per call.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))] // its callers are the x86 and Arm kernels
pub(super) fn grown<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

// Both tests compare the packed AVX2 tiles with what runs without them.
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The packed AVX2 tiles and the generic ones (what a CPU without
    /// AVX2 runs) compute every output element as the same FMA chain over
    /// the reduction in order, so they agree bit for bit; edges in every
    /// dimension.
    #[test]
    fn packed_and_generic_tiles_give_the_same_bits() {
        if !simd_tiles() {
            return crate::test_skip::skip("no AVX2+FMA on this CPU (every CI machine has them): only the generic tiles run");
        }
        let values = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect::<Vec<f32>>();
        for (tokens, out_f, in_f) in [(1, 3, 5), (13, 40, 21), (37, 70, 96), (256, 33, 64)] {
            let w: Vec<u16> = values(out_f * in_f, 0.37).into_iter().map(round_bits).collect();
            let (x, dy) = (values(tokens * in_f, 0.71), values(tokens * out_f, 0.53));
            let run = |avx2: bool| {
                let (mut y, mut dx) = (vec![f32::NAN; tokens * out_f], vec![f32::NAN; tokens * in_f]);
                forward_on(&mut y, &x, tokens, &w, (out_f, in_f), avx2);
                input_grad_on(&mut dx, &dy, tokens, &w, (out_f, in_f), avx2);
                (y, dx)
            };
            let bits = |v: (Vec<f32>, Vec<f32>)| v.0.iter().chain(&v.1).map(|f| f.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(run(true)), bits(run(false)), "{tokens}x{in_f}->{out_f}");
        }
    }

    /// The f32 entry points round nothing: each output is the same FMA
    /// chain as `matmul_unpacked` computes from the unrounded operands (so
    /// the same bits), and within f32 summation error of f64 products.
    #[test]
    fn f32_weights_match_unpacked_tiles_and_f64() {
        if !simd_tiles() {
            return crate::test_skip::skip("no AVX2+FMA on this CPU (every CI machine has them): f32 products stay on matrixmultiply");
        }
        let values = |n: usize, f: f32| (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect::<Vec<f32>>();
        for (tokens, out_f, in_f) in [(17, 3, 5), (37, 70, 96), (256, 33, 64)] {
            let w = values(out_f * in_f, 0.37);
            let (x, dy) = (values(tokens * in_f, 0.71), values(tokens * out_f, 0.53));
            let (mut y, mut dx) = (vec![f32::NAN; tokens * out_f], vec![f32::NAN; tokens * in_f]);
            assert!(f32_forward(&mut y, &x, tokens, &w, (out_f, in_f)));
            assert!(f32_input_grad(&mut dx, &dy, tokens, &w, (out_f, in_f)));
            let wt: Vec<f32> = (0..in_f * out_f).map(|i| w[(i % out_f) * in_f + i / out_f]).collect(); // [in, out]
            let (mut y_ref, mut dx_ref) = (vec![0.0; y.len()], vec![0.0; dx.len()]);
            crate::ops::matmul::matmul_unpacked(&mut y_ref, &x, (in_f, 1), &wt, (tokens, in_f, out_f), 1.0, false);
            crate::ops::matmul::matmul_unpacked(&mut dx_ref, &dy, (out_f, 1), &w, (tokens, out_f, in_f), 1.0, false);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&y), bits(&y_ref), "forward {tokens}x{in_f}->{out_f}");
            assert_eq!(bits(&dx), bits(&dx_ref), "input grad {tokens}x{in_f}->{out_f}");
            for t in 0..tokens {
                for o in 0..out_f {
                    let want: f64 = (0..in_f).map(|i| x[t * in_f + i] as f64 * w[o * in_f + i] as f64).sum();
                    assert!((y[t * out_f + o] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "forward [{t}][{o}]");
                }
                for i in 0..in_f {
                    let want: f64 = (0..out_f).map(|o| dy[t * out_f + o] as f64 * w[o * in_f + i] as f64).sum();
                    assert!((dx[t * in_f + i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "input grad [{t}][{i}]");
                }
            }
        }
    }
}

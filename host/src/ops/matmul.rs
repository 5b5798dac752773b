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

/// `out[m,n] = (accumulate ? out : 0) + scale * lhs[m,k] · rhs[k,n]`, with
/// each operand read through (row stride, column stride).
#[allow(clippy::too_many_arguments)]
fn product(
    out: &mut [f32],
    lhs: &[f32],
    (lrs, lcs): (usize, usize),
    rhs: &[f32],
    (rrs, rcs): (usize, usize),
    (m, k, n): (usize, usize, usize),
    scale: f32,
    accumulate: bool,
) {
    assert_eq!(out.len(), m * n, "matmul output length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out.fill(0.0);
        }
        return;
    }
    assert!(lhs.len() > (m - 1) * lrs + (k - 1) * lcs, "matmul lhs length");
    assert!(rhs.len() > (k - 1) * rrs + (n - 1) * rcs, "matmul rhs length");
    if m >= MANY_ROWS {
        return product_blocks(out, lhs, (lrs, lcs), rhs, (rrs, rcs), (m, k, n), scale, accumulate);
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

/// `*mut f32` shared by the blocks of one product; each block writes a
/// disjoint set of output elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: blocks write disjoint elements (see `product_blocks`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// [`product`] for many rows: `matrixmultiply::sgemm` on one block per rayon
/// thread, split along the larger of `m` and `n`. sgemm packs the right-hand
/// operand per call, so splitting rows made every thread pack the whole
/// weight (18% of a training step went to packing); splitting the wider
/// dimension packs each operand part once.
#[allow(clippy::too_many_arguments)]
fn product_blocks(
    out: &mut [f32],
    lhs: &[f32],
    (lrs, lcs): (usize, usize),
    rhs: &[f32],
    (rrs, rcs): (usize, usize),
    (m, k, n): (usize, usize, usize),
    scale: f32,
    accumulate: bool,
) {
    use rayon::prelude::*;
    let threads = if m * n * k >= PARALLEL_MIN_MACS { rayon::current_num_threads() } else { 1 };
    let split_cols = n > m;
    let len = if split_cols { n } else { m };
    let block = len.div_ceil(threads).next_multiple_of(TILE).max(MANY_ROWS);
    let out_ptr = OutPtr(out.as_mut_ptr());
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
    product(out, a, (k, 1), b, (n, 1), (m, k, n), scale, accumulate);
}

/// `out[m,n] (+)= scale * a[m,k] · b[n,k]^T`: the `nn.Linear` forward,
/// `Y = X W^T` with `W: [out, in]`.
pub fn matmul_bt(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), scale: f32, accumulate: bool) {
    product(out, a, (k, 1), b, (1, k), (m, k, n), scale, accumulate);
}

/// `out[m,n] (+)= scale * a[k,m]^T · b[k,n]`: the weight-gradient shape.
pub fn matmul_at(out: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), scale: f32, accumulate: bool) {
    product(out, a, (1, m), b, (n, 1), (m, k, n), scale, accumulate);
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

//! Dense f32 matrix products. Row-major slices throughout; the `_bt`/`_at`
//! variants read one operand transposed through strides, so nothing is copied.
//!
//! Two crates, chosen by measurement on SmolLM2's projection shapes
//! (single thread, this AVX-512 machine): for many rows (prefill, training)
//! `matrixmultiply` ran 1.3-1.8x faster than `gemm` (e.g. 256x576x192: 46 vs
//! 24 GFLOP/s); for a few rows (decoding) `gemm` ran ~4x faster
//! (1x576x1536: 3.8 vs 1.0 GFLOP/s). Many-row products are split into row
//! blocks over rayon; each output element's sum runs in the same order
//! whatever the split, so results do not depend on the thread count.
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
        return product_row_blocks(out, lhs, (lrs, lcs), rhs, (rrs, rcs), (m, k, n), scale, accumulate);
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

/// From this many rows on, `matrixmultiply` in row blocks beats `gemm`.
const MANY_ROWS: usize = 16;

/// [`product`] for many rows: `matrixmultiply::sgemm` on row blocks, one
/// block per rayon thread (blocks of at least [`MANY_ROWS`] rows).
#[allow(clippy::too_many_arguments)]
fn product_row_blocks(
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
    let block = m.div_ceil(threads).max(MANY_ROWS);
    out.par_chunks_mut(block * n).enumerate().for_each(|(b, out_b)| {
        let rows = out_b.len() / n;
        let lhs_b = &lhs[b * block * lrs..];
        // SAFETY: rows of this block read lhs at (r * lrs + c * lcs) for
        // r < rows, c < k, inside `lhs_b` because the caller checked the whole
        // of `lhs`; rhs as checked by the caller; `out_b` is `rows * n` long,
        // exclusively borrowed. With beta = 0 sgemm does not read `out_b`.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                n,
                scale,
                lhs_b.as_ptr(),
                lrs as isize,
                lcs as isize,
                rhs.as_ptr(),
                rrs as isize,
                rcs as isize,
                if accumulate { 1.0 } else { 0.0 },
                out_b.as_mut_ptr(),
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
        let (m, k, n) = (200, 64, 96);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0.0; m * n];
            pool.install(|| matmul_bt(&mut out, &a, &b, (m, k, n), 1.0, false));
            out
        };
        assert_eq!(run(1), run(3), "bit-identical across thread counts");
    }
}

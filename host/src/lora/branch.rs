//! The fused LoRA branch, forward and backward as slice functions (llm.c
//! style): `Y += s * drop(X) A^T B^T` (PEFT's `lora_B(lora_A(dropout(x))) *
//! scaling`). The forward saves `xa = drop(X) A^T` (`[T, r]`, tiny); the
//! dropout mask is regenerated from its seed, never stored.
//!
//! Every product has the rank on one side, so none is worth packing: all go
//! through [`matmul_unpacked`] (register tiles straight from the operands).
//! Rows of the outputs are split over rayon in blocks of whole tiles; each
//! output element is summed in one fixed order whatever the split, so
//! results do not depend on the thread count.
use crate::base::counter_rng;
use crate::ops::matmul::{matmul_unpacked, matmul_unpacked_columns, TILE_ROWS};
use crate::ops::SharedMut;
use rayon::prelude::*;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Inverted dropout on the branch input: keep with probability `1 - p`,
/// scale kept values by `1 / (1 - p)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Drop probability in `[0, 1)`.
    pub p: f32,
    /// Mask stream; element `i` of `X` is kept when `uniform(seed, i) >= p`.
    pub seed: u64,
}

/// Token count and the three widths of one branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shapes {
    /// Rows of `X`.
    pub tokens: usize,
    /// `in_features`.
    pub in_f: usize,
    /// LoRA rank `r`.
    pub rank: usize,
    /// `out_features`.
    pub out_f: usize,
}

impl Shapes {
    /// Checks `x: [.., in]`, `a: [r, in]`, `b: [out, r]`.
    pub fn of(x: &Tensor, a: &Tensor, b: &Tensor) -> Result<Shapes> {
        let bad = |what: &str, expected: Vec<usize>, got: &Tensor| {
            Err(Error::Shape { what: format!("lora branch {what}"), expected, got: got.shape.clone() })
        };
        if a.shape.len() != 2 {
            return bad("A (expected [r, in])", vec![0, x.last_dim()], a);
        }
        let (rank, in_f) = (a.shape[0], a.shape[1]);
        if x.last_dim() != in_f {
            return bad("input", vec![x.rows(), in_f], x);
        }
        if b.shape.len() != 2 || b.shape[1] != rank {
            return bad("B (expected [out, r])", vec![0, rank], b);
        }
        Ok(Shapes { tokens: x.rows(), in_f, rank, out_f: b.shape[0] })
    }
}

/// Gradient buffers to fill (each `None` when not wanted); [`backward`]
/// writes every element, so they need not be zeroed.
pub struct Grads {
    /// `[T, in]`.
    pub dx: Option<Vec<f32>>,
    /// `[r, in]`.
    pub da: Option<Vec<f32>>,
    /// `[out, r]`.
    pub db: Option<Vec<f32>>,
}

/// `drop(X)`, or `None` when there is no dropout (use `X` itself).
fn dropped(x: &[f32], dropout: Option<Dropout>) -> Option<Vec<f32>> {
    let d = dropout.filter(|d| d.p > 0.0)?;
    let mut xd = x.to_vec();
    mask(&mut xd, 0, d);
    Some(xd)
}

/// Applies the dropout mask to `v`, element `i` of which is element
/// `first + i` of the masked tensor.
fn mask(v: &mut [f32], first: usize, d: Dropout) {
    let keep_scale = 1.0 / (1.0 - d.p);
    for (i, v) in v.iter_mut().enumerate() {
        *v = if counter_rng::uniform(d.seed, (first + i) as u64) >= d.p { *v * keep_scale } else { 0.0 };
    }
}

/// `[rows, cols] -> [cols, rows]`.
pub fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

/// Products below this many multiply-adds run on the calling thread
/// (decoding, tiny tests): rayon's fork/join would cost more.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// Rows per rayon block when `rows` rows cost `macs_per_row` each: one
/// block per thread, whole tiles.
fn block_rows(rows: usize, macs_per_row: usize) -> usize {
    let threads = if rows * macs_per_row >= PARALLEL_MIN_MACS { rayon::current_num_threads() } else { 1 };
    rows.div_ceil(threads).next_multiple_of(TILE_ROWS).max(1)
}

/// `y: [T, out] += s * drop(x) a^T b^T`; writes `xa: [T, r]`.
#[allow(clippy::too_many_arguments)]
pub fn forward(y: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes) {
    forward_product(y, xa, x, a, b, s, dropout, sh, true);
}

/// `out: [T, out] = s * drop(x) a^T b^T` (overwritten); writes `xa: [T, r]`.
/// The training nodes add `out` to the frozen product themselves, so the
/// fused and the unfused graph round the sum the same way.
#[allow(clippy::too_many_arguments)]
pub fn forward_into(out: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes) {
    forward_product(out, xa, x, a, b, s, dropout, sh, false);
}

/// Both products per block of token rows (a block's `y` rows need only its
/// own `xa` rows), so one fork covers the whole forward.
#[allow(clippy::too_many_arguments)]
fn forward_product(y: &mut [f32], xa: &mut [f32], x: &[f32], a: &[f32], b: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes, accumulate: bool) {
    let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
    if t == 0 || r == 0 {
        if !accumulate {
            y.fill(0.0);
        }
        return;
    }
    let xd = dropped(x, dropout);
    let xd = xd.as_deref().unwrap_or(x);
    let at = transposed(a, r, in_f); // [in, r]
    let bt = transposed(b, out_f, r); // [r, out]
    forward_transposed(y, xa, xd, &at, &bt, s, sh, accumulate);
}

/// The forward's two products from factors already transposed (`at: [in,
/// r]`, `bt: [r, out]`), as inference keeps them: `y (+)= s * x at bt`.
#[allow(clippy::too_many_arguments)]
pub fn forward_transposed(y: &mut [f32], xa: &mut [f32], x: &[f32], at: &[f32], bt: &[f32], s: f32, sh: Shapes, accumulate: bool) {
    let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
    if t == 0 || r == 0 {
        if !accumulate {
            y.fill(0.0);
        }
        return;
    }
    let rows = block_rows(t, r * (in_f + out_f));
    y.par_chunks_mut(rows * out_f).zip(xa.par_chunks_mut(rows * r)).zip(x.par_chunks(rows * in_f)).for_each(|((y, xa), x)| {
        let m = xa.len() / r;
        matmul_unpacked(xa, x, (in_f, 1), at, (m, in_f, r), 1.0, false);
        matmul_unpacked(y, xa, (r, 1), bt, (m, r, out_f), s, accumulate);
    });
}

/// `xa: [T, r] = drop(x) a^T`: the half of the forward that needs only the
/// input, so the fused node runs it while the frozen product is in flight.
pub fn down(xa: &mut [f32], x: &[f32], a: &[f32], dropout: Option<Dropout>, sh: Shapes) {
    let Shapes { tokens: t, in_f, rank: r, .. } = sh;
    if t == 0 || r == 0 {
        return;
    }
    let xd = dropped(x, dropout);
    let xd = xd.as_deref().unwrap_or(x);
    let at = transposed(a, r, in_f); // [in, r]
    let rows = block_rows(t, r * in_f);
    xa.par_chunks_mut(rows * r).zip(xd.par_chunks(rows * in_f)).for_each(|(xa, x)| {
        matmul_unpacked(xa, x, (in_f, 1), &at, (xa.len() / r, in_f, r), 1.0, false);
    });
}

/// `y: [T, out] += s * xa b^T`: the other half, added straight into the
/// frozen product's output. Each element is `y + s * sum`, the same bits as
/// [`forward_into`]'s output added to `y` afterwards, without its buffer.
pub fn add_up(y: &mut [f32], xa: &[f32], b: &[f32], s: f32, sh: Shapes) {
    let Shapes { tokens: t, rank: r, out_f, .. } = sh;
    if t == 0 || r == 0 {
        return;
    }
    let bt = transposed(b, out_f, r); // [r, out]
    let rows = block_rows(t, r * out_f);
    y.par_chunks_mut(rows * out_f).zip(xa.par_chunks(rows * r)).for_each(|(y, xa)| {
        matmul_unpacked(y, xa, (r, 1), &bt, (xa.len() / r, r, out_f), s, true);
    });
}

/// Given `dy: [T, out]`: `dB = s dY^T xa`, `dxa = s dY B`, `dA = dxa^T drop(X)`,
/// `dX = mask * (dxa A)`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    g: &mut Grads,
    dy: &[f32],
    x: &[f32],
    a: &[f32],
    b: &[f32],
    xa: &[f32],
    s: f32,
    dropout: Option<Dropout>,
    sh: Shapes,
) {
    let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
    let dropout = dropout.filter(|d| d.p > 0.0);
    if t == 0 || r == 0 {
        [g.dx.as_deref_mut(), g.da.as_deref_mut(), g.db.as_deref_mut()].into_iter().flatten().for_each(|d| d.fill(0.0));
        return;
    }
    if let Some(db) = g.db.as_deref_mut() {
        grad_b(db, dy, xa, s, sh);
    }
    if g.da.is_none() && g.dx.is_none() {
        return;
    }
    let mut dxa = vec![0.0; t * r]; // [T, r]
    // Per block of token rows: its dxa rows, then its dX rows from them.
    let rows = block_rows(t, r * (out_f + in_f));
    let dx_blocks = g.dx.as_deref_mut().map(|dx| dx.par_chunks_mut(rows * in_f));
    let work = |(blk, (dxa, dx)): (usize, (&mut [f32], Option<&mut [f32]>))| {
        let (t0, m) = (blk * rows, dxa.len() / r);
        matmul_unpacked(dxa, &dy[t0 * out_f..(t0 + m) * out_f], (out_f, 1), b, (m, out_f, r), s, false);
        if let Some(dx) = dx {
            matmul_unpacked(dx, dxa, (r, 1), a, (m, r, in_f), 1.0, false);
            if let Some(d) = dropout {
                mask(dx, t0 * in_f, d);
            }
        }
    };
    match dx_blocks {
        Some(dx) => dxa.par_chunks_mut(rows * r).zip(dx).map(|(a, b)| (a, Some(b))).enumerate().for_each(work),
        None => dxa.par_chunks_mut(rows * r).map(|a| (a, None)).enumerate().for_each(work),
    }
    if let Some(da) = g.da.as_deref_mut() {
        grad_a(da, &dxa, x, dropout, sh);
    }
}

/// `db: [out, r] = s dY^T xa`.
pub fn grad_b(db: &mut [f32], dy: &[f32], xa: &[f32], s: f32, sh: Shapes) {
    let Shapes { tokens: t, rank: r, out_f, .. } = sh;
    // As dB^T = s xa^T dY: rows of dY stream as they are, where dB's own
    // rows would read a column of dY each (1.5x slower measured).
    let mut dbt = vec![0.0; r * out_f]; // [r, out]
    let rows = block_rows(r, t * out_f);
    dbt.par_chunks_mut(rows * out_f).enumerate().for_each(|(blk, dbt)| {
        let j0 = blk * rows;
        matmul_unpacked(dbt, &xa[j0..], (1, r), dy, (dbt.len() / out_f, t, out_f), s, false);
    });
    db.copy_from_slice(&transposed(&dbt, r, out_f));
}

/// `da: [r, in] = dxa^T drop(X)` given `dxa = s dY B: [T, r]`.
pub fn grad_a(da: &mut [f32], dxa: &[f32], x: &[f32], dropout: Option<Dropout>, sh: Shapes) {
    let Shapes { tokens: t, in_f, rank: r, .. } = sh;
    assert!(da.len() == r * in_f && dxa.len() == t * r && x.len() == t * in_f, "grad_a lengths");
    // dA rows j.. = dxa[:, j..]^T drop(X): lhs(j, t) = dxa[t * r + j]
    let xd = dropped(x, dropout);
    let xd = xd.as_deref().unwrap_or(x);
    // Column blocks, not row blocks: each thread then reads only its
    // columns of X, once (with row blocks every thread swept all of X, a
    // strided walk that missed cache; ~4% of a training step).
    let cols = if r * t * in_f >= PARALLEL_MIN_MACS { in_f.div_ceil(rayon::current_num_threads()).next_multiple_of(32) } else { in_f };
    let da_ptr = SharedMut(da.as_mut_ptr());
    (0..in_f.div_ceil(cols.max(1))).into_par_iter().for_each(|b| {
        let da_ptr = da_ptr;
        let c0 = b * cols;
        let n = cols.min(in_f - c0);
        // SAFETY: columns c0 .. c0 + n of the r rows of `da` ([r, in_f],
        // exclusively borrowed by this call) belong to this block alone.
        unsafe { matmul_unpacked_columns(da_ptr.0.add(c0), in_f, dxa, (1, r), &xd[c0..], in_f, (r, t, n), 1.0) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 - 0.5) * 2.0).collect()
    }

    /// The branch in f64 with naive loops: `[y, xa, dx, da, db]`.
    fn reference(x: &[f32], a: &[f32], b: &[f32], dy: &[f32], s: f64, dropout: Option<Dropout>, sh: Shapes) -> [Vec<f64>; 5] {
        let Shapes { tokens: t, in_f, rank: r, out_f } = sh;
        let keep = |i: usize| match dropout {
            Some(d) if d.p > 0.0 => {
                if counter_rng::uniform(d.seed, i as u64) >= d.p {
                    1.0 / (1.0 - d.p as f64)
                } else {
                    0.0
                }
            }
            _ => 1.0,
        };
        let xd: Vec<f64> = x.iter().enumerate().map(|(i, &v)| v as f64 * keep(i)).collect();
        let mut xa = vec![0.0; t * r];
        let mut y = vec![0.0; t * out_f];
        let mut dxa = vec![0.0; t * r];
        for tt in 0..t {
            for j in 0..r {
                xa[tt * r + j] = (0..in_f).map(|i| xd[tt * in_f + i] * a[j * in_f + i] as f64).sum();
                dxa[tt * r + j] = s * (0..out_f).map(|o| dy[tt * out_f + o] as f64 * b[o * r + j] as f64).sum::<f64>();
            }
            for o in 0..out_f {
                y[tt * out_f + o] = s * (0..r).map(|j| xa[tt * r + j] * b[o * r + j] as f64).sum::<f64>();
            }
        }
        let mut dx = vec![0.0; t * in_f];
        for (e, v) in dx.iter_mut().enumerate() {
            let (tt, i) = (e / in_f, e % in_f);
            *v = keep(e) * (0..r).map(|j| dxa[tt * r + j] * a[j * in_f + i] as f64).sum::<f64>();
        }
        let mut da = vec![0.0; r * in_f];
        for (e, v) in da.iter_mut().enumerate() {
            let (j, i) = (e / in_f, e % in_f);
            *v = (0..t).map(|tt| dxa[tt * r + j] * xd[tt * in_f + i]).sum();
        }
        let mut db = vec![0.0; out_f * r];
        for (e, v) in db.iter_mut().enumerate() {
            let (o, j) = (e / r, e % r);
            *v = s * (0..t).map(|tt| dy[tt * out_f + o] as f64 * xa[tt * r + j]).sum::<f64>();
        }
        [y, xa, dx, da, db]
    }

    fn assert_close(what: &str, got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what} length");
        let scale = want.iter().fold(1e-6f64, |m, w| m.max(w.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((*g as f64 - w).abs() <= 1e-5 * scale, "{what}[{i}]: {g} vs {w}");
        }
    }

    /// `[y, xa, dx, da, db]` from the branch on a `threads` pool; `y` starts
    /// at `base` and is accumulated into.
    fn run(x: &[f32], a: &[f32], b: &[f32], dy: &[f32], base: &[f32], s: f32, dropout: Option<Dropout>, sh: Shapes, threads: usize) -> [Vec<f32>; 5] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut y = base.to_vec();
            let mut xa = vec![f32::NAN; sh.tokens * sh.rank];
            forward(&mut y, &mut xa, x, a, b, s, dropout, sh);
            let mut g = Grads { dx: Some(vec![f32::NAN; x.len()]), da: Some(vec![f32::NAN; a.len()]), db: Some(vec![f32::NAN; b.len()]) };
            backward(&mut g, dy, x, a, b, &xa, s, dropout, sh);
            [y, xa, g.dx.unwrap(), g.da.unwrap(), g.db.unwrap()]
        })
    }

    /// Ranks below, at and above one 16-lane tile, token counts that leave
    /// edge tiles, with and without dropout; 1 and 3 threads agree bit for
    /// bit. The last shape is big enough for dA's parallel column blocks
    /// (96, 96 and 8 columns on 3 threads).
    #[test]
    fn forward_and_backward_match_f64_on_any_thread_count() {
        for (t, in_f, rank, out_f) in [(1, 9, 1, 5), (37, 70, 5, 40), (64, 48, 16, 100), (21, 33, 20, 17), (130, 200, 16, 50)] {
            let sh = Shapes { tokens: t, in_f, rank, out_f };
            let (x, a, b, dy) = (values(t * in_f, 1), values(rank * in_f, 2), values(out_f * rank, 3), values(t * out_f, 4));
            let base = values(t * out_f, 5);
            for dropout in [None, Some(Dropout { p: 0.3, seed: 11 })] {
                let got = run(&x, &a, &b, &dy, &base, 1.5, dropout, sh, 3);
                let mut want = reference(&x, &a, &b, &dy, 1.5, dropout, sh);
                want[0].iter_mut().zip(&base).for_each(|(w, b)| *w += *b as f64);
                for (i, name) in ["y", "xa", "dx", "da", "db"].iter().enumerate() {
                    assert_close(name, &got[i], &want[i]);
                }
                assert_eq!(got, run(&x, &a, &b, &dy, &base, 1.5, dropout, sh, 1), "1 vs 3 threads");
            }
        }
    }

    #[test]
    fn forward_into_overwrites_halves_agree_and_unwanted_grads_stay_none() {
        let sh = Shapes { tokens: 20, in_f: 24, rank: 4, out_f: 30 };
        let (x, a, b) = (values(20 * 24, 1), values(4 * 24, 2), values(30 * 4, 3));
        let (mut added, mut xa) = (vec![0.0; 20 * 30], vec![0.0; 20 * 4]);
        forward(&mut added, &mut xa, &x, &a, &b, 2.0, None, sh);
        let mut over = vec![f32::NAN; 20 * 30];
        forward_into(&mut over, &mut xa, &x, &a, &b, 2.0, None, sh);
        assert_eq!(added, over);
        let (mut halves, mut xa_halves) = (vec![0.0; 20 * 30], vec![f32::NAN; 20 * 4]);
        down(&mut xa_halves, &x, &a, None, sh);
        add_up(&mut halves, &xa_halves, &b, 2.0, sh);
        assert_eq!((halves, &xa_halves), (added, &xa), "down + add_up is forward");
        let mut g = Grads { dx: None, da: Some(vec![0.0; 4 * 24]), db: None };
        backward(&mut g, &values(20 * 30, 4), &x, &a, &b, &xa, 2.0, None, sh);
        assert!(g.dx.is_none() && g.db.is_none());
        assert!(g.da.unwrap().iter().any(|&v| v != 0.0));
    }
}

//! Scaled dot-product attention with grouped-query heads (GQA), causal or
//! bidirectional (the LLM2Vec-style embedder needs the latter).
//!
//! Queries are the last `q_len` positions of a `kv_len`-long sequence (so
//! with a KV cache, query `t` sits at absolute position `kv_len - q_len + t`
//! and, when causal, sees keys `0..=kv_len - q_len + t`). Query head `h`
//! reads key/value head `h / (n_head / n_kv_head)`, as `repeat_kv` does.
//!
//! The forward saves the log-sum-exp of each softmax row (`lse`), which is
//! all a flash-style backward needs to rebuild the probabilities.
//!
//! Work is cut into blocks of [`BLOCK`] rows per head: query blocks in the
//! forward, key blocks in the backward. A block only touches the keys (or
//! queries) the causal mask lets through, so the upper triangle of the score
//! matrix is never computed. Blocks run in parallel; each writes its own
//! outputs or partial sums, and the partials are added in block and head
//! order afterwards, so results do not depend on the thread count.
//! Products run single-threaded on `ops::matmul`'s unpacked register tiles,
//! reading the heads in place through strides (keys and values through
//! per-call transposed copies where a product reads them sideways; a
//! decoding step's `q k^T` stays a strided `matrixmultiply` call); with
//! [`Products::Bf16`] (training with bf16
//! frozen weights) they run on bf16 tiles instead (AMX, or `VDPBF16PS`
//! without AMX), operands rounded to bf16 (`attention/bf16.rs`): on AMX
//! 1.47-1.69 against 2.33-2.72 ms per SmolLM2 layer (forward + backward,
//! 2 threads, `host/examples/bench_attention.rs`, several runs on a noisy
//! machine); on Zen 4 the training job's attention time fell by a quarter
//! (0.58-0.62 -> 0.43-0.47 s over 6 steps, 2026-12-04).
use crate::ops::activation::{exp, exp_shifted, simd_fn};
use crate::ops::softmax::{lane_max, lane_sum};
use crate::ops::matmul::matmul_unpacked_columns;
use crate::ops::quant_matvec::{matvec, StoredRows};
use crate::ops::SharedMut;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod bf16;

/// Rows per parallel block: big enough for efficient products, small enough
/// that the masked half of each diagonal block stays a small waste.
const BLOCK: usize = 64;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// Query rows (new tokens).
    pub q_len: usize,
    /// Key/value rows (cached + new tokens).
    pub kv_len: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; divides `n_head`.
    pub n_kv_head: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Mask keys after each query's position.
    pub causal: bool,
}

impl AttnDims {
    /// Keys query `t` may attend to: `0..visible(t)`.
    #[inline]
    pub fn visible(&self, t: usize) -> usize {
        if self.causal {
            self.kv_len - self.q_len + t + 1
        } else {
            self.kv_len
        }
    }

    /// First query that sees key `j` (`q_len` if none does).
    #[inline]
    fn first_seeing(&self, j: usize) -> usize {
        if self.causal {
            (j + self.q_len).saturating_sub(self.kv_len).min(self.q_len)
        } else {
            0
        }
    }

    fn check(&self) {
        let AttnDims { q_len, kv_len, n_head, n_kv_head, .. } = *self;
        assert!(n_kv_head > 0 && n_head % n_kv_head == 0, "attention: {n_head} heads over {n_kv_head} kv heads");
        assert!(q_len <= kv_len, "attention: {q_len} queries over {kv_len} keys");
    }
}

/// `c[m, n] = alpha * a[m, k] · b[k, n]` (overwritten), each operand given
/// by a base pointer and (row, column) strides.
///
/// Where `b` and `c` have contiguous rows (every call but decoding's
/// `q k^T`: `k` and `v` are read through transposed copies where a
/// product needs them sideways), the unpacked register tiles of
/// `ops::matmul` run it: these blocks are small (64 rows, head_dim 64), and
/// `matrixmultiply` spent about a sixth of its time packing them (`perf`
/// over a training step: 1.1% packing beside 5.4% in its kernel).
/// `matrixmultiply` stays for the other layout.
///
/// # Safety
/// Every index `r * rs + c * cs` of each operand must lie inside its
/// allocation, and `c` must not alias `a` or `b` or be written concurrently.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: (*const f32, usize, usize),
    b: (*const f32, usize, usize),
    c: (*mut f32, usize, usize),
) {
    // Decoding's scores: a few queries against keys read sideways in the
    // cache (each column of b is one key's contiguous row): dot products,
    // not a packed product that would copy the whole cache per call.
    // `b.2 >= k`: keys must not overlap; a one-key transposed operand
    // (training on a one-token sequence) has both strides 1 and goes below.
    if m > 0 && k > 0 && n > 0 && m <= DOT_MAX_QUERIES && a.2 == 1 && b.1 == 1 && b.2 >= k && c.1 == n && c.2 == 1 {
        // SAFETY: as below; b's n rows of k values are b.2 apart.
        unsafe {
            let lhs = std::slice::from_raw_parts(a.0, (m - 1) * a.1 + k);
            let lhs: Vec<f32> = (0..m).flat_map(|r| lhs[r * a.1..r * a.1 + k].iter().copied()).collect();
            let keys = std::slice::from_raw_parts(b.0, (n - 1) * b.2 + k);
            let out = std::slice::from_raw_parts_mut(c.0, m * n);
            matvec(out, &lhs, m, StoredRows::F32Strided(keys, b.2), (n, k));
            out.iter_mut().for_each(|v| *v *= alpha);
        }
        return;
    }
    if m > 0 && k > 0 && n > 0 && b.2 == 1 && c.2 == 1 {
        // SAFETY: the last index each operand reads is inside its
        // allocation (the caller's contract); `c` rows are `c.1` apart.
        unsafe {
            let lhs = std::slice::from_raw_parts(a.0, (m - 1) * a.1 + (k - 1) * a.2 + 1);
            let rhs = std::slice::from_raw_parts(b.0, (k - 1) * b.1 + n);
            return matmul_unpacked_columns(c.0, c.1, lhs, (a.1, a.2), rhs, b.1, (m, k, n), alpha);
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        matrixmultiply::sgemm(m, k, n, alpha, a.0, a.1 as isize, a.2 as isize, b.0, b.1 as isize, b.2 as isize, 0.0, c.0, c.1 as isize, c.2 as isize);
    }
}

/// Up to this many queries, scores against keys read in place are dot
/// products ([`matvec`]).
const DOT_MAX_QUERIES: usize = 4;

/// From this many queries on, the forward reads keys through a transposed
/// copy ([`heads_transposed`]); the backward (training: as many queries as
/// keys) always does.
const TRANSPOSE_MIN_QUERIES: usize = 16;

/// `t[kvh][f][j] = x[j, kvh, f]`: each key/value head transposed to
/// `[head_dim, kv_len]`, so that products with `x^T` read whole rows.
fn heads_transposed(x: &[f32], d: AttnDims) -> Vec<f32> {
    let AttnDims { kv_len, n_kv_head, head_dim: hd, .. } = d;
    let mut t = vec![0.0f32; x.len()];
    t.par_chunks_mut(hd * kv_len).enumerate().for_each(|(kvh, th)| {
        for (j, row) in x.chunks_exact(n_kv_head * hd).enumerate() {
            row[kvh * hd..(kvh + 1) * hd].iter().enumerate().for_each(|(f, &v)| th[f * kv_len + j] = v);
        }
    });
    t
}

/// `out[q_len, n_head * head_dim] = softmax(scale * q k^T + mask) v`, with
/// `lse[q_len, n_head]` saved.
///
/// `q`: `[q_len, n_head, head_dim]`; `k`, `v`: `[kv_len, n_kv_head, head_dim]`.
/// One parallel task per (head, block of [`BLOCK`] queries): scores against
/// the keys the block can see, row softmax, then `p v`.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f32) {
    attention_forward_window(out, lse, q, k, v, d, scale, None)
}

/// [`attention_forward`] where, with `window = Some(w)`, a causal query
/// also ignores keys `w` or more positions before it: query `t` sees keys
/// `visible(t) - w .. visible(t)` (sliding-window attention; transformers'
/// `sliding_window = w`). A block of queries only computes scores for the
/// keys its rows can see, so a long prompt costs `O(q_len w)`.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_window(out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f32, window: Option<usize>) {
    check_forward(out, lse, q, k, v, d);
    assert!(window != Some(0), "attention: a window of 0 keys");
    let AttnDims { n_head, n_kv_head, head_dim: hd, .. } = d;
    let group = n_head / n_kv_head;
    let (qs, ks) = (n_head * hd, n_kv_head * hd);
    // First key query `t` sees.
    let first = |t: usize| window.map_or(0, |w| d.visible(t).saturating_sub(w));
    // Decoding (a few queries against a long cache) would spend more on
    // the copy than on the products: k is read sideways in place then.
    let kt = (d.q_len >= TRANSPOSE_MIN_QUERIES).then(|| heads_transposed(k, d));
    let out_ptr = SharedMut(out.as_mut_ptr());
    query_blocks(lse, d, |h, r0, rows| {
        let out_ptr = out_ptr;
        // Keys lo..hi: what the block's rows see together.
        let (lo, hi) = (first(r0), d.visible(r0 + rows - 1));
        let keys = hi - lo;
        // Offsets of this block's first query row and of its head's first key.
        let (qv, kv) = (r0 * qs + h * hd, lo * ks + (h / group) * hd);
        // k^T of this head from key lo: [hd, keys]
        let k_t = match &kt {
            Some(kt) => (kt[(h / group) * hd * d.kv_len + lo..].as_ptr(), d.kv_len, 1),
            None => (k[kv..].as_ptr(), 1, ks),
        };
        // p: [rows, keys]
        let mut p = vec![0.0f32; rows * keys];
        // SAFETY: q rows r0..r0+rows and k/v rows lo..hi of this head lie
        // inside q, k (or kt), v (lengths asserted above); out rows
        // r0..r0+rows of head h are written by this task only.
        unsafe {
            gemm((rows, hd, keys), scale, (q.as_ptr().add(qv), qs, 1), k_t, (p.as_mut_ptr(), keys, 1));
        }
        let lse_b: Vec<f32> = p
            .chunks_exact_mut(keys)
            .enumerate()
            .map(|(t, row)| softmax_range(row, first(r0 + t) - lo, d.visible(r0 + t) - lo))
            .collect();
        unsafe {
            gemm((rows, keys, hd), 1.0, (p.as_ptr(), keys, 1), (v.as_ptr().add(kv), ks, 1), (out_ptr.0.add(qv), qs, 1));
        }
        lse_b
    });
}

/// Runs `task(head, first query, rows)` on every (head, block of
/// [`BLOCK`] queries) in parallel (both forward paths); each returns its
/// rows' log-sum-exps, written into `lse: [q_len, n_head]`.
fn query_blocks(lse: &mut [f32], d: AttnDims, task: impl Fn(usize, usize, usize) -> Vec<f32> + Sync) {
    let blocks = d.q_len.div_ceil(BLOCK);
    let lse_blocks: Vec<Vec<f32>> = (0..d.n_head * blocks)
        .into_par_iter()
        .map(|t| {
            let (h, r0) = (t / blocks, t % blocks * BLOCK);
            task(h, r0, BLOCK.min(d.q_len - r0))
        })
        .collect();
    for (t, lse_b) in lse_blocks.iter().enumerate() {
        let (h, r0) = (t / blocks, t % blocks * BLOCK);
        for (i, &l) in lse_b.iter().enumerate() {
            lse[(r0 + i) * d.n_head + h] = l;
        }
    }
}

fn check_forward(out: &[f32], lse: &[f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims) {
    d.check();
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    assert_eq!(q.len(), q_len * n_head * hd, "attention q length");
    assert_eq!(k.len(), kv_len * n_kv_head * hd, "attention k length");
    assert_eq!(v.len(), k.len(), "attention v length");
    assert_eq!(out.len(), q.len(), "attention out length");
    assert_eq!(lse.len(), q_len * n_head, "attention lse length");
}

/// How attention's products are computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// f32 (`ops::matmul`'s unpacked tiles).
    #[default]
    F32,
    /// Operands rounded to bf16 on the AMX or `VDPBF16PS` tiles, f32 sums
    /// (`bf16_matmul::operands`): the precision of PyTorch's bf16
    /// attention. Falls back to [`Products::F32`] on CPUs with neither and
    /// for calls with a cache (`q_len < kv_len`).
    Bf16,
}

impl Products {
    /// Whether a call with `d` runs on the bf16 path (x86 only for now).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn runs_bf16(self, d: &AttnDims) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self == Products::Bf16 && d.q_len == d.kv_len && crate::ops::bf16_matmul::operands::available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = d;
            false
        }
    }
}

/// [`attention_forward`] with its products computed as `products` says.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward_with(products: Products, out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if products.runs_bf16(&d) {
        check_forward(out, lse, q, k, v, d);
        return bf16::forward(out, lse, q, k, v, d, scale);
    }
    let _ = products;
    attention_forward(out, lse, q, k, v, d, scale)
}

/// Softmax of `row[..seen]` in place, zero past it; returns the row's
/// log-sum-exp.
fn softmax_prefix(row: &mut [f32], seen: usize) -> f32 {
    softmax_range(row, 0, seen)
}

/// Softmax of `row[from..to]` in place, zero elsewhere; returns the
/// log-sum-exp of that range.
fn softmax_range(row: &mut [f32], from: usize, to: usize) -> f32 {
    let (row, after) = row.split_at_mut(to);
    after.fill(0.0);
    let (before, live) = row.split_at_mut(from);
    before.fill(0.0);
    let max = lane_max(live);
    exp_shifted(live, max);
    let sum = lane_sum(live);
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|s| *s *= inv);
    max + sum.ln()
}

simd_fn! {
    /// One row of the backward's score block, in place: `p = exp(s - lse)`
    /// on the visible keys `hidden..seen` (zero elsewhere) and
    /// `ds = p (dp - big_d) scale`.
    fn probs_and_score_grads(s: &mut [f32], dp: &mut [f32], hidden: usize, seen: usize, lse: f32, big_d: f32, scale: f32) {
        for (j, (p, g)) in s.iter_mut().zip(dp.iter_mut()).enumerate() {
            let e = exp(*p - lse);
            *p = if j >= hidden && j < seen { e } else { 0.0 };
            *g = *p * (*g - big_d) * scale;
        }
    }
}

/// Partial gradients of one (head, key block) backward task.
struct KeyBlockGrads {
    /// `[rows, hd]`: this key block's share of `dq` for queries `first..end`.
    dq: Vec<f32>,
    /// `[cols, hd]` each: this head's share of the block's `dk`, `dv`.
    dk: Vec<f32>,
    dv: Vec<f32>,
    first: usize,
    end: usize,
}

/// Backward of [`attention_forward`]: the probabilities are rebuilt from
/// `lse`, never stored. With `p = softmax(s)`, `dp = dout v^T`,
/// `D = rowsum(dout * out)`: `ds = p (dp - D)`, `dq = scale ds k`,
/// `dk = scale ds^T q`, `dv = p^T dout`.
///
/// One parallel task per (query head, block of [`BLOCK`] keys) over the
/// queries that see the block: five products on a `[rows, BLOCK]` score
/// block. Its `dq` rows and its `dk`/`dv` rows are partial sums, added
/// afterwards in key-block order (dq) and head order (dk, dv).
///
/// `dq`, `dk`, `dv` (all three overwritten) are shaped as `q`, `k`, `v`
/// (see [`BackwardInputs`]). With a sliding window the task covers only
/// the queries near enough to see the block.
pub fn attention_backward((dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]), x: BackwardInputs<'_>) {
    check_backward((dq, dk, dv), &x);
    let BackwardInputs { dout, q, k, v, out, lse, d, scale, window } = x;
    let AttnDims { q_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    let group = n_head / n_kv_head;
    let (qs, ks) = (n_head * hd, n_kv_head * hd);
    let (kt, vt) = (heads_transposed(k, d), heads_transposed(v, d));
    key_blocks((dq, dk, dv), d, |h, c0, cols| {
        let first = d.first_seeing(c0);
        // Queries from `end` on are `window` or more positions past the block's last key.
        let end = window.map_or(q_len, |w| (c0 + cols - 1 + w).saturating_sub(d.kv_len - q_len).clamp(first, q_len));
        let rows = end - first;
        let qv = first * qs + h * hd;
        let kv = c0 * ks + (h / group) * hd;
        // column c0 of this head in `kt` and `vt`
        let tv = (h / group) * hd * d.kv_len + c0;
        // s, dp: [rows, cols]
        let (mut s, mut dp) = (vec![0.0f32; rows * cols], vec![0.0f32; rows * cols]);
        let (mut dq_b, mut dk_b, mut dv_b) = (vec![0.0f32; rows * hd], vec![0.0f32; cols * hd], vec![0.0f32; cols * hd]);
        // SAFETY: query rows first..end and key rows c0..c0+cols of
        // this head lie inside q, dout, k, v and their copies kt, vt
        // (lengths asserted above); the outputs are this task's own buffers.
        unsafe {
            gemm((rows, hd, cols), scale, (q.as_ptr().add(qv), qs, 1), (kt.as_ptr().add(tv), d.kv_len, 1), (s.as_mut_ptr(), cols, 1));
            gemm((rows, hd, cols), 1.0, (dout.as_ptr().add(qv), qs, 1), (vt.as_ptr().add(tv), d.kv_len, 1), (dp.as_mut_ptr(), cols, 1));
        }
        for (r, (s_r, dp_r)) in s.chunks_exact_mut(cols).zip(dp.chunks_exact_mut(cols)).enumerate() {
            let t = first + r;
            let at = t * qs + h * hd;
            let big_d = lane_dot(&dout[at..at + hd], &out[at..at + hd]);
            let seen = d.visible(t).saturating_sub(c0);
            let hidden = window.map_or(0, |w| d.visible(t).saturating_sub(w).saturating_sub(c0));
            probs_and_score_grads(s_r, dp_r, hidden, seen, lse[t * n_head + h], big_d, scale);
        }
        unsafe {
            gemm((cols, rows, hd), 1.0, (s.as_ptr(), 1, cols), (dout.as_ptr().add(qv), qs, 1), (dv_b.as_mut_ptr(), hd, 1));
            gemm((cols, rows, hd), 1.0, (dp.as_ptr(), 1, cols), (q.as_ptr().add(qv), qs, 1), (dk_b.as_mut_ptr(), hd, 1));
            gemm((rows, cols, hd), 1.0, (dp.as_ptr(), cols, 1), (k.as_ptr().add(kv), ks, 1), (dq_b.as_mut_ptr(), hd, 1));
        }
        KeyBlockGrads { dq: dq_b, dk: dk_b, dv: dv_b, first, end }
    });
}

/// What the backward reads: the forward's inputs and outputs, and the
/// gradient of its output.
#[derive(Clone, Copy)]
pub struct BackwardInputs<'a> {
    /// `[q_len, n_head, head_dim]`.
    pub dout: &'a [f32],
    /// `[q_len, n_head, head_dim]`.
    pub q: &'a [f32],
    /// `[kv_len, n_kv_head, head_dim]`.
    pub k: &'a [f32],
    /// `[kv_len, n_kv_head, head_dim]`.
    pub v: &'a [f32],
    /// The forward's output, `[q_len, n_head, head_dim]`.
    pub out: &'a [f32],
    /// The forward's log-sum-exp per softmax row, `[q_len, n_head]`.
    pub lse: &'a [f32],
    /// The forward's sizes.
    pub d: AttnDims,
    /// The forward's score scale.
    pub scale: f32,
    /// The forward's sliding window ([`attention_forward_window`]).
    pub window: Option<usize>,
}

fn check_backward((dq, dk, dv): (&[f32], &[f32], &[f32]), x: &BackwardInputs<'_>) {
    let BackwardInputs { dout, q, k, v, out, lse, d, .. } = *x;
    d.check();
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    assert!(q.len() == q_len * n_head * hd && dq.len() == q.len() && dout.len() == q.len() && out.len() == q.len(), "attention_backward q lengths");
    assert!(dk.len() == k.len() && dv.len() == v.len() && v.len() == k.len() && k.len() == kv_len * n_kv_head * hd, "attention_backward kv lengths");
    assert_eq!(lse.len(), q_len * n_head, "attention_backward lse length");
}

/// [`attention_backward`] with its products computed as `products` says.
pub fn attention_backward_with(products: Products, (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]), x: BackwardInputs<'_>) {
    #[cfg(target_arch = "x86_64")]
    if products.runs_bf16(&x.d) && x.window.is_none() {
        check_backward((dq, dk, dv), &x);
        return bf16::backward((dq, dk, dv), x);
    }
    let _ = products;
    attention_backward((dq, dk, dv), x)
}

/// Runs `task(query head, first key, keys)` on every (query head, block of
/// [`BLOCK`] keys) in parallel (both backward paths), then adds the
/// partials into `dq`, `dk`, `dv` (overwritten): `dq` over key blocks in
/// block order, `dk` and `dv` over the group's query heads in head order.
fn key_blocks((dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]), d: AttnDims, task: impl Fn(usize, usize, usize) -> KeyBlockGrads + Sync) {
    let AttnDims { kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    let (group, blocks) = (n_head / n_kv_head, kv_len.div_ceil(BLOCK));
    let (qs, ks) = (n_head * hd, n_kv_head * hd);
    let grads: Vec<KeyBlockGrads> = (0..n_head * blocks)
        .into_par_iter()
        .map(|t| {
            let c0 = t % blocks * BLOCK;
            task(t / blocks, c0, BLOCK.min(kv_len - c0))
        })
        .collect();
    // dq[t, h] = sum over key blocks, in block order.
    dq.par_chunks_mut(qs).enumerate().for_each(|(t, dq_t)| {
        dq_t.fill(0.0);
        for (task, g) in grads.iter().enumerate().filter(|(_, g)| (g.first..g.end).contains(&t)) {
            let h = task / blocks;
            let src = &g.dq[(t - g.first) * hd..][..hd];
            dq_t[h * hd..][..hd].iter_mut().zip(src).for_each(|(a, b)| *a += b);
        }
    });
    // dk, dv[j, kvh] = sum over the group's query heads, in head order.
    dk.par_chunks_mut(ks).zip(dv.par_chunks_mut(ks)).enumerate().for_each(|(j, (dk_j, dv_j))| {
        let (b, c) = (j / BLOCK, j % BLOCK);
        for kvh in 0..n_kv_head {
            let (dk_o, dv_o) = (&mut dk_j[kvh * hd..][..hd], &mut dv_j[kvh * hd..][..hd]);
            dk_o.fill(0.0);
            dv_o.fill(0.0);
            for h in kvh * group..(kvh + 1) * group {
                let g = &grads[h * blocks + b];
                dk_o.iter_mut().zip(&g.dk[c * hd..][..hd]).for_each(|(a, b)| *a += b);
                dv_o.iter_mut().zip(&g.dv[c * hd..][..hd]).for_each(|(a, b)| *a += b);
            }
        }
    });
}

simd_fn! {
    /// `sum(a * b)`, in the fixed 16-lane order of [`lane_sum`].
    fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
        const LANES: usize = 16;
        let mut acc = [0.0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
        for (x, y) in ca.zip(cb) {
            for l in 0..LANES {
                acc[l] += x[l] * y[l];
            }
        }
        lane_sum(&acc) + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Products {
        /// Error allowed against f64, absolute on outputs of order 1: bf16
        /// operands keep 8 significant bits (2^-9 relative rounding), f32 24.
        fn tolerance(self) -> f64 {
            match self {
                Products::F32 => 1e-5,
                Products::Bf16 => 1e-2,
            }
        }

        /// Relative error allowed on a directional derivative of the
        /// backward against central differences of the f64 forward.
        fn derivative_tolerance(self) -> f64 {
            match self {
                Products::F32 => 1e-3,
                Products::Bf16 => 1e-2,
            }
        }
    }

    /// f64 reference with explicit repeat_kv and a -inf mask.
    fn reference(q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f64) -> Vec<f64> {
        reference_window(q, k, v, d, scale, usize::MAX)
    }

    /// [`reference`] where query `t` also masks keys `j` with `pos - j >= window`.
    fn reference_window(q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f64, window: usize) -> Vec<f64> {
        let mut out = vec![0f64; d.q_len * d.n_head * d.head_dim];
        let hd = d.head_dim;
        for t in 0..d.q_len {
            for h in 0..d.n_head {
                let kvh = h * d.n_kv_head / d.n_head;
                let pos = d.kv_len - d.q_len + t;
                let s: Vec<f64> = (0..d.kv_len)
                    .map(|j| {
                        if d.causal && (j > pos || pos - j >= window) {
                            f64::NEG_INFINITY
                        } else {
                            scale
                                * (0..hd)
                                    .map(|i| {
                                        q[(t * d.n_head + h) * hd + i] as f64 * k[(j * d.n_kv_head + kvh) * hd + i] as f64
                                    })
                                    .sum::<f64>()
                        }
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for j in 0..d.kv_len {
                    let p = (s[j] - m).exp() / z;
                    for i in 0..hd {
                        out[(t * d.n_head + h) * hd + i] += p * v[(j * d.n_kv_head + kvh) * hd + i] as f64;
                    }
                }
            }
        }
        out
    }

    /// Sliding windows shorter and longer than a block of queries, with and
    /// without cached keys before the queries, a window of one key and one
    /// wider than the sequence (plain causal attention, to the same bits).
    #[test]
    fn sliding_window_matches_f64_with_the_window_mask() {
        let cases = [(150, 150, 40), (150, 150, 100), (3, 60, 7), (1, 30, 5), (20, 23, 1), (70, 90, 500)];
        for (q_len, kv_len, window) in cases {
            let d = AttnDims { q_len, kv_len, n_head: 4, n_kv_head: 2, head_dim: 8, causal: true };
            let q: Vec<f32> = (0..q_len * 32).map(|i| (i as f32 * 0.61).sin()).collect();
            let k: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.23).cos()).collect();
            let v: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.11).sin() * 2.0).collect();
            let want = reference_window(&q, &k, &v, d, 0.35, window);
            let mut out = vec![0.0; q.len()];
            let mut lse = vec![0.0; q_len * 4];
            attention_forward_window(&mut out, &mut lse, &q, &k, &v, d, 0.35, Some(window));
            for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() < 1e-5, "{q_len}/{kv_len} window {window}, element {i}: {g} vs {w}");
            }
            if window >= kv_len {
                let mut plain = vec![0.0; q.len()];
                attention_forward(&mut plain, &mut lse, &q, &k, &v, d, 0.35);
                assert_eq!(plain, out, "a window wider than the sequence changes nothing");
            }
        }
    }

    #[test]
    fn gqa_causal_cached_and_bidirectional_match_f64() {
        // below and above TRANSPOSE_MIN_QUERIES (keys read in place, then transposed)
        for (q_len, kv_len, causal) in [(6, 6, true), (2, 7, true), (5, 5, false), (20, 23, true), (17, 17, false)] {
            let d = AttnDims { q_len, kv_len, n_head: 4, n_kv_head: 2, head_dim: 8, causal };
            let q: Vec<f32> = (0..q_len * 32).map(|i| (i as f32 * 0.61).sin()).collect();
            let k: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.23).cos()).collect();
            let v: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.11).sin() * 2.0).collect();
            let want = reference(&q, &k, &v, d, 0.35);
            for products in [Products::F32, Products::Bf16] {
                let mut out = vec![0.0; q.len()];
                let mut lse = vec![0.0; q_len * 4];
                attention_forward_with(products, &mut out, &mut lse, &q, &k, &v, d, 0.35);
                for (g, w) in out.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() < products.tolerance(), "{products:?} {q_len}/{kv_len}/{causal}: {g} vs {w}");
                }
            }
        }
    }

    /// Forward and backward give the same bits on 1 and 3 threads (blocks
    /// sum their partials in a fixed order).
    #[test]
    fn results_do_not_depend_on_thread_count() {
        let d = AttnDims { q_len: 200, kv_len: 200, n_head: 6, n_kv_head: 2, head_dim: 16, causal: true };
        let wave = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
        let (q, k, v, dout) = (wave(200 * 96, 0.61), wave(200 * 32, 0.23), wave(200 * 32, 0.11), wave(200 * 96, 0.37));
        let run = |threads: usize, products: Products| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; 200 * 6]);
                attention_forward_with(products, &mut out, &mut lse, &q, &k, &v, d, 0.25);
                let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
                attention_backward_with(products, (&mut dq, &mut dk, &mut dv), BackwardInputs { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse, d, scale: 0.25, window: None });
                [out, lse, dq, dk, dv].map(|x| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            })
        };
        for products in [Products::F32, Products::Bf16] {
            assert!(run(1, products) == run(3, products), "{products:?}: attention bits differ between 1 and 3 threads");
        }
    }

    /// Longer causal sequences (with and without a cache) and a
    /// bidirectional call: the forward against f64, and the
    /// backward's directional derivatives `<dq, e> + <dk, f> + <dv, g>`
    /// against central differences of the f64 forward's `<out, dout>`.
    #[test]
    fn long_sequences_match_f64_forward_and_directional_derivatives() {
        for (q_len, kv_len, causal, n_head) in [(150, 150, true, 2), (70, 100, true, 2), (80, 80, false, 2), (130, 130, true, 3)] {
            let d = AttnDims { q_len, kv_len, n_head, n_kv_head: 1, head_dim: 4, causal };
            let wave = |n: usize, k: f32, a: f32| (0..n).map(|i| (i as f32 * k).sin() * a).collect::<Vec<f32>>();
            let (q, k, v) = (wave(q_len * n_head * 4, 0.61, 1.0), wave(kv_len * 4, 0.23, 1.0), wave(kv_len * 4, 0.11, 2.0));
            let want = reference(&q, &k, &v, d, 0.35);
            let dout = wave(q.len(), 0.37, 1.0);
            let (e, f, g) = (wave(q.len(), 0.77, 1.0), wave(k.len(), 0.19, 1.0), wave(v.len(), 0.53, 1.0));
            let objective = |t: f32| {
                let shift = |x: &[f32], dir: &[f32]| x.iter().zip(dir).map(|(a, b)| a + t * b).collect::<Vec<f32>>();
                let o = reference(&shift(&q, &e), &shift(&k, &f), &shift(&v, &g), d, 0.35);
                o.iter().zip(&dout).map(|(o, w)| o * *w as f64).sum::<f64>()
            };
            let h = 1e-2;
            let numeric = (objective(h as f32) - objective(-h as f32)) / (2.0 * h);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>();
            for products in [Products::F32, Products::Bf16] {
                let mut out = vec![0.0; q.len()];
                let mut lse = vec![0.0; q_len * n_head];
                attention_forward_with(products, &mut out, &mut lse, &q, &k, &v, d, 0.35);
                for (got, w) in out.iter().zip(&want) {
                    assert!((*got as f64 - w).abs() < products.tolerance(), "{products:?} {q_len}/{kv_len}/{causal}: {got} vs {w}");
                }
                let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
                attention_backward_with(products, (&mut dq, &mut dk, &mut dv), BackwardInputs { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse, d, scale: 0.35, window: None });
                let analytic = dot(&dq, &e) + dot(&dk, &f) + dot(&dv, &g);
                assert!((analytic - numeric).abs() < products.derivative_tolerance() * (1.0 + numeric.abs()), "{products:?} {causal}: {analytic} vs {numeric}");
            }
        }
    }

    /// Sliding windows (shorter than a block of keys, spanning blocks,
    /// of one key, with cached keys before the queries): the backward's
    /// directional derivatives against central differences of the f64
    /// windowed forward.
    #[test]
    fn sliding_window_backward_matches_directional_derivatives() {
        for (q_len, kv_len, window) in [(150, 150, 40), (150, 150, 100), (130, 130, 1), (70, 100, 30)] {
            let d = AttnDims { q_len, kv_len, n_head: 2, n_kv_head: 1, head_dim: 4, causal: true };
            let wave = |n: usize, k: f32, a: f32| (0..n).map(|i| (i as f32 * k).sin() * a).collect::<Vec<f32>>();
            let (q, k, v) = (wave(q_len * 8, 0.61, 1.0), wave(kv_len * 4, 0.23, 1.0), wave(kv_len * 4, 0.11, 2.0));
            let dout = wave(q.len(), 0.37, 1.0);
            let (e, f, g) = (wave(q.len(), 0.77, 1.0), wave(k.len(), 0.19, 1.0), wave(v.len(), 0.53, 1.0));
            let objective = |t: f32| {
                let shift = |x: &[f32], dir: &[f32]| x.iter().zip(dir).map(|(a, b)| a + t * b).collect::<Vec<f32>>();
                let o = reference_window(&shift(&q, &e), &shift(&k, &f), &shift(&v, &g), d, 0.35, window);
                o.iter().zip(&dout).map(|(o, w)| o * *w as f64).sum::<f64>()
            };
            let h = 1e-2;
            let numeric = (objective(h as f32) - objective(-h as f32)) / (2.0 * h);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>();
            let mut out = vec![0.0; q.len()];
            let mut lse = vec![0.0; q_len * 2];
            attention_forward_window(&mut out, &mut lse, &q, &k, &v, d, 0.35, Some(window));
            let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
            let x = BackwardInputs { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse, d, scale: 0.35, window: Some(window) };
            attention_backward_with(Products::Bf16, (&mut dq, &mut dk, &mut dv), x);
            let analytic = dot(&dq, &e) + dot(&dk, &f) + dot(&dv, &g);
            assert!((analytic - numeric).abs() < 1e-3 * (1.0 + numeric.abs()), "{q_len}/{kv_len} window {window}: {analytic} vs {numeric}");
        }
    }

    /// SmolLM2-135M's shapes (256 tokens, 9 heads over 3, head_dim 64):
    /// the bf16 products give what the f32 path gives, within 5e-2 of each
    /// output's largest magnitude (the f32 path is checked against f64
    /// above; bf16 rounds each operand by up to 2^-9). Measured: out
    /// 5.4e-3, lse 1.6e-3, dq 3.4e-2 (its score gradient `p (dp - D)`
    /// cancels), dk and dv below 1e-2.
    #[test]
    fn bf16_products_match_f32_on_smollm2_shapes() {
        let d = AttnDims { q_len: 256, kv_len: 256, n_head: 9, n_kv_head: 3, head_dim: 64, causal: true };
        let wave = |n: usize, f: f32, a: f32| (0..n).map(|i| (i as f32 * f).sin() * a).collect::<Vec<f32>>();
        let (q, k, v, dout) = (wave(256 * 576, 0.61, 2.0), wave(256 * 192, 0.23, 2.0), wave(256 * 192, 0.11, 1.0), wave(256 * 576, 0.37, 1.0));
        let run = |products: Products| {
            let (mut out, mut lse) = (vec![0.0; q.len()], vec![0.0; 256 * 9]);
            attention_forward_with(products, &mut out, &mut lse, &q, &k, &v, d, 0.125);
            let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
            attention_backward_with(products, (&mut dq, &mut dk, &mut dv), BackwardInputs { dout: &dout, q: &q, k: &k, v: &v, out: &out, lse: &lse, d, scale: 0.125, window: None });
            [out, lse, dq, dk, dv]
        };
        let (want, got) = (run(Products::F32), run(Products::Bf16));
        for (name, (w, g)) in ["out", "lse", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
            let top = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = w.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("{name}: worst difference {:.2e} of the largest magnitude", worst / top);
            assert!(worst <= 5e-2 * top, "{name}: {worst} against largest {top}");
        }
    }
}

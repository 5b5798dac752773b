//! Attention with its products on bf16 tiles (AMX, or `VDPBF16PS` without
//! it), operands rounded to bf16 and sums in f32 (`bf16_matmul::operands`),
//! for training calls (`q_len == kv_len`). Same blocks, same softmax and
//! score-gradient code in f32, same reduction of the partials as the f32
//! path in `attention.rs`; only the products differ.
//!
//! Operands every block reads are laid out once per call and per head:
//! in the forward the queries (A) and the keys and values (B); in the
//! backward the queries and `dout` both ways (`s^T = k q^T` and `dp^T =
//! v dout^T` take them transposed, `dk = ds^T q` and `dv = p^T dout` as
//! they are) and the keys and values as A. The backward's score blocks
//! are computed transposed (`[keys, queries]`), so that `p^T` and `ds^T`,
//! the A operands of `dv` and `dk`, are plain rows; only `dq = ds k` reads
//! `ds` transposed (16x16 register transposes).
use super::{key_blocks, lane_dot, query_blocks, softmax_prefix, AttnDims, BackwardInputs, KeyBlockGrads, SharedMut};
use crate::ops::activation::{exp, simd_fn};
use crate::ops::bf16_matmul::operands::{product, ARows, BPanels, Lines};
use rayon::prelude::*;

/// 32-wide chunks of the reduction in `len`.
fn chunks(len: usize) -> usize {
    len.div_ceil(32)
}

/// The forward (see `attention_forward`): per (head, block of queries)
/// `s = scale q k^T` over the keys the block sees, row softmax, `p v`.
pub(super) fn forward(out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f32) {
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    let group = n_head / n_kv_head;
    let (qs, ks) = (n_head * hd, n_kv_head * hd);
    let q_a: Vec<ARows> = (0..n_head).into_par_iter().map(|h| ARows::from_rows(&q[h * hd..], (q_len, hd), qs)).collect();
    // per kv head: k^T and v as B
    let kv_b: Vec<(BPanels, BPanels)> = (0..n_kv_head)
        .into_par_iter()
        .map(|g| (BPanels::from_transposed(&k[g * hd..], (kv_len, hd), ks), BPanels::from_rows(&v[g * hd..], (kv_len, hd), ks)))
        .collect();
    let out_ptr = SharedMut(out.as_mut_ptr());
    query_blocks(lse, d, |h, r0, rows| {
        let out_ptr = out_ptr;
        let keys = d.visible(r0 + rows - 1);
        let width = keys.next_multiple_of(32);
        let (k_b, v_b) = &kv_b[h / group];
        // p: [rows, width], zero past the keys
        let mut p_lines = Lines::zeros(rows * width);
        let p = p_lines.as_mut_slice();
        // SAFETY: `p` is rows x width; the output rows r0 .. r0 + rows,
        // columns h * hd .. + hd of `out` ([q_len, qs]) are this task's.
        unsafe { product((&q_a[h], r0, 0), (k_b, 0, 0), (rows, keys, chunks(hd)), p.as_mut_ptr(), width, scale) };
        let lse_b: Vec<f32> = p.chunks_exact_mut(width).enumerate().map(|(t, row)| softmax_prefix(row, d.visible(r0 + t))).collect();
        let p_a = ARows::from_rows(p, (rows, width), width);
        unsafe { product((&p_a, 0, 0), (v_b, 0, 0), (rows, hd, chunks(width)), out_ptr.0.add(r0 * qs + h * hd), qs, 1.0) };
        lse_b
    });
}

/// What every key block of one query head reads.
struct HeadOperands {
    /// `q^T`, `dout^T` as B (for `s^T`, `dp^T`).
    q_t: BPanels,
    dout_t: BPanels,
    /// `q`, `dout` as B (for `dk`, `dv`).
    q_n: BPanels,
    dout_n: BPanels,
    /// `[q_len]`: this head's log-sum-exp and `D = rowsum(dout * out)`.
    lse: Vec<f32>,
    big_d: Vec<f32>,
}

/// What every key block of one kv head reads: `k`, `v` as A (`s^T`,
/// `dp^T`) and `k` as B (`dq`).
struct KvOperands {
    k_a: ARows,
    v_a: ARows,
    k_n: BPanels,
}

/// The backward (see `attention_backward`), per (query head, block of
/// keys) over the queries that see the block.
pub(super) fn backward((dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]), x: BackwardInputs<'_>) {
    // Never called with a window (`attention_backward_with` keeps those on f32).
    let BackwardInputs { dout, q, k, v, out, lse, d, scale, .. } = x;
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    let group = n_head / n_kv_head;
    let (qs, ks) = (n_head * hd, n_kv_head * hd);
    let heads: Vec<HeadOperands> = (0..n_head)
        .into_par_iter()
        .map(|h| HeadOperands {
            q_t: BPanels::from_transposed(&q[h * hd..], (q_len, hd), qs),
            dout_t: BPanels::from_transposed(&dout[h * hd..], (q_len, hd), qs),
            q_n: BPanels::from_rows(&q[h * hd..], (q_len, hd), qs),
            dout_n: BPanels::from_rows(&dout[h * hd..], (q_len, hd), qs),
            lse: (0..q_len).map(|t| lse[t * n_head + h]).collect(),
            big_d: (0..q_len).map(|t| lane_dot(&dout[t * qs + h * hd..][..hd], &out[t * qs + h * hd..][..hd])).collect(),
        })
        .collect();
    let kvs: Vec<KvOperands> = (0..n_kv_head)
        .into_par_iter()
        .map(|g| KvOperands {
            k_a: ARows::from_rows(&k[g * hd..], (kv_len, hd), ks),
            v_a: ARows::from_rows(&v[g * hd..], (kv_len, hd), ks),
            k_n: BPanels::from_rows(&k[g * hd..], (kv_len, hd), ks),
        })
        .collect();
    key_blocks((dq, dk, dv), d, |h, c0, cols| {
        let (ho, kvo) = (&heads[h], &kvs[h / group]);
        // `first` is c0 (causal) or 0: a whole number of chunks
        let first = d.first_seeing(c0);
        let rows = q_len - first;
        let width = rows.next_multiple_of(32);
        // s^T, dp^T: [cols, width], zero past the queries
        let (mut st_lines, mut dpt_lines) = (Lines::zeros(cols * width), Lines::zeros(cols * width));
        let (st, dpt) = (st_lines.as_mut_slice(), dpt_lines.as_mut_slice());
        // SAFETY: both are cols x width.
        unsafe {
            product((&kvo.k_a, c0, 0), (&ho.q_t, first, 0), (cols, rows, chunks(hd)), st.as_mut_ptr(), width, scale);
            product((&kvo.v_a, c0, 0), (&ho.dout_t, first, 0), (cols, rows, chunks(hd)), dpt.as_mut_ptr(), width, 1.0);
        }
        for (i, (s_i, dp_i)) in st.chunks_exact_mut(width).zip(dpt.chunks_exact_mut(width)).enumerate() {
            let hidden = d.first_seeing(c0 + i) - first;
            let (l, big_d) = (&ho.lse[first..], &ho.big_d[first..]);
            probs_and_score_grads_t(&mut s_i[..rows], &mut dp_i[..rows], hidden, l, big_d, scale);
        }
        let (pt_a, dst_a) = (ARows::from_rows(st, (cols, rows), width), ARows::from_rows(dpt, (cols, rows), width));
        let ds_a = ARows::from_transposed(dpt, (rows, cols), width);
        let (mut dq_b, mut dk_b, mut dv_b) = (vec![0.0f32; rows * hd], vec![0.0f32; cols * hd], vec![0.0f32; cols * hd]);
        // SAFETY: the outputs are rows x hd and cols x hd.
        unsafe {
            product((&pt_a, 0, 0), (&ho.dout_n, 0, first / 32), (cols, hd, chunks(width)), dv_b.as_mut_ptr(), hd, 1.0);
            product((&dst_a, 0, 0), (&ho.q_n, 0, first / 32), (cols, hd, chunks(width)), dk_b.as_mut_ptr(), hd, 1.0);
            product((&ds_a, 0, 0), (&kvo.k_n, 0, c0 / 32), (rows, hd, chunks(cols)), dq_b.as_mut_ptr(), hd, 1.0);
        }
        KeyBlockGrads { dq: dq_b, dk: dk_b, dv: dv_b, first, end: q_len }
    });
}

simd_fn! {
    /// One key's row of the transposed score block, in place, over the
    /// queries `t`: `p = exp(s - lse[t])` (zero for the first `hidden`
    /// queries, which do not see the key) and `ds = p (dp - D[t]) scale`.
    fn probs_and_score_grads_t(s: &mut [f32], dp: &mut [f32], hidden: usize, lse: &[f32], big_d: &[f32], scale: f32) {
        for (t, ((p, g), (l, dd))) in s.iter_mut().zip(dp.iter_mut()).zip(lse.iter().zip(big_d)).enumerate() {
            let e = exp(*p - *l);
            *p = if t >= hidden { e } else { 0.0 };
            *g = *p * (*g - *dd) * scale;
        }
    }
}

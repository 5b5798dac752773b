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
use crate::ops::matmul::{matmul, matmul_at, matmul_bt};
use rayon::prelude::*;

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
}

/// `out[q_len, n_head * head_dim] = softmax(scale * q k^T + mask) v`, with
/// `lse[q_len, n_head]` saved.
///
/// `q`: `[q_len, n_head, head_dim]`; `k`, `v`: `[kv_len, n_kv_head, head_dim]`.
/// Per head two GEMMs (`s = scale q_h k_h^T`, `out_h = p v_h`) around a row
/// softmax; threads split over heads, so every sum runs in a fixed order.
pub fn attention_forward(out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f32) {
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    assert!(n_kv_head > 0 && n_head % n_kv_head == 0, "attention: {n_head} heads over {n_kv_head} kv heads");
    assert!(q_len <= kv_len, "attention: {q_len} queries over {kv_len} keys");
    assert_eq!(q.len(), q_len * n_head * hd, "attention q length");
    assert_eq!(k.len(), kv_len * n_kv_head * hd, "attention k length");
    assert_eq!(v.len(), k.len(), "attention v length");
    assert_eq!(out.len(), q.len(), "attention out length");
    assert_eq!(lse.len(), q_len * n_head, "attention lse length");
    let group = n_head / n_kv_head;
    // Per head: (out_h: [q_len, hd], lse_h: [q_len]).
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..n_head)
        .into_par_iter()
        .map(|h| {
            let kvh = h / group;
            let (q_h, k_h, v_h) = (head_rows(q, q_len, n_head, hd, h), head_rows(k, kv_len, n_kv_head, hd, kvh), head_rows(v, kv_len, n_kv_head, hd, kvh));
            let mut p = vec![0.0f32; q_len * kv_len];
            matmul_bt(&mut p, &q_h, &k_h, (q_len, hd, kv_len), scale, false);
            let lse_h: Vec<f32> = p.chunks_exact_mut(kv_len).enumerate().map(|(t, row)| softmax_prefix(row, d.visible(t))).collect();
            let mut out_h = vec![0.0f32; q_len * hd];
            matmul(&mut out_h, &p, &v_h, (q_len, kv_len, hd), 1.0, false);
            (out_h, lse_h)
        })
        .collect();
    for (h, (out_h, lse_h)) in per_head.iter().enumerate() {
        for t in 0..q_len {
            out[(t * n_head + h) * hd..][..hd].copy_from_slice(&out_h[t * hd..][..hd]);
            lse[t * n_head + h] = lse_h[t];
        }
    }
}

/// Softmax of `row[..seen]` in place, zero past it; returns the row's
/// log-sum-exp.
fn softmax_prefix(row: &mut [f32], seen: usize) -> f32 {
    let (live, masked) = row.split_at_mut(seen);
    masked.fill(0.0);
    let max = live.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0.0f32;
    for s in live.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    live.iter_mut().for_each(|s| *s *= inv);
    max + sum.ln()
}

/// Rows `[len, hd]` of head `h` out of `x: [len, heads, hd]`.
fn head_rows(x: &[f32], len: usize, heads: usize, hd: usize, h: usize) -> Vec<f32> {
    (0..len).flat_map(|t| x[(t * heads + h) * hd..][..hd].iter().copied()).collect()
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Backward of [`attention_forward`]: the probabilities are rebuilt from
/// `lse`, never stored. Per head, with `p = softmax(s)`, `dp = dout v^T`,
/// `D = rowsum(dout * out)`: `ds = p (dp - D)`, `dq = scale ds k`,
/// `dk = scale ds^T q`, `dv = p^T dout`, each product one GEMM over the
/// head's `[q_len, kv_len]` score block.
///
/// `dq`, `q`, `out`, `dout`: `[q_len, n_head, head_dim]`; `dk`, `dv`, `k`, `v`:
/// `[kv_len, n_kv_head, head_dim]` (overwritten); `lse`: `[q_len, n_head]`.
/// Threads split over key/value heads, so every sum runs in a fixed order.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    d: AttnDims,
    scale: f32,
) {
    let AttnDims { q_len, kv_len, n_head, n_kv_head, head_dim: hd, .. } = d;
    assert!(dq.len() == q.len() && dout.len() == q.len() && out.len() == q.len(), "attention_backward q lengths");
    assert!(dk.len() == k.len() && dv.len() == v.len() && k.len() == kv_len * n_kv_head * hd, "attention_backward kv lengths");
    let group = n_head / n_kv_head;
    let head_rows = |x: &[f32], len: usize, heads: usize, h: usize| head_rows(x, len, heads, hd, h);
    let per_kv: Vec<(Vec<Vec<f32>>, Vec<f32>, Vec<f32>)> = (0..n_kv_head)
        .into_par_iter()
        .map(|kvh| {
            let (k_h, v_h) = (head_rows(k, kv_len, n_kv_head, kvh), head_rows(v, kv_len, n_kv_head, kvh));
            let mut dk_h = vec![0.0f32; kv_len * hd];
            let mut dv_h = vec![0.0f32; kv_len * hd];
            let mut p = vec![0.0f32; q_len * kv_len];
            let mut ds = vec![0.0f32; q_len * kv_len];
            let mut dqs = Vec::with_capacity(group);
            for h in kvh * group..(kvh + 1) * group {
                let (q_h, do_h, o_h) = (head_rows(q, q_len, n_head, h), head_rows(dout, q_len, n_head, h), head_rows(out, q_len, n_head, h));
                matmul_bt(&mut p, &q_h, &k_h, (q_len, hd, kv_len), scale, false);
                matmul_bt(&mut ds, &do_h, &v_h, (q_len, hd, kv_len), 1.0, false);
                for t in 0..q_len {
                    let (l, seen) = (lse[t * n_head + h], d.visible(t));
                    let big_d = dot(&do_h[t * hd..][..hd], &o_h[t * hd..][..hd]);
                    let (p_t, ds_t) = (&mut p[t * kv_len..][..kv_len], &mut ds[t * kv_len..][..kv_len]);
                    for j in 0..kv_len {
                        p_t[j] = if j < seen { (p_t[j] - l).exp() } else { 0.0 };
                        ds_t[j] = p_t[j] * (ds_t[j] - big_d) * scale;
                    }
                }
                let mut dq_h = vec![0.0f32; q_len * hd];
                matmul(&mut dq_h, &ds, &k_h, (q_len, kv_len, hd), 1.0, false);
                matmul_at(&mut dk_h, &ds, &q_h, (kv_len, q_len, hd), 1.0, true);
                matmul_at(&mut dv_h, &p, &do_h, (kv_len, q_len, hd), 1.0, true);
                dqs.push(dq_h);
            }
            (dqs, dk_h, dv_h)
        })
        .collect();
    for (kvh, (dqs, dk_h, dv_h)) in per_kv.iter().enumerate() {
        for (g, dq_h) in dqs.iter().enumerate() {
            for t in 0..q_len {
                dq[(t * n_head + kvh * group + g) * hd..][..hd].copy_from_slice(&dq_h[t * hd..][..hd]);
            }
        }
        for j in 0..kv_len {
            let at = (j * n_kv_head + kvh) * hd;
            dk[at..at + hd].copy_from_slice(&dk_h[j * hd..][..hd]);
            dv[at..at + hd].copy_from_slice(&dv_h[j * hd..][..hd]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f64 reference with explicit repeat_kv and a -inf mask.
    fn reference(q: &[f32], k: &[f32], v: &[f32], d: AttnDims, scale: f64) -> Vec<f64> {
        let mut out = vec![0f64; d.q_len * d.n_head * d.head_dim];
        let hd = d.head_dim;
        for t in 0..d.q_len {
            for h in 0..d.n_head {
                let kvh = h * d.n_kv_head / d.n_head;
                let pos = d.kv_len - d.q_len + t;
                let s: Vec<f64> = (0..d.kv_len)
                    .map(|j| {
                        if d.causal && j > pos {
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

    #[test]
    fn gqa_causal_cached_and_bidirectional_match_f64() {
        for (q_len, kv_len, causal) in [(6, 6, true), (2, 7, true), (5, 5, false)] {
            let d = AttnDims { q_len, kv_len, n_head: 4, n_kv_head: 2, head_dim: 8, causal };
            let q: Vec<f32> = (0..q_len * 32).map(|i| (i as f32 * 0.61).sin()).collect();
            let k: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.23).cos()).collect();
            let v: Vec<f32> = (0..kv_len * 16).map(|i| (i as f32 * 0.11).sin() * 2.0).collect();
            let mut out = vec![0.0; q.len()];
            let mut lse = vec![0.0; q_len * 4];
            attention_forward(&mut out, &mut lse, &q, &k, &v, d, 0.35);
            let want = reference(&q, &k, &v, d, 0.35);
            for (g, w) in out.iter().zip(&want) {
                assert!((*g as f64 - w).abs() < 1e-5, "{q_len}/{kv_len}/{causal}: {g} vs {w}");
            }
        }
    }

    /// Longer causal sequences (with and without a cache) and a
    /// bidirectional call: the forward against f64, and the
    /// backward's directional derivatives `<dq, e> + <dk, f> + <dv, g>`
    /// against central differences of the f64 forward's `<out, dout>`.
    #[test]
    fn long_sequences_match_f64_forward_and_directional_derivatives() {
        for (q_len, kv_len, causal) in [(150, 150, true), (70, 100, true), (80, 80, false)] {
            let d = AttnDims { q_len, kv_len, n_head: 2, n_kv_head: 1, head_dim: 4, causal };
            let wave = |n: usize, k: f32, a: f32| (0..n).map(|i| (i as f32 * k).sin() * a).collect::<Vec<f32>>();
            let (q, k, v) = (wave(q_len * 8, 0.61, 1.0), wave(kv_len * 4, 0.23, 1.0), wave(kv_len * 4, 0.11, 2.0));
            let mut out = vec![0.0; q.len()];
            let mut lse = vec![0.0; q_len * 2];
            attention_forward(&mut out, &mut lse, &q, &k, &v, d, 0.35);
            for (g, w) in out.iter().zip(&reference(&q, &k, &v, d, 0.35)) {
                assert!((*g as f64 - w).abs() < 1e-5, "{q_len}/{kv_len}/{causal}: {g} vs {w}");
            }
            if q_len != kv_len {
                continue; // the backward serves training (no cache)
            }
            let dout = wave(q.len(), 0.37, 1.0);
            let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
            attention_backward(&mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &out, &lse, d, 0.35);
            let (e, f, g) = (wave(q.len(), 0.77, 1.0), wave(k.len(), 0.19, 1.0), wave(v.len(), 0.53, 1.0));
            let objective = |t: f32| {
                let shift = |x: &[f32], dir: &[f32]| x.iter().zip(dir).map(|(a, b)| a + t * b).collect::<Vec<f32>>();
                let o = reference(&shift(&q, &e), &shift(&k, &f), &shift(&v, &g), d, 0.35);
                o.iter().zip(&dout).map(|(o, w)| o * *w as f64).sum::<f64>()
            };
            let h = 1e-2;
            let numeric = (objective(h as f32) - objective(-h as f32)) / (2.0 * h);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>();
            let analytic = dot(&dq, &e) + dot(&dk, &f) + dot(&dv, &g);
            assert!((analytic - numeric).abs() < 1e-3 * (1.0 + numeric.abs()), "{causal}: {analytic} vs {numeric}");
        }
    }
}

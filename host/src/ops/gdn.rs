//! Gated DeltaNet pieces (Qwen3.5's linear-attention layers), matching
//! transformers' `Qwen3_5GatedDeltaNet`:
//!
//! ```text
//! qkv  = conv1d_causal(in_proj_qkv(x)) -> silu          [T, 2*key_dim + value_dim]
//! q, k = l2norm(q), l2norm(k)                            [T, n_k_head, k_dim]
//! g    = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)  [T, n_v_head]
//! beta = sigmoid(in_proj_b(x))                           [T, n_v_head]
//! o    = delta_rule(q, k, v, g, beta)                    [T, n_v_head, v_dim]
//! y    = out_proj(gated_rmsnorm(o, silu(in_proj_z(x))))
//! ```
//!
//! The recurrence runs token by token in f32 with an f32 state
//! `[n_v_head, k_dim, v_dim]`; transformers' chunked (64-token) form is the
//! same sum reordered. The state is in/out, so a sequence may be processed
//! in pieces (generation one token at a time; training checkpoints it every
//! few tokens and recomputes inside a piece).
use crate::ops::activation::{sigmoid, silu, softplus};
use crate::ops::rmsnorm::rstd_of;
use rayon::prelude::*;

/// Depthwise causal convolution over time, before the activation.
///
/// `out[t, c] = sum_j weight[c, j] * x[t + j - (K - 1), c]`, where `x` is
/// `history` (`[K - 1, C]`, the inputs just before this piece, oldest first;
/// zeros at sequence start) followed by `inp` (`[T, C]`). `weight`: `[C, K]`
/// (the checkpoint's `conv1d.weight` `[C, 1, K]`). Backward needs `inp` and
/// `history`.
pub fn conv1d_causal_forward(out: &mut [f32], inp: &[f32], history: &[f32], weight: &[f32], channels: usize) {
    let kernel = weight.len() / channels;
    assert_eq!(weight.len(), channels * kernel, "conv1d weight length");
    assert_eq!(history.len(), (kernel - 1) * channels, "conv1d history length");
    assert_eq!(out.len(), inp.len(), "conv1d output length");
    let tokens = inp.len() / channels;
    for t in 0..tokens {
        let o = &mut out[t * channels..(t + 1) * channels];
        o.fill(0.0);
        for j in 0..kernel {
            // source row index in history ++ inp
            let src = t + j;
            let row = if src < kernel - 1 {
                &history[src * channels..(src + 1) * channels]
            } else {
                let r = src - (kernel - 1);
                &inp[r * channels..(r + 1) * channels]
            };
            for c in 0..channels {
                o[c] += weight[c * kernel + j] * row[c];
            }
        }
    }
}

/// The `K - 1` input rows that precede the next piece: the tail of
/// `history ++ inp`. `history`, result: `[K - 1, C]`.
pub fn conv1d_next_history(history: &[f32], inp: &[f32], channels: usize) -> Vec<f32> {
    let keep = history.len();
    let mut joined = Vec::with_capacity(history.len() + inp.len());
    joined.extend_from_slice(history);
    joined.extend_from_slice(inp);
    debug_assert_eq!(joined.len() % channels, 0);
    joined[joined.len() - keep..].to_vec()
}

/// `out[rows, dim] = inp / sqrt(sum(inp^2) + eps)`, `rnorm[rows]` saved
/// (the FLA/transformers `l2norm`, eps 1e-6).
pub fn l2norm_forward(out: &mut [f32], rnorm: &mut [f32], inp: &[f32], dim: usize, eps: f32) {
    assert_eq!(out.len(), inp.len(), "l2norm output length");
    assert_eq!(rnorm.len() * dim, inp.len(), "l2norm rnorm length");
    for ((o, x), r) in out.chunks_exact_mut(dim).zip(inp.chunks_exact(dim)).zip(rnorm.iter_mut()) {
        let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        *r = (1.0 / (ss + eps as f64).sqrt()) as f32;
        for (o, &v) in o.iter_mut().zip(x) {
            *o = v * *r;
        }
    }
}

/// Per-token, per-value-head decay (log space) and write strength:
/// `g = -exp(A_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`.
///
/// `a`, `b`, `g`, `beta`: `[T, n_v_head]`; `a_log`, `dt_bias`: `[n_v_head]`.
/// Backward needs `a` and `b`.
pub fn gdn_gates_forward(g: &mut [f32], beta: &mut [f32], a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32]) {
    let heads = a_log.len();
    assert_eq!(dt_bias.len(), heads, "dt_bias length");
    assert!(g.len() == a.len() && beta.len() == b.len() && a.len() == b.len(), "gdn gate lengths");
    for (g_t, a_t) in g.chunks_exact_mut(heads).zip(a.chunks_exact(heads)) {
        for h in 0..heads {
            g_t[h] = -a_log[h].exp() * softplus(a_t[h] + dt_bias[h]);
        }
    }
    for (bt, &bv) in beta.iter_mut().zip(b) {
        *bt = sigmoid(bv);
    }
}

/// Head counts and widths of the delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaDims {
    /// Query/key heads; divides `n_v_head`.
    pub n_k_head: usize,
    /// Value heads (= state heads). Value head `h` reads key head
    /// `h / (n_v_head / n_k_head)` (transformers' `repeat_interleave`).
    pub n_v_head: usize,
    /// Key width per head.
    pub k_dim: usize,
    /// Value width per head.
    pub v_dim: usize,
}

/// The gated delta rule, token by token, for every value head `h`:
///
/// ```text
/// S     = S * exp(g[t,h])
/// delta = beta[t,h] * (v[t,h] - S^T k[t])
/// S     = S + k[t] delta^T
/// o[t,h] = S^T q[t] / sqrt(k_dim)
/// ```
///
/// `q`, `k` (already L2-normalised): `[T, n_k_head, k_dim]`; `v`:
/// `[T, n_v_head, v_dim]`; `g`, `beta`: `[T, n_v_head]`; `out`:
/// `[T, n_v_head, v_dim]`; `state` (in/out, f32): `[n_v_head, k_dim, v_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_forward(
    out: &mut [f32],
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    d: DeltaDims,
) {
    let DeltaDims { n_k_head, n_v_head, k_dim, v_dim } = d;
    assert!(n_k_head > 0 && n_v_head % n_k_head == 0, "delta rule: {n_v_head} value heads over {n_k_head} key heads");
    let tokens = g.len() / n_v_head;
    assert_eq!(g.len(), tokens * n_v_head, "delta rule g length");
    assert_eq!(beta.len(), g.len(), "delta rule beta length");
    assert_eq!(q.len(), tokens * n_k_head * k_dim, "delta rule q length");
    assert_eq!(k.len(), q.len(), "delta rule k length");
    assert_eq!(v.len(), tokens * n_v_head * v_dim, "delta rule v length");
    assert_eq!(out.len(), v.len(), "delta rule out length");
    assert_eq!(state.len(), n_v_head * k_dim * v_dim, "delta rule state length");
    let group = n_v_head / n_k_head;
    let scale = 1.0 / (k_dim as f32).sqrt();
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(k_dim * v_dim)
        .enumerate()
        .map(|(h, s)| {
            let kh = h / group;
            let mut o = vec![0.0f32; tokens * v_dim];
            let mut delta = vec![0.0f32; v_dim];
            for t in 0..tokens {
                let q_t = &q[(t * n_k_head + kh) * k_dim..][..k_dim];
                let k_t = &k[(t * n_k_head + kh) * k_dim..][..k_dim];
                let v_t = &v[(t * n_v_head + h) * v_dim..][..v_dim];
                let decay = g[t * n_v_head + h].exp();
                let b = beta[t * n_v_head + h];
                s.iter_mut().for_each(|x| *x *= decay);
                // delta = b * (v - S^T k)
                delta.copy_from_slice(v_t);
                for (i, &ki) in k_t.iter().enumerate() {
                    for (dj, &sij) in delta.iter_mut().zip(&s[i * v_dim..(i + 1) * v_dim]) {
                        *dj -= sij * ki;
                    }
                }
                delta.iter_mut().for_each(|x| *x *= b);
                // S += k delta^T; o = S^T q * scale
                let o_t = &mut o[t * v_dim..(t + 1) * v_dim];
                for i in 0..k_dim {
                    let row = &mut s[i * v_dim..(i + 1) * v_dim];
                    let qi = q_t[i] * scale;
                    for ((sij, &dj), oj) in row.iter_mut().zip(&delta).zip(o_t.iter_mut()) {
                        *sij += k_t[i] * dj;
                        *oj += *sij * qi;
                    }
                }
            }
            o
        })
        .collect();
    for (h, o) in per_head.iter().enumerate() {
        for t in 0..tokens {
            out[(t * n_v_head + h) * v_dim..][..v_dim].copy_from_slice(&o[t * v_dim..(t + 1) * v_dim]);
        }
    }
}

/// Gated RMSNorm: `out = weight * (inp * rstd) * silu(gate)`, norm before
/// gate, plain `w` convention; `rstd[rows]` saved.
///
/// `inp`, `gate`, `out`: `[rows, dim]`; `weight`: `[dim]`.
pub fn gated_rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], inp: &[f32], gate: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    assert!(out.len() == inp.len() && gate.len() == inp.len(), "gated rmsnorm lengths");
    assert_eq!(rstd.len() * dim, inp.len(), "gated rmsnorm rstd length");
    for (((o, x), z), r) in
        out.chunks_exact_mut(dim).zip(inp.chunks_exact(dim)).zip(gate.chunks_exact(dim)).zip(rstd.iter_mut())
    {
        *r = rstd_of(x, eps);
        for c in 0..dim {
            o[c] = weight[c] * (x[c] * *r) * silu(z[c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize, f: f32, amp: f32) -> Vec<f32> {
        (0..n).map(|i| amp * (i as f32 * f + 0.3).sin()).collect()
    }

    #[test]
    fn conv_in_pieces_equals_whole_and_matches_definition() {
        let (c, kernel, t) = (3, 4, 9);
        let w = wave(c * kernel, 0.7, 1.0);
        let x = wave(t * c, 0.31, 2.0);
        let zeros = vec![0.0; (kernel - 1) * c];
        let mut whole = vec![0.0; t * c];
        conv1d_causal_forward(&mut whole, &x, &zeros, &w, c);
        for tt in 0..t {
            for ch in 0..c {
                let want: f64 = (0..kernel)
                    .filter(|&j| tt + j >= kernel - 1)
                    .map(|j| w[ch * kernel + j] as f64 * x[(tt + j - (kernel - 1)) * c + ch] as f64)
                    .sum();
                assert!((whole[tt * c + ch] as f64 - want).abs() < 1e-5);
            }
        }
        // two pieces (5 + 4 tokens) through the carried history
        let mut first = vec![0.0; 5 * c];
        conv1d_causal_forward(&mut first, &x[..5 * c], &zeros, &w, c);
        let hist = conv1d_next_history(&zeros, &x[..5 * c], c);
        let mut second = vec![0.0; 4 * c];
        conv1d_causal_forward(&mut second, &x[5 * c..], &hist, &w, c);
        assert_eq!(&whole[..5 * c], &first[..]);
        assert_eq!(&whole[5 * c..], &second[..]);
    }

    /// f64 recurrence with explicit (I - beta k k^T) form, the textbook
    /// statement of the delta rule.
    #[test]
    fn delta_rule_matches_f64_textbook_form_and_composes_in_pieces() {
        let d = DeltaDims { n_k_head: 1, n_v_head: 2, k_dim: 3, v_dim: 2 };
        let t = 7;
        let mut q = wave(t * 3, 0.9, 1.0);
        let mut k = wave(t * 3, 0.4, 1.0);
        let mut rn = vec![0.0; t];
        let (q0, k0) = (q.clone(), k.clone());
        l2norm_forward(&mut q, &mut rn, &q0, 3, 1e-6);
        l2norm_forward(&mut k, &mut rn, &k0, 3, 1e-6);
        let v = wave(t * 4, 0.57, 1.5);
        let g: Vec<f32> = wave(t * 2, 0.8, 0.5).iter().map(|x| x - 0.6).collect();
        let beta: Vec<f32> = wave(t * 2, 1.3, 0.4).iter().map(|x| x + 0.5).collect();
        let mut state = vec![0.0; 2 * 3 * 2];
        let mut out = vec![0.0; t * 4];
        delta_rule_forward(&mut out, &mut state, &q, &k, &v, &g, &beta, d);

        for h in 0..2 {
            let mut s = [[0f64; 2]; 3];
            for tt in 0..t {
                let kt: Vec<f64> = (0..3).map(|i| k[tt * 3 + i] as f64).collect();
                let qt: Vec<f64> = (0..3).map(|i| q[tt * 3 + i] as f64).collect();
                let vt: Vec<f64> = (0..2).map(|j| v[(tt * 2 + h) * 2 + j] as f64).collect();
                let (a, b) = ((g[tt * 2 + h] as f64).exp(), beta[tt * 2 + h] as f64);
                // S' = a (I - b k k^T) S + b k v^T
                let mut ns = [[0f64; 2]; 3];
                for i in 0..3 {
                    for j in 0..2 {
                        let proj: f64 = (0..3).map(|p| kt[i] * kt[p] * s[p][j]).sum();
                        ns[i][j] = a * (s[i][j] - b * proj) + b * kt[i] * vt[j];
                    }
                }
                s = ns;
                for j in 0..2 {
                    let want: f64 = (0..3).map(|i| s[i][j] * qt[i]).sum::<f64>() / 3f64.sqrt();
                    assert!((out[(tt * 2 + h) * 2 + j] as f64 - want).abs() < 1e-5, "t{tt} h{h} j{j}");
                }
            }
        }

        // same result in two pieces carrying the state
        let mut s2 = vec![0.0; 12];
        let mut o1 = vec![0.0; 3 * 4];
        let mut o2 = vec![0.0; 4 * 4];
        delta_rule_forward(&mut o1, &mut s2, &q[..9], &k[..9], &v[..12], &g[..6], &beta[..6], d);
        delta_rule_forward(&mut o2, &mut s2, &q[9..], &k[9..], &v[12..], &g[6..], &beta[6..], d);
        assert_eq!(&out[..12], &o1[..]);
        assert_eq!(&out[12..], &o2[..]);
        assert_eq!(state, s2);
    }

    #[test]
    fn gates_and_gated_norm_match_definitions() {
        let (a, b) = (vec![-1.0f32, 30.0], vec![0.5f32, -2.0]);
        let (a_log, dt) = (vec![0.3f32, -0.2], vec![0.1f32, 0.4]);
        let (mut g, mut beta) = (vec![0.0; 2], vec![0.0; 2]);
        gdn_gates_forward(&mut g, &mut beta, &a, &b, &a_log, &dt);
        assert!((g[0] as f64 - (-(0.3f64).exp() * (1.0 + (-0.9f64).exp()).ln())).abs() < 1e-6);
        assert!((g[1] as f64 - (-(-0.2f64).exp() * 30.4)).abs() < 1e-4);
        assert!((beta[1] as f64 - 1.0 / (1.0 + 2f64.exp())).abs() < 1e-7);

        let x = [1.0f32, -2.0, 0.5];
        let z = [0.3f32, -1.0, 2.0];
        let w = [1.1f32, 0.9, -0.5];
        let (mut out, mut r) = ([0.0; 3], [0.0]);
        gated_rmsnorm_forward(&mut out, &mut r, &x, &z, &w, 1e-6);
        let ms = (1.0 + 4.0 + 0.25) / 3.0f64;
        for c in 0..3 {
            let zc = z[c] as f64;
            let want = w[c] as f64 * x[c] as f64 / (ms + 1e-6).sqrt() * zc / (1.0 + (-zc).exp());
            assert!((out[c] as f64 - want).abs() < 1e-6);
        }
    }
}

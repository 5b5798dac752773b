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

/// Input gradient of [`conv1d_causal_forward`] at sequence start (zero
/// history, which receives no gradient); the weight is frozen.
///
/// `dinp[s, c] = sum_j weight[c, j] * dout[s - j + K - 1, c]` over the
/// outputs that exist. `dinp`, `dout`: `[T, C]`; `weight`: `[C, K]`.
pub fn conv1d_causal_backward(dinp: &mut [f32], dout: &[f32], weight: &[f32], channels: usize) {
    let kernel = weight.len() / channels;
    assert_eq!(dinp.len(), dout.len(), "conv1d backward lengths");
    let tokens = dout.len() / channels;
    for s in 0..tokens {
        let d = &mut dinp[s * channels..(s + 1) * channels];
        d.fill(0.0);
        for j in 0..kernel {
            let t = s + kernel - 1 - j;
            if t >= tokens {
                continue;
            }
            let row = &dout[t * channels..(t + 1) * channels];
            for c in 0..channels {
                d[c] += weight[c * kernel + j] * row[c];
            }
        }
    }
}

/// Input gradient of [`crate::ops::activation::silu_forward`]:
/// `dinp = dout * sigmoid(x) * (1 + x * (1 - sigmoid(x)))`. All `[n]`.
pub fn silu_backward(dinp: &mut [f32], dout: &[f32], inp: &[f32]) {
    assert!(dinp.len() == inp.len() && dout.len() == inp.len(), "silu backward lengths");
    for ((d, &g), &x) in dinp.iter_mut().zip(dout).zip(inp) {
        let s = sigmoid(x);
        *d = g * s * (1.0 + x * (1.0 - s));
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

/// Input gradient of [`l2norm_forward`]:
/// `dinp = r * dout - r^3 * inp * (inp . dout)` per row.
///
/// `dinp`, `dout`, `inp`: `[rows, dim]`; `rnorm`: `[rows]` from the forward.
pub fn l2norm_backward(dinp: &mut [f32], dout: &[f32], inp: &[f32], rnorm: &[f32], dim: usize) {
    assert!(dinp.len() == inp.len() && dout.len() == inp.len() && rnorm.len() * dim == inp.len(), "l2norm backward lengths");
    for (((di, dy), x), &r) in dinp.chunks_exact_mut(dim).zip(dout.chunks_exact(dim)).zip(inp.chunks_exact(dim)).zip(rnorm) {
        let dot: f64 = dy.iter().zip(x).map(|(&g, &x)| g as f64 * x as f64).sum();
        let c = (dot * (r as f64).powi(3)) as f32;
        for ((d, &g), &x) in di.iter_mut().zip(dy).zip(x) {
            *d = r * g - c * x;
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

/// Input gradients of [`gdn_gates_forward`] (`A_log`, `dt_bias` frozen):
/// `da = dg * -exp(A_log) * softplus'(a + dt_bias)` (softplus' = sigmoid,
/// 1 above PyTorch's threshold 20), `db = dbeta * beta * (1 - beta)`.
///
/// `da`, `db`, `dg`, `dbeta`, `a`, `b`: `[T, n_v_head]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_gates_backward(da: &mut [f32], db: &mut [f32], dg: &[f32], dbeta: &[f32], a: &[f32], b: &[f32], a_log: &[f32], dt_bias: &[f32]) {
    let heads = a_log.len();
    assert!(da.len() == a.len() && db.len() == b.len() && dg.len() == a.len() && dbeta.len() == b.len(), "gdn gate backward lengths");
    for ((da_t, dg_t), a_t) in da.chunks_exact_mut(heads).zip(dg.chunks_exact(heads)).zip(a.chunks_exact(heads)) {
        for h in 0..heads {
            let x = a_t[h] + dt_bias[h];
            let slope = if x > 20.0 { 1.0 } else { sigmoid(x) };
            da_t[h] = dg_t[h] * -a_log[h].exp() * slope;
        }
    }
    for ((d, &g), &bv) in db.iter_mut().zip(dbeta).zip(b) {
        let s = sigmoid(bv);
        *d = g * s * (1.0 - s);
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
                let (decay, b) = (g[t * n_v_head + h].exp(), beta[t * n_v_head + h]);
                delta_token(s, &mut delta, &mut o[t * v_dim..(t + 1) * v_dim], q_t, k_t, v_t, decay, b, scale);
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

/// One token of one head: `S *= decay; delta = b (v - S^T k); S += k delta^T;
/// o += S^T q * scale`. `s`: `[k_dim, v_dim]`; `o` must start at zero.
#[allow(clippy::too_many_arguments)]
#[inline]
fn delta_token(s: &mut [f32], delta: &mut [f32], o: &mut [f32], q: &[f32], k: &[f32], v: &[f32], decay: f32, b: f32, scale: f32) {
    let v_dim = v.len();
    s.iter_mut().for_each(|x| *x *= decay);
    delta.copy_from_slice(v);
    for (i, &ki) in k.iter().enumerate() {
        for (dj, &sij) in delta.iter_mut().zip(&s[i * v_dim..(i + 1) * v_dim]) {
            *dj -= sij * ki;
        }
    }
    delta.iter_mut().for_each(|x| *x *= b);
    for (i, &ki) in k.iter().enumerate() {
        let row = &mut s[i * v_dim..(i + 1) * v_dim];
        let qi = q[i] * scale;
        for ((sij, &dj), oj) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            *sij += ki * dj;
            *oj += *sij * qi;
        }
    }
}

/// The inputs of the delta rule over one sequence, shaped as at
/// [`delta_rule_forward`]: what the checkpointed forward reads and its
/// backward reads again.
#[derive(Clone, Copy)]
pub struct DeltaInputs<'a> {
    /// `[T, n_k_head, k_dim]`, L2-normalised.
    pub q: &'a [f32],
    /// `[T, n_k_head, k_dim]`, L2-normalised.
    pub k: &'a [f32],
    /// `[T, n_v_head, v_dim]`.
    pub v: &'a [f32],
    /// `[T, n_v_head]`.
    pub g: &'a [f32],
    /// `[T, n_v_head]`.
    pub beta: &'a [f32],
    /// Heads and widths.
    pub d: DeltaDims,
}

/// [`delta_rule_forward`] from a zero state over one whole sequence, saving
/// the f32 state before every `every`-token piece for the backward:
/// `checkpoints: [ceil(T / every), n_v_head, k_dim, v_dim]` (the first is
/// zeros). Same bits as one call, since pieces compose exactly.
pub fn delta_rule_forward_checkpointed(out: &mut [f32], checkpoints: &mut Vec<f32>, x: DeltaInputs<'_>, every: usize) {
    let DeltaInputs { q, k, v, g, beta, d } = x;
    let (nk, nv) = (d.n_k_head * d.k_dim, d.n_v_head * d.v_dim);
    let tokens = g.len() / d.n_v_head;
    let mut state = vec![0.0f32; d.n_v_head * d.k_dim * d.v_dim];
    checkpoints.clear();
    for t0 in (0..tokens).step_by(every) {
        let t1 = (t0 + every).min(tokens);
        checkpoints.extend_from_slice(&state);
        let (hv, hk) = (t0 * d.n_v_head..t1 * d.n_v_head, t0 * nk..t1 * nk);
        let vr = t0 * nv..t1 * nv;
        delta_rule_forward(&mut out[vr.clone()], &mut state, &q[hk.clone()], &k[hk], &v[vr], &g[hv.clone()], &beta[hv], d);
    }
}

/// Gradients of [`delta_rule_forward_checkpointed`]'s inputs. Inside each
/// piece the states are recomputed from its checkpoint, then the piece is
/// walked backwards token by token carrying `dS`. Per token, with
/// `a = exp(g)`, `Sa = a S_prev`, `u = Sa^T k`, `delta = beta (v - u)`,
/// `S = Sa + k delta^T`, `o = S^T q s`:
///
/// ```text
/// dS += s q do^T            dq = s S do
/// dk += dS delta            ddelta = dS^T k
/// dbeta = ddelta . (v - u)  dv = beta ddelta    du = -beta ddelta
/// dSa = dS + k du^T         dk += Sa du
/// dg = a * sum(dSa * S_prev)                    dS_prev = a dSa
/// ```
///
/// Shapes as the forward: `dq`, `dk`: `[T, n_k_head, k_dim]` (value heads
/// that share a key head add up, in head order); `dv`, `dout`:
/// `[T, n_v_head, v_dim]`; `dg`, `dbeta`: `[T, n_v_head]`.
pub fn delta_rule_backward(grads: DeltaGrads<'_>, dout: &[f32], checkpoints: &[f32], x: DeltaInputs<'_>, every: usize) {
    let DeltaDims { n_k_head, n_v_head, k_dim, v_dim } = x.d;
    let tokens = x.g.len() / n_v_head;
    assert_eq!(checkpoints.len(), tokens.div_ceil(every) * n_v_head * k_dim * v_dim, "delta rule checkpoints length");
    assert_eq!(dout.len(), tokens * n_v_head * v_dim, "delta rule dout length");
    let group = n_v_head / n_k_head;
    let per_head: Vec<HeadGrads> = (0..n_v_head)
        .into_par_iter()
        .map(|h| {
            let inputs = HeadInputs { h, kh: h / group, seq: x, dout };
            head_backward(&inputs, checkpoints, tokens, every)
        })
        .collect();
    let DeltaGrads { dq, dk, dv, dg, dbeta } = grads;
    dq.fill(0.0);
    dk.fill(0.0);
    for (h, hg) in per_head.iter().enumerate() {
        let kh = h / group;
        for t in 0..tokens {
            let r = (t * n_k_head + kh) * k_dim..(t * n_k_head + kh + 1) * k_dim;
            dq[r.clone()].iter_mut().zip(&hg.dq[t * k_dim..(t + 1) * k_dim]).for_each(|(a, b)| *a += b);
            dk[r].iter_mut().zip(&hg.dk[t * k_dim..(t + 1) * k_dim]).for_each(|(a, b)| *a += b);
            dv[(t * n_v_head + h) * v_dim..][..v_dim].copy_from_slice(&hg.dv[t * v_dim..(t + 1) * v_dim]);
            dg[t * n_v_head + h] = hg.dg[t];
            dbeta[t * n_v_head + h] = hg.dbeta[t];
        }
    }
}

/// Output buffers of [`delta_rule_backward`] (overwritten).
pub struct DeltaGrads<'a> {
    /// `[T, n_k_head, k_dim]`.
    pub dq: &'a mut [f32],
    /// `[T, n_k_head, k_dim]`.
    pub dk: &'a mut [f32],
    /// `[T, n_v_head, v_dim]`.
    pub dv: &'a mut [f32],
    /// `[T, n_v_head]`.
    pub dg: &'a mut [f32],
    /// `[T, n_v_head]`.
    pub dbeta: &'a mut [f32],
}

/// One value head's view of the forward inputs.
struct HeadInputs<'a> {
    h: usize,
    kh: usize,
    seq: DeltaInputs<'a>,
    dout: &'a [f32],
}

/// One value head's gradients over the sequence, `[T, width]` each.
struct HeadGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dg: Vec<f32>,
    dbeta: Vec<f32>,
}

impl HeadInputs<'_> {
    fn q(&self, t: usize) -> &[f32] {
        let d = self.seq.d;
        &self.seq.q[(t * d.n_k_head + self.kh) * d.k_dim..][..d.k_dim]
    }
    fn k(&self, t: usize) -> &[f32] {
        let d = self.seq.d;
        &self.seq.k[(t * d.n_k_head + self.kh) * d.k_dim..][..d.k_dim]
    }
    fn v(&self, t: usize) -> &[f32] {
        let d = self.seq.d;
        &self.seq.v[(t * d.n_v_head + self.h) * d.v_dim..][..d.v_dim]
    }
    fn dout(&self, t: usize) -> &[f32] {
        let d = self.seq.d;
        &self.dout[(t * d.n_v_head + self.h) * d.v_dim..][..d.v_dim]
    }
    fn gate(&self, t: usize) -> (f32, f32) {
        let at = t * self.seq.d.n_v_head + self.h;
        (self.seq.g[at].exp(), self.seq.beta[at])
    }
}

fn head_backward(x: &HeadInputs<'_>, checkpoints: &[f32], tokens: usize, every: usize) -> HeadGrads {
    let DeltaDims { n_v_head, k_dim, v_dim, .. } = x.seq.d;
    let sz = k_dim * v_dim;
    let mut out = HeadGrads {
        dq: vec![0.0; tokens * k_dim],
        dk: vec![0.0; tokens * k_dim],
        dv: vec![0.0; tokens * v_dim],
        dg: vec![0.0; tokens],
        dbeta: vec![0.0; tokens],
    };
    let mut ds = vec![0.0f32; sz];
    let mut scratch = TokenScratch { sa: vec![0.0; sz], u: vec![0.0; v_dim], delta: vec![0.0; v_dim], ddelta: vec![0.0; v_dim], du: vec![0.0; v_dim] };
    for c in (0..tokens.div_ceil(every)).rev() {
        let (t0, t1) = (c * every, ((c + 1) * every).min(tokens));
        let states = piece_states(x, &checkpoints[(c * n_v_head + x.h) * sz..][..sz], t0, t1);
        for t in (t0..t1).rev() {
            let (prev, cur) = (&states[(t - t0) * sz..][..sz], &states[(t - t0 + 1) * sz..][..sz]);
            token_backward(x, t, prev, cur, &mut ds, &mut scratch, &mut out);
        }
    }
    out
}

/// The states of one head around every token of the piece `t0..t1`:
/// `[t1 - t0 + 1, k_dim, v_dim]`, entry `i` the state before token `t0 + i`.
fn piece_states(x: &HeadInputs<'_>, checkpoint: &[f32], t0: usize, t1: usize) -> Vec<f32> {
    let (sz, v_dim) = (checkpoint.len(), x.seq.d.v_dim);
    let scale = 1.0 / (x.seq.d.k_dim as f32).sqrt();
    let (mut delta, mut o) = (vec![0.0f32; v_dim], vec![0.0f32; v_dim]);
    let mut states = Vec::with_capacity((t1 - t0 + 1) * sz);
    states.extend_from_slice(checkpoint);
    let mut s = checkpoint.to_vec();
    for t in t0..t1 {
        let (decay, b) = x.gate(t);
        o.fill(0.0);
        delta_token(&mut s, &mut delta, &mut o, x.q(t), x.k(t), x.v(t), decay, b, scale);
        states.extend_from_slice(&s);
    }
    states
}

/// Per-token buffers of the backward walk.
struct TokenScratch {
    /// `a S_prev`, `[k_dim, v_dim]`.
    sa: Vec<f32>,
    /// `Sa^T k`, `[v_dim]`.
    u: Vec<f32>,
    /// `beta (v - u)`, `[v_dim]`.
    delta: Vec<f32>,
    /// Gradient of `delta`, `[v_dim]`.
    ddelta: Vec<f32>,
    /// Gradient of `u`, `[v_dim]`.
    du: Vec<f32>,
}

/// One token of [`delta_rule_backward`] (formulas there): writes token
/// `t`'s gradients into `out` and turns `ds` (gradient of the state after
/// `t`) into the gradient of the state before it.
fn token_backward(x: &HeadInputs<'_>, t: usize, prev: &[f32], cur: &[f32], ds: &mut [f32], w: &mut TokenScratch, out: &mut HeadGrads) {
    let (k_dim, v_dim) = (x.seq.d.k_dim, x.seq.d.v_dim);
    let scale = 1.0 / (k_dim as f32).sqrt();
    let (q_t, k_t, v_t, do_t) = (x.q(t), x.k(t), x.v(t), x.dout(t));
    let (decay, b) = x.gate(t);
    w.sa.iter_mut().zip(prev).for_each(|(a, &p)| *a = p * decay);
    w.u.fill(0.0);
    for (i, &ki) in k_t.iter().enumerate() {
        w.u.iter_mut().zip(&w.sa[i * v_dim..(i + 1) * v_dim]).for_each(|(uj, &s)| *uj += s * ki);
    }
    w.delta.iter_mut().zip(v_t).zip(&w.u).for_each(|((dl, &vj), &uj)| *dl = b * (vj - uj));
    let (dq, dk) = (&mut out.dq[t * k_dim..(t + 1) * k_dim], &mut out.dk[t * k_dim..(t + 1) * k_dim]);
    w.ddelta.fill(0.0);
    for i in 0..k_dim {
        let (row, drow) = (&cur[i * v_dim..(i + 1) * v_dim], &mut ds[i * v_dim..(i + 1) * v_dim]);
        let qi = q_t[i] * scale;
        let (mut dqi, mut dki) = (0.0f32, 0.0f32);
        for j in 0..v_dim {
            dqi += row[j] * do_t[j];
            drow[j] += qi * do_t[j];
            dki += drow[j] * w.delta[j];
            w.ddelta[j] += drow[j] * k_t[i];
        }
        dq[i] = dqi * scale;
        dk[i] = dki;
    }
    let mut dbeta = 0.0f32;
    for j in 0..v_dim {
        dbeta += w.ddelta[j] * (v_t[j] - w.u[j]);
        out.dv[t * v_dim + j] = b * w.ddelta[j];
        w.du[j] = -b * w.ddelta[j];
    }
    out.dbeta[t] = dbeta;
    let mut dalpha = 0.0f32;
    for i in 0..k_dim {
        let (srow, drow, prow) = (&w.sa[i * v_dim..(i + 1) * v_dim], &mut ds[i * v_dim..(i + 1) * v_dim], &prev[i * v_dim..(i + 1) * v_dim]);
        let mut dki = 0.0f32;
        for j in 0..v_dim {
            dki += srow[j] * w.du[j];
            drow[j] += k_t[i] * w.du[j];
            dalpha += drow[j] * prow[j];
            drow[j] *= decay;
        }
        dk[i] += dki;
    }
    out.dg[t] = dalpha * decay;
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

/// Input gradients of [`gated_rmsnorm_forward`] (weight frozen). With
/// `n = inp * rstd` and `dn = dout * weight * silu(gate)`:
/// `dinp = rstd dn - rstd^3 / dim * inp * (inp . dn)`,
/// `dgate = dout * weight * n * silu'(gate)`.
///
/// `dinp`, `dgate`, `dout`, `inp`, `gate`: `[rows, dim]`; `rstd`: `[rows]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_rmsnorm_backward(dinp: &mut [f32], dgate: &mut [f32], dout: &[f32], inp: &[f32], gate: &[f32], weight: &[f32], rstd: &[f32]) {
    let dim = weight.len();
    assert!(dinp.len() == inp.len() && dgate.len() == inp.len() && dout.len() == inp.len() && rstd.len() * dim == inp.len(), "gated rmsnorm backward lengths");
    let mut dn = vec![0.0f32; dim];
    for (row, &r) in rstd.iter().enumerate() {
        let span = row * dim..(row + 1) * dim;
        let (x, z, dy) = (&inp[span.clone()], &gate[span.clone()], &dout[span.clone()]);
        let mut dot = 0f64;
        for c in 0..dim {
            let s = sigmoid(z[c]);
            dn[c] = dy[c] * weight[c] * z[c] * s;
            dgate[span.start + c] = dy[c] * weight[c] * (x[c] * r) * s * (1.0 + z[c] * (1.0 - s));
            dot += dn[c] as f64 * x[c] as f64;
        }
        let k = (dot * (r as f64).powi(3) / dim as f64) as f32;
        for c in 0..dim {
            dinp[span.start + c] = r * dn[c] - k * x[c];
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

    /// `q`, `k` (L2-normalised), `v`, `g`, `beta` of `t` tokens shaped by `d`.
    fn delta_inputs(d: DeltaDims, t: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let (nk, nv) = (t * d.n_k_head * d.k_dim, t * d.n_v_head);
        let (mut q, mut k) = (wave(nk, 0.9, 1.0), wave(nk, 0.4, 1.0));
        let mut rn = vec![0.0; t * d.n_k_head];
        let (q0, k0) = (q.clone(), k.clone());
        l2norm_forward(&mut q, &mut rn, &q0, d.k_dim, 1e-6);
        l2norm_forward(&mut k, &mut rn, &k0, d.k_dim, 1e-6);
        let v = wave(nv * d.v_dim, 0.57, 1.5);
        let g = wave(nv, 0.8, 0.5).iter().map(|x| x - 0.6).collect();
        let beta = wave(nv, 1.3, 0.4).iter().map(|x| x + 0.5).collect();
        (q, k, v, g, beta)
    }

    /// f64 recurrence with explicit (I - beta k k^T) form, the textbook
    /// statement of the delta rule.
    #[test]
    fn delta_rule_matches_f64_textbook_form_and_composes_in_pieces() {
        let d = DeltaDims { n_k_head: 1, n_v_head: 2, k_dim: 3, v_dim: 2 };
        let t = 7;
        let (q, k, v, g, beta) = delta_inputs(d, t);
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

    /// Checkpointing only decides where states are recomputed from: the
    /// gradients are the same bits for any interval (a state recomputed
    /// from a checkpoint equals the forward's, since pieces compose exactly).
    #[test]
    fn delta_rule_backward_is_independent_of_the_checkpoint_interval() {
        let d = DeltaDims { n_k_head: 2, n_v_head: 4, k_dim: 3, v_dim: 2 };
        let t = 23;
        let (q, k, v, g, beta) = delta_inputs(d, t);
        let x = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, d };
        let dout = wave(t * 8, 0.23, 1.0);
        let grads_for = |every: usize| {
            let (mut out, mut ck) = (vec![0.0; t * 8], Vec::new());
            delta_rule_forward_checkpointed(&mut out, &mut ck, x, every);
            let (mut dq, mut dk, mut dv, mut dg, mut db) = (vec![0.0; t * 6], vec![0.0; t * 6], vec![0.0; t * 8], vec![0.0; t * 4], vec![0.0; t * 4]);
            let grads = DeltaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dbeta: &mut db };
            delta_rule_backward(grads, &dout, &ck, x, every);
            (out, [dq, dk, dv, dg, db])
        };
        let reference = grads_for(1);
        for every in [5, 16, 64] {
            assert_eq!(grads_for(every), reference, "checkpoint every {every}");
        }
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

//! Qwen3.5's fused tape nodes: the Gated DeltaNet recurrence and the two
//! halves of the gated attention output (query split, sigmoid gate). All
//! frozen weights here are small (conv, gates, norm); the GDN projections
//! themselves stay [`crate::projection::Projection`] nodes outside.
//!
//! The recurrence node, per sequence of `seq` rows:
//!
//! ```text
//! inputs  qkv [T, conv_dim]  z [T, value_dim]  b [T, n_v_head]  a [T, n_v_head]
//! mixed = silu(conv1d_causal(qkv))         q, k = l2norm(q), l2norm(k)
//! g, beta = gates(a, b)                    o = delta_rule(q, k, v, g, beta)
//! output  gated_rmsnorm(o, z)  [T, value_dim]
//! saved   checkpoints [n_seq, ceil(T / 16), n_v_head, k_dim, v_dim] (f32 state
//!         before every 16-token piece), o [rows, value_dim]
//! ```
//!
//! The backward recomputes the elementwise parts from the inputs and the
//! states inside each piece from its checkpoint (`ops/gdn.rs`), so what is
//! kept per layer is the checkpoints and `o`, not one state per token.
use super::L2NORM_EPS;
use crate::autograd::{CustomNode, Tape, Var};
use crate::model::blocks::{output_gate_forward, query_half};
use crate::ops::activation::{sigmoid, silu_forward};
use crate::ops::gdn::{
    conv1d_causal_backward, conv1d_causal_forward, delta_rule_backward, delta_rule_forward_checkpointed, gated_rmsnorm_backward,
    gated_rmsnorm_forward, gdn_gates_backward, gdn_gates_forward, l2norm_backward, l2norm_forward, silu_backward, DeltaGrads,
    DeltaInputs,
};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::sync::Arc;

/// Tokens between saved recurrent states.
pub const CHECKPOINT_EVERY: usize = 16;

pub use super::GdnWeights;

/// Qwen3.5's node kinds, on the tape as [`CustomNode`]s.
pub(crate) enum Qwen35Node {
    /// The Gated DeltaNet recurrence. Inputs `[qkv, z, b, a]`.
    Gdn { weights: Arc<GdnWeights>, seq: usize, checkpoints: Vec<f32>, core: Vec<f32> },
    /// The query half of q_proj's `[rows, n_head, 2 * head_dim]` (query then
    /// gate per head). Inputs `[q_full]`; saves nothing.
    QueryOf { head_dim: usize },
    /// `attn * sigmoid(gate half of q_full)`. Inputs `[attn: [rows, n_head *
    /// head_dim], q_full]`; saves nothing.
    OutputGate { head_dim: usize },
}

/// Everything the recurrence computes from its inputs before the delta
/// rule, for one sequence (`[T, width]` each).
struct Prepared {
    conv: Vec<f32>,
    q_raw: Vec<f32>,
    k_raw: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    rq: Vec<f32>,
    rk: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Prepared {
    /// The delta rule's inputs among these.
    fn delta_inputs(&self, w: &GdnWeights) -> DeltaInputs<'_> {
        DeltaInputs { q: &self.q, k: &self.k, v: &self.v, g: &self.g, beta: &self.beta, d: w.delta_dims() }
    }
}

fn prepare(w: &GdnWeights, qkv: &[f32], b: &[f32], a: &[f32]) -> Prepared {
    let d = w.dims;
    let (key_dim, conv_dim) = (d.key_dim(), d.conv_dim());
    let tokens = qkv.len() / conv_dim;
    let zeros = vec![0.0; (d.conv_kernel - 1) * conv_dim];
    let mut conv = vec![0.0; qkv.len()];
    conv1d_causal_forward(&mut conv, qkv, &zeros, &w.conv_weight, conv_dim);
    let mut mixed = vec![0.0; conv.len()];
    silu_forward(&mut mixed, &conv);
    let (q_raw, k_raw, v) = super::gdn::split_qkv(&mixed, key_dim, conv_dim);
    let (mut q, mut k) = (vec![0.0; q_raw.len()], vec![0.0; k_raw.len()]);
    let (mut rq, mut rk) = (vec![0.0; tokens * d.n_k_head], vec![0.0; tokens * d.n_k_head]);
    l2norm_forward(&mut q, &mut rq, &q_raw, d.k_dim, L2NORM_EPS);
    l2norm_forward(&mut k, &mut rk, &k_raw, d.k_dim, L2NORM_EPS);
    let (mut g, mut beta) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    gdn_gates_forward(&mut g, &mut beta, a, b, &w.a_log, &w.dt_bias);
    Prepared { conv, q_raw, k_raw, q, k, v, rq, rk, g, beta }
}

/// Forward of one sequence: `(output, checkpoints, core)`.
fn gdn_sequence_forward(w: &GdnWeights, qkv: &[f32], z: &[f32], b: &[f32], a: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = prepare(w, qkv, b, a);
    let mut core = vec![0.0; p.v.len()];
    let mut checkpoints = Vec::new();
    delta_rule_forward_checkpointed(&mut core, &mut checkpoints, p.delta_inputs(w), CHECKPOINT_EVERY);
    let mut out = vec![0.0; core.len()];
    let mut rstd = vec![0.0; core.len() / w.dims.v_dim];
    gated_rmsnorm_forward(&mut out, &mut rstd, &core, z, &w.norm_weight, w.eps);
    (out, checkpoints, core)
}

/// Input gradients of one sequence: `[dqkv, dz, db, da]`.
#[allow(clippy::too_many_arguments)]
fn gdn_sequence_backward(w: &GdnWeights, dout: &[f32], qkv: &[f32], z: &[f32], b: &[f32], a: &[f32], checkpoints: &[f32], core: &[f32]) -> [Vec<f32>; 4] {
    let d = w.dims;
    let p = prepare(w, qkv, b, a);
    let mut rstd = vec![0.0; core.len() / d.v_dim];
    let mut scratch = vec![0.0; core.len()];
    gated_rmsnorm_forward(&mut scratch, &mut rstd, core, z, &w.norm_weight, w.eps);
    let (mut dcore, mut dz) = (vec![0.0; core.len()], vec![0.0; z.len()]);
    gated_rmsnorm_backward(&mut dcore, &mut dz, dout, core, z, &w.norm_weight, &rstd);

    let (mut dq, mut dk, mut dv) = (vec![0.0; p.q.len()], vec![0.0; p.k.len()], vec![0.0; p.v.len()]);
    let (mut dg, mut dbeta) = (vec![0.0; p.g.len()], vec![0.0; p.beta.len()]);
    let grads = DeltaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dbeta: &mut dbeta };
    delta_rule_backward(grads, &dcore, checkpoints, p.delta_inputs(w), CHECKPOINT_EVERY);
    let (mut da, mut db) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    gdn_gates_backward(&mut da, &mut db, &dg, &dbeta, a, b, &w.a_log, &w.dt_bias);

    let (mut dq_raw, mut dk_raw) = (vec![0.0; dq.len()], vec![0.0; dk.len()]);
    l2norm_backward(&mut dq_raw, &dq, &p.q_raw, &p.rq, d.k_dim);
    l2norm_backward(&mut dk_raw, &dk, &p.k_raw, &p.rk, d.k_dim);
    let (key_dim, value_dim) = (d.key_dim(), d.value_dim());
    let mut dmixed = Vec::with_capacity(qkv.len());
    for t in 0..qkv.len() / d.conv_dim() {
        dmixed.extend_from_slice(&dq_raw[t * key_dim..(t + 1) * key_dim]);
        dmixed.extend_from_slice(&dk_raw[t * key_dim..(t + 1) * key_dim]);
        dmixed.extend_from_slice(&dv[t * value_dim..(t + 1) * value_dim]);
    }
    let mut dconv = vec![0.0; qkv.len()];
    silu_backward(&mut dconv, &dmixed, &p.conv);
    let mut dqkv = vec![0.0; qkv.len()];
    conv1d_causal_backward(&mut dqkv, &dconv, &w.conv_weight, d.conv_dim());
    [dqkv, dz, db, da]
}

impl CustomNode for Qwen35Node {
    fn name(&self) -> &'static str {
        match self {
            Qwen35Node::Gdn { .. } => "gdn",
            Qwen35Node::QueryOf { .. } | Qwen35Node::OutputGate { .. } => "attn-gate",
        }
    }

    fn backward(&self, inputs: &[&Tensor], _output: &Tensor, dout: &Tensor, wanted: &[bool]) -> Result<Vec<Option<Tensor>>> {
        match self {
            Qwen35Node::Gdn { weights, seq, checkpoints, core } => Ok(gdn_backward(weights, *seq, checkpoints, core, inputs, dout)
                .into_iter()
                .zip(wanted)
                .map(|(g, &w)| w.then_some(g))
                .collect()),
            Qwen35Node::QueryOf { head_dim } => {
                let mut d = Tensor::zeros(&inputs[0].shape);
                for (full, q) in d.data.chunks_exact_mut(2 * head_dim).zip(dout.data.chunks_exact(*head_dim)) {
                    full[..*head_dim].copy_from_slice(q);
                }
                Ok(vec![Some(d)])
            }
            Qwen35Node::OutputGate { head_dim } => {
                let (attn, full) = (inputs[0], inputs[1]);
                let hd = *head_dim;
                let mut dattn = Tensor::zeros(&attn.shape);
                let mut dfull = Tensor::zeros(&full.shape);
                let heads = attn.data.chunks_exact(hd).zip(full.data.chunks_exact(2 * hd)).zip(dout.data.chunks_exact(hd));
                for (((x, f), dy), (da, df)) in heads.zip(dattn.data.chunks_exact_mut(hd).zip(dfull.data.chunks_exact_mut(2 * hd))) {
                    for c in 0..hd {
                        let s = sigmoid(f[hd + c]);
                        da[c] = dy[c] * s;
                        df[hd + c] = dy[c] * x[c] * s * (1.0 - s);
                    }
                }
                Ok(vec![wanted[0].then_some(dattn), wanted[1].then_some(dfull)])
            }
        }
    }
}

fn gdn_backward(w: &GdnWeights, seq: usize, checkpoints: &[f32], core: &[f32], inputs: &[&Tensor], dout: &Tensor) -> Vec<Tensor> {
    let d = w.dims;
    let widths = [d.conv_dim(), d.value_dim(), d.n_v_head, d.n_v_head];
    let mut grads: Vec<Tensor> = inputs.iter().map(|t| Tensor::zeros(&t.shape)).collect();
    let per_seq_ckpt = seq.div_ceil(CHECKPOINT_EVERY) * d.n_v_head * d.k_dim * d.v_dim;
    let vd = d.value_dim();
    for s in 0..inputs[0].rows() / seq {
        let part = |i: usize| &inputs[i].data[s * seq * widths[i]..(s + 1) * seq * widths[i]];
        let ds = gdn_sequence_backward(
            w,
            &dout.data[s * seq * vd..(s + 1) * seq * vd],
            part(0),
            part(1),
            part(2),
            part(3),
            &checkpoints[s * per_seq_ckpt..(s + 1) * per_seq_ckpt],
            &core[s * seq * vd..(s + 1) * seq * vd],
        );
        for (i, g) in ds.iter().enumerate() {
            grads[i].data[s * seq * widths[i]..(s + 1) * seq * widths[i]].copy_from_slice(g);
        }
    }
    grads
}

fn check_width(what: &str, t: &Tensor, width: usize, rows: usize) -> Result<()> {
    if t.last_dim() != width || t.rows() != rows {
        return Err(Error::Shape { what: what.into(), expected: vec![rows, width], got: t.shape.clone() });
    }
    Ok(())
}

impl Tape {
    /// The Gated DeltaNet recurrence over sequences of `seq` rows (each
    /// starts from a zero state): `qkv: [rows, conv_dim]` (before the
    /// conv), `z: [rows, value_dim]`, `b`, `a: [rows, n_v_head]` ->
    /// `[rows, value_dim]` (the input of out_proj).
    pub fn gdn(&mut self, qkv: Var, z: Var, b: Var, a: Var, weights: &Arc<GdnWeights>, seq: usize) -> Result<Var> {
        let _time = crate::autograd::profile::timer("gdn", true);
        let d = weights.dims;
        let rows = self.value(qkv).rows();
        if seq == 0 || !rows.is_multiple_of(seq) {
            return Err(Error::Shape { what: "gdn rows (batch * seq)".into(), expected: vec![seq], got: vec![rows] });
        }
        check_width("gdn qkv", self.value(qkv), d.conv_dim(), rows)?;
        check_width("gdn z", self.value(z), d.value_dim(), rows)?;
        check_width("gdn b", self.value(b), d.n_v_head, rows)?;
        check_width("gdn a", self.value(a), d.n_v_head, rows)?;
        let (mut out, mut checkpoints, mut core) = (Vec::new(), Vec::new(), Vec::new());
        let widths = [d.conv_dim(), d.value_dim(), d.n_v_head, d.n_v_head];
        for s in 0..rows / seq {
            let part = |v: Var, w: usize| &self.value(v).data[s * seq * w..(s + 1) * seq * w];
            let (o, c, k) = gdn_sequence_forward(weights, part(qkv, widths[0]), part(z, widths[1]), part(b, widths[2]), part(a, widths[3]));
            out.extend(o);
            checkpoints.extend(c);
            core.extend(k);
        }
        let y = Tensor::from_vec(&[rows, d.value_dim()], out)?;
        let node = Box::new(Qwen35Node::Gdn { weights: weights.clone(), seq, checkpoints, core });
        Ok(self.push_custom(node, &[qkv, z, b, a], y))
    }

    /// The query half of `q_full: [rows, n_head * 2 * head_dim]`.
    pub fn query_of(&mut self, q_full: Var, head_dim: usize) -> Result<Var> {
        let _time = crate::autograd::profile::timer("attn-gate", true);
        let f = self.value(q_full);
        if head_dim == 0 || !f.last_dim().is_multiple_of(2 * head_dim) {
            return Err(Error::Shape { what: "query_of input".into(), expected: vec![2 * head_dim], got: f.shape.clone() });
        }
        let y = Tensor::from_vec(&[f.rows(), f.last_dim() / 2], query_half(&f.data, head_dim))?;
        Ok(self.push_custom(Box::new(Qwen35Node::QueryOf { head_dim }), &[q_full], y))
    }

    /// `attn * sigmoid(gate)`, the gate being the second half of each head
    /// of `q_full`.
    pub fn output_gate(&mut self, attn: Var, q_full: Var, head_dim: usize) -> Result<Var> {
        let _time = crate::autograd::profile::timer("attn-gate", true);
        let (x, f) = (self.value(attn), self.value(q_full));
        if head_dim == 0 || x.len() * 2 != f.len() || !x.len().is_multiple_of(head_dim) {
            return Err(Error::Shape { what: "output_gate attn / q_full".into(), expected: vec![2 * x.len()], got: f.shape.clone() });
        }
        let y = Tensor::from_vec(&x.shape, output_gate_forward(&x.data, &f.data, head_dim))?;
        Ok(self.push_custom(Box::new(Qwen35Node::OutputGate { head_dim }), &[attn, q_full], y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::GdnConfig;
    use crate::autograd::gradcheck_tests::{pseudo_random, rel_err};

    fn weights() -> GdnWeights {
        let dims = GdnConfig { conv_kernel: 4, n_k_head: 1, n_v_head: 2, k_dim: 3, v_dim: 2 };
        GdnWeights {
            conv_weight: pseudo_random(dims.conv_dim() * 4, 11, 0.8),
            dt_bias: vec![0.3, -0.4],
            a_log: vec![-0.5, 0.2],
            norm_weight: vec![1.1, 0.7],
            dims,
            eps: 1e-6,
        }
    }

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// Independent f64 statement of the layer (textbook delta rule
    /// `S = a (I - b k k^T) S + b k v^T`), one sequence from zero state.
    fn reference(w: &GdnWeights, qkv: &[f64], z: &[f64], b: &[f64], a: &[f64]) -> Vec<f64> {
        let d = w.dims;
        let (c, kk, t_len) = (d.conv_dim(), d.conv_kernel, qkv.len() / d.conv_dim());
        let mixed: Vec<f64> = (0..t_len * c)
            .map(|i| {
                let (t, ch) = (i / c, i % c);
                let s: f64 = (0..kk).filter(|&j| t + j >= kk - 1).map(|j| w.conv_weight[ch * kk + j] as f64 * qkv[(t + j + 1 - kk) * c + ch]).sum();
                silu(s)
            })
            .collect();
        let l2 = |x: &[f64]| {
            let n = (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
            x.iter().map(|v| v / n).collect::<Vec<f64>>()
        };
        let mut out = vec![0.0; t_len * d.value_dim()];
        let group = d.n_v_head / d.n_k_head;
        for h in 0..d.n_v_head {
            let kh = h / group;
            let mut s = vec![vec![0f64; d.v_dim]; d.k_dim];
            for t in 0..t_len {
                let row = &mixed[t * c..(t + 1) * c];
                let q = l2(&row[kh * d.k_dim..(kh + 1) * d.k_dim]);
                let k = l2(&row[d.key_dim() + kh * d.k_dim..d.key_dim() + (kh + 1) * d.k_dim]);
                let v = &row[2 * d.key_dim() + h * d.v_dim..2 * d.key_dim() + (h + 1) * d.v_dim];
                let x = a[t * d.n_v_head + h] + w.dt_bias[h] as f64;
                let g = -(w.a_log[h] as f64).exp() * (1.0 + x.exp()).ln();
                let (al, be) = (g.exp(), 1.0 / (1.0 + (-b[t * d.n_v_head + h]).exp()));
                let mut ns = s.clone();
                for i in 0..d.k_dim {
                    for j in 0..d.v_dim {
                        let proj: f64 = (0..d.k_dim).map(|p| k[i] * k[p] * s[p][j]).sum();
                        ns[i][j] = al * (s[i][j] - be * proj) + be * k[i] * v[j];
                    }
                }
                s = ns;
                let o: Vec<f64> = (0..d.v_dim).map(|j| (0..d.k_dim).map(|i| s[i][j] * q[i]).sum::<f64>() / (d.k_dim as f64).sqrt()).collect();
                let ms = o.iter().map(|x| x * x).sum::<f64>() / d.v_dim as f64;
                let r = 1.0 / (ms + w.eps as f64).sqrt();
                for j in 0..d.v_dim {
                    let zi = z[(t * d.n_v_head + h) * d.v_dim + j];
                    out[(t * d.n_v_head + h) * d.v_dim + j] = w.norm_weight[j] as f64 * o[j] * r * silu(zi);
                }
            }
        }
        out
    }

    /// Forward values and every input gradient of the tape node match the
    /// f64 reference and its central differences, over two sequences of 37
    /// tokens (three checkpoints each, the last piece partial).
    #[test]
    fn gdn_node_matches_f64_reference_and_finite_differences() {
        let w = Arc::new(weights());
        let d = w.dims;
        let (seq, batch) = (37, 2);
        let rows = seq * batch;
        let widths = [d.conv_dim(), d.value_dim(), d.n_v_head, d.n_v_head];
        let scales = [1.5, 1.0, 1.5, 1.5];
        let inputs: Vec<Vec<f32>> = (0..4).map(|i| pseudo_random(rows * widths[i], 20 + i as u64, scales[i])).collect();
        let r = pseudo_random(rows * d.value_dim(), 30, 1.0);
        let mut tape = Tape::new();
        let vars: Vec<Var> = (0..4).map(|i| tape.param(Tensor::from_vec(&[rows, widths[i]], inputs[i].clone()).unwrap())).collect();
        let y = tape.gdn(vars[0], vars[1], vars[2], vars[3], &w, seq).unwrap();
        let out = tape.value(y).data.clone();
        tape.backward_with(y, Tensor::from_vec(&[rows, d.value_dim()], r.clone()).unwrap()).unwrap();

        let as64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let seq_ref = |ins: &[Vec<f64>], s: usize| {
            let part = |i: usize| &ins[i][s * seq * widths[i]..(s + 1) * seq * widths[i]];
            reference(&w, part(0), part(1), part(2), part(3))
        };
        let base: Vec<Vec<f64>> = inputs.iter().map(|v| as64(v)).collect();
        let want: Vec<f64> = (0..batch).flat_map(|s| seq_ref(&base, s)).collect();
        assert!(rel_err(&out, &want) < 1e-5, "forward rel err {}", rel_err(&out, &want));

        let loss = |ins: &[Vec<f64>], s: usize| -> f64 {
            let o = seq_ref(ins, s);
            o.iter().zip(&r[s * seq * d.value_dim()..]).map(|(o, &r)| o * r as f64).sum()
        };
        for i in 0..4 {
            let eps = 1e-6;
            let fd: Vec<f64> = (0..base[i].len())
                .map(|e| {
                    let s = e / (seq * widths[i]);
                    let mut p = base.clone();
                    p[i][e] += eps;
                    let up = loss(&p, s);
                    p[i][e] -= 2.0 * eps;
                    (up - loss(&p, s)) / (2.0 * eps)
                })
                .collect();
            let got = tape.grad(vars[i]).unwrap();
            let e = rel_err(&got.data, &fd);
            assert!(e < 1e-4, "input {i}: rel err {e}");
        }
    }

    #[test]
    fn wrong_shapes_are_errors_not_panics() {
        let w = Arc::new(weights());
        let d = w.dims;
        let mut tape = Tape::new();
        let mut var = |rows: usize, width: usize| tape.constant(Tensor::zeros(&[rows, width]));
        let (qkv, z, b, a) = (var(10, d.conv_dim()), var(10, d.value_dim()), var(10, d.n_v_head), var(10, d.n_v_head));
        let bad_z = var(10, d.value_dim() + 1);
        assert!(tape.gdn(qkv, z, b, a, &w, 3).is_err(), "10 rows are not sequences of 3");
        assert!(tape.gdn(qkv, bad_z, b, a, &w, 5).is_err(), "z width");
        assert!(tape.gdn(qkv, z, b, a, &w, 5).is_ok());
        assert!(tape.query_of(qkv, 3).is_err(), "{} is not a multiple of 6", d.conv_dim());
    }

    #[test]
    fn output_gate_and_query_split_match_finite_differences() {
        let (rows, heads, hd) = (3, 2, 4);
        let full = pseudo_random(rows * heads * 2 * hd, 40, 2.0);
        let r = pseudo_random(rows * heads * hd, 41, 1.0);
        let mut tape = Tape::new();
        let f = tape.param(Tensor::from_vec(&[rows, heads * 2 * hd], full.clone()).unwrap());
        let q = tape.query_of(f, hd).unwrap();
        // y = q * sigmoid(gate): both halves of q_full reach the output.
        let y = tape.output_gate(q, f, hd).unwrap();
        tape.backward_with(y, Tensor::from_vec(&[rows, heads * hd], r.clone()).unwrap()).unwrap();
        let loss = |x: &[f64]| -> f64 {
            (0..rows * heads)
                .flat_map(|rh| (0..hd).map(move |c| (rh, c)))
                .map(|(rh, c)| x[rh * 2 * hd + c] / (1.0 + (-x[rh * 2 * hd + hd + c]).exp()) * r[rh * hd + c] as f64)
                .sum()
        };
        let base: Vec<f64> = full.iter().map(|&v| v as f64).collect();
        let fd: Vec<f64> = (0..base.len())
            .map(|e| {
                let mut p = base.clone();
                p[e] += 1e-6;
                let up = loss(&p);
                p[e] -= 2e-6;
                (up - loss(&p)) / 2e-6
            })
            .collect();
        let e = rel_err(&tape.grad(f).unwrap().data, &fd);
        assert!(e < 1e-5, "rel err {e}");
    }
}

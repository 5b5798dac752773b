//! Every kind of node the tape knows, in one enum, with its forward builder
//! (a method on [`Tape`]) and its backward. Nodes are coarse and fused; each
//! saves only what its backward needs, named in the variant. The arithmetic
//! lives in forward/backward slice functions (`ops/`, `lora/branch.rs`).
use super::tape::{Tape, Var};
use crate::lora::branch::{self, Dropout};
use crate::ops::attention::{attention_backward_with, attention_forward_window, attention_forward_with, AttnDims, BackwardInputs, Products};
use crate::ops::cross_entropy;
use crate::ops::rmsnorm::{rmsnorm_backward, rmsnorm_forward, NormWeight};
use crate::ops::rope::rope_apply;
use crate::ops::geglu::{geglu_backward, geglu_forward};
use crate::ops::swiglu::{swiglu_backward, swiglu_forward};
use crate::projection::{Carried, Direction, LoraFactors, Product, Projection};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::sync::Arc;

/// A piece of graph that can be run again: `f(tape, x, params) -> y`.
/// Must be deterministic (same inputs, same bits), since recompute relies on it.
pub type SegmentFn = Arc<dyn Fn(&mut Tape, Var, &[Var]) -> Result<Var> + Send + Sync>;

/// The node kinds. Inputs are listed in the order the builder records them.
pub(crate) enum NodeKind {
    /// `Y = X W^T` with a frozen weight. Inputs `[x: [T, in]]`. Saves nothing:
    /// the backward is `dX = dY W` through the same interface.
    Projection { proj: Arc<dyn Projection> },
    /// `Y = base + s * drop(X) A^T B^T`. Inputs `[base: [T, out], x: [T, in],
    /// a: [r, in], b: [out, r]]`. Saves `xa = drop(X) A^T: [T, r]`; the
    /// dropout mask is regenerated from its seed.
    LoraAdd { scaling: f32, dropout: Option<Dropout>, xa: Vec<f32> },
    /// The frozen product and its LoRA branch in one node:
    /// `Y = X W^T + s * drop(X) A^T B^T`. Inputs `[x, x, a, b]`: `x` is listed
    /// twice so its two gradient terms (branch, then product) accumulate one
    /// after the other exactly as the unfused `Projection` + `LoraAdd` pair's
    /// do, which keeps fused and unfused runs bit-identical. Saves `xa:
    /// [T, r]`. Both directions go through [`Projection::apply_overlapped`]
    /// with the branch as the side work, so an NPU-served product overlaps
    /// the CPU's LoRA arithmetic.
    ///
    /// `carried`: the projection carried the branch on its own pass
    /// ([`Projection::apply_carrying_lora`]: bf16 AMX, no dropout); the
    /// backward then asks it for `dX` and `dxa` the same way, and the
    /// node's `dX` arrives as one term. A carried node rounds the branch's
    /// input like the product's, so it is deterministic but not
    /// bit-identical to the unfused pair.
    ProjectionLora { proj: Arc<dyn Projection>, scaling: f32, dropout: Option<Dropout>, xa: Vec<f32>, carried: bool },
    /// `Y = A + B`, same shapes. Inputs `[a, b]`.
    Add,
    /// RMSNorm over rows of `weight.len()` with a frozen weight. Inputs
    /// `[x: [rows, dim]]`; saves `rstd: [rows]` (and `eps`, so the output
    /// can be rebuilt: [`Tape::forget_recomputable`]).
    RmsNorm { weight: Arc<Vec<f32>>, kind: NormWeight, eps: f32, rstd: Vec<f32> },
    /// Rotary embedding of `x: [tokens, heads * head_dim]`, token `t` at
    /// `positions[t]`. Saves nothing (the backward rotates back).
    Rope { positions: Arc<Vec<usize>>, heads: usize, head_dim: usize, inv_freq: Arc<Vec<f32>> },
    /// Attention per sequence of `dims.q_len` rows (batch = rows / q_len),
    /// over a sliding `window` of keys where one is given. Inputs
    /// `[q, k, v]`; saves `lse: [rows, n_head]`.
    Attention { dims: AttnDims, scale: f32, products: Products, window: Option<usize>, lse: Vec<f32> },
    /// `silu(gate) * up`. Inputs `[gate, up]`; saves nothing beyond them.
    SwiGlu,
    /// `gelu_tanh(gate) * up` (Gemma's MLP).
    GeGlu,
    /// Vocabulary head + cross-entropy, fused and chunked over tokens.
    /// Inputs `[x: [T, hidden]]`, output the scalar loss. Because the loss is
    /// the end of the graph, `dL/dX` is computed during the forward (chunk by
    /// chunk, through the head's input-gradient direction) and saved:
    /// `dx: [T, hidden]`, so the `[T, vocab]` logits never exist at once.
    HeadLoss { dx: Option<Tensor> },
    /// A recomputed segment (activation budget). Inputs `[x, params...]`.
    /// Saves nothing but the function: the backward reruns it on a private
    /// tape and back-propagates there.
    Segment { f: SegmentFn },
    /// A node kind defined beside its architecture rather than in the tape
    /// (Qwen3.5's Gated DeltaNet and attention gate:
    /// `model/qwen35/gdn_node.rs`), so the tape names no architecture.
    Custom(Box<dyn CustomNode>),
}

/// The extension point of the tape: a fused node whose forward the caller
/// computes and pushes ([`super::Tape::push_custom`]) and whose backward the
/// tape's one backward walk calls like its own kinds'. Its backward may read
/// the node's output.
pub trait CustomNode: Send + Sync {
    /// Short name for profiles.
    fn name(&self) -> &'static str;
    /// Gradients of the inputs given `dout`; `None` where not `wanted`.
    fn backward(&self, inputs: &[&Tensor], output: &Tensor, dout: &Tensor, wanted: &[bool]) -> Result<Vec<Option<Tensor>>>;
}

impl NodeKind {
    /// Short name for profiles.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            NodeKind::Projection { .. } => "projection",
            NodeKind::LoraAdd { .. } => "lora",
            NodeKind::ProjectionLora { .. } => "proj+lora",
            NodeKind::RmsNorm { .. } => "rmsnorm",
            NodeKind::Rope { .. } => "rope",
            NodeKind::Attention { .. } => "attention",
            NodeKind::SwiGlu => "swiglu",
            NodeKind::GeGlu => "geglu",
            NodeKind::Add => "add",
            NodeKind::HeadLoss { .. } => "head+loss",
            NodeKind::Segment { .. } => "segment",
            NodeKind::Custom(n) => n.name(),
        }
    }

    /// Whether the backward reads input `i`'s value (a value no backward
    /// reads may be dropped once no forward needs it: [`Tape::forget`]).
    pub(crate) fn reads_input(&self, i: usize) -> bool {
        match self {
            NodeKind::LoraAdd { .. } => i != 0,
            NodeKind::Add | NodeKind::Rope { .. } | NodeKind::HeadLoss { .. } => false,
            _ => true,
        }
    }

    /// Whether [`NodeKind::forward_again`] can rebuild the output.
    pub(crate) fn rebuildable(&self) -> bool {
        matches!(self, NodeKind::RmsNorm { .. } | NodeKind::SwiGlu | NodeKind::GeGlu)
    }

    /// The output computed again from `inputs`, bit-identical to the
    /// forward's, for the kinds cheap enough to drop after the forward and
    /// rebuild in the backward ([`Tape::forget_recomputable`]); `None` for
    /// the others.
    pub(crate) fn forward_again(&self, inputs: &[&Tensor]) -> Option<Tensor> {
        match self {
            NodeKind::RmsNorm { weight, kind, eps, rstd } => {
                let mut y = Tensor::to_overwrite(&inputs[0].shape);
                let mut scratch = vec![0.0; rstd.len()];
                rmsnorm_forward(&mut y.data, &mut scratch, &inputs[0].data, weight, *kind, *eps);
                Some(y)
            }
            NodeKind::SwiGlu => {
                let mut y = Tensor::to_overwrite(&inputs[0].shape);
                swiglu_forward(&mut y.data, &inputs[0].data, &inputs[1].data);
                Some(y)
            }
            NodeKind::GeGlu => {
                let mut y = Tensor::to_overwrite(&inputs[0].shape);
                geglu_forward(&mut y.data, &inputs[0].data, &inputs[1].data);
                Some(y)
            }
            _ => None,
        }
    }

    /// Whether the backward reads the node's own output.
    pub(crate) fn reads_output(&self) -> bool {
        matches!(self, NodeKind::Attention { .. } | NodeKind::Custom(_))
    }

    /// Gradients of the inputs given `dout`; `None` where not `wanted`.
    pub(crate) fn backward(
        &self,
        inputs: &[&Tensor],
        output: &Tensor,
        dout: Tensor,
        wanted: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        match self {
            NodeKind::Projection { proj } => {
                let x = inputs[0];
                let mut dx = Tensor::to_overwrite(&x.shape);
                proj.apply(Direction::InputGrad, &dout.data, x.rows(), &mut dx.data)?;
                Ok(vec![Some(dx)])
            }
            NodeKind::LoraAdd { scaling, dropout, xa } => {
                let (x, a, b) = (inputs[1], inputs[2], inputs[3]);
                let [dx, da, db] = lora_backward(x, a, b, &dout, xa, *scaling, *dropout, [wanted[1], wanted[2], wanted[3]])?;
                Ok(vec![wanted[0].then(|| dout.clone()), dx, da, db])
            }
            NodeKind::ProjectionLora { proj, scaling, xa, carried: true, .. } if wanted[1] => {
                carried_lora_backward(proj.as_ref(), inputs, &dout, xa, *scaling, wanted)
            }
            NodeKind::ProjectionLora { proj, scaling, dropout, xa, .. } => {
                let (x, a, b) = (inputs[0], inputs[2], inputs[3]);
                let mut lora = None;
                let mut dx = wanted[1].then(|| Tensor::to_overwrite(&x.shape));
                let mut side = || {
                    lora = Some(lora_backward(x, a, b, &dout, xa, *scaling, *dropout, [wanted[0], wanted[2], wanted[3]])?);
                    Ok(())
                };
                match dx.as_mut() {
                    Some(dx) => proj.apply_overlapped(Product { dir: Direction::InputGrad, input: &dout.data, tokens: x.rows(), out: &mut dx.data }, &mut side)?,
                    None => side()?,
                }
                let [dx_lora, da, db] = lora.expect("side work runs exactly once");
                Ok(vec![dx_lora, dx, da, db])
            }
            NodeKind::RmsNorm { weight, kind, rstd, .. } => {
                let mut dx = Tensor::to_overwrite(&inputs[0].shape);
                rmsnorm_backward(&mut dx.data, &dout.data, &inputs[0].data, weight, rstd, *kind);
                Ok(vec![Some(dx)])
            }
            NodeKind::Rope { positions, heads, head_dim, inv_freq } => {
                let mut dx = dout;
                rope_apply(&mut dx.data, positions, *heads, *head_dim, inv_freq, true);
                Ok(vec![Some(dx)])
            }
            NodeKind::Attention { dims, scale, products, window, lse } => Ok(attention_node_backward(inputs, output, &dout, lse, (*dims, *scale, *products, *window))
                .into_iter()
                .zip(wanted)
                .map(|(g, &w)| w.then_some(g))
                .collect()),
            NodeKind::SwiGlu => {
                let (g, u) = (inputs[0], inputs[1]);
                let (mut dg, mut du) = (Tensor::to_overwrite(&g.shape), Tensor::to_overwrite(&u.shape));
                swiglu_backward(&mut dg.data, &mut du.data, &dout.data, &g.data, &u.data);
                Ok(vec![wanted[0].then_some(dg), wanted[1].then_some(du)])
            }
            NodeKind::GeGlu => {
                let (g, u) = (inputs[0], inputs[1]);
                let (mut dg, mut du) = (Tensor::to_overwrite(&g.shape), Tensor::to_overwrite(&u.shape));
                geglu_backward(&mut dg.data, &mut du.data, &dout.data, &g.data, &u.data);
                Ok(vec![wanted[0].then_some(dg), wanted[1].then_some(du)])
            }
            NodeKind::Add => Ok(vec![wanted[0].then(|| dout.clone()), wanted[1].then_some(dout)]),
            NodeKind::HeadLoss { dx } => {
                let g = dout.data[0];
                Ok(vec![dx.as_ref().map(|dx| {
                    let mut dx = dx.clone();
                    if g != 1.0 {
                        dx.data.iter_mut().for_each(|v| *v *= g);
                    }
                    dx
                })])
            }
            NodeKind::Segment { f } => segment_backward(f, inputs, dout, wanted),
            NodeKind::Custom(n) => n.backward(inputs, output, &dout, wanted),
        }
    }
}

/// Per-sequence slices of q/k/v/out/lse for [`attention_backward`].
fn attention_node_backward(inputs: &[&Tensor], out: &Tensor, dout: &Tensor, lse: &[f32], (d, scale, products, window): (AttnDims, f32, Products, Option<usize>)) -> Vec<Tensor> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let (mut dq, mut dk, mut dv) = (Tensor::to_overwrite(&q.shape), Tensor::to_overwrite(&k.shape), Tensor::to_overwrite(&v.shape));
    let (qw, kw, lw) = (d.q_len * d.n_head * d.head_dim, d.kv_len * d.n_kv_head * d.head_dim, d.q_len * d.n_head);
    for s in 0..q.len() / qw {
        let (qs, ks, ls) = (s * qw..(s + 1) * qw, s * kw..(s + 1) * kw, s * lw..(s + 1) * lw);
        let x = BackwardInputs {
            dout: &dout.data[qs.clone()],
            q: &q.data[qs.clone()],
            k: &k.data[ks.clone()],
            v: &v.data[ks.clone()],
            out: &out.data[qs.clone()],
            lse: &lse[ls],
            d,
            scale,
            window,
        };
        attention_backward_with(products, (&mut dq.data[qs], &mut dk.data[ks.clone()], &mut dv.data[ks]), x);
    }
    vec![dq, dk, dv]
}

/// Gradients `[dx, da, db]` of the LoRA branch (each only when `wanted`).
#[allow(clippy::too_many_arguments)]
fn lora_backward(
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    dout: &Tensor,
    xa: &[f32],
    scaling: f32,
    dropout: Option<Dropout>,
    wanted: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    let shapes = branch::Shapes::of(x, a, b)?;
    // `branch::backward` writes every element of each buffer it is given,
    // so reused buffers need no zeroing pass first.
    let buffer = |like: &Tensor| crate::tensor::overwritable(like.len());
    let mut grads = branch::Grads { dx: wanted[0].then(|| buffer(x)), da: wanted[1].then(|| buffer(a)), db: wanted[2].then(|| buffer(b)) };
    branch::backward(&mut grads, &dout.data, &x.data, &a.data, &b.data, xa, scaling, dropout, shapes);
    let wrap = |d: Option<Vec<f32>>, like: &Tensor| d.map(|d| Tensor { shape: like.shape.clone(), data: d });
    Ok([wrap(grads.dx, x), wrap(grads.da, a), wrap(grads.db, b)])
}

fn no_dropout(dropout: Option<Dropout>) -> bool {
    dropout.is_none_or(|d| d.p == 0.0)
}

/// The backward of a node whose projection carried its branch: `dX` and
/// `dxa` from one carried input-gradient pass, then `dA`, `dB` on the CPU.
/// Gradients `[x, x, a, b]` with `dX` in the second slot.
fn carried_lora_backward(proj: &dyn Projection, inputs: &[&Tensor], dout: &Tensor, xa: &[f32], scaling: f32, wanted: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let (x, a, b) = (inputs[0], inputs[2], inputs[3]);
    let shapes = branch::Shapes::of(x, a, b)?;
    let mut dx = Tensor::to_overwrite(&x.shape);
    let mut dxa = vec![0.0; shapes.tokens * shapes.rank];
    let mut db = wanted[3].then(|| Tensor::zeros(&b.shape));
    let lora = LoraFactors { a: &a.data, b: &b.data, rank: shapes.rank, scale: scaling };
    let db_slot = db.as_mut().map(|db| (xa, &mut db.data[..]));
    let carried = proj.apply_carrying_lora(Product { dir: Direction::InputGrad, input: &dout.data, tokens: shapes.tokens, out: &mut dx.data }, lora, &mut dxa, db_slot)?;
    if carried == Carried::No {
        return Err(Error::Unsupported(format!("{} carried its LoRA branch forward but not backward", proj.info().name)));
    }
    if let (Some(db), Carried::Branch) = (db.as_mut(), carried) {
        branch::grad_b(&mut db.data, &dout.data, xa, scaling, shapes);
    }
    // dA stays f32: X is not in tile order here, and rounding it into a
    // row-pair layout first measured no faster (a pass over X either way).
    let da = wanted[2].then(|| {
        let mut da = Tensor::zeros(&a.shape);
        branch::grad_a(&mut da.data, &dxa, &x.data, None, shapes);
        da
    });
    Ok(vec![None, Some(dx), da, db])
}

fn segment_backward(f: &SegmentFn, inputs: &[&Tensor], dout: Tensor, wanted: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let mut inner = Tape::new();
    let vars: Vec<Var> = inputs
        .iter()
        .zip(wanted)
        .map(|(t, &w)| if w { inner.param((*t).clone()) } else { inner.constant((*t).clone()) })
        .collect();
    let y = f(&mut inner, vars[0], &vars[1..])?;
    inner.backward_with(y, dout)?;
    Ok(vars.iter().map(|&v| inner.take_grad(v)).collect())
}

fn same_shape(what: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape != b.shape {
        return Err(Error::Shape { what: what.into(), expected: a.shape.clone(), got: b.shape.clone() });
    }
    Ok(())
}

impl Tape {
    /// `x W^T` through a frozen projection; `x: [.., in] -> [.., out]`.
    pub fn projection(&mut self, x: Var, proj: &Arc<dyn Projection>) -> Result<Var> {
        let _time = super::profile::timer("projection", true);
        let info = proj.info();
        let xv = self.value(x);
        if xv.last_dim() != info.in_features {
            return Err(Error::Shape {
                what: format!("input of {}", info.name),
                expected: vec![info.in_features],
                got: vec![xv.last_dim()],
            });
        }
        let tokens = xv.rows();
        let mut shape = xv.shape.clone();
        *shape.last_mut().expect("checked non-scalar") = info.out_features;
        let mut y = Tensor::to_overwrite(&shape);
        proj.apply(Direction::Forward, &xv.data, tokens, &mut y.data)?;
        Ok(self.push(NodeKind::Projection { proj: proj.clone() }, &[x], y))
    }

    /// The fused LoRA branch added to a base output:
    /// `base + scaling * drop(x) a^T b^T` with `a: [r, in]`, `b: [out, r]`.
    /// `a` and `b` may be any values on the tape (parameters, or outputs of a
    /// hypernetwork); gradients reach them either way.
    pub fn lora_add(&mut self, base: Var, x: Var, a: Var, b: Var, scaling: f32, dropout: Option<Dropout>) -> Result<Var> {
        let _time = super::profile::timer("lora", true);
        let (xv, av, bv, basev) = (self.value(x), self.value(a), self.value(b), self.value(base));
        let shapes = branch::Shapes::of(xv, av, bv)?;
        if basev.rows() != shapes.tokens || basev.last_dim() != shapes.out_f {
            return Err(Error::Shape {
                what: "lora_add base".into(),
                expected: vec![shapes.tokens, shapes.out_f],
                got: basev.shape.clone(),
            });
        }
        let mut xa = vec![0.0; shapes.tokens * shapes.rank];
        let mut y = Tensor::to_overwrite(&basev.shape);
        branch::forward_into(&mut y.data, &mut xa, &xv.data, &av.data, &bv.data, scaling, dropout, shapes);
        y.data.iter_mut().zip(&basev.data).for_each(|(y, base)| *y = base + *y);
        Ok(self.push(NodeKind::LoraAdd { scaling, dropout, xa }, &[base, x, a, b], y))
    }

    /// The frozen product and its LoRA branch in one node:
    /// `x W^T + scaling * drop(x) a^T b^T`, `x: [.., in] -> [.., out]`,
    /// `a: [r, in]`, `b: [out, r]`. When the projection carries the branch
    /// on its own pass ([`Projection::apply_carrying_lora`]) it does; else
    /// this gives bit-for-bit what [`Tape::projection`] followed by
    /// [`Tape::lora_add`] gives, with the branch run while the product is
    /// in flight (the forward's input half `xa`, the whole backward) and
    /// the forward's `s xa b^T` added into the product's output afterwards.
    pub fn projection_lora(&mut self, x: Var, proj: &Arc<dyn Projection>, a: Var, b: Var, scaling: f32, dropout: Option<Dropout>) -> Result<Var> {
        let _time = super::profile::timer("proj+lora", true);
        let info = proj.info();
        let (xv, av, bv) = (self.value(x), self.value(a), self.value(b));
        let shapes = branch::Shapes::of(xv, av, bv)?;
        if xv.last_dim() != info.in_features || shapes.out_f != info.out_features {
            return Err(Error::Shape {
                what: format!("input / LoRA B of {}", info.name),
                expected: vec![info.in_features, info.out_features],
                got: vec![xv.last_dim(), shapes.out_f],
            });
        }
        let mut shape = xv.shape.clone();
        *shape.last_mut().expect("checked non-scalar") = info.out_features;
        let mut y = Tensor::to_overwrite(&shape);
        let mut xa = vec![0.0; shapes.tokens * shapes.rank];
        let lora = LoraFactors { a: &av.data, b: &bv.data, rank: shapes.rank, scale: scaling };
        let carried = no_dropout(dropout) && proj.apply_carrying_lora(Product { dir: Direction::Forward, input: &xv.data, tokens: shapes.tokens, out: &mut y.data }, lora, &mut xa, None)? != Carried::No;
        if !carried {
            let mut side = || {
                branch::down(&mut xa, &xv.data, &av.data, dropout, shapes);
                Ok(())
            };
            proj.apply_overlapped(Product { dir: Direction::Forward, input: &xv.data, tokens: shapes.tokens, out: &mut y.data }, &mut side)?;
            // Straight into y: a separate [T, out] branch output plus an add
            // pass cost more than this product (measured, examples/bench_lora_branch.rs).
            branch::add_up(&mut y.data, &xa, &bv.data, scaling, shapes);
        }
        let kind = NodeKind::ProjectionLora { proj: proj.clone(), scaling, dropout, xa, carried };
        Ok(self.push(kind, &[x, x, a, b], y))
    }

    /// RMSNorm of `x` over rows of `weight.len()` features.
    pub fn rms_norm(&mut self, x: Var, weight: &Arc<Vec<f32>>, kind: NormWeight, eps: f32) -> Result<Var> {
        let _time = super::profile::timer("rmsnorm", true);
        let xv = self.value(x);
        if weight.is_empty() || xv.len() % weight.len() != 0 {
            return Err(Error::Shape { what: "rms_norm input".into(), expected: vec![weight.len()], got: xv.shape.clone() });
        }
        let mut y = Tensor::to_overwrite(&xv.shape);
        let mut rstd = vec![0.0; xv.len() / weight.len()];
        rmsnorm_forward(&mut y.data, &mut rstd, &xv.data, weight, kind, eps);
        Ok(self.push(NodeKind::RmsNorm { weight: weight.clone(), kind, eps, rstd }, &[x], y))
    }

    /// Rotary embedding of `x: [tokens, heads * head_dim]` at `positions`.
    pub fn rope(&mut self, x: Var, positions: &Arc<Vec<usize>>, heads: usize, head_dim: usize, inv_freq: &Arc<Vec<f32>>) -> Result<Var> {
        let _time = super::profile::timer("rope", true);
        let xv = self.value(x);
        if xv.len() != positions.len() * heads * head_dim || 2 * inv_freq.len() > head_dim {
            return Err(Error::Shape { what: "rope input".into(), expected: vec![positions.len(), heads * head_dim], got: xv.shape.clone() });
        }
        let mut y = xv.clone();
        rope_apply(&mut y.data, positions, heads, head_dim, inv_freq, false);
        let kind = NodeKind::Rope { positions: positions.clone(), heads, head_dim, inv_freq: inv_freq.clone() };
        Ok(self.push(kind, &[x], y))
    }

    /// Attention over sequences of `dims.q_len` rows (`dims.kv_len` must
    /// equal it: training has no cache). `q: [rows, n_head * head_dim]`,
    /// `k`, `v: [rows, n_kv_head * head_dim]`; its products (forward and
    /// backward) computed as `products` says.
    pub fn attention(&mut self, q: Var, k: Var, v: Var, dims: AttnDims, scale: f32, products: Products) -> Result<Var> {
        self.attention_window(q, k, v, dims, scale, products, None)
    }

    /// [`Tape::attention`] where, with `window = Some(w)`, each query sees
    /// only itself and the `w - 1` positions before it (Gemma 3's local
    /// layers); such calls compute in f32 whatever `products` says.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_window(&mut self, q: Var, k: Var, v: Var, dims: AttnDims, scale: f32, products: Products, window: Option<usize>) -> Result<Var> {
        let _time = super::profile::timer("attention", true);
        let (qv, kv, vv) = (self.value(q), self.value(k), self.value(v));
        let qw = dims.q_len * dims.n_head * dims.head_dim;
        let kw = dims.kv_len * dims.n_kv_head * dims.head_dim;
        let ok = dims.q_len == dims.kv_len && qw > 0 && dims.n_kv_head > 0 && dims.n_head % dims.n_kv_head == 0;
        if !ok || qv.len() % qw != 0 || kv.len() != qv.len() / qw * kw || vv.len() != kv.len() {
            return Err(Error::Shape { what: "attention q/k/v".into(), expected: vec![qw, kw], got: vec![qv.len(), kv.len(), vv.len()] });
        }
        let seqs = qv.len() / qw;
        let mut y = Tensor::to_overwrite(&qv.shape);
        let mut lse = vec![0.0; seqs * dims.q_len * dims.n_head];
        let lw = dims.q_len * dims.n_head;
        for s in 0..seqs {
            let (qs, ks) = (s * qw..(s + 1) * qw, s * kw..(s + 1) * kw);
            let (out, lse) = (&mut y.data[qs.clone()], &mut lse[s * lw..(s + 1) * lw]);
            match window {
                Some(_) => attention_forward_window(out, lse, &qv.data[qs], &kv.data[ks.clone()], &vv.data[ks], dims, scale, window),
                None => attention_forward_with(products, out, lse, &qv.data[qs], &kv.data[ks.clone()], &vv.data[ks], dims, scale),
            }
        }
        Ok(self.push(NodeKind::Attention { dims, scale, products, window, lse }, &[q, k, v], y))
    }

    /// `silu(gate) * up`.
    pub fn swiglu(&mut self, gate: Var, up: Var) -> Result<Var> {
        let _time = super::profile::timer("swiglu", true);
        same_shape("swiglu", self.value(gate), self.value(up))?;
        let mut y = Tensor::to_overwrite(&self.value(gate).shape);
        swiglu_forward(&mut y.data, &self.value(gate).data, &self.value(up).data);
        Ok(self.push(NodeKind::SwiGlu, &[gate, up], y))
    }

    /// `gelu_tanh(gate) * up`.
    pub fn geglu(&mut self, gate: Var, up: Var) -> Result<Var> {
        let _time = super::profile::timer("geglu", true);
        same_shape("geglu", self.value(gate), self.value(up))?;
        let mut y = Tensor::to_overwrite(&self.value(gate).shape);
        geglu_forward(&mut y.data, &self.value(gate).data, &self.value(up).data);
        Ok(self.push(NodeKind::GeGlu, &[gate, up], y))
    }

    /// `a + b` (residual connections).
    pub fn add(&mut self, a: Var, b: Var) -> Result<Var> {
        let _time = super::profile::timer("add", true);
        same_shape("add", self.value(a), self.value(b))?;
        let (av, bv) = (self.value(a), self.value(b));
        let y = Tensor { shape: av.shape.clone(), data: crate::tensor::sum(&av.data, &bv.data) };
        Ok(self.push(NodeKind::Add, &[a, b], y))
    }

    /// Vocabulary head and cross-entropy: `sum_t -log softmax(x_t W^T)[target_t]
    /// / denom` over targets `>= 0` (negative targets, e.g. -100, are ignored).
    /// `targets` are already shifted (target of row t is the next token).
    /// Processes `chunk` rows at a time; when `logits` is given, every row's
    /// logits are appended to it (for verification tools, not training).
    /// The whole head is one vocabulary slice here; see
    /// [`Tape::head_loss_sliced`].
    pub fn head_loss(
        &mut self,
        x: Var,
        head: &Arc<dyn Projection>,
        targets: &[i64],
        denom: f32,
        chunk: usize,
        logits: Option<&mut Vec<f32>>,
    ) -> Result<Var> {
        self.head_loss_sliced(x, std::slice::from_ref(head), targets, denom, chunk, logits)
    }

    /// [`Tape::head_loss`] with the head given as vocabulary slices
    /// (`[slice_i, hidden]` each, in vocabulary order), so no `[chunk, vocab]`
    /// logits buffer exists either (`ops/cross_entropy.rs`).
    pub fn head_loss_sliced(
        &mut self,
        x: Var,
        head: &[Arc<dyn Projection>],
        targets: &[i64],
        denom: f32,
        chunk: usize,
        logits: Option<&mut Vec<f32>>,
    ) -> Result<Var> {
        let _time = super::profile::timer("head+loss", true);
        let xv = self.value(x);
        let want_dx = self.needs_grad(x);
        let out = cross_entropy::head_forward_backward(head, &xv.data, xv.rows(), targets, denom, chunk, want_dx, logits)?;
        let dx = out.dx.map(|d| Tensor { shape: xv.shape.clone(), data: d });
        let loss = Tensor { shape: vec![1], data: vec![out.loss] };
        Ok(self.push(NodeKind::HeadLoss { dx }, &[x], loss))
    }

    /// Runs `f(tape, x, params)`. With `recompute` the segment's inner values
    /// are not kept: only `x` and `params` stay on the tape, and the backward
    /// reruns `f`. Gradients are bit-identical either way.
    pub fn segment(&mut self, f: &SegmentFn, x: Var, params: &[Var], recompute: bool) -> Result<Var> {
        if !recompute {
            return f(self, x, params);
        }
        let mut inner = Tape::new();
        let xi = inner.constant(self.value(x).clone());
        let pi: Vec<Var> = params.iter().map(|&p| inner.constant(self.value(p).clone())).collect();
        let yi = f(&mut inner, xi, &pi)?;
        let y = std::mem::replace(&mut inner.values[yi.0], Tensor::zeros(&[0]));
        drop(inner);
        let mut inputs = vec![x];
        inputs.extend_from_slice(params);
        Ok(self.push(NodeKind::Segment { f: f.clone() }, &inputs, y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu_projection::CpuProjection;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    /// Serves the product first and the side work after it, as an NPU
    /// projection whose reply arrives before the CPU finishes would.
    struct SideAfter(CpuProjection);

    impl Projection for SideAfter {
        fn info(&self) -> &ProjectionInfo {
            self.0.info()
        }
        fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
            self.0.apply(dir, input, tokens, out)
        }
        fn apply_overlapped(&self, p: Product<'_>, side: &mut dyn FnMut() -> Result<()>) -> Result<()> {
            self.0.apply(p.dir, p.input, p.tokens, p.out)?;
            side()
        }
    }

    fn values(n: usize, k: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * k).sin() * 0.8).collect()
    }

    /// Three adapted projections read the same input (as q, k, v do), then a
    /// scalar loss; returns the loss and the gradients of x, A and B.
    fn run(proj: &Arc<dyn Projection>, fused: bool) -> Vec<Vec<u32>> {
        let (t, d, r) = (5, 6, 2);
        let mut tape = Tape::new();
        let x = tape.param(Tensor::from_vec(&[t, d], values(t * d, 0.7)).unwrap());
        let a = tape.param(Tensor::from_vec(&[r, d], values(r * d, 1.3)).unwrap());
        let b = tape.param(Tensor::from_vec(&[d, r], values(d * r, 0.4)).unwrap());
        let mut sum = None;
        for seed in 0..3 {
            let dropout = Some(Dropout { p: 0.3, seed });
            let y = if fused {
                tape.projection_lora(x, proj, a, b, 2.0, dropout).unwrap()
            } else {
                let y = tape.projection(x, proj).unwrap();
                tape.lora_add(y, x, a, b, 2.0, dropout).unwrap()
            };
            sum = Some(match sum {
                None => y,
                Some(s) => tape.add(s, y).unwrap(),
            });
        }
        let head: Arc<dyn Projection> = Arc::new(CpuProjection::new(ProjectionInfo { name: "head".into(), kind: ProjectionKind::Mlp, out_features: 7, in_features: d }, values(7 * d, 0.9)).unwrap());
        let loss = tape.head_loss(sum.unwrap(), &head, &[1, 4, -100, 6, 0], 4.0, 2, None).unwrap();
        tape.backward(loss).unwrap();
        let mut out = vec![tape.value(loss).data.iter().map(|v| v.to_bits()).collect()];
        out.extend([x, a, b].map(|v| tape.grad(v).unwrap().data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()));
        out
    }

    #[test]
    fn fused_projection_lora_matches_the_unfused_pair_bit_for_bit() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Attention, out_features: 6, in_features: 6 };
        let w = values(36, 0.23);
        let cpu: Arc<dyn Projection> = Arc::new(CpuProjection::new(info.clone(), w.clone()).unwrap());
        let late: Arc<dyn Projection> = Arc::new(SideAfter(CpuProjection::new(info, w).unwrap()));
        let want = run(&cpu, false);
        assert!(want[1].iter().any(|&v| v != 0), "x gets a gradient");
        assert_eq!(run(&cpu, true), want, "fused");
        assert_eq!(run(&late, true), want, "fused, side work after the product");
    }

    #[test]
    fn fused_node_rejects_mismatched_b() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Mlp, out_features: 4, in_features: 3 };
        let proj: Arc<dyn Projection> = Arc::new(CpuProjection::new(info, vec![0.5; 12]).unwrap());
        let mut tape = Tape::new();
        let x = tape.constant(Tensor::zeros(&[2, 3]));
        let a = tape.param(Tensor::zeros(&[2, 3]));
        let b = tape.param(Tensor::zeros(&[5, 2]));
        let err = tape.projection_lora(x, &proj, a, b, 1.0, None).unwrap_err().to_string();
        assert!(err.contains("LoRA B of p"), "{err}");
    }

    /// `forget` drops a projection output that only an add reads, keeps
    /// values a backward reads (attention's inputs and output, leaves), and
    /// leaves the gradients bit-identical.
    #[test]
    fn forget_drops_only_values_no_backward_reads() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Attention, out_features: 4, in_features: 4 };
        let proj: Arc<dyn Projection> = Arc::new(CpuProjection::new(info.clone(), values(16, 0.31)).unwrap());
        let head: Arc<dyn Projection> = Arc::new(CpuProjection::new(ProjectionInfo { out_features: 5, ..info }, values(20, 0.7)).unwrap());
        let run = |forget: bool| {
            let mut tape = Tape::new();
            let x = tape.param(Tensor::from_vec(&[3, 4], values(12, 0.9)).unwrap());
            let p = tape.projection(x, &proj).unwrap();
            let dims = AttnDims { q_len: 3, kv_len: 3, n_head: 2, n_kv_head: 2, head_dim: 2, causal: true };
            let kv = tape.projection(x, &proj).unwrap();
            let a = tape.attention(p, kv, kv, dims, 0.5, Products::F32).unwrap();
            let s = tape.add(a, p).unwrap();
            if forget {
                assert!(!tape.forget(x), "a leaf");
                assert!(!tape.forget(p), "attention reads its query");
                assert!(!tape.forget(a), "attention reads its output");
                let q = tape.projection(s, &proj).unwrap();
                let t = tape.add(q, s).unwrap();
                assert!(tape.forget(q), "only an add reads it");
                assert!(tape.value(q).is_empty());
                let loss = tape.head_loss(t, &head, &[1, 4, 0], 3.0, 2, None).unwrap();
                tape.backward(loss).unwrap();
            } else {
                let q = tape.projection(s, &proj).unwrap();
                let t = tape.add(q, s).unwrap();
                let loss = tape.head_loss(t, &head, &[1, 4, 0], 3.0, 2, None).unwrap();
                tape.backward(loss).unwrap();
            }
            tape.grad(x).unwrap().data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        assert_eq!(run(true), run(false));
    }

    /// `forget_recomputable` drops an RMSNorm output read by two fused
    /// LoRA projections and a SwiGLU output read by a third; the backward
    /// rebuilds them and every gradient stays bit-identical. Values whose
    /// node cannot be rebuilt (a projection) are refused.
    #[test]
    fn recomputable_values_are_rebuilt_bit_identically() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Mlp, out_features: 4, in_features: 4 };
        let proj: Arc<dyn Projection> = Arc::new(CpuProjection::new(info.clone(), values(16, 0.31)).unwrap());
        let head: Arc<dyn Projection> = Arc::new(CpuProjection::new(ProjectionInfo { out_features: 5, ..info }, values(20, 0.7)).unwrap());
        let norm = Arc::new(values(4, 0.2));
        let run = |forget: bool| {
            let mut tape = Tape::new();
            let x = tape.param(Tensor::from_vec(&[3, 4], values(12, 0.9)).unwrap());
            let ab: Vec<Var> = (0..6).map(|i| tape.param(Tensor::from_vec(&[2, 4], values(8, 0.4 + i as f32)).unwrap())).collect();
            let bs: Vec<Var> = (0..3).map(|i| tape.param(Tensor::from_vec(&[4, 2], values(8, 1.3 + i as f32)).unwrap())).collect();
            let h = tape.rms_norm(x, &norm, NormWeight::Plain, 1e-6).unwrap();
            let g = tape.projection_lora(h, &proj, ab[0], bs[0], 0.5, None).unwrap();
            let u = tape.projection_lora(h, &proj, ab[1], bs[1], 0.5, None).unwrap();
            let m = tape.swiglu(g, u).unwrap();
            let d = tape.projection_lora(m, &proj, ab[2], bs[2], 0.5, None).unwrap();
            let before = tape.value_bytes();
            if forget {
                assert!(!tape.forget_recomputable(d), "a projection is not rebuilt");
                assert!(tape.forget_recomputable(h) && tape.forget_recomputable(m));
                assert!(tape.value(h).is_empty() && tape.value(m).is_empty());
                assert_eq!(tape.value_bytes(), before - 4 * 24);
            }
            let loss = tape.head_loss(d, &head, &[1, 4, 0], 3.0, 2, None).unwrap();
            tape.backward(loss).unwrap();
            if forget {
                assert!(tape.value(h).is_empty() && tape.value(m).is_empty(), "dropped again after the backward");
            }
            [x, ab[0], ab[1], ab[2], bs[0], bs[1], bs[2]].map(|v| tape.grad(v).unwrap().data.iter().map(|g| g.to_bits()).collect::<Vec<u32>>())
        };
        let want = run(false);
        assert!(want.iter().all(|g| g.iter().any(|&b| b != 0)));
        assert_eq!(run(true), want);
    }
}

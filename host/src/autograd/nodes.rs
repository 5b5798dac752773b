//! Every kind of node the tape knows, in one enum, with its forward builder
//! (a method on [`Tape`]) and its backward. Nodes are coarse and fused; each
//! saves only what its backward needs, named in the variant. The arithmetic
//! lives in forward/backward slice functions (`ops/`, `lora/branch.rs`).
use super::tape::{Tape, Var};
use crate::lora::branch::{self, Dropout};
use crate::ops::cross_entropy;
use crate::projection::{Direction, Projection};
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
    /// `Y = A + B`, same shapes. Inputs `[a, b]`.
    Add,
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
}

impl NodeKind {
    /// Gradients of the inputs given `dout`; `None` where not `wanted`.
    pub(crate) fn backward(
        &self,
        inputs: &[&Tensor],
        _output: &Tensor,
        dout: Tensor,
        wanted: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        match self {
            NodeKind::Projection { proj } => {
                let x = inputs[0];
                let mut dx = Tensor::zeros(&x.shape);
                proj.apply(Direction::InputGrad, &dout.data, x.rows(), &mut dx.data)?;
                Ok(vec![Some(dx)])
            }
            NodeKind::LoraAdd { scaling, dropout, xa } => {
                let (x, a, b) = (inputs[1], inputs[2], inputs[3]);
                let shapes = branch::Shapes::of(x, a, b)?;
                let mut grads = branch::Grads {
                    dx: wanted[1].then(|| vec![0.0; x.len()]),
                    da: wanted[2].then(|| vec![0.0; a.len()]),
                    db: wanted[3].then(|| vec![0.0; b.len()]),
                };
                branch::backward(&mut grads, &dout.data, &x.data, &a.data, &b.data, xa, *scaling, *dropout, shapes);
                let wrap = |d: Option<Vec<f32>>, like: &Tensor| d.map(|d| Tensor { shape: like.shape.clone(), data: d });
                let dbase = wanted[0].then(|| dout.clone());
                Ok(vec![dbase, wrap(grads.dx, x), wrap(grads.da, a), wrap(grads.db, b)])
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
        }
    }
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
        let mut y = Tensor::zeros(&shape);
        proj.apply(Direction::Forward, &xv.data, tokens, &mut y.data)?;
        Ok(self.push(NodeKind::Projection { proj: proj.clone() }, &[x], y))
    }

    /// The fused LoRA branch added to a base output:
    /// `base + scaling * drop(x) a^T b^T` with `a: [r, in]`, `b: [out, r]`.
    /// `a` and `b` may be any values on the tape (parameters, or outputs of a
    /// hypernetwork); gradients reach them either way.
    pub fn lora_add(&mut self, base: Var, x: Var, a: Var, b: Var, scaling: f32, dropout: Option<Dropout>) -> Result<Var> {
        let (xv, av, bv, basev) = (self.value(x), self.value(a), self.value(b), self.value(base));
        let shapes = branch::Shapes::of(xv, av, bv)?;
        if basev.rows() != shapes.tokens || basev.last_dim() != shapes.out_f {
            return Err(Error::Shape {
                what: "lora_add base".into(),
                expected: vec![shapes.tokens, shapes.out_f],
                got: basev.shape.clone(),
            });
        }
        let mut y = basev.clone();
        let mut xa = vec![0.0; shapes.tokens * shapes.rank];
        branch::forward(&mut y.data, &mut xa, &xv.data, &av.data, &bv.data, scaling, dropout, shapes);
        Ok(self.push(NodeKind::LoraAdd { scaling, dropout, xa }, &[base, x, a, b], y))
    }

    /// `a + b` (residual connections).
    pub fn add(&mut self, a: Var, b: Var) -> Result<Var> {
        same_shape("add", self.value(a), self.value(b))?;
        let mut y = self.value(a).clone();
        y.data.iter_mut().zip(&self.value(b).data).for_each(|(y, b)| *y += b);
        Ok(self.push(NodeKind::Add, &[a, b], y))
    }

    /// Vocabulary head and cross-entropy: `sum_t -log softmax(x_t W^T)[target_t]
    /// / denom` over targets `>= 0` (negative targets, e.g. -100, are ignored).
    /// `targets` are already shifted (target of row t is the next token).
    /// Processes `chunk` rows at a time; when `logits` is given, every row's
    /// logits are appended to it (for verification tools, not training).
    pub fn head_loss(
        &mut self,
        x: Var,
        head: &Arc<dyn Projection>,
        targets: &[i64],
        denom: f32,
        chunk: usize,
        logits: Option<&mut Vec<f32>>,
    ) -> Result<Var> {
        let xv = self.value(x);
        let want_dx = self.needs_grad(x);
        let out = cross_entropy::head_forward_backward(head.as_ref(), &xv.data, xv.rows(), targets, denom, chunk, want_dx, logits)?;
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

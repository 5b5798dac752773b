//! The one reverse walk. Nodes were appended in execution order, so
//! iterating them backwards visits every node after all its consumers.
use super::tape::{Node, Tape, Var};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::ops::Not;

impl Tape {
    /// Back-propagates from the scalar `loss` (seed gradient 1).
    pub fn backward(&mut self, loss: Var) -> Result<()> {
        if self.value(loss).len() != 1 {
            return Err(Error::Shape {
                what: "backward: loss must be a scalar".into(),
                expected: vec![1],
                got: self.value(loss).shape.clone(),
            });
        }
        let seed = Tensor { shape: self.value(loss).shape.clone(), data: vec![1.0] };
        self.backward_with(loss, seed)
    }

    /// Back-propagates the gradient `grad` of `out` (same shape as `out`).
    /// Gradients of parameters accumulate (gradient accumulation across
    /// calls works by not clearing them); intermediate ones are freed.
    pub fn backward_with(&mut self, out: Var, grad: Tensor) -> Result<()> {
        if grad.shape != self.value(out).shape {
            return Err(Error::Shape {
                what: "backward seed gradient".into(),
                expected: self.value(out).shape.clone(),
                got: grad.shape.clone(),
            });
        }
        accumulate(&mut self.grads[out.0], grad);
        let Tape { values, needs_grad, grads, nodes, rebuild } = self;
        for (at, node) in nodes.iter().enumerate().rev() {
            if rebuild[node.output.0] == Some(at) {
                // Its last reader has run: drop the rebuilt value again.
                values[node.output.0].data = Vec::new();
            }
            if !needs_grad[node.output.0] {
                continue;
            }
            let Some(dout) = grads[node.output.0].take() else { continue };
            rebuild_inputs(node, values, nodes, rebuild)?;
            let wanted: Vec<bool> = node.inputs.iter().map(|v| needs_grad[v.0]).collect();
            let inputs: Vec<&Tensor> = node.inputs.iter().map(|v| &values[v.0]).collect();
            let timer = matches!(node.kind, super::nodes::NodeKind::Segment { .. }).not().then(|| super::profile::timer(node.kind.name(), false));
            let dinputs = node.kind.backward(&inputs, &values[node.output.0], dout, &wanted)?;
            drop(timer);
            for ((v, d), want) in node.inputs.iter().zip(dinputs).zip(&wanted) {
                if let (Some(d), true) = (d, want) {
                    accumulate(&mut grads[v.0], d);
                }
            }
        }
        Ok(())
    }

    /// Forgets all gradients (start of an optimizer step).
    pub fn zero_grads(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
    }
}

/// Rebuilds the inputs of `node` that [`Tape::forget_recomputable`] dropped
/// and that `node`'s backward reads (once; later readers find them there).
fn rebuild_inputs(node: &Node, values: &mut [Tensor], nodes: &[Node], rebuild: &[Option<usize>]) -> Result<()> {
    for (i, v) in node.inputs.iter().enumerate() {
        let Some(at) = rebuild[v.0] else { continue };
        if !values[v.0].data.is_empty() || !node.kind.reads_input(i) {
            continue;
        }
        let maker = &nodes[at];
        let _timer = super::profile::timer(maker.kind.name(), false);
        let inputs: Vec<&Tensor> = maker.inputs.iter().map(|u| &values[u.0]).collect();
        let again = maker.kind.forward_again(&inputs).ok_or_else(|| Error::Unsupported(format!("rebuilding a {} output", maker.kind.name())))?;
        values[v.0] = again;
    }
    Ok(())
}

/// `slot += grad` (or `slot = grad` when empty). The left-to-right order of
/// additions is fixed by the walk, which keeps runs bit-identical.
fn accumulate(slot: &mut Option<Tensor>, grad: Tensor) {
    match slot {
        None => *slot = Some(grad),
        Some(acc) => crate::tensor::add_assign(&mut acc.data, &grad.data),
    }
}

//! The tape: an append-only arena of values and the nodes that made them.
//!
//! Every value (parameter, constant or node output) gets a [`Var`] index.
//! Nodes are appended in execution order, so walking them backwards is
//! already a topological order (`backward.rs`); there is no graph to sort.
use super::nodes::NodeKind;
use crate::tensor::Tensor;

/// Handle to a value on a [`Tape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Var(pub(crate) usize);

/// One recorded operation: what it was, what it read, what it wrote.
pub(crate) struct Node {
    pub kind: NodeKind,
    pub inputs: Vec<Var>,
    pub output: Var,
}

/// Values, their gradients and the nodes between them.
#[derive(Default)]
pub struct Tape {
    pub(crate) values: Vec<Tensor>,
    pub(crate) needs_grad: Vec<bool>,
    pub(crate) grads: Vec<Option<Tensor>>,
    pub(crate) nodes: Vec<Node>,
    /// Per value: the node that rebuilds it in the backward, when
    /// [`Tape::forget_recomputable`] dropped it after the forward.
    pub(crate) rebuild: Vec<Option<usize>>,
}

impl Tape {
    /// An empty tape.
    pub fn new() -> Self {
        Self::default()
    }

    fn push_value(&mut self, value: Tensor, needs_grad: bool) -> Var {
        self.values.push(value);
        self.needs_grad.push(needs_grad);
        self.grads.push(None);
        self.rebuild.push(None);
        Var(self.values.len() - 1)
    }

    /// A value that receives no gradient (token embeddings, masks).
    pub fn constant(&mut self, value: Tensor) -> Var {
        self.push_value(value, false)
    }

    /// A value whose gradient [`Tape::backward`] computes and keeps (LoRA
    /// factors, hypernetwork weights).
    pub fn param(&mut self, value: Tensor) -> Var {
        self.push_value(value, true)
    }

    /// Records a node; its output needs a gradient when any input does.
    pub(crate) fn push(&mut self, kind: NodeKind, inputs: &[Var], value: Tensor) -> Var {
        let needs_grad = inputs.iter().any(|v| self.needs_grad[v.0]);
        let output = self.push_value(value, needs_grad);
        self.nodes.push(Node { kind, inputs: inputs.to_vec(), output });
        output
    }

    /// Records a node of a kind defined outside the tape
    /// ([`super::CustomNode`]) whose forward gave `value`.
    pub fn push_custom(&mut self, node: Box<dyn super::CustomNode>, inputs: &[Var], value: Tensor) -> Var {
        self.push(NodeKind::Custom(node), inputs, value)
    }

    /// The value of `v`.
    pub fn value(&self, v: Var) -> &Tensor {
        &self.values[v.0]
    }

    /// Whether `v` takes part in the backward pass.
    pub fn needs_grad(&self, v: Var) -> bool {
        self.needs_grad[v.0]
    }

    /// The gradient of `v` after [`Tape::backward`]; kept for values that were
    /// created with [`Tape::param`] (intermediate gradients are freed as the
    /// walk passes them).
    pub fn grad(&self, v: Var) -> Option<&Tensor> {
        self.grads[v.0].as_ref()
    }

    /// Moves the gradient of `v` out of the tape.
    pub fn take_grad(&mut self, v: Var) -> Option<Tensor> {
        self.grads[v.0].take()
    }

    /// Drops the value of `v`, a node output that no later forward reads
    /// (the caller's promise), when no recorded backward reads it either;
    /// returns whether it was dropped. Activation memory: e.g. q before
    /// RoPE or a residual branch after its add are read by no backward.
    pub fn forget(&mut self, v: Var) -> bool {
        let mut produced = false;
        for n in &self.nodes {
            if n.output == v {
                produced = true;
                if n.kind.reads_output() {
                    return false;
                }
            }
            if n.inputs.iter().enumerate().any(|(i, &x)| x == v && n.kind.reads_input(i)) {
                return false;
            }
        }
        if produced {
            self.values[v.0] = Tensor { shape: vec![0], data: Vec::new() };
        }
        produced
    }

    /// Drops the value of `v` although backwards read it, when its node is
    /// cheap to run again (RMSNorm, SwiGLU) and that node's inputs are kept:
    /// the backward rebuilds it, bit-identical, just before the first
    /// backward that reads it and drops it again at its own node. Selective
    /// recompute: e.g. the normed input of q/k/v or the SwiGLU output costs
    /// a layer's worth of f32 activations and an elementwise pass to rebuild.
    /// The caller promises no later forward reads `v`. Returns whether it
    /// was dropped.
    pub fn forget_recomputable(&mut self, v: Var) -> bool {
        let Some(at) = self.nodes.iter().rposition(|n| n.output == v) else { return false };
        let node = &self.nodes[at];
        let kept = node.inputs.iter().all(|u| self.values[u.0].data.len() == self.values[u.0].shape.iter().product::<usize>());
        if !kept || !node.kind.rebuildable() || self.rebuild[v.0].is_some() {
            return false;
        }
        // Straight back to malloc, not to the spare pool (tensor::spare):
        // the forward forgets these while asking for other lengths, so
        // pooled they sat idle (measured: peak RSS 559 -> 701 MiB).
        self.values[v.0].data = Vec::new();
        self.rebuild[v.0] = Some(at);
        true
    }

    /// Number of recorded nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Bytes held by values and gradients (node-saved buffers excluded).
    pub fn value_bytes(&self) -> usize {
        let grads: usize = self.grads.iter().flatten().map(|g| g.len()).sum();
        let values: usize = self.values.iter().map(|t| t.len()).sum();
        4 * (grads + values)
    }
}

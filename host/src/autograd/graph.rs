//! What the training loop needs from a model: the projections an adapter can
//! target, and a way to record the loss of a batch on a tape with the LoRA
//! factors attached. Architectures implement [`TrainableModel`]; the loop,
//! `hexlora grad` and the hypernetwork only talk to this trait.
use super::{Tape, Var};
use crate::lora::branch::Dropout;
use crate::projection::{Projection, ProjectionInfo};
use crate::base::counter_rng;
use crate::Result;
use std::collections::HashMap;
use std::sync::Arc;

/// Token sequences of equal length with aligned labels, Hugging Face style:
/// `labels[b][t]` is the token expected at position `t` (the shift to "next
/// token" happens in [`Batch::targets`]); `-100` is ignored.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Batch {
    /// `[batch, seq]` token ids.
    pub input_ids: Vec<Vec<u32>>,
    /// `[batch, seq]` labels.
    pub labels: Vec<Vec<i64>>,
}

impl Batch {
    /// `(batch, seq)`, checking that every row has the same length.
    pub fn dims(&self) -> Result<(usize, usize)> {
        let seq = self.input_ids.first().map_or(0, Vec::len);
        let rows_ok = self.input_ids.iter().all(|r| r.len() == seq) && self.labels.len() == self.input_ids.len();
        if seq == 0 || !rows_ok || self.labels.iter().any(|r| r.len() != seq) {
            return Err(crate::Error::invalid("batch", "input_ids and labels must be non-empty rows of one common length"));
        }
        Ok((self.input_ids.len(), seq))
    }

    /// Shifted targets `[batch * seq]`: row `t` predicts `labels[t + 1]`; the
    /// last position of each sequence has no target (-100).
    pub fn targets(&self) -> Vec<i64> {
        self.labels.iter().flat_map(|row| row.iter().skip(1).copied().chain([-100])).collect()
    }

    /// Number of non-ignored shifted targets.
    pub fn target_count(&self) -> usize {
        self.targets().iter().filter(|&&t| t >= 0).count()
    }
}

/// The LoRA factors on the tape, by projection name, and how to apply them.
pub struct LoraVars {
    /// `(A, B)` per adapted projection.
    pub factors: HashMap<String, (Var, Var)>,
    /// `alpha / r`.
    pub scaling: f32,
    /// Dropout probability (0 for evaluation and `hexlora grad`).
    pub dropout: f32,
    /// Seed of this micro-batch's dropout masks.
    pub dropout_seed: u64,
}

impl LoraVars {
    /// Adds the LoRA branch of projection `name` (if adapted) to `base`, the
    /// projection's output for input `x`. `slot` is a per-call index that
    /// makes dropout masks differ between projections.
    pub fn apply(&self, tape: &mut Tape, name: &str, base: Var, x: Var, slot: u64) -> Result<Var> {
        let Some(&(a, b)) = self.factors.get(name) else { return Ok(base) };
        let dropout = (self.dropout > 0.0).then(|| Dropout { p: self.dropout, seed: counter_rng::derive(self.dropout_seed, slot) });
        tape.lora_add(base, x, a, b, self.scaling, dropout)
    }
}

/// Per-call switches of the training graph.
#[derive(Clone, Debug, Default)]
pub struct GraphOptions {
    /// Layers (by index) that keep only their input and recompute their
    /// forward in the backward pass.
    pub recompute_layers: Vec<bool>,
    /// Token rows per chunk of the vocabulary head.
    pub head_chunk: usize,
    /// Divide the summed token loss by this (defaults to the batch's target
    /// count): gradient accumulation passes the whole step's count.
    pub loss_denominator: Option<f32>,
    /// Record each adapted projection as two nodes (frozen product, then
    /// LoRA branch) instead of the fused `projection_lora` node. Same bits
    /// either way; the split runtime's step-time table compares the two.
    pub unfused_lora: bool,
}

impl GraphOptions {
    /// What the summed token loss of `targets` is divided by:
    /// `loss_denominator`, or the count of real (non-negative) targets.
    pub fn denominator(&self, targets: &[i64]) -> f32 {
        self.loss_denominator.unwrap_or(targets.iter().filter(|&&t| t >= 0).count().max(1) as f32)
    }
}

/// `(batch, seq)` of token rows, checking they are non-empty and of one
/// common length (what [`TrainableModel::hidden_states`] accepts).
pub fn token_rows(input_ids: &[Vec<u32>]) -> Result<(usize, usize)> {
    let seq = input_ids.first().map_or(0, Vec::len);
    if seq == 0 || input_ids.iter().any(|r| r.len() != seq) {
        return Err(crate::Error::invalid("input_ids", "must be non-empty rows of one common length"));
    }
    Ok((input_ids.len(), seq))
}

/// One layer's LoRA parameters for a tape segment: the `(A, B)` vars of the
/// adapted projections among `proj`, flattened in order, and per projection
/// the index of its pair in them (`None`: not adapted).
pub fn layer_lora_params(lora: &LoraVars, proj: &[Arc<dyn Projection>]) -> (Vec<Var>, Vec<Option<usize>>) {
    let mut params = Vec::new();
    let names = proj
        .iter()
        .map(|p| {
            lora.factors.get(&p.info().name).map(|&(a, b)| {
                params.extend([a, b]);
                params.len() / 2 - 1
            })
        })
        .collect();
    (params, names)
}

/// The [`ProjectionInfo`] of every projection of `layers`, in model order.
pub fn projection_infos<'a>(layers: impl IntoIterator<Item = &'a [Arc<dyn Projection>]>) -> Vec<ProjectionInfo> {
    layers.into_iter().flat_map(|l| l.iter().map(|p| p.info().clone())).collect()
}

/// A model the training engine can differentiate.
pub trait TrainableModel: Send + Sync {
    /// Every frozen projection, in model order (LoRA targets come from here).
    fn projections(&self) -> Vec<ProjectionInfo>;
    /// Number of decoder layers (for the activation budget).
    fn layer_count(&self) -> usize;
    /// Rough bytes of saved activations per token per layer, for the budget.
    fn activation_bytes_per_token_layer(&self) -> usize;
    /// Records the forward of `batch` with `lora` attached and returns the
    /// scalar mean loss. When `logits` is given, `[batch * seq, vocab]`
    /// logits are appended to it.
    fn loss(&self, tape: &mut Tape, batch: &Batch, lora: &LoraVars, opts: &GraphOptions, logits: Option<&mut Vec<f32>>) -> Result<Var>;
    /// Width of the hidden states (the embedding of one token).
    fn hidden_size(&self) -> usize;
    /// Records the layers and the final norm for `input_ids` (`[batch,
    /// seq]`, equal lengths) with `lora` attached and returns the normed
    /// hidden states `[batch * seq, hidden]`: what [`TrainableModel::loss`]
    /// feeds the head. `causal = false` lets every token attend to the whole
    /// sequence in the attention layers (the hypernetwork's embedder); a
    /// recurrent mixer (Qwen3.5's Gated DeltaNet) reads only the past either
    /// way. `recompute_layers` as in [`GraphOptions::recompute_layers`].
    fn hidden_states(&self, tape: &mut Tape, input_ids: &[Vec<u32>], lora: &LoraVars, recompute_layers: &[bool], causal: bool) -> Result<Var>;
    /// The frozen vocabulary head (`[vocab, hidden]`).
    fn head(&self) -> &Arc<dyn Projection>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_shift_and_ignore_the_last_position() {
        let b = Batch { input_ids: vec![vec![5, 6, 7], vec![1, 2, 3]], labels: vec![vec![-100, 6, 7], vec![1, -100, 3]] };
        assert_eq!(b.targets(), vec![6, 7, -100, -100, 3, -100]);
        assert_eq!(b.target_count(), 3);
        assert_eq!(b.dims().unwrap(), (2, 3));
        let ragged = Batch { input_ids: vec![vec![1, 2], vec![3]], labels: vec![vec![1, 2], vec![3]] };
        assert!(ragged.dims().is_err());
    }
}

/// Attaches `modules` (name, A, B) as parameters on `tape`.
pub fn lora_params(tape: &mut Tape, modules: &[crate::lora::LoraModule]) -> (HashMap<String, (Var, Var)>, Vec<(Var, Var)>) {
    let mut map = HashMap::new();
    let mut order = Vec::new();
    for m in modules {
        let pair = (tape.param(m.a.clone()), tape.param(m.b.clone()));
        map.insert(m.name.clone(), pair);
        order.push(pair);
    }
    (map, order)
}

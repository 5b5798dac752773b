//! One forward + backward of a batch with an adapter attached, no optimizer:
//! what `hexlora grad` writes and what the PyTorch fixtures check.
use crate::autograd::graph::lora_params;
use crate::autograd::graph::{Batch, GraphOptions, LoraVars, TrainableModel};
use crate::autograd::Tape;
use crate::lora::peft::peft_key;
use crate::base::tensor_file::TensorFile;
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::Result;

/// Loss, logits and the adapter's gradients for one batch.
pub struct GradResult {
    /// Mean loss over non-ignored targets.
    pub loss: f32,
    /// `[batch, seq, vocab]` when asked for.
    pub logits: Option<Tensor>,
    /// Gradient per adapter tensor, under its PEFT key.
    pub grads: TensorFile,
}

/// Forward + backward with dropout off. `opts` selects recompute etc.
pub fn compute_grads(model: &dyn TrainableModel, adapter: &Adapter, batch: &Batch, opts: &GraphOptions, want_logits: bool) -> Result<GradResult> {
    adapter.check(&model.projections())?;
    let (b, seq) = batch.dims()?;
    let mut tape = Tape::new();
    let (factors, order) = lora_params(&mut tape, &adapter.modules);
    let lora = LoraVars { factors, scaling: adapter.config.scaling(), dropout: 0.0, dropout_seed: 0 };
    let mut logits = want_logits.then(Vec::new);
    let loss = model.loss(&mut tape, batch, &lora, opts, logits.as_mut())?;
    tape.backward(loss)?;
    let mut grads = TensorFile::default();
    for (m, (a, bv)) in adapter.modules.iter().zip(order) {
        for (which, v, like) in [("A", a, &m.a), ("B", bv, &m.b)] {
            let g = tape.take_grad(v).unwrap_or_else(|| Tensor::zeros(&like.shape));
            grads.tensors.insert(peft_key(&m.name, which), g);
        }
    }
    let logits = match logits {
        Some(l) => {
            let vocab = l.len() / (b * seq).max(1);
            Some(Tensor::from_vec(&[b, seq, vocab], l)?)
        }
        None => None,
    };
    Ok(GradResult { loss: tape.value(loss).data[0], logits, grads })
}

/// Mean token loss of `data` under `adapter` (dropout off, forward only:
/// the factors are constants, so no gradient work is recorded).
pub fn evaluate(model: &dyn TrainableModel, adapter: &Adapter, data: &[Batch]) -> Result<f32> {
    let (mut total, mut count) = (0f64, 0usize);
    for batch in data {
        let mut tape = Tape::new();
        let factors = adapter.modules.iter().map(|m| (m.name.clone(), (tape.constant(m.a.clone()), tape.constant(m.b.clone())))).collect();
        let lora = LoraVars { factors, scaling: adapter.config.scaling(), dropout: 0.0, dropout_seed: 0 };
        let n = batch.target_count();
        let loss = model.loss(&mut tape, batch, &lora, &GraphOptions::default(), None)?;
        total += tape.value(loss).data[0] as f64 * n as f64;
        count += n;
    }
    Ok((total / count.max(1) as f64) as f32)
}

//! The embedder: the frozen target LLM with a trainable embedder LoRA,
//! attention made bidirectional (LLM2Vec), hidden states mean-pooled and
//! RMS-normalised into one user embedding.
//!
//! ```text
//! H = llm_bidirectional(context; embedder LoRA)     [T, E]  (on the tape)
//! m = mean_{t pooled} H[t]                           [E]
//! e = m / sqrt(mean(m^2) + eps)                      [E]
//! ```
//!
//! The context is one unpadded sequence; the pooled rows are all of them or,
//! with [`crate::hyper::Pool::Responses`], the responses' tokens only
//! ([`Context::pooled`]). The pooling and normalisation sit outside the tape
//! as a forward/backward pair; their gradient seeds the tape at `H`.
use super::users::Context;
use crate::base::counter_rng;
use crate::autograd::{Tape, Var};
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::autograd::graph::TrainableModel;
use crate::autograd::graph::LoraVars;
use crate::{Error, Result};

/// Keeps the embedding finite for an all-zero mean.
const NORM_EPS: f32 = 1e-6;

/// One recorded embedder forward, ready for its backward.
pub struct EmbedPass {
    tape: Tape,
    hidden: Var,
    /// `(A, B)` vars of the embedder LoRA, in module order.
    factors: Vec<(Var, Var)>,
    /// Which rows of `H` were pooled (`None` = all).
    pooled: Option<Vec<bool>>,
    /// `1 / sqrt(mean(m^2) + eps)`.
    rstd: f32,
    /// The user embedding `e: [E]`.
    pub embedding: Vec<f32>,
}

/// Runs the embedder on `context` token ids. `dropout_seed` turns on the
/// embedder LoRA's dropout (SimCSE views); `with_grad` records the tape for
/// [`embed_backward`]. `recompute` as in [`TrainableModel::hidden_states`].
pub fn embed_forward(model: &dyn TrainableModel, lora: &Adapter, context: &Context, dropout_seed: Option<u64>, with_grad: bool, recompute: &[bool]) -> Result<EmbedPass> {
    if context.is_empty() {
        return Err(Error::invalid("hypernetwork context", "is empty (no example fits the token budget)"));
    }
    let pooled = context.pooled.as_deref();
    if pooled.is_some_and(|p| p.len() != context.len() || !p.contains(&true)) {
        return Err(Error::invalid("hypernetwork context", "has no response token within the token budget to pool"));
    }
    let mut tape = Tape::new();
    let mut factors = Vec::with_capacity(lora.modules.len());
    let mut map = std::collections::HashMap::new();
    for m in &lora.modules {
        let pair = if with_grad {
            (tape.param(m.a.clone()), tape.param(m.b.clone()))
        } else {
            (tape.constant(m.a.clone()), tape.constant(m.b.clone()))
        };
        map.insert(m.name.clone(), pair);
        factors.push(pair);
    }
    let (dropout, seed) = match dropout_seed {
        Some(s) => (lora.config.dropout, s),
        None => (0.0, 0),
    };
    let vars = LoraVars { factors: map, scaling: lora.config.scaling(), dropout, dropout_seed: seed };
    let hidden = model.hidden_states(&mut tape, &[context.ids.clone()], &vars, recompute, false)?;
    let h = tape.value(hidden);
    let (embedding, rstd) = pool_forward(&h.data, h.last_dim(), pooled);
    if embedding.iter().any(|v| !v.is_finite()) {
        return Err(Error::NonFinite("hypernetwork user embedding".into()));
    }
    Ok(EmbedPass { tape, hidden, factors, pooled: context.pooled.clone(), rstd, embedding })
}

/// `e = normalise(mean of the pooled rows of h)` for `h: [tokens, dim]`
/// (`pooled = None`: every row); returns `(e, rstd)`. At least one row is pooled.
pub fn pool_forward(h: &[f32], dim: usize, pooled: Option<&[bool]>) -> (Vec<f32>, f32) {
    let mut m = vec![0f64; dim];
    let mut count = 0usize;
    for (t, row) in h.chunks_exact(dim).enumerate() {
        if pooled.is_none_or(|p| p[t]) {
            m.iter_mut().zip(row).for_each(|(m, &x)| *m += x as f64);
            count += 1;
        }
    }
    let m: Vec<f32> = m.iter().map(|v| (v / count as f64) as f32).collect();
    let ms = m.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / dim as f64;
    let rstd = (1.0 / (ms + NORM_EPS as f64).sqrt()) as f32;
    (m.iter().map(|v| v * rstd).collect(), rstd)
}

/// Backward of [`pool_forward`]: `dm = rstd (de - e (de . e) / E)`, spread
/// evenly over the pooled rows of `dh: [tokens, dim]` (zero elsewhere).
pub fn pool_backward(de: &[f32], e: &[f32], rstd: f32, tokens: usize, pooled: Option<&[bool]>) -> Vec<f32> {
    let dim = e.len();
    let count = pooled.map_or(tokens, |p| p.iter().filter(|&&x| x).count());
    let proj = de.iter().zip(e).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() / dim as f64;
    let dm: Vec<f32> = de.iter().zip(e).map(|(&d, &v)| (rstd as f64 * (d as f64 - v as f64 * proj) / count as f64) as f32).collect();
    let mut dh = vec![0.0; tokens * dim];
    for (t, row) in dh.chunks_exact_mut(dim).enumerate() {
        if pooled.is_none_or(|p| p[t]) {
            row.copy_from_slice(&dm);
        }
    }
    dh
}

/// Back-propagates `de: [E]` through the pooling and the LLM into the
/// embedder LoRA; returns its gradients `[dA, dB]` per module, in order.
pub fn embed_backward(pass: &mut EmbedPass, de: &[f32]) -> Result<Vec<Tensor>> {
    let dim = pass.embedding.len();
    if de.len() != dim {
        return Err(Error::Shape { what: "embedding gradient".into(), expected: vec![dim], got: vec![de.len()] });
    }
    let tokens = pass.tape.value(pass.hidden).rows();
    let dh = pool_backward(de, &pass.embedding, pass.rstd, tokens, pass.pooled.as_deref());
    pass.tape.backward_with(pass.hidden, Tensor::from_vec(&[tokens, dim], dh)?)?;
    let mut grads = Vec::with_capacity(2 * pass.factors.len());
    for &(a, b) in &pass.factors {
        for v in [a, b] {
            let g = pass.tape.take_grad(v).unwrap_or_else(|| Tensor::zeros(&pass.tape.value(v).shape));
            grads.push(g);
        }
    }
    Ok(grads)
}

/// Seed of view `view` of user slot `slot` at step `step` (SimCSE dropout).
pub fn view_seed(seed: u64, step: u64, slot: u64, view: u64) -> u64 {
    counter_rng::derive(counter_rng::derive(seed, step), slot * 2 + view)
}

//! The embedder: the frozen target LLM with a trainable embedder LoRA,
//! attention made bidirectional (LLM2Vec), hidden states mean-pooled and
//! RMS-normalised into one user embedding.
//!
//! ```text
//! H = llm_bidirectional(context; embedder LoRA)     [T, E]  (on the tape)
//! m = mean_t H[t]                                    [E]
//! e = m / sqrt(mean(m^2) + eps)                      [E]
//! ```
//!
//! The context is one unpadded sequence, so "non-pad tokens" are all of
//! them. The pooling and normalisation sit outside the tape as a
//! forward/backward pair; their gradient seeds the tape at `H`.
use crate::autograd::{counter_rng, Tape, Var};
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::model::llama::DecoderGraph;
use crate::train::graph::LoraVars;
use crate::{Error, Result};

/// Keeps the embedding finite for an all-zero mean.
const NORM_EPS: f32 = 1e-6;

/// One recorded embedder forward, ready for its backward.
pub struct EmbedPass {
    tape: Tape,
    hidden: Var,
    /// `(A, B)` vars of the embedder LoRA, in module order.
    factors: Vec<(Var, Var)>,
    /// Rows of `H`.
    tokens: usize,
    /// `1 / sqrt(mean(m^2) + eps)`.
    rstd: f32,
    /// The user embedding `e: [E]`.
    pub embedding: Vec<f32>,
}

/// Runs the embedder on `context` token ids. `dropout_seed` turns on the
/// embedder LoRA's dropout (SimCSE views); `with_grad` records the tape for
/// [`embed_backward`]. `recompute` as in [`DecoderGraph::hidden_states`].
pub fn embed_forward(model: &DecoderGraph, lora: &Adapter, context: &[u32], dropout_seed: Option<u64>, with_grad: bool, recompute: &[bool]) -> Result<EmbedPass> {
    if context.is_empty() {
        return Err(Error::invalid("hypernetwork context", "is empty (no example fits the token budget)"));
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
    let hidden = model.hidden_states(&mut tape, &[context.to_vec()], &vars, recompute, false)?;
    let h = tape.value(hidden);
    let (tokens, dim) = (h.rows(), h.last_dim());
    let (embedding, rstd) = pool_forward(&h.data, tokens, dim);
    if embedding.iter().any(|v| !v.is_finite()) {
        return Err(Error::NonFinite("hypernetwork user embedding".into()));
    }
    Ok(EmbedPass { tape, hidden, factors, tokens, rstd, embedding })
}

/// `e = normalise(mean_t h[t])` of `h: [tokens, dim]`; returns `(e, rstd)`.
pub fn pool_forward(h: &[f32], tokens: usize, dim: usize) -> (Vec<f32>, f32) {
    let mut m = vec![0f64; dim];
    for row in h.chunks_exact(dim) {
        m.iter_mut().zip(row).for_each(|(m, &x)| *m += x as f64);
    }
    let m: Vec<f32> = m.iter().map(|v| (v / tokens as f64) as f32).collect();
    let ms = m.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / dim as f64;
    let rstd = (1.0 / (ms + NORM_EPS as f64).sqrt()) as f32;
    (m.iter().map(|v| v * rstd).collect(), rstd)
}

/// Backward of [`pool_forward`]: `dm = rstd (de - e (de . e) / E)`, spread
/// evenly over the rows: `dh: [tokens, dim]`.
pub fn pool_backward(de: &[f32], e: &[f32], rstd: f32, tokens: usize) -> Vec<f32> {
    let dim = e.len();
    let proj = de.iter().zip(e).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() / dim as f64;
    let dm: Vec<f32> = de.iter().zip(e).map(|(&d, &v)| (rstd as f64 * (d as f64 - v as f64 * proj) / tokens as f64) as f32).collect();
    let mut dh = Vec::with_capacity(tokens * dim);
    (0..tokens).for_each(|_| dh.extend_from_slice(&dm));
    dh
}

/// Back-propagates `de: [E]` through the pooling and the LLM into the
/// embedder LoRA; returns its gradients `[dA, dB]` per module, in order.
pub fn embed_backward(pass: &mut EmbedPass, de: &[f32]) -> Result<Vec<Tensor>> {
    let dim = pass.embedding.len();
    if de.len() != dim {
        return Err(Error::Shape { what: "embedding gradient".into(), expected: vec![dim], got: vec![de.len()] });
    }
    let dh = pool_backward(de, &pass.embedding, pass.rstd, pass.tokens);
    pass.tape.backward_with(pass.hidden, Tensor::from_vec(&[pass.tokens, dim], dh)?)?;
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

//! Autoregressive generation: the prompt is run once, then one token at a
//! time through the model's [`DecodeState`] (KV caches for attention layers,
//! conv history and f32 recurrent state for Gated DeltaNet layers).
//!
//! Sampling: greedy at temperature 0; otherwise logits / T, nucleus (top-p)
//! filtering, and a draw from a seeded ChaCha8 stream, so a seed reproduces
//! a run exactly.
use crate::model::decoder::{DecodeState, Model};
use crate::ops::softmax::softmax_rows;
use crate::{Error, Result};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 for greedy; otherwise the softmax temperature.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps the whole distribution.
    pub top_p: f32,
    /// Seed of the sampling stream.
    pub seed: u64,
}

impl Sampling {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    }

    /// Rejects NaN, negative temperatures and top-p outside (0, 1].
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::invalid("temperature", format!("{} (must be >= 0)", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::invalid("top-p", format!("{} (must be in (0, 1])", self.top_p)));
        }
        Ok(())
    }
}

/// Generates up to `max_new` tokens after `prompt`, stopping early after
/// any token in `stop` (which is included). `on_token` sees each token as
/// it is produced (for streaming output). Returns the new tokens.
pub fn generate(
    model: &Model,
    prompt: &[u32],
    max_new: usize,
    sampling: &Sampling,
    stop: &[u32],
    on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    sampling.validate()?;
    let (mut state, logits) = prefill(model, prompt)?;
    decode(model, &mut state, logits, max_new, sampling, stop, on_token)
}

/// Runs `prompt` through a fresh state: the state after it and the logits
/// of its last position. Callers that sample several answers (or score
/// several continuations) from one prompt clone both instead of re-running it.
pub fn prefill(model: &Model, prompt: &[u32]) -> Result<(DecodeState, Vec<f32>)> {
    if prompt.is_empty() {
        return Err(Error::invalid("prompt", "no tokens"));
    }
    let mut state = model.new_state();
    let hidden = model.forward(prompt, &mut state)?;
    let h = model.config.hidden_size;
    let logits = model.logits(&hidden[hidden.len() - h..])?;
    Ok((state, logits))
}

/// Continues from `state` whose next-token logits are `logits` (as
/// [`prefill`] leaves them): up to `max_new` tokens, stopping after any
/// token in `stop`. `sampling` must be valid ([`Sampling::validate`]).
pub fn decode(
    model: &Model,
    state: &mut DecodeState,
    logits: Vec<f32>,
    max_new: usize,
    sampling: &Sampling,
    stop: &[u32],
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>> {
    decode_while(model, state, logits, max_new, sampling, stop, |id| {
        on_token(id);
        true
    })
}

/// [`decode`], ending early after a token for which `on_token` returns
/// `false` (a stop string, a client that went away).
pub fn decode_while(
    model: &Model,
    state: &mut DecodeState,
    mut logits: Vec<f32>,
    max_new: usize,
    sampling: &Sampling,
    stop: &[u32],
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(sampling.seed);
    // Grown as tokens come: max_new is a bound, not a size to reserve.
    let mut out = Vec::new();
    while out.len() < max_new {
        if logits.iter().any(|x| !x.is_finite()) {
            return Err(Error::NonFinite(format!("logits after {} generated tokens", out.len())));
        }
        let next = choose(&mut logits, sampling, &mut rng);
        out.push(next);
        let go_on = on_token(next);
        if !go_on || stop.contains(&next) || out.len() == max_new {
            break;
        }
        let hidden = model.forward(&[next], state)?;
        logits = model.logits(&hidden)?;
    }
    Ok(out)
}

/// Picks a token from `logits` (overwritten).
pub fn choose(logits: &mut [f32], sampling: &Sampling, rng: &mut ChaCha8Rng) -> u32 {
    if sampling.temperature == 0.0 {
        return argmax(logits);
    }
    logits.iter_mut().for_each(|x| *x /= sampling.temperature);
    softmax_rows(logits, logits.len());
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    // smallest prefix whose mass reaches top_p (at least one token)
    let mut mass = 0.0f32;
    let mut keep = 0;
    for &i in &order {
        mass += logits[i as usize];
        keep += 1;
        if mass >= sampling.top_p {
            break;
        }
    }
    let u = (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * mass;
    let mut acc = 0.0f32;
    for &i in &order[..keep] {
        acc += logits[i as usize];
        if u < acc {
            return i;
        }
    }
    order[keep - 1]
}

/// Index of the largest value (the first on ties, as `torch.argmax`).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_p_and_seeded_sampling() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let logits = [0.0f32, 3.0, 1.0, 3.0];
        assert_eq!(choose(&mut logits.clone(), &Sampling::greedy(), &mut rng), 1);
        // softmax: p1 = p3 = 0.4576, p2 = 0.0619, p0 = 0.0228. Ties keep index
        // order, so top-p 0.4 keeps token 1 alone and top-p 0.5 keeps {1, 3}.
        let s = Sampling { temperature: 1.0, top_p: 0.4, seed: 0 };
        for _ in 0..50 {
            assert_eq!(choose(&mut logits.clone(), &s, &mut rng), 1);
        }
        let s = Sampling { temperature: 1.0, top_p: 0.5, seed: 0 };
        let mut seen = [false; 4];
        for _ in 0..200 {
            seen[choose(&mut logits.clone(), &s, &mut rng) as usize] = true;
        }
        assert_eq!(seen, [false, true, false, true]);
        // full distribution: frequencies follow softmax
        let s = Sampling { temperature: 1.0, top_p: 1.0, seed: 0 };
        let mut counts = [0usize; 4];
        for _ in 0..20000 {
            counts[choose(&mut logits.clone(), &s, &mut rng) as usize] += 1;
        }
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for i in 0..4 {
            let p = (logits[i] as f64).exp() / z;
            assert!((counts[i] as f64 / 20000.0 - p).abs() < 0.015, "token {i}: {counts:?}");
        }
        assert!(Sampling { temperature: -1.0, top_p: 1.0, seed: 0 }.validate().is_err());
        assert!(Sampling { temperature: 1.0, top_p: 0.0, seed: 0 }.validate().is_err());
    }
}

//! Stage 1b for one user: context -> embedder -> heads -> LoRA attached to
//! the frozen LLM -> token cross-entropy (+ distillation from an ICL
//! teacher) on the user's other examples (+ the distance of the generated
//! LoRA from the user's own, [`super::targets`]) -> gradients into the heads
//! and the embedder LoRA.
//!
//! Three graphs chained by hand (vector-Jacobian products): the embedder
//! tape ends at `H`, the heads are a forward/backward pair, the target tape
//! takes the generated `A`, `B` as its parameters. `dA, dB` from the target
//! tape feed the heads' backward, whose `de` seeds the embedder tape.
use super::distill::head_ce_kl;
use super::embedder::{embed_backward, embed_forward};
use super::hypernet::HyperNet;
use super::targets::{reconstruction, Reconstruct};
use super::users::Context;
use crate::autograd::Tape;
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::autograd::graph::TrainableModel;
use crate::autograd::graph::LoraVars;
use crate::{Error, Result};
use std::collections::HashMap;

/// One target sequence: ids and aligned labels (Hugging Face convention,
/// shifted inside; -100 ignored).
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Labels, same length.
    pub labels: Vec<i64>,
}

impl Example {
    /// Targets of each row (row `t` predicts `labels[t + 1]`).
    pub fn targets(&self) -> Vec<i64> {
        self.labels.iter().skip(1).copied().chain([-100]).collect()
    }
}

/// What one user contributes to a step.
#[derive(Clone, Debug, PartialEq)]
pub struct UserBatch {
    /// Rendered context examples (the hypernetwork's input).
    pub context: Context,
    /// The other batch: examples the generated LoRA is scored on.
    pub examples: Vec<Example>,
    /// Prompt prefix of the ICL teacher (its view of the user's context).
    pub teacher_prefix: Vec<u32>,
}

/// Loss settings of stage 1b.
pub struct E2eOptions<'a> {
    /// Weight of KL(teacher || student); 0 turns the teacher off.
    pub kl_weight: f32,
    /// The teacher's LoRA (the common LoRA); `None` = the base model.
    pub teacher_lora: Option<&'a Adapter>,
    /// Embedder LoRA dropout seed (`None` = no dropout).
    pub dropout_seed: Option<u64>,
    /// Per-layer recompute for the embedder and the target passes.
    pub recompute: Vec<bool>,
    /// Rows per vocabulary-head chunk.
    pub head_chunk: usize,
    /// Back-propagate into the embedder LoRA (false: its gradients stay
    /// zero and the embedding pass records nothing to go back through).
    pub train_embedder: bool,
    /// Score the generated LoRA on the user's examples (false: no target
    /// pass at all, the reconstruction term alone).
    pub end_to_end: bool,
    /// Pull the generated LoRA toward the user's own.
    pub reconstruct: Option<Reconstruct<'a>>,
}

/// One user's loss (means over its target tokens).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UserLoss {
    /// Token cross-entropy.
    pub ce: f64,
    /// KL to the teacher (0 when off).
    pub kl: f64,
    /// Squared distance of the generated LoRA from the user's own over the
    /// population's mean distance (0 without a target).
    pub recon: f64,
    /// `ce + kl_weight * kl + recon_weight * recon` (without the first two
    /// when not end to end), what the gradients are of.
    pub total: f64,
    /// Target tokens.
    pub tokens: usize,
    /// The heads' coefficients for this user (what centred heads average).
    pub coefficients: Vec<f32>,
    /// This user's raw embedding (what standardized heads' statistics average).
    pub embedding: Vec<f32>,
}

/// Hidden states of the teacher for `ex`: `[len, hidden]` rows aligned with
/// the student's (the prefix rows dropped).
fn teacher_hidden(model: &dyn TrainableModel, lora: Option<&Adapter>, prefix: &[u32], ex: &Example, recompute: &[bool]) -> Result<Vec<f32>> {
    let mut tape = Tape::new();
    let (factors, scaling) = match lora {
        Some(a) => (a.modules.iter().map(|m| (m.name.clone(), (tape.constant(m.a.clone()), tape.constant(m.b.clone())))).collect(), a.config.scaling()),
        None => (HashMap::new(), 1.0),
    };
    let vars = LoraVars { factors, scaling, dropout: 0.0, dropout_seed: 0 };
    let ids = [prefix, &ex.ids].concat();
    let h = model.hidden_states(&mut tape, &[ids], &vars, recompute, true)?;
    let dim = tape.value(h).last_dim();
    Ok(tape.value(h).data[prefix.len() * dim..].to_vec())
}

/// Target pass of one example with the generated factors as parameters;
/// adds `dL/dA`, `dL/dB` into `dfactors` (heads order) and returns `(ce, kl)` sums.
fn target_pass(model: &dyn TrainableModel, net: &HyperNet, factors: &[Tensor], ex: &Example, teacher: Option<&[f32]>, opts: &E2eOptions<'_>, denom: f32, dfactors: &mut [Tensor]) -> Result<(f64, f64)> {
    let mut tape = Tape::new();
    let vars: Vec<_> = factors.iter().map(|t| tape.param(t.clone())).collect();
    let mut map = HashMap::new();
    for (s, pair) in net.heads.specs.chunks_exact(2).zip(vars.chunks_exact(2)) {
        map.insert(s[0].module.clone(), (pair[0], pair[1]));
    }
    let lora = LoraVars { factors: map, scaling: net.config.out_lora().scaling(), dropout: 0.0, dropout_seed: 0 };
    let h = model.hidden_states(&mut tape, &[ex.ids.clone()], &lora, &opts.recompute, true)?;
    let out = head_ce_kl(model.head().as_ref(), &tape.value(h).data, teacher, &ex.targets(), opts.kl_weight, denom, opts.head_chunk)?;
    let shape = tape.value(h).shape.clone();
    tape.backward_with(h, Tensor { shape, data: out.dx })?;
    for (d, &v) in dfactors.iter_mut().zip(&vars) {
        if let Some(g) = tape.grad(v) {
            d.data.iter_mut().zip(&g.data).for_each(|(d, g)| *d += g);
        }
    }
    Ok((out.ce_sum, out.kl_sum))
}

/// Loss of `user` under `net` and its gradient, scaled by `grad_scale`,
/// added into `grads` (layout of [`HyperNet::params`]).
pub fn user_loss_and_grads(model: &dyn TrainableModel, net: &HyperNet, user: &UserBatch, opts: &E2eOptions<'_>, grad_scale: f32, grads: &mut [Tensor]) -> Result<UserLoss> {
    if grads.len() != net.embedder_len() + net.heads.params.len() {
        return Err(Error::Shape { what: "hypernetwork gradients".into(), expected: vec![net.embedder_len() + net.heads.params.len()], got: vec![grads.len()] });
    }
    let tokens: usize = user.examples.iter().map(|e| e.targets().iter().filter(|&&t| t >= 0).count()).sum();
    if tokens == 0 || user.examples.iter().any(|e| e.ids.len() != e.labels.len() || e.ids.is_empty()) {
        return Err(Error::invalid("user batch", "needs examples with aligned labels and at least one target token"));
    }
    let mut pass = embed_forward(model, &net.embedder, &user.context, opts.dropout_seed, opts.train_embedder, &opts.recompute)?;
    let (factors, cache) = net.heads.forward(&pass.embedding)?;
    let mut dfactors: Vec<Tensor> = factors.iter().map(|t| Tensor::zeros(&t.shape)).collect();
    let (mut ce, mut kl) = (0f64, 0f64);
    let scored = if opts.end_to_end { &user.examples[..] } else { &[] };
    for ex in scored {
        let teacher = match opts.kl_weight > 0.0 {
            true => Some(teacher_hidden(model, opts.teacher_lora, &user.teacher_prefix, ex, &opts.recompute)?),
            false => None,
        };
        let (c, k) = target_pass(model, net, &factors, ex, teacher.as_deref(), opts, tokens as f32, &mut dfactors)?;
        ce += c;
        kl += k;
    }
    let recon = match opts.reconstruct {
        Some(r) => reconstruction(&factors, r.target, r.inv_norm, r.weight, &mut dfactors),
        None => 0.0,
    };
    if grad_scale != 1.0 {
        dfactors.iter_mut().for_each(|d| d.data.iter_mut().for_each(|v| *v *= grad_scale));
    }
    let (eg, hg) = grads.split_at_mut(net.embedder_len());
    let de = net.heads.backward(&cache, &dfactors, hg);
    if opts.train_embedder {
        for (g, d) in eg.iter_mut().zip(embed_backward(&mut pass, &de)?) {
            g.data.iter_mut().zip(&d.data).for_each(|(g, d)| *g += d);
        }
    }
    let n = tokens as f64;
    let weight = opts.reconstruct.map_or(0.0, |r| r.weight as f64);
    let total = (ce + opts.kl_weight as f64 * kl) / n + weight * recon;
    Ok(UserLoss { ce: ce / n, kl: kl / n, recon, total, tokens, coefficients: cache.coefficients(), embedding: pass.embedding })
}

//! Embedding-to-matrix heads: one 2-layer bottleneck MLP per (layer, module,
//! A or B), each emitting one LoRA matrix (llm.c style forward/backward pair).
//!
//! For head `j` with embedding `e: [E]`:
//!
//! ```text
//! z   = W1 e + b1 (+ layer_emb[l] + type_emb[t])      [k]
//! h   = silu(z)                                        [k]  (the coefficient vector)
//! out = W2 h + b2                                      [rows * cols]  (W2 is a basis of k matrices)
//! ```
//!
//! Parallel variant: `W1 [k, E]`, `b1 [k]`, `W2 [n_j, k]`, `b2 [n_j]` per head.
//! Shared trunk: one `W1`, `b1`, learned `layer_emb [L, k]` and
//! `type_emb [T, k]` (T = module type x factor), one `W2` per module type,
//! `b2` per head. `W2 = 0` at initialisation and `b2` holds a common LoRA, so
//! an untrained hypernetwork emits exactly that LoRA.
//!
//! Centred heads (`HyperConfig::center`) emit `out = W2 (h - c) + b2`, where
//! `c` is a running mean of every head's `h` over the users training has
//! seen (a buffer: saved with the weights, moved by no gradient). Users'
//! embeddings are alike (cosine 0.7-0.9), so an uncentred `h` is mostly its
//! population mean and `W2` learned a second common LoRA from it
//! (docs/results/hyper-diagnosis); centred, `W2` sees only what differs
//! between users and the common part stays in `b2`.
//!
//! Standardized heads (`HyperConfig::standardize`) read the embedding
//! centred on its running population mean and scaled by one factor to unit
//! mean variance across users, `e' = (e - mu) / sqrt(mean_d var_d + eps)`
//! (batch normalisation's running statistics, with one scale for all
//! dimensions so none is amplified alone): users' embeddings share over 90%
//! of their energy, so raw `W1 e` barely differs between users, while `W1 e'`
//! differs by O(1). A per-coefficient scale of `h - c` was tried first and
//! made the LoRAs differ by blowing up coefficients no user moves
//! (docs/RESULTS.md).
use super::config::HeadVariant;
use crate::base::counter_rng;
use crate::lora::{Adapter, LoraConfig, LoraModule};
use crate::projection::ProjectionInfo;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Which LoRA factor a head emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Factor {
    /// `lora_A`, `[r, in]`.
    A,
    /// `lora_B`, `[out, r]`.
    B,
}

/// One head: the matrix it emits and where its parameters sit.
#[derive(Clone, Debug)]
pub struct HeadSpec {
    /// Projection name (`model.layers.3.self_attn.q_proj`).
    pub module: String,
    /// A or B.
    pub factor: Factor,
    /// Output matrix shape `[rows, cols]`.
    pub shape: [usize; 2],
    /// Decoder layer of the module.
    pub layer: usize,
    /// Module type x factor index (shared-trunk embeddings and `W2`).
    pub kind: usize,
    w1: usize,
    b1: usize,
    w2: usize,
    b2: usize,
}

/// All heads and their parameters, in one flat list for the optimizer.
#[derive(Clone, Debug)]
pub struct Heads {
    /// Parallel or shared trunk.
    pub variant: HeadVariant,
    /// Embedding width `E`.
    pub embed_dim: usize,
    /// Bottleneck width `k`.
    pub k: usize,
    /// One per emitted matrix, in module order (A then B).
    pub specs: Vec<HeadSpec>,
    /// Parameter tensors (shapes in the module docs).
    pub params: Vec<Tensor>,
    /// Their safetensors names, same order.
    pub names: Vec<String>,
    /// `(layer_emb, type_emb)` parameter indices in the shared trunk.
    trunk_emb: Option<(usize, usize)>,
    /// `(center.sum [heads, k], center.weight [1])` indices of centred heads:
    /// `c = sum / weight` (0 before the first update).
    center: Option<(usize, usize)>,
    /// `(embed.sum [E], embed.sumsq [1], embed.weight [1])` indices of the
    /// embedding's running statistics when standardized: `mu = sum / weight`,
    /// `mean_d var_d = sumsq / weight - mean_d mu_d^2`.
    embed_norm: Option<(usize, usize, usize)>,
}

/// What the forward saves for the backward: `z` and the centred
/// coefficients `h - c` (`h` itself without a centre), both `[heads, k]`;
/// the heads' input `e'` and its scale (`e` and 1 unless standardized).
pub struct HeadsCache {
    z: Vec<f32>,
    centered: Vec<f32>,
    input: Vec<f32>,
    scale: f32,
}

impl HeadsCache {
    /// Every head's coefficient vector `h = silu(z)`, `[heads * k]` (what
    /// the running centre averages).
    pub fn coefficients(&self) -> Vec<f32> {
        self.z.iter().map(|&z| silu(z)).collect()
    }
}

/// Weight of the old running mean in each step's update of the centre: about
/// the last ten steps (40 users at 4 a step), so `c` follows `W1` as it trains.
const CENTER_MOMENTUM: f32 = 0.9;

/// Keeps the embedding's scale finite when users do not differ at all.
const VARIANCE_EPS: f64 = 1e-6;

fn layer_of(name: &str) -> usize {
    name.split('.').find_map(|p| p.parse().ok()).unwrap_or(0)
}

fn module_type(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
fn silu(z: f32) -> f32 {
    z * sigmoid(z)
}

impl Heads {
    /// Builds heads for the `projections` targeted by `out` and fills `b2`
    /// from `common` (its factors must match) or PEFT's default init;
    /// `center` adds the running-mean buffers (after every other
    /// parameter), `standardize` the embedding's running statistics after them.
    #[allow(clippy::too_many_arguments)]
    pub fn new(variant: HeadVariant, embed_dim: usize, k: usize, out: &LoraConfig, projections: &[ProjectionInfo], common: Option<&Adapter>, (center, standardize): (bool, bool), seed: u64) -> Result<Heads> {
        let init = match common {
            Some(c) => {
                if c.config.r != out.r {
                    return Err(Error::invalid("common LoRA", format!("rank {} but the hypernetwork emits rank {}", c.config.r, out.r)));
                }
                c.clone()
            }
            None => Adapter::init(out.clone(), projections, counter_rng::derive(seed, 1))?,
        };
        let mut heads = Heads { variant, embed_dim, k, specs: Vec::new(), params: Vec::new(), names: Vec::new(), trunk_emb: None, center: None, embed_norm: None };
        let mut kinds: Vec<(String, Factor)> = Vec::new();
        let targeted: Vec<&ProjectionInfo> = projections.iter().filter(|p| out.targets(&p.name)).collect();
        for p in &targeted {
            for f in [Factor::A, Factor::B] {
                let key = (module_type(&p.name).to_string(), f);
                if !kinds.contains(&key) {
                    kinds.push(key);
                }
            }
        }
        let layers = targeted.iter().map(|p| layer_of(&p.name) + 1).max().unwrap_or(0);
        let w1_init = |n: usize, s: u64| -> Vec<f32> {
            let bound = 1.0 / (embed_dim as f32).sqrt();
            (0..n).map(|i| (2.0 * counter_rng::uniform(s, i as u64) - 1.0) * bound).collect()
        };
        let shared = if variant == HeadVariant::SharedTrunk {
            let w1 = heads.push("trunk.w1", vec![k, embed_dim], w1_init(k * embed_dim, counter_rng::derive(seed, 2)));
            let b1 = heads.push("trunk.b1", vec![k], vec![0.0; k]);
            let le = heads.push("trunk.layer_emb", vec![layers, k], vec![0.0; layers * k]);
            let te = heads.push("trunk.type_emb", vec![kinds.len(), k], vec![0.0; kinds.len() * k]);
            heads.trunk_emb = Some((le, te));
            Some((w1, b1))
        } else {
            None
        };
        let mut type_w2: Vec<Option<usize>> = vec![None; kinds.len()];
        for p in &targeted {
            let m = init.module(&p.name).ok_or_else(|| Error::invalid("common LoRA", format!("has no factors for {}", p.name)))?;
            for (f, t, tag) in [(Factor::A, &m.a, "lora_A"), (Factor::B, &m.b, "lora_B")] {
                let shape = [t.shape[0], t.shape[1]];
                let want = match f {
                    Factor::A => [out.r, p.in_features],
                    Factor::B => [p.out_features, out.r],
                };
                if shape != want {
                    return Err(Error::Shape { what: format!("common LoRA {} {tag}", p.name), expected: want.to_vec(), got: t.shape.clone() });
                }
                let n = shape[0] * shape[1];
                let kind = kinds.iter().position(|x| *x == (module_type(&p.name).to_string(), f)).expect("kinds hold every target");
                let j = heads.specs.len() as u64;
                let (w1, b1) = match shared {
                    Some(s) => s,
                    None => (
                        heads.push(&format!("{}.{tag}.w1", p.name), vec![k, embed_dim], w1_init(k * embed_dim, counter_rng::derive(seed, 100 + j))),
                        heads.push(&format!("{}.{tag}.b1", p.name), vec![k], vec![0.0; k]),
                    ),
                };
                let w2 = match (shared, type_w2[kind]) {
                    (Some(_), Some(w2)) => w2,
                    (Some(_), None) => {
                        let w2 = heads.push(&format!("trunk.{}.{tag}.w2", kinds[kind].0), vec![n, k], vec![0.0; n * k]);
                        type_w2[kind] = Some(w2);
                        w2
                    }
                    (None, _) => heads.push(&format!("{}.{tag}.w2", p.name), vec![n, k], vec![0.0; n * k]),
                };
                if heads.params[w2].shape[0] != n {
                    return Err(Error::Unsupported(format!("shared trunk: {} differs in shape from other {} modules", p.name, kinds[kind].0)));
                }
                let b2 = heads.push(&format!("{}.{tag}.b2", p.name), vec![n], t.data.clone());
                heads.specs.push(HeadSpec { module: p.name.clone(), factor: f, shape, layer: layer_of(&p.name), kind, w1, b1, w2, b2 });
            }
        }
        if heads.specs.is_empty() {
            return Err(Error::invalid("out_targets", format!("{:?} match no projection of the model", out.target_modules)));
        }
        if center {
            let n = heads.specs.len();
            let sum = heads.push("center.sum", vec![n, k], vec![0.0; n * k]);
            let weight = heads.push("center.weight", vec![1], vec![0.0]);
            heads.center = Some((sum, weight));
        }
        if standardize {
            let sum = heads.push("embed.sum", vec![embed_dim], vec![0.0; embed_dim]);
            let sumsq = heads.push("embed.sumsq", vec![1], vec![0.0]);
            let weight = heads.push("embed.weight", vec![1], vec![0.0]);
            heads.embed_norm = Some((sum, sumsq, weight));
        }
        Ok(heads)
    }

    fn push(&mut self, name: &str, shape: Vec<usize>, data: Vec<f32>) -> usize {
        self.params.push(Tensor { shape, data });
        self.names.push(name.to_string());
        self.params.len() - 1
    }

    /// `z` of head `j`: `W1 e + b1 (+ embeddings)`, `[k]`.
    fn pre_activation(&self, j: usize, e: &[f32]) -> Vec<f32> {
        let s = &self.specs[j];
        let (w1, b1) = (&self.params[s.w1].data, &self.params[s.b1].data);
        let mut z: Vec<f32> = (0..self.k).map(|i| b1[i] + dot(&w1[i * self.embed_dim..(i + 1) * self.embed_dim], e)).collect();
        if let Some((le, te)) = self.trunk_emb {
            let (le, te) = (&self.params[le].data[s.layer * self.k..][..self.k], &self.params[te].data[s.kind * self.k..][..self.k]);
            z.iter_mut().zip(le.iter().zip(te)).for_each(|(z, (l, t))| *z += l + t);
        }
        z
    }

    /// Every head's matrix for embedding `e: [E]`, in `specs` order.
    pub fn forward(&self, e: &[f32]) -> Result<(Vec<Tensor>, HeadsCache)> {
        self.forward_with_strength(e, 1.0)
    }

    /// [`Heads::forward`] with the user's part scaled: `out = b2 + s W2 (h - c)`.
    /// With centred heads `b2` is what every user gets and `W2 (h - c)` what
    /// this user's embedding adds, so `s > 1` pushes a synthesized LoRA further
    /// from the population's (task-vector extrapolation), `s = 0` is the common
    /// LoRA, and `s = 1` is training's forward, bit for bit (`1.0 * x == x`).
    pub fn forward_with_strength(&self, e: &[f32], strength: f32) -> Result<(Vec<Tensor>, HeadsCache)> {
        if e.len() != self.embed_dim {
            return Err(Error::Shape { what: "hypernetwork embedding".into(), expected: vec![self.embed_dim], got: vec![e.len()] });
        }
        let len = self.specs.len() * self.k;
        let (input, scale) = self.standardized(e);
        let mut cache = HeadsCache { z: Vec::with_capacity(len), centered: Vec::with_capacity(len), input, scale };
        let mut outs = Vec::with_capacity(self.specs.len());
        for (j, s) in self.specs.iter().enumerate() {
            let z = self.pre_activation(j, &cache.input);
            let h = self.centered(j, z.iter().map(|&z| silu(z)).collect());
            let (w2, b2) = (&self.params[s.w2].data, &self.params[s.b2].data);
            let out: Vec<f32> = b2.iter().enumerate().map(|(n, &b)| b + strength * dot(&w2[n * self.k..(n + 1) * self.k], &h)).collect();
            outs.push(Tensor { shape: s.shape.to_vec(), data: out });
            cache.z.extend(z);
            cache.centered.extend(h);
        }
        Ok((outs, cache))
    }

    /// `(e', s)`: `e' = (e - mu) s` when standardized (and after the first
    /// update), else `(e, 1)`.
    fn standardized(&self, e: &[f32]) -> (Vec<f32>, f32) {
        let Some((sum, sumsq, weight)) = self.embed_norm else { return (e.to_vec(), 1.0) };
        let w = self.params[weight].data[0] as f64;
        if w <= 0.0 {
            return (e.to_vec(), 1.0);
        }
        let mu: Vec<f64> = self.params[sum].data.iter().map(|&s| s as f64 / w).collect();
        let mean_sq_mu = mu.iter().map(|m| m * m).sum::<f64>() / mu.len() as f64;
        let var = (self.params[sumsq].data[0] as f64 / w - mean_sq_mu).max(0.0);
        let s = 1.0 / (var + VARIANCE_EPS).sqrt();
        (e.iter().zip(&mu).map(|(&x, m)| ((x as f64 - m) * s) as f32).collect(), s as f32)
    }

    /// `h - c` of head `j` (`h` without a centre).
    fn centered(&self, j: usize, mut h: Vec<f32>) -> Vec<f32> {
        if let Some((sum, weight)) = self.center {
            let w = self.params[weight].data[0];
            if w > 0.0 {
                let c = &self.params[sum].data[j * self.k..][..self.k];
                h.iter_mut().zip(c).for_each(|(h, c)| *h -= c / w);
            }
        }
        h
    }

    /// Folds one step's coefficients (one [`HeadsCache::coefficients`] per
    /// user) into the running centre: `sum <- m sum + (1 - m) mean(h)`,
    /// `weight <- m weight + (1 - m)`, so `c = sum / weight` is an
    /// exponential mean with Adam's bias correction (exact after one step).
    /// Without a centre it does nothing.
    pub fn update_center(&mut self, coefficients: &[Vec<f32>]) {
        let (Some((sum, weight)), false) = (self.center, coefficients.is_empty()) else { return };
        self.fold(sum, coefficients);
        self.fold_weight(weight);
    }

    /// Folds one step's raw embeddings (one per user) into the running
    /// statistics of standardized heads as [`Heads::update_center`] folds
    /// coefficients: `sum` follows `mean(e)`, `sumsq` `mean(|e|^2 / E)`.
    /// Without them it does nothing.
    pub fn update_embed_norm(&mut self, embeddings: &[Vec<f32>]) {
        let (Some((sum, sumsq, weight)), false) = (self.embed_norm, embeddings.is_empty()) else { return };
        self.fold(sum, embeddings);
        let ms: Vec<Vec<f32>> = embeddings.iter().map(|e| vec![e.iter().map(|x| x * x).sum::<f32>() / e.len() as f32]).collect();
        self.fold(sumsq, &ms);
        self.fold_weight(weight);
    }

    /// `buffer <- m buffer + (1 - m) mean_u x_u`, elementwise.
    fn fold(&mut self, buffer: usize, xs: &[Vec<f32>]) {
        let (m, n) = (CENTER_MOMENTUM, xs.len() as f32);
        for (i, s) in self.params[buffer].data.iter_mut().enumerate() {
            let mean = xs.iter().map(|x| x[i]).sum::<f32>() / n;
            *s = m * *s + (1.0 - m) * mean;
        }
    }

    fn fold_weight(&mut self, weight: usize) {
        let w = &mut self.params[weight].data[0];
        *w = CENTER_MOMENTUM * *w + (1.0 - CENTER_MOMENTUM);
    }

    /// Indices into `params` of the buffers no gradient step may move (the
    /// running statistics); empty without them.
    pub fn buffers(&self) -> Vec<usize> {
        let center = self.center.map(|(sum, weight)| vec![sum, weight]).unwrap_or_default();
        let embed = self.embed_norm.map(|(sum, sumsq, weight)| vec![sum, sumsq, weight]).unwrap_or_default();
        [center, embed].concat()
    }

    /// Given `douts` (one per head, like the forward's outputs), adds the
    /// parameter gradients into `grads` (same layout as `params`) and
    /// returns `de: [E]` (through the standardization: its statistics are
    /// constants of the step, so `de = s de'`).
    pub fn backward(&self, cache: &HeadsCache, douts: &[Tensor], grads: &mut [Tensor]) -> Vec<f32> {
        let (k, e) = (self.k, &cache.input);
        let mut de = vec![0.0f32; self.embed_dim];
        for (j, (s, dout)) in self.specs.iter().zip(douts).enumerate() {
            let z = &cache.z[j * k..(j + 1) * k];
            // c is a constant of the step: dW2 takes h - c, dh = W2^T dout.
            let h = &cache.centered[j * k..(j + 1) * k];
            grads[s.b2].data.iter_mut().zip(&dout.data).for_each(|(g, d)| *g += d);
            let w2 = &self.params[s.w2].data;
            let mut dh = vec![0.0f32; k];
            let dw2 = &mut grads[s.w2].data;
            for (n, &d) in dout.data.iter().enumerate() {
                if d == 0.0 {
                    continue;
                }
                let row = n * k..(n + 1) * k;
                dw2[row.clone()].iter_mut().zip(h).for_each(|(g, h)| *g += d * h);
                dh.iter_mut().zip(&w2[row]).for_each(|(g, w)| *g += d * w);
            }
            // silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
            let dz: Vec<f32> = dh.iter().zip(z).map(|(&g, &z)| {
                let sg = sigmoid(z);
                g * sg * (1.0 + z * (1.0 - sg))
            }).collect();
            grads[s.b1].data.iter_mut().zip(&dz).for_each(|(g, d)| *g += d);
            if let Some((le, te)) = self.trunk_emb {
                grads[le].data[s.layer * k..][..k].iter_mut().zip(&dz).for_each(|(g, d)| *g += d);
                grads[te].data[s.kind * k..][..k].iter_mut().zip(&dz).for_each(|(g, d)| *g += d);
            }
            let w1 = &self.params[s.w1].data;
            let dw1 = &mut grads[s.w1].data;
            for (i, &d) in dz.iter().enumerate() {
                let row = i * self.embed_dim..(i + 1) * self.embed_dim;
                dw1[row.clone()].iter_mut().zip(e).for_each(|(g, x)| *g += d * x);
                de.iter_mut().zip(&w1[row]).for_each(|(g, w)| *g += d * w);
            }
        }
        de.iter_mut().for_each(|g| *g *= cache.scale);
        de
    }

    /// Zero tensors shaped like the parameters.
    pub fn zero_grads(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| Tensor::zeros(&p.shape)).collect()
    }

    /// Indices into `params` of every head's output bias `b2` (what the
    /// heads emit for any user when `W2 = 0`: the common LoRA at init).
    pub fn output_biases(&self) -> impl Iterator<Item = usize> + '_ {
        self.specs.iter().map(|s| s.b2)
    }

    /// The emitted matrices as a PEFT adapter with configuration `config`.
    pub fn to_adapter(&self, outs: Vec<Tensor>, config: LoraConfig) -> Adapter {
        let mut modules: Vec<LoraModule> = Vec::new();
        for (s, t) in self.specs.iter().zip(outs) {
            match s.factor {
                Factor::A => modules.push(LoraModule { name: s.module.clone(), a: t, b: Tensor::zeros(&[0]) }),
                Factor::B => modules.last_mut().expect("A precedes B").b = t,
            }
        }
        Adapter { config, modules }
    }

    /// Replaces the parameters with `params` (loaded weights), checking shapes.
    pub fn set_params(&mut self, params: Vec<Tensor>) -> Result<()> {
        if params.len() != self.params.len() {
            return Err(Error::Shape { what: "hypernetwork head parameters".into(), expected: vec![self.params.len()], got: vec![params.len()] });
        }
        for ((p, new), name) in self.params.iter().zip(&params).zip(&self.names) {
            if p.shape != new.shape {
                return Err(Error::Shape { what: format!("head parameter {name}"), expected: p.shape.clone(), got: new.shape.clone() });
            }
        }
        self.params = params;
        Ok(())
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::ProjectionKind;

    /// Heads of one q_proj (in 6, out 5), rank 2, bottleneck 3, embedding 4,
    /// centred, every parameter filled with counter-RNG values.
    fn filled_heads() -> Heads {
        let out = LoraConfig { r: 2, alpha: 4.0, target_modules: vec!["q_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() };
        let proj = [ProjectionInfo { name: "model.layers.0.self_attn.q_proj".into(), kind: ProjectionKind::Attention, out_features: 5, in_features: 6 }];
        let mut heads = Heads::new(HeadVariant::Parallel, 4, 3, &out, &proj, None, (true, false), 7).unwrap();
        let (_, weight) = heads.center.unwrap();
        for (i, p) in heads.params.iter_mut().enumerate() {
            p.data.iter_mut().enumerate().for_each(|(n, x)| *x = counter_rng::uniform(counter_rng::derive(11, i as u64), n as u64) - 0.5);
        }
        heads.params[weight].data[0] = 2.0;
        heads
    }

    /// `b2 + s W2 (silu(W1 e + b1) - sum / weight)` per head, in f64.
    fn reference(heads: &Heads, e: &[f32], s: f64) -> Vec<Vec<f64>> {
        let (sum, weight) = heads.center.unwrap();
        let p = |i: usize| heads.params[i].data.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        heads.specs.iter().enumerate().map(|(j, spec)| {
            let (w1, b1, w2, b2, c, w) = (p(spec.w1), p(spec.b1), p(spec.w2), p(spec.b2), p(sum), p(weight)[0]);
            let h: Vec<f64> = (0..heads.k).map(|i| {
                let z = b1[i] + (0..heads.embed_dim).map(|d| w1[i * heads.embed_dim + d] * e[d] as f64).sum::<f64>();
                z / (1.0 + (-z).exp()) - c[j * heads.k + i] / w
            }).collect();
            (0..b2.len()).map(|n| b2[n] + s * (0..heads.k).map(|i| w2[n * heads.k + i] * h[i]).sum::<f64>()).collect()
        }).collect()
    }

    #[test]
    fn strength_scales_the_users_part_and_one_is_training_forward() {
        let heads = filled_heads();
        let e = [0.3, -1.2, 0.7, 2.0];
        let (trained, _) = heads.forward(&e).unwrap();
        for s in [0.0f32, 1.0, 2.5] {
            let (outs, _) = heads.forward_with_strength(&e, s).unwrap();
            for (out, want) in outs.iter().zip(reference(&heads, &e, s as f64)) {
                for (x, y) in out.data.iter().zip(&want) {
                    assert!((*x as f64 - y).abs() < 1e-5, "strength {s}: {x} against f64 {y}");
                }
            }
            if s == 1.0 {
                assert!(outs.iter().zip(&trained).all(|(a, b)| a.data == b.data), "strength 1 must be training's forward bit for bit");
            }
            if s == 0.0 {
                assert!(outs.iter().zip(&heads.specs).all(|(o, spec)| o.data == heads.params[spec.b2].data), "strength 0 must be b2, the common LoRA");
            }
        }
    }
}

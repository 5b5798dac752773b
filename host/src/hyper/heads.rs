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
//! Standardized heads (`HyperConfig::standardize`, with a centre) emit
//! `out = W2 ((h - c) / sqrt(v + eps)) + b2`, `v` the running variance of
//! `h` kept the same way (batch normalisation's running statistics): the
//! part of `h` that differs between users is a few percent of it, and Adam
//! moves each `W2` entry by about the learning rate a step, so unscaled that
//! part stays small against `b2` however the gradients point.
use super::config::HeadVariant;
use crate::autograd::counter_rng;
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
    /// The running statistics of centred heads (buffers in `params`).
    center: Option<Center>,
}

/// Indices into `params` of the centre's buffers: `center.sum [heads, k]`,
/// `center.weight [1]` (`c = sum / weight`, 0 before the first update) and,
/// standardized, `center.sumsq [heads, k]` (`v = sumsq / weight - c^2`).
#[derive(Clone, Copy, Debug)]
struct Center {
    sum: usize,
    weight: usize,
    sumsq: Option<usize>,
}

/// What the forward saves for the backward: `z`, the centred coefficients
/// `(h - c) s` (`h` itself without a centre) and the scales `s` (1 unless
/// standardized), all `[heads, k]`.
pub struct HeadsCache {
    z: Vec<f32>,
    centered: Vec<f32>,
    scale: Vec<f32>,
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

/// Added to the running variance before its root, as batch normalisation
/// does: a coefficient no user moves is scaled by at most `1 / sqrt(eps)`.
const VARIANCE_EPS: f32 = 1e-5;

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
    /// parameter), `standardize` the running second moment beside them.
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
        let mut heads = Heads { variant, embed_dim, k, specs: Vec::new(), params: Vec::new(), names: Vec::new(), trunk_emb: None, center: None };
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
            let sumsq = standardize.then(|| heads.push("center.sumsq", vec![n, k], vec![0.0; n * k]));
            heads.center = Some(Center { sum, weight, sumsq });
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
        if e.len() != self.embed_dim {
            return Err(Error::Shape { what: "hypernetwork embedding".into(), expected: vec![self.embed_dim], got: vec![e.len()] });
        }
        let len = self.specs.len() * self.k;
        let mut cache = HeadsCache { z: Vec::with_capacity(len), centered: Vec::with_capacity(len), scale: Vec::with_capacity(len) };
        let mut outs = Vec::with_capacity(self.specs.len());
        for (j, s) in self.specs.iter().enumerate() {
            let z = self.pre_activation(j, e);
            let scale = self.scale(j);
            let h = self.centered(j, z.iter().map(|&z| silu(z)).collect(), &scale);
            let (w2, b2) = (&self.params[s.w2].data, &self.params[s.b2].data);
            let out: Vec<f32> = b2.iter().enumerate().map(|(n, &b)| b + dot(&w2[n * self.k..(n + 1) * self.k], &h)).collect();
            outs.push(Tensor { shape: s.shape.to_vec(), data: out });
            cache.z.extend(z);
            cache.centered.extend(h);
            cache.scale.extend(scale);
        }
        Ok((outs, cache))
    }

    /// `(h - c) s` of head `j` (`h` without a centre).
    fn centered(&self, j: usize, mut h: Vec<f32>, scale: &[f32]) -> Vec<f32> {
        if let Some(c) = self.center {
            let w = self.params[c.weight].data[0];
            if w > 0.0 {
                let sum = &self.params[c.sum].data[j * self.k..][..self.k];
                h.iter_mut().zip(sum).zip(scale).for_each(|((h, sum), s)| *h = (*h - sum / w) * s);
            }
        }
        h
    }

    /// `s = 1 / sqrt(v + eps)` of head `j`'s coefficients when standardized
    /// (and after the first update), else 1: `[k]`.
    fn scale(&self, j: usize) -> Vec<f32> {
        let ones = vec![1.0; self.k];
        let Some(Center { sum, weight, sumsq: Some(sumsq) }) = self.center else { return ones };
        let w = self.params[weight].data[0];
        if w <= 0.0 {
            return ones;
        }
        let (sum, sumsq) = (&self.params[sum].data[j * self.k..][..self.k], &self.params[sumsq].data[j * self.k..][..self.k]);
        sum.iter().zip(sumsq).map(|(&s, &q)| {
            let (mean, var) = (s as f64 / w as f64, q as f64 / w as f64);
            (1.0 / ((var - mean * mean).max(0.0) + VARIANCE_EPS as f64).sqrt()) as f32
        }).collect()
    }

    /// Folds one step's coefficients (one [`HeadsCache::coefficients`] per
    /// user) into the running centre: `sum <- m sum + (1 - m) mean(h)`,
    /// `weight <- m weight + (1 - m)`, so `c = sum / weight` is an
    /// exponential mean with Adam's bias correction (exact after one step);
    /// standardized, `sumsq` follows `mean(h^2)` the same way. Without a
    /// centre it does nothing.
    pub fn update_center(&mut self, coefficients: &[Vec<f32>]) {
        let (Some(c), false) = (self.center, coefficients.is_empty()) else { return };
        let (m, n) = (CENTER_MOMENTUM, coefficients.len() as f32);
        let fold = |buffer: &mut Vec<f32>, f: fn(f32) -> f32| {
            for (i, s) in buffer.iter_mut().enumerate() {
                let mean = coefficients.iter().map(|h| f(h[i])).sum::<f32>() / n;
                *s = m * *s + (1.0 - m) * mean;
            }
        };
        fold(&mut self.params[c.sum].data, |h| h);
        if let Some(sumsq) = c.sumsq {
            fold(&mut self.params[sumsq].data, |h| h * h);
        }
        let w = &mut self.params[c.weight].data[0];
        *w = m * *w + (1.0 - m);
    }

    /// Indices into `params` of the buffers no gradient step may move (the
    /// centre); empty without one.
    pub fn buffers(&self) -> Vec<usize> {
        self.center.map(|c| [Some(c.sum), Some(c.weight), c.sumsq].into_iter().flatten().collect()).unwrap_or_default()
    }

    /// Given `douts` (one per head, like the forward's outputs), adds the
    /// parameter gradients into `grads` (same layout as `params`) and
    /// returns `de: [E]`.
    pub fn backward(&self, e: &[f32], cache: &HeadsCache, douts: &[Tensor], grads: &mut [Tensor]) -> Vec<f32> {
        let k = self.k;
        let mut de = vec![0.0f32; self.embed_dim];
        for (j, (s, dout)) in self.specs.iter().zip(douts).enumerate() {
            let z = &cache.z[j * k..(j + 1) * k];
            // c and s are constants of the step: dW2 takes (h - c) s,
            // dh = s W2^T dout.
            let h = &cache.centered[j * k..(j + 1) * k];
            let scale = &cache.scale[j * k..(j + 1) * k];
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
            let dz: Vec<f32> = dh.iter().zip(z).zip(scale).map(|((&g, &z), &s)| {
                let sg = sigmoid(z);
                g * s * sg * (1.0 + z * (1.0 - sg))
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

//! The one decoder-layer forward of every architecture, written once and
//! run two ways by an [`Exec`]: [`Decode`] runs it on plain buffers with a
//! decoding state (KV cache, GDN state: generation, serving, evaluation's
//! answers), [`Record`] records it on the autograd tape (training, hidden
//! states), where each node's backward sits beside its forward
//! (`autograd/nodes.rs`, Qwen3.5's in `qwen35/gdn_node.rs`).
//!
//! Per layer (`x: [rows, hidden]`):
//!
//! ```text
//! h  = rmsnorm(x)
//! attention:  q, k, v = proj(h)        (Qwen3.5: q_proj emits [query | gate] per head)
//!             q, k = rmsnorm(q), rmsnorm(k) per head        (Qwen3, Qwen3.5, Gemma 3)
//!             q, k = rope(q), rope(k)                       (Gemma 3's local layers: their own base)
//!             a = attention(q, k, v)   causal GQA; Gemma 3's local layers within a window
//!             a = a * sigmoid(gate)                         (Qwen3.5)
//!             o = proj_o(a)
//! GDN:        qkv, z, b, a = proj(h)   c = gdn(qkv, z, b, a)   o = proj_out(c)      (Qwen3.5)
//! x1 = x + o                                                (Gemma 3: x + rmsnorm(o))
//! m  = act(proj_gate(rmsnorm(x1))) * proj_up(rmsnorm(x1))   (SwiGLU; Gemma 3: GeGLU)
//! y  = x1 + proj_down(m)                                    (Gemma 3: x1 + rmsnorm(proj_down(m)))
//! ```
//!
//! Every projection goes through [`Exec::lin`]: the frozen product (CPU,
//! or routed to the NPU), plus the LoRA branch when recording, or the
//! adapter slot's branch when decoding (`lora::slots`).
use crate::autograd::{Tape, Var};
use crate::base::counter_rng;
use crate::model::blocks::{output_gate_forward, project, query_half, GateAct, KvCache};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::decoder::ProjectionFactory;
use crate::model::descriptor::{Descriptor, LayerDesc};
use crate::model::qwen35::gdn::{gdn_decode, GdnState, GdnWeights};
use crate::model::source::TensorSource;
use crate::ops::attention::{attention_forward_window, AttnDims, Products};
use crate::ops::geglu::geglu_forward;
use crate::ops::rmsnorm::{rmsnorm_forward, NormWeight};
use crate::ops::rope::{rope_forward, rope_inv_freq, RopeScaling};
use crate::ops::swiglu::swiglu_forward;
use crate::projection::Projection;
use crate::{Error, Result};
use std::sync::Arc;

/// Two norm weights that go together (q and k; the mixer's and the MLP's
/// outputs).
pub type NormPair = (Arc<Vec<f32>>, Arc<Vec<f32>>);

/// What mixes tokens in a layer, besides its projections.
pub enum Mixer {
    /// Softmax attention.
    Attention {
        /// Per-head q/k RMSNorm weights `[head_dim]` (Qwen3, Qwen3.5, Gemma 3).
        qk_norm: Option<NormPair>,
        /// q_proj emits `[query | gate]` per head; the output is multiplied
        /// by `sigmoid(gate)` (Qwen3.5).
        gated: bool,
        /// Each query sees itself and the `window - 1` positions before it
        /// (Gemma 3's local layers); `None`: every position before it.
        window: Option<usize>,
    },
    /// Gated DeltaNet: conv, gates and gated norm (Qwen3.5).
    Gdn(Arc<GdnWeights>),
}

/// The frozen parts of one decoder layer, loaded once for decoding and
/// training alike.
pub struct Layer {
    /// In descriptor order: the mixer's (q, k, v, o; or in_proj_qkv,
    /// in_proj_z, in_proj_b, in_proj_a, out_proj), then gate, up, down.
    pub proj: Vec<Arc<dyn Projection>>,
    /// Attention or Gated DeltaNet.
    pub mixer: Mixer,
    /// `input_layernorm.weight` `[hidden]`.
    pub input_norm: Arc<Vec<f32>>,
    /// The norm before the MLP `[hidden]`: `post_attention_layernorm`
    /// (Llama, Qwen), `pre_feedforward_layernorm` (Gemma 3).
    pub mlp_norm: Arc<Vec<f32>>,
    /// Norms of the mixer's and the MLP's outputs before each residual add
    /// (Gemma 3's `post_attention_layernorm`, `post_feedforward_layernorm`).
    pub out_norms: Option<NormPair>,
}

/// What every layer of a model shares.
pub struct Consts {
    /// RMSNorm convention (residual stream and q/k norms).
    pub norm: NormWeight,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Head width.
    pub head_dim: usize,
    /// Attention's score scale.
    pub scale: f32,
    /// The MLP's gate activation.
    pub act: GateAct,
    /// Rotary inverse frequencies `[rotary_dim / 2]`.
    pub inv_freq: Arc<Vec<f32>>,
    /// Those of the sliding-window layers, which have their own base (Gemma 3).
    pub sliding_inv_freq: Option<Arc<Vec<f32>>>,
    /// How the tape's attention multiplies (bf16 operands beside bf16
    /// frozen weights); decoding always runs f32.
    pub products: Products,
}

impl Consts {
    /// From the configuration, with attention's products as `products`.
    pub fn new(cfg: &ModelConfig, products: Products) -> Self {
        let recipe = crate::model::arch::recipe(cfg.arch);
        Consts {
            norm: recipe.norm,
            eps: cfg.rms_norm_eps,
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            scale: cfg.attention_scale(),
            act: recipe.act,
            inv_freq: Arc::new(rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, &cfg.rope_scaling)),
            sliding_inv_freq: cfg.sliding.map(|s| Arc::new(rope_inv_freq(cfg.rotary_dim, s.rope_theta, &RopeScaling::Default))),
            products,
        }
    }

    /// The frequencies of a layer with `window` (a sliding layer's own).
    fn inv_freq(&self, window: Option<usize>) -> &Arc<Vec<f32>> {
        match (window, &self.sliding_inv_freq) {
            (Some(_), Some(f)) => f,
            _ => &self.inv_freq,
        }
    }
}

/// Loads every layer `desc` names from `src`; `make` builds each frozen
/// projection (CPU, or routed to the NPU).
pub fn load_layers(cfg: &ModelConfig, desc: &Descriptor, src: &dyn TensorSource, make: &ProjectionFactory<'_>) -> Result<Vec<Layer>> {
    desc.layers.iter().map(|ld| load_layer(cfg, ld, src, make)).collect()
}

fn load_layer(cfg: &ModelConfig, ld: &LayerDesc, src: &dyn TensorSource, make: &ProjectionFactory<'_>) -> Result<Layer> {
    let proj = ld
        .projections
        .iter()
        .map(|info| make(info.clone(), &src.get(&format!("{}.weight", info.name))?))
        .collect::<Result<Vec<_>>>()?;
    let tensor = |suffix: &str| -> Result<Vec<f32>> {
        let t = ld.tensors.iter().find(|t| t.name.ends_with(suffix)).expect("the descriptor lists it");
        src.get(&t.name)?.to_f32()
    };
    let shared = |suffix: &str| tensor(suffix).map(Arc::new);
    let recipe = crate::model::arch::recipe(cfg.arch);
    let mixer = match ld.kind {
        LayerKind::FullAttention | LayerKind::SlidingAttention => Mixer::Attention {
            qk_norm: match recipe.qk_norm {
                true => Some((shared(".q_norm.weight")?, shared(".k_norm.weight")?)),
                false => None,
            },
            gated: recipe.gated_attention,
            window: (ld.kind == LayerKind::SlidingAttention).then(|| cfg.sliding.map(|s| s.window)).flatten(),
        },
        LayerKind::LinearAttention => {
            let dims = cfg.gdn.ok_or_else(|| Error::invalid("model config", "linear-attention layer without GDN sizes"))?;
            Mixer::Gdn(Arc::new(GdnWeights::read(&tensor, dims, cfg.rms_norm_eps)?))
        }
    };
    let out_norms = match recipe.sandwich_norms {
        true => Some((shared("post_attention_layernorm.weight")?, shared("post_feedforward_layernorm.weight")?)),
        false => None,
    };
    Ok(Layer {
        proj,
        mixer,
        input_norm: shared("input_layernorm.weight")?,
        mlp_norm: shared(&format!("{}.weight", recipe.mlp_norm()))?,
        out_norms,
    })
}

/// The operations a layer forward runs, on the tape or on plain buffers.
pub trait Exec {
    /// An activation `[rows, features]`.
    type V;
    /// Projection `i` of the layer (descriptor order) of `h`.
    fn lin(&mut self, i: usize, h: &Self::V) -> Result<Self::V>;
    /// RMSNorm over rows of `w.len()` features (the residual stream, or
    /// each head).
    fn norm(&mut self, x: &Self::V, w: &Arc<Vec<f32>>) -> Result<Self::V>;
    /// Rotary embedding of `heads` heads with the layer's frequencies. It
    /// takes `x`: decoding rotates it in place; on the tape its value goes
    /// (read by no backward: RoPE's rotates dY back), activation memory.
    fn rope(&mut self, x: Self::V, heads: usize, window: Option<usize>) -> Result<Self::V>;
    /// Causal attention (decoding appends `k` and `v` to the layer's cache).
    fn attention(&mut self, q: &Self::V, k: &Self::V, v: &Self::V, window: Option<usize>) -> Result<Self::V>;
    /// The query half of q_proj's `[query | gate]` heads.
    fn query_of(&mut self, q_full: &Self::V) -> Result<Self::V>;
    /// `a * sigmoid(gate)`, the gate half of `q_full`'s heads.
    fn output_gate(&mut self, a: &Self::V, q_full: &Self::V) -> Result<Self::V>;
    /// The Gated DeltaNet core (decoding continues the layer's state).
    fn gdn(&mut self, qkv: &Self::V, z: &Self::V, b: &Self::V, a: &Self::V, w: &Arc<GdnWeights>) -> Result<Self::V>;
    /// `act(gate) * up`.
    fn gated(&mut self, gate: &Self::V, up: &Self::V, act: GateAct) -> Result<Self::V>;
    /// `a + b`, taking `a` (decoding adds in place: the residual stream).
    fn add(&mut self, a: Self::V, b: &Self::V) -> Result<Self::V>;
    /// `v` is read by no backward: its memory may go (the tape's hint).
    fn forget(&mut self, _v: &Self::V) {}
    /// `v` is cheap to rebuild in the backward: its memory may go.
    fn forget_recomputable(&mut self, _v: &Self::V) {}
}

/// One decoder layer: `x: [rows, hidden] -> [rows, hidden]`.
pub fn layer_forward<E: Exec>(e: &mut E, c: &Consts, layer: &Layer, x: E::V) -> Result<E::V> {
    let h = e.norm(&x, &layer.input_norm)?;
    let o = match &layer.mixer {
        Mixer::Attention { qk_norm, gated, window } => attention(e, c, qk_norm.as_ref(), *gated, *window, h)?,
        Mixer::Gdn(w) => {
            let (qkv, z, b, a) = (e.lin(0, &h)?, e.lin(1, &h)?, e.lin(2, &h)?, e.lin(3, &h)?);
            e.forget_recomputable(&h);
            let core = e.gdn(&qkv, &z, &b, &a, w)?;
            e.lin(4, &core)?
        }
    };
    let o = out_norm(e, o, layer.out_norms.as_ref().map(|n| &n.0))?;
    let x1 = e.add(x, &o)?;
    e.forget(&o);
    let n = layer.proj.len();
    let h2 = e.norm(&x1, &layer.mlp_norm)?;
    let (g, u) = (e.lin(n - 3, &h2)?, e.lin(n - 2, &h2)?);
    e.forget_recomputable(&h2);
    let m = e.gated(&g, &u, c.act)?;
    let d = e.lin(n - 1, &m)?;
    e.forget_recomputable(&m);
    let d = out_norm(e, d, layer.out_norms.as_ref().map(|n| &n.1))?;
    let y = e.add(x1, &d)?;
    e.forget(&d);
    Ok(y)
}

/// The attention mixer of the normed input `h`, up to and including o_proj.
fn attention<E: Exec>(e: &mut E, c: &Consts, qk_norm: Option<&NormPair>, gated: bool, window: Option<usize>, h: E::V) -> Result<E::V> {
    let q_full = e.lin(0, &h)?;
    // Qwen3.5's q_proj also emits the output gate, kept for after attention.
    let (q, gate) = match gated {
        true => (e.query_of(&q_full)?, Some(q_full)),
        false => (q_full, None),
    };
    let (k, v) = (e.lin(1, &h)?, e.lin(2, &h)?);
    // The normed input is read by the LoRA backwards but costs only an
    // elementwise pass to rebuild there (as are the MLP's normed input and
    // its gated product): a third less activation memory per layer.
    e.forget_recomputable(&h);
    let (q, k) = match qk_norm {
        Some((qn, kn)) => (e.norm(&q, qn)?, e.norm(&k, kn)?),
        None => (q, k),
    };
    let (q, k) = (e.rope(q, c.n_head, window)?, e.rope(k, c.n_kv_head, window)?);
    let a = e.attention(&q, &k, &v, window)?;
    let a = match &gate {
        Some(q_full) => e.output_gate(&a, q_full)?,
        None => a,
    };
    e.lin(3, &a)
}

/// `rmsnorm(y)` with Gemma 3's output norm `w`, or `y` itself. The norm's
/// backward reads `y`, so only its output may be forgotten after the
/// residual add.
fn out_norm<E: Exec>(e: &mut E, y: E::V, w: Option<&Arc<Vec<f32>>>) -> Result<E::V> {
    match w {
        Some(w) => e.norm(&y, w),
        None => Ok(y),
    }
}

/// Per-layer decoding state.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Attention layers keep keys and values.
    Kv(KvCache),
    /// Gated DeltaNet layers keep the conv history and the recurrent state.
    Gdn(GdnState),
}

/// Runs a layer on plain buffers for `positions` (consecutive, following
/// what `state` holds), continuing one sequence's state.
pub struct Decode<'a> {
    /// The model's shared constants.
    pub c: &'a Consts,
    /// The layer.
    pub layer: &'a Layer,
    /// Its state in the sequence.
    pub state: &'a mut LayerState,
    /// Positions of the rows.
    pub positions: &'a [usize],
}

impl Decode<'_> {
    fn wrong_state() -> Error {
        Error::invalid("decode state", "does not belong to this model")
    }
}

impl Exec for Decode<'_> {
    type V = Vec<f32>;

    fn lin(&mut self, i: usize, h: &Vec<f32>) -> Result<Vec<f32>> {
        project(&*self.layer.proj[i], h, self.positions.len())
    }

    fn norm(&mut self, x: &Vec<f32>, w: &Arc<Vec<f32>>) -> Result<Vec<f32>> {
        let mut y = vec![0.0; x.len()];
        let mut rstd = vec![0.0; x.len() / w.len()];
        rmsnorm_forward(&mut y, &mut rstd, x, w, self.c.norm, self.c.eps);
        Ok(y)
    }

    fn rope(&mut self, mut x: Vec<f32>, heads: usize, window: Option<usize>) -> Result<Vec<f32>> {
        rope_forward(&mut x, self.positions, heads, self.c.head_dim, self.c.inv_freq(window));
        Ok(x)
    }

    fn attention(&mut self, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>, window: Option<usize>) -> Result<Vec<f32>> {
        let LayerState::Kv(cache) = &mut *self.state else { return Err(Self::wrong_state()) };
        let (t, nh, nkv, hd) = (self.positions.len(), self.c.n_head, self.c.n_kv_head, self.c.head_dim);
        cache.k.extend_from_slice(k);
        cache.v.extend_from_slice(v);
        let kv_len = cache.k.len() / (nkv * hd);
        let dims = AttnDims { q_len: t, kv_len, n_head: nh, n_kv_head: nkv, head_dim: hd, causal: true };
        let mut out = vec![0.0; t * nh * hd];
        let mut lse = vec![0.0; t * nh];
        attention_forward_window(&mut out, &mut lse, q, &cache.k, &cache.v, dims, self.c.scale, window);
        if let Some(w) = window {
            cache.bound(w, nkv * hd);
        }
        Ok(out)
    }

    fn query_of(&mut self, q_full: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(query_half(q_full, self.c.head_dim))
    }

    fn output_gate(&mut self, a: &Vec<f32>, q_full: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(output_gate_forward(a, q_full, self.c.head_dim))
    }

    fn gdn(&mut self, qkv: &Vec<f32>, z: &Vec<f32>, b: &Vec<f32>, a: &Vec<f32>, w: &Arc<GdnWeights>) -> Result<Vec<f32>> {
        let LayerState::Gdn(state) = &mut *self.state else { return Err(Self::wrong_state()) };
        Ok(gdn_decode(w, qkv, z, b, a, self.positions.len(), state))
    }

    fn gated(&mut self, gate: &Vec<f32>, up: &Vec<f32>, act: GateAct) -> Result<Vec<f32>> {
        let mut y = vec![0.0; gate.len()];
        match act {
            GateAct::Silu => swiglu_forward(&mut y, gate, up),
            GateAct::GeluTanh => geglu_forward(&mut y, gate, up),
        }
        Ok(y)
    }

    fn add(&mut self, mut a: Vec<f32>, b: &Vec<f32>) -> Result<Vec<f32>> {
        a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        Ok(a)
    }
}

/// Records a layer on the tape over sequences of `seq` rows (each from
/// position 0): the training graphs' segment body.
pub struct Record<'a> {
    /// The tape.
    pub tape: &'a mut Tape,
    /// The model's shared constants.
    pub c: &'a Consts,
    /// The layer.
    pub layer: &'a Layer,
    /// The `(A, B)` pairs of the layer's adapted projections.
    pub params: &'a [Var],
    /// For each projection, the index of its pair in `params`.
    pub names: &'a [Option<usize>],
    /// LoRA scaling, dropout probability and dropout seed.
    pub lora: (f32, f32, u64),
    /// Projection `i`'s dropout stream is `derive(seed, stream.0 * stream.1 + i)`:
    /// the layer index and the architecture's stride.
    pub stream: (usize, usize),
    /// Record each adapted projection and its branch as two nodes.
    pub unfused: bool,
    /// Position of every row.
    pub positions: &'a Arc<Vec<usize>>,
    /// Rows per sequence.
    pub seq: usize,
    /// Attention masks the future (`false`: the embedder's full view).
    pub causal: bool,
}

impl Exec for Record<'_> {
    type V = Var;

    fn lin(&mut self, i: usize, h: &Var) -> Result<Var> {
        let proj = &self.layer.proj[i];
        let Some(k) = self.names[i] else { return self.tape.projection(*h, proj) };
        let (scaling, p, seed) = self.lora;
        let stream = (self.stream.0 * self.stream.1 + i) as u64;
        let dropout = (p > 0.0).then(|| crate::lora::branch::Dropout { p, seed: counter_rng::derive(seed, stream) });
        let (a, b) = (self.params[2 * k], self.params[2 * k + 1]);
        if self.unfused {
            let y = self.tape.projection(*h, proj)?;
            return self.tape.lora_add(y, *h, a, b, scaling, dropout);
        }
        self.tape.projection_lora(*h, proj, a, b, scaling, dropout)
    }

    fn norm(&mut self, x: &Var, w: &Arc<Vec<f32>>) -> Result<Var> {
        self.tape.rms_norm(*x, w, self.c.norm, self.c.eps)
    }

    fn rope(&mut self, x: Var, heads: usize, window: Option<usize>) -> Result<Var> {
        let y = self.tape.rope(x, self.positions, heads, self.c.head_dim, self.c.inv_freq(window))?;
        self.tape.forget(x);
        Ok(y)
    }

    fn attention(&mut self, q: &Var, k: &Var, v: &Var, window: Option<usize>) -> Result<Var> {
        let c = self.c;
        let dims = AttnDims { q_len: self.seq, kv_len: self.seq, n_head: c.n_head, n_kv_head: c.n_kv_head, head_dim: c.head_dim, causal: self.causal };
        self.tape.attention_window(*q, *k, *v, dims, c.scale, c.products, window)
    }

    fn query_of(&mut self, q_full: &Var) -> Result<Var> {
        self.tape.query_of(*q_full, self.c.head_dim)
    }

    fn output_gate(&mut self, a: &Var, q_full: &Var) -> Result<Var> {
        self.tape.output_gate(*a, *q_full, self.c.head_dim)
    }

    fn gdn(&mut self, qkv: &Var, z: &Var, b: &Var, a: &Var, w: &Arc<GdnWeights>) -> Result<Var> {
        self.tape.gdn(*qkv, *z, *b, *a, w, self.seq)
    }

    fn gated(&mut self, gate: &Var, up: &Var, act: GateAct) -> Result<Var> {
        match act {
            GateAct::Silu => self.tape.swiglu(*gate, *up),
            GateAct::GeluTanh => self.tape.geglu(*gate, *up),
        }
    }

    fn add(&mut self, a: Var, b: &Var) -> Result<Var> {
        self.tape.add(a, *b)
    }

    fn forget(&mut self, v: &Var) {
        self.tape.forget(*v);
    }

    fn forget_recomputable(&mut self, v: &Var) {
        self.tape.forget_recomputable(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu_projection::CpuProjection;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    fn projection(out_features: usize, in_features: usize, seed: f32) -> Arc<dyn Projection> {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Attention, out_features, in_features };
        let w = (0..out_features * in_features).map(|i| (i as f32 * seed).sin() * 0.5).collect();
        Arc::new(CpuProjection::new(info, w).unwrap())
    }

    /// A sliding-window layer decoding token by token keeps a bounded
    /// cache (dropped `w` at a time past `2 w`) and still gives what one
    /// call over the whole sequence gives (whose windowed attention
    /// `ops::attention` checks against f64).
    #[test]
    fn sliding_window_cache_stays_bounded_and_decodes_like_one_pass() {
        let (h, nh, nkv, hd, w, t, inter) = (8, 2, 1, 4, 3, 20, 6);
        let ones = Arc::new(vec![1.0f32; h]);
        let layer = Layer {
            proj: vec![
                projection(nh * hd, h, 0.37),
                projection(nkv * hd, h, 0.53),
                projection(nkv * hd, h, 0.71),
                projection(h, nh * hd, 0.29),
                projection(inter, h, 0.17),
                projection(inter, h, 0.23),
                projection(h, inter, 0.31),
            ],
            mixer: Mixer::Attention { qk_norm: None, gated: false, window: Some(w) },
            input_norm: ones.clone(),
            mlp_norm: ones,
            out_norms: None,
        };
        let c = Consts {
            norm: NormWeight::Plain,
            eps: 1e-6,
            n_head: nh,
            n_kv_head: nkv,
            head_dim: hd,
            scale: 0.5,
            act: GateAct::Silu,
            inv_freq: Arc::new(vec![1.0, 0.1]),
            sliding_inv_freq: Some(Arc::new(vec![0.5, 0.05])),
            products: Products::F32,
        };
        let x: Vec<f32> = (0..t * h).map(|i| (i as f32 * 0.13).cos()).collect();
        let positions: Vec<usize> = (0..t).collect();
        let mut whole_state = LayerState::Kv(KvCache::default());
        let mut e = Decode { c: &c, layer: &layer, state: &mut whole_state, positions: &positions };
        let whole = layer_forward(&mut e, &c, &layer, x.clone()).unwrap();
        let mut state = LayerState::Kv(KvCache::default());
        for p in 0..t {
            let mut e = Decode { c: &c, layer: &layer, state: &mut state, positions: &positions[p..p + 1] };
            let y = layer_forward(&mut e, &c, &layer, x[p * h..(p + 1) * h].to_vec()).unwrap();
            for (a, b) in y.iter().zip(&whole[p * h..(p + 1) * h]) {
                assert!((a - b).abs() < 1e-5, "token {p}: {a} vs {b}");
            }
            let LayerState::Kv(cache) = &state else { unreachable!() };
            let held = cache.k.len() / (nkv * hd);
            assert!(held <= 2 * w && held >= (p + 1).min(w - 1), "token {p}: {held} positions held");
        }
    }
}

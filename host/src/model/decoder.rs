//! The decoder-only model shared by every architecture: embedding (scaled
//! by `sqrt(hidden)` for Gemma 3), layers (token mixer + gated MLP, each a
//! pre-norm residual, Gemma 3 normalising their outputs too), final norm
//! and the vocabulary head, built from a [`Descriptor`] and a
//! [`TensorSource`].
//!
//! ```no_run
//! use hexlora::model::decoder::Model;
//! let model = Model::open("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let mut state = model.new_state();
//! let hidden = model.forward(&[1, 2, 3], &mut state)?;
//! let logits = model.logits(&hidden)?; // [3, vocab]
//! # Ok::<(), hexlora::Error>(())
//! ```
use crate::model::arch;
use crate::model::config::{LayerKind, ModelConfig};
use crate::ops::cpu_projection::{inference_projection, CpuProjection};
use crate::model::descriptor::{Descriptor, LayerDesc};
use crate::model::checkpoint::Checkpoint;
use crate::model::blocks::{read_vector, Attention, KvCache, Mlp};
use crate::model::qwen35::{GatedDeltaNet, GdnState, GdnWeights};
use crate::model::source::{RawTensor, TensorSource};
use crate::ops::rmsnorm::{rmsnorm_forward, NormWeight};
use crate::ops::rope::{rope_inv_freq, RopeScaling};
use crate::projection::{Direction, Projection, ProjectionInfo, ProjectionKind};
use crate::{Error, Result};
use std::path::Path;
use std::sync::Arc;

/// The token mixer of a layer.
pub enum Mixer {
    /// Softmax attention.
    Attention(Attention),
    /// Gated DeltaNet.
    Gdn(GatedDeltaNet),
}

/// One decoder layer: `x += mixer(norm(x)); x += mlp(norm(x))`, Gemma 3
/// normalising each block's output before the residual add too.
pub struct Layer {
    /// `input_layernorm.weight` `[hidden]`.
    pub input_norm: Vec<f32>,
    /// Attention or Gated DeltaNet.
    pub mixer: Mixer,
    /// Norm of the mixer's output, `post_attention_layernorm.weight`
    /// `[hidden]` (Gemma 3).
    pub mixer_out_norm: Option<Vec<f32>>,
    /// Norm before the MLP `[hidden]`: `post_attention_layernorm.weight`
    /// (Llama, Qwen), `pre_feedforward_layernorm.weight` (Gemma 3).
    pub mlp_norm: Vec<f32>,
    /// Gated MLP.
    pub mlp: Mlp,
    /// Norm of the MLP's output, `post_feedforward_layernorm.weight`
    /// `[hidden]` (Gemma 3).
    pub mlp_out_norm: Option<Vec<f32>>,
}

/// Per-layer decoding state.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// Attention layers keep keys and values.
    Kv(KvCache),
    /// Gated DeltaNet layers keep the conv history and the recurrent state.
    Gdn(GdnState),
}

/// Everything a model carries between calls while decoding one sequence.
#[derive(Clone, Debug)]
pub struct DecodeState {
    /// Tokens processed so far (the next token's position).
    pub pos: usize,
    /// One per layer.
    pub layers: Vec<LayerState>,
}

/// A loaded model.
pub struct Model {
    /// Sizes.
    pub config: ModelConfig,
    /// Names, shapes and ops.
    pub descriptor: Descriptor,
    /// Embedding table `[vocab, hidden]`, as stored (a quantized table
    /// stays in its blocks: its rows are read per token).
    pub embed: Arc<dyn Projection>,
    /// Decoder layers.
    pub layers: Vec<Layer>,
    /// Final norm weight `[hidden]`.
    pub final_norm: Vec<f32>,
    /// The vocabulary head `[vocab, hidden]`: `lm_head.weight`, or the
    /// embedding table itself when tied.
    pub head: Arc<dyn Projection>,
    /// RMSNorm convention of residual-stream and q/k norms.
    pub norm: NormWeight,
    /// Rotary inverse frequencies `[rotary_dim / 2]`.
    pub inv_freq: Vec<f32>,
    /// Those of the sliding-window layers, which have their own base.
    pub sliding_inv_freq: Option<Vec<f32>>,
    /// Factor of the embedding rows (Gemma 3: `sqrt(hidden)` rounded to
    /// f32, as transformers multiplies in the weights' dtype, f32 here).
    pub embed_scale: Option<f32>,
}

/// Builds the [`Projection`] for one frozen weight (CPU by default; the
/// split runtime passes its own to route projections to the NPU).
pub type ProjectionFactory<'a> = dyn Fn(ProjectionInfo, &RawTensor<'_>) -> Result<Arc<dyn Projection>> + 'a;

/// Builds each frozen projection once, by name: two models over one
/// checkpoint (the answering model and a training graph) then hold one
/// copy of the base weights.
pub struct SharedProjections<'a> {
    make: &'a ProjectionFactory<'a>,
    built: std::cell::RefCell<std::collections::HashMap<String, Arc<dyn Projection>>>,
}

impl<'a> SharedProjections<'a> {
    /// Projections made by `make`, each at its first request.
    pub fn new(make: &'a ProjectionFactory<'a>) -> Self {
        SharedProjections { make, built: Default::default() }
    }

    /// The projection of `info.name`, built on first use.
    pub fn get(&self, info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Arc<dyn Projection>> {
        if let Some(p) = self.built.borrow().get(&info.name) {
            return Ok(p.clone());
        }
        let p = (self.make)(info.clone(), raw)?;
        self.built.borrow_mut().insert(info.name, p.clone());
        Ok(p)
    }
}

/// The default factory: dense f32 on the CPU.
pub fn cpu_projection(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Arc<dyn Projection>> {
    Ok(Arc::new(CpuProjection::from_raw(info, raw)?))
}

impl Model {
    /// Opens a GGUF file or a Hugging Face directory with dense f32 CPU
    /// projections (the embedding and head stay as stored). `generate`
    /// keeps a quantized file's projections in their blocks instead
    /// (`inference_projection`); both give the same bits, because the
    /// decoding kernel reads blocks and their dequantized f32 alike
    /// (`ops::quant_matvec`'s tests) and longer products dequantize first.
    pub fn open(path: &Path) -> Result<Self> {
        let ckpt = Checkpoint::open(path)?;
        Self::load(ckpt.config.clone(), ckpt.tensors(), &cpu_projection)
    }

    /// Builds the model for `config` from `src`, after checking that every
    /// tensor the descriptor names is present with the right size.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, make: &ProjectionFactory<'_>) -> Result<Self> {
        let descriptor = Descriptor::new(&config);
        descriptor.check(src)?;
        let layers = descriptor
            .layers
            .iter()
            .map(|l| load_layer(&config, &descriptor, l, src, make))
            .collect::<Result<Vec<_>>>()?;
        let table = |name: &str| {
            let info = ProjectionInfo { name: name.into(), kind: ProjectionKind::Mlp, out_features: config.vocab_size, in_features: config.hidden_size };
            inference_projection(info, &src.get(name)?)
        };
        let embed = table(&descriptor.embed.name)?;
        let head = match &descriptor.lm_head {
            Some(t) => table(&t.name)?,
            None => embed.clone(),
        };
        let inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, &config.rope_scaling);
        let sliding_inv_freq = config.sliding.map(|s| rope_inv_freq(config.rotary_dim, s.rope_theta, &RopeScaling::Default));
        let embed_scale = arch::recipe(config.arch).embed_scale(config.hidden_size);
        Ok(Model {
            final_norm: read_vector(src, &descriptor.final_norm.name)?,
            norm: descriptor.norm,
            descriptor,
            embed,
            layers,
            head,
            inv_freq,
            sliding_inv_freq,
            embed_scale,
            config,
        })
    }

    /// A fresh state for a new sequence.
    pub fn new_state(&self) -> DecodeState {
        let layers = self
            .config
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::FullAttention | LayerKind::SlidingAttention => LayerState::Kv(KvCache::default()),
                LayerKind::LinearAttention => {
                    LayerState::Gdn(GdnState::new(self.config.gdn.as_ref().expect("GDN layers have a GDN config")))
                }
            })
            .collect();
        DecodeState { pos: 0, layers }
    }

    /// Runs `ids` (continuing `state`) and returns the final-normed hidden
    /// states `[ids.len(), hidden]`.
    pub fn forward(&self, ids: &[u32], state: &mut DecodeState) -> Result<Vec<f32>> {
        let (t, h) = (ids.len(), self.config.hidden_size);
        let mut x = vec![0.0; t * h];
        // The embedding rows times 1 (exact): the gather reads a quantized
        // table's rows in place.
        let vocab = self.config.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::invalid("token id", format!("{id} is outside the vocabulary of {vocab}")));
        }
        let rows: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
        self.embed.scaled_rows(&rows, &vec![1.0; t], &mut x)?;
        if let Some(s) = self.embed_scale {
            // After the gather, as transformers: (d q) s, not d (q s).
            x.iter_mut().for_each(|v| *v *= s);
        }
        let positions: Vec<usize> = (state.pos..state.pos + t).collect();
        let eps = self.config.rms_norm_eps;
        let mut normed = vec![0.0; x.len()];
        let mut rstd = vec![0.0; t];
        for ((layer, ls), kind) in self.layers.iter().zip(state.layers.iter_mut()).zip(&self.config.layer_types) {
            rmsnorm_forward(&mut normed, &mut rstd, &x, &layer.input_norm, self.norm, eps);
            let inv_freq = match (kind, &self.sliding_inv_freq) {
                (LayerKind::SlidingAttention, Some(f)) => f,
                _ => &self.inv_freq,
            };
            let mixed = match (&layer.mixer, ls) {
                (Mixer::Attention(a), LayerState::Kv(cache)) => a.forward(&normed, &positions, inv_freq, cache)?,
                (Mixer::Gdn(g), LayerState::Gdn(s)) => g.forward(&normed, t, s)?,
                _ => return Err(Error::invalid("decode state", "does not belong to this model")),
            };
            self.residual_add(&mut x, mixed, layer.mixer_out_norm.as_deref());
            rmsnorm_forward(&mut normed, &mut rstd, &x, &layer.mlp_norm, self.norm, eps);
            self.residual_add(&mut x, layer.mlp.forward(&normed, t)?, layer.mlp_out_norm.as_deref());
        }
        rmsnorm_forward(&mut normed, &mut rstd, &x, &self.final_norm, self.norm, eps);
        state.pos += t;
        Ok(normed)
    }

    /// `logits[rows, vocab]` for `hidden[rows, hidden]`.
    pub fn logits(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        let rows = hidden.len() / self.config.hidden_size;
        let mut out = vec![0.0; rows * self.config.vocab_size];
        self.head.apply(Direction::Forward, hidden, rows, &mut out)?;
        Ok(out)
    }

    /// `x += y`, or `x += norm(y)` with the output norm `out_norm` (Gemma 3).
    fn residual_add(&self, x: &mut [f32], y: Vec<f32>, out_norm: Option<&[f32]>) {
        let Some(w) = out_norm else { return add(x, &y) };
        let mut normed = vec![0.0; y.len()];
        let mut rstd = vec![0.0; y.len() / w.len()];
        rmsnorm_forward(&mut normed, &mut rstd, &y, w, self.norm, self.config.rms_norm_eps);
        add(x, &normed);
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn load_layer(
    cfg: &ModelConfig,
    desc: &Descriptor,
    l: &LayerDesc,
    src: &dyn TensorSource,
    make: &ProjectionFactory<'_>,
) -> Result<Layer> {
    let proj = |suffix: &str| -> Result<Arc<dyn Projection>> {
        let info = l.projections.iter().find(|p| p.name.ends_with(suffix)).expect("descriptor lists it");
        make(info.clone(), &src.get(&format!("{}.weight", info.name))?)
    };
    let tensor = |suffix: &str| -> Result<Vec<f32>> {
        let t = l.tensors.iter().find(|t| t.name.ends_with(suffix)).expect("descriptor lists it");
        read_vector(src, &t.name)
    };
    let recipe = arch::recipe(cfg.arch);
    let mixer = match l.kind {
        LayerKind::FullAttention | LayerKind::SlidingAttention => Mixer::Attention(Attention {
            q: proj(".q_proj")?,
            k: proj(".k_proj")?,
            v: proj(".v_proj")?,
            o: proj(".o_proj")?,
            qk_norm: match recipe.qk_norm {
                true => Some((tensor(".q_norm.weight")?, tensor(".k_norm.weight")?)),
                false => None,
            },
            norm: desc.norm,
            gated: recipe.gated_attention,
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            eps: cfg.rms_norm_eps,
            scale: cfg.attention_scale(),
            window: (l.kind == LayerKind::SlidingAttention).then(|| cfg.sliding.map(|s| s.window)).flatten(),
        }),
        LayerKind::LinearAttention => Mixer::Gdn(GatedDeltaNet {
            in_proj_qkv: proj("in_proj_qkv")?,
            in_proj_z: proj("in_proj_z")?,
            in_proj_b: proj("in_proj_b")?,
            in_proj_a: proj("in_proj_a")?,
            out_proj: proj("out_proj")?,
            weights: Arc::new(GdnWeights::read(&tensor, cfg.gdn.expect("GDN layers have a GDN config"), cfg.rms_norm_eps)?),
        }),
    };
    let optional = |suffix: &str| if recipe.sandwich_norms { tensor(suffix).map(Some) } else { Ok(None) };
    Ok(Layer {
        input_norm: tensor("input_layernorm.weight")?,
        mixer,
        mixer_out_norm: optional("post_attention_layernorm.weight")?,
        mlp_norm: tensor(&format!("{}.weight", recipe.mlp_norm()))?,
        mlp: Mlp { gate: proj("gate_proj")?, up: proj("up_proj")?, down: proj("down_proj")?, act: recipe.act },
        mlp_out_norm: optional("post_feedforward_layernorm.weight")?,
    })
}

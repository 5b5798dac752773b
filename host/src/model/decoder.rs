//! The decoding model of every architecture: embedding (scaled by
//! `sqrt(hidden)` for Gemma 3), the layers run by the one layer forward
//! ([`crate::model::layer`], with a KV cache or GDN state per layer), final
//! norm and the vocabulary head, built from a [`Descriptor`] and a
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
use crate::model::descriptor::Descriptor;
use crate::model::checkpoint::Checkpoint;
use crate::model::blocks::{read_vector, KvCache};
use crate::model::layer::{layer_forward, load_layers, Consts, Decode, Layer};
pub use crate::model::layer::LayerState;
use crate::model::qwen35::GdnState;
use crate::model::source::{RawTensor, TensorSource};
use crate::ops::attention::Products;
use crate::ops::rmsnorm::rmsnorm_forward;
use crate::projection::{Direction, Projection, ProjectionInfo, ProjectionKind};
use crate::{Error, Result};
use std::path::Path;
use std::sync::Arc;

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
    /// What every layer shares (norm convention, heads, RoPE frequencies).
    pub consts: Consts,
    /// Final norm weight `[hidden]`.
    pub final_norm: Vec<f32>,
    /// The vocabulary head `[vocab, hidden]`: `lm_head.weight`, or the
    /// embedding table itself when tied.
    pub head: Arc<dyn Projection>,
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
        let layers = load_layers(&config, &descriptor, src, make)?;
        let table = |name: &str| {
            let info = ProjectionInfo { name: name.into(), kind: ProjectionKind::Mlp, out_features: config.vocab_size, in_features: config.hidden_size };
            inference_projection(info, &src.get(name)?)
        };
        let embed = table(&descriptor.embed.name)?;
        let head = match &descriptor.lm_head {
            Some(t) => table(&t.name)?,
            None => embed.clone(),
        };
        // Decoding's attention runs f32 whatever the weights' dtype.
        let consts = Consts::new(&config, Products::F32);
        let embed_scale = arch::recipe(config.arch).embed_scale(config.hidden_size);
        Ok(Model {
            final_norm: read_vector(src, &descriptor.final_norm.name)?,
            descriptor,
            embed,
            layers,
            consts,
            head,
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
        if state.layers.len() != self.layers.len() {
            return Err(Error::invalid("decode state", "does not belong to this model"));
        }
        let positions: Vec<usize> = (state.pos..state.pos + t).collect();
        for (layer, ls) in self.layers.iter().zip(state.layers.iter_mut()) {
            let mut e = Decode { c: &self.consts, layer, state: ls, positions: &positions };
            x = layer_forward(&mut e, &self.consts, layer, x)?;
        }
        let mut normed = vec![0.0; x.len()];
        let mut rstd = vec![0.0; t];
        rmsnorm_forward(&mut normed, &mut rstd, &x, &self.final_norm, self.consts.norm, self.config.rms_norm_eps);
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
}

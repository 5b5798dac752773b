//! The training graph of Qwen3.5 (Gated DeltaNet layers interleaved with
//! gated full-attention layers): f32 embeddings, one recomputable segment
//! per layer whose body is the one layer forward
//! ([`crate::model::layer`], recorded on the tape; every sequence from a
//! zero state), the final norm and the vocabulary head + loss.
//!
//! Frozen projections are built by a [`ProjectionFactory`] (kind
//! `Recurrent` for the GDN ones, from the descriptor), so the split runtime
//! can route them to the NPU with FP16 weights.
use crate::autograd::graph::{layer_lora_params, projection_infos, token_rows, Batch, GraphOptions, LoraVars, TrainableModel};
use crate::autograd::{SegmentFn, Tape, Var};
use crate::model::config::{Arch, ModelConfig};
use crate::ops::cpu_projection::CpuProjection;
use crate::model::decoder::ProjectionFactory;
use crate::model::descriptor::Descriptor;
use crate::model::layer::{layer_forward, load_layers, Consts, Layer, Record};
use crate::model::source::TensorSource;
use crate::ops::attention::Products;
use crate::ops::embedding::embedding_forward;
use crate::projection::{Projection, ProjectionInfo, ProjectionKind};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::sync::Arc;

struct Shared {
    cfg: ModelConfig,
    layers: Vec<Layer>,
    consts: Consts,
}

/// A Qwen3.5 model ready to be differentiated.
pub struct Qwen35Graph {
    shared: Arc<Shared>,
    /// `[vocab, hidden]` token embeddings.
    embed: Arc<Vec<f32>>,
    final_norm: Arc<Vec<f32>>,
    head: Arc<dyn Projection>,
}

fn f32_tensor(src: &dyn TensorSource, name: &str) -> Result<Vec<f32>> {
    src.get(name)?.to_f32()
}

impl Qwen35Graph {
    /// Loads a Qwen3.5 checkpoint with CPU f32 projections.
    pub fn load(src: &dyn TensorSource, cfg: ModelConfig) -> Result<Self> {
        Self::load_with(src, cfg, &crate::model::decoder::cpu_projection)
    }

    /// Like [`Qwen35Graph::load`], with `make` building every per-layer
    /// frozen projection. The vocabulary head stays on the CPU.
    pub fn load_with(src: &dyn TensorSource, cfg: ModelConfig, make: &ProjectionFactory<'_>) -> Result<Self> {
        if cfg.arch != Arch::Qwen35 {
            return Err(Error::invalid("Qwen35Graph", format!("{:?} is not a Qwen3.5 model", cfg.arch)));
        }
        let desc = Descriptor::new(&cfg);
        desc.check(src)?;
        let layers = load_layers(&cfg, &desc, src, make)?;
        let embed = Arc::new(f32_tensor(src, &desc.embed.name)?);
        let head_info = ProjectionInfo { name: "lm_head".into(), kind: ProjectionKind::Mlp, out_features: cfg.vocab_size, in_features: cfg.hidden_size };
        let head_w = match &desc.lm_head {
            Some(t) => f32_tensor(src, &t.name)?,
            None => embed.as_ref().clone(),
        };
        let head: Arc<dyn Projection> = Arc::new(CpuProjection::new(head_info, head_w)?);
        let final_norm = Arc::new(f32_tensor(src, &desc.final_norm.name)?);
        let consts = Consts::new(&cfg, Products::F32);
        Ok(Qwen35Graph { shared: Arc::new(Shared { cfg, layers, consts }), embed, final_norm, head })
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.shared.cfg
    }
}

impl TrainableModel for Qwen35Graph {
    fn projections(&self) -> Vec<ProjectionInfo> {
        projection_infos(self.shared.layers.iter().map(|l| &l.proj[..]))
    }

    fn layer_count(&self) -> usize {
        self.shared.layers.len()
    }

    fn activation_bytes_per_token_layer(&self) -> usize {
        let c = &self.shared.cfg;
        let g = c.gdn.map_or(0, |g| 3 * g.conv_dim() + 4 * g.value_dim() + g.n_v_head * g.k_dim * g.v_dim / super::gdn_node::CHECKPOINT_EVERY);
        let attn = 2 * (2 * c.n_head + 2 * c.n_kv_head) * c.head_dim;
        4 * (8 * c.hidden_size + 4 * c.intermediate_size + g.max(attn))
    }

    fn loss(&self, tape: &mut Tape, batch: &Batch, lora: &LoraVars, opts: &GraphOptions, logits: Option<&mut Vec<f32>>) -> Result<Var> {
        batch.dims()?;
        let h = self.hidden_states(tape, &batch.input_ids, lora, &opts.recompute_layers, true)?;
        let targets = batch.targets();
        let denom = opts.denominator(&targets);
        let chunk = if opts.head_chunk == 0 { 64 } else { opts.head_chunk };
        tape.head_loss(h, &self.head, &targets, denom, chunk, logits)
    }

    fn hidden_size(&self) -> usize {
        self.shared.cfg.hidden_size
    }

    fn hidden_states(&self, tape: &mut Tape, input_ids: &[Vec<u32>], lora: &LoraVars, recompute_layers: &[bool], causal: bool) -> Result<Var> {
        let (b, seq) = token_rows(input_ids)?;
        let cfg = &self.shared.cfg;
        let mut x = Tensor::zeros(&[b * seq, cfg.hidden_size]);
        embedding_forward(&mut x.data, &input_ids.concat(), &self.embed, cfg.hidden_size)?;
        let mut x = tape.constant(x);
        let positions = Arc::new((0..b).flat_map(|_| 0..seq).collect::<Vec<_>>());
        for (l, layer) in self.shared.layers.iter().enumerate() {
            let (params, names) = layer_lora_params(lora, &layer.proj);
            let (shared, positions, lora) = (self.shared.clone(), positions.clone(), (lora.scaling, lora.dropout, lora.dropout_seed));
            let f: SegmentFn = Arc::new(move |tape: &mut Tape, x: Var, params: &[Var]| {
                let (c, layer) = (&shared.consts, &shared.layers[l]);
                // Each adapted projection records its frozen product, then its
                // branch; dropout streams `l * 8 + i`.
                let mut e = Record { tape, c, layer, params, names: &names, lora, stream: (l, 8), unfused: true, positions: &positions, seq, causal };
                layer_forward(&mut e, c, layer, x)
            });
            let recompute = recompute_layers.get(l).copied().unwrap_or(false);
            x = tape.segment(&f, x, &params, recompute)?;
        }
        tape.rms_norm(x, &self.final_norm, self.shared.consts.norm, cfg.rms_norm_eps)
    }

    fn head(&self) -> &Arc<dyn Projection> {
        &self.head
    }
}

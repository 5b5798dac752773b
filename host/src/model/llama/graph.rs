//! The training graph of the attention decoders (Llama, Qwen3, Gemma 3):
//! embeddings (held in the frozen dtype), one recomputable segment per
//! layer whose body is the one layer forward ([`crate::model::layer`],
//! recorded on the tape), the final norm and the fused vocabulary head +
//! loss over vocabulary slices.
//!
//! Frozen weights are only reached through [`Projection`]s, which callers may
//! swap (the split runtime routes them to the NPU).
use crate::autograd::graph::{layer_lora_params, projection_infos, token_rows, Batch, GraphOptions, LoraVars, TrainableModel};
use crate::autograd::{SegmentFn, Tape, Var};
use crate::model::arch;
use crate::model::config::{LayerKind, ModelConfig};
use crate::ops::cpu_projection::{Bf16Projection, CpuProjection, FrozenDtype};
use crate::model::decoder::ProjectionFactory;
use crate::model::descriptor::Descriptor;
use crate::model::layer::{layer_forward, load_layers, Consts, Layer, Record};
use crate::model::source::{DType, RawTensor, TensorSource};
use crate::ops::attention::Products;
use crate::ops::bf16_matmul::Bf16Matrix;
use crate::ops::cross_entropy::slice_rows;
use crate::ops::embedding::embedding_forward;
use crate::ops::quant_bf16::decode_rows;
use crate::projection::{Projection, ProjectionInfo, ProjectionKind};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::sync::Arc;

struct Shared {
    cfg: ModelConfig,
    layers: Vec<Layer>,
    /// Norm convention, heads, RoPE frequencies, score scale, gate
    /// activation; attention's products: operands rounded to bf16 on the
    /// AMX tiles when the frozen weights are bf16 (the products with them
    /// round their activations the same way), f32 otherwise.
    consts: Consts,
    /// Factor of the embedding rows (Gemma 3's `sqrt(hidden)` in f32).
    embed_scale: Option<f32>,
}

/// A Llama, Qwen3 or Gemma 3 model ready to be differentiated.
pub struct DecoderGraph {
    shared: Arc<Shared>,
    /// `[vocab, hidden]` token embeddings.
    embed: EmbedTable,
    final_norm: Arc<Vec<f32>>,
    /// The whole `[vocab, hidden]` head (a window over the tied embedding
    /// when the checkpoint has no `lm_head`: nothing copied).
    head: Arc<dyn Projection>,
    /// The same weight as vocabulary slices for the fused head + loss.
    head_slices: Vec<Arc<dyn Projection>>,
    /// `hexlora train --no-fuse`: always record the unfused pair.
    unfused_lora: bool,
}

fn f32_tensor(src: &dyn TensorSource, name: &str) -> Result<Arc<Vec<f32>>> {
    Ok(Arc::new(src.get(name)?.to_f32()?))
}

/// The `[vocab, hidden]` token embeddings in the frozen dtype. With bf16 a
/// tied head shares the table, so no f32 copy of it stays resident; where
/// the CPU decodes the checkpoint's blocks (Q4_0/Q4_1/Q8_0, AVX-512) the
/// table is those blocks, the same values in half the bytes or less.
#[derive(Clone)]
enum EmbedTable {
    F32(Arc<Vec<f32>>),
    Bf16(Arc<Bf16Matrix>),
    /// `rows` rows of blocks of `dtype`.
    Blocks { dtype: DType, bytes: Arc<Vec<u8>>, rows: usize },
}

impl EmbedTable {
    /// The bf16 table of a checkpoint tensor `[rows, cols]`: its blocks
    /// where [`Bf16Projection::holds_blocks_of`] says so, else a bf16 copy.
    fn bf16(raw: &RawTensor<'_>, (rows, cols): (usize, usize)) -> Result<EmbedTable> {
        if Bf16Projection::holds_blocks_of(raw.dtype) {
            raw.checked_row_bytes()?;
            return Ok(EmbedTable::Blocks { dtype: raw.dtype, bytes: Arc::new(raw.bytes.to_vec()), rows });
        }
        Ok(EmbedTable::Bf16(Arc::new(Bf16Matrix::from_f32(&raw.to_f32()?, rows, cols))))
    }

    /// `out[t, :] = table[ids[t], :]` (`out: [ids.len(), dim]`).
    fn lookup(&self, out: &mut [f32], ids: &[u32], dim: usize) -> Result<()> {
        let vocab = match self {
            EmbedTable::F32(t) => return embedding_forward(out, ids, t, dim),
            EmbedTable::Bf16(t) => t.rows(),
            EmbedTable::Blocks { rows, .. } => *rows,
        };
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::invalid("token id", format!("{id} is outside the vocabulary of {vocab}")));
        }
        match self {
            EmbedTable::Bf16(table) => {
                for (row, &id) in out.chunks_exact_mut(dim).zip(ids) {
                    row.iter_mut().zip(table.row(id as usize)).for_each(|(o, w)| *o = w.to_f32());
                }
            }
            EmbedTable::Blocks { dtype, bytes, .. } => {
                // the rows' blocks side by side, decoded in one call
                let row_bytes = bytes.len() / vocab;
                let picked: Vec<u8> = ids.iter().flat_map(|&id| &bytes[id as usize * row_bytes..(id as usize + 1) * row_bytes]).copied().collect();
                let mut bits = vec![0u16; ids.len() * dim];
                decode_rows(*dtype, &picked, dim, &mut bits);
                out.iter_mut().zip(bits).for_each(|(o, b)| *o = half::bf16::from_bits(b).to_f32());
            }
            EmbedTable::F32(_) => unreachable!("returned above"),
        }
        Ok(())
    }
}

/// The vocabulary head's table: the untied `lm_head` or the embeddings.
fn head_table(src: &dyn TensorSource, desc: &Descriptor, embed: &EmbedTable, cfg: &ModelConfig) -> Result<EmbedTable> {
    let Some(t) = &desc.lm_head else {
        return Ok(embed.clone());
    };
    let raw = src.get(&t.name)?;
    match embed {
        EmbedTable::F32(_) => Ok(EmbedTable::F32(Arc::new(raw.to_f32()?))),
        _ => EmbedTable::bf16(&raw, (cfg.vocab_size, cfg.hidden_size)),
    }
}

/// A row window of the head table as a projection.
fn head_window(table: &EmbedTable, info: ProjectionInfo, first: usize) -> Result<Arc<dyn Projection>> {
    Ok(match table {
        EmbedTable::F32(t) => Arc::new(CpuProjection::window(info, t.clone(), first)?),
        EmbedTable::Bf16(t) => Arc::new(Bf16Projection::window(info, t.clone(), first)?),
        EmbedTable::Blocks { dtype, bytes, .. } => Arc::new(Bf16Projection::block_window(info, *dtype, bytes.clone(), first)?),
    })
}

impl DecoderGraph {
    /// Loads every tensor of `cfg`'s architecture from `src` with CPU f32
    /// projections. Qwen3.5 (Gated DeltaNet) has its own graph.
    pub fn load(src: &dyn TensorSource, cfg: ModelConfig) -> Result<Self> {
        Self::load_with(src, cfg, &crate::ops::cpu_projection::factory(FrozenDtype::F32), FrozenDtype::F32)
    }

    /// `make` builds every per-layer frozen projection (CPU in some dtype,
    /// or routed to the NPU service by the split runtime); embeddings and
    /// the vocabulary head are held in `tables`, which also picks
    /// attention's products (bf16 tables: bf16 operands).
    pub fn load_with(src: &dyn TensorSource, cfg: ModelConfig, make: &ProjectionFactory<'_>, tables: FrozenDtype) -> Result<Self> {
        let recipe = arch::recipe(cfg.arch);
        if recipe.gated_attention || cfg.layer_types.contains(&LayerKind::LinearAttention) {
            return Err(Error::Unsupported("Qwen3.5 (Gated DeltaNet layers) has a graph of its own".into()));
        }
        let desc = Descriptor::new(&cfg);
        desc.check(src)?;
        let layers = load_layers(&cfg, &desc, src, make)?;
        let embed = match tables {
            FrozenDtype::F32 => EmbedTable::F32(f32_tensor(src, &desc.embed.name)?),
            FrozenDtype::Bf16 => EmbedTable::bf16(&src.get(&desc.embed.name)?, (cfg.vocab_size, cfg.hidden_size))?,
        };
        let head_info = ProjectionInfo { name: "lm_head".into(), kind: ProjectionKind::Mlp, out_features: cfg.vocab_size, in_features: cfg.hidden_size };
        let head_w = head_table(src, &desc, &embed, &cfg)?;
        let head = head_window(&head_w, head_info.clone(), 0)?;
        let head_slices = slice_rows(cfg.vocab_size)
            .into_iter()
            .map(|(first, rows)| head_window(&head_w, ProjectionInfo { out_features: rows, ..head_info.clone() }, first))
            .collect::<Result<_>>()?;
        let final_norm = f32_tensor(src, &desc.final_norm.name)?;
        let products = match tables {
            FrozenDtype::F32 => Products::F32,
            FrozenDtype::Bf16 => Products::Bf16,
        };
        let consts = Consts::new(&cfg, products);
        let embed_scale = recipe.embed_scale(cfg.hidden_size);
        let shared = Shared { cfg, layers, consts, embed_scale };
        Ok(DecoderGraph { shared: Arc::new(shared), embed, final_norm, head, head_slices, unfused_lora: false })
    }

    /// Opens a GGUF file or a Hugging Face directory (CPU projections, f32).
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let ckpt = crate::model::checkpoint::Checkpoint::open(path)?;
        Self::load(ckpt.tensors(), ckpt.config.clone())
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.shared.cfg
    }

    /// Records every adapted projection as the unfused pair (frozen product
    /// node, then LoRA branch node) whatever [`GraphOptions::unfused_lora`]
    /// says: `hexlora train --no-fuse`.
    pub fn set_unfused_lora(&mut self, unfused: bool) {
        self.unfused_lora = unfused;
    }

    /// [`TrainableModel::hidden_states`] with the fused/unfused LoRA choice.
    fn layers_and_norm(&self, tape: &mut Tape, input_ids: &[Vec<u32>], lora: &LoraVars, recompute_layers: &[bool], causal: bool, unfused: bool) -> Result<Var> {
        let (b, seq) = token_rows(input_ids)?;
        let cfg = &self.shared.cfg;
        let ids: Vec<u32> = input_ids.concat();
        let mut x = Tensor::zeros(&[b * seq, cfg.hidden_size]);
        self.embed.lookup(&mut x.data, &ids, cfg.hidden_size)?;
        if let Some(s) = self.shared.embed_scale {
            // After the gather, as transformers multiplies the looked-up rows.
            x.data.iter_mut().for_each(|v| *v *= s);
        }
        let mut x = tape.constant(x);
        let positions = Arc::new((0..b).flat_map(|_| 0..seq).collect::<Vec<_>>());
        for l in 0..self.shared.layers.len() {
            let (params, names) = layer_lora_params(lora, &self.shared.layers[l].proj);
            let f = layer_segment(self.shared.clone(), l, names, (lora.scaling, lora.dropout, lora.dropout_seed), positions.clone(), seq, causal, unfused);
            let recompute = recompute_layers.get(l).copied().unwrap_or(false);
            x = tape.segment(&f, x, &params, recompute)?;
        }
        tape.rms_norm(x, &self.final_norm, self.shared.consts.norm, cfg.rms_norm_eps)
    }
}

/// One layer as a segment: `params` are the `(A, B)` pairs of its adapted
/// projections, in `names` order; the body is the one layer forward.
#[allow(clippy::too_many_arguments)]
fn layer_segment(shared: Arc<Shared>, l: usize, names: Vec<Option<usize>>, lora: (f32, f32, u64), positions: Arc<Vec<usize>>, seq: usize, causal: bool, unfused: bool) -> SegmentFn {
    Arc::new(move |tape: &mut Tape, x: Var, params: &[Var]| {
        let (c, layer) = (&shared.consts, &shared.layers[l]);
        // Dropout streams `l * 7 + i`: seven projections a layer.
        let mut e = Record { tape, c, layer, params, names: &names, lora, stream: (l, 7), unfused, positions: &positions, seq, causal };
        layer_forward(&mut e, c, layer, x)
    })
}

impl TrainableModel for DecoderGraph {
    fn projections(&self) -> Vec<ProjectionInfo> {
        projection_infos(self.shared.layers.iter().map(|l| &l.proj[..]))
    }

    fn layer_count(&self) -> usize {
        self.shared.layers.len()
    }

    fn activation_bytes_per_token_layer(&self) -> usize {
        let c = &self.shared.cfg;
        // Kept to the backward: the layer input, attention output and
        // residual sum (hidden each), gate and up, rotated q and k, and v;
        // Gemma 3's output norms keep their inputs too (two more hidden).
        let out_norms = if self.shared.layers.iter().any(|l| l.out_norms.is_some()) { 2 } else { 0 };
        4 * ((3 + out_norms) * c.hidden_size + 2 * c.intermediate_size + (c.n_head + 2 * c.n_kv_head) * c.head_dim)
    }

    fn loss(&self, tape: &mut Tape, batch: &Batch, lora: &LoraVars, opts: &GraphOptions, logits: Option<&mut Vec<f32>>) -> Result<Var> {
        batch.dims()?;
        let h = self.layers_and_norm(tape, &batch.input_ids, lora, &opts.recompute_layers, true, opts.unfused_lora || self.unfused_lora)?;
        let targets = batch.targets();
        let denom = opts.denominator(&targets);
        let chunk = if opts.head_chunk == 0 { 256 } else { opts.head_chunk };
        tape.head_loss_sliced(h, &self.head_slices, &targets, denom, chunk, logits)
    }

    fn hidden_size(&self) -> usize {
        self.shared.cfg.hidden_size
    }

    fn hidden_states(&self, tape: &mut Tape, input_ids: &[Vec<u32>], lora: &LoraVars, recompute_layers: &[bool], causal: bool) -> Result<Var> {
        self.layers_and_norm(tape, input_ids, lora, recompute_layers, causal, self.unfused_lora)
    }

    fn head(&self) -> &Arc<dyn Projection> {
        &self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Embeddings held in Q8_0 or Q4 blocks look up the rows a bf16 copy
    /// of the dequantized table gives, bit for bit; an id past the
    /// vocabulary is refused.
    #[test]
    fn embeddings_in_blocks_look_up_as_their_bf16_copy() {
        if !crate::ops::quant_bf16::decodes(DType::Q8_0) {
            return crate::test_skip::skip_allowed_in_ci("no AVX-512 F+BW+BF16: embeddings keep a bf16 copy here", crate::test_skip::CPU_CLASS_VARIES);
        }
        let (vocab, dim) = (50, 64);
        for dtype in [DType::Q8_0, DType::Q4_1] {
            let bytes = crate::ops::quant_bf16::random_block_rows(dtype, vocab, dim, 9);
            let raw = RawTensor { name: "token_embd.weight".into(), dtype, shape: vec![vocab, dim], bytes: &bytes };
            let blocks = EmbedTable::bf16(&raw, (vocab, dim)).unwrap();
            assert!(matches!(blocks, EmbedTable::Blocks { .. }));
            let copy = EmbedTable::Bf16(Arc::new(Bf16Matrix::from_f32(&raw.to_f32().unwrap(), vocab, dim)));
            let ids = [3, 0, 49, 3, 17];
            let (mut got, mut want) = (vec![f32::NAN; ids.len() * dim], vec![0.0; ids.len() * dim]);
            blocks.lookup(&mut got, &ids, dim).unwrap();
            copy.lookup(&mut want, &ids, dim).unwrap();
            assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{dtype:?}");
            assert!(blocks.lookup(&mut got[..dim], &[50], dim).is_err(), "id past the vocabulary");
        }
    }
}

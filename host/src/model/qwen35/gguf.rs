//! Qwen3.5 GGUF files as llama.cpp's converter writes them, read back in
//! Hugging Face convention (the [`crate::model::gguf::Gguf`] tensor source
//! hands every architecture out that way).
//!
//! Conventions followed: llama.cpp's `convert_hf_to_gguf` split into
//! `conversion/qwen.py` (classes `Qwen3NextModel`,
//! `_LinearAttentionVReorderBase` and `Qwen3_5TextModel`, i.e. after the
//! V-head reorder of llama.cpp PR #19468), with tensor names and metadata
//! keys from gguf-py 0.19.0 (`MODEL_ARCH.QWEN35`). That converter
//!
//! - writes architecture `qwen35` with `qwen35.ssm.conv_kernel`,
//!   `ssm.state_size` (= key head width), `ssm.group_count` (= key heads),
//!   `ssm.time_step_rank` (= value heads), `ssm.inner_size` (= value heads x
//!   value head width), `full_attention_interval` (layer `i` is full
//!   attention iff `(i + 1) % interval == 0`; llama.cpp's default is 4),
//!   `rope.dimension_count` (= head_dim x partial_rotary_factor), and
//!   `nextn_predict_layers` MTP blocks appended after the decoder layers;
//! - stores `A_log` as `ssm_a = -exp(A_log)` and `dt_bias` as `ssm_dt.bias`;
//! - squeezes `conv1d.weight` `[C, 1, K]` to `[C, K]`;
//! - stores every RMSNorm weight except the gated one (`linear_attn.norm`)
//!   as `1 + w` (llama.cpp multiplies by the stored weight);
//! - when value heads outnumber key heads, moves value heads from HF's
//!   grouped order (head `k * r + j` for key head `k`, `r = n_v / n_k`) to
//!   tiled order (position `j * n_k + k`) in every tensor indexed by value
//!   head: the v rows of `in_proj_qkv` and of the conv, `in_proj_z`,
//!   `in_proj_a`, `in_proj_b`, `A_log`, `dt_bias` and the columns of
//!   `out_proj`;
//! - leaves the full-attention q/k rows as they are (no rotary permutation;
//!   q_proj keeps its per-head `[q | gate]` rows).
//!
//! The rotary `rope.dimension_sections` (interleaved MRoPE) are not read: for
//! text every section sees the same position, which is plain rotary.
use crate::model::gguf::{Conventions, Gguf, Rewrite, Rewritten};
use crate::model::source::{DType, RawTensor};
use crate::{Error, Result};

/// Hugging Face name (under `model.layers.N.`) of a Qwen3.5 layer tensor,
/// from its GGUF name after `blk.N.`; `None` for names shared with llama
/// (attention, MLP, norms).
pub fn hf_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "attn_qkv.weight" => "linear_attn.in_proj_qkv.weight",
        "attn_gate.weight" => "linear_attn.in_proj_z.weight",
        "ssm_beta.weight" => "linear_attn.in_proj_b.weight",
        "ssm_alpha.weight" => "linear_attn.in_proj_a.weight",
        "ssm_out.weight" => "linear_attn.out_proj.weight",
        "ssm_conv1d.weight" => "linear_attn.conv1d.weight",
        "ssm_norm.weight" => "linear_attn.norm.weight",
        "ssm_dt.bias" => "linear_attn.dt_bias",
        "ssm_a" => "linear_attn.A_log",
        _ => return None,
    })
}

/// What the converter did to one tensor, to be undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// `in_proj_qkv`: the v rows (after q and k) were tiled.
    QkvRows,
    /// `in_proj_z`: rows tiled by value head.
    ValueRows,
    /// `in_proj_a`, `in_proj_b`: one row per value head, tiled.
    HeadRows,
    /// `out_proj`: columns tiled by value head.
    ValueColumns,
    /// `ssm_a = -exp(A_log)`, tiled.
    ALog,
    /// `dt_bias`, tiled.
    DtBias,
    /// Conv `[C, K]`: the v channels tiled, the `[C, 1, K]` dim squeezed.
    Conv,
    /// RMSNorm weight stored as `1 + w`.
    NormOffset,
}

/// The rewrite a GGUF tensor name needs, if any.
pub fn undo_for(gguf_name: &str) -> Option<Undo> {
    if gguf_name == "output_norm.weight" {
        return Some(Undo::NormOffset);
    }
    let rest = gguf_name.strip_prefix("blk.")?.split_once('.')?.1;
    Some(match rest {
        "attn_qkv.weight" => Undo::QkvRows,
        "attn_gate.weight" => Undo::ValueRows,
        "ssm_alpha.weight" | "ssm_beta.weight" => Undo::HeadRows,
        "ssm_out.weight" => Undo::ValueColumns,
        "ssm_a" => Undo::ALog,
        "ssm_dt.bias" => Undo::DtBias,
        "ssm_conv1d.weight" => Undo::Conv,
        "attn_norm.weight" | "post_attention_norm.weight" | "attn_q_norm.weight" | "attn_k_norm.weight" => {
            Undo::NormOffset
        }
        _ => return None,
    })
}

/// Gated DeltaNet head geometry from the `qwen35.ssm.*` metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Key heads (`ssm.group_count`).
    pub n_k_head: usize,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_head: usize,
    /// Key head width (`ssm.state_size`).
    pub k_dim: usize,
    /// Value head width (`ssm.inner_size / ssm.time_step_rank`).
    pub v_dim: usize,
}

impl Heads {
    /// Reads and checks the geometry.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch = g.architecture()?;
        let key = |k: &str| format!("{arch}.ssm.{k}");
        let n_k_head = g.get_u32(&key("group_count"))? as usize;
        let n_v_head = g.get_u32(&key("time_step_rank"))? as usize;
        let k_dim = g.get_u32(&key("state_size"))? as usize;
        let inner = g.get_u32(&key("inner_size"))? as usize;
        if n_k_head == 0 || n_v_head == 0 || k_dim == 0 || !n_v_head.is_multiple_of(n_k_head) || !inner.is_multiple_of(n_v_head) {
            return Err(Error::invalid(
                "GGUF metadata",
                format!("{arch}.ssm: group_count {n_k_head}, time_step_rank {n_v_head}, state_size {k_dim}, inner_size {inner} do not describe whole heads"),
            ));
        }
        Ok(Heads { n_k_head, n_v_head, k_dim, v_dim: inner / n_v_head })
    }

    /// Tiled position of the HF (grouped) value head `h`.
    fn tiled(&self, h: usize) -> usize {
        let per_k = self.n_v_head / self.n_k_head;
        (h % per_k) * self.n_k_head + h / per_k
    }

    /// For HF index `i` of a value-head-major axis with `width` entries per
    /// head, the index the converter stored it at.
    fn stored_index(&self, i: usize, width: usize) -> usize {
        self.tiled(i / width) * width + i % width
    }
}

/// Undoes `undo` on `stored` (HF name, GGUF data, dims reversed).
pub fn apply(undo: Undo, stored: &RawTensor<'_>, heads: Heads) -> Result<Rewritten> {
    let h = heads;
    let value_dim = h.n_v_head * h.v_dim;
    let expect_rows = |rows: usize| -> Result<()> {
        let got = stored.shape.first().copied().unwrap_or(0);
        if got != rows {
            return Err(Error::format(
                &stored.name,
                format!("{got} rows, but the ssm metadata implies {rows} ({} value heads of {})", h.n_v_head, h.v_dim),
            ));
        }
        Ok(())
    };
    match undo {
        Undo::QkvRows => {
            let skip = 2 * h.n_k_head * h.k_dim;
            expect_rows(skip + value_dim)?;
            Ok(keep_type(stored, rows_from(stored, |r| if r < skip { r } else { skip + h.stored_index(r - skip, h.v_dim) })?))
        }
        Undo::Conv => {
            let skip = 2 * h.n_k_head * h.k_dim;
            expect_rows(skip + value_dim)?;
            let bytes = rows_from(stored, |r| if r < skip { r } else { skip + h.stored_index(r - skip, h.v_dim) })?;
            let (c, k) = (stored.shape[0], stored.row_len());
            Ok(Rewritten { dtype: stored.dtype, shape: vec![c, 1, k], bytes })
        }
        Undo::ValueRows => {
            expect_rows(value_dim)?;
            Ok(keep_type(stored, rows_from(stored, |r| h.stored_index(r, h.v_dim))?))
        }
        Undo::HeadRows => {
            expect_rows(h.n_v_head)?;
            Ok(keep_type(stored, rows_from(stored, |r| h.tiled(r))?))
        }
        Undo::ValueColumns => {
            let cols = stored.row_len();
            if cols != value_dim {
                return Err(Error::format(&stored.name, format!("{cols} columns, but the ssm metadata implies {value_dim}")));
            }
            let x = stored.to_f32()?;
            let mut out = vec![0.0f32; x.len()];
            for (o, row) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                for (c, v) in o.iter_mut().enumerate() {
                    *v = row[h.stored_index(c, h.v_dim)];
                }
            }
            Ok(f32_tensor(stored, out))
        }
        Undo::ALog => {
            expect_rows(h.n_v_head)?;
            let a = stored.to_f32()?;
            let mut out = Vec::with_capacity(a.len());
            for i in 0..a.len() {
                let v = a[h.tiled(i)];
                if !(v < 0.0 && v.is_finite()) {
                    return Err(Error::format(&stored.name, format!("ssm_a[{i}] = {v}; llama.cpp stores -exp(A_log), which is negative")));
                }
                out.push((-v).ln());
            }
            Ok(f32_tensor(stored, out))
        }
        Undo::DtBias => {
            expect_rows(h.n_v_head)?;
            let d = stored.to_f32()?;
            Ok(f32_tensor(stored, (0..d.len()).map(|i| d[h.tiled(i)]).collect()))
        }
        // (1 + w) - 1 is exact in f32 for |w| <= 1, and the norm adds 1 back.
        Undo::NormOffset => Ok(f32_tensor(stored, stored.to_f32()?.iter().map(|w| w - 1.0).collect())),
    }
}

fn keep_type(stored: &RawTensor<'_>, bytes: Vec<u8>) -> Rewritten {
    Rewritten { dtype: stored.dtype, shape: stored.shape.clone(), bytes }
}

fn f32_tensor(stored: &RawTensor<'_>, values: Vec<f32>) -> Rewritten {
    Rewritten { dtype: DType::F32, shape: stored.shape.clone(), bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
}

/// The stored rows in HF order: HF row `r` is stored row `src(r)`. Rows
/// are whole quantization blocks, so this works for every storage type.
fn rows_from(stored: &RawTensor<'_>, src: impl Fn(usize) -> usize) -> Result<Vec<u8>> {
    let rows = stored.shape.first().copied().unwrap_or(1);
    let row_bytes = stored.row_bytes()?;
    if row_bytes * rows != stored.bytes.len() {
        return Err(Error::format(&stored.name, format!("{} bytes for {rows} rows of {row_bytes}", stored.bytes.len())));
    }
    let mut out = Vec::with_capacity(stored.bytes.len());
    for r in 0..rows {
        let s = src(r);
        out.extend_from_slice(&stored.bytes[s * row_bytes..(s + 1) * row_bytes]);
    }
    Ok(out)
}


/// The conventions of `qwen35` files: the linear-attention tensors' own
/// names, and [`undo_for`]'s rewrites.
pub struct Qwen35Gguf;

impl Conventions for Qwen35Gguf {
    fn layer_name(&self, rest: &str) -> Option<&'static str> {
        hf_layer_name(rest)
    }

    fn rewrite(&self, _gguf: &Gguf, gguf_name: &str) -> Result<Option<Box<dyn Rewrite>>> {
        Ok(undo_for(gguf_name).map(|u| Box::new(u) as Box<dyn Rewrite>))
    }
}

impl Rewrite for Undo {
    fn apply(&self, gguf: &Gguf, stored: &RawTensor<'_>) -> Result<Rewritten> {
        apply(*self, stored, Heads::from_gguf(gguf)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's `_reorder_v_heads`: view `[n_k, r, width]`, swap the
    /// first two axes. Written from its description, independently of
    /// `stored_index`.
    fn converter_order(n_k: usize, r: usize, width: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for j in 0..r {
            for k in 0..n_k {
                for w in 0..width {
                    out.push((k * r + j) * width + w);
                }
            }
        }
        out
    }

    #[test]
    fn undo_inverts_the_converters_tiling() {
        let h = Heads { n_k_head: 2, n_v_head: 6, k_dim: 3, v_dim: 2 };
        // stored position p holds HF index converter_order[p]
        let order = converter_order(2, 3, 2);
        for hf in 0..12 {
            assert_eq!(order[h.stored_index(hf, 2)], hf);
        }
        let one = converter_order(2, 3, 1);
        for hf in 0..6 {
            assert_eq!(one[h.tiled(hf)], hf);
        }
    }

    #[test]
    fn a_log_and_norm_offsets_are_undone() {
        let h = Heads { n_k_head: 1, n_v_head: 2, k_dim: 1, v_dim: 1 };
        let a: Vec<u8> = [-(0.5f32.exp()), -(2.0f32.exp())].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = RawTensor { name: "model.layers.0.linear_attn.A_log".into(), dtype: DType::F32, shape: vec![2], bytes: &a };
        let r = apply(Undo::ALog, &t, h).unwrap();
        let got: Vec<f32> = r.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert!((got[0] - 0.5).abs() < 1e-6 && (got[1] - 2.0).abs() < 1e-6, "{got:?}");

        let pos: Vec<u8> = [0.5f32, 1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = RawTensor { bytes: &pos, ..t };
        let err = apply(Undo::ALog, &t, h).unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
    }
}

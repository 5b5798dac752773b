//! Llama GGUF files as llama.cpp's converter writes them, read back in
//! Hugging Face convention: the converter permuted the rows of each q and k
//! weight for its rotary layout (per head, HF's (half, i) row order becomes
//! (i, half)); they are put back as transformers' GGUF loader does. Qwen3
//! files (`qwen3`) use the common names and no rewrite.
use crate::base::dtype::RawTensor;
use crate::model::gguf::{Conventions, Gguf, Rewrite, Rewritten};
use crate::{Error, Result};

/// The conventions of `llama` files.
pub struct LlamaGguf;

impl Conventions for LlamaGguf {
    fn rewrite(&self, gguf: &Gguf, gguf_name: &str) -> Result<Option<Box<dyn Rewrite>>> {
        let heads = if gguf_name.ends_with(".attn_q.weight") {
            gguf.get_u32("llama.attention.head_count")?
        } else if gguf_name.ends_with(".attn_k.weight") {
            match gguf.value("llama.attention.head_count_kv") {
                Some(_) => gguf.get_u32("llama.attention.head_count_kv")?,
                None => gguf.get_u32("llama.attention.head_count")?,
            }
        } else {
            return Ok(None);
        };
        Ok(Some(Box::new(Unpermute { heads: heads as usize, gguf_name: gguf_name.to_string() })))
    }
}

/// A q or k weight's rotary rows, with this many heads.
struct Unpermute {
    heads: usize,
    gguf_name: String,
}

impl Rewrite for Unpermute {
    fn apply(&self, gguf: &Gguf, stored: &RawTensor<'_>) -> Result<Rewritten> {
        let bytes = unpermute(&stored.shape, stored.bytes, self.heads).map_err(|msg| Error::format(gguf.name(), format!("{}: {msg}", self.gguf_name)))?;
        Ok(Rewritten { dtype: stored.dtype, shape: stored.shape.clone(), bytes })
    }
}

/// Where llama.cpp's converter put row `hf_row` of a q/k weight in rotary layout with
/// `rows` rows in `n_head` rotary heads (`rows % (2 * n_head) == 0`): per
/// head, HF's (half, i) row order becomes (i, half).
pub fn rotary_gguf_row(hf_row: usize, rows: usize, n_head: usize) -> usize {
    let half = rows / n_head / 2;
    let (h, s, i) = (hf_row / (2 * half), (hf_row % (2 * half)) / half, hf_row % half);
    h * 2 * half + 2 * i + s
}

/// The rows of a q/k weight of HF `shape` `[rows, cols]` back in Hugging
/// Face order; the reason when they cannot be split into `n_head` heads.
fn unpermute(shape: &[usize], bytes: &[u8], n_head: usize) -> std::result::Result<Vec<u8>, String> {
    let rows = shape.first().copied().unwrap_or(1);
    if shape.len() != 2 || n_head == 0 || rows % (2 * n_head) != 0 || bytes.is_empty() {
        return Err(format!("{rows} rows of {} bytes cannot be split into {n_head} rotary heads", bytes.len() / rows.max(1)));
    }
    let row_bytes = bytes.len() / rows;
    let mut out = vec![0u8; bytes.len()];
    for (r, dst) in out.chunks_exact_mut(row_bytes).enumerate() {
        let src = rotary_gguf_row(r, rows, n_head);
        dst.copy_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::Value;
    use crate::model::gguf_writer::{GgufWriter, TensorOut};
    use crate::model::source::TensorSource;

    #[test]
    fn unpermute_matches_transformers_formula() {
        // 2 heads of head_dim 4 => 8 rows of 1 byte. transformers:
        // w.reshape(n_head, dim/2, 2).swapaxes(1, 2): HF row (h, s, i) is
        // GGUF row (h, i, s).
        let gguf_rows: Vec<u8> = (0..8).collect();
        let hf = unpermute(&[8, 1], &gguf_rows, 2).unwrap();
        assert_eq!(hf, vec![0, 2, 1, 3, 4, 6, 5, 7]);
        assert!(unpermute(&[8, 1], &gguf_rows, 3).is_err());
    }

    #[test]
    fn a_q_weight_without_columns_is_an_error_not_a_panic() {
        // Rows but no bytes: a row length of 0 must not reach chunks_exact.
        let mut w = GgufWriter::default();
        w.kv("general.architecture", Value::String("llama".into())).kv("llama.attention.head_count", Value::U32(2));
        w.tensor(TensorOut { name: "blk.0.attn_q.weight".into(), ggml_type: 0, dims: vec![0, 8], bytes: vec![] });
        let g = Gguf::from_bytes(&w.to_bytes().unwrap(), "empty-rows.gguf").unwrap();
        let err = g.get("model.layers.0.self_attn.q_proj.weight").unwrap_err().to_string();
        assert!(err.contains("empty-rows.gguf") && err.contains("attn_q"), "{err}");
    }
}

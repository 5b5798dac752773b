//! Token embedding lookup. The table is a dense `[vocab, dim]` f32 tensor
//! held by the model (a gather, not a product, so it does not go through
//! [`crate::projection::Projection`]); backward needs only the ids.
use crate::{Error, Result};

/// `out[t, :] = table[ids[t], :]`; `out`: `[ids.len(), dim]`, `table`:
/// `[vocab, dim]`. An id outside the vocabulary is an error naming it.
pub fn embedding_forward(out: &mut [f32], ids: &[u32], table: &[f32], dim: usize) -> Result<()> {
    assert_eq!(out.len(), ids.len() * dim, "embedding_forward output length");
    let vocab = table.len() / dim.max(1);
    for (row, &id) in out.chunks_exact_mut(dim).zip(ids) {
        let id = id as usize;
        if id >= vocab {
            return Err(Error::invalid("token id", format!("{id} is outside the vocabulary of {vocab}")));
        }
        row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_rows_and_rejects_out_of_range_ids() {
        let table: Vec<f32> = (0..12).map(|i| i as f32).collect(); // [4, 3]
        let mut out = vec![0.0; 6];
        embedding_forward(&mut out, &[2, 0], &table, 3).unwrap();
        assert_eq!(out, [6.0, 7.0, 8.0, 0.0, 1.0, 2.0]);
        let err = embedding_forward(&mut out, &[1, 4], &table, 3).unwrap_err().to_string();
        assert!(err.contains("4 is outside the vocabulary of 4"), "{err}");
    }
}

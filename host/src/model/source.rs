//! The contract between file-format readers (GGUF, safetensors) and models:
//! a model asks a [`TensorSource`] for tensors by checkpoint name and gets a
//! [`RawTensor`] view in the file's own storage type.
//!
//! Names and shapes are always in Hugging Face / PyTorch convention
//! (`model.layers.0.self_attn.q_proj.weight`, shape `[out, in]`, outermost
//! first), whatever the file uses internally: the GGUF reader maps
//! `blk.0.attn_q.weight` and reverses GGUF's innermost-first dims.
use crate::Result;

pub use crate::base::dtype::{DType, RawTensor};

/// Anything that hands out tensors by name: a GGUF file, a safetensors
/// directory, a test fixture.
pub trait TensorSource {
    /// All tensor names, in file order.
    fn names(&self) -> Vec<String>;
    /// The tensor called `name`, or a clear error naming it.
    fn get(&self, name: &str) -> Result<RawTensor<'_>>;
}

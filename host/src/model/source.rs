//! The contract between file-format readers (GGUF, safetensors) and models:
//! a model asks a [`TensorSource`] for tensors by checkpoint name and gets a
//! [`RawTensor`] view in the file's own storage type.
//!
//! Names and shapes are always in Hugging Face / PyTorch convention
//! (`model.layers.0.self_attn.q_proj.weight`, shape `[out, in]`, outermost
//! first), whatever the file uses internally: the GGUF reader maps
//! `blk.0.attn_q.weight` and reverses GGUF's innermost-first dims.
use crate::Result;

/// Storage type of a tensor in a model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// GGUF Q8_0: blocks of 32, f16 scale + 32 i8.
    Q8_0,
    /// GGUF Q4_0.
    Q4_0,
    /// GGUF Q4_1.
    Q4_1,
    /// GGUF Q5_0.
    Q5_0,
    /// GGUF Q5_1.
    Q5_1,
    /// GGUF Q4_K (super-blocks of 256).
    Q4K,
    /// GGUF Q5_K (super-blocks of 256).
    Q5K,
    /// GGUF Q6_K (super-blocks of 256).
    Q6K,
}

/// A tensor as stored in the file: borrowed bytes plus type and shape.
#[derive(Clone, Debug)]
pub struct RawTensor<'a> {
    /// Checkpoint name (Hugging Face convention).
    pub name: String,
    /// Storage type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The stored bytes, exactly `dtype`-sized for `shape`.
    pub bytes: &'a [u8],
}

/// Anything that hands out tensors by name: a GGUF file, a safetensors
/// directory, a test fixture.
pub trait TensorSource {
    /// All tensor names, in file order.
    fn names(&self) -> Vec<String>;
    /// The tensor called `name`, or a clear error naming it.
    fn get(&self, name: &str) -> Result<RawTensor<'_>>;
}

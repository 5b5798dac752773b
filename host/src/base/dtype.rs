//! Storage types of tensors in model files ([`DType`]) and a tensor as
//! stored ([`RawTensor`]: borrowed bytes, type, shape). Their block
//! decoders are in [`super::quant`]; file readers hand these out through
//! `model::source::TensorSource`.

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

/// Our [`DType`] for a safetensors float dtype; `None` for the types hexlora
/// does not read (integers, f64, f8).
pub(crate) fn float_dtype(dtype: safetensors::Dtype) -> Option<DType> {
    match dtype {
        safetensors::Dtype::F32 => Some(DType::F32),
        safetensors::Dtype::F16 => Some(DType::F16),
        safetensors::Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

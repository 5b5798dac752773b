//! Model files, tokenizer and architectures.
pub mod gguf;
pub mod hf_dir;
pub mod quant;
pub mod source;

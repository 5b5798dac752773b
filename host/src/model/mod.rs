//! Model files, tokenizer and architectures.
pub mod config;
pub mod cpu_projection;
pub mod descriptor;
pub mod gguf;
pub mod hf_dir;
pub mod quant;
pub mod source;

//! Model files, tokenizer and architectures.
pub mod assistant;
pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod cpu_projection;
pub mod decoder;
pub mod descriptor;
pub mod generate;
pub mod gguf;
pub mod gguf_qwen35;
pub mod gguf_writer;
pub mod hf_dir;
pub mod llama;
pub mod quant;
pub mod qwen35;
pub mod source;
pub mod tokenizer;

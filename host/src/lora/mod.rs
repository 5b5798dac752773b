//! LoRA adapters: hyper-parameters ([`config`]), the fused branch
//! ([`branch`]), PEFT directories ([`peft`]), llama.cpp GGUF adapters
//! (`model::gguf_adapter`, which needs the model), f32 safetensors ([`tensor_file`]) and the slots that
//! put an adapter into an inference model ([`slots`]).
pub mod branch;
pub mod config;
pub mod peft;
pub mod slots;

pub use config::LoraConfig;
pub use peft::{Adapter, LoraModule};

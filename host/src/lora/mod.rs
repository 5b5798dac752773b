//! LoRA adapters: hyper-parameters ([`config`]), the fused branch
//! ([`branch`]), PEFT directories ([`peft`]) and f32 safetensors
//! ([`tensor_file`]).
pub mod branch;
pub mod config;
pub mod peft;
pub mod tensor_file;

pub use config::LoraConfig;
pub use peft::{Adapter, LoraModule};

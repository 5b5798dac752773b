//! hexlora host runtime.
//!
//! Folder map (one concern each):
//! - [`model`]: file formats (GGUF, safetensors), tokenizer, chat templates,
//!   architecture descriptors and the Llama / Qwen3 / Qwen3.5 models;
//! - [`projection`]: the one interface through which anything touches a
//!   frozen base weight (forward and input-gradient);
//! - [`ops`]: layer kernels as explicit forward/backward pairs (llm.c style);
//! - [`autograd`]: the append-only tape and its fused nodes;
//! - [`lora`], [`optim`], [`train`]: adapters, optimizers, the training loop;
//! - [`npu`]: kernel planner, NPU client and transports;
//! - [`runtime`]: the split runtime's job layer (planner, routing, pacing,
//!   signals, energy);
//! - [`eval`]: benchmarks, metrics, methods; [`hyper`]: the hypernetwork;
//! - [`serve`]: the OpenAI-compatible server (stage 3, personalized inference);
//! - [`personal`]: the personal loop's parts (approved examples, adapter
//!   versions, the gate, a learning round), driven by `serve --learn`;
//! - [`bench_support`]: the clock and CPU name of the speed benchmarks in
//!   `host/examples/`.
//!
//! The `hexlora` subcommands are the binary's (`src/cli/`, declared in
//! `main.rs`): a change to the command line rebuilds only the binary.
// The unit tests as a static musl binary need it (see the file).
#[cfg(all(test, target_env = "musl", target_os = "linux"))]
mod dl_find_object;

pub mod autograd;
pub mod base;
pub mod bench_support;
pub mod error;
pub mod eval;
pub mod hyper;
pub mod lora;
pub mod model;
pub mod npu;
pub mod ops;
pub mod optim;
pub mod personal;
pub mod projection;
pub mod runtime;
pub mod serve;
pub mod signals;
pub mod tensor;
pub mod train;
#[cfg(test)]
#[allow(dead_code)] // not every target's tests use both kinds of skip
mod test_skip;

pub use error::{Error, Result};

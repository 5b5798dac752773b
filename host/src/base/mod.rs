//! The bottom layer's small parts: storage types and their block decoders
//! ([`dtype`], [`quant`]), named f32 tensors in safetensors bytes
//! ([`tensor_file`]), crash-safe file replacement ([`atomic_write`]) and
//! seed-addressed random numbers ([`counter_rng`]), and the one rule for
//! files a command writes ([`outputs`]). Nothing here imports
//! from above `tensor`, `ops`, `projection` and `error`
//! (`docs/ARCHITECTURE.md`).
pub mod atomic_write;
pub mod counter_rng;
pub mod dtype;
pub mod outputs;
pub mod quant;
pub mod tensor_file;

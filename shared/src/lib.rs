//! hexlora-proto: what the host and the DSP firmware must agree on.
//!
//! - [`q8_0`]: the GGUF-compatible Q8_0 block and the one dequantizer that
//!   forward and backward both use;
//! - [`f16`]: f16 conversion helpers (crate `half`);
//! - [`rescale`]: the per-row power-of-two rescaling policy constants;
//! - [`protocol`]: the FastRPC/dspqueue-style messages and buffer references.
#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

pub mod f16;
pub mod protocol;
pub mod q8_0;
pub mod rescale;

//! Tape autograd with coarse fused nodes (llm.c forward/backward pairs,
//! candle's one-enum/one-walk layout, micrograd's size).
//!
//! - [`tape`]: the append-only arena of values and nodes;
//! - [`nodes`]: the one list of node kinds, their builders and backwards;
//! - `backward.rs`: the one reverse walk;
//! - [`gdn_node`]: Qwen3.5's fused nodes (Gated DeltaNet, attention gate);
//! - [`profile`]: per-node-kind timings for benchmarks;
//! - [`counter_rng`]: seed-addressed random numbers (dropout, MeZO).
mod backward;
pub mod gdn_node;
pub mod counter_rng;
pub mod nodes;
pub mod profile;
pub mod tape;

pub use nodes::SegmentFn;
pub use tape::{Tape, Var};

#[cfg(test)]
pub(crate) mod gradcheck_tests;
#[cfg(test)]
mod ops_gradcheck_tests;

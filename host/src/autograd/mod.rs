//! Tape autograd with coarse fused nodes (llm.c forward/backward pairs,
//! candle's one-enum/one-walk layout, micrograd's size).
//!
//! - [`tape`]: the append-only arena of values and nodes;
//! - [`nodes`]: the one list of node kinds, their builders and backwards;
//! - `backward.rs`: the one reverse walk;
//! - [`profile`]: per-node-kind timings for benchmarks;
//! - [`counter_rng`]: seed-addressed random numbers (dropout, MeZO).
mod backward;
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

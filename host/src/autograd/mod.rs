//! Tape autograd with coarse fused nodes (llm.c forward/backward pairs,
//! candle's one-enum/one-walk layout, micrograd's size).
//!
//! - [`tape`]: the append-only arena of values and nodes;
//! - [`nodes`]: the one list of node kinds, their builders and backwards;
//! - `backward.rs`: the one reverse walk;
//! - [`nodes::CustomNode`]: the extension point for an architecture's own
//!   fused nodes (Qwen3.5's live in `model/qwen35/gdn_node.rs`);
//! - [`profile`]: per-node-kind timings for benchmarks;
//! - [`graph`]: the contract between an architecture's training graph and
//!   the loops that drive it ([`graph::TrainableModel`]).
mod backward;
pub mod graph;
pub mod nodes;
pub mod profile;
pub mod tape;

pub use nodes::{CustomNode, SegmentFn};
pub use tape::{Tape, Var};

#[cfg(test)]
pub(crate) mod gradcheck_tests;
#[cfg(test)]
mod ops_gradcheck_tests;

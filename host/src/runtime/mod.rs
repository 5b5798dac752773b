//! The split runtime around the training loop: which frozen projections the
//! DSP serves ([`planner`], [`routed`]), when to pause ([`pacing`]), how to
//! stop cleanly ([`signals`]) and what a run cost ([`energy`]);
//! [`split_model`] loads the training graph with every projection routed;
//! [`nightly`] is the job that puts them together (`hexlora personalize`).
//!
//! Everything here talks to the DSP only through [`crate::projection::Projection`],
//! so the NPU client (any transport) and the CPU path are interchangeable.
pub mod allocator;
pub mod energy;
pub mod nightly;
pub mod nightly_report;
pub mod pacing;
pub mod plan_cache;
pub mod planner;
pub mod routed;
/// Stop signals live at the bottom ([`crate::signals`]): the training loop
/// asks them too.
pub use crate::signals;
pub mod split_model;

//! Training: the model-facing graph contract ([`graph`]), the loop
//! ([`trainer`]), activation budget ([`budget`]), commits and resume
//! ([`commit`], [`atomic_write`]) and run outputs ([`metrics`]).
pub mod atomic_write;
pub mod budget;
pub mod commit;
pub mod graph;
pub mod metrics;
pub mod decoder_graph;
pub mod grad;
pub mod data;
pub mod trainer;
pub mod text_encoder;

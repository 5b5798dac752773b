//! Optimizers: [`adamw`] (with [`schedule`] and clipping) for backprop
//! training, [`mezo`] for the forward-only baseline.
pub mod adamw;
pub mod mezo;
pub mod schedule;

//! Training: data, the loop, activation budget, commits and resume.
pub mod atomic_write;

//! (being written)

pub mod firmware_log;

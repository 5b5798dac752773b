//! The `gguf_read` fuzz target. Its body is `fuzz/bodies/gguf_read.rs`, which
//! `host/tests/suite/fuzz_replay.rs` also runs natively (regression inputs, the
//! fixture seeds and their mutants) in the test suite.
#![no_main]

#[path = "../bodies/gguf_read.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| body::run(bytes));

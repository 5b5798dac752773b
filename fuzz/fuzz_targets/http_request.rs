//! The `http_request` fuzz target. Its body is `fuzz/bodies/http_request.rs`, which
//! `host/tests/suite/fuzz_replay.rs` also runs natively (regression inputs, the
//! seeds and their mutants) in the test suite.
#![no_main]

#[path = "../bodies/http_request.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| body::run(bytes));

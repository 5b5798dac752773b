//! How a test skips when it needs what this machine lacks (a CPU feature,
//! the real model, benchmark data, a service `ci/test.sh` builds): loudly,
//! `SKIPPED <test>: <why>` on stderr, past libtest's output capture. Under
//! CI (`CI` set) a skip fails the test, since CI provides every need
//! (`ci/test.sh` fetches the models and data and builds the services)
//! except those a test names with the reason CI cannot have them
//! ([`skip_allowed_in_ci`]).
//!
//! The library's unit tests use this module; the integration tests include
//! the same file from `tests/support`.

/// Why a CPU-feature test (AMX, AVX-512, AVX512-BF16, FEAT_BF16) passes
/// skipped under CI: its runs land on Intel with AMX, AMD Zen 1/3 (AVX2
/// only) or Zen 4 (AVX-512 and AVX512-BF16, no AMX).
pub const CPU_CLASS_VARIES: &str = "CPU class varies between CI machines";

/// Skips the running test; under CI, where `why`'s need is provided, a
/// panic instead. `why` names what is missing and what provides it.
#[track_caller]
pub fn skip(why: &str) {
    let test = running_test();
    assert!(std::env::var_os("CI").is_none(), "SKIPPED {test} under CI, which must provide it: {why}");
    announce(&format!("SKIPPED {test}: {why}"));
}

/// Skips the running test, under CI too: `ci_lacks_it` says why a CI
/// machine cannot be counted on to have the need.
pub fn skip_allowed_in_ci(why: &str, ci_lacks_it: &str) {
    announce(&format!("SKIPPED {}: {why} (allowed under CI: {ci_lacks_it})", running_test()));
}

/// The test's name: libtest runs each test on a thread named after it.
fn running_test() -> String {
    std::thread::current().name().unwrap_or("this test").to_string()
}

/// One line straight to the process's stderr: libtest captures `eprintln!`
/// and shows it only for a failed test, which would hide a skip.
fn announce(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

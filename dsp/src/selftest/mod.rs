//! The self-test registry: one set of tests that runs natively under
//! `cargo test` and as Hexagon code under qemu-hexagon (ci/sim-test.sh).
//!
//! A self-test is a plain `fn() -> Result<(), TestFailure>` that uses only
//! `core`/`alloc`, so the same body runs on both sides. Natively each one is
//! also its own `#[test]`; the simulator binary (`src/bin/selftest.rs`)
//! runs [`SUITES`] and ends with the line `N passed, M failed`.
//!
//! # Adding tests
//!
//! 1. In your module write test functions with [`check!`] / [`check_eq!`]
//!    (or return `Err(TestFailure)` yourself):
//!    ```ignore
//!    fn dequant_known_block() -> TestResult {
//!        let v = dequantize(&block);
//!        check_eq!(v[0], 0.5);
//!        check!(v.iter().all(|x| x.is_finite()), "non-finite in {:?}", &v[..4]);
//!        Ok(())
//!    }
//!    ```
//! 2. List them once, at module level:
//!    `crate::selftests!(dequant_known_block, other_test);`
//!    This defines `pub const SELFTESTS: &[SelfTest]` in your module and one
//!    native `#[test]` per function.
//! 3. Add `crate::your::module::SELFTESTS,` to [`SUITES`] below, so the
//!    simulator runs them too. Nothing can detect a forgotten line: an
//!    unlisted module's tests still run natively, but never on Hexagon.
//!
//! Keep tests small: qemu executes Hexagon code at a few hundred MIPS, and
//! the whole suite should finish in seconds.
use core::fmt::{self, Write};

pub mod protocol;
pub mod q8_0;

/// Every registered suite, in run order.
pub const SUITES: &[&[SelfTest]] = &[
    protocol::SELFTESTS,
    q8_0::SELFTESTS,
    crate::rt::log_ring::SELFTESTS,
    crate::rt::heap::SELFTESTS,
    crate::rt::PLATFORM_SELFTESTS,
    crate::skel::SELFTESTS,
    crate::dma::selftests::SELFTESTS,
    crate::hvx::selftests::SELFTESTS,
    crate::tile::selftests::SELFTESTS,
    crate::kernels::selftests::SELFTESTS,
    crate::service::selftests::SELFTESTS,
];

/// What a self-test returns.
pub type TestResult = Result<(), TestFailure>;

/// One registered test.
#[derive(Clone, Copy)]
pub struct SelfTest {
    /// `module::function`, as printed.
    pub name: &'static str,
    /// The test body.
    pub run: fn() -> TestResult,
}

/// Where and why a check failed.
#[derive(Debug)]
pub struct TestFailure {
    /// Source file of the failing check.
    pub file: &'static str,
    /// Line of the failing check.
    pub line: u32,
    /// The condition and any values, truncated to fit.
    pub message: heapless::String<256>,
}

impl TestFailure {
    /// A failure at `file:line` with a formatted message.
    pub fn new(file: &'static str, line: u32, args: fmt::Arguments) -> Self {
        let mut message = heapless::String::new();
        // A message longer than the buffer is cut, not lost.
        let _ = TruncatingWriter(&mut message).write_fmt(args);
        TestFailure { file, line, message }
    }
}

impl fmt::Display for TestFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

struct TruncatingWriter<'a, const N: usize>(&'a mut heapless::String<N>);

impl<const N: usize> Write for TruncatingWriter<'_, N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.0.push(c).is_err() {
                return Err(fmt::Error);
            }
        }
        Ok(())
    }
}

/// Fails the test with file/line and the condition text (plus an optional
/// formatted message) unless `cond` holds.
#[macro_export]
macro_rules! check {
    ($cond:expr $(,)?) => {
        if !$cond {
            return Err($crate::selftest::TestFailure::new(
                file!(), line!(), format_args!("check failed: {}", stringify!($cond)),
            ));
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::selftest::TestFailure::new(
                file!(), line!(),
                format_args!("check failed: {}: {}", stringify!($cond), format_args!($($fmt)+)),
            ));
        }
    };
}

/// Fails the test unless `left == right`, printing both with `{:?}`.
#[macro_export]
macro_rules! check_eq {
    ($left:expr, $right:expr $(,)?) => {
        match (&$left, &$right) {
            (l, r) => {
                if !(*l == *r) {
                    return Err($crate::selftest::TestFailure::new(
                        file!(), line!(),
                        format_args!("{} == {}: {:?} != {:?}", stringify!($left), stringify!($right), l, r),
                    ));
                }
            }
        }
    };
}

/// Registers a module's self-tests: defines `pub const SELFTESTS` and one
/// native `#[test]` per function. See the [module docs](crate::selftest).
#[macro_export]
macro_rules! selftests {
    ($($name:ident),+ $(,)?) => {
        /// This module's self-tests (see `hexlora_dsp::selftest`).
        pub const SELFTESTS: &[$crate::selftest::SelfTest] = &[
            $($crate::selftest::SelfTest {
                name: concat!(module_path!(), "::", stringify!($name)),
                run: $name,
            },)+
        ];

        #[cfg(test)]
        mod native_selftests {
            $(#[test]
            fn $name() {
                $crate::selftest::run_native(super::$name);
            })+
        }
    };
}

/// Runs one self-test as a native `#[test]`: a failure panics with its
/// location and message.
#[cfg(test)]
pub fn run_native(test: fn() -> TestResult) {
    if let Err(failure) = test() {
        panic!("{failure}");
    }
}

/// Pass/fail counts of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Tests that returned `Ok`.
    pub passed: u32,
    /// Tests that returned `Err`.
    pub failed: u32,
}

/// Runs every registered test whose name contains `filter`, writing one
/// line per test and then exactly `N passed, M failed` to `out`.
pub fn run_all(filter: &str, out: &mut dyn Write) -> Summary {
    let mut summary = Summary::default();
    for test in SUITES.iter().flat_map(|suite| suite.iter()) {
        let name = test.name.strip_prefix("hexlora_dsp::").unwrap_or(test.name);
        if !name.contains(filter) {
            continue;
        }
        // Output errors cannot fail a test; the summary still counts.
        let _ = match (test.run)() {
            Ok(()) => {
                summary.passed += 1;
                writeln!(out, "test {name} ... ok")
            }
            Err(failure) => {
                summary.failed += 1;
                writeln!(out, "test {name} ... FAILED\n    {failure}")
            }
        };
    }
    let _ = writeln!(out, "{} passed, {} failed", summary.passed, summary.failed);
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_test_passes_and_names_are_unique() {
        let mut out = String::new();
        let summary = run_all("", &mut out);
        assert_eq!(summary.failed, 0, "{out}");
        let mut names: Vec<_> = SUITES.iter().flat_map(|s| s.iter()).map(|t| t.name).collect();
        let total = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), total, "a test is listed twice");
        assert!(out.ends_with(&format!("{} passed, 0 failed\n", total)));
    }

    #[test]
    fn a_failing_check_reports_location_and_values() {
        fn fails() -> TestResult {
            let x = 3;
            check_eq!(x + 1, 5);
            Ok(())
        }
        let failure = fails().unwrap_err();
        assert!(failure.file.ends_with("selftest/mod.rs"));
        assert_eq!(failure.message.as_str(), "x + 1 == 5: 4 != 5");
    }

    #[test]
    fn long_messages_are_truncated_not_dropped() {
        let long = "x".repeat(1000);
        let failure = TestFailure::new("f", 1, format_args!("{long}"));
        assert_eq!(failure.message.len(), 256);
    }
}

//! The host's error type. Every user-facing failure names the thing that is
//! wrong (file, tensor, field, shape) so nobody has to read a backtrace.
//! Add variants here rather than stringly-typed errors when callers need to
//! tell cases apart.
use std::path::PathBuf;

/// Errors of the hexlora host runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error, with the path it happened on. The reason is in the
    /// message and deliberately not a `source`: error chains (`{:#}`)
    /// would print it twice.
    #[error("{path}: {reason}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        reason: std::io::Error,
    },
    /// A file's contents are not what its format says (corrupt, truncated,
    /// unsupported variant).
    #[error("{what}: {msg}")]
    Format {
        /// What was being read (file name, tensor name, field).
        what: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A tensor or argument has the wrong shape.
    #[error("shape mismatch in {what}: expected {expected:?}, got {got:?}")]
    Shape {
        /// Where the mismatch was found.
        what: String,
        /// The shape that was required.
        expected: Vec<usize>,
        /// The shape that was supplied.
        got: Vec<usize>,
    },
    /// Something valid but not implemented (a quant type, an architecture).
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A NaN or infinity where finite numbers are required.
    #[error("non-finite value in {0}")]
    NonFinite(String),
    /// Invalid user input or configuration.
    #[error("invalid {what}: {msg}")]
    Invalid {
        /// The argument, field or file.
        what: String,
        /// Why it is rejected.
        msg: String,
    },
    /// The NPU service answered with an error or could not be reached.
    #[error("npu: {0}")]
    Npu(String),
    /// A stop signal ended the work where nothing is left half-done (the
    /// start-up planner between projections, an evaluation between users):
    /// the command says what a rerun continues from and exits cleanly.
    #[error("stopped by {0}")]
    Stopped(&'static str),
    /// The NPU service cannot run this (shape, precision, VTCM size): the
    /// caller keeps the CPU path for it.
    #[error("npu does not support {0}")]
    NpuNoSupport(String),
    /// The NPU service crashed or hung and did not recover after
    /// `restarts` restarts: the caller falls back to the CPU.
    #[error("npu service failed after {restarts} restarts (last: {last}); falling back to the CPU is required")]
    NpuFailed {
        /// Restarts tried for the failing request.
        restarts: u32,
        /// The last fault or restart error.
        last: String,
    },
}

/// Result with the host [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A [`Error::Format`] error.
    pub fn format(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Format { what: what.into(), msg: msg.into() }
    }
    /// An [`Error::Invalid`] error.
    pub fn invalid(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid { what: what.into(), msg: msg.into() }
    }
    /// An [`Error::Io`] error for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), reason: source }
    }
}

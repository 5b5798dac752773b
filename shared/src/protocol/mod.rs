//! The host <-> DSP protocol, in the style of FastRPC + dspqueue.
//!
//! The host sends one [`Request`] at a time (one NPU request in flight, see
//! the mission) and gets one [`Response`] back. Bulk data (weights,
//! activations, gradients) never travels inside a message: it lives in
//! shared buffers the host registered beforehand (rpcmem buffers on a
//! device), and messages point into them with [`BufferRef`]s that the DSP
//! validates against the registered bounds before touching memory
//! ([`buffer::validate`]).
//!
//! Buffer ids:
//! - [`WEIGHTS_BUFFER`] (1): the session's weights mapping, registered once
//!   when the session opens (a persistent `fastrpc_mmap` on a device, the
//!   shared file in the simulator). [`LoadWeights`] names ranges in it and
//!   the DSP reads them in place for the rest of the session: weights are
//!   never copied into DSP memory nor sent again with a request;
//! - [`INPUT_BUFFER`] (2, read-only) and [`OUTPUT_BUFFER`] (3, writable):
//!   the buffers each [`ProjectionOp`] call carries.
//!
//! Messages are encoded with postcard ([`codec::encode`], [`codec::decode`]);
//! decoding never panics and rejects truncated, trailing or garbage bytes.
//!
//! Tests: `dsp/src/selftest/protocol.rs`, so the same checks run natively
//! and as Hexagon code under the simulator.
//!
//! Shape conventions (row-major, little-endian):
//! - a resident weight `W` has shape `(rows, cols)` = (out features, in
//!   features), so the forward product is `Y = X W^T`;
//! - activations in shared buffers are `f32`: the DSP does the per-row
//!   power-of-two scaling to f16 itself (see [`crate::rescale`]);
//! - [`Direction::Forward`]: input `X (tokens, cols)`, output `Y (tokens, rows)`;
//! - [`Direction::InputGrad`]: input `dY (tokens, rows)`, output
//!   `dX (tokens, cols)` = `dY W`.
pub mod buffer;
pub mod codec;
mod validate;

pub use buffer::{BufferError, BufferRef, RegisteredBuffer};
pub use codec::{decode, encode, DecodeError, MAX_MESSAGE_BYTES};
pub use validate::OpBuffers;

use serde::{Deserialize, Serialize};

/// Bumped whenever a message layout changes; the host refuses a DSP whose
/// [`Capabilities::protocol_version`] differs.
pub const PROTOCOL_VERSION: u16 = 2;

/// Id of the session's weights mapping.
pub const WEIGHTS_BUFFER: u32 = 1;
/// Id of the first buffer a call carries (the op's input).
pub const INPUT_BUFFER: u32 = 2;
/// Id of the op's output buffer.
pub const OUTPUT_BUFFER: u32 = 3;

/// Identifies one frozen projection (e.g. "layer 3, q_proj") for the
/// lifetime of a session. The host chooses the numbering.
pub type ProjectionId = u32;

/// How a resident weight is stored in DSP memory; the host's precision
/// policy speaks the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    /// IEEE half precision, `rows * cols * 2` bytes.
    Fp16,
    /// GGUF Q8_0 blocks (f16 scale + 32 i8) along each row; `cols` must be a
    /// multiple of 32. Forward and input-gradient use the same dequantizer.
    Q8_0,
}

impl Precision {
    /// Its name on the command line and in messages: `f16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "f16",
            Precision::Q8_0 => "q8_0",
        }
    }

    /// Bytes a `[rows, cols]` weight occupies, `None` if Q8_0 cannot hold it
    /// (`cols` not a multiple of 32).
    pub fn weight_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        match self {
            Precision::Fp16 => Some(rows * cols * 2),
            Precision::Q8_0 if cols % crate::q8_0::QK8_0 == 0 => Some(rows * cols / crate::q8_0::QK8_0 * crate::q8_0::BLOCK_BYTES),
            Precision::Q8_0 => None,
        }
    }
}

impl core::fmt::Display for Precision {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which product of the frozen weight an op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// `Y = X W^T` (also used for the activation recompute).
    Forward,
    /// `dX = dY W`, the input gradient.
    InputGrad,
}

/// Shape of a resident weight `W`: `(rows, cols)` = (out, in) features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightShape {
    /// Output features (rows of `W`).
    pub rows: u32,
    /// Input features (columns of `W`).
    pub cols: u32,
}

/// What the DSP can do; the answer to [`Request::Capabilities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Must equal [`PROTOCOL_VERSION`].
    pub protocol_version: u16,
    /// Hexagon architecture version, e.g. 67, 73, 79.
    pub arch: u16,
    /// VTCM bytes the service could reserve.
    pub vtcm_bytes: u32,
    /// HVX contexts available to the service.
    pub hvx_contexts: u8,
    /// Whether the matrix engine (HMX) is present; without it the service
    /// runs its kernels on HVX or scalar code.
    pub hmx: bool,
    /// Resident FP16 weights are supported.
    pub fp16: bool,
    /// Resident Q8_0 weights are supported.
    pub q8_0: bool,
    /// Largest `tokens` a single [`ProjectionOp`] may carry.
    pub max_tokens: u32,
    /// Largest `rows` or `cols` of a resident weight.
    pub max_dim: u32,
    /// How many projections can be resident at once.
    pub max_projections: u32,
}

/// Make a weight resident: `W` stays where it lies in the session's weights
/// mapping ([`WEIGHTS_BUFFER`]), which the host must not change until the
/// weight is unloaded or the session ends; the DSP checks it once, here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadWeights {
    /// The id later ops use.
    pub projection: ProjectionId,
    /// Storage format of the bytes in `weights`.
    pub precision: Precision,
    /// Shape of `W`.
    pub shape: WeightShape,
    /// The weight bytes in [`WEIGHTS_BUFFER`]: exactly
    /// [`LoadWeights::weight_bytes`] long.
    pub weights: BufferRef,
}

/// One product against a resident weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionOp {
    /// Echoed in the [`OpResult`] so the host can match answers to requests.
    pub seq: u32,
    /// Which resident weight.
    pub projection: ProjectionId,
    /// Forward or input gradient.
    pub direction: Direction,
    /// Number of token rows in input and output.
    pub tokens: u32,
    /// f32 input: `X (tokens, cols)` forward, `dY (tokens, rows)` backward.
    pub input: BufferRef,
    /// f32 output: `Y (tokens, rows)` forward, `dX (tokens, cols)` backward.
    pub output: BufferRef,
}

/// A request from the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Ask for [`Capabilities`].
    Capabilities,
    /// Make a weight resident.
    LoadWeights(LoadWeights),
    /// Drop a resident weight.
    Unload(ProjectionId),
    /// Run a product.
    Project(ProjectionOp),
}

/// How an op ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Every output row is finite and below the overflow limit.
    Ok,
    /// Some rows still overflowed after the maximum number of rescale
    /// retries; the host must recompute them on the CPU.
    RowsFailed {
        /// How many rows failed.
        rows: u32,
    },
}

/// Where the time of an op went, in DSP processor cycles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// From request decoded to response ready.
    pub total_cycles: u64,
    /// Spent waiting for DMA into VTCM.
    pub dma_wait_cycles: u64,
    /// Spent in the matrix kernels.
    pub compute_cycles: u64,
}

/// The answer to a [`ProjectionOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    /// The op's sequence number.
    pub seq: u32,
    /// Outcome.
    pub status: Status,
    /// Rows that were re-run with a smaller scale (each retry counts once).
    pub rows_retried: u32,
    /// Cycle counts.
    pub timing: Timing,
}

/// Why the service refused or failed a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceError {
    /// The request is valid but this DSP cannot do it (precision, HMX, ...).
    NoSupport,
    /// A field is out of range (zero tokens, shape too large, cols not a
    /// multiple of 32 for Q8_0, ...).
    InvalidParams,
    /// The op needs more VTCM than the service could reserve.
    VtcmTooSmall {
        /// Bytes the op needs.
        needed: u32,
        /// Bytes available.
        available: u32,
    },
    /// A buffer reference does not fit its registered buffer.
    BadBuffer(BufferError),
    /// No resident weight has this id.
    UnknownProjection(ProjectionId),
    /// The id is already resident, or the resident table is full.
    ProjectionSlot(ProjectionId),
    /// The request bytes did not decode.
    Malformed(DecodeError),
    /// The DSP could not allocate memory the request needs (its heap is a
    /// fixed arena): the host should send less at once or use its CPU path.
    OutOfMemory {
        /// Bytes the failed allocation asked for (saturated).
        bytes: u32,
    },
}

/// A response from the DSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to [`Request::Capabilities`].
    Capabilities(Capabilities),
    /// [`Request::LoadWeights`] or [`Request::Unload`] succeeded.
    Done(ProjectionId),
    /// Answer to [`Request::Project`].
    Op(OpResult),
    /// The request failed; `seq` is the op's sequence number when the
    /// request was a [`Request::Project`] that decoded.
    Error {
        /// Sequence number of the failed op, if any.
        seq: Option<u32>,
        /// What went wrong.
        error: ServiceError,
    },
}

impl From<BufferError> for ServiceError {
    fn from(e: BufferError) -> Self {
        ServiceError::BadBuffer(e)
    }
}

impl From<DecodeError> for ServiceError {
    fn from(e: DecodeError) -> Self {
        ServiceError::Malformed(e)
    }
}

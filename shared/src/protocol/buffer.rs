//! Buffer references into registered shared buffers, and their validation.
//!
//! A [`BufferRef`] is `(buffer id, offset, len)`, the way rpcmem/dspqueue
//! buffers are addressed: the host registers each shared buffer once (its id
//! and length), then messages only name byte ranges inside them. The
//! receiving side checks every reference with [`validate`] before it forms a
//! slice, so a corrupt or hostile message cannot make the DSP read or write
//! outside memory it was given. All arithmetic is overflow-checked.
use core::ops::Range;
use serde::{Deserialize, Serialize};

/// A byte range inside a registered shared buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferRef {
    /// Id the buffer was registered under.
    pub buffer: u32,
    /// First byte, from the buffer's start.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A shared buffer as the receiving side knows it: its id and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisteredBuffer {
    /// The id messages use.
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
}

/// Why a [`BufferRef`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufferError {
    /// No buffer with this id is registered.
    Unregistered {
        /// The id named by the reference.
        buffer: u32,
    },
    /// `offset + len` overflows or lies past the buffer's end.
    OutOfBounds {
        /// The buffer id.
        buffer: u32,
        /// `offset + len`, saturated at `u64::MAX` on overflow.
        end: u64,
        /// The registered length.
        len: u64,
    },
    /// The offset is not aligned for the element type.
    Misaligned {
        /// The buffer id.
        buffer: u32,
        /// The offending offset.
        offset: u64,
    },
    /// The range does not have the length the op's shape implies.
    WrongLength {
        /// The buffer id.
        buffer: u32,
        /// Bytes the shape implies (saturated on overflow).
        expected: u64,
        /// Bytes the reference names.
        got: u64,
    },
    /// An output reference names a buffer the DSP may only read.
    ReadOnly {
        /// The buffer id.
        buffer: u32,
    },
    /// Input and output ranges overlap.
    Overlap {
        /// The buffer both ranges lie in.
        buffer: u32,
    },
}

/// Checks `r` against the registered buffers and returns its byte range
/// inside the buffer it names.
pub fn validate(r: &BufferRef, registered: &[RegisteredBuffer]) -> Result<Range<usize>, BufferError> {
    let reg = registered
        .iter()
        .find(|b| b.id == r.buffer)
        .ok_or(BufferError::Unregistered { buffer: r.buffer })?;
    let end = r.offset.checked_add(r.len);
    let out_of_bounds = BufferError::OutOfBounds {
        buffer: r.buffer,
        end: end.unwrap_or(u64::MAX),
        len: reg.len,
    };
    let end = end.filter(|&e| e <= reg.len).ok_or(out_of_bounds)?;
    // On the 32-bit DSP a registered length can exceed usize only if the
    // registration itself was wrong; refuse rather than truncate.
    let start = usize::try_from(r.offset).map_err(|_| out_of_bounds)?;
    let end = usize::try_from(end).map_err(|_| out_of_bounds)?;
    Ok(start..end)
}

/// [`validate`], plus: the offset is a multiple of `align` and the length is
/// exactly `expected` bytes.
pub fn validate_exact(
    r: &BufferRef,
    registered: &[RegisteredBuffer],
    align: u64,
    expected: Option<u64>,
) -> Result<Range<usize>, BufferError> {
    let range = validate(r, registered)?;
    if align > 1 && r.offset % align != 0 {
        return Err(BufferError::Misaligned { buffer: r.buffer, offset: r.offset });
    }
    match expected {
        Some(e) if e == r.len => Ok(range),
        e => Err(BufferError::WrongLength {
            buffer: r.buffer,
            expected: e.unwrap_or(u64::MAX),
            got: r.len,
        }),
    }
}

/// Whether two validated references share any byte.
pub fn overlaps(a: &BufferRef, b: &BufferRef) -> bool {
    // Both were validated, so offset + len does not overflow.
    a.buffer == b.buffer
        && a.len > 0
        && b.len > 0
        && a.offset < b.offset + b.len
        && b.offset < a.offset + a.len
}

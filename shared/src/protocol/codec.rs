//! postcard encoding of protocol messages, with errors instead of panics.
use serde::{Deserialize, Serialize};

/// Upper bound on an encoded [`super::Request`] or [`super::Response`]; a
/// stack buffer of this size always suffices (checked by a test with every
/// field at its maximum).
pub const MAX_MESSAGE_BYTES: usize = 96;

/// Why bytes did not decode into a message (or a message did not encode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecodeError {
    /// The bytes end in the middle of a message.
    Truncated,
    /// An enum tag names no variant.
    BadTag,
    /// A field holds an impossible value (overlong varint, bool not 0/1, ...).
    BadValue,
    /// A whole message decoded but bytes are left over.
    TrailingBytes,
    /// Encoding only: the output buffer is too small.
    BufferFull,
}

/// Encodes `msg` into `buf`, returning the used prefix.
pub fn encode<'b, T: Serialize>(msg: &T, buf: &'b mut [u8]) -> Result<&'b mut [u8], DecodeError> {
    postcard::to_slice(msg, buf).map_err(map_error)
}

/// Decodes exactly one message from `bytes`.
pub fn decode<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, DecodeError> {
    let (msg, rest) = postcard::take_from_bytes(bytes).map_err(map_error)?;
    if rest.is_empty() {
        Ok(msg)
    } else {
        Err(DecodeError::TrailingBytes)
    }
}

fn map_error(e: postcard::Error) -> DecodeError {
    use postcard::Error as E;
    match e {
        E::DeserializeUnexpectedEnd => DecodeError::Truncated,
        // serde's derived enum visitor reports an unknown variant index as a
        // custom error; our messages raise no other custom errors.
        E::DeserializeBadEnum | E::SerdeDeCustom => DecodeError::BadTag,
        E::SerializeBufferFull => DecodeError::BufferFull,
        _ => DecodeError::BadValue,
    }
}

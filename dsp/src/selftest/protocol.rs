//! Self-tests of the shared protocol (`hexlora_proto::protocol`): encoding
//! round trips, malformed input, and buffer-reference validation.
use crate::{check, check_eq};
use hexlora_proto::protocol::buffer::{validate, validate_exact};
use hexlora_proto::protocol::*;

use super::TestResult;

const WEIGHTS: BufferRef = BufferRef { buffer: 1, offset: 0, len: 24 };
const OP: ProjectionOp = ProjectionOp {
    seq: 7,
    projection: 3,
    direction: Direction::InputGrad,
    tokens: 2,
    input: BufferRef { buffer: 2, offset: 0, len: 24 },
    output: BufferRef { buffer: 2, offset: 64, len: 32 },
};

fn sample_requests() -> [Request; 4] {
    [
        Request::Capabilities,
        Request::LoadWeights(LoadWeights {
            projection: 3,
            precision: Precision::Q8_0,
            shape: WeightShape { rows: 3, cols: 64 },
            weights: WEIGHTS,
        }),
        Request::Unload(u32::MAX),
        Request::Project(OP),
    ]
}

fn sample_responses() -> [Response; 5] {
    [
        Response::Capabilities(Capabilities {
            protocol_version: PROTOCOL_VERSION,
            arch: 67,
            vtcm_bytes: 1 << 20,
            hvx_contexts: 4,
            hmx: false,
            fp16: true,
            q8_0: true,
            max_tokens: 4096,
            max_dim: 16384,
            max_projections: 256,
        }),
        Response::Done(3),
        Response::Op(OpResult {
            seq: 7,
            status: Status::RowsFailed { rows: 2 },
            rows_retried: 5,
            timing: Timing { total_cycles: 1 << 40, dma_wait_cycles: 3, compute_cycles: 9 },
        }),
        Response::Error {
            seq: Some(7),
            error: ServiceError::BadBuffer(BufferError::OutOfBounds { buffer: 2, end: u64::MAX, len: 96 }),
        },
        Response::Error { seq: None, error: ServiceError::VtcmTooSmall { needed: 9, available: 4 } },
    ]
}

/// Every message kind survives encode -> decode unchanged, and every strict
/// prefix of its encoding is reported as truncated.
fn round_trip_and_truncation() -> TestResult {
    let mut buf = [0u8; MAX_MESSAGE_BYTES];
    for req in sample_requests() {
        let n = encode(&req, &mut buf).map_err(|e| fail(format_args!("{e:?}")))?.len();
        check_eq!(decode::<Request>(&buf[..n]), Ok(req));
        for cut in 0..n {
            check_eq!(decode::<Request>(&buf[..cut]), Err(DecodeError::Truncated));
        }
    }
    for resp in sample_responses() {
        let n = encode(&resp, &mut buf).map_err(|e| fail(format_args!("{e:?}")))?.len();
        check_eq!(decode::<Response>(&buf[..n]), Ok(resp));
        for cut in 0..n {
            check_eq!(decode::<Response>(&buf[..cut]), Err(DecodeError::Truncated));
        }
    }
    Ok(())
}

/// The largest possible messages (every varint at its maximum) fit
/// `MAX_MESSAGE_BYTES`, and a too-small buffer is an error, not a panic.
fn largest_messages_fit() -> TestResult {
    let big = BufferRef { buffer: u32::MAX, offset: u64::MAX, len: u64::MAX };
    let req = Request::Project(ProjectionOp {
        seq: u32::MAX,
        projection: u32::MAX,
        direction: Direction::Forward,
        tokens: u32::MAX,
        input: big,
        output: big,
    });
    let resp = Response::Op(OpResult {
        seq: u32::MAX,
        status: Status::RowsFailed { rows: u32::MAX },
        rows_retried: u32::MAX,
        timing: Timing { total_cycles: u64::MAX, dma_wait_cycles: u64::MAX, compute_cycles: u64::MAX },
    });
    let mut buf = [0u8; MAX_MESSAGE_BYTES];
    check!(encode(&req, &mut buf).is_ok());
    check!(encode(&resp, &mut buf).is_ok());
    check_eq!(encode(&req, &mut buf[..8]).map(|b| b.len()), Err(DecodeError::BufferFull));
    Ok(())
}

/// Unknown tags, leftover bytes and overlong varints are errors.
fn malformed_bytes_are_errors() -> TestResult {
    check_eq!(decode::<Request>(&[4]), Err(DecodeError::BadTag));
    check_eq!(decode::<Request>(&[0xff, 0xff, 0xff, 0xff, 0x0f]), Err(DecodeError::BadTag));
    check_eq!(decode::<Request>(&[0, 0]), Err(DecodeError::TrailingBytes));
    // Unload(id) with an 6-byte varint: more than a u32 can hold.
    check_eq!(decode::<Request>(&[2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]), Err(DecodeError::BadValue));
    // Capabilities.hmx is a bool: 2 is not one. Find its byte by encoding
    // both values.
    let caps = sample_responses()[0];
    let Response::Capabilities(c) = caps else { return Err(fail(format_args!("sample 0"))) };
    let mut with_hmx = [0u8; MAX_MESSAGE_BYTES];
    encode(&Response::Capabilities(Capabilities { hmx: true, ..c }), &mut with_hmx)
        .map_err(|e| fail(format_args!("{e:?}")))?;
    let mut buf = [0u8; MAX_MESSAGE_BYTES];
    let n = encode(&caps, &mut buf).map_err(|e| fail(format_args!("{e:?}")))?.len();
    let hmx_at = (0..n).find(|&i| buf[i] != with_hmx[i]).ok_or_else(|| fail(format_args!("no hmx byte")))?;
    check_eq!((buf[hmx_at], with_hmx[hmx_at]), (0, 1));
    buf[hmx_at] = 2;
    check_eq!(decode::<Response>(&buf[..n]), Err(DecodeError::BadValue));
    Ok(())
}

/// Pseudo-random bytes never panic the decoder (the fuzz target in fuzz/
/// does the same at scale).
fn random_bytes_never_panic() -> TestResult {
    let mut state = 0x9e37_79b9_u32;
    let mut buf = [0u8; 24];
    let mut decoded = 0;
    for _ in 0..3000 {
        for b in buf.iter_mut() {
            // xorshift32: a cheap deterministic byte source.
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *b = state as u8 & 0x87; // small values hit real tags more often
        }
        let len = (state >> 8) as usize % buf.len();
        decoded += decode::<Request>(&buf[..len]).is_ok() as u32;
        let _ = decode::<Response>(&buf[..len]);
    }
    check!(decoded > 0, "no random input decoded: the generator hits nothing");
    Ok(())
}

const REGISTERED: [RegisteredBuffer; 2] =
    [RegisteredBuffer { id: 1, len: 24 }, RegisteredBuffer { id: 2, len: 96 }];

/// References inside a buffer give their byte range; anything else names
/// the buffer and the problem, including offset + len overflowing u64.
fn buffer_refs_are_bounds_checked() -> TestResult {
    let r = |buffer, offset, len| BufferRef { buffer, offset, len };
    check_eq!(validate(&r(2, 8, 88), &REGISTERED), Ok(8..96));
    check_eq!(validate(&r(2, 96, 0), &REGISTERED), Ok(96..96));
    check_eq!(validate(&r(9, 0, 1), &REGISTERED), Err(BufferError::Unregistered { buffer: 9 }));
    check_eq!(
        validate(&r(2, 8, 89), &REGISTERED),
        Err(BufferError::OutOfBounds { buffer: 2, end: 97, len: 96 })
    );
    check_eq!(
        validate(&r(2, u64::MAX, 2), &REGISTERED),
        Err(BufferError::OutOfBounds { buffer: 2, end: u64::MAX, len: 96 })
    );
    check_eq!(
        validate(&r(1, 1, u64::MAX), &REGISTERED),
        Err(BufferError::OutOfBounds { buffer: 1, end: u64::MAX, len: 24 })
    );
    check_eq!(
        validate_exact(&r(2, 2, 8), &REGISTERED, 4, Some(8)),
        Err(BufferError::Misaligned { buffer: 2, offset: 2 })
    );
    check_eq!(
        validate_exact(&r(2, 4, 8), &REGISTERED, 4, Some(12)),
        Err(BufferError::WrongLength { buffer: 2, expected: 12, got: 8 })
    );
    // A registration larger than the address space cannot be sliced here.
    if usize::BITS == 32 {
        let huge = [RegisteredBuffer { id: 5, len: 1 << 33 }];
        check!(validate(&r(5, 1 << 32, 4), &huge).is_err());
    }
    Ok(())
}

/// An op's references must match `tokens x features` f32 for its direction
/// and must not overlap.
fn op_buffers_match_shape_and_direction() -> TestResult {
    let shape = WeightShape { rows: 3, cols: 4 };
    // InputGrad: dY (2, 3) = 24 bytes in, dX (2, 4) = 32 bytes out.
    check_eq!(OP.validate(shape, &REGISTERED), Ok(OpBuffers { input: 0..24, output: 64..96 }));
    let forward = ProjectionOp { direction: Direction::Forward, ..OP };
    check_eq!(
        forward.validate(shape, &REGISTERED),
        Err(ServiceError::BadBuffer(BufferError::WrongLength { buffer: 2, expected: 32, got: 24 }))
    );
    let overlapping = ProjectionOp { output: BufferRef { buffer: 2, offset: 20, len: 32 }, ..OP };
    check_eq!(
        overlapping.validate(shape, &REGISTERED),
        Err(ServiceError::BadBuffer(BufferError::Overlap { buffer: 2 }))
    );
    check_eq!(ProjectionOp { tokens: 0, ..OP }.validate(shape, &REGISTERED), Err(ServiceError::InvalidParams));
    // tokens * features * 4 overflows u64 only with absurd shapes: it is
    // reported as a length mismatch, never wraps to a small number.
    let huge = WeightShape { rows: u32::MAX, cols: u32::MAX };
    let absurd = ProjectionOp { tokens: u32::MAX, ..OP };
    check!(matches!(
        absurd.validate(huge, &REGISTERED),
        Err(ServiceError::BadBuffer(BufferError::WrongLength { expected: u64::MAX, .. }))
    ));
    Ok(())
}

/// Weight byte counts: FP16 is 2 bytes per value, Q8_0 34 bytes per 32
/// values; Q8_0 rows must be whole blocks.
fn weight_sizes_follow_precision() -> TestResult {
    let load = |precision, rows, cols| LoadWeights {
        projection: 0,
        precision,
        shape: WeightShape { rows, cols },
        weights: WEIGHTS,
    };
    check_eq!(load(Precision::Fp16, 3, 4).weight_bytes(), Ok(24));
    check_eq!(load(Precision::Q8_0, 3, 64).weight_bytes(), Ok(3 * 2 * 34));
    check_eq!(load(Precision::Q8_0, 3, 48).weight_bytes(), Err(ServiceError::InvalidParams));
    check_eq!(load(Precision::Fp16, 0, 4).weight_bytes(), Err(ServiceError::InvalidParams));
    check_eq!(load(Precision::Fp16, 3, 4).validate(&REGISTERED), Ok(0..24));
    check_eq!(
        load(Precision::Fp16, 4, 4).validate(&REGISTERED),
        Err(ServiceError::BadBuffer(BufferError::WrongLength { buffer: 1, expected: 32, got: 24 }))
    );
    Ok(())
}

fn fail(args: core::fmt::Arguments) -> super::TestFailure {
    super::TestFailure::new(file!(), line!(), args)
}

crate::selftests!(
    round_trip_and_truncation,
    largest_messages_fit,
    malformed_bytes_are_errors,
    random_bytes_never_panic,
    buffer_refs_are_bounds_checked,
    op_buffers_match_shape_and_direction,
    weight_sizes_follow_precision,
);

//! Self-tests of the skel dispatch with constructed `remote_arg` arrays,
//! the way the FastRPC framework calls it.
use super::abi::{AEE_EBADPARM, AEE_ENOMEMORY, AEE_EUNSUPPORTED, AEE_SUCCESS};
use super::*;
use crate::selftest::{TestFailure, TestResult};
use crate::{check, check_eq};
use hexlora_proto::protocol::*;

/// A service that exercises the buffer plumbing: `Project` writes each
/// input byte inverted into the output, `LoadWeights` sums the weight bytes
/// into the answer's projection id.
struct Inverter;

impl Service for Inverter {
    fn open(uri: &[u8]) -> Result<Self, i32> {
        if uri.starts_with(b"file:///libhexlora_skel.so") {
            Ok(Inverter)
        } else {
            Err(AEE_EBADPARM)
        }
    }

    fn handle(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response {
        let error = |seq, error| Response::Error { seq, error };
        match request {
            Request::Project(op) => match buffers.input_output(&op.input, &op.output) {
                Ok((input, output)) => {
                    for (o, i) in output.iter_mut().zip(input) {
                        *o = !*i;
                    }
                    let timing = Timing::default();
                    Response::Op(OpResult { seq: op.seq, status: Status::Ok, rows_retried: 0, timing })
                }
                Err(e) => error(Some(op.seq), e.into()),
            },
            Request::LoadWeights(lw) => match buffers.read(&lw.weights) {
                Ok(w) => Response::Done(w.iter().map(|&b| b as u32).sum()),
                Err(e) => error(None, e.into()),
            },
            _ => error(None, ServiceError::NoSupport),
        }
    }
}

type Table = Spinlock<Sessions<Inverter, 2>>;

fn buf(bytes: &mut [u8]) -> RemoteArg {
    RemoteArg { buf: RemoteBuf { pv: bytes.as_mut_ptr().cast(), len: bytes.len() } }
}

fn fail(args: core::fmt::Arguments) -> TestFailure {
    TestFailure::new(file!(), line!(), args)
}

/// Opens a session the way the framework does; returns the handle.
fn open(table: &Table) -> Result<u64, TestFailure> {
    let mut uri = *b"file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0\0";
    let mut handle = [0u8; 8];
    let mut args = [buf(&mut uri), buf(&mut handle)];
    // SAFETY: args holds 1 in and 1 out buffer, both live.
    let rc = unsafe { invoke(table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) };
    if rc != AEE_SUCCESS {
        return Err(fail(format_args!("open returned {rc}")));
    }
    Ok(u64::from_le_bytes(handle))
}

/// Sends `request` with the given shared buffers; returns (rc, response).
fn call(table: &Table, handle: u64, request: &[u8], ins: &mut [&mut [u8]], outs: &mut [&mut [u8]]) -> (i32, Option<Response>) {
    let mut req = [0u8; MAX_MESSAGE_BYTES];
    req[..request.len()].copy_from_slice(request);
    let mut resp = [0u8; RESPONSE_BUF_BYTES];
    let mut args: heapless::Vec<RemoteArg, 8> = heapless::Vec::new();
    let _ = args.push(buf(&mut req[..request.len()]));
    for b in ins.iter_mut() {
        let _ = args.push(buf(b));
    }
    let _ = args.push(buf(&mut resp));
    for b in outs.iter_mut() {
        let _ = args.push(buf(b));
    }
    let sc = Scalars::make(METHOD_CALL, 1 + ins.len() as u32, 1 + outs.len() as u32);
    // SAFETY: args matches sc and every buffer outlives the call.
    let rc = unsafe { invoke(table, handle, sc.0, args.as_mut_ptr()) };
    let len = u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]]) as usize;
    let response = (rc == AEE_SUCCESS).then(|| decode(&resp[4..4 + len.min(MAX_MESSAGE_BYTES)]).ok()).flatten();
    (rc, response)
}

fn encoded(request: &Request) -> Result<heapless::Vec<u8, MAX_MESSAGE_BYTES>, TestFailure> {
    let mut buf = [0u8; MAX_MESSAGE_BYTES];
    let n = encode(request, &mut buf).map_err(|e| fail(format_args!("{e:?}")))?.len();
    heapless::Vec::from_slice(&buf[..n]).map_err(|_| fail(format_args!("too long")))
}

/// The packing matches `REMOTE_SCALARS_MAKEX` in remote.h bit for bit.
fn scalars_pack_like_remote_h() -> TestResult {
    check_eq!(Scalars::make(2, 3, 1).0, 0x0203_0100);
    let all = Scalars::make_x(1, 31, 255, 255, 15, 15);
    check_eq!(all.0, 0x3fff_ffff);
    check_eq!((all.method(), all.in_bufs(), all.out_bufs(), all.in_handles(), all.out_handles()), (31, 255, 255, 15, 15));
    check_eq!(Scalars::make(METHOD_CALL, 2, 1).total(), 3);
    check_eq!(core::mem::size_of::<RemoteArg>(), 2 * core::mem::size_of::<usize>().max(4));
    Ok(())
}

/// open -> call (with shared buffers in both directions) -> close, then the
/// closed handle is refused.
fn open_call_close() -> TestResult {
    let table = Table::new(Sessions::new());
    let handle = open(&table)?;
    check_eq!(handle, 1);
    let mut input = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let mut output = [0u8; 16];
    let op = ProjectionOp {
        seq: 42,
        projection: 0,
        direction: Direction::Forward,
        tokens: 1,
        input: BufferRef { buffer: 1, offset: 4, len: 4 },
        output: BufferRef { buffer: 2, offset: 8, len: 4 },
    };
    let (rc, resp) = call(&table, handle, &encoded(&Request::Project(op))?, &mut [&mut input], &mut [&mut output]);
    check_eq!(rc, AEE_SUCCESS);
    check!(matches!(resp, Some(Response::Op(OpResult { seq: 42, status: Status::Ok, .. }))), "{:?}", resp);
    check_eq!(output, [0, 0, 0, 0, 0, 0, 0, 0, !5, !6, !7, !8, 0, 0, 0, 0]);
    let mut none: [RemoteArg; 0] = [];
    // SAFETY: no arguments.
    check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CLOSE, 0, 0).0, none.as_mut_ptr()) }, AEE_SUCCESS);
    let (rc, _) = call(&table, handle, &encoded(&Request::Capabilities)?, &mut [], &mut []);
    check_eq!(rc, AEE_EBADPARM);
    // SAFETY: no arguments.
    check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CLOSE, 0, 0).0, none.as_mut_ptr()) }, AEE_EBADPARM);
    Ok(())
}

/// Garbage request bytes get a `Malformed` error response, not a crash;
/// references outside a buffer or into a read-only one get `BadBuffer`.
fn bad_requests_get_error_responses() -> TestResult {
    let table = Table::new(Sessions::new());
    let handle = open(&table)?;
    let (rc, resp) = call(&table, handle, &[9, 9, 9], &mut [], &mut []);
    check_eq!(rc, AEE_SUCCESS);
    check_eq!(resp, Some(Response::Error { seq: None, error: ServiceError::Malformed(DecodeError::BadTag) }));

    let mut input = [0u8; 8];
    let mut output = [0u8; 8];
    let op = ProjectionOp {
        seq: 5,
        projection: 0,
        direction: Direction::Forward,
        tokens: 1,
        input: BufferRef { buffer: 1, offset: 4, len: 8 },
        output: BufferRef { buffer: 2, offset: 0, len: 4 },
    };
    let (_, resp) = call(&table, handle, &encoded(&Request::Project(op))?, &mut [&mut input], &mut [&mut output]);
    let oob = BufferError::OutOfBounds { buffer: 1, end: 12, len: 8 };
    check_eq!(resp, Some(Response::Error { seq: Some(5), error: ServiceError::BadBuffer(oob) }));

    let into_input = ProjectionOp { output: BufferRef { buffer: 1, offset: 0, len: 4 }, input: op.output, ..op };
    let (_, resp) = call(&table, handle, &encoded(&Request::Project(into_input))?, &mut [&mut input], &mut [&mut output]);
    let read_only = ServiceError::BadBuffer(BufferError::ReadOnly { buffer: 1 });
    check_eq!(resp, Some(Response::Error { seq: Some(5), error: read_only }));
    check_eq!(input, [0u8; 8]);
    Ok(())
}

/// Wrong argument layouts fail the transport with the AEE code the
/// framework expects.
fn bad_invocations_fail_the_transport() -> TestResult {
    let table = Table::new(Sessions::new());
    let handle = open(&table)?;
    let mut req = encoded(&Request::Capabilities)?;
    let mut short = [0u8; RESPONSE_BUF_BYTES - 1];
    let mut args = [buf(&mut req), buf(&mut short)];
    // SAFETY: args matches each scalars word below (or is a prefix of it).
    unsafe {
        check_eq!(invoke(&table, handle, Scalars::make(METHOD_CALL, 1, 1).0, args.as_mut_ptr()), AEE_EBADPARM);
        check_eq!(invoke(&table, handle, Scalars::make(METHOD_CALL, 1, 0).0, args.as_mut_ptr()), AEE_EBADPARM);
        check_eq!(invoke(&table, handle, Scalars::make(7, 0, 0).0, args.as_mut_ptr()), AEE_EUNSUPPORTED);
        check_eq!(invoke(&table, 99, Scalars::make(METHOD_CALL, 1, 1).0, args.as_mut_ptr()), AEE_EBADPARM);
        check_eq!(invoke(&table, handle, Scalars::make(METHOD_CALL, 1, 1).0, core::ptr::null_mut()), AEE_EBADPARM);
    }
    // Both session slots in use: the third open is refused.
    check_eq!(open(&table)?, 2);
    check!(open(&table).is_err());
    let mut uri = *b"file:///libhexlora_skel.so\0";
    let mut h = [0u8; 8];
    let mut args = [buf(&mut uri), buf(&mut h)];
    // SAFETY: 1 in, 1 out buffer.
    check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_ENOMEMORY);
    Ok(())
}

/// The projection service itself behind the dispatch (what
/// libhexlora_skel.so serves): load an FP16 weight from in-buf 1, run a
/// forward product of in-buf 2 into out-buf 1, compare with f64.
fn projection_service_serves_through_invoke() -> TestResult {
    use crate::service::ProjectionService;
    use half::f16;
    let table: Spinlock<Sessions<ProjectionService, 1>> = Spinlock::new(Sessions::new());
    let mut uri = *b"file:///libhexlora_skel.so\0";
    let mut h = [0u8; 8];
    let mut args = [buf(&mut uri), buf(&mut h)];
    // SAFETY: 1 in, 1 out buffer.
    check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_SUCCESS);
    let handle = u64::from_le_bytes(h);
    let (rows, cols, tokens) = (5usize, 64usize, 3usize);
    let w: alloc::vec::Vec<f16> = (0..rows * cols).map(|i| f16::from_f32(((i * 37 % 23) as f32 - 11.0) / 8.0)).collect();
    let x: alloc::vec::Vec<f32> = (0..tokens * cols).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
    // u32 storage keeps the buffers 4-byte aligned, as rpcmem buffers are.
    let mut wbuf: alloc::vec::Vec<u32> = bytemuck::cast_slice::<f16, u32>(&w).to_vec();
    let mut xbuf: alloc::vec::Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
    let mut ybuf = alloc::vec![0u32; tokens * rows];
    let wlen = (rows * cols * 2) as u64;
    let load = Request::LoadWeights(LoadWeights {
        projection: 7,
        precision: Precision::Fp16,
        shape: WeightShape { rows: rows as u32, cols: cols as u32 },
        weights: BufferRef { buffer: 1, offset: 0, len: wlen },
    });
    let op = Request::Project(ProjectionOp {
        seq: 1,
        projection: 7,
        direction: Direction::Forward,
        tokens: tokens as u32,
        input: BufferRef { buffer: 2, offset: 0, len: (tokens * cols * 4) as u64 },
        output: BufferRef { buffer: 3, offset: 0, len: (tokens * rows * 4) as u64 },
    });
    let mut answers = heapless::Vec::<Response, 2>::new();
    for request in [load, op] {
        let mut req = encoded(&request)?;
        let mut resp = [0u8; RESPONSE_BUF_BYTES];
        let mut args = [
            buf(&mut req),
            buf(bytemuck::cast_slice_mut(&mut wbuf)),
            buf(bytemuck::cast_slice_mut(&mut xbuf)),
            buf(&mut resp),
            buf(bytemuck::cast_slice_mut(&mut ybuf)),
        ];
        // SAFETY: 3 in, 2 out buffers, all live and disjoint.
        check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CALL, 3, 2).0, args.as_mut_ptr()) }, AEE_SUCCESS);
        let len = u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]]) as usize;
        let r = decode::<Response>(&resp[4..4 + len]).map_err(|e| fail(format_args!("response: {e:?}")))?;
        let _ = answers.push(r);
    }
    check_eq!(answers[0], Response::Done(7));
    check!(matches!(answers[1], Response::Op(OpResult { seq: 1, status: Status::Ok, .. })), "{:?}", answers[1]);
    for t in 0..tokens {
        for r in 0..rows {
            let terms = (0..cols).map(|c| x[t * cols + c] as f64 * w[r * cols + c].to_f64());
            let (want, scale) = terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
            let got = f32::from_bits(ybuf[t * rows + r]) as f64;
            // Activations are rounded to f16 once: relative 2^-11 per term.
            check!((got - want).abs() <= 1e-3 * scale, "y[{}][{}] = {} vs f64 {}", t, r, got, want);
        }
    }
    Ok(())
}

crate::selftests!(
    scalars_pack_like_remote_h,
    open_call_close,
    bad_requests_get_error_responses,
    bad_invocations_fail_the_transport,
    projection_service_serves_through_invoke,
);

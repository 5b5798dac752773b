//! Self-tests of the skel dispatch with constructed `remote_arg` arrays,
//! the way the FastRPC framework calls it.
use super::abi::{AEE_EBADPARM, AEE_ENOMEMORY, AEE_EUNSUPPORTED, AEE_SUCCESS};
use super::*;
use crate::kernels::testbed::Rng;
use crate::selftest::{TestFailure, TestResult};
use crate::{check, check_eq};
use hexlora_proto::protocol::*;

/// A service that exercises the buffer plumbing: `Project` writes each
/// input byte inverted into the output, `LoadWeights` sums the mapped
/// weight bytes into the answer's projection id.
struct Inverter(Option<Mapping>);

impl Service for Inverter {
    fn open(uri: &[u8]) -> Result<Self, i32> {
        if uri.starts_with(b"file:///libhexlora_skel.so") {
            Ok(Inverter(None))
        } else {
            Err(AEE_EBADPARM)
        }
    }

    fn map(&mut self, weights: Mapping) -> Result<(), i32> {
        self.0 = Some(weights);
        Ok(())
    }

    fn mapping(&self) -> Option<&Mapping> {
        self.0.as_ref()
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
            Request::LoadWeights(lw) => match self.0.as_ref().map(|m| m.read(&lw.weights)) {
                Some(Ok(w)) => Response::Done(w.iter().map(|&b| b as u32).sum()),
                Some(Err(e)) => error(None, e.into()),
                None => error(None, ServiceError::InvalidParams),
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
        input: BufferRef { buffer: INPUT_BUFFER, offset: 4, len: 4 },
        output: BufferRef { buffer: OUTPUT_BUFFER, offset: 8, len: 4 },
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
        input: BufferRef { buffer: INPUT_BUFFER, offset: 4, len: 8 },
        output: BufferRef { buffer: OUTPUT_BUFFER, offset: 0, len: 4 },
    };
    let (_, resp) = call(&table, handle, &encoded(&Request::Project(op))?, &mut [&mut input], &mut [&mut output]);
    let oob = BufferError::OutOfBounds { buffer: INPUT_BUFFER, end: 12, len: 8 };
    check_eq!(resp, Some(Response::Error { seq: Some(5), error: ServiceError::BadBuffer(oob) }));

    let into_input = ProjectionOp { output: BufferRef { buffer: INPUT_BUFFER, offset: 0, len: 4 }, input: op.output, ..op };
    let (_, resp) = call(&table, handle, &encoded(&Request::Project(into_input))?, &mut [&mut input], &mut [&mut output]);
    let read_only = ServiceError::BadBuffer(BufferError::ReadOnly { buffer: INPUT_BUFFER });
    check_eq!(resp, Some(Response::Error { seq: Some(5), error: read_only }));
    check_eq!(input, [0u8; 8]);

    // A request longer than any message is Malformed, not read past.
    let long = [0u8; MAX_MESSAGE_BYTES + 1];
    let mut req = long;
    let mut resp_buf = [0u8; RESPONSE_BUF_BYTES];
    let mut args = [buf(&mut req), buf(&mut resp_buf)];
    // SAFETY: 1 in, 1 out buffer, both live.
    check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CALL, 1, 1).0, args.as_mut_ptr()) }, AEE_SUCCESS);
    check_eq!(decode::<Response>(&resp_buf[4..4 + resp_buf[0] as usize]).ok(), Some(Response::Error { seq: None, error: ServiceError::Malformed(DecodeError::TrailingBytes) }));
    Ok(())
}

/// The trust boundary of a call: an output buffer that shares bytes with an
/// input (or with the weights mapping), or a null buffer, fails the call
/// before the service sees it; nothing is written.
fn aliasing_and_null_buffers_are_refused() -> TestResult {
    let table = Table::new(Sessions::new());
    let handle = open(&table)?;
    let mut req = encoded(&Request::Capabilities)?;
    let mut resp = [0u8; RESPONSE_BUF_BYTES];
    let mut shared = [7u8; 64];
    let base = shared.as_mut_ptr();
    let part = |off: usize, len: usize| RemoteArg { buf: RemoteBuf { pv: base.wrapping_add(off).cast(), len } };
    let null = RemoteArg { buf: RemoteBuf { pv: core::ptr::null_mut(), len: 16 } };
    let sc = Scalars::make(METHOD_CALL, 2, 2).0;
    for (input, output, want) in [(part(0, 32), part(16, 32), AEE_EBADPARM), (part(0, 32), null, AEE_EBADPARM), (part(0, 32), part(32, 32), AEE_SUCCESS)] {
        let mut args = [buf(&mut req), input, buf(&mut resp), output];
        // SAFETY: 2 in, 2 out buffers; the non-null ones lie in `shared`.
        check_eq!(unsafe { invoke(&table, handle, sc, args.as_mut_ptr()) }, want);
    }
    check!(shared.iter().all(|&b| b == 7));
    Ok(())
}

/// Method 3 maps the session's weights once, through the fd table
/// `fastrpc_mmap` fills: LoadWeights then reads them in place; a second map,
/// an unknown fd, a length past the registered mapping, and an output
/// buffer inside the mapping are refused.
fn map_registers_the_weights_once() -> TestResult {
    let table = Table::new(Sessions::new());
    let handle = open(&table)?;
    let mut weights = [3u8; 100];
    // SAFETY: `weights` outlives the session (closed below).
    check!(unsafe { mmap::register(41, weights.as_ptr(), weights.len()) });
    let map = |fd: i32, len: usize| {
        let mut arg = map_arg(fd, 0, len);
        let mut args = [buf(&mut arg)];
        // SAFETY: 1 in-buffer, live.
        unsafe { invoke(&table, handle, Scalars::make(METHOD_MAP, 1, 0).0, args.as_mut_ptr()) }
    };
    check_eq!(map(42, 100), AEE_EBADPARM);
    check_eq!(map(41, 101), AEE_EBADPARM);
    check_eq!(map(41, 100), AEE_SUCCESS);
    check_eq!(map(41, 100), AEE_EBADPARM);
    let load = |len| {
        let lw = LoadWeights { projection: 0, precision: Precision::Fp16, shape: WeightShape { rows: 1, cols: 1 }, weights: BufferRef { buffer: WEIGHTS_BUFFER, offset: 10, len } };
        encoded(&Request::LoadWeights(lw))
    };
    let (rc, resp) = call(&table, handle, &load(20)?, &mut [], &mut []);
    check_eq!((rc, resp), (AEE_SUCCESS, Some(Response::Done(60))));
    let (_, resp) = call(&table, handle, &load(91)?, &mut [], &mut []);
    check!(matches!(resp, Some(Response::Error { error: ServiceError::BadBuffer(BufferError::OutOfBounds { .. }), .. })), "{resp:?}");
    // An output buffer inside the mapping.
    let mut req = encoded(&Request::Capabilities)?;
    let mut resp = [0u8; RESPONSE_BUF_BYTES];
    let inside = RemoteArg { buf: RemoteBuf { pv: weights.as_mut_ptr().wrapping_add(50).cast(), len: 8 } };
    let mut args = [buf(&mut req), buf(&mut resp), inside];
    // SAFETY: 1 in, 2 out buffers, all live.
    check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CALL, 1, 2).0, args.as_mut_ptr()) }, AEE_EBADPARM);
    check_eq!(close_session(&table, handle), AEE_SUCCESS);
    mmap::unregister(41);
    check!(weights.iter().all(|&b| b == 3));
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
    // A null URI or handle buffer (found by fuzz/skel_invoke) is refused.
    let mut h = [0u8; 8];
    let mut args = [RemoteArg { buf: RemoteBuf { pv: core::ptr::null_mut(), len: 9 } }, buf(&mut h)];
    // SAFETY: 1 in (null, refused before use), 1 out buffer.
    check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_EBADPARM);
    let mut uri = *b"file:///libhexlora_skel.so\0";
    let mut args = [buf(&mut uri), RemoteArg { buf: RemoteBuf { pv: core::ptr::null_mut(), len: 8 } }];
    // SAFETY: as above.
    check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_EBADPARM);
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
    let wbuf: alloc::vec::Vec<u32> = bytemuck::cast_slice::<f16, u32>(&w).to_vec();
    let mut xbuf: alloc::vec::Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
    let mut ybuf = alloc::vec![0u32; tokens * rows];
    let wlen = (rows * cols * 2) as u64;
    // The weights are mapped once (as fastrpc_mmap + method 3 do), then
    // every call carries only the input and the output.
    // SAFETY: wbuf outlives the session (closed below).
    check!(unsafe { mmap::register(9, wbuf.as_ptr().cast(), wlen as usize) });
    let mut arg = map_arg(9, 0, wlen as usize);
    let mut args = [buf(&mut arg)];
    // SAFETY: 1 in-buffer.
    check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_MAP, 1, 0).0, args.as_mut_ptr()) }, AEE_SUCCESS);
    let load = Request::LoadWeights(LoadWeights {
        projection: 7,
        precision: Precision::Fp16,
        shape: WeightShape { rows: rows as u32, cols: cols as u32 },
        weights: BufferRef { buffer: WEIGHTS_BUFFER, offset: 0, len: wlen },
    });
    let op = Request::Project(ProjectionOp {
        seq: 1,
        projection: 7,
        direction: Direction::Forward,
        tokens: tokens as u32,
        input: BufferRef { buffer: INPUT_BUFFER, offset: 0, len: (tokens * cols * 4) as u64 },
        output: BufferRef { buffer: OUTPUT_BUFFER, offset: 0, len: (tokens * rows * 4) as u64 },
    });
    let mut answers = heapless::Vec::<Response, 2>::new();
    for request in [load, op] {
        let mut req = encoded(&request)?;
        let mut resp = [0u8; RESPONSE_BUF_BYTES];
        let mut args = [buf(&mut req), buf(bytemuck::cast_slice_mut(&mut xbuf)), buf(&mut resp), buf(bytemuck::cast_slice_mut(&mut ybuf))];
        // SAFETY: 2 in, 2 out buffers, all live and disjoint.
        check_eq!(unsafe { invoke(&table, handle, Scalars::make(METHOD_CALL, 2, 2).0, args.as_mut_ptr()) }, AEE_SUCCESS);
        let len = u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]]) as usize;
        let r = decode::<Response>(&resp[4..4 + len]).map_err(|e| fail(format_args!("response: {e:?}")))?;
        let _ = answers.push(r);
    }
    check_eq!(close_session(&table, handle), AEE_SUCCESS);
    mmap::unregister(9);
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

/// A request that mostly makes sense: loads and ops with random shapes and
/// references, or random bytes.
fn random_request(rng: &mut Rng, buf: &mut [u8; MAX_MESSAGE_BYTES]) -> usize {
    let r = |rng: &mut Rng| {
        let buffer = 1 + rng.below(4) as u32;
        BufferRef { buffer, offset: rng.below(9000), len: rng.below(9000) }
    };
    let request = match rng.below(4) {
        0 => Request::LoadWeights(LoadWeights {
            projection: rng.below(3) as u32,
            precision: if rng.below(2) == 0 { Precision::Fp16 } else { Precision::Q8_0 },
            shape: WeightShape { rows: 1 + rng.below(8) as u32, cols: 32 * (1 + rng.below(2) as u32) },
            weights: r(rng),
        }),
        1 | 2 => Request::Project(ProjectionOp {
            seq: rng.next_u64() as u32,
            projection: rng.below(3) as u32,
            direction: if rng.below(2) == 0 { Direction::Forward } else { Direction::InputGrad },
            tokens: rng.below(5) as u32,
            input: r(rng),
            output: r(rng),
        }),
        _ => {
            let n = rng.below(MAX_MESSAGE_BYTES as u64 + 8) as usize;
            let n = n.min(MAX_MESSAGE_BYTES);
            buf[..n].iter_mut().for_each(|b| *b = rng.next_u64() as u8);
            return n;
        }
    };
    encode(&request, buf).map(|b| b.len()).unwrap_or(0)
}

/// Arbitrary invocations of the real service's entry point, the way a
/// hostile or broken host could make them: random methods and argument
/// counts, buffers that are null, empty, overlapping each other or the
/// weights mapping, requests with references anywhere. Every one returns a
/// status (the harness would abort on a panic), and both accepted and
/// refused calls occur. (A smaller-scale sibling of
/// fuzz/fuzz_targets/skel_invoke.rs, run here natively and under qemu.)
fn random_invocations_never_panic() -> TestResult {
    use crate::service::ProjectionService;
    let table: Spinlock<Sessions<ProjectionService, 1>> = Spinlock::new(Sessions::new());
    let mut arena = alloc::vec![0u32; 4096];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    arena.iter_mut().for_each(|w| *w = (rng.next_u64() as u32) & 0x3bff_3bff); // finite f16 pairs
    let base = arena.as_mut_ptr().cast::<u8>();
    let bytes = arena.len() * 4;
    // SAFETY: the arena outlives the session (closed below).
    check!(unsafe { mmap::register(77, base, bytes) });
    let mut uri = *b"file:///libhexlora_skel.so\0";
    let mut h = [0u8; 8];
    let mut args = [buf(&mut uri), buf(&mut h)];
    // SAFETY: 1 in, 1 out buffer.
    check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_SUCCESS);
    let handle = u64::from_le_bytes(h);
    let (mut accepted, mut refused) = (0u32, 0u32);
    for i in 0..400 {
        let mut req = [0u8; MAX_MESSAGE_BYTES];
        let req_len = random_request(&mut rng, &mut req);
        let mut resp = [0u8; RESPONSE_BUF_BYTES];
        let mut map = map_arg(77, rng.below(64) as usize * 4, rng.below(bytes as u64 + 64) as usize);
        let method = [METHOD_CALL, METHOD_CALL, METHOD_CALL, METHOD_MAP, METHOD_CLOSE, 9][rng.below(6) as usize];
        let method = if i == 0 { METHOD_MAP } else { method };
        let (ins, outs) = (rng.below(4) as usize, rng.below(4) as usize);
        let mut list: heapless::Vec<RemoteArg, 8> = heapless::Vec::new();
        for k in 0..ins + outs {
            let arg = match (k, method) {
                (0, METHOD_MAP) => buf(&mut map),
                (0, _) => buf(&mut req[..req_len]),
                _ if k == ins && rng.below(4) != 0 => buf(&mut resp),
                _ => match rng.below(8) {
                    0 => RemoteArg { buf: RemoteBuf { pv: core::ptr::null_mut(), len: rng.below(64) as usize } },
                    _ => {
                        let off = rng.below(bytes as u64) as usize & !3;
                        let len = rng.below((bytes - off) as u64 + 1) as usize;
                        RemoteArg { buf: RemoteBuf { pv: base.wrapping_add(off).cast(), len } }
                    }
                },
            };
            let _ = list.push(arg);
        }
        let sc = Scalars::make(method, ins as u32, outs as u32).0;
        let handle = if rng.below(16) == 0 { rng.next_u64() } else { handle };
        // SAFETY: every non-null buffer lies in `arena` or a live local.
        let code = unsafe { invoke(&table, handle, sc, list.as_mut_ptr()) };
        if method == METHOD_CLOSE && code == AEE_SUCCESS {
            // Re-open so the run goes on against a live session.
            let mut args = [buf(&mut uri), buf(&mut h)];
            // SAFETY: 1 in, 1 out buffer.
            check_eq!(unsafe { invoke(&table, 0, Scalars::make(METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_SUCCESS);
        }
        if code == AEE_SUCCESS { accepted += 1 } else { refused += 1 }
    }
    check!(accepted > 20 && refused > 20, "accepted {} refused {}", accepted, refused);
    check_eq!(close_session(&table, u64::from_le_bytes(h)), AEE_SUCCESS);
    mmap::unregister(77);
    Ok(())
}

crate::selftests!(
    scalars_pack_like_remote_h,
    random_invocations_never_panic,
    open_call_close,
    bad_requests_get_error_responses,
    bad_invocations_fail_the_transport,
    aliasing_and_null_buffers_are_refused,
    map_registers_the_weights_once,
    projection_service_serves_through_invoke,
);

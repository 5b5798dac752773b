//! A skel session opened with the device's constants, natively: VTCM of
//! the device's size ([`limits::SESSION_VTCM_BYTES`]), weights larger than
//! the whole firmware heap ([`limits::HEAP_BYTES`]) loaded through the
//! registered mapping and read in place (a counting allocator shows the
//! load allocates almost nothing), a product checked against f64, and
//! oversized or inconsistent host requests answered with error statuses.
use half::f16;
use hexlora_dsp::rt::limits;
use hexlora_dsp::service::{ProjectionService, MAX_TOKENS};
use hexlora_dsp::skel::abi::{AEE_EBADPARM, AEE_SUCCESS};
use hexlora_dsp::skel::{self, map_arg, mmap, RemoteArg, RemoteBuf, Scalars, Sessions, RESPONSE_BUF_BYTES};
use hexlora_proto::protocol::*;
use spinning_top::Spinlock;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes every allocation of this test binary asks for.
struct Counting;
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(l.size(), Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn arg(bytes: &mut [u8]) -> RemoteArg {
    RemoteArg { buf: RemoteBuf { pv: bytes.as_mut_ptr().cast(), len: bytes.len() } }
}

type Table = Spinlock<Sessions<ProjectionService, 1>>;

/// One `call` with `ins`/`outs` as the shared buffers; the decoded response.
fn call(table: &Table, handle: u64, request: &Request, shared_in: &mut [u8], shared_out: &mut [u8]) -> Response {
    let mut req = [0u8; MAX_MESSAGE_BYTES];
    let n = encode(request, &mut req).unwrap().len();
    let mut resp = vec![0u8; RESPONSE_BUF_BYTES];
    let mut args = [arg(&mut req[..n]), arg(shared_in), arg(&mut resp), arg(shared_out)];
    // SAFETY: 2 in, 2 out buffers, live and disjoint.
    let code = unsafe { skel::invoke(table, handle, Scalars::make(skel::METHOD_CALL, 2, 2).0, args.as_mut_ptr()) };
    assert_eq!(code, AEE_SUCCESS);
    let len = u32::from_le_bytes(resp[..4].try_into().unwrap()) as usize;
    decode(&resp[4..4 + len]).unwrap()
}

#[test]
fn device_session_holds_weights_larger_than_the_heap_in_place() {
    let table: Table = Spinlock::new(Sessions::new());
    let mut uri = *b"file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=cdsp\0";
    let mut h = [0u8; 8];
    let mut args = [arg(&mut uri), arg(&mut h)];
    // SAFETY: 1 in, 1 out buffer.
    assert_eq!(unsafe { skel::invoke(&table, 0, Scalars::make(skel::METHOD_OPEN, 1, 1).0, args.as_mut_ptr()) }, AEE_SUCCESS);
    let handle = u64::from_le_bytes(h);

    // 2048 x 3072 FP16 = 12 MiB of weights, 1.5x the firmware heap.
    let (rows, cols) = (2048usize, 3072usize);
    assert!(rows * cols * 2 > limits::HEAP_BYTES);
    let w: Vec<f16> = (0..rows * cols).map(|i| f16::from_f32(((i * 7919 % 4001) as f32 - 2000.0) / 2000.0)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&w);
    // SAFETY: `w` outlives the session (closed below).
    assert!(unsafe { mmap::register(5, bytes.as_ptr(), bytes.len()) });
    let map = |offset: usize, len: usize| {
        let mut a = map_arg(5, offset, len);
        let mut args = [arg(&mut a)];
        // SAFETY: 1 in-buffer.
        unsafe { skel::invoke(&table, handle, Scalars::make(skel::METHOD_MAP, 1, 0).0, args.as_mut_ptr()) }
    };
    assert_eq!(map(0, bytes.len() + 2), AEE_EBADPARM, "a mapping longer than the fd's is refused");
    assert_eq!(map(0, bytes.len()), AEE_SUCCESS);

    let mut none_in = [0u8; 0];
    let mut none_out = [0u8; 0];
    match call(&table, handle, &Request::Capabilities, &mut none_in, &mut none_out) {
        Response::Capabilities(c) => assert_eq!(c.vtcm_bytes as usize, limits::SESSION_VTCM_BYTES),
        other => panic!("{other:?}"),
    }
    let load = |rows: u32, len: u64| {
        Request::LoadWeights(LoadWeights {
            projection: 1,
            precision: Precision::Fp16,
            shape: WeightShape { rows, cols: cols as u32 },
            weights: BufferRef { buffer: WEIGHTS_BUFFER, offset: 0, len },
        })
    };
    // A shape whose bytes run past the mapping.
    let too_big = call(&table, handle, &load(rows as u32 + 1, (rows as u64 + 1) * cols as u64 * 2), &mut none_in, &mut none_out);
    assert!(matches!(too_big, Response::Error { error: ServiceError::BadBuffer(BufferError::OutOfBounds { .. }), .. }), "{too_big:?}");
    let before = ALLOCATED.load(Ordering::Relaxed);
    assert_eq!(call(&table, handle, &load(rows as u32, bytes.len() as u64), &mut none_in, &mut none_out), Response::Done(1));
    let load_alloc = ALLOCATED.load(Ordering::Relaxed) - before;
    assert!(load_alloc < 64 << 10, "loading 12 MiB allocated {load_alloc} bytes: the weights were copied");

    // Forward of 2 tokens against f64.
    let tokens = 2usize;
    let x: Vec<f32> = (0..tokens * cols).map(|i| ((i * 31 % 97) as f32 - 48.0) / 24.0).collect();
    let mut input: Vec<u8> = bytemuck::cast_slice(&x).to_vec();
    let mut output = vec![0u8; tokens * rows * 4];
    let op = |tokens: u32, in_len: u64, out_len: u64| {
        Request::Project(ProjectionOp {
            seq: 3,
            projection: 1,
            direction: Direction::Forward,
            tokens,
            input: BufferRef { buffer: INPUT_BUFFER, offset: 0, len: in_len },
            output: BufferRef { buffer: OUTPUT_BUFFER, offset: 0, len: out_len },
        })
    };
    let r = call(&table, handle, &op(tokens as u32, input.len() as u64, output.len() as u64), &mut input, &mut output);
    assert!(matches!(r, Response::Op(OpResult { status: Status::Ok, rows_retried: 0, .. })), "{r:?}");
    let y: &[f32] = bytemuck::cast_slice(&output);
    for t in 0..tokens {
        for j in (0..rows).step_by(97) {
            let terms = (0..cols).map(|c| x[t * cols + c] as f64 * w[j * cols + c].to_f64());
            let (want, scale) = terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
            // One f16 rounding of each activation (2^-11 relative) and f32 sums.
            assert!((y[t * rows + j] as f64 - want).abs() <= 1e-3 * scale, "y[{t}][{j}] {} vs {want}", y[t * rows + j]);
        }
    }

    // Oversized requests: more tokens than any op may carry, buffers that
    // do not match the shape. Each is an error status.
    let huge = call(&table, handle, &op(MAX_TOKENS + 1, input.len() as u64, output.len() as u64), &mut input, &mut output);
    assert!(matches!(huge, Response::Error { error: ServiceError::InvalidParams, .. }), "{huge:?}");
    let mismatch = call(&table, handle, &op(3, input.len() as u64, output.len() as u64), &mut input, &mut output);
    assert!(matches!(mismatch, Response::Error { error: ServiceError::BadBuffer(_), .. }), "{mismatch:?}");

    assert_eq!(skel::close_session(&table, handle), AEE_SUCCESS);
    mmap::unregister(5);
}

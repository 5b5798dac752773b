//! Service self-tests: requests through [`ProjectionService::serve`] with
//! buffers laid out as the skel passes them: the session's weights mapping
//! (id 1), the call's input (id 2, read-only) and output (id 3, writable).
use super::{ProjectionService, MAX_PROJECTIONS};
use crate::kernels::testbed::{first_violation, fp16_weight, q8_weight, reference, Rng};
use crate::kernels::{Direction as KDir, ResidentWeight};
use crate::selftest::TestResult;
use crate::skel::{Mapping, RemoteBuf, SharedBuffers};
use crate::vtcm::VtcmRegion;
use crate::{check, check_eq};
use alloc::vec;
use alloc::vec::Vec;
use hexlora_proto::protocol::{
    BufferError, BufferRef, Direction, LoadWeights, Precision, ProjectionOp, Request, Response, ServiceError, Status,
    WeightShape, INPUT_BUFFER, OUTPUT_BUFFER, PROTOCOL_VERSION, WEIGHTS_BUFFER,
};

const VTCM: usize = 1 << 20;

fn remote(bytes: &mut [u8]) -> RemoteBuf {
    RemoteBuf { pv: bytes.as_mut_ptr().cast(), len: bytes.len() }
}

/// A session's weights mapping and one call's input and output (u32
/// storage keeps them 4-byte aligned, as rpcmem buffers are).
struct Call {
    weights: Vec<u32>,
    inbuf: Vec<u32>,
    outbuf: Vec<u32>,
    w_len: usize,
    in_len: usize,
}

impl Call {
    fn new(weights: &[u8], input: &[f32], out_floats: usize) -> Call {
        let mut w = vec![0u8; weights.len().div_ceil(4) * 4 + 4];
        w[..weights.len()].copy_from_slice(weights);
        let weights_u32 = w.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let inbuf = input.iter().map(|x| x.to_bits()).collect();
        Call { weights: weights_u32, inbuf, outbuf: vec![0; out_floats], w_len: weights.len(), in_len: input.len() * 4 }
    }

    /// A session over `vtcm_bytes` of VTCM with this call's weights mapped.
    fn session(&mut self, vtcm_bytes: usize) -> Result<ProjectionService, crate::selftest::TestFailure> {
        let vtcm = VtcmRegion::new(vtcm_bytes);
        check!(vtcm.is_some());
        let mut svc = ProjectionService::new(vtcm.unwrap());
        // SAFETY: the weights outlive every use of `svc` in these tests.
        let mapping = unsafe { Mapping::new(remote(bytemuck::cast_slice_mut(&mut self.weights))) };
        check!(mapping.is_some() && svc.map_weights(mapping.unwrap()).is_ok());
        Ok(svc)
    }

    fn set_input(&mut self, input: &[f32]) {
        self.inbuf = input.iter().map(|x| x.to_bits()).collect();
        self.in_len = input.len() * 4;
    }

    fn serve(&mut self, svc: &mut ProjectionService, req: &Request) -> Response {
        let i = remote(bytemuck::cast_slice_mut(&mut self.inbuf));
        let o = remote(bytemuck::cast_slice_mut(&mut self.outbuf));
        // SAFETY: both buffers outlive the call and nothing else touches them.
        let mut bufs = unsafe { SharedBuffers::new(&[i], &[o], None) }.unwrap();
        svc.serve(req, &mut bufs)
    }

    fn weights(&self) -> BufferRef {
        BufferRef { buffer: WEIGHTS_BUFFER, offset: 0, len: self.w_len as u64 }
    }

    fn op(&self, projection: u32, direction: Direction, tokens: u32) -> ProjectionOp {
        ProjectionOp {
            seq: 77,
            projection,
            direction,
            tokens,
            input: BufferRef { buffer: INPUT_BUFFER, offset: 0, len: self.in_len as u64 },
            output: BufferRef { buffer: OUTPUT_BUFFER, offset: 0, len: self.outbuf.len() as u64 * 4 },
        }
    }

    fn output(&self) -> Vec<f32> {
        self.outbuf.iter().map(|&b| f32::from_bits(b)).collect()
    }
}

fn load(precision: Precision, rows: u32, cols: u32, weights: BufferRef) -> Request {
    Request::LoadWeights(LoadWeights { projection: 5, precision, shape: WeightShape { rows, cols }, weights })
}

/// Load, forward and input-gradient through the service; outputs checked
/// against the f64 reference, both precisions.
fn load_and_project_both_directions() -> TestResult {
    let (rows, cols, tokens) = (40usize, 64usize, 9usize);
    let w16 = fp16_weight(&mut Rng(40), rows, cols, 0.5);
    let w16_bytes: Vec<u8> = w16.iter().flat_map(|x| x.to_le_bytes()).collect();
    let wq = q8_weight(&mut Rng(41), rows, cols, 0.5);
    for (precision, bytes) in [(Precision::Fp16, &w16_bytes), (Precision::Q8_0, &wq)] {
        let w = match precision {
            Precision::Fp16 => ResidentWeight::fp16(&w16, rows, cols),
            Precision::Q8_0 => ResidentWeight::q8_0(&wq, rows, cols),
        };
        check!(w.is_ok());
        let w = w.unwrap();
        for (dir, kdir, d, o) in [(Direction::Forward, KDir::Forward, cols, rows), (Direction::InputGrad, KDir::InputGrad, rows, cols)] {
            let x = Rng(42).vec(tokens * d, 2.0);
            let mut call = Call::new(bytes, &x, tokens * o);
            let mut svc = call.session(VTCM)?;
            check_eq!(call.serve(&mut svc, &load(precision, rows as u32, cols as u32, call.weights())), Response::Done(5));
            let r = call.serve(&mut svc, &Request::Project(call.op(5, dir, tokens as u32)));
            check!(matches!(r, Response::Op(res) if res.seq == 77 && res.status == Status::Ok && res.rows_retried == 0), "{r:?}");
            let (y, bound) = reference(&w, kdir, tokens, &x);
            let got = call.output();
            check!(first_violation(&got, &y, &bound).is_none(), "{:?}", first_violation(&got, &y, &bound));
        }
    }
    Ok(())
}

fn capabilities_describe_this_build() -> TestResult {
    let mut call = Call::new(&[0; 4], &[], 0);
    let mut svc = call.session(VTCM)?;
    match call.serve(&mut svc, &Request::Capabilities) {
        Response::Capabilities(c) => {
            check_eq!(c.protocol_version, PROTOCOL_VERSION);
            check_eq!(c.vtcm_bytes as usize, VTCM);
            check!(c.fp16 && c.q8_0 && !c.hmx);
            check_eq!(c.max_projections as usize, MAX_PROJECTIONS);
            check_eq!(c.max_dim, 32767);
        }
        other => check!(false, "{other:?}"),
    }
    Ok(())
}

/// Every refusal is an error response naming the problem.
fn bad_requests_get_error_responses() -> TestResult {
    let (rows, cols) = (8u32, 32u32);
    let w16 = fp16_weight(&mut Rng(43), 8, 32, 0.5);
    let bytes: Vec<u8> = w16.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut x = vec![1.0f32; 2 * 32];
    let mut call = Call::new(&bytes, &x, 2 * 8);
    let mut svc = call.session(VTCM)?;
    let err = |error| Response::Error { seq: None, error };
    let op_err = |error| Response::Error { seq: Some(77), error };
    // Projecting before loading.
    check_eq!(call.serve(&mut svc, &Request::Project(call.op(5, Direction::Forward, 2))), op_err(ServiceError::UnknownProjection(5)));
    // Weight reference past the mapping's end, or into a call buffer.
    let mut far = call.weights();
    far.offset = 4096;
    check!(matches!(call.serve(&mut svc, &load(Precision::Fp16, rows, cols, far)), Response::Error { error: ServiceError::BadBuffer(BufferError::OutOfBounds { .. }), .. }));
    let mut input = call.weights();
    input.buffer = INPUT_BUFFER;
    check_eq!(call.serve(&mut svc, &load(Precision::Fp16, rows, cols, input)), err(ServiceError::BadBuffer(BufferError::Unregistered { buffer: INPUT_BUFFER })));
    check_eq!(call.serve(&mut svc, &load(Precision::Fp16, rows, cols, call.weights())), Response::Done(5));
    check_eq!(call.serve(&mut svc, &load(Precision::Fp16, rows, cols, call.weights())), err(ServiceError::ProjectionSlot(5)));
    // Token count that does not match the buffers.
    check!(matches!(call.serve(&mut svc, &Request::Project(call.op(5, Direction::Forward, 3))), Response::Error { seq: Some(77), error: ServiceError::BadBuffer(BufferError::WrongLength { .. }) }));
    // NaN input.
    x[40] = f32::NAN;
    call.set_input(&x);
    check_eq!(call.serve(&mut svc, &Request::Project(call.op(5, Direction::Forward, 2))), op_err(ServiceError::InvalidParams));
    // An op may not name the weights mapping as its output.
    let mut onto_weights = call.op(5, Direction::Forward, 2);
    onto_weights.output = BufferRef { buffer: WEIGHTS_BUFFER, offset: 0, len: 64 };
    check!(matches!(call.serve(&mut svc, &Request::Project(onto_weights)), Response::Error { error: ServiceError::BadBuffer(_), .. }));
    // Unload, then the id is unknown.
    check_eq!(call.serve(&mut svc, &Request::Unload(5)), Response::Done(5));
    check_eq!(call.serve(&mut svc, &Request::Unload(5)), err(ServiceError::UnknownProjection(5)));
    // Q8_0 with a NaN block scale is refused at load.
    let mut wq = q8_weight(&mut Rng(44), 8, 32, 0.5);
    wq[1] = 0x7e;
    let mut qcall = Call::new(&wq, &[], 0);
    let mut svc = qcall.session(VTCM)?;
    check_eq!(qcall.serve(&mut svc, &load(Precision::Q8_0, rows, cols, qcall.weights())), err(ServiceError::InvalidParams));
    Ok(())
}

/// A shape above the kernels' limit answers NoSupport (host falls back); a
/// VTCM too small for one token block answers VtcmTooSmall.
fn unsupported_ops_answer_no_support_or_vtcm() -> TestResult {
    let cols = 32_800u32;
    let bytes = vec![0u8; cols as usize * 2];
    let x = vec![0.5f32; cols as usize];
    let mut call = Call::new(&bytes, &x, 1);
    let mut svc = call.session(VTCM)?;
    check_eq!(call.serve(&mut svc, &load(Precision::Fp16, 1, cols, call.weights())), Response::Done(5));
    check_eq!(call.serve(&mut svc, &Request::Project(call.op(5, Direction::Forward, 1))), Response::Error { seq: Some(77), error: ServiceError::NoSupport });
    let cols = 8192u32;
    let mut call = Call::new(&vec![0u8; cols as usize * 2], &vec![0.5; cols as usize], 1);
    let mut small = call.session(64 << 10)?;
    check_eq!(call.serve(&mut small, &load(Precision::Fp16, 1, cols, call.weights())), Response::Done(5));
    let r = call.serve(&mut small, &Request::Project(call.op(5, Direction::Forward, 1)));
    check!(matches!(r, Response::Error { seq: Some(77), error: ServiceError::VtcmTooSmall { available: 65536, .. } }), "{r:?}");
    Ok(())
}

/// A session opened the way the skel opens it gets its VTCM.
fn skel_open_reserves_session_vtcm() -> TestResult {
    use crate::skel::Service;
    let svc = ProjectionService::open(b"file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0");
    check!(svc.is_ok());
    check_eq!(svc.map(|s| s.capabilities().vtcm_bytes as usize).unwrap_or(0), crate::rt::limits::SESSION_VTCM_BYTES);
    Ok(())
}

crate::selftests!(
    skel_open_reserves_session_vtcm,
    load_and_project_both_directions,
    capabilities_describe_this_build,
    bad_requests_get_error_responses,
    unsupported_ops_answer_no_support_or_vtcm,
);

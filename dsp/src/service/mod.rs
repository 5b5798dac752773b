//! The projection service: the [`crate::skel::Service`] that owns the
//! resident weights and runs one op per request.
//!
//! One request at a time: request (decoded by the skel) -> validate -> run
//! -> [`Response`]. Every failure is an error response, never a panic:
//!
//! | request | checks | answer |
//! |---|---|---|
//! | `Capabilities` | | [`Capabilities`] of this build |
//! | `LoadWeights` | mapping registered, reference in it, exact length, table slot, FP16 finite / Q8_0 scales finite | `Done(id)` |
//! | `Unload` | id resident | `Done(id)` |
//! | `Project` | id resident, references in bounds/aligned/exact/disjoint, input finite, VTCM fits | `Op(OpResult)` |
//!
//! Resident weights stay where they lie in the session's weights mapping
//! ([`Mapping`], protocol buffer 1, registered once per session): `load`
//! checks them once (finite FP16, finite Q8_0 scales, their maximum for the
//! first-scale bound) and keeps only their place; ops read them from there.
//! Nothing host-sized is copied into the firmware heap, and the heap
//! allocations an op does make (row lists) are fallible: a failure is
//! [`ServiceError::OutOfMemory`], never an abort. The table is a
//! `heapless::Vec` of at most [`MAX_PROJECTIONS`].
//!
//! Error mapping: NaN/inf input, an empty shape or a mismatched length is
//! `InvalidParams`; shapes the kernels do not take (dimension above
//! [`crate::kernels::plan::MAX_DIM`]) are `NoSupport`; a chunk that cannot
//! fit is `VtcmTooSmall`, so the host falls back to its CPU path. Rows that
//! overflow after three rescale retries come back as
//! `Status::RowsFailed` with NaN in their output rows.
use crate::dma::software::SoftwareDma;
use crate::kernels::{self, Engines, KernelError, ResidentWeight, RunStats};
use crate::kernels::WeightData;
use crate::rt::limits;
use crate::skel::{Mapping, SharedBuffers};
use crate::tile::DeviceTiles;
use crate::vtcm::VtcmRegion;
use half::f16;
use hexlora_proto::protocol::{
    BufferError, BufferRef, Capabilities, LoadWeights, OpResult, Precision, ProjectionId, ProjectionOp, Request, Response,
    ServiceError, Status, Timing, WeightShape, PROTOCOL_VERSION, WEIGHTS_BUFFER,
};

/// Resident projections at most.
pub const MAX_PROJECTIONS: usize = 512;

/// Largest `tokens` one op may carry (the kernels chunk internally; this
/// bounds the host's buffers, not VTCM).
pub const MAX_TOKENS: u32 = 1 << 16;

/// A weight the service keeps: where it lies in the mapping, and what the
/// load-time check found.
struct Resident {
    id: ProjectionId,
    shape: WeightShape,
    precision: Precision,
    /// Byte range in the mapping.
    offset: usize,
    len: usize,
    /// Upper bound on |w|, from the load-time check.
    max_abs: f32,
}

/// Views `bytes` as weight `r`'s storage, checking everything
/// ([`ResidentWeight::fp16`] / [`ResidentWeight::q8_0`]).
fn check_weight<'a>(precision: Precision, shape: WeightShape, bytes: &'a [u8]) -> Result<ResidentWeight<'a>, KernelError> {
    let (rows, cols) = (shape.rows as usize, shape.cols as usize);
    match precision {
        Precision::Fp16 => ResidentWeight::fp16(fp16_view(bytes)?, rows, cols),
        Precision::Q8_0 => ResidentWeight::q8_0(bytes, rows, cols),
    }
}

/// FP16 weights in place: the mapping is page-aligned and references are
/// 2-byte aligned (validated), so the cast fails only on a host that broke
/// that, which is an error rather than a copy.
fn fp16_view(bytes: &[u8]) -> Result<&[f16], KernelError> {
    bytemuck::try_cast_slice(bytes).map_err(|_| KernelError::Shape("FP16 weights are not 2-byte aligned in the mapping"))
}

/// The service state of one session.
///
/// It is `Send` without any `unsafe impl`: the DMA engine, whose queued
/// descriptors hold raw pointers into the call's buffers, is not part of the
/// state but created per request in [`ProjectionService::serve`] (its queue
/// is empty again when `kernels::project` returns), and [`VtcmRegion`] is
/// uniquely owned memory. The skel keeps sessions in a static shared by the
/// FastRPC threads, which needs exactly this.
pub struct ProjectionService {
    mapping: Option<Mapping>,
    resident: heapless::Vec<Resident, MAX_PROJECTIONS>,
    vtcm: VtcmRegion,
    tiles: DeviceTiles,
    arch: u16,
}

impl ProjectionService {
    /// A service over `vtcm` (see [`VtcmRegion::for_session`]).
    pub fn new(vtcm: VtcmRegion) -> ProjectionService {
        ProjectionService { mapping: None, resident: heapless::Vec::new(), vtcm, tiles: DeviceTiles::default(), arch: build_arch() }
    }

    /// Takes the session's weights mapping; a session maps once.
    pub fn map_weights(&mut self, mapping: Mapping) -> Result<(), ServiceError> {
        if self.mapping.is_some() {
            return Err(ServiceError::InvalidParams);
        }
        self.mapping = Some(mapping);
        Ok(())
    }

    /// Serves one decoded request against this call's shared buffers.
    pub fn serve(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response {
        let seq = match request {
            Request::Project(op) => Some(op.seq),
            _ => None,
        };
        let answer = match request {
            Request::Capabilities => Ok(Response::Capabilities(self.capabilities())),
            Request::LoadWeights(lw) => self.load(lw).map(Response::Done),
            Request::Unload(id) => self.unload(*id).map(Response::Done),
            Request::Project(op) => self.project(op, buffers).map(Response::Op),
        };
        answer.unwrap_or_else(|error| Response::Error { seq, error })
    }

    /// What this build offers.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            protocol_version: PROTOCOL_VERSION,
            arch: self.arch,
            vtcm_bytes: u32::try_from(self.vtcm.capacity()).unwrap_or(u32::MAX),
            hvx_contexts: 1,
            // No HMX is driven: the tile engine is HVX float on v68+ skels
            // (DeviceTiles), the software model elsewhere.
            hmx: false,
            fp16: true,
            q8_0: true,
            max_tokens: MAX_TOKENS,
            max_dim: kernels::plan::MAX_DIM as u32,
            max_projections: MAX_PROJECTIONS as u32,
        }
    }

    fn load(&mut self, lw: &LoadWeights) -> Result<ProjectionId, ServiceError> {
        if self.resident.iter().any(|r| r.id == lw.projection) || self.resident.is_full() {
            return Err(ServiceError::ProjectionSlot(lw.projection));
        }
        let mapping = self.mapping.as_ref().ok_or(BufferError::Unregistered { buffer: lw.weights.buffer })?;
        let range = lw.validate(&[mapping.registered()])?;
        let bytes = mapping.read(&lw.weights)?;
        let checked = check_weight(lw.precision, lw.shape, bytes).map_err(kernel_error)?;
        let resident = Resident {
            id: lw.projection,
            shape: lw.shape,
            precision: lw.precision,
            offset: range.start,
            len: range.len(),
            max_abs: checked.max_abs(),
        };
        // Checked not full above.
        let _ = self.resident.push(resident);
        Ok(lw.projection)
    }

    fn unload(&mut self, id: ProjectionId) -> Result<ProjectionId, ServiceError> {
        let i = self.resident.iter().position(|r| r.id == id).ok_or(ServiceError::UnknownProjection(id))?;
        self.resident.swap_remove(i);
        Ok(id)
    }

    fn project(&mut self, op: &ProjectionOp, buffers: &mut SharedBuffers<'_>) -> Result<OpResult, ServiceError> {
        let resident = self
            .resident
            .iter()
            .find(|r| r.id == op.projection)
            .ok_or(ServiceError::UnknownProjection(op.projection))?;
        if op.tokens > MAX_TOKENS {
            return Err(ServiceError::InvalidParams);
        }
        op.validate(resident.shape, buffers.registered())?;
        let (input, output) = buffers.input_output(&op.input, &op.output)?;
        let input: &[f32] =
            bytemuck::try_cast_slice(input).map_err(|_| BufferError::Misaligned { buffer: op.input.buffer, offset: op.input.offset })?;
        let output: &mut [f32] = bytemuck::try_cast_slice_mut(output)
            .map_err(|_| BufferError::Misaligned { buffer: op.output.buffer, offset: op.output.offset })?;
        // Resident weights exist only once a mapping does.
        let mapping = self.mapping.ok_or(ServiceError::UnknownProjection(op.projection))?;
        let w = resident_weight(&mapping, resident)?;
        let start = cycles();
        let mut dma = SoftwareDma::new();
        let mut eng = Engines { dma: &mut dma, tiles: &mut self.tiles, vtcm: &mut self.vtcm };
        let stats = kernels::project(&mut eng, &w, op.direction, op.tokens as usize, input, output).map_err(kernel_error)?;
        Ok(op_result(op.seq, &stats, cycles().wrapping_sub(start)))
    }
}

/// The view of a resident weight in the mapping, without re-reading it.
fn resident_weight<'a>(mapping: &'a Mapping, r: &Resident) -> Result<ResidentWeight<'a>, ServiceError> {
    let weights = BufferRef { buffer: WEIGHTS_BUFFER, offset: r.offset as u64, len: r.len as u64 };
    let bytes = mapping.read(&weights)?;
    let data = match r.precision {
        Precision::Fp16 => WeightData::Fp16(fp16_view(bytes).map_err(kernel_error)?),
        Precision::Q8_0 => WeightData::Q8_0(bytes),
    };
    let (rows, cols) = (r.shape.rows as usize, r.shape.cols as usize);
    ResidentWeight::checked_earlier(data, rows, cols, r.max_abs).map_err(kernel_error)
}

/// The Hexagon user cycle counter (`UPCYCLE`); 0 on other targets. Note
/// that qemu-hexagon does not count cycles: it reads 0 there too, so
/// only a device fills `Timing::total_cycles`.
fn cycles() -> u64 {
    #[cfg(target_arch = "hexagon")]
    {
        let (lo, hi): (u32, u32);
        // SAFETY: reads a user-readable control register pair.
        unsafe { core::arch::asm!("r1:0 = upcycle", out("r0") lo, out("r1") hi, options(nomem, nostack)) };
        (hi as u64) << 32 | lo as u64
    }
    #[cfg(not(target_arch = "hexagon"))]
    {
        0
    }
}

fn op_result(seq: u32, stats: &RunStats, total_cycles: u64) -> OpResult {
    let status = match stats.rows_failed {
        0 => Status::Ok,
        rows => Status::RowsFailed { rows },
    };
    // Only the total is measured; the DMA/compute split would need the real
    // engines' completion times, so those stay zero rather than invented.
    let timing = Timing { total_cycles, ..Timing::default() };
    OpResult { seq, status, rows_retried: stats.rows_retried, timing }
}

/// The protocol error for a kernel error.
pub fn kernel_error(e: KernelError) -> ServiceError {
    match e {
        KernelError::NoSupport(_) => ServiceError::NoSupport,
        KernelError::VtcmTooSmall { needed, available } => ServiceError::VtcmTooSmall {
            needed: u32::try_from(needed).unwrap_or(u32::MAX),
            available: u32::try_from(available).unwrap_or(u32::MAX),
        },
        KernelError::NonFiniteInput { .. } | KernelError::Shape(_) | KernelError::BadWeights(_) => {
            ServiceError::InvalidParams
        }
        KernelError::OutOfMemory(bytes) => ServiceError::OutOfMemory { bytes: u32::try_from(bytes).unwrap_or(u32::MAX) },
    }
}

impl crate::skel::Service for ProjectionService {
    fn open(_uri: &[u8]) -> Result<Self, i32> {
        let vtcm = VtcmRegion::for_session(limits::SESSION_VTCM_BYTES).ok_or(crate::skel::abi::AEE_ENOMEMORY)?;
        Ok(ProjectionService::new(vtcm))
    }

    fn map(&mut self, weights: Mapping) -> Result<(), i32> {
        self.map_weights(weights).map_err(|_| crate::skel::abi::AEE_EBADPARM)
    }

    fn mapping(&self) -> Option<&Mapping> {
        self.mapping.as_ref()
    }

    fn handle(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response {
        self.serve(request, buffers)
    }
}

/// The Hexagon generation this firmware was built for (0 natively).
fn build_arch() -> u16 {
    if cfg!(feature = "v79") {
        79
    } else if cfg!(feature = "v75") {
        75
    } else if cfg!(feature = "v73") {
        73
    } else if cfg!(feature = "v68") {
        68
    } else if cfg!(feature = "sim") {
        73
    } else {
        0
    }
}

pub mod mailbox;
pub mod selftests;

/// Compile-time proof of the `Send` claim above.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<ProjectionService>();
};

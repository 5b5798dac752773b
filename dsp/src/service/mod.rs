//! The projection service: the [`crate::skel::Service`] that owns the
//! resident weights and runs one op per request.
//!
//! One request at a time: request (decoded by the skel) -> validate -> run
//! -> [`Response`]. Every failure is an error response, never a panic:
//!
//! | request | checks | answer |
//! |---|---|---|
//! | `Capabilities` | | [`Capabilities`] of this build |
//! | `LoadWeights` | reference in bounds, exact length, table slot, FP16 finite / Q8_0 scales finite | `Done(id)` |
//! | `Unload` | id resident | `Done(id)` |
//! | `Project` | id resident, references in bounds/aligned/exact/disjoint, input finite, VTCM fits | `Op(OpResult)` |
//!
//! Resident weights are copied out of the shared buffer into firmware memory
//! at load time (on a device they would stay in the mapped rpcmem buffer);
//! the table is a `heapless::Vec` of at most [`MAX_PROJECTIONS`].
//!
//! Error mapping: NaN/inf input, an empty shape or a mismatched length is
//! `InvalidParams`; shapes the kernels do not take (dimension above
//! [`crate::kernels::plan::MAX_DIM`]) are `NoSupport`; a chunk that cannot
//! fit is `VtcmTooSmall`, so the host falls back to its CPU path. Rows that
//! overflow after three rescale retries come back as
//! `Status::RowsFailed` with NaN in their output rows.
use crate::dma::software::SoftwareDma;
use crate::kernels::{self, Engines, KernelError, ResidentWeight, RunStats};
use crate::skel::SharedBuffers;
use crate::tile::software::SoftwareTiles;
use crate::vtcm::{VtcmRegion, DEFAULT_VTCM_BYTES};
use alloc::vec::Vec;
use half::f16;
use hexlora_proto::protocol::{
    BufferError, Capabilities, LoadWeights, OpResult, Precision, ProjectionId, ProjectionOp, Request, Response,
    ServiceError, Status, Timing, WeightShape, PROTOCOL_VERSION,
};

/// Resident projections at most.
pub const MAX_PROJECTIONS: usize = 512;

/// VTCM a session reserves: the generation's 8 MiB, except in the simulator
/// build, whose whole firmware heap is 8 MiB (the VTCM stand-in comes from
/// the heap, see [`crate::vtcm`]).
pub const SESSION_VTCM_BYTES: usize = if cfg!(feature = "sim") { 2 << 20 } else { DEFAULT_VTCM_BYTES };

/// Largest `tokens` one op may carry (the kernels chunk internally; this
/// bounds the host's buffers, not VTCM).
pub const MAX_TOKENS: u32 = 1 << 16;

/// A weight the service keeps.
struct Resident {
    id: ProjectionId,
    shape: WeightShape,
    data: ResidentData,
}

enum ResidentData {
    Fp16(Vec<f16>),
    Q8_0(Vec<u8>),
}

impl Resident {
    fn weight(&self) -> Result<ResidentWeight<'_>, KernelError> {
        let (rows, cols) = (self.shape.rows as usize, self.shape.cols as usize);
        match &self.data {
            ResidentData::Fp16(w) => ResidentWeight::fp16(w, rows, cols),
            ResidentData::Q8_0(w) => ResidentWeight::q8_0(w, rows, cols),
        }
    }
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
    resident: heapless::Vec<Resident, MAX_PROJECTIONS>,
    vtcm: VtcmRegion,
    tiles: SoftwareTiles,
    arch: u16,
}

impl ProjectionService {
    /// A service with `vtcm_bytes` of VTCM; `None` if that memory cannot be
    /// reserved.
    pub fn new(vtcm_bytes: usize) -> Option<ProjectionService> {
        Some(ProjectionService {
            resident: heapless::Vec::new(),
            vtcm: VtcmRegion::new(vtcm_bytes)?,
            tiles: SoftwareTiles::new(),
            arch: build_arch(),
        })
    }

    /// Serves one decoded request against this call's shared buffers.
    pub fn serve(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response {
        let seq = match request {
            Request::Project(op) => Some(op.seq),
            _ => None,
        };
        let answer = match request {
            Request::Capabilities => Ok(Response::Capabilities(self.capabilities())),
            Request::LoadWeights(lw) => self.load(lw, buffers).map(Response::Done),
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
            // The tile engine is the software model: no HMX is driven.
            hmx: false,
            fp16: true,
            q8_0: true,
            max_tokens: MAX_TOKENS,
            max_dim: kernels::plan::MAX_DIM as u32,
            max_projections: MAX_PROJECTIONS as u32,
        }
    }

    fn load(&mut self, lw: &LoadWeights, buffers: &mut SharedBuffers<'_>) -> Result<ProjectionId, ServiceError> {
        if self.resident.iter().any(|r| r.id == lw.projection) || self.resident.is_full() {
            return Err(ServiceError::ProjectionSlot(lw.projection));
        }
        lw.validate(buffers.registered())?;
        let bytes = buffers.read(&lw.weights)?;
        let data = match lw.precision {
            Precision::Fp16 => {
                let mut w = alloc::vec![f16::ZERO; bytes.len() / 2];
                hexlora_proto::f16::decode_le(bytes, &mut w).ok_or(ServiceError::InvalidParams)?;
                ResidentData::Fp16(w)
            }
            Precision::Q8_0 => ResidentData::Q8_0(bytes.to_vec()),
        };
        let resident = Resident { id: lw.projection, shape: lw.shape, data };
        resident.weight().map_err(kernel_error)?;
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
        let w = resident.weight().map_err(kernel_error)?;
        let start = cycles();
        let mut dma = SoftwareDma::new();
        let mut eng = Engines { dma: &mut dma, tiles: &mut self.tiles, vtcm: &mut self.vtcm };
        let stats = kernels::project(&mut eng, &w, op.direction, op.tokens as usize, input, output).map_err(kernel_error)?;
        Ok(op_result(op.seq, &stats, cycles().wrapping_sub(start)))
    }
}

/// The Hexagon user cycle counter (`UPCYCLE`); 0 on other targets. Note
/// that qemu-hexagon 7.2 does not count cycles: it reads 0 there too, so
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
    }
}

impl crate::skel::Service for ProjectionService {
    fn open(_uri: &[u8]) -> Result<Self, i32> {
        ProjectionService::new(SESSION_VTCM_BYTES).ok_or(crate::skel::abi::AEE_ENOMEMORY)
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
        67
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

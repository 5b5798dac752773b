//! The NPU client: one session with the DSP service over a [`Transport`],
//! resident weights, one request in flight, and recovery from service
//! faults.
//!
//! Faults: a service that crashes (its process or thread ends) or hangs (no
//! response within [`NpuOptions::timeout`]) is restarted, every resident
//! weight is loaded again from the shared weights buffer (the host keeps
//! them there, as rpcmem buffers stay mapped on a device), and the request
//! is sent again. After [`NpuOptions::max_restarts`] restarts for one
//! request the client gives up with [`Error::NpuFailed`], and callers fall
//! back to the CPU. Requests are pure functions of the resident weight and
//! the input, so a retried request gives the same bits.
use super::policy::Precision;
use super::projection::NpuProjection;
use super::transport::in_process::InProcess;
use super::transport::shared_memory::SharedMemory;
use super::transport::simulator::{Simulator, SimulatorConfig, SERVICE_ENV};
use super::transport::{Fault, Layout, Transport, TransportKind, INPUT, OUTPUT, WEIGHTS};
use crate::base::dtype::{DType, RawTensor};
use crate::projection::{Direction, Projection, ProjectionInfo};
use crate::{Error, Result};
use hexlora_proto::protocol::{
    self as proto, BufferRef, Capabilities, LoadWeights, ProjectionOp, Request, Response, ServiceError, Status,
    WeightShape, INPUT_BUFFER, OUTPUT_BUFFER, PROTOCOL_VERSION, WEIGHTS_BUFFER,
};
use hexlora_proto::q8_0::{self, BlockQ8_0, QK8_0};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Settings of a client.
#[derive(Clone, Debug)]
pub struct NpuOptions {
    /// Capacity of the shared weights buffer (all resident weights).
    pub weight_bytes: usize,
    /// Capacity of each of the input and output buffers (one op's
    /// activations).
    pub activation_bytes: usize,
    /// How long one request may take before the service counts as hung.
    pub timeout: Duration,
    /// Restarts for one request before the client gives up.
    pub max_restarts: u32,
    /// Hexagon service ELF for the simulator; `None` reads
    /// `HEXLORA_SIM_SERVICE`.
    pub sim_service: Option<PathBuf>,
    /// The emulator.
    pub qemu: PathBuf,
    /// Directory of the simulator's shared file.
    pub shm_dir: PathBuf,
}

impl Default for NpuOptions {
    fn default() -> Self {
        NpuOptions {
            // Sparse: pages cost memory only once written.
            weight_bytes: 512 << 20,
            activation_bytes: 64 << 20,
            // The simulator runs the software tile engine under emulation:
            // a large op takes seconds there.
            timeout: Duration::from_secs(120),
            max_restarts: 3,
            sim_service: None,
            qemu: PathBuf::from("qemu-hexagon"),
            shm_dir: PathBuf::from("/dev/shm"),
        }
    }
}

/// Resident weight bytes per precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResidentBytes {
    /// Bytes of FP16 weights.
    pub f16: u64,
    /// Bytes of Q8_0 weights.
    pub q8_0: u64,
}

impl ResidentBytes {
    /// Both together.
    pub fn total(&self) -> u64 {
        self.f16 + self.q8_0
    }
}

/// Counters of a client's life so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NpuStats {
    /// Requests answered (loads and ops; retries count once).
    pub requests: u64,
    /// Service restarts after a crash or hang.
    pub restarts: u64,
    /// Time from posting requests to having their responses.
    pub in_flight: Duration,
    /// Token rows sent in ops (each op's `tokens`).
    pub rows_sent: u64,
    /// Rows the service re-ran with a smaller scale (from result messages).
    pub row_retries: u64,
    /// Rows that still overflowed and were recomputed on the CPU.
    pub rows_failed: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    restarts: AtomicU64,
    in_flight_ns: AtomicU64,
    rows_sent: AtomicU64,
    row_retries: AtomicU64,
    rows_failed: AtomicU64,
    f16_bytes: AtomicU64,
    q8_0_bytes: AtomicU64,
}

/// What the lock guards: the transport and the resident table.
struct Session {
    transport: Box<dyn Transport>,
    /// Replayed after a restart.
    resident: Vec<LoadWeights>,
    weights_used: usize,
    next_id: u32,
    seq: u32,
}

/// A connection to the DSP service. `Send + Sync`; requests from several
/// threads are serialised (one request in flight).
pub struct NpuClient {
    kind: TransportKind,
    options: NpuOptions,
    capabilities: Capabilities,
    session: Mutex<Session>,
    counters: Counters,
}

/// Weights start on 128-byte boundaries (an HVX vector), as rpcmem
/// allocations would.
const WEIGHT_ALIGN: usize = 128;

impl NpuClient {
    /// Starts (or reaches) the service over `kind` and checks its protocol
    /// version.
    pub fn connect(kind: TransportKind, options: &NpuOptions) -> Result<Arc<NpuClient>> {
        let layout = Layout::new(options.weight_bytes, options.activation_bytes);
        let transport: Box<dyn Transport> = match kind {
            TransportKind::InProcess => Box::new(InProcess::new(layout)?),
            TransportKind::SharedMemory => Box::new(SharedMemory::new(layout)?),
            TransportKind::Simulator => Box::new(Simulator::new(layout, simulator_config(options)?)?),
            TransportKind::FastRpc => fastrpc(layout)?,
        };
        let mut session = Session { transport, resident: Vec::new(), weights_used: 0, next_id: 1, seq: 0 };
        let counters = Counters::default();
        let capabilities = session.handshake()?;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(NpuClient { kind, options: options.clone(), capabilities, session: Mutex::new(session), counters }))
    }

    /// The transport in use.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// What the service reported at connect.
    pub fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// Makes `raw` (`[out, in]`) resident in `precision` and returns the
    /// projection served by the NPU. [`Error::NpuNoSupport`] when the
    /// service cannot hold this shape or precision (the caller keeps a CPU
    /// projection instead).
    pub fn load_weight(self: &Arc<Self>, info: ProjectionInfo, raw: &RawTensor<'_>, precision: Precision) -> Result<Arc<dyn Projection>> {
        Ok(self.load_npu_weight(info, raw, precision)?)
    }

    /// [`NpuClient::load_weight`], typed (the planner asks the projection
    /// for its effective weight).
    pub fn load_npu_weight(self: &Arc<Self>, info: ProjectionInfo, raw: &RawTensor<'_>, precision: Precision) -> Result<Arc<NpuProjection>> {
        if raw.shape != [info.out_features, info.in_features] {
            return Err(Error::Shape { what: raw.name.clone(), expected: vec![info.out_features, info.in_features], got: raw.shape.clone() });
        }
        let bytes = weight_bytes(raw, precision)?;
        let shape = WeightShape { rows: dim(info.out_features, &info.name)?, cols: dim(info.in_features, &info.name)? };
        let mut s = self.lock()?;
        let offset = s.weights_used.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN;
        s.transport.region().write(WEIGHTS, offset, &bytes)?;
        let id = s.next_id;
        let weights = BufferRef { buffer: WEIGHTS_BUFFER, offset: offset as u64, len: bytes.len() as u64 };
        let lw = LoadWeights { projection: id, precision, shape, weights };
        match self.exchange(&mut s, &Request::LoadWeights(lw), None)? {
            Response::Done(got) if got == id => {}
            other => return Err(response_error(&info.name, other)),
        }
        s.weights_used = offset + bytes.len();
        s.next_id += 1;
        s.resident.push(lw);
        let counter = match precision {
            Precision::Fp16 => &self.counters.f16_bytes,
            Precision::Q8_0 => &self.counters.q8_0_bytes,
        };
        counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(Arc::new(NpuProjection::new(Arc::clone(self), info, id, precision, weights)))
    }

    /// Resident weight bytes per precision.
    pub fn resident_bytes(&self) -> ResidentBytes {
        ResidentBytes { f16: self.counters.f16_bytes.load(Ordering::Relaxed), q8_0: self.counters.q8_0_bytes.load(Ordering::Relaxed) }
    }

    /// Rows re-run by the rescaling policy so far (summed from the result
    /// messages); callers report per-step differences.
    pub fn row_retries(&self) -> u64 {
        self.counters.row_retries.load(Ordering::Relaxed)
    }

    /// Token rows sent in ops so far.
    pub fn rows_sent(&self) -> u64 {
        self.counters.rows_sent.load(Ordering::Relaxed)
    }

    /// Counters so far.
    pub fn stats(&self) -> NpuStats {
        let c = &self.counters;
        NpuStats {
            requests: c.requests.load(Ordering::Relaxed),
            restarts: c.restarts.load(Ordering::Relaxed),
            in_flight: Duration::from_nanos(c.in_flight_ns.load(Ordering::Relaxed)),
            rows_sent: c.rows_sent.load(Ordering::Relaxed),
            row_retries: c.row_retries.load(Ordering::Relaxed),
            rows_failed: c.rows_failed.load(Ordering::Relaxed),
        }
    }

    /// The service's process id when it runs as a process (simulator).
    pub fn service_pid(&self) -> Option<u32> {
        self.lock().ok()?.transport.service_pid()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Session>> {
        self.session.lock().map_err(|_| Error::Npu("the client lock is poisoned (a request panicked)".into()))
    }

    /// One op: input into buffer 2, request, `side` while in flight,
    /// output from buffer 3. Returns the rows that overflowed (NaN in
    /// `out`).
    pub(crate) fn project(
        &self,
        p: &NpuProjection,
        dir: Direction,
        input: &[f32],
        tokens: usize,
        out: &mut [f32],
        side: Option<&mut dyn FnMut() -> Result<()>>,
    ) -> Result<u32> {
        let mut s = self.lock()?;
        let in_bytes: &[u8] = bytemuck::cast_slice(input);
        s.transport.region().write(INPUT, 0, in_bytes)?;
        let out_len = std::mem::size_of_val(out);
        let (_, out_cap) = s.transport.region().buffer(OUTPUT);
        if out_len > out_cap {
            return Err(Error::Npu(format!("{}: {out_len} output bytes exceed the {out_cap}-byte output buffer (raise NpuOptions::activation_bytes)", p.info().name)));
        }
        s.seq = s.seq.wrapping_add(1);
        let op = ProjectionOp {
            seq: s.seq,
            projection: p.id(),
            direction: match dir {
                Direction::Forward => proto::Direction::Forward,
                Direction::InputGrad => proto::Direction::InputGrad,
            },
            tokens: dim(tokens, &p.info().name)?,
            input: BufferRef { buffer: INPUT_BUFFER, offset: 0, len: in_bytes.len() as u64 },
            output: BufferRef { buffer: OUTPUT_BUFFER, offset: 0, len: out_len as u64 },
        };
        let result = match self.exchange(&mut s, &Request::Project(op), side)? {
            Response::Op(r) if r.seq == op.seq => r,
            other => return Err(response_error(&p.info().name, other)),
        };
        self.counters.rows_sent.fetch_add(tokens as u64, Ordering::Relaxed);
        self.counters.row_retries.fetch_add(result.rows_retried as u64, Ordering::Relaxed);
        bytemuck::cast_slice_mut(out).copy_from_slice(s.transport.region().read(OUTPUT, 0, out_len)?);
        let failed = check_answer(&p.info().name, &result, tokens, out)?;
        self.counters.rows_failed.fetch_add(failed as u64, Ordering::Relaxed);
        Ok(failed)
    }

    /// The resident bytes of a projection, as the service was given them.
    pub(crate) fn weight_bytes_of(&self, r: &BufferRef) -> Result<Vec<u8>> {
        let mut s = self.lock()?;
        Ok(s.transport.region().read(WEIGHTS, r.offset as usize, r.len as usize)?.to_vec())
    }

    /// Sends `request`, runs `side` once while it is in flight, returns the
    /// response; restarts the service on faults (see the module docs).
    fn exchange(&self, s: &mut Session, request: &Request, mut side: Option<&mut dyn FnMut() -> Result<()>>) -> Result<Response> {
        let mut buf = [0u8; proto::MAX_MESSAGE_BYTES];
        let bytes = proto::encode(request, &mut buf).map_err(|e| Error::Npu(format!("cannot encode {request:?}: {e:?}")))?;
        let mut side_result = Ok(());
        let mut restarts = 0;
        let outcome = loop {
            let started = Instant::now();
            let answer = s.transport.post(bytes).and_then(|()| {
                if let Some(f) = side.take() {
                    side_result = f();
                }
                s.transport.wait(self.options.timeout)
            });
            self.counters.in_flight_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let fault = match answer {
                Ok(bytes) => break proto::decode::<Response>(&bytes).map_err(|e| Error::Npu(format!("undecodable response to {request:?}: {e:?}"))),
                Err(fault) => fault,
            };
            match self.recover(s, &fault, &mut restarts) {
                Ok(()) => continue,
                Err(e) => break Err(e),
            }
        };
        // `side` runs exactly once, even when the service failed for good.
        if let Some(f) = side.take() {
            side_result = f();
        }
        let response = outcome?;
        side_result?;
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        Ok(response)
    }

    /// Restarts the service and reloads every resident weight; retries a
    /// failed restart until `max_restarts` is used up.
    fn recover(&self, s: &mut Session, fault: &Fault, restarts: &mut u32) -> Result<()> {
        let mut last = fault.to_string();
        loop {
            if *restarts >= self.options.max_restarts {
                return Err(Error::NpuFailed { restarts: *restarts, last });
            }
            *restarts += 1;
            self.counters.restarts.fetch_add(1, Ordering::Relaxed);
            eprintln!("npu ({}): {last}; restarting the service ({} of {})", self.kind, restarts, self.options.max_restarts);
            match s.restart() {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
    }
}

impl Session {
    /// Capabilities, checked.
    fn handshake(&mut self) -> Result<Capabilities> {
        match self.call_once(&Request::Capabilities)? {
            Response::Capabilities(c) if c.protocol_version == PROTOCOL_VERSION => Ok(c),
            Response::Capabilities(c) => Err(Error::Npu(format!(
                "the service speaks protocol version {}, this host {PROTOCOL_VERSION}",
                c.protocol_version
            ))),
            other => Err(response_error("capabilities", other)),
        }
    }

    /// Fresh service, handshake, every weight loaded again.
    fn restart(&mut self) -> Result<()> {
        self.transport.restart()?;
        self.handshake()?;
        for lw in self.resident.clone() {
            match self.call_once(&Request::LoadWeights(lw))? {
                Response::Done(id) if id == lw.projection => {}
                other => return Err(response_error(&format!("reloading projection {}", lw.projection), other)),
            }
        }
        Ok(())
    }

    /// One exchange without recovery (used while recovering).
    fn call_once(&mut self, request: &Request) -> Result<Response> {
        let mut buf = [0u8; proto::MAX_MESSAGE_BYTES];
        let bytes = proto::encode(request, &mut buf).map_err(|e| Error::Npu(format!("cannot encode {request:?}: {e:?}")))?;
        self.transport.post(bytes).map_err(|f| Error::Npu(f.to_string()))?;
        let answer = self.transport.wait(HANDSHAKE_TIMEOUT).map_err(|f| Error::Npu(f.to_string()))?;
        proto::decode(&answer).map_err(|e| Error::Npu(format!("undecodable response to {request:?}: {e:?}")))
    }
}

/// Capabilities and weight loads are quick even under emulation.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// The error for a response that is not the expected success.
fn response_error(what: &str, response: Response) -> Error {
    match response {
        Response::Error { error: e @ (ServiceError::NoSupport | ServiceError::VtcmTooSmall { .. }), .. } => {
            Error::NpuNoSupport(format!("{what}: {e:?}"))
        }
        Response::Error { error, .. } => Error::Npu(format!("{what}: the service answered {error:?}")),
        other => Error::Npu(format!("{what}: unexpected response {other:?}")),
    }
}

fn dim(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::NpuNoSupport(format!("{what}: dimension {n} exceeds the protocol's u32")))
}

/// The bytes of `raw` in `precision`. A checkpoint already in that format
/// is passed through unchanged (a GGUF Q8_0 weight is exactly what the NPU
/// multiplies); anything else goes through f32: FP16 by rounding, Q8_0 by
/// the ggml reference quantizer.
fn weight_bytes(raw: &RawTensor<'_>, precision: Precision) -> Result<Vec<u8>> {
    match (precision, raw.dtype) {
        (Precision::Fp16, DType::F16) | (Precision::Q8_0, DType::Q8_0) => Ok(raw.bytes.to_vec()),
        (Precision::Fp16, _) => {
            let w = raw.to_f32()?;
            if let Some(i) = w.iter().position(|v| !v.is_finite() || v.abs() > 65504.0) {
                return Err(Error::invalid(&raw.name, format!("weight {} = {} is not representable in f16; use q8_0 for it", i, w[i])));
            }
            Ok(w.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect())
        }
        (Precision::Q8_0, _) => {
            let cols = raw.shape.last().copied().unwrap_or(0);
            if cols == 0 || cols % QK8_0 != 0 {
                return Err(Error::NpuNoSupport(format!("{}: Q8_0 needs in_features divisible by 32, got {cols}", raw.name)));
            }
            let w = raw.to_f32()?;
            let mut blocks = vec![BlockQ8_0 { d: half::f16::ZERO, qs: [0; QK8_0] }; cols / QK8_0];
            let mut out = Vec::with_capacity(w.len() / QK8_0 * q8_0::BLOCK_BYTES);
            for row in w.chunks_exact(cols) {
                q8_0::quantize_row(row, &mut blocks).map_err(|e| Error::invalid(&raw.name, format!("cannot quantize to Q8_0: {e:?}")))?;
                out.extend(blocks.iter().flat_map(BlockQ8_0::to_bytes));
            }
            Ok(out)
        }
    }
}

fn simulator_config(options: &NpuOptions) -> Result<SimulatorConfig> {
    let service = match &options.sim_service {
        Some(p) => p.clone(),
        None => std::env::var_os(SERVICE_ENV).map(PathBuf::from).ok_or_else(|| {
            Error::Npu(format!("the simulator transport needs the Hexagon service ELF: set {SERVICE_ENV} (ci/sim-test.sh builds it)"))
        })?,
    };
    Ok(SimulatorConfig { service, qemu: options.qemu.clone(), shm_dir: options.shm_dir.clone() })
}

#[cfg(feature = "fastrpc")]
fn fastrpc(layout: Layout) -> Result<Box<dyn Transport>> {
    Ok(Box::new(super::transport::fastrpc::FastRpc::new(layout)?))
}

#[cfg(not(feature = "fastrpc"))]
fn fastrpc(_layout: Layout) -> Result<Box<dyn Transport>> {
    Err(Error::Unsupported("the FastRPC transport: this hexlora was built without the `fastrpc` feature".into()))
}

/// The host's check of a DSP answer: the service is trusted to compute, not
/// to be right about its own bookkeeping. Failed rows at most `tokens`,
/// retries at most [`MAX_RETRIES`] per row, and an `Ok` output finite
/// everywhere (failed rows are NaN by contract and recomputed by the
/// caller). Returns the failed rows.
fn check_answer(name: &str, result: &proto::OpResult, tokens: usize, out: &[f32]) -> Result<u32> {
    let failed = match result.status {
        Status::Ok => 0,
        Status::RowsFailed { rows } => rows,
    };
    let max_retries = tokens as u64 * hexlora_proto::rescale::MAX_RETRIES as u64;
    if failed as usize > tokens || result.rows_retried as u64 > max_retries {
        return Err(Error::Npu(format!(
            "{name}: the DSP reported {failed} failed rows and {} retries for a {tokens}-row op",
            result.rows_retried
        )));
    }
    if failed == 0 {
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            let width = out.len() / tokens.max(1);
            return Err(Error::Npu(format!("{name}: the DSP answered Ok with a non-finite output (row {}, column {})", i / width.max(1), i % width.max(1))));
        }
    }
    Ok(failed)
}

#[cfg(test)]
mod answer_tests {
    use super::*;

    fn result(status: Status, rows_retried: u32) -> proto::OpResult {
        proto::OpResult { seq: 1, status, rows_retried, timing: proto::Timing::default() }
    }

    #[test]
    fn implausible_answers_are_errors() {
        let out = [1.0f32, 2.0, 3.0, 4.0];
        assert!(check_answer("q", &result(Status::Ok, 0), 2, &out).is_ok());
        let err = check_answer("q", &result(Status::Ok, 0), 2, &[1.0, 2.0, f32::NAN, 4.0]).unwrap_err().to_string();
        assert!(err.contains("q: the DSP answered Ok with a non-finite output (row 1, column 0)"), "{err}");
        assert!(check_answer("q", &result(Status::RowsFailed { rows: 1 }, 3), 2, &[f32::NAN, f32::NAN, 3.0, 4.0]).is_ok());
        assert!(check_answer("q", &result(Status::RowsFailed { rows: 3 }, 0), 2, &out).is_err());
        assert!(check_answer("q", &result(Status::Ok, 7), 2, &out).is_err());
    }
}

//! How protocol messages and shared buffers reach the DSP service.
//!
//! Every transport carries the same postcard [`Request`]/[`Response`] bytes
//! and the same three shared buffers, so a service sees identical inputs
//! whichever road they took:
//!
//! | id | buffer | DSP access | holds |
//! |---|---|---|---|
//! | 1 | weights | read-only | every resident weight, packed (host keeps them: reload after a restart) |
//! | 2 | input | read-only | `X` or `dY` of the op in flight, f32 |
//! | 3 | output | writable | `Y` or `dX`, f32 |
//!
//! They live in one [`Region`] (a memmap2 mapping) laid out by [`Layout`];
//! the first [`HEADER_BYTES`] hold the mailbox of the queue transports.
//!
//! - [`in_process`]: the firmware crate built natively, called through the
//!   FastRPC skel dispatch (`hexlora_dsp::skel::invoke`), synchronously;
//! - [`shared_memory`]: the service on its own thread, the mailbox
//!   (dspqueue-like) in an anonymous shared mapping;
//! - [`simulator`]: the firmware built for Hexagon under `qemu-hexagon` as a
//!   child process, the mailbox in a `/dev/shm` file both map;
//! - `fastrpc` (feature `fastrpc`): `libcdsprpc.so` loaded at run time.
//!
//! The first and the last call the skel synchronously, one request per
//! invoke, through [`synchronous`]; the other two share the mailbox host
//! side in [`queue`].
//!
//! [`Request`]: hexlora_proto::protocol::Request
//! [`Response`]: hexlora_proto::protocol::Response
pub mod in_process;
pub mod queue;
pub mod shared_memory;
pub mod simulator;
pub mod synchronous;

#[cfg(feature = "fastrpc")]
pub mod fastrpc;

use crate::{Error, Result};
pub use hexlora_dsp::service::mailbox::HEADER_BYTES;
use memmap2::MmapMut;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Which road requests take to the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// The firmware crate linked into this process, through the skel.
    InProcess,
    /// The firmware on a thread of its own, mailbox in shared memory.
    SharedMemory,
    /// The Hexagon firmware under qemu-hexagon, mailbox in `/dev/shm`.
    Simulator,
    /// A real DSP through `libcdsprpc.so` (feature `fastrpc`).
    FastRpc,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::InProcess => "in-process",
            TransportKind::SharedMemory => "shared-memory",
            TransportKind::Simulator => "simulator",
            TransportKind::FastRpc => "fastrpc",
        })
    }
}

impl FromStr for TransportKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "in-process" | "inprocess" | "native" => Ok(TransportKind::InProcess),
            "shared-memory" | "shm" => Ok(TransportKind::SharedMemory),
            "simulator" | "sim" | "qemu" => Ok(TransportKind::Simulator),
            "fastrpc" => Ok(TransportKind::FastRpc),
            other => Err(Error::invalid(
                "transport",
                format!("'{other}' (expected in-process, shared-memory, simulator or fastrpc)"),
            )),
        }
    }
}

/// Why an exchange with the service did not produce a response. The client
/// answers each by restarting the service and retrying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The service process or thread is gone.
    Crashed(String),
    /// No response within the timeout (a hung service).
    TimedOut(Duration),
    /// The transport itself failed (a FastRPC error code, a refused header).
    Transport(String),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crashed(why) => write!(f, "service crashed: {why}"),
            Fault::TimedOut(t) => write!(f, "no response within {t:?} (service hung)"),
            Fault::Transport(why) => write!(f, "transport failed: {why}"),
        }
    }
}

/// One road to a service. One request in flight: `post`, then `wait`.
pub trait Transport: Send {
    /// Which road this is.
    fn kind(&self) -> TransportKind;
    /// The shared buffers.
    fn region(&mut self) -> &mut Region;
    /// Starts serving `request` (postcard bytes); the answer comes from
    /// [`Transport::wait`]. May run the request to completion (in-process).
    fn post(&mut self, request: &[u8]) -> std::result::Result<(), Fault>;
    /// The response bytes of the posted request.
    fn wait(&mut self, timeout: Duration) -> std::result::Result<Vec<u8>, Fault>;
    /// Drops the service (killing it if needed) and starts a fresh one with
    /// nothing resident. The region, and the weights in it, survive.
    fn restart(&mut self) -> Result<()>;
    /// The service's process id, when it is a process of its own (tests
    /// kill it to check recovery).
    fn service_pid(&self) -> Option<u32> {
        None
    }
}

/// Where the three buffers sit inside the region (byte offsets from its
/// start; all page-aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Buffer 1.
    pub weights: (usize, usize),
    /// Buffer 2.
    pub input: (usize, usize),
    /// Buffer 3.
    pub output: (usize, usize),
    /// Bytes of the whole region.
    pub total: usize,
}

const PAGE: usize = 4096;

impl Layout {
    /// Header, then `weight_bytes` of weights, then input and output of
    /// `activation_bytes` each (rounded up to pages).
    pub fn new(weight_bytes: usize, activation_bytes: usize) -> Layout {
        let w = weight_bytes.div_ceil(PAGE).max(1) * PAGE;
        let a = activation_bytes.div_ceil(PAGE).max(1) * PAGE;
        let weights = (HEADER_BYTES, w);
        let input = (weights.0 + w, a);
        let output = (input.0 + a, a);
        Layout { weights, input, output, total: output.0 + a }
    }

    /// The mailbox's buffer table; `None` if the region is beyond 4 GiB
    /// (the 32-bit DSP cannot address it).
    pub fn table(&self) -> Option<[(u32, u32); 3]> {
        u32::try_from(self.total).ok()?;
        let t = |(o, n): (usize, usize)| (o as u32, n as u32);
        Some([t(self.weights), t(self.input), t(self.output)])
    }
}

/// A mapping both sides see. The host touches it only through these
/// methods, and only while no request is in flight (the client's lock),
/// so it never aliases what the service reads or writes.
pub struct Region {
    base: *mut u8,
    layout: Layout,
    _backing: Backing,
}

/// What owns the region's memory; held only so that dropping the region
/// releases it.
#[allow(dead_code)]
enum Backing {
    /// A memmap2 mapping (anonymous or of a file).
    Map(MmapMut),
    /// Memory from elsewhere (rpcmem), released by the closure.
    External(ExternalFree),
}

/// Releases external memory once.
struct ExternalFree(Option<Box<dyn FnOnce() + Send>>);

impl Drop for ExternalFree {
    fn drop(&mut self) {
        if let Some(free) = self.0.take() {
            free();
        }
    }
}

// SAFETY: the memory is owned by the region (mapping or external block);
// concurrent access by the service is ordered by the transport's
// request/response handshake.
unsafe impl Send for Region {}

impl Region {
    /// An anonymous mapping (in-process and shared-memory transports).
    pub fn anonymous(layout: Layout) -> Result<Region> {
        let map = MmapMut::map_anon(layout.total).map_err(|e| Error::Npu(format!("cannot map {} bytes of shared memory: {e}", layout.total)))?;
        Ok(Region::over_map(map, layout))
    }

    /// A mapping of `file`, resized to the layout (simulator transport).
    pub fn file(file: &std::fs::File, path: &std::path::Path, layout: Layout) -> Result<Region> {
        file.set_len(layout.total as u64).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is ours (created by the transport); only the
        // service child maps it besides us, under the mailbox protocol.
        let map = unsafe { MmapMut::map_mut(file) }.map_err(|e| Error::io(path, e))?;
        Ok(Region::over_map(map, layout))
    }

    fn over_map(mut map: MmapMut, layout: Layout) -> Region {
        Region { base: map.as_mut_ptr(), layout, _backing: Backing::Map(map) }
    }

    /// A region over memory allocated elsewhere (rpcmem on a device);
    /// `free` releases it when the region is dropped.
    ///
    /// # Safety
    /// `base` must point to `layout.total` bytes, readable and writable,
    /// aligned to a page, valid until `free` runs, and used by nothing but
    /// the service besides this region.
    pub unsafe fn external(base: *mut u8, layout: Layout, free: Box<dyn FnOnce() + Send>) -> Region {
        Region { base, layout, _backing: Backing::External(ExternalFree(Some(free))) }
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Start of the mapping, for the service side.
    pub fn base(&mut self) -> *mut u8 {
        self.base
    }

    /// Copies `bytes` into buffer `buf` (0 weights, 1 input, 2 output) at
    /// `offset`; errors if it does not fit.
    pub fn write(&mut self, buf: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        let (start, len) = self.buffer(buf);
        if offset.checked_add(bytes.len()).is_none_or(|end| end > len) {
            return Err(Error::Npu(format!(
                "{} bytes at offset {offset} do not fit the {len}-byte {} buffer (raise the NPU buffer sizes in NpuOptions)",
                bytes.len(),
                BUFFER_NAMES[buf]
            )));
        }
        // Raw copies, never a slice over the whole mapping: the service may
        // be polling the header meanwhile.
        // SAFETY: the range lies inside the mapping (checked above) and the
        // service does not touch buffers between requests.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(start + offset), bytes.len()) };
        Ok(())
    }

    /// `len` bytes of buffer `buf` at `offset`.
    pub fn read(&self, buf: usize, offset: usize, len: usize) -> Result<&[u8]> {
        let (start, cap) = self.buffer(buf);
        if offset.checked_add(len).is_none_or(|end| end > cap) {
            return Err(Error::Npu(format!("read of {len} bytes at {offset} past the {} buffer", BUFFER_NAMES[buf])));
        }
        // SAFETY: as in write(); the slice covers only this buffer range.
        Ok(unsafe { std::slice::from_raw_parts(self.base.add(start + offset), len) })
    }

    /// `(start, len)` of buffer `buf` (0 weights, 1 input, 2 output).
    pub fn buffer(&self, buf: usize) -> (usize, usize) {
        [self.layout.weights, self.layout.input, self.layout.output][buf]
    }
}

/// Buffer indices into [`Region`] (protocol id minus one).
pub const WEIGHTS: usize = 0;
/// The op's input.
pub const INPUT: usize = 1;
/// The op's output.
pub const OUTPUT: usize = 2;
const BUFFER_NAMES: [&str; 3] = ["weights", "input", "output"];

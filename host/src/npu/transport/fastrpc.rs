//! A real DSP through FastRPC (feature `fastrpc`, on by default). No
//! Snapdragon device has run it. The tests run it end to end against
//! `dsp/fastrpc-standin` (`HEXLORA_FASTRPC_LIB`), a native stand-in for
//! `libcdsprpc.so` that serves the skel in-process; see that crate for
//! what only a phone can check.
//!
//! As llama.cpp's Hexagon backend does, `libcdsprpc.so` is loaded at run
//! time (libloading) rather than linked, so a host binary built with the
//! feature still starts on machines without it (and says so). The shared
//! buffers are one rpcmem allocation (zero-copy on a device), laid out like
//! every other transport's region. At session open the allocation is mapped
//! into the DSP once (`fastrpc_mmap(.., FASTRPC_MAP_FD)`) and the skel's
//! method 3 `map` tells the session where its weights lie in it; each
//! request is then one synchronous `remote_handle64_invoke` of method 2 with
//! the `remote_arg` layout the in-process transport builds too (in:
//! request, input; out: response, output; [`super::synchronous`]): weights
//! never travel again. The skel library (`ci/build-skel.sh`) must be
//! on the DSP's library path (`ADSP_LIBRARY_PATH`); the Hexagon SDK
//! (HEXAGON_SDK_ROOT) is needed to sign it, not to build this transport.
use super::synchronous::{Skel, Synchronous};
use super::{Fault, Layout, Region, TransportKind};
use crate::{Error, Result};
use hexlora_dsp::skel::{abi::AEE_SUCCESS, RemoteArg, Scalars};
use std::ffi::{c_char, c_int, c_void, CString};

/// The FastRPC library on a device.
const LIBRARY_DEFAULT: &str = "libcdsprpc.so";
/// Names another FastRPC library: the tests' stand-in
/// (`ci/fastrpc-standin.sh` builds it).
pub const LIBRARY_ENV: &str = "HEXLORA_FASTRPC_LIB";

/// The skel's URI on the compute DSP.
const URI: &str = "file:///libhexlora_skel.so?hexlora_skel_handle_invoke&_modver=1.0&_dom=cdsp";
/// `RPCMEM_HEAP_ID_SYSTEM`.
const RPCMEM_HEAP_ID_SYSTEM: c_int = 25;
/// `RPCMEM_DEFAULT_FLAGS`.
const RPCMEM_DEFAULT_FLAGS: u32 = 1;
/// `CDSP_DOMAIN_ID` (remote.h).
const CDSP_DOMAIN_ID: c_int = 3;
/// `FASTRPC_MAP_FD` of `enum fastrpc_map_flags` (remote.h): a persistent
/// mapping the DSP finds with `HAP_mmap_get(fd)`.
const FASTRPC_MAP_FD: c_int = 2;

type RpcmemAlloc = unsafe extern "C" fn(heapid: c_int, flags: u32, size: c_int) -> *mut c_void;
type RpcmemFree = unsafe extern "C" fn(po: *mut c_void);
type RpcmemToFd = unsafe extern "C" fn(po: *mut c_void) -> c_int;
type FastrpcMmap = unsafe extern "C" fn(domain: c_int, fd: c_int, addr: *mut c_void, offset: c_int, length: usize, flags: c_int) -> c_int;
type FastrpcMunmap = unsafe extern "C" fn(domain: c_int, fd: c_int, addr: *mut c_void, length: usize) -> c_int;
type HandleOpen = unsafe extern "C" fn(name: *const c_char, handle: *mut u64) -> c_int;
type HandleInvoke = unsafe extern "C" fn(handle: u64, scalars: u32, args: *mut RemoteArg) -> c_int;
type HandleClose = unsafe extern "C" fn(handle: u64) -> c_int;

/// The FastRPC transport.
pub type FastRpc = Synchronous<Api>;

/// The entry points used, resolved once, and the library they live in.
pub struct Api {
    open: HandleOpen,
    invoke: HandleInvoke,
    close: HandleClose,
    munmap: FastrpcMunmap,
    _lib: std::sync::Arc<libloading::Library>,
}

fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    // SAFETY: each type alias above is the C prototype of `name` in the
    // Hexagon SDK's remote.h / rpcmem.h.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| Error::Npu(format!("libcdsprpc.so has no {name}: {e}")))
}

impl FastRpc {
    /// Loads libcdsprpc.so, allocates the region in rpcmem, maps it into
    /// the DSP and opens the skel.
    pub fn new(layout: Layout) -> Result<FastRpc> {
        let lib = std::env::var_os(LIBRARY_ENV).unwrap_or_else(|| LIBRARY_DEFAULT.into());
        FastRpc::with_library(layout, std::path::Path::new(&lib))
    }

    /// [`FastRpc::new`] over the FastRPC library at `path` (the device's
    /// `libcdsprpc.so`, or the in-tree stand-in the tests build).
    pub fn with_library(layout: Layout, path: &std::path::Path) -> Result<FastRpc> {
        // SAFETY: loading runs the library's initialisers, as linking would.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| Error::Npu(format!("cannot load {} (no FastRPC on this machine?): {e}", path.display())))?;
        let lib = std::sync::Arc::new(lib);
        let alloc: RpcmemAlloc = symbol(&lib, "rpcmem_alloc")?;
        let free: RpcmemFree = symbol(&lib, "rpcmem_free")?;
        let to_fd: RpcmemToFd = symbol(&lib, "rpcmem_to_fd")?;
        let mmap: FastrpcMmap = symbol(&lib, "fastrpc_mmap")?;
        let api = Api {
            open: symbol(&lib, "remote_handle64_open")?,
            invoke: symbol(&lib, "remote_handle64_invoke")?,
            close: symbol(&lib, "remote_handle64_close")?,
            munmap: symbol(&lib, "fastrpc_munmap")?,
            _lib: std::sync::Arc::clone(&lib),
        };
        let size = c_int::try_from(layout.total).map_err(|_| Error::Npu(format!("rpcmem cannot allocate {} bytes", layout.total)))?;
        // SAFETY: rpcmem_alloc returns null or `size` bytes of shared memory.
        let base = unsafe { alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, size) };
        if base.is_null() {
            return Err(Error::Npu(format!("rpcmem_alloc of {} bytes failed", layout.total)));
        }
        let keep = lib;
        let base_addr = base as usize;
        let release = Box::new(move || {
            // SAFETY: allocated above by rpcmem_alloc; `keep` holds the library.
            unsafe { free(base_addr as *mut c_void) };
            drop(keep);
        });
        // SAFETY: rpcmem memory is page-aligned, `size` bytes, ours alone.
        let region = unsafe { Region::external(base.cast(), layout, release) };
        // SAFETY: base came from rpcmem_alloc.
        let fd = unsafe { to_fd(base) };
        // SAFETY: maps the whole allocation, which outlives the mapping
        // (Drop unmaps before the region is freed).
        let code = unsafe { mmap(CDSP_DOMAIN_ID, fd, base, 0, layout.total, FASTRPC_MAP_FD) };
        if fd < 0 || code != AEE_SUCCESS {
            return Err(Error::Npu(format!("fastrpc_mmap of the {}-byte region (fd {fd}) failed with {code:#x}", layout.total)));
        }
        Synchronous::open_over(api, region, fd)
    }
}

impl Skel for Api {
    const KIND: TransportKind = TransportKind::FastRpc;

    fn open(&mut self) -> Result<u64> {
        let uri = CString::new(URI).map_err(|_| Error::Npu("URI holds a NUL".into()))?;
        let mut handle = 0u64;
        // SAFETY: uri is NUL-terminated, handle writable.
        let code = unsafe { (self.open)(uri.as_ptr(), &mut handle) };
        if code != AEE_SUCCESS {
            return Err(Error::Npu(format!("remote_handle64_open({URI}) failed with {code:#x}")));
        }
        Ok(handle)
    }

    unsafe fn invoke(&mut self, handle: u64, sc: Scalars, args: &mut [RemoteArg]) -> c_int {
        // SAFETY: the caller's contract.
        unsafe { (self.invoke)(handle, sc.0, args.as_mut_ptr()) }
    }

    fn close(&mut self, handle: u64) {
        // SAFETY: closes a handle opened by open().
        unsafe { (self.close)(handle) };
    }

    /// Unmaps the region from the DSP before rpcmem frees it.
    fn unmap(&mut self, fd: c_int, region: &mut Region) {
        let total = region.layout().total;
        // SAFETY: the mapping came from with_library(), over the region,
        // which is freed only after this (field order of Synchronous).
        unsafe { (self.munmap)(CDSP_DOMAIN_ID, fd, region.base().cast(), total) };
    }

    fn map_failed(code: c_int) -> Error {
        Error::Npu(format!("the skel's map of the weights failed with {code:#x}"))
    }

    /// A dead DSP process domain shows up here (AEE_ENOSUCH and friends);
    /// the client restarts the session.
    fn call_failed(code: c_int) -> Fault {
        Fault::Crashed(format!("remote_handle64_invoke failed with {code:#x}"))
    }
}

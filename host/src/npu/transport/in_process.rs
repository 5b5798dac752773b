//! The firmware crate built natively, reached through its FastRPC skel
//! dispatch (`hexlora_dsp::skel::invoke`) exactly as the FastRPC framework
//! calls `hexlora_skel_handle_invoke` on a device: the request and response
//! as buffers, the shared buffers as further `remote_arg`s.
//!
//! A FastRPC call is synchronous, and so is this transport: `post` runs the
//! request to completion, `wait` hands back its response. Overlap needs the
//! [`super::shared_memory`] transport.
//!
//! The weights buffer is mapped once per session, as on a device: the
//! region is entered in the skel's fd table (what `fastrpc_mmap` does) and
//! method 3 `map` hands it to the session; calls then carry only the input
//! and the output ([`super::synchronous`]).
use super::synchronous::{arg, Skel, Synchronous};
use super::{Fault, Layout, Region, TransportKind};
use crate::{Error, Result};
use hexlora_dsp::service::ProjectionService;
use hexlora_dsp::skel::{self, abi::AEE_SUCCESS, RemoteArg, Scalars, Sessions};
use spinning_top::Spinlock;

/// The in-process transport.
pub type InProcess = Synchronous<NativeSkel>;

/// The skel's session table in this process.
pub struct NativeSkel {
    sessions: Spinlock<Sessions<ProjectionService, 1>>,
}

/// A process-unique stand-in for an rpcmem fd.
fn next_fd() -> i32 {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1 << 20);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl InProcess {
    /// Maps the region and opens a session.
    pub fn new(layout: Layout) -> Result<InProcess> {
        let mut region = Region::anonymous(layout)?;
        let fd = next_fd();
        // SAFETY: the region lives as long as the transport, whose Drop
        // unregisters the fd after closing the session.
        if !unsafe { skel::mmap::register(fd, region.base(), layout.total) } {
            return Err(Error::Npu("the skel's mapping table is full".into()));
        }
        Synchronous::open_over(NativeSkel { sessions: Spinlock::new(Sessions::new()) }, region, fd)
    }
}

impl Skel for NativeSkel {
    const KIND: TransportKind = TransportKind::InProcess;

    /// Method 0 `open`: in-buf the URI, out-buf the 8-byte handle.
    fn open(&mut self) -> Result<u64> {
        let mut uri = *b"in-process";
        let mut handle = [0u8; 8];
        let mut args = [arg(&mut uri), arg(&mut handle)];
        let sc = Scalars::make(skel::METHOD_OPEN, 1, 1);
        // SAFETY: args holds the 2 buffers sc describes, alive for the call.
        let code = unsafe { skel::invoke(&self.sessions, 0, sc.0, args.as_mut_ptr()) };
        if code != AEE_SUCCESS {
            return Err(Error::Npu(format!("in-process skel open failed with AEE code {code}")));
        }
        Ok(u64::from_le_bytes(handle))
    }

    unsafe fn invoke(&mut self, handle: u64, sc: Scalars, args: &mut [RemoteArg]) -> i32 {
        // SAFETY: the caller's contract.
        unsafe { skel::invoke(&self.sessions, handle, sc.0, args.as_mut_ptr()) }
    }

    fn close(&mut self, handle: u64) {
        skel::close_session(&self.sessions, handle);
    }

    fn unmap(&mut self, fd: i32, _region: &mut Region) {
        skel::mmap::unregister(fd);
    }

    fn map_failed(code: i32) -> Error {
        Error::Npu(format!("in-process skel map of the weights failed with AEE code {code}"))
    }

    fn call_failed(code: i32) -> Fault {
        Fault::Transport(format!("skel call returned AEE code {code}"))
    }
}

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
//! and the output.
use super::{Fault, Layout, Region, Transport, TransportKind, INPUT, OUTPUT, WEIGHTS};
use crate::{Error, Result};
use hexlora_dsp::service::ProjectionService;
use hexlora_dsp::skel::{self, abi::AEE_SUCCESS, RemoteArg, RemoteBuf, Scalars, Sessions, RESPONSE_BUF_BYTES};
use spinning_top::Spinlock;
use std::time::Duration;

/// The in-process transport.
pub struct InProcess {
    sessions: Spinlock<Sessions<ProjectionService, 1>>,
    handle: u64,
    region: Region,
    /// The weights buffer's key in the skel's fd table.
    fd: i32,
    response: Option<Vec<u8>>,
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
        let mut t = InProcess { sessions: Spinlock::new(Sessions::new()), handle: 0, region, fd, response: None };
        t.handle = t.open()?;
        Ok(t)
    }

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
        let handle = u64::from_le_bytes(handle);
        let (offset, len) = self.region.buffer(WEIGHTS);
        let mut map = skel::map_arg(self.fd, offset, len);
        let mut args = [arg(&mut map)];
        // SAFETY: one in-buffer, as method 3 takes.
        let code = unsafe { skel::invoke(&self.sessions, handle, Scalars::make(skel::METHOD_MAP, 1, 0).0, args.as_mut_ptr()) };
        if code != AEE_SUCCESS {
            skel::close_session(&self.sessions, handle);
            return Err(Error::Npu(format!("in-process skel map of the weights failed with AEE code {code}")));
        }
        Ok(handle)
    }

    /// Method 2 `call`: in-bufs request, input; out-bufs response, output
    /// (protocol ids 2 and 3).
    fn call(&mut self, request: &[u8]) -> std::result::Result<Vec<u8>, Fault> {
        let mut req = request.to_vec();
        let mut resp = [0u8; RESPONSE_BUF_BYTES];
        let base = self.region.base();
        let remote = |(off, len): (usize, usize)| RemoteArg {
            // SAFETY (of the add): off lies inside the mapping (Layout).
            buf: RemoteBuf { pv: unsafe { base.add(off) }.cast(), len },
        };
        let mut args = [arg(&mut req), remote(self.region.buffer(INPUT)), arg(&mut resp), remote(self.region.buffer(OUTPUT))];
        let sc = Scalars::make(skel::METHOD_CALL, 2, 2);
        // SAFETY: args holds the 4 buffers sc describes; the region's
        // buffers are disjoint and nothing else touches them during the call.
        let code = unsafe { skel::invoke(&self.sessions, self.handle, sc.0, args.as_mut_ptr()) };
        if code != AEE_SUCCESS {
            return Err(Fault::Transport(format!("skel call returned AEE code {code}")));
        }
        let len = u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]]) as usize;
        resp.get(4..4 + len).map(<[u8]>::to_vec).ok_or_else(|| Fault::Transport(format!("response length {len} past the buffer")))
    }
}

fn arg(bytes: &mut [u8]) -> RemoteArg {
    RemoteArg { buf: RemoteBuf { pv: bytes.as_mut_ptr().cast(), len: bytes.len() } }
}

impl Transport for InProcess {
    fn kind(&self) -> TransportKind {
        TransportKind::InProcess
    }

    fn region(&mut self) -> &mut Region {
        &mut self.region
    }

    fn post(&mut self, request: &[u8]) -> std::result::Result<(), Fault> {
        self.response = Some(self.call(request)?);
        Ok(())
    }

    fn wait(&mut self, _timeout: Duration) -> std::result::Result<Vec<u8>, Fault> {
        self.response.take().ok_or_else(|| Fault::Transport("wait without a posted request".into()))
    }

    fn restart(&mut self) -> Result<()> {
        skel::close_session(&self.sessions, self.handle);
        self.response = None;
        self.handle = self.open()?;
        Ok(())
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        skel::close_session(&self.sessions, self.handle);
        skel::mmap::unregister(self.fd);
    }
}

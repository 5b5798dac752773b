//! The road the in-process and FastRPC transports share: the skel reached
//! by a synchronous `invoke`, one session at a time. At open the session's
//! method 3 `map` is told where the weights lie in the region (mapped once
//! under `fd`); each request is then one invoke of method 2 `call` with the
//! `remote_arg`s in: request, input; out: response, output. `post` runs the
//! request to completion, `wait` hands back its response.
//!
//! [`Skel`] is what differs between the two: how a session is opened,
//! invoked and closed, how the region's mapping is released, and how a
//! failure is worded.
use super::{Fault, Region, Transport, TransportKind, INPUT, OUTPUT, WEIGHTS};
use crate::{Error, Result};
use hexlora_dsp::skel::{self, abi::AEE_SUCCESS, RemoteArg, RemoteBuf, Scalars, RESPONSE_BUF_BYTES};
use std::time::Duration;

/// One way of calling the skel synchronously.
pub trait Skel: Send {
    /// Which transport this is.
    const KIND: TransportKind;
    /// Opens a session; its handle.
    fn open(&mut self) -> Result<u64>;
    /// Runs method `sc` of session `handle`; the AEE code.
    ///
    /// # Safety
    /// `args` holds the buffers `sc` describes, alive for the call; those
    /// inside the region are touched by nothing else meanwhile.
    unsafe fn invoke(&mut self, handle: u64, sc: Scalars, args: &mut [RemoteArg]) -> i32;
    /// Closes session `handle`.
    fn close(&mut self, handle: u64);
    /// Releases the mapping of `region` under `fd`, once its last session
    /// is closed (the region is freed after this).
    fn unmap(&mut self, fd: i32, region: &mut Region);
    /// The error of a session open whose `map` of the weights returned `code`.
    fn map_failed(code: i32) -> Error;
    /// The fault of a `call` that returned `code`.
    fn call_failed(code: i32) -> Fault;
}

/// A transport over [`Skel`] `S`.
pub struct Synchronous<S: Skel> {
    handle: u64,
    region: Region,
    /// The region's key in the skel's mapping table.
    fd: i32,
    response: Option<Vec<u8>>,
    /// Declared last: dropped after the region (which may be freed through
    /// the library it holds).
    skel: S,
}

/// A `remote_arg` over `bytes`.
pub fn arg(bytes: &mut [u8]) -> RemoteArg {
    RemoteArg { buf: RemoteBuf { pv: bytes.as_mut_ptr().cast(), len: bytes.len() } }
}

impl<S: Skel> Synchronous<S> {
    /// Opens a session of `skel` over `region`, mapped under `fd`.
    pub fn open_over(skel: S, region: Region, fd: i32) -> Result<Synchronous<S>> {
        let mut t = Synchronous { handle: 0, region, fd, response: None, skel };
        t.handle = t.open()?;
        Ok(t)
    }

    /// Opens a session and maps the weights buffer into it (method 3).
    fn open(&mut self) -> Result<u64> {
        let handle = self.skel.open()?;
        let (offset, len) = self.region.buffer(WEIGHTS);
        let mut map = skel::map_arg(self.fd, offset, len);
        let mut args = [arg(&mut map)];
        // SAFETY: one in-buffer, as method 3 takes.
        let code = unsafe { self.skel.invoke(handle, Scalars::make(skel::METHOD_MAP, 1, 0), &mut args) };
        if code != AEE_SUCCESS {
            self.skel.close(handle);
            return Err(S::map_failed(code));
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
            // SAFETY (of the add): off lies inside the region (Layout).
            buf: RemoteBuf { pv: unsafe { base.add(off) }.cast(), len },
        };
        let mut args = [arg(&mut req), remote(self.region.buffer(INPUT)), arg(&mut resp), remote(self.region.buffer(OUTPUT))];
        let sc = Scalars::make(skel::METHOD_CALL, 2, 2);
        // SAFETY: args holds the 4 buffers sc describes, alive for the call;
        // the region's buffers are disjoint and nothing else touches them
        // during the call.
        let code = unsafe { self.skel.invoke(self.handle, sc, &mut args) };
        if code != AEE_SUCCESS {
            return Err(S::call_failed(code));
        }
        let len = u32::from_le_bytes([resp[0], resp[1], resp[2], resp[3]]) as usize;
        resp.get(4..4 + len).map(<[u8]>::to_vec).ok_or_else(|| Fault::Transport(format!("response length {len} past the buffer")))
    }
}

impl<S: Skel> Transport for Synchronous<S> {
    fn kind(&self) -> TransportKind {
        S::KIND
    }

    fn region(&mut self) -> &mut Region {
        &mut self.region
    }

    fn post(&mut self, request: &[u8]) -> std::result::Result<(), Fault> {
        self.response = Some(self.call(request)?);
        Ok(())
    }

    /// The call was synchronous; a hang inside it cannot be timed out from
    /// here (FastRPC has no cancellation), which is a known limit.
    fn wait(&mut self, _timeout: Duration) -> std::result::Result<Vec<u8>, Fault> {
        self.response.take().ok_or_else(|| Fault::Transport("wait without a posted request".into()))
    }

    fn restart(&mut self) -> Result<()> {
        self.skel.close(self.handle);
        self.response = None;
        self.handle = self.open()?;
        Ok(())
    }
}

impl<S: Skel> Drop for Synchronous<S> {
    fn drop(&mut self) {
        self.skel.close(self.handle);
        self.skel.unmap(self.fd, &mut self.region);
    }
}

//! The FastRPC skel: `hexlora_skel_handle_invoke` dispatch.
//!
//! Methods (see `dsp/include/hexlora.idl` and `hexlora.h`):
//! - 0 `open`: in-bufs `[.., uri]`, out-buf 0 receives the new handle
//!   (u64, little-endian);
//! - 1 `close`: frees the session named by the handle argument;
//! - 2 `call`: in-buf 0 is an encoded [`Request`], in-bufs `1..` are
//!   read-only shared buffers; out-buf 0 receives the [`Response`] as a
//!   little-endian `u32` length then the message (so it needs
//!   `4 + MAX_MESSAGE_BYTES` bytes); out-bufs `1..` are writable shared
//!   buffers. Shared buffers get protocol ids 1, 2, ... in that order
//!   ([`SharedBuffers`]).
//!
//! The return value is the transport status (`AEE_*`): a request that
//! decodes badly or fails still returns `AEE_SUCCESS` with an error
//! [`Response`]; only a call whose argument layout is wrong fails the
//! transport.
//!
//! The service behind the skel is a [`Service`]; the cdylib crate in
//! `dsp/skel/` picks the implementation.
pub mod abi;
pub mod buffers;
#[cfg(all(test, hexlora_h_bindings))]
mod c_header;
mod dispatch_tests;

pub use abi::{RemoteArg, RemoteBuf, Scalars};
pub use buffers::SharedBuffers;
pub use dispatch_tests::SELFTESTS;

use abi::{AEE_EBADPARM, AEE_ENOMEMORY, AEE_EUNSUPPORTED, AEE_SUCCESS};
use hexlora_proto::protocol::{decode, encode, Request, Response, ServiceError, MAX_MESSAGE_BYTES};
use spinning_top::Spinlock;

/// Method numbers.
pub const METHOD_OPEN: u32 = 0;
/// Close a session.
pub const METHOD_CLOSE: u32 = 1;
/// One protocol request.
pub const METHOD_CALL: u32 = 2;

/// Bytes out-buf 0 of a `call` must have.
pub const RESPONSE_BUF_BYTES: usize = 4 + MAX_MESSAGE_BYTES;

/// What serves protocol requests for one open session.
pub trait Service: Sized {
    /// A new session for `uri` (method 0); `Err` is an `AEE_*` code.
    fn open(uri: &[u8]) -> Result<Self, i32>;
    /// Serves one request; failures are error [`Response`]s.
    fn handle(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response;
}

/// Open sessions; a handle is a slot index plus one.
pub struct Sessions<S, const N: usize> {
    slots: [Option<S>; N],
}

impl<S, const N: usize> Sessions<S, N> {
    /// No open session.
    pub const fn new() -> Self {
        Sessions { slots: [const { None }; N] }
    }

    fn get(&mut self, handle: u64) -> Option<&mut S> {
        let i = usize::try_from(handle).ok()?.checked_sub(1)?;
        self.slots.get_mut(i)?.as_mut()
    }

    fn close(&mut self, handle: u64) -> i32 {
        match self.get(handle) {
            Some(_) => {
                // get() succeeded, so handle - 1 is a valid index.
                self.slots[handle as usize - 1] = None;
                AEE_SUCCESS
            }
            None => AEE_EBADPARM,
        }
    }
}

impl<S: Service, const N: usize> Sessions<S, N> {
    fn open(&mut self, uri: &[u8]) -> Result<u64, i32> {
        let slot = self.slots.iter().position(|s| s.is_none()).ok_or(AEE_ENOMEMORY)?;
        self.slots[slot] = Some(S::open(uri)?);
        Ok(slot as u64 + 1)
    }
}

impl<S, const N: usize> Default for Sessions<S, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves one FastRPC invocation.
///
/// # Safety
/// `args` must point to `Scalars(scalars).total()` valid `remote_arg`s
/// (or may be null when that is 0), and each buffer must satisfy the
/// contract of [`SharedBuffers::new`] for the duration of the call.
pub unsafe fn invoke<S: Service, const N: usize>(
    sessions: &Spinlock<Sessions<S, N>>,
    handle: u64,
    scalars: u32,
    args: *mut RemoteArg,
) -> i32 {
    let sc = Scalars(scalars);
    if args.is_null() && sc.total() > 0 {
        return AEE_EBADPARM;
    }
    let bufs: &[RemoteArg] = if sc.total() == 0 { &[] } else { core::slice::from_raw_parts(args, sc.total()) };
    // SAFETY (union reads below): the first in_bufs + out_bufs entries are
    // buffers by the FastRPC convention.
    let mut ins: heapless::Vec<RemoteBuf, 32> = heapless::Vec::new();
    let mut outs: heapless::Vec<RemoteBuf, 32> = heapless::Vec::new();
    for a in &bufs[..sc.in_bufs()] {
        if ins.push(a.buf).is_err() {
            return AEE_EBADPARM;
        }
    }
    for a in &bufs[sc.in_bufs()..sc.in_bufs() + sc.out_bufs()] {
        if outs.push(a.buf).is_err() {
            return AEE_EBADPARM;
        }
    }
    let mut sessions = sessions.lock();
    match sc.method() {
        METHOD_OPEN => open(&mut sessions, &ins, &outs),
        METHOD_CLOSE => sessions.close(handle),
        METHOD_CALL => match sessions.get(handle) {
            Some(service) => call(service, &ins, &outs),
            None => AEE_EBADPARM,
        },
        _ => AEE_EUNSUPPORTED,
    }
}

unsafe fn open<S: Service, const N: usize>(sessions: &mut Sessions<S, N>, ins: &[RemoteBuf], outs: &[RemoteBuf]) -> i32 {
    let (Some(uri), Some(out)) = (ins.last(), outs.first()) else {
        return AEE_EBADPARM;
    };
    if out.len < 8 {
        return AEE_EBADPARM;
    }
    let uri = core::slice::from_raw_parts(uri.pv as *const u8, uri.len);
    match sessions.open(uri) {
        Ok(handle) => {
            core::ptr::copy_nonoverlapping(handle.to_le_bytes().as_ptr(), out.pv as *mut u8, 8);
            AEE_SUCCESS
        }
        Err(code) => code,
    }
}

/// Opens a session outside `invoke` (the IDL's `hexlora_open`).
pub fn open_session<S: Service, const N: usize>(sessions: &Spinlock<Sessions<S, N>>, uri: &[u8]) -> Result<u64, i32> {
    sessions.lock().open(uri)
}

/// Closes a session outside `invoke` (the IDL's `hexlora_close`).
pub fn close_session<S: Service, const N: usize>(sessions: &Spinlock<Sessions<S, N>>, handle: u64) -> i32 {
    sessions.lock().close(handle)
}

unsafe fn call<S: Service>(service: &mut S, ins: &[RemoteBuf], outs: &[RemoteBuf]) -> i32 {
    let (Some(req), Some(resp)) = (ins.first(), outs.first()) else {
        return AEE_EBADPARM;
    };
    if resp.len < RESPONSE_BUF_BYTES {
        return AEE_EBADPARM;
    }
    let Some(mut shared) = SharedBuffers::new(&ins[1..], &outs[1..]) else {
        return AEE_EBADPARM;
    };
    let req_bytes = core::slice::from_raw_parts(req.pv as *const u8, req.len);
    let response = match decode::<Request>(req_bytes) {
        Ok(request) => service.handle(&request, &mut shared),
        Err(e) => Response::Error { seq: None, error: ServiceError::Malformed(e) },
    };
    let out = core::slice::from_raw_parts_mut(resp.pv as *mut u8, resp.len);
    let (len, msg) = out.split_at_mut(4);
    match encode(&response, msg) {
        Ok(bytes) => {
            len.copy_from_slice(&(bytes.len() as u32).to_le_bytes());
            AEE_SUCCESS
        }
        // Unreachable while MAX_MESSAGE_BYTES bounds every response (a
        // self-test checks it); a transport error beats a panic.
        Err(_) => AEE_EBADPARM,
    }
}

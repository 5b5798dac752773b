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
//!   buffers. Shared buffers get protocol ids 2, 3, ... in that order
//!   ([`SharedBuffers`]);
//! - 3 `map`: in-buf 0 is `fd: i32, offset: u32, len: u32` (little-endian,
//!   [`map_arg`]): the session's weights, `len` bytes at `offset` in `fd`'s
//!   persistent mapping, protocol id 1, looked up once through [`mmap::get`]
//!   and read in place until the session closes ([`Mapping`]).
//!   A session maps once; weights are loaded after.
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
pub mod mmap;
#[cfg(all(test, hexlora_h_bindings))]
mod c_header;
mod dispatch_tests;

pub use abi::{RemoteArg, RemoteBuf, Scalars};
pub use buffers::{Mapping, SharedBuffers};
pub use dispatch_tests::SELFTESTS;

use abi::{AEE_EBADPARM, AEE_ENOMEMORY, AEE_EUNSUPPORTED, AEE_SUCCESS};
use hexlora_proto::protocol::{decode, encode, DecodeError, Request, Response, ServiceError, MAX_MESSAGE_BYTES};
use spinning_top::Spinlock;

/// Method numbers.
pub const METHOD_OPEN: u32 = 0;
/// Close a session.
pub const METHOD_CLOSE: u32 = 1;
/// One protocol request.
pub const METHOD_CALL: u32 = 2;
/// Register the session's weights mapping.
pub const METHOD_MAP: u32 = 3;

/// The in-buf of method 3 `map`: `fd`, then the weights' `offset` and
/// `len` inside that fd's mapping, little-endian (lengths past u32
/// saturate, and are refused).
pub fn map_arg(fd: i32, offset: usize, len: usize) -> [u8; MAP_ARG_BYTES] {
    let word = |v: usize| u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes();
    let mut arg = [0u8; MAP_ARG_BYTES];
    arg[..4].copy_from_slice(&fd.to_le_bytes());
    arg[4..8].copy_from_slice(&word(offset));
    arg[8..].copy_from_slice(&word(len));
    arg
}

/// Bytes of method 3's in-buf.
pub const MAP_ARG_BYTES: usize = 12;

/// Bytes out-buf 0 of a `call` must have.
pub const RESPONSE_BUF_BYTES: usize = 4 + MAX_MESSAGE_BYTES;

/// What serves protocol requests for one open session.
pub trait Service: Sized {
    /// A new session for `uri` (method 0); `Err` is an `AEE_*` code.
    fn open(uri: &[u8]) -> Result<Self, i32>;
    /// Takes the session's weights mapping (method 3); `Err` is an `AEE_*`
    /// code.
    fn map(&mut self, weights: Mapping) -> Result<(), i32>;
    /// The mapping taken, if any.
    fn mapping(&self) -> Option<&Mapping>;
    /// Serves one request; failures are error [`Response`]s.
    fn handle(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response;
}

/// One open session: its service and the fd of its weights mapping.
struct Session<S> {
    service: S,
    mapped_fd: Option<i32>,
}

/// Open sessions; a handle is a slot index plus one.
pub struct Sessions<S, const N: usize> {
    slots: [Option<Session<S>>; N],
}

impl<S, const N: usize> Sessions<S, N> {
    /// No open session.
    pub const fn new() -> Self {
        Sessions { slots: [const { None }; N] }
    }

    fn get(&mut self, handle: u64) -> Option<&mut Session<S>> {
        let i = usize::try_from(handle).ok()?.checked_sub(1)?;
        self.slots.get_mut(i)?.as_mut()
    }

    fn close(&mut self, handle: u64) -> i32 {
        match self.get(handle) {
            Some(session) => {
                if let Some(fd) = session.mapped_fd {
                    mmap::put(fd);
                }
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
        self.slots[slot] = Some(Session { service: S::open(uri)?, mapped_fd: None });
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
            Some(session) => call(&mut session.service, &ins, &outs),
            None => AEE_EBADPARM,
        },
        METHOD_MAP => match sessions.get(handle) {
            Some(session) => map(session, &ins),
            None => AEE_EBADPARM,
        },
        _ => AEE_EUNSUPPORTED,
    }
}

unsafe fn open<S: Service, const N: usize>(sessions: &mut Sessions<S, N>, ins: &[RemoteBuf], outs: &[RemoteBuf]) -> i32 {
    let (Some(uri), Some(out)) = (ins.last(), outs.first()) else {
        return AEE_EBADPARM;
    };
    let Some(uri) = host_bytes(uri).filter(|_| out.len >= 8 && !out.pv.is_null()) else {
        return AEE_EBADPARM;
    };
    match sessions.open(uri) {
        Ok(handle) => {
            core::ptr::copy_nonoverlapping(handle.to_le_bytes().as_ptr(), out.pv as *mut u8, 8);
            AEE_SUCCESS
        }
        Err(code) => code,
    }
}

/// The bytes of a host buffer: empty for a zero length (whatever the
/// pointer), `None` for a null pointer with a length.
///
/// # Safety
/// A non-null `b` must be valid for reads of `b.len` bytes for `'a`.
unsafe fn host_bytes<'a>(b: &RemoteBuf) -> Option<&'a [u8]> {
    match (b.len, b.pv.is_null()) {
        (0, _) => Some(&[]),
        (_, true) => None,
        (len, false) => Some(core::slice::from_raw_parts(b.pv as *const u8, len)),
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

unsafe fn map<S: Service>(session: &mut Session<S>, ins: &[RemoteBuf]) -> i32 {
    let Some(arg) = ins.first().and_then(|a| host_bytes(a)).filter(|a| a.len() == MAP_ARG_BYTES) else {
        return AEE_EBADPARM;
    };
    if session.mapped_fd.is_some() {
        return AEE_EBADPARM;
    }
    // Read once: the host may change the buffer while we look.
    let mut b = [0u8; MAP_ARG_BYTES];
    b.copy_from_slice(arg);
    let fd = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let offset = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    let len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    let buf = match mmap::get(fd, offset, len) {
        Ok(buf) => buf,
        Err(code) => return code,
    };
    // SAFETY: mmap::get answered with the live mapping of `fd`, which stays
    // mapped until close() puts it back.
    let Some(mapping) = Mapping::new(buf) else {
        mmap::put(fd);
        return AEE_EBADPARM;
    };
    match session.service.map(mapping) {
        Ok(()) => {
            session.mapped_fd = Some(fd);
            AEE_SUCCESS
        }
        Err(code) => {
            mmap::put(fd);
            code
        }
    }
}

unsafe fn call<S: Service>(service: &mut S, ins: &[RemoteBuf], outs: &[RemoteBuf]) -> i32 {
    let (Some(req), Some(resp)) = (ins.first(), outs.first()) else {
        return AEE_EBADPARM;
    };
    if resp.len < RESPONSE_BUF_BYTES || req.pv.is_null() || resp.pv.is_null() {
        return AEE_EBADPARM;
    }
    // The response buffer is written too: it may share no byte with any
    // other buffer of the call or with the weights mapping.
    let mapped = service.mapping().map(Mapping::buf);
    if ins.iter().chain(&outs[1..]).chain(mapped.as_ref()).any(|b| buffers::aliases(resp, b)) {
        return AEE_EBADPARM;
    }
    let Some(mut shared) = SharedBuffers::new(&ins[1..], &outs[1..], service.mapping()) else {
        return AEE_EBADPARM;
    };
    // The request is decoded from a private copy: read once, so the host
    // cannot change a field between its check and its use.
    let mut copy = [0u8; MAX_MESSAGE_BYTES];
    let Some(bytes) = host_bytes(req).filter(|b| b.len() <= MAX_MESSAGE_BYTES) else {
        let response = Response::Error { seq: None, error: ServiceError::Malformed(DecodeError::TrailingBytes) };
        return respond(&response, resp);
    };
    let private = &mut copy[..bytes.len()];
    private.copy_from_slice(bytes);
    let response = match decode::<Request>(private) {
        Ok(request) => service.handle(&request, &mut shared),
        Err(e) => Response::Error { seq: None, error: ServiceError::Malformed(e) },
    };
    respond(&response, resp)
}

/// Writes `response` into out-buf 0 (length-prefixed).
unsafe fn respond(response: &Response, resp: &RemoteBuf) -> i32 {
    let out = core::slice::from_raw_parts_mut(resp.pv as *mut u8, resp.len);
    let (len, msg) = out.split_at_mut(4);
    match encode(response, msg) {
        Ok(bytes) => {
            len.copy_from_slice(&(bytes.len() as u32).to_le_bytes());
            AEE_SUCCESS
        }
        // Unreachable while MAX_MESSAGE_BYTES bounds every response (a
        // self-test checks it); a transport error beats a panic.
        Err(_) => AEE_EBADPARM,
    }
}

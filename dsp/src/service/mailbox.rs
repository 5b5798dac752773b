//! A dspqueue-style mailbox in a shared mapping: how the host reaches a
//! service that runs elsewhere (its own thread, or a qemu-hexagon child
//! process mapping the same `/dev/shm` file).
//!
//! Region layout (offsets in bytes from the mapping's start):
//!
//! ```text
//! [0, HEADER_BYTES)   Header: magic, generation, state, message slots,
//!                     buffer table
//! buffer table        (offset, len) of protocol buffers 1, 2, 3:
//!                     1 weights (read-only), 2 input (read-only),
//!                     3 output (writable), all inside the region
//! ```
//!
//! One request in flight, a state word passed back and forth:
//!
//! ```text
//! host: init header, state=EMPTY -> start service
//! service: checks header, opens its session -> state=READY
//! host: writes request slot, state=REQUEST (release)
//! service: sees REQUEST (acquire), serves, writes response, state=RESPONSE (release)
//! host: sees RESPONSE (acquire), reads response; next request ...
//! host: state=STOP -> service returns
//! ```
//!
//! No futex or interrupt: the service polls with an `idle` callback between
//! looks (it sleeps a little; qemu-hexagon has no futex wait we rely on).
//! A host that restarts a hung service bumps `generation`; a service that
//! wakes up and sees a generation other than its own leaves without writing.
//!
//! The messages are the protocol's postcard bytes, served through the same
//! [`Service`] the FastRPC skel serves, over [`SharedBuffers`] built from
//! the buffer table: nothing here knows what a projection is.
use crate::skel::{Mapping, RemoteBuf, Service, SharedBuffers};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};
use hexlora_proto::protocol::{decode, encode, Request, Response, ServiceError, MAX_MESSAGE_BYTES};

/// `"HXMB"` little-endian: the header was initialised by a host.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HXMB");

/// Bytes reserved for the header; buffers start at or after this.
pub const HEADER_BYTES: usize = 4096;

/// Bytes of each message slot (a request or a response).
pub const SLOT_BYTES: usize = 128;

/// Protocol buffers the table describes: ids 1 (weights), 2 (input), 3
/// (output).
pub const BUFFERS: usize = 3;

/// Values of [`Header::state`].
pub mod state {
    /// Header written, service not ready yet.
    pub const EMPTY: u32 = 0;
    /// The service opened its session and waits for a request.
    pub const READY: u32 = 1;
    /// A request is in the request slot.
    pub const REQUEST: u32 = 2;
    /// The response is in the response slot.
    pub const RESPONSE: u32 = 3;
    /// The service must return.
    pub const STOP: u32 = 4;
    /// The service refused the header or could not open its session.
    pub const FAILED: u32 = 5;
}

const _: () = assert!(SLOT_BYTES >= MAX_MESSAGE_BYTES);
const _: () = assert!(core::mem::size_of::<Header>() <= HEADER_BYTES);

/// The header at the start of the region. Every field is either atomic or a
/// slot owned by one side at a time (the state word says which).
#[repr(C)]
pub struct Header {
    /// [`MAGIC`] once the host initialised the header.
    pub magic: AtomicU32,
    /// Bumped by the host on every (re)start; see the module docs.
    pub generation: AtomicU32,
    /// One of [`state`].
    pub state: AtomicU32,
    /// Bytes used in the request slot.
    pub request_len: AtomicU32,
    /// Bytes used in the response slot.
    pub response_len: AtomicU32,
    /// Requests served by this service instance.
    pub served: AtomicU32,
    /// Length of the whole region in bytes.
    pub region_len: AtomicU32,
    /// `(offset, len)` of buffers 1..=3.
    pub buffers: [[AtomicU32; 2]; BUFFERS],
    request: UnsafeCell<[u8; SLOT_BYTES]>,
    response: UnsafeCell<[u8; SLOT_BYTES]>,
}

// SAFETY: the slots are written only by the side the state word hands them
// to (host: request slot while not REQUEST; service: response slot while
// REQUEST), with release/acquire on the state word between.
unsafe impl Sync for Header {}

/// Why [`serve`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The host asked it to stop.
    Stopped,
    /// The host restarted the service: another instance owns the header.
    Superseded,
    /// `idle` said to give up (e.g. the host process is gone).
    Abandoned,
    /// Bad magic, a buffer outside the region, or overlapping buffers.
    BadHeader,
    /// The session could not be opened (an `AEE_*` code).
    OpenFailed(i32),
}

impl Header {
    /// The header at `base`.
    ///
    /// # Safety
    /// `base` must point to at least [`HEADER_BYTES`] bytes, aligned to 4,
    /// mapped for as long as the returned reference is used.
    pub unsafe fn at<'a>(base: *mut u8) -> &'a Header {
        &*(base as *const Header)
    }

    /// Host: writes the layout for a new service instance and returns its
    /// generation. `buffers` are `(offset, len)` of ids 1..=3.
    pub fn init(&self, region_len: u32, buffers: [(u32, u32); BUFFERS]) -> u32 {
        let generation = self.generation.load(Ordering::Relaxed).wrapping_add(1);
        self.state.store(state::EMPTY, Ordering::Relaxed);
        self.region_len.store(region_len, Ordering::Relaxed);
        self.served.store(0, Ordering::Relaxed);
        for (slot, (off, len)) in self.buffers.iter().zip(buffers) {
            slot[0].store(off, Ordering::Relaxed);
            slot[1].store(len, Ordering::Relaxed);
        }
        self.generation.store(generation, Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Release);
        generation
    }

    /// Host: posts `request`; false if it does not fit the slot.
    pub fn post(&self, request: &[u8]) -> bool {
        if request.len() > SLOT_BYTES {
            return false;
        }
        // SAFETY: the state is not REQUEST (one request in flight, the host
        // posts only after READY or RESPONSE), so the host owns the slot.
        unsafe { (&mut *self.request.get())[..request.len()].copy_from_slice(request) };
        self.request_len.store(request.len() as u32, Ordering::Relaxed);
        self.state.store(state::REQUEST, Ordering::Release);
        true
    }

    /// Host: the response bytes, once the state is RESPONSE.
    pub fn response(&self) -> Option<heapless::Vec<u8, SLOT_BYTES>> {
        if self.state.load(Ordering::Acquire) != state::RESPONSE {
            return None;
        }
        let len = (self.response_len.load(Ordering::Relaxed) as usize).min(SLOT_BYTES);
        // SAFETY: in state RESPONSE the service no longer touches the slot.
        let bytes = unsafe { &(&*self.response.get())[..len] };
        heapless::Vec::from_slice(bytes).ok()
    }

    /// The current state.
    pub fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Host: asks the service to return.
    pub fn stop(&self) {
        self.state.store(state::STOP, Ordering::Release);
    }

    fn buffer(&self, i: usize) -> (usize, usize) {
        let [off, len] = &self.buffers[i];
        (off.load(Ordering::Relaxed) as usize, len.load(Ordering::Relaxed) as usize)
    }

    /// Service: reads the buffer table once and checks it against a region
    /// of `len` bytes (every buffer inside, the output apart from both
    /// inputs). The host cannot change it afterwards: only this copy is used.
    fn checked_table(&self, len: usize) -> Option<[(usize, usize); BUFFERS]> {
        let inside = |(off, n): (usize, usize)| off >= HEADER_BYTES && off.checked_add(n).is_some_and(|end| end <= len);
        let disjoint = |a: (usize, usize), b: (usize, usize)| a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0;
        let bufs = [self.buffer(0), self.buffer(1), self.buffer(2)];
        (bufs.iter().all(|&b| inside(b)) && disjoint(bufs[2], bufs[0]) && disjoint(bufs[2], bufs[1])).then_some(bufs)
    }
}

/// Service side: serves requests from the mailbox at `base` until the host
/// stops it, restarts it, or `idle` gives up. `idle(spins)` is called
/// between looks at the state word, `spins` counting looks since the last
/// request; it returns false to abandon.
///
/// # Safety
/// `base` must point to `len` bytes mapped read-write, aligned to 4, for the
/// whole call; only the host touches them otherwise, and only as the module
/// docs describe.
pub unsafe fn serve<S: Service>(base: *mut u8, len: usize, idle: &mut dyn FnMut(u32) -> bool) -> Exit {
    if len < HEADER_BYTES {
        return Exit::BadHeader;
    }
    let header = Header::at(base);
    let table = match header.checked_table(len) {
        Some(table) if header.magic.load(Ordering::Acquire) == MAGIC => table,
        _ => {
            header.state.store(state::FAILED, Ordering::Release);
            return Exit::BadHeader;
        }
    };
    let remote = |i: usize| {
        let (off, n) = table[i];
        RemoteBuf { pv: base.add(off).cast(), len: n }
    };
    let generation = header.generation.load(Ordering::Relaxed);
    // The weights buffer is the session's mapping: it stays mapped (the
    // region is) for the whole call.
    let opened = S::open(b"mailbox").and_then(|mut s| match Mapping::new(remote(0)) {
        Some(m) => s.map(m).map(|()| s),
        None => Err(crate::skel::abi::AEE_EBADPARM),
    });
    let mut service = match opened {
        Ok(s) => s,
        Err(code) => {
            header.state.store(state::FAILED, Ordering::Release);
            return Exit::OpenFailed(code);
        }
    };
    header.state.store(state::READY, Ordering::Release);
    loop {
        if let Some(exit) = wait_for_request(header, generation, idle) {
            return exit;
        }
        let response = serve_one(&mut service, header, [remote(1), remote(2)]);
        if header.generation.load(Ordering::Acquire) != generation {
            return Exit::Superseded;
        }
        let mut slot = [0u8; SLOT_BYTES];
        // MAX_MESSAGE_BYTES bounds every response (a protocol self-test
        // checks it), so encoding into a slot cannot fail.
        let n = encode(&response, &mut slot).map(|b| b.len()).unwrap_or(0);
        (&mut *header.response.get())[..n].copy_from_slice(&slot[..n]);
        header.response_len.store(n as u32, Ordering::Relaxed);
        header.served.fetch_add(1, Ordering::Relaxed);
        header.state.store(state::RESPONSE, Ordering::Release);
    }
}

/// Polls until a request (None) or a reason to leave (Some).
fn wait_for_request(header: &Header, generation: u32, idle: &mut dyn FnMut(u32) -> bool) -> Option<Exit> {
    let mut spins = 0u32;
    loop {
        if header.generation.load(Ordering::Acquire) != generation {
            return Some(Exit::Superseded);
        }
        match header.state.load(Ordering::Acquire) {
            state::REQUEST => return None,
            state::STOP => return Some(Exit::Stopped),
            _ => {}
        }
        spins = spins.wrapping_add(1);
        if !idle(spins) {
            return Some(Exit::Abandoned);
        }
    }
}

/// Decodes the request slot and serves it over the call's buffers
/// (`[input, output]` from the checked table).
unsafe fn serve_one<S: Service>(service: &mut S, header: &Header, call: [RemoteBuf; 2]) -> Response {
    let len = (header.request_len.load(Ordering::Relaxed) as usize).min(SLOT_BYTES);
    let mut bytes = [0u8; SLOT_BYTES];
    bytes[..len].copy_from_slice(&(&*header.request.get())[..len]);
    let request = match decode::<Request>(&bytes[..len]) {
        Ok(r) => r,
        Err(e) => return Response::Error { seq: None, error: ServiceError::Malformed(e) },
    };
    // checked_table() put every buffer inside the region and the output
    // apart from both inputs, as SharedBuffers::new requires.
    match SharedBuffers::new(&call[..1], &call[1..], service.mapping()) {
        Some(mut shared) => service.handle(&request, &mut shared),
        None => Response::Error { seq: None, error: ServiceError::InvalidParams },
    }
}

//! Fuzzes the skel's invoke entry (`hexlora_dsp::skel::invoke`) over the real
//! projection service: the input chooses methods, argument counts, buffers
//! (null, empty, overlapping each other or the weights mapping, anywhere in
//! an arena), map arguments and request bytes. Every invocation must return
//! a status: a panic, an abort or an out-of-bounds access (under the
//! sanitizer) is a finding.
//!
//! The service runs over a 1 MiB VTCM region instead of the device's 8 MiB:
//! every input opens a fresh session, and a fresh 8 MiB mapping per input
//! made page faults three quarters of the run time (`perf`, 125
//! executions/s). The mappings fit in the 16 KiB arena, so no plan over
//! them needs more; a request that does gets the service's out-of-memory
//! error, a path worth fuzzing too.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run skel_invoke

use hexlora_proto::protocol::{Request, Response};
use hexlora_dsp::service::ProjectionService;
use hexlora_dsp::skel::{self, mmap, Mapping, RemoteArg, RemoteBuf, Scalars, Service, SharedBuffers, Sessions};
use hexlora_dsp::vtcm::VtcmRegion;
use spinning_top::Spinlock;

/// Reads choices from the fuzz input; zeros once it runs out.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn below(&mut self, n: usize) -> usize {
        let v = u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()]) as usize;
        v % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
}

/// The projection service with [`FUZZ_VTCM_BYTES`] of VTCM; everything
/// else is `ProjectionService`'s own.
struct FuzzService(ProjectionService);

const FUZZ_VTCM_BYTES: usize = 1 << 20;

impl Service for FuzzService {
    fn open(_uri: &[u8]) -> Result<Self, i32> {
        let vtcm = VtcmRegion::new(FUZZ_VTCM_BYTES).ok_or(skel::abi::AEE_ENOMEMORY)?;
        Ok(FuzzService(ProjectionService::new(vtcm)))
    }
    fn map(&mut self, weights: Mapping) -> Result<(), i32> {
        self.0.map(weights)
    }
    fn mapping(&self) -> Option<&Mapping> {
        self.0.mapping()
    }
    fn handle(&mut self, request: &Request, buffers: &mut SharedBuffers<'_>) -> Response {
        self.0.handle(request, buffers)
    }
}

const ARENA_WORDS: usize = 4096;
const FD: i32 = 77;

pub fn run(data: &[u8]) {
    let mut c = Choices(data);
    let table: Spinlock<Sessions<FuzzService, 1>> = Spinlock::new(Sessions::new());
    let mut arena: Vec<u32> = (0..ARENA_WORDS).map(|i| (i as u32).wrapping_mul(0x9e37_79b9) & 0x3bff_3bff).collect();
    let base = arena.as_mut_ptr().cast::<u8>();
    let bytes = ARENA_WORDS * 4;
    // SAFETY: the arena outlives every session of this run (closed below).
    assert!(unsafe { mmap::register(FD, base, bytes) });
    let mut uri = *b"file:///libhexlora_skel.so\0";
    let mut h = [0u8; 8];
    let mut open = [RemoteArg { buf: RemoteBuf { pv: uri.as_mut_ptr().cast(), len: uri.len() } }, RemoteArg { buf: RemoteBuf { pv: h.as_mut_ptr().cast(), len: 8 } }];
    // SAFETY: 1 in, 1 out buffer, both live.
    assert_eq!(unsafe { skel::invoke(&table, 0, Scalars::make(skel::METHOD_OPEN, 1, 1).0, open.as_mut_ptr()) }, 0);
    let handle = u64::from_le_bytes(h);
    for _ in 0..16 {
        let method = c.below(5) as u32;
        let (ins, outs) = (c.below(4), c.below(4));
        let mut owned: Vec<Vec<u8>> = Vec::new();
        let mut args: Vec<RemoteArg> = Vec::new();
        for _ in 0..ins + outs {
            let arg = match c.below(4) {
                0 => RemoteBuf { pv: std::ptr::null_mut(), len: c.below(64) },
                1 => {
                    // A private buffer with fuzzed contents (a request, a
                    // map argument, a response buffer).
                    let n = c.below(skel::RESPONSE_BUF_BYTES + 8);
                    owned.push(c.bytes(n));
                    let v = owned.last_mut().unwrap();
                    RemoteBuf { pv: v.as_mut_ptr().cast(), len: v.len() }
                }
                _ => {
                    let off = c.below(bytes) & !3;
                    RemoteBuf { pv: base.wrapping_add(off).cast(), len: c.below(bytes - off + 1) }
                }
            };
            args.push(RemoteArg { buf: arg });
        }
        let handle = if c.byte() == 0xff { c.below(8) as u64 } else { handle };
        // SAFETY: every non-null buffer lies in the arena or in `owned`,
        // both alive for the call.
        let _ = unsafe { skel::invoke(&table, handle, Scalars::make(method, ins as u32, outs as u32).0, args.as_mut_ptr()) };
    }
    let _ = skel::close_session(&table, handle);
    mmap::unregister(FD);
}

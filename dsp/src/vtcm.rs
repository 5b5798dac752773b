//! VTCM: the NPU's on-chip scratch, handed out by a bump arena.
//!
//! Every kernel asks for all of its VTCM up front (activation tiles, weight
//! windows, accumulators, staging); a request that does not fit gets
//! [`VtcmTooSmall`] before any work starts, never a crash. The arena is
//! rebuilt for each request, so nothing leaks between requests.
//!
//! Where the region comes from ([`VtcmRegion::for_session`], sizes in
//! [`crate::rt::limits`]):
//! - device skel: `HAP_compute_res_acquire` with a VTCM request, released
//!   when the session closes (symbols resolved by the DSP's loader;
//!   prototypes from the SDK's `HAP_compute_res.h`; natively the FastRPC
//!   stand-in defines them, so this path runs in its tests);
//! - simulator build: the `.vtcm` section of linker/hexagon-sim.x (qemu has
//!   no VTCM; this is ordinary memory outside the heap), one session at a
//!   time;
//! - native: an aligned block from the global allocator.
use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use bytemuck::Pod;
use core::ptr::NonNull;

/// VTCM capacity of v73, v75 and v79: 8 MiB.
pub const DEFAULT_VTCM_BYTES: usize = 8 << 20;

/// Alignment of every allocation: one HVX vector, so tiles load as aligned
/// vectors.
pub const VTCM_ALIGN: usize = 128;

/// The arena ran out of VTCM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VtcmTooSmall {
    /// Bytes the allocation needed (including alignment padding).
    pub needed: usize,
    /// Bytes still free when it was asked for.
    pub available: usize,
}

/// Who gave the region, so `Drop` gives it back the same way.
enum Source {
    /// The global allocator, with this layout.
    Heap(Layout),
    /// The linker's `.vtcm` section (simulator build).
    #[allow(dead_code)]
    Section,
    /// A `HAP_compute_res` context (device).
    #[allow(dead_code)]
    ComputeRes(u32),
}

/// The VTCM region a session owns.
pub struct VtcmRegion {
    ptr: NonNull<u8>,
    len: usize,
    source: Source,
}

// SAFETY: the region is uniquely owned memory, like a Box<[u8]>.
unsafe impl Send for VtcmRegion {}

impl VtcmRegion {
    /// Reserves `bytes` of zeroed, page-aligned memory from the global
    /// allocator; `None` if it cannot provide it (or `bytes` is 0).
    pub fn new(bytes: usize) -> Option<VtcmRegion> {
        let layout = Layout::from_size_align(bytes, 4096).ok()?;
        if bytes == 0 {
            return None;
        }
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(VtcmRegion { ptr, len: bytes, source: Source::Heap(layout) })
    }

    /// The region of one session on this target: `bytes` of VTCM, or `None`
    /// when it cannot be had (too large, or already taken).
    pub fn for_session(bytes: usize) -> Option<VtcmRegion> {
        #[cfg(all(target_arch = "hexagon", feature = "sim"))]
        return section::take(bytes);
        #[cfg(hexlora_hap)]
        return compute_res::acquire(bytes);
        #[cfg(not(any(hexlora_hap, all(target_arch = "hexagon", feature = "sim"))))]
        return VtcmRegion::new(bytes);
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// A fresh arena over the whole region (borrowing it exclusively).
    pub fn arena(&mut self) -> VtcmArena<'_> {
        // SAFETY: ptr/len describe our region, borrowed mutably here.
        let bytes = unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        VtcmArena::new(bytes)
    }
}

impl Drop for VtcmRegion {
    fn drop(&mut self) {
        match self.source {
            // SAFETY: allocated in `new` with exactly this layout.
            Source::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            #[cfg(all(target_arch = "hexagon", feature = "sim"))]
            Source::Section => section::give_back(),
            #[cfg(hexlora_hap)]
            Source::ComputeRes(ctx) => compute_res::release(ctx),
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

#[cfg(all(target_arch = "hexagon", feature = "sim"))]
mod section {
    use super::{NonNull, Source, VtcmRegion};
    use core::sync::atomic::{AtomicBool, Ordering};

    extern "C" {
        // linker/hexagon-sim.x
        static mut __vtcm_start: u8;
        static __vtcm_end: u8;
    }

    static TAKEN: AtomicBool = AtomicBool::new(false);

    pub fn take(bytes: usize) -> Option<VtcmRegion> {
        let start = &raw mut __vtcm_start;
        // Only the symbols' addresses are used.
        let size = (&raw const __vtcm_end as usize) - start as usize;
        if bytes == 0 || bytes > size || TAKEN.swap(true, Ordering::Acquire) {
            return None;
        }
        // SAFETY: the section is `size` bytes that nothing else uses, and
        // TAKEN makes this the only region over it.
        unsafe { start.write_bytes(0, bytes) };
        Some(VtcmRegion { ptr: NonNull::new(start)?, len: bytes, source: Source::Section })
    }

    pub fn give_back() {
        TAKEN.store(false, Ordering::Release);
    }
}

#[cfg(hexlora_hap)]
mod compute_res {
    use super::{NonNull, Source, VtcmRegion};
    use core::ffi::c_void;

    /// `compute_res_attr_t` (HAP_compute_res.h): opaque, 8 x u64.
    #[repr(C, align(8))]
    struct Attr([u64; 8]);

    extern "C" {
        fn HAP_compute_res_attr_init(attr: *mut Attr) -> i32;
        fn HAP_compute_res_attr_set_vtcm_param(attr: *mut Attr, vtcm_size: u32, single_page: u8) -> i32;
        fn HAP_compute_res_acquire(attr: *mut Attr, timeout_us: u32) -> u32;
        fn HAP_compute_res_attr_get_vtcm_ptr(attr: *mut Attr) -> *mut c_void;
        fn HAP_compute_res_release(context_id: u32) -> i32;
    }

    /// How long a session waits for VTCM another client holds.
    const TIMEOUT_US: u32 = 10_000;

    pub fn acquire(bytes: usize) -> Option<VtcmRegion> {
        let size = u32::try_from(bytes).ok().filter(|&b| b > 0)?;
        let mut attr = Attr([0; 8]);
        // SAFETY: attr is a valid, writable compute_res_attr_t.
        unsafe {
            if HAP_compute_res_attr_init(&mut attr) != 0 || HAP_compute_res_attr_set_vtcm_param(&mut attr, size, 1) != 0 {
                return None;
            }
            let ctx = HAP_compute_res_acquire(&mut attr, TIMEOUT_US);
            if ctx == 0 {
                return None;
            }
            let Some(ptr) = NonNull::new(HAP_compute_res_attr_get_vtcm_ptr(&mut attr).cast::<u8>()) else {
                HAP_compute_res_release(ctx);
                return None;
            };
            ptr.as_ptr().write_bytes(0, bytes);
            Some(VtcmRegion { ptr, len: bytes, source: Source::ComputeRes(ctx) })
        }
    }

    pub fn release(ctx: u32) {
        // SAFETY: ctx came from HAP_compute_res_acquire.
        unsafe { HAP_compute_res_release(ctx) };
    }
}

/// Bump allocator over a VTCM region; allocations live as long as the region
/// borrow and never overlap.
pub struct VtcmArena<'a> {
    free: &'a mut [u8],
    capacity: usize,
}

impl<'a> VtcmArena<'a> {
    /// An arena over `region`.
    pub fn new(region: &'a mut [u8]) -> VtcmArena<'a> {
        let capacity = region.len();
        VtcmArena { free: region, capacity }
    }

    /// Total bytes of the region.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes handed out so far, padding included.
    pub fn used(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// `n` zeroed elements of `T`, aligned to [`VTCM_ALIGN`].
    pub fn alloc<T: Pod>(&mut self, n: usize) -> Result<&'a mut [T], VtcmTooSmall> {
        let size = core::mem::size_of::<T>();
        let pad = self.free.as_ptr().align_offset(VTCM_ALIGN);
        let needed = n.checked_mul(size).and_then(|b| b.checked_add(pad)).unwrap_or(usize::MAX);
        if needed > self.free.len() {
            return Err(VtcmTooSmall { needed, available: self.free.len() });
        }
        let free = core::mem::take(&mut self.free);
        let (head, rest) = free.split_at_mut(needed);
        self.free = rest;
        let bytes = &mut head[pad..];
        bytes.fill(0);
        Ok(bytemuck::cast_slice_mut(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_bounded() {
        let mut region = VtcmRegion::new(4096).unwrap();
        let mut arena = region.arena();
        let a: &mut [u8] = arena.alloc(3).unwrap();
        let b: &mut [f32] = arena.alloc(10).unwrap();
        assert_eq!(b.as_ptr() as usize % VTCM_ALIGN, 0);
        assert!(b.as_ptr() as usize >= a.as_ptr() as usize + 128);
        a.fill(7);
        assert!(b.iter().all(|&x| x == 0.0));
        assert_eq!(arena.used(), 128 + 40);
        let err = arena.alloc::<u16>(2000).unwrap_err();
        assert_eq!(err, VtcmTooSmall { needed: 88 + 4000, available: 4096 - 168 });
        // A failed allocation takes nothing.
        assert_eq!(arena.used(), 168);
        assert!(arena.alloc::<u8>(usize::MAX).is_err());
    }

    #[test]
    fn new_arena_reuses_the_whole_region_zeroed() {
        let mut region = VtcmRegion::new(256).unwrap();
        region.arena().alloc::<u8>(256).unwrap().fill(9);
        let again = region.arena().alloc::<u8>(256).unwrap();
        assert!(again.iter().all(|&b| b == 0));
    }
}

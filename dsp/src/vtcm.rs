//! VTCM: the NPU's on-chip scratch, handed out by a bump arena.
//!
//! Every kernel asks for all of its VTCM up front (activation tiles, weight
//! windows, accumulators, staging); a request that does not fit gets
//! [`VtcmTooSmall`] before any work starts, never a crash. The arena is
//! rebuilt for each request, so nothing leaks between requests.
//!
//! On a device the region would come from `HAP_compute_res_acquire`; natively
//! and under qemu-hexagon (which has no VTCM) [`VtcmRegion`] is an aligned
//! heap block of the same capacity, which is enough to model capacity limits
//! and alignment.
use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use bytemuck::Pod;
use core::ptr::NonNull;

/// Default VTCM capacity: 8 MiB on v73, v79 and v81.
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

/// An owned, aligned block standing in for the VTCM region.
pub struct VtcmRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is uniquely owned memory, like a Box<[u8]>.
unsafe impl Send for VtcmRegion {}

impl VtcmRegion {
    /// Reserves `bytes` of zeroed, page-aligned memory; `None` if the heap
    /// cannot provide it (or `bytes` is 0).
    pub fn new(bytes: usize) -> Option<VtcmRegion> {
        let layout = Layout::from_size_align(bytes, 4096).ok()?;
        if bytes == 0 {
            return None;
        }
        // SAFETY: layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(VtcmRegion { ptr, len: bytes })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// A fresh arena over the whole region (borrowing it exclusively).
    pub fn arena(&mut self) -> VtcmArena<'_> {
        // SAFETY: ptr/len describe our allocation, borrowed mutably here.
        let bytes = unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) };
        VtcmArena::new(bytes)
    }
}

impl Drop for VtcmRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, 4096)) }
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

//! The firmware heap: talc over a static arena.
//!
//! talc is architecture-neutral (unlike allocators tied to Cortex-M), so the
//! same allocator code runs in the native tests and on Hexagon. Hexagon
//! builds register [`Heap`] over a static arena as the global allocator;
//! native builds keep std's and test talc on arenas of their own.
use spinning_top::RawSpinlock;
use talc::source::Claim;
use talc::sync::TalcLock;
use talc::DefaultBinning;

/// A lock-protected talc heap that claims one memory region on first use.
pub type Heap = TalcLock<RawSpinlock, Claim, DefaultBinning>;

pub use super::limits::HEAP_BYTES;

/// A heap over `arena`.
///
/// # Safety
/// `arena` must be valid, unused by anything else, for as long as the heap
/// lives.
pub const unsafe fn heap_over<const N: usize>(arena: *mut [u8; N]) -> Heap {
    TalcLock::new(Claim::array(arena))
}

#[cfg(target_arch = "hexagon")]
mod global {
    use super::{heap_over, Heap, HEAP_BYTES};

    #[repr(align(128))]
    struct Arena([u8; HEAP_BYTES]);
    static mut ARENA: Arena = Arena([0; HEAP_BYTES]);

    // SAFETY: ARENA is referenced nowhere else.
    #[global_allocator]
    static GLOBAL: Heap = unsafe { heap_over(&raw mut ARENA.0) };
}

use crate::selftest::TestResult;
use crate::{check, check_eq};
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};

/// Allocations are distinct, aligned (128 bytes = one HVX vector) and keep
/// their contents; exhausting the arena yields null, not a crash; freed
/// memory is reusable.
fn arena_heap_allocates_aligns_and_reuses() -> TestResult {
    #[repr(align(16))]
    struct Arena([u8; 16 << 10]);
    let mut arena = Arena([0; 16 << 10]);
    // SAFETY: `arena` outlives `heap` and nothing else touches it.
    let heap = unsafe { heap_over(&raw mut arena.0) };
    let layout = Layout::from_size_align(1000, 128).map_err(|_| fail("layout"))?;
    let mut blocks = Vec::new();
    loop {
        // SAFETY: layout has non-zero size.
        let p = unsafe { heap.alloc(layout) };
        if p.is_null() {
            break;
        }
        check_eq!(p as usize % 128, 0);
        // SAFETY: p points to 1000 fresh bytes.
        unsafe { p.write_bytes(blocks.len() as u8, 1000) };
        blocks.push(p);
        check!(blocks.len() <= 16, "more 1000-byte blocks than a 16 KiB arena holds");
    }
    check!(blocks.len() >= 8, "only {} blocks fit in 16 KiB", blocks.len());
    for (i, &p) in blocks.iter().enumerate() {
        // SAFETY: each block holds the 1000 bytes written above.
        let bytes = unsafe { core::slice::from_raw_parts(p, 1000) };
        check!(bytes.iter().all(|&b| b == i as u8), "block {} was overwritten", i);
    }
    let count = blocks.len();
    for p in blocks.drain(..) {
        // SAFETY: p came from heap.alloc(layout).
        unsafe { heap.dealloc(p, layout) };
    }
    let mut again = 0;
    // SAFETY: as above.
    while again < count && !unsafe { heap.alloc(layout) }.is_null() {
        again += 1;
    }
    check_eq!(again, count);
    Ok(())
}

/// `realloc` keeps the prefix when growing.
fn realloc_keeps_contents() -> TestResult {
    let mut arena = [0u8; 8 << 10];
    // SAFETY: `arena` outlives `heap` and nothing else touches it.
    let heap = unsafe { heap_over(&raw mut arena) };
    let layout = Layout::from_size_align(64, 8).map_err(|_| fail("layout"))?;
    // SAFETY: non-zero size; the pointer is checked before use.
    let p = unsafe { heap.alloc(layout) };
    check!(!p.is_null());
    // SAFETY: 64 bytes at p.
    unsafe { (0..64).for_each(|i| p.add(i).write(i as u8)) };
    // SAFETY: p came from heap with `layout`.
    let q = unsafe { heap.realloc(p, layout, 4096) };
    check!(!q.is_null());
    // SAFETY: q holds at least 64 initialised bytes.
    let bytes = unsafe { core::slice::from_raw_parts(q, 64) };
    check!(bytes.iter().enumerate().all(|(i, &b)| b == i as u8));
    Ok(())
}

/// The global allocator serves `alloc` collections (talc on Hexagon).
fn global_allocator_serves_collections() -> TestResult {
    let v: Vec<u32> = (0..10_000).collect();
    check_eq!(v.iter().map(|&x| x as u64).sum::<u64>(), 49_995_000);
    let s = alloc::format!("{}-{}", v[1], v[9_999]);
    check_eq!(s.as_str(), "1-9999");
    Ok(())
}

fn fail(what: &str) -> crate::selftest::TestFailure {
    crate::selftest::TestFailure::new(file!(), line!(), format_args!("{what}"))
}

crate::selftests!(arena_heap_allocates_aligns_and_reuses, realloc_keeps_contents, global_allocator_serves_collections);

//! Hexagon user DMA through `dmstart`/`dmlink`/`dmwait`.
//!
//! COMPILE-ONLY. qemu-hexagon 7.2 implements no user-DMA instructions, so
//! this engine is built for Hexagon targets to keep it compiling but no test
//! here executes it; the kernels run with [`super::software::SoftwareDma`]
//! everywhere we can execute code. On a device the descriptor ring must live
//! in memory the DMA engine can read (not VTCM) and addresses are virtual.
use super::{Desc2d, DescState, DmaEngine, Ticket};

/// The UDMA type-1 (2-D) descriptor, 32 bytes. The packing follows the
/// published outline (next, control, src, dst, ROI, strides); it has never
/// been checked on hardware, which is one more reason this file is
/// compile-only.
#[repr(C, align(32))]
#[derive(Clone, Copy, Default)]
struct Type1Descriptor {
    next: u32,
    /// Descriptor type in bits 24..26 (1 = 2-D), done flag in bit 31.
    control: u32,
    src: u32,
    dst: u32,
    /// Cache-allocation and padding controls (left 0: defaults).
    allocation: u32,
    roi: u32,    // width (16) | height (16) << 16
    stride: u32, // src_stride (16) | dst_stride (16) << 16
    offsets: u32,
}

const RING: usize = 64;
const DESC_TYPE_1: u32 = 1 << 24;
const DONE: u32 = 1 << 31;

/// The hardware engine: a ring of descriptors linked with `dmlink`.
pub struct HexagonUdma {
    ring: [Type1Descriptor; RING],
    next: u64,
    started: bool,
}

impl HexagonUdma {
    /// An idle engine.
    pub const fn new() -> HexagonUdma {
        HexagonUdma {
            ring: [Type1Descriptor { next: 0, control: 0, src: 0, dst: 0, allocation: 0, roi: 0, stride: 0, offsets: 0 }; RING],
            next: 0,
            started: false,
        }
    }

    fn slot(&self, t: Ticket) -> &Type1Descriptor {
        &self.ring[(t.0 % RING as u64) as usize]
    }
}

impl DmaEngine for HexagonUdma {
    unsafe fn push(&mut self, d: Desc2d) -> Option<Ticket> {
        let i = (self.next % RING as u64) as usize;
        if self.next >= RING as u64 && self.ring[i].control & DONE == 0 {
            return None;
        }
        let prev = (self.next.wrapping_sub(1) % RING as u64) as usize;
        self.ring[i] = Type1Descriptor {
            next: 0,
            control: DESC_TYPE_1,
            src: d.src as u32,
            dst: d.dst as u32,
            allocation: 0,
            roi: d.roi_width as u32 | (d.roi_height as u32) << 16,
            stride: d.src_stride as u32 | (d.dst_stride as u32) << 16,
            offsets: 0,
        };
        let desc = &self.ring[i] as *const Type1Descriptor as u32;
        if self.started {
            let tail = &self.ring[prev] as *const Type1Descriptor as u32;
            // SAFETY: links a fully written descriptor after the tail.
            unsafe { core::arch::asm!("dmlink({0}, {1})", in(reg) tail, in(reg) desc) };
        } else {
            // SAFETY: starts the channel on a fully written descriptor.
            unsafe { core::arch::asm!("dmstart({0})", in(reg) desc) };
            self.started = true;
        }
        let t = Ticket(self.next);
        self.next += 1;
        Some(t)
    }

    fn poll(&mut self, t: Ticket) -> DescState {
        // SAFETY: the engine writes the done bit; read it volatile.
        let control = unsafe { core::ptr::read_volatile(&self.slot(t).control) };
        if control & DONE != 0 {
            DescState::Done
        } else {
            DescState::Pending
        }
    }

    fn wait(&mut self, t: Ticket) {
        while self.poll(t) == DescState::Pending {}
    }

    fn wait_all(&mut self) {
        let status: u32;
        // SAFETY: dmwait blocks until the channel is idle.
        unsafe { core::arch::asm!("{0} = dmwait", out(reg) status) };
        let _ = status;
    }
}

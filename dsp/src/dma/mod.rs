//! The row-window DMA engine: 2-D descriptors, push/poll/wait.
//!
//! Descriptors are modelled on the Hexagon user-DMA (UDMA) type-1 descriptor:
//! a region of interest `roi_width` bytes wide and `roi_height` rows high,
//! read with `src_stride` and written with `dst_stride`, every field 16 bits.
//! [`split_2d`] turns any 2-D copy into descriptors that fit those fields:
//! a row longer than 65535 bytes (or a stride past 65535) becomes one
//! descriptor per row, cut into chunks; more than 65535 rows become several
//! descriptors.
//!
//! The kernels double-buffer: they push the next window's descriptors, work
//! on the current window, then wait for the next one. Engines:
//! - [`software::SoftwareDma`]: a real engine that copies bytes, in queue
//!   order, as it is polled or waited on (so reading a destination before its
//!   descriptor completed shows stale bytes, as on hardware);
//! - `udma_hexagon` (Hexagon v68+ builds only): `dmstart`/`dmlink`/`dmwait`.
//!   COMPILE-ONLY: qemu-hexagon 10 aborts on user-DMA instructions, so the
//!   simulator build leaves this engine out and nothing here runs it.
pub mod selftests;
pub mod software;
// User DMA: device skels only (qemu-hexagon aborts on it).
#[cfg(all(target_arch = "hexagon", not(feature = "sim")))]
pub mod udma_hexagon;

/// Largest value of a 16-bit descriptor field.
pub const FIELD_MAX: usize = u16::MAX as usize;

/// Chunk used when a row must be cut: the largest multiple of 128 (one HVX
/// vector) that fits a 16-bit width, so chunks stay vector-aligned.
pub const ROW_CHUNK: usize = FIELD_MAX / 128 * 128;

/// One UDMA-type-1-style 2-D transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc2d {
    /// First source byte.
    pub src: *const u8,
    /// First destination byte.
    pub dst: *mut u8,
    /// Bytes per row.
    pub roi_width: u16,
    /// Rows.
    pub roi_height: u16,
    /// Bytes between source row starts.
    pub src_stride: u16,
    /// Bytes between destination row starts.
    pub dst_stride: u16,
}

impl Desc2d {
    /// Bytes this descriptor moves.
    pub fn bytes(&self) -> usize {
        self.roi_width as usize * self.roi_height as usize
    }
}

/// A 2-D copy of any size, before it is cut into descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2d {
    /// First source byte.
    pub src: *const u8,
    /// First destination byte.
    pub dst: *mut u8,
    /// Bytes per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// Bytes between source row starts.
    pub src_stride: usize,
    /// Bytes between destination row starts.
    pub dst_stride: usize,
}

/// Where a pushed descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescState {
    /// Queued or in flight: its destination must not be read yet.
    Pending,
    /// Copied.
    Done,
}

/// Names one pushed descriptor (tickets increase in push order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// A row-window DMA engine.
pub trait DmaEngine {
    /// Queues `d`; returns `None` if the queue is full (wait, then retry).
    ///
    /// # Safety
    /// `d.src` must stay readable and `d.dst` writable (and not otherwise
    /// accessed) for the whole region until the ticket reports
    /// [`DescState::Done`].
    unsafe fn push(&mut self, d: Desc2d) -> Option<Ticket>;

    /// Lets the engine make progress and reports on `t`.
    fn poll(&mut self, t: Ticket) -> DescState;

    /// Blocks until `t` (and everything pushed before it) is done.
    fn wait(&mut self, t: Ticket);

    /// Blocks until every pushed descriptor is done.
    fn wait_all(&mut self);
}

/// Cuts `c` into descriptors that fit the 16-bit fields, calling `emit` for
/// each in order. Rows are never reordered; a zero-sized copy emits nothing.
pub fn split_2d(c: Copy2d, mut emit: impl FnMut(Desc2d)) {
    if c.width == 0 || c.height == 0 {
        return;
    }
    let fits = c.width <= FIELD_MAX && c.src_stride <= FIELD_MAX && c.dst_stride <= FIELD_MAX;
    if fits {
        let mut row = 0;
        while row < c.height {
            let rows = (c.height - row).min(FIELD_MAX);
            emit(Desc2d {
                src: c.src.wrapping_add(row * c.src_stride),
                dst: c.dst.wrapping_add(row * c.dst_stride),
                roi_width: c.width as u16,
                roi_height: rows as u16,
                src_stride: c.src_stride as u16,
                dst_stride: c.dst_stride as u16,
            });
            row += rows;
        }
        return;
    }
    for row in 0..c.height {
        let mut col = 0;
        while col < c.width {
            let w = (c.width - col).min(ROW_CHUNK);
            emit(Desc2d {
                src: c.src.wrapping_add(row * c.src_stride + col),
                dst: c.dst.wrapping_add(row * c.dst_stride + col),
                roi_width: w as u16,
                roi_height: 1,
                src_stride: 0,
                dst_stride: 0,
            });
            col += w;
        }
    }
}

/// Pushes every descriptor of `c`; when the queue is full, drains it first
/// (a real engine would stall the same way). Returns the last ticket (`None`
/// if the copy was empty) and adds the bytes moved to `*bytes`.
///
/// # Safety
/// As for [`DmaEngine::push`], for the whole of `c`.
pub unsafe fn push_copy<E: DmaEngine + ?Sized>(engine: &mut E, c: Copy2d, bytes: &mut u64) -> Option<Ticket> {
    let mut last = None;
    split_2d(c, |d| {
        *bytes += d.bytes() as u64;
        // SAFETY: forwarded from the caller.
        let t = unsafe { engine.push(d) }.unwrap_or_else(|| {
            engine.wait_all();
            // SAFETY: as above; an empty queue always accepts.
            unsafe { engine.push(d) }.expect("an empty DMA queue refused a descriptor")
        });
        last = Some(t);
    });
    last
}

//! The firmware log ring: whole frames in, bytes out.
//!
//! The defmt logger (Hexagon builds) stages each encoded frame and pushes it
//! here whole; a reader (the simulator binary dumping to stdout, or the host
//! reading shared memory on a device) drains bytes in order. A frame that
//! does not fit is dropped whole and counted, so the reader never sees half
//! a frame and the decoder never has to resynchronise.
use spinning_top::Spinlock;

/// Capacity of the global [`LOG`] ring.
pub const LOG_RING_BYTES: usize = 8192;

/// The firmware's log ring.
pub static LOG: Spinlock<LogRing<LOG_RING_BYTES>> = Spinlock::new(LogRing::new());

/// A byte ring of capacity `N` that accepts only whole frames.
pub struct LogRing<const N: usize> {
    buf: [u8; N],
    /// Index of the oldest unread byte.
    start: usize,
    /// Unread bytes.
    len: usize,
    dropped_frames: u32,
}

impl<const N: usize> LogRing<N> {
    /// An empty ring.
    pub const fn new() -> Self {
        LogRing { buf: [0; N], start: 0, len: 0, dropped_frames: 0 }
    }

    /// Appends `frame` if it fits entirely; otherwise drops it, counts it
    /// and returns false.
    pub fn push_frame(&mut self, frame: &[u8]) -> bool {
        if frame.len() > N - self.len {
            self.dropped_frames = self.dropped_frames.saturating_add(1);
            return false;
        }
        let end = (self.start + self.len) % N;
        let first = frame.len().min(N - end);
        self.buf[end..end + first].copy_from_slice(&frame[..first]);
        self.buf[..frame.len() - first].copy_from_slice(&frame[first..]);
        self.len += frame.len();
        true
    }

    /// Counts a frame the writer had to drop before pushing it.
    pub fn note_dropped(&mut self) {
        self.dropped_frames = self.dropped_frames.saturating_add(1);
    }

    /// Moves up to `out.len()` of the oldest bytes into `out`; returns how
    /// many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len);
        let first = n.min(N - self.start);
        out[..first].copy_from_slice(&self.buf[self.start..self.start + first]);
        out[first..n].copy_from_slice(&self.buf[..n - first]);
        self.start = (self.start + n) % N;
        self.len -= n;
        n
    }

    /// Unread bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Frames dropped because the ring was full.
    pub fn dropped_frames(&self) -> u32 {
        self.dropped_frames
    }
}

impl<const N: usize> Default for LogRing<N> {
    fn default() -> Self {
        Self::new()
    }
}

use crate::selftest::TestResult;
use crate::{check, check_eq};

fn frames_come_out_in_order() -> TestResult {
    let mut ring = LogRing::<16>::new();
    check!(ring.push_frame(b"abc\0"));
    check!(ring.push_frame(b"de\0"));
    let mut out = [0u8; 16];
    check_eq!(ring.read(&mut out), 7);
    check_eq!(&out[..7], b"abc\0de\0");
    check!(ring.is_empty());
    Ok(())
}

fn frames_wrap_around_the_end() -> TestResult {
    let mut ring = LogRing::<8>::new();
    let mut out = [0u8; 8];
    check!(ring.push_frame(b"12345\0"));
    check_eq!(ring.read(&mut out[..4]), 4);
    check_eq!(&out[..4], b"1234");
    // 2 unread bytes; this frame starts at index 6 and wraps to index 0.
    check!(ring.push_frame(b"wxyz\0"));
    check_eq!(ring.len(), 7);
    check_eq!(ring.read(&mut out), 7);
    check_eq!(&out[..7], b"5\0wxyz\0");
    Ok(())
}

fn full_ring_drops_whole_frames() -> TestResult {
    let mut ring = LogRing::<8>::new();
    check!(ring.push_frame(b"12345\0"));
    check!(!ring.push_frame(b"abc\0"), "a frame larger than the free space was accepted");
    check!(!ring.push_frame(&[7u8; 9]), "a frame larger than the ring was accepted");
    check_eq!(ring.dropped_frames(), 2);
    check!(ring.push_frame(b"a\0"), "a frame that fits exactly was refused");
    let mut out = [0u8; 8];
    check_eq!(ring.read(&mut out), 8);
    check_eq!(&out, b"12345\0a\0");
    Ok(())
}

crate::selftests!(frames_come_out_in_order, frames_wrap_around_the_end, full_ring_drops_whole_frames);

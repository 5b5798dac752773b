//! defmt's global logger: each frame is staged, then pushed whole into the
//! log ring ([`super::log_ring::LOG`]).
//!
//! The frame staging and the encoder are guarded by a spinlock held from
//! `acquire` to `release`, as defmt requires (no interleaved frames).
use super::log_ring::LOG;
use core::cell::UnsafeCell;
use spinning_top::lock_api::RawMutex;
use spinning_top::RawSpinlock;

/// Longest frame kept; longer frames are dropped and counted.
const MAX_FRAME_BYTES: usize = 256;

struct Staging {
    encoder: defmt::Encoder,
    frame: heapless::Vec<u8, MAX_FRAME_BYTES>,
    overflow: bool,
}

struct Guarded(UnsafeCell<Staging>);
// SAFETY: only touched between LOCK.lock() and LOCK.unlock().
unsafe impl Sync for Guarded {}

static LOCK: RawSpinlock = RawSpinlock::INIT;
static STAGING: Guarded =
    Guarded(UnsafeCell::new(Staging { encoder: defmt::Encoder::new(), frame: heapless::Vec::new(), overflow: false }));

#[defmt::global_logger]
struct RingLogger;

fn stage(s: &mut heapless::Vec<u8, MAX_FRAME_BYTES>, overflow: &mut bool, bytes: &[u8]) {
    if s.extend_from_slice(bytes).is_err() {
        *overflow = true;
    }
}

// SAFETY: acquire/release bracket every frame with LOCK; the staging state
// is touched only in between.
unsafe impl defmt::Logger for RingLogger {
    fn acquire() {
        LOCK.lock();
        // SAFETY: LOCK is held.
        let s = unsafe { &mut *STAGING.0.get() };
        s.frame.clear();
        s.overflow = false;
        let (frame, overflow) = (&mut s.frame, &mut s.overflow);
        s.encoder.start_frame(|b| stage(frame, overflow, b));
    }

    unsafe fn flush() {}

    unsafe fn release() {
        let s = &mut *STAGING.0.get();
        let (frame, overflow) = (&mut s.frame, &mut s.overflow);
        s.encoder.end_frame(|b| stage(frame, overflow, b));
        let mut ring = LOG.lock();
        if s.overflow {
            ring.note_dropped();
        } else {
            ring.push_frame(&s.frame);
        }
        drop(ring);
        LOCK.unlock();
    }

    unsafe fn write(bytes: &[u8]) {
        let s = &mut *STAGING.0.get();
        let (frame, overflow) = (&mut s.frame, &mut s.overflow);
        s.encoder.write(bytes, |b| stage(frame, overflow, b));
    }
}

use crate::selftest::TestResult;
use crate::{check, check_eq};

/// A defmt message becomes one frame in the ring: rzcobs-encoded, so it
/// ends in the 0 delimiter. The host decodes these frames in
/// `host/src/npu/firmware_log.rs`.
fn defmt_frames_land_in_ring() -> TestResult {
    let before = LOG.lock().len();
    defmt::info!("selftest log frame: {=u32} + {=u32}", 40, 2);
    let after = LOG.lock().len();
    check!(after > before + 2, "ring grew from {} to {} bytes", before, after);
    check_eq!(LOG.lock().dropped_frames(), 0);
    Ok(())
}

crate::selftests!(defmt_frames_land_in_ring);

//! Memory sizes per target: the firmware heap and the VTCM a session takes.
//!
//! Tests open sessions with these same constants (natively the VTCM stand-in
//! is host memory of the device's size), so a size that does not fit shows
//! up in `cargo test`, not first on a phone.
//!
//! | target | heap | session VTCM | VTCM from |
//! |---|---|---|---|
//! | v73 / v75 / v79 skel | 8 MiB | 8 MiB | `HAP_compute_res_acquire` |
//! | v68 skel | 8 MiB | 4 MiB | `HAP_compute_res_acquire` |
//! | simulator (qemu-hexagon) | 8 MiB | 2 MiB | the linker's `.vtcm` section |
//! | native (tests, in-process) | std's | as the device | heap memory |
//!
//! The heap holds only small, bounded state (the resident table, row lists,
//! DMA descriptors): weights stay in the host's mapping and activations in
//! the call's buffers, so 8 MiB is ample; every allocation whose size comes
//! from the host is fallible. VTCM sizes are those the Hexagon SDK documents
//! per generation (not checked on a device here).

/// Bytes of the firmware heap arena (Hexagon builds).
pub const HEAP_BYTES: usize = 8 << 20;

/// VTCM a device session reserves.
pub const DEVICE_VTCM_BYTES: usize = if cfg!(feature = "v68") { 4 << 20 } else { 8 << 20 };

/// VTCM of the simulator build: the size of `.vtcm` in linker/hexagon-sim.x.
pub const SIM_VTCM_BYTES: usize = 2 << 20;

/// VTCM a session of this build reserves.
pub const SESSION_VTCM_BYTES: usize = if cfg!(feature = "sim") { SIM_VTCM_BYTES } else { DEVICE_VTCM_BYTES };

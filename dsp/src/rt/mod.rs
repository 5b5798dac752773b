//! Firmware runtime: heap, log ring, defmt logger and (for the simulator
//! build) the Linux entry point and system calls qemu-hexagon provides.
//!
//! Everything here except the Hexagon-only files is plain Rust that also
//! runs, and is tested, natively.
pub mod heap;
pub mod limits;
pub mod log_ring;

#[cfg(target_arch = "hexagon")]
mod defmt_logger;
#[cfg(all(target_arch = "hexagon", feature = "sim"))]
pub mod linux;
#[cfg(all(target_arch = "hexagon", not(feature = "sim")))]
mod panic_device;

/// Self-tests that only make sense on Hexagon (the defmt logger); empty
/// natively.
#[cfg(target_arch = "hexagon")]
pub use defmt_logger::SELFTESTS as PLATFORM_SELFTESTS;
/// Self-tests that only make sense on Hexagon (the defmt logger); empty
/// natively.
#[cfg(not(target_arch = "hexagon"))]
pub const PLATFORM_SELFTESTS: &[crate::selftest::SelfTest] = &[];

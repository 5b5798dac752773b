//! hexlora-dsp: the firmware that serves frozen-weight projections.
//!
//! - [`rt`]: heap, log ring, defmt logger, simulator entry point;
//! - [`skel`]: the FastRPC skel dispatch (`hexlora_skel_handle_invoke`);
//! - [`selftest`]: the test registry that runs natively and under
//!   qemu-hexagon.
#![cfg_attr(not(test), no_std)]
#![cfg_attr(target_arch = "hexagon", feature(asm_experimental_arch))]
#![deny(missing_docs)]

extern crate alloc;

pub mod rt;
pub mod selftest;
pub mod skel;

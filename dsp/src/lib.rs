//! hexlora-dsp: the firmware that serves frozen-weight projections.
//!
//! - [`rt`]: heap, log ring, defmt logger, simulator entry point;
//! - [`skel`]: the FastRPC skel dispatch (`hexlora_skel_handle_invoke`);
//! - [`selftest`]: the test registry that runs natively and under
//!   qemu-hexagon;
//! - [`kernels`]: the frozen-projection op (forward and input-gradient, FP16
//!   and Q8_0) over [`vtcm`], [`dma`], [`hvx`] and [`tile`];
//! - [`service`]: the request loop the skel calls.
// `std` (host builds only) lets the software tile engine pick x86 vector
// code at run time; the firmware itself never needs it.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![cfg_attr(target_arch = "hexagon", feature(asm_experimental_arch, stdarch_hexagon, hexagon_target_feature))]
#![deny(missing_docs)]

extern crate alloc;

pub mod rt;
pub mod selftest;
pub mod skel;

/// Hexagon SDK bindings (feature `sdk`, needs `HEXAGON_SDK_ROOT`).
#[cfg(feature = "sdk")]
#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, missing_docs)]
pub mod sdk {
    include!(concat!(env!("OUT_DIR"), "/sdk.rs"));
}

pub mod dma;
pub mod hvx;
pub mod kernels;
pub mod service;
pub mod tile;
pub mod vtcm;

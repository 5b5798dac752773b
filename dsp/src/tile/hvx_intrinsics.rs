//! The real HVX v68+ instructions behind [`HvxFloat`], from
//! `core::arch::hexagon::v128` (128-byte vectors). Selected on Hexagon
//! builds with `hvxv68`, `hvx-ieee-fp` and `hvx-length128b` (v68 and later:
//! ci/build-skel.sh's flags); compile-only here (see [`super::hvx_float`]).
use super::hvx_float::HvxFloat;
use core::arch::hexagon::v128::{
    q6_v_hi_w, q6_v_lo_w, q6_v_vsplat_r, q6_v_vzero, q6_vsf_vadd_vsfvsf, q6_w_vcombine_vv,
    q6_wsf_vmpyacc_wsfvhfvhf, HvxVector, HvxVectorPair,
};
use half::f16;

/// The intrinsics as an [`HvxFloat`] implementation.
pub struct Intrinsics;

// SAFETY (every `unsafe` block below): the module is compiled only when the
// target has HVX v68 with IEEE float and 128-byte vectors, which is all these
// intrinsics require; the loads and stores read or write exactly the 128
// bytes of the array they are given, unaligned (`vmemu`).
impl HvxFloat for Intrinsics {
    type V = HvxVector;
    type W = HvxVectorPair;

    #[inline(always)]
    fn load_sf(row: &[f32; 32]) -> HvxVector {
        unsafe { core::ptr::read_unaligned(row.as_ptr() as *const HvxVector) }
    }

    #[inline(always)]
    fn load_hf(row: &[f16; 64]) -> HvxVector {
        unsafe { core::ptr::read_unaligned(row.as_ptr() as *const HvxVector) }
    }

    #[inline(always)]
    fn store_sf(row: &mut [f32; 32], v: HvxVector) {
        unsafe { core::ptr::write_unaligned(row.as_mut_ptr() as *mut HvxVector, v) }
    }

    #[inline(always)]
    fn zero() -> HvxVector {
        unsafe { q6_v_vzero() }
    }

    #[inline(always)]
    fn splat(rt: u32) -> HvxVector {
        unsafe { q6_v_vsplat_r(rt as i32) }
    }

    #[inline(always)]
    fn combine(hi: HvxVector, lo: HvxVector) -> HvxVectorPair {
        unsafe { q6_w_vcombine_vv(hi, lo) }
    }

    #[inline(always)]
    fn lo(w: HvxVectorPair) -> HvxVector {
        unsafe { q6_v_lo_w(w) }
    }

    #[inline(always)]
    fn hi(w: HvxVectorPair) -> HvxVector {
        unsafe { q6_v_hi_w(w) }
    }

    #[inline(always)]
    fn vmpyacc_sf_hf(xx: HvxVectorPair, u: HvxVector, v: HvxVector) -> HvxVectorPair {
        unsafe { q6_wsf_vmpyacc_wsfvhfvhf(xx, u, v) }
    }

    #[inline(always)]
    fn vadd_sf(u: HvxVector, v: HvxVector) -> HvxVector {
        unsafe { q6_vsf_vadd_vsfvsf(u, v) }
    }
}

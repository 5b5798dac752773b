//! The HVX floating-point tile engine (Hexagon v68+): `acc += act * weight`
//! on 32x32 FP16 tiles with IEEE `Vxx.sf += vmpy(Vu.hf, Vv.hf)`.
//!
//! The algorithm is written once, over the [`HvxFloat`] instructions, and
//! runs on two implementations of them:
//!
//! - [`super::hvx_model::Model`]: bit-level models of the instructions from
//!   their reference definitions, on any target. Natively and under
//!   qemu-hexagon the engine's code runs over these and is tested;
//! - `hvx_intrinsics::Intrinsics` (Hexagon builds with `hvxv68` and
//!   `hvx-ieee-fp`): the real instructions through `core::arch::hexagon::v128`.
//!   Compile-checked only (ci/hvx-float-check.sh finds the instructions in
//!   the v73 build's loop): no simulator here executes HVX float and no
//!   device is available, so the instructions' behaviour on hardware is
//!   taken from the models' reference, not verified.
//!
//! # Schedule
//! The 16 weight vectors (vector `r` = weight row `r` of the tile layout:
//! halfword `2j + e` is element `(2r + e, j)`) are loaded once per tile.
//! For each activation row `m`:
//!
//! ```text
//! Vxx = vcombine(vzero, vmemu(acc[m]))           // v[0] = acc row, v[1] = +0
//! for r in 0..16:
//!     Vu  = vsplat(act[m][2r] | act[m][2r+1] << 16)   // the hf pair in every word
//!     Vxx.sf += vmpy(Vu.hf, W[r].hf)             // v[0][j] += a[m][2r]   * w[2r][j]
//!                                                // v[1][j] += a[m][2r+1] * w[2r+1][j]
//! vmemu(acc[m]) = vadd(Vxx.v[0].sf, Vxx.v[1].sf)
//! ```
//!
//! That is the summation order of the tile module docs ([`super`]): two
//! chains per output, the even reduction steps on top of the incoming
//! accumulator, the odd ones from +0, then one add. Every product is exact,
//! so each chain step is one IEEE round-to-nearest-even f32 add, and
//! [`super::software::SoftwareTiles`] performs the same adds in the same
//! order: the two engines are bit-identical (tested).
use super::{AccTile, TileEngine, TILE_DIM};
use crate::hvx::Tile;
use core::marker::PhantomData;
use half::f16;

/// The HVX instructions the engine uses (128-byte vectors). Each method
/// names its instruction; [`super::hvx_model`] defines what they compute.
pub trait HvxFloat {
    /// One vector register (`HVX_Vector`).
    type V: Copy;
    /// A register pair (`HVX_VectorPair`): `v[0]` low, `v[1]` high.
    type W: Copy;
    /// `Vd = vmemu(Rt)`: 32 f32 values.
    fn load_sf(row: &[f32; 32]) -> Self::V;
    /// `Vd = vmemu(Rt)`: 64 FP16 values.
    fn load_hf(row: &[f16; 64]) -> Self::V;
    /// `vmemu(Rt) = Vs`: 32 f32 values.
    fn store_sf(row: &mut [f32; 32], v: Self::V);
    /// `Vd = vzero()` (`Q6_V_vzero`).
    fn zero() -> Self::V;
    /// `Vd = vsplat(Rt)` (`Q6_V_vsplat_R`): `rt` in every word.
    fn splat(rt: u32) -> Self::V;
    /// `Vdd = vcombine(Vu, Vv)` (`Q6_W_vcombine_VV`): `v[1] = hi`, `v[0] = lo`.
    fn combine(hi: Self::V, lo: Self::V) -> Self::W;
    /// `v[0]` of a pair (`Q6_V_lo_W`).
    fn lo(w: Self::W) -> Self::V;
    /// `v[1]` of a pair (`Q6_V_hi_W`).
    fn hi(w: Self::W) -> Self::V;
    /// `Vxx.sf += vmpy(Vu.hf, Vv.hf)` (`Q6_Wsf_vmpyacc_WsfVhfVhf`).
    fn vmpyacc_sf_hf(xx: Self::W, u: Self::V, v: Self::V) -> Self::W;
    /// `Vd.sf = vadd(Vu.sf, Vv.sf)` (`Q6_Vsf_vadd_VsfVsf`).
    fn vadd_sf(u: Self::V, v: Self::V) -> Self::V;
}

/// The HVX float tile engine over the instructions `H`.
pub struct HvxFloatTiles<H> {
    tiles: u64,
    isa: PhantomData<H>,
}

impl<H: HvxFloat> HvxFloatTiles<H> {
    /// A fresh engine.
    pub fn new() -> HvxFloatTiles<H> {
        HvxFloatTiles {
            tiles: 0,
            isa: PhantomData,
        }
    }
}

impl<H: HvxFloat> Default for HvxFloatTiles<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: HvxFloat> TileEngine for HvxFloatTiles<H> {
    fn mac(&mut self, acc: &mut AccTile, act: &Tile, weight: &Tile) {
        self.tiles += 1;
        mac_tile::<H>(acc, act, weight);
    }

    fn tiles(&self) -> u64 {
        self.tiles
    }
}

/// One tile product, the schedule in the module docs. Kept out of line so
/// the firmware image has one symbol holding the hot loop
/// (`hexlora_dsp::tile::hvx_float::mac_tile`, which ci/hvx-float-check.sh
/// disassembles).
#[inline(never)]
pub fn mac_tile<H: HvxFloat>(acc: &mut AccTile, act: &Tile, weight: &Tile) {
    let w: [H::V; 16] =
        core::array::from_fn(|r| H::load_hf(weight[r * 64..][..64].try_into().unwrap()));
    for m in 0..TILE_DIM {
        let row: &mut [f32; 32] = (&mut acc[m * TILE_DIM..][..TILE_DIM]).try_into().unwrap();
        let a = &act[m * TILE_DIM..][..TILE_DIM];
        let mut xx = H::combine(H::zero(), H::load_sf(row));
        for (r, &wr) in w.iter().enumerate() {
            let pair = u32::from(a[2 * r].to_bits()) | u32::from(a[2 * r + 1].to_bits()) << 16;
            xx = H::vmpyacc_sf_hf(xx, H::splat(pair), wr);
        }
        H::store_sf(row, H::vadd_sf(H::lo(xx), H::hi(xx)));
    }
}

/// The engine's instruction schedule, counted for the modelled speed in
/// `examples/kernel_plan.rs`: HVX instructions per tile product, by kind.
/// These are counts of the source schedule above, not of compiled code.
pub mod schedule {
    /// `vmemu` loads of weight vectors (once per tile).
    pub const WEIGHT_LOADS: u32 = 16;
    /// `vmemu` loads of accumulator rows.
    pub const ACC_LOADS: u32 = 32;
    /// `vmemu` stores of accumulator rows.
    pub const ACC_STORES: u32 = 32;
    /// `vsplat` of an activation pair (class CVI_VX_LATE, slots 2/3).
    pub const SPLATS: u32 = 32 * 16;
    /// `vmpy` accumulates (class CVI_VX_DV, slots 2/3, both multiply units).
    pub const VMPYACCS: u32 = 32 * 16;
    /// `vadd` of the two chains (class CVI_VX, slots 2/3).
    pub const VADDS: u32 = 32;
    /// `vzero` + `vcombine` per row (register moves the compiler can fold).
    pub const MOVES: u32 = 32 * 2;
    /// Floating-point operations per tile product (multiply and add).
    pub const FLOPS: u32 = 2 * 32 * 32 * 32;
}

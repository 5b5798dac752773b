//! The tile engine: a model of HMX, the Hexagon matrix unit.
//!
//! HMX multiplies 32x32 FP16 tiles (2048 bytes each) held in VTCM:
//! `acc (m x j) += act (m x i) * weight (i x j)`, `i` the reduction index.
//! The two operands use different layouts:
//!
//! - activation tile: row-major, element `(m, i)` at `m * 32 + i`;
//! - weight tile: reduction index in pairs, element `(i, j)` at
//!   `(i / 2) * 64 + j * 2 + i % 2` ([`weight_index`]): each 128-byte row
//!   holds two consecutive reduction steps for all 32 output columns.
//!
//! [`TileEngine`] is the trait a real HMX implementation would fill. Two
//! engines implement it:
//!
//! - [`software::SoftwareTiles`]: f32 code, used natively and under
//!   qemu-hexagon (which has no HMX and no HVX float); on x86-64 hosts
//!   (feature `std`) the same adds run on AVX-512 or AVX2 vectors;
//! - [`hvx_float::HvxFloatTiles`]: HVX v68+ IEEE float vectors
//!   (`Vxx.sf += vmpy(Vu.hf, Vv.hf)`), over the real instructions on v68+
//!   builds ([`DeviceTiles`]) or over [`hvx_model`]'s bit-level models of
//!   them anywhere (how it is tested).
//!
//! # Summation order (every engine)
//! Each product of two FP16 values is exact in f32. For output `(m, j)` of
//! one tile product, with `p(i) = act(m, i) * weight(i, j)`:
//!
//! ```text
//! even = acc(m, j) + p(0) + p(2) + ... + p(30)     // left to right, f32
//! odd  = +0        + p(1) + p(3) + ... + p(31)     // left to right, f32
//! acc(m, j) = even + odd
//! ```
//!
//! every `+` one IEEE f32 add rounded to nearest even. This is the order the
//! HVX schedule produces naturally (the weight layout puts reduction steps
//! `2r` and `2r + 1` in the even and odd halfwords of one vector, and the
//! widening multiply sends those to two accumulator registers), and the
//! software engine performs exactly the same adds, so both engines give the
//! same bits; the tests check it. Tiles are summed in the order the kernels
//! issue them.
use crate::hvx::{Tile, TILE_ELEMS};

pub mod hvx_float;
#[cfg(all(target_arch = "hexagon", target_feature = "hvxv68", target_feature = "hvx-ieee-fp", target_feature = "hvx-length128b"))]
pub mod hvx_intrinsics;
pub mod hvx_model;
pub mod software;

/// The tile engine the firmware runs on this build: the HVX float engine on
/// the real instructions when compiling for Hexagon with HVX v68+ IEEE float
/// (ci/build-skel.sh's v68/v73/v75/v79 flags), the software engine otherwise
/// (native builds, the v67 simulator build). Both give the same bits.
#[cfg(all(target_arch = "hexagon", target_feature = "hvxv68", target_feature = "hvx-ieee-fp", target_feature = "hvx-length128b"))]
pub type DeviceTiles = hvx_float::HvxFloatTiles<hvx_intrinsics::Intrinsics>;
/// The tile engine the firmware runs on this build: the software engine
/// here (the HVX float engine on Hexagon v68+ builds).
#[cfg(not(all(target_arch = "hexagon", target_feature = "hvxv68", target_feature = "hvx-ieee-fp", target_feature = "hvx-length128b")))]
pub type DeviceTiles = software::SoftwareTiles;

/// Which engine [`DeviceTiles`] is on this build: `"hvx-float"` or `"software"`.
pub const DEVICE_TILES: &str = if cfg!(all(
    target_arch = "hexagon",
    target_feature = "hvxv68",
    target_feature = "hvx-ieee-fp",
    target_feature = "hvx-length128b"
)) {
    "hvx-float"
} else {
    "software"
};

/// Bytes of one FP16 tile.
pub const TILE_BYTES: usize = 2048;

/// Rows and columns of a tile.
pub const TILE_DIM: usize = 32;

/// One 32x32 FP32 accumulator tile, row-major `(m, j)`.
pub type AccTile = [f32; TILE_ELEMS];

/// Position of weight element `(i, j)` (reduction `i`, output `j`).
#[inline]
pub const fn weight_index(i: usize, j: usize) -> usize {
    (i / 2) * 64 + j * 2 + i % 2
}

/// A matrix engine over 32x32 FP16 tiles.
pub trait TileEngine {
    /// `acc += act * weight` with the layouts in the module docs.
    fn mac(&mut self, acc: &mut AccTile, act: &Tile, weight: &Tile);

    /// Tile products done since creation.
    fn tiles(&self) -> u64;
}

pub mod selftests;

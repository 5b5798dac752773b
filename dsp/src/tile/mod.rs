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
//! [`TileEngine`] is the trait a real HMX implementation would fill;
//! [`software::SoftwareTiles`] is the tested software model used natively and
//! under qemu-hexagon (which has no HMX).
use crate::hvx::{Tile, TILE_ELEMS};

pub mod software;

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

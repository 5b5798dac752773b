//! The software tile engine.
//!
//! Each product `a * w` of two f16 values is exact in f32 (11 + 11
//! significant bits), and every output element sums its products in f32 in
//! the fixed order of the tile module docs ([`super`]): within a tile an
//! even chain (reduction steps 0, 2, .., 30 on top of the accumulator) and
//! an odd chain (1, 3, .., 31 from +0), then their sum; tiles in the order
//! the kernel issues them. That order, plain IEEE f32 adds (Rust never fuses
//! them) and no reassociation make results bit-identical on every host,
//! under qemu-hexagon, and with the HVX float engine, whose schedule yields
//! the same order.
//!
//! How this differs from a real HMX: HMX sums a tile's 32 products in its own
//! wider internal accumulator (not IEEE f32, with its own rounding and
//! summation tree) and converts to FP16 on read-out through a per-column
//! scale/bias stage, so device results differ from these in the low bits and
//! are FP16, where ours stay f32 until unscaled. The kernels' overflow rule
//! (partial sums must stay under 60000) is what keeps the FP16 read-out of a
//! real HMX finite, so the same rule is applied here.
use super::{weight_index, AccTile, TileEngine, TILE_DIM};
use crate::hvx::{Tile, TILE_ELEMS};

/// The software model of HMX.
#[derive(Default)]
pub struct SoftwareTiles {
    tiles: u64,
}

impl SoftwareTiles {
    /// A fresh engine.
    pub fn new() -> SoftwareTiles {
        SoftwareTiles::default()
    }
}

/// The weight tile widened to f32, row-major `(i, j)`.
fn widen_weight(weight: &Tile) -> [f32; TILE_ELEMS] {
    let mut w = [0f32; TILE_ELEMS];
    for i in 0..TILE_DIM {
        for j in 0..TILE_DIM {
            w[i * TILE_DIM + j] = weight[weight_index(i, j)].to_f32();
        }
    }
    w
}

impl TileEngine for SoftwareTiles {
    fn mac(&mut self, acc: &mut AccTile, act: &Tile, weight: &Tile) {
        self.tiles += 1;
        let w = widen_weight(weight);
        for m in 0..TILE_DIM {
            let row = &mut acc[m * TILE_DIM..(m + 1) * TILE_DIM];
            let mut even = [0f32; TILE_DIM];
            even.copy_from_slice(row);
            let mut odd = [0f32; TILE_DIM];
            for r in 0..TILE_DIM / 2 {
                let (i0, i1) = (2 * r, 2 * r + 1);
                let (a0, a1) = (act[m * TILE_DIM + i0].to_f32(), act[m * TILE_DIM + i1].to_f32());
                let (w0, w1) = (&w[i0 * TILE_DIM..][..TILE_DIM], &w[i1 * TILE_DIM..][..TILE_DIM]);
                for j in 0..TILE_DIM {
                    even[j] += a0 * w0[j];
                    odd[j] += a1 * w1[j];
                }
            }
            for j in 0..TILE_DIM {
                row[j] = even[j] + odd[j];
            }
        }
    }

    fn tiles(&self) -> u64 {
        self.tiles
    }
}

//! Forward `Y = X W^T`: stripe `s` is rows `32s..32s+32` of W (32 output
//! features) across all `cols`, tile `db` of it holding reduction columns
//! `32db..32db+32`.
//!
//! - FP16: one 2-D descriptor per tile gathers the 32x32 block (64-byte rows,
//!   source stride `cols * 2`) into 2048 contiguous VTCM bytes; HVX
//!   [`hvx::weight_from_rows`] turns it into a weight tile in place.
//! - Q8_0: one descriptor moves the 32 Q8_0 rows; [`dequantize_tile`] makes
//!   each 32x32 FP16 block, then the same HVX shuffle.
//!
//! Buffer shapes: window FP16 `(db, 32, 32)` f16 tiles; Q8 `(32, cols/32*34)`
//! bytes; output tiles `(db)` weight-layout tiles.
use super::plan::q8_row_bytes;
use super::{dequantize_tile, tile_mut, Plan, Precision, ResidentWeight, WeightData, BLOCK_BYTES};
use crate::dma::{push_copy, Copy2d, DmaEngine, Ticket};
use crate::hvx::{self, TILE_ELEMS};
use crate::tile::TILE_BYTES;
use half::f16;

/// Pushes the descriptors of stripe `s` into `win`.
///
/// # Safety
/// `win` must not be accessed until the returned ticket is done.
pub(super) unsafe fn fetch(
    plan: &Plan,
    w: &ResidentWeight<'_>,
    s: usize,
    win: &mut [u8],
    dma: &mut dyn DmaEngine,
    bytes: &mut u64,
) -> Option<Ticket> {
    let rows = (plan.w_rows - s * 32).min(32);
    let cols = plan.w_cols;
    let mut last = None;
    match w.data() {
        WeightData::Fp16(data) => {
            if rows < 32 || cols % 32 != 0 {
                // Padding must read as zero; the previous stripe's shuffled
                // tiles are still in this window.
                win.fill(0);
            }
            for db in 0..plan.db {
                let c = Copy2d {
                    src: data[s * 32 * cols + db * 32..].as_ptr() as *const u8,
                    dst: win[db * TILE_BYTES..].as_mut_ptr(),
                    width: (cols - db * 32).min(32) * 2,
                    height: rows,
                    src_stride: cols * 2,
                    dst_stride: 64,
                };
                // SAFETY: forwarded from the caller; W outlives the op.
                last = unsafe { push_copy(dma, c, bytes) }.or(last);
            }
        }
        WeightData::Q8_0(data) => {
            let rb = q8_row_bytes(cols);
            let c = Copy2d {
                src: data[s * 32 * rb..].as_ptr(),
                dst: win.as_mut_ptr(),
                width: rb,
                height: rows,
                src_stride: rb,
                dst_stride: rb,
            };
            // SAFETY: as above.
            last = unsafe { push_copy(dma, c, bytes) };
        }
    }
    last
}

/// Turns the fetched window of stripe `s` into `db` weight tiles; returns them.
pub(super) fn build<'t>(plan: &Plan, s: usize, win: &'t mut [u8], dequant: &'t mut [f16]) -> &'t [f16] {
    let tiles: &'t mut [f16] = match plan.precision {
        Precision::Fp16 => bytemuck::cast_slice_mut(win),
        Precision::Q8_0 => {
            let rb = q8_row_bytes(plan.w_cols);
            // Rows past the end of W were not fetched (stale bytes from the
            // previous stripe): dequantize_tile zeroes them.
            let valid = (plan.w_rows - s * 32).min(32);
            for db in 0..plan.db {
                dequantize_tile(&win[db * BLOCK_BYTES..], rb, valid, tile_mut(dequant, db));
            }
            dequant
        }
    };
    for db in 0..plan.db {
        hvx::weight_from_rows(tile_mut(tiles, db));
    }
    &tiles[..plan.db * TILE_ELEMS]
}

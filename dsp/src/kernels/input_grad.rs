//! Input gradient `dX = dY W`: stripe `s` is columns `32s..32s+32` of W (32
//! output features of dX) down all `rows`, tile `db` of it holding reduction
//! rows `32db..32db+32`. W is never copied or transposed in DDR: each stripe
//! is one 2-D descriptor over the resident row-major W.
//!
//! - FP16: the descriptor (64-byte rows, source stride `cols * 2`, height
//!   `rows`) lands as `db` contiguous 32x32 blocks whose rows run along the
//!   reduction index; HVX [`hvx::weight_from_cols`] (the row-pair interleave)
//!   makes the transposed weight tiles in place.
//! - Q8_0, operand roles swapped: `(dX)^T = W^T dY^T`. The descriptor
//!   gathers block column `s` (34-byte rows, source stride `cols/32*34`);
//!   [`dequantize_tile`] (the forward's code path) makes each 32x32 FP16
//!   block and HVX [`hvx::transpose`] turns it into the activation tile of
//!   `W^T`; `dY^T` was laid out as weight tiles when the chunk was staged.
//!
//! Buffer shapes: window FP16 `(db, 32, 32)` f16; Q8 `(db * 32, 34)` bytes;
//! tiles `(db)`.
use super::plan::q8_row_bytes;
use super::{dequantize_tile, tile_mut, Plan, Precision, ResidentWeight, WeightData, BLOCK_BYTES};
use crate::dma::{push_copy, Copy2d, DmaEngine, Ticket};
use crate::hvx::{self, TILE_ELEMS};
use half::f16;

/// Pushes the descriptor of stripe `s` into `win`.
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
    let rows = plan.w_rows;
    let cols = plan.w_cols;
    let c = match w.data() {
        WeightData::Fp16(data) => {
            let width = (cols - s * 32).min(32);
            if width < 32 || rows % 32 != 0 {
                win.fill(0);
            }
            Copy2d {
                src: data[s * 32..].as_ptr() as *const u8,
                dst: win.as_mut_ptr(),
                width: width * 2,
                height: rows,
                src_stride: cols * 2,
                dst_stride: 64,
            }
        }
        WeightData::Q8_0(data) => {
            let rb = q8_row_bytes(cols);
            Copy2d {
                src: data[s * BLOCK_BYTES..].as_ptr(),
                dst: win.as_mut_ptr(),
                width: BLOCK_BYTES,
                height: rows,
                src_stride: rb,
                dst_stride: BLOCK_BYTES,
            }
        }
    };
    // SAFETY: forwarded from the caller; W outlives the op.
    unsafe { push_copy(dma, c, bytes) }
}

/// Turns the fetched window into `db` tiles (weight tiles for FP16,
/// activation tiles of `W^T` for Q8_0); returns them.
pub(super) fn build<'t>(plan: &Plan, win: &'t mut [u8], dequant: &'t mut [f16]) -> &'t [f16] {
    match plan.precision {
        Precision::Fp16 => {
            let tiles: &'t mut [f16] = bytemuck::cast_slice_mut(win);
            for db in 0..plan.db {
                hvx::weight_from_cols(tile_mut(tiles, db));
            }
            &tiles[..plan.db * TILE_ELEMS]
        }
        Precision::Q8_0 => {
            for db in 0..plan.db {
                let valid = (plan.w_rows - db * 32).min(32);
                let tile = tile_mut(dequant, db);
                dequantize_tile(&win[db * 32 * BLOCK_BYTES..], BLOCK_BYTES, valid, tile);
                hvx::transpose(tile);
            }
            &dequant[..plan.db * TILE_ELEMS]
        }
    }
}

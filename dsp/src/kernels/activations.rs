//! Activations in and results out: per-row power-of-two scaling to FP16
//! tiles, and exact unscaling of the f32 results.
use super::pass::Op;
use super::tile_mut as tile_at;
use super::KernelError;
use crate::dma::{push_copy, Copy2d};
use crate::hvx;
use hexlora_proto::f16::to_f16;
use hexlora_proto::rescale::{first_exponent, retry_exponent, scale_pow2};

/// Splits ascending `rows` into runs of consecutive indices: `(position in
/// rows, first row, length)`.
pub(super) fn runs(rows: &[u32]) -> impl Iterator<Item = (usize, u32, usize)> + '_ {
    let mut i = 0;
    core::iter::from_fn(move || {
        if i == rows.len() {
            return None;
        }
        let start = i;
        while i + 1 < rows.len() && rows[i + 1] == rows[i] + 1 {
            i += 1;
        }
        i += 1;
        Some((start, rows[start], i - start))
    })
}

/// Input rows staged in VTCM at a time (f32, full width).
pub(super) const STAGE_ROWS: usize = 8;

/// Moves the group's input rows into VTCM, one token block at a time, and
/// converts each row to FP16 tiles at its scale `2^k` (k lowered by 8 per
/// retry). Fails on the first NaN or infinity.
pub(super) fn stage_group(op: &mut Op<'_>, group: &[u32], retry: u32) -> Result<(), KernelError> {
    for (tb, block) in group.chunks(32).enumerate() {
        for (part, rows) in block.chunks(STAGE_ROWS).enumerate() {
            stage_rows(op, rows)?;
            for (i, &token) in rows.iter().enumerate() {
                let r = part * STAGE_ROWS + i;
                let row = &op.v.stage[i * op.plan.d..(i + 1) * op.plan.d];
                let k = row_scale(row, op.w.max_abs(), token, retry)?;
                convert_row(op, tb, r, Some(i), k);
            }
        }
        for r in block.len()..32 {
            convert_row(op, tb, r, None, 0);
        }
        if op.plan.precision == super::Precision::Q8_0 && op.plan.direction == super::Direction::InputGrad {
            // dY^T is the weight operand: rows of the block run along the
            // output index (tokens), so the forward weight-tile shuffle fits.
            for db in 0..op.plan.db {
                hvx::weight_from_rows(tile_at(op.v.act, tb * op.plan.db + db));
            }
        }
    }
    Ok(())
}

/// DMAs up to [`STAGE_ROWS`] input rows into the staging buffer and waits.
fn stage_rows(op: &mut Op<'_>, rows: &[u32]) -> Result<(), KernelError> {
    let d = op.plan.d;
    for (pos, row, len) in runs(rows) {
        let c = Copy2d {
            src: op.input[row as usize * d..].as_ptr() as *const u8,
            dst: op.v.stage[pos * d..].as_mut_ptr() as *mut u8,
            width: d * 4,
            height: len,
            src_stride: d * 4,
            dst_stride: d * 4,
        };
        // SAFETY: the input outlives the op and the staging buffer is only
        // read after the wait below.
        unsafe { push_copy(&mut *op.dma, c, &mut op.stats.dma_input_bytes) };
    }
    op.dma.wait_all();
    Ok(())
}

/// Writes row `r` of token block `tb` into its activation tiles at scale
/// `2^k`: staged row `staged`, or zeros (padding rows).
fn convert_row(op: &mut Op<'_>, tb: usize, r: usize, staged: Option<usize>, k: i32) {
    let d = op.plan.d;
    op.v.exps[tb * 32 + r] = k;
    for db in 0..op.plan.db {
        let tile = tile_at(op.v.act, tb * op.plan.db + db);
        for c in 0..32 {
            let col = db * 32 + c;
            let x = match staged {
                Some(i) if col < d => op.v.stage[i * d + col],
                _ => 0.0,
            };
            tile[r * 32 + c] = to_f16(scale_pow2(x, k));
        }
    }
}

/// The exponent for one input row against weights bounded by `w_max`, or
/// the error naming its first non-finite value.
pub(super) fn row_scale(row: &[f32], w_max: f32, token: u32, retry: u32) -> Result<i32, KernelError> {
    let (mut max, mut l1) = (0.0f32, 0.0f32);
    for (feature, &x) in row.iter().enumerate() {
        if !x.is_finite() {
            return Err(KernelError::NonFiniteInput { token, feature: feature as u32 });
        }
        max = max.max(x.abs());
        l1 += x.abs();
    }
    Ok(retry_exponent(first_exponent(max, l1, w_max), retry))
}

/// Unscales output tile `(token block tb of the group, stripe s)` into a
/// staging tile and DMAs it to the output rows of `block`; the two staging
/// tiles alternate, so one drains while the next is filled.
pub(super) fn write_tile(op: &mut Op<'_>, block: &[u32], tb: usize, s: usize) {
    let o = op.plan.o;
    let cols = (o - s * 32).min(32);
    let swapped = op.plan.precision == super::Precision::Q8_0 && op.plan.direction == super::Direction::InputGrad;
    let slot = op.out_slot;
    op.out_slot ^= 1;
    if let Some(t) = op.out_pending[slot].take() {
        op.dma.wait(t);
    }
    let out = &mut *op.v.out[slot];
    for r in 0..block.len() {
        let k = op.v.exps[tb * 32 + r];
        for c in 0..cols {
            let y = if swapped { op.v.acc[c * 32 + r] } else { op.v.acc[r * 32 + c] };
            out[r * 32 + c] = scale_pow2(y, -k);
        }
    }
    for (pos, row, len) in runs(block) {
        let c = Copy2d {
            src: out[pos * 32..].as_ptr() as *const u8,
            dst: op.output[row as usize * o + s * 32..].as_mut_ptr() as *mut u8,
            width: cols * 4,
            height: len,
            src_stride: 128,
            dst_stride: o * 4,
        };
        // SAFETY: the staging tile is not rewritten before this ticket is
        // waited for (two slots, waited above), and the output rows are not
        // otherwise touched while the op runs.
        op.out_pending[slot] = unsafe { push_copy(&mut *op.dma, c, &mut op.stats.dma_output_bytes) }.or(op.out_pending[slot]);
    }
}

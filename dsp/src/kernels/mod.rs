//! The frozen-projection op, both directions, W resident as FP16 or Q8_0.
//!
//! - forward `Y = X W^T` ([`forward`]): stripes of 32 rows of W stream
//!   through DMA; HVX turns each 32x32 block into a weight tile.
//! - input gradient `dX = dY W` ([`input_grad`]): W is never copied or
//!   transposed in memory. FP16: stripes of 32 columns of the resident W
//!   stream through DMA (one 2-D descriptor each) and HVX builds the
//!   transposed tiles in VTCM. Q8_0: the operand roles swap,
//!   `(dX)^T = W^T dY^T`, and the blocks go through the same
//!   [`dequantize_tile`] as forward, so both directions multiply bit-identical
//!   effective weights.
//!
//! Loop order ([`plan`], `pass.rs`): windows of consecutive stripes stream
//! through VTCM in the outer loop, double-buffered, so every byte of W is
//! DMA'd exactly once per op whatever the token count (retried rows cost one
//! more pass each). The token side stays resident in VTCM when it fits next
//! to the windows, and is otherwise re-read from the f32 input and re-scaled
//! for every window (deterministically, so identically). Every output
//! element is reduced in full inside one window in an FP32 accumulator tile,
//! reduction tiles in order `0..db`: results do not depend on the VTCM size
//! or the token count.
//!
//! Known gaps, documented rather than modelled: with one in-order DMA queue
//! (the software engine, one UDMA channel) the first token staging of a
//! window waits for the next window's prefetch, so streaming mode overlaps
//! less than the plan's model assumes; a second channel would fix that. The
//! service copies resident weights into the firmware heap when they are
//! loaded (a device build would map the client's buffer instead), and the
//! VTCM stand-in ([`crate::vtcm::VtcmRegion`]) is heap memory everywhere but
//! a device, so nothing here measures VTCM bandwidth.
//!
//! Shapes (row-major f32 at the interface): `W (rows, cols)`;
//! forward `X (tokens, cols) -> Y (tokens, rows)`;
//! input-gradient `dY (tokens, rows) -> dX (tokens, cols)`.
//!
//! Activations stay floating point: each input row is scaled by `2^k` so its
//! max |value| lands just under 2^12, converted to FP16, multiplied, and the
//! f32 result unscaled exactly. A row whose partial sums turn non-finite or
//! reach 60000 is re-sent with a further 2^-8, at most 3 times
//! ([`hexlora_proto::rescale`]); rows that still overflow are reported and
//! their outputs set to NaN. NaN or infinity in the input is an error.
use crate::dma::DmaEngine;
use crate::hvx::{Tile, TILE_ELEMS};
use crate::tile::TileEngine;
use crate::vtcm::{VtcmRegion, VtcmTooSmall};
use alloc::vec::Vec;
use half::f16;
use hexlora_proto::q8_0::{self, BlockQ8_0, BLOCK_BYTES};
pub use hexlora_proto::protocol::{Direction, Precision};
use hexlora_proto::rescale::MAX_RETRIES;

mod activations;
pub mod forward;
pub mod input_grad;
mod pass;
pub mod plan;

pub use plan::Plan;

/// Why an op did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// An input value is NaN or infinite.
    NonFiniteInput {
        /// Token row.
        token: u32,
        /// Feature (column) in that row.
        feature: u32,
    },
    /// This shape or format is not supported here; the host should use its
    /// CPU path.
    NoSupport(&'static str),
    /// The op needs more VTCM than there is.
    VtcmTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// Buffer lengths do not match the shape, or the shape is empty.
    Shape(&'static str),
    /// The firmware heap could not hold a buffer of this many bytes.
    OutOfMemory(usize),
    /// Resident weight bytes are not valid Q8_0 (or FP16 holds NaN/inf).
    BadWeights(&'static str),
}

impl From<VtcmTooSmall> for KernelError {
    fn from(e: VtcmTooSmall) -> Self {
        KernelError::VtcmTooSmall { needed: e.needed, available: e.available }
    }
}

/// A resident weight, checked once when it is made resident.
#[derive(Clone, Copy, Debug)]
pub struct ResidentWeight<'a> {
    rows: usize,
    cols: usize,
    data: WeightData<'a>,
    /// An upper bound on |w| over the effective FP16 weights: the input rows'
    /// first scale is chosen from it ([`hexlora_proto::rescale`]).
    max_abs: f32,
}

/// The shape check every view of a weight makes: `data` holds exactly a
/// non-empty `(rows, cols)` weight (Q8_0: `cols` a multiple of 32).
fn check_len(data: WeightData<'_>, rows: usize, cols: usize) -> Result<(), KernelError> {
    match data {
        WeightData::Fp16(w) if rows.checked_mul(cols) != Some(w.len()) || w.is_empty() => {
            Err(KernelError::Shape("FP16 weight length is not rows * cols"))
        }
        WeightData::Q8_0(_) if cols % 32 != 0 || rows == 0 => Err(KernelError::Shape("Q8_0 weight columns not a multiple of 32")),
        WeightData::Q8_0(w) if rows.checked_mul(plan::q8_row_bytes(cols)) != Some(w.len()) => {
            Err(KernelError::Shape("Q8_0 weight length is not rows * cols / 32 * 34"))
        }
        _ => Ok(()),
    }
}

/// The bytes of a resident weight.
#[derive(Clone, Copy, Debug)]
pub enum WeightData<'a> {
    /// Row-major `(rows, cols)` FP16.
    Fp16(&'a [f16]),
    /// Row-major Q8_0 blocks, `cols / 32` per row, GGUF byte layout.
    Q8_0(&'a [u8]),
}

impl<'a> ResidentWeight<'a> {
    /// FP16 weight `(rows, cols)`; rejects a wrong length or NaN/inf values.
    pub fn fp16(data: &'a [f16], rows: usize, cols: usize) -> Result<ResidentWeight<'a>, KernelError> {
        check_len(WeightData::Fp16(data), rows, cols)?;
        let mut max_abs = 0.0f32;
        for w in data {
            if !w.is_finite() {
                return Err(KernelError::BadWeights("FP16 weight holds NaN or infinity"));
            }
            max_abs = max_abs.max(w.to_f32().abs());
        }
        Ok(ResidentWeight { rows, cols, data: WeightData::Fp16(data), max_abs })
    }

    /// Q8_0 weight `(rows, cols)`; rejects a wrong length, `cols` not a
    /// multiple of 32, or a non-finite block scale.
    pub fn q8_0(data: &'a [u8], rows: usize, cols: usize) -> Result<ResidentWeight<'a>, KernelError> {
        check_len(WeightData::Q8_0(data), rows, cols)?;
        q8_0::check_scales(data).map_err(|_| KernelError::BadWeights("Q8_0 block scale is NaN or infinite"))?;
        // |d * q| <= |d| * 128 for every block: no need to read the quants.
        let max_scale = data.chunks_exact(BLOCK_BYTES).fold(0.0f32, |m, b| m.max(f16::from_le_bytes([b[0], b[1]]).to_f32().abs()));
        Ok(ResidentWeight { rows, cols, data: WeightData::Q8_0(data), max_abs: max_scale * 128.0 })
    }

    /// A weight that [`ResidentWeight::fp16`] or [`ResidentWeight::q8_0`]
    /// checked earlier (and found `max_abs`), viewed again without reading
    /// its values: only its length is checked against the shape.
    ///
    /// The bytes may have been changed by the host since (resident weights
    /// live in its shared memory); that can make results wrong (overflowing
    /// rows are retried, then reported), never unsafe.
    pub fn checked_earlier(data: WeightData<'a>, rows: usize, cols: usize, max_abs: f32) -> Result<ResidentWeight<'a>, KernelError> {
        check_len(data, rows, cols)?;
        Ok(ResidentWeight { rows, cols, data, max_abs })
    }

    /// An upper bound on |w| over the effective FP16 weights.
    pub fn max_abs(&self) -> f32 {
        self.max_abs
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Storage format.
    pub fn precision(&self) -> Precision {
        match self.data {
            WeightData::Fp16(_) => Precision::Fp16,
            WeightData::Q8_0(_) => Precision::Q8_0,
        }
    }

    /// The stored data.
    pub fn data(&self) -> WeightData<'a> {
        self.data
    }
}

/// The hardware an op runs on.
pub struct Engines<'e> {
    /// Moves windows between DDR and VTCM.
    pub dma: &'e mut dyn DmaEngine,
    /// Multiplies tiles.
    pub tiles: &'e mut dyn TileEngine,
    /// The VTCM region (a fresh arena is made over it per op).
    pub vtcm: &'e mut VtcmRegion,
}

/// What an op did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Row re-sends with a smaller scale (a row retried twice counts 2).
    pub rows_retried: u32,
    /// Rows still overflowing after [`MAX_RETRIES`]; their outputs are NaN.
    pub rows_failed: u32,
    /// Tile products issued.
    pub tile_products: u64,
    /// DMA bytes of W moved into VTCM.
    pub dma_weight_bytes: u64,
    /// DMA bytes of input moved into VTCM.
    pub dma_input_bytes: u64,
    /// DMA bytes of output moved out of VTCM.
    pub dma_output_bytes: u64,
    /// VTCM bytes the op occupied.
    pub vtcm_bytes: usize,
    /// Passes over W: 1, plus one per retry level that had rows to re-send.
    /// Each pass DMAs every byte of W once.
    pub weight_passes: u32,
}

/// Runs `Y = X W^T` (forward) or `dX = dY W` (input gradient) for `tokens`
/// rows; `input` and `output` are row-major f32 with the widths in the module
/// docs. `output` is fully overwritten.
pub fn project(
    eng: &mut Engines<'_>,
    w: &ResidentWeight<'_>,
    direction: Direction,
    tokens: usize,
    input: &[f32],
    output: &mut [f32],
) -> Result<RunStats, KernelError> {
    let (d, o) = match direction {
        Direction::Forward => (w.cols, w.rows),
        Direction::InputGrad => (w.rows, w.cols),
    };
    if Some(input.len()) != tokens.checked_mul(d) || Some(output.len()) != tokens.checked_mul(o) {
        return Err(KernelError::Shape("input/output length does not match tokens x features"));
    }
    let plan = Plan::new(w.precision(), direction, w.rows, w.cols, tokens, eng.vtcm.capacity())?;
    let tiles_before = eng.tiles.tiles();
    let mut op = pass::Op::new(plan, *w, input, output, eng)?;
    let mut rows: Vec<u32> = Vec::new();
    rows.try_reserve_exact(tokens).map_err(|_| KernelError::OutOfMemory(tokens * 4))?;
    rows.extend(0..tokens as u32);
    let mut retry = 0;
    loop {
        let flagged = op.run(&rows, retry)?;
        if flagged.is_empty() {
            break;
        }
        if retry == MAX_RETRIES {
            op.fail_rows(&flagged);
            op.stats.rows_failed = flagged.len() as u32;
            break;
        }
        retry += 1;
        op.stats.rows_retried += flagged.len() as u32;
        rows = flagged;
    }
    let mut stats = op.stats;
    stats.tile_products = op.tiles_issued(tiles_before);
    Ok(stats)
}

/// THE Q8_0 -> FP16 step of both directions: tile row `r` is the block at
/// `blocks[r * stride..]` (32 weights of one row of W) through
/// [`q8_0::dequantize_block`]; rows from `valid` on are zero.
pub fn dequantize_tile(blocks: &[u8], stride: usize, valid: usize, tile: &mut Tile) {
    for r in 0..32 {
        let row: &mut [f16; 32] = (&mut tile[r * 32..(r + 1) * 32]).try_into().unwrap();
        if r < valid {
            let bytes: &[u8; BLOCK_BYTES] = blocks[r * stride..r * stride + BLOCK_BYTES].try_into().unwrap();
            q8_0::dequantize_block(&BlockQ8_0::from_bytes(bytes), row);
        } else {
            row.fill(f16::ZERO);
        }
    }
}

/// Views tile `i` of a tile-blocked buffer.
pub(crate) fn tile_mut(buf: &mut [f16], i: usize) -> &mut Tile {
    (&mut buf[i * TILE_ELEMS..(i + 1) * TILE_ELEMS]).try_into().unwrap()
}

/// Views tile `i` of a tile-blocked buffer.
pub(crate) fn tile_ref(buf: &[f16], i: usize) -> &Tile {
    buf[i * TILE_ELEMS..(i + 1) * TILE_ELEMS].try_into().unwrap()
}

pub mod selftests;
pub mod testbed;
#[cfg(test)]
mod proptests;

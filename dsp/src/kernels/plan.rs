//! What a projection op costs before it runs: VTCM layout, token chunking,
//! DMA traffic and tile count. The kernels allocate exactly these buffers;
//! the benchmark prints these numbers.
//!
//! Names: `d` is the reduction width (forward: `cols` of W; input-gradient:
//! `rows`), `o` the output width, `db`/`ob` their tile counts. Activations
//! for a whole token chunk stay in VTCM while W streams through once per
//! chunk in 32-wide stripes (forward: 32 rows of W; input-gradient: 32
//! columns), double-buffered.
use super::{Direction, KernelError, Precision};
use crate::tile::TILE_BYTES;
use crate::vtcm::VTCM_ALIGN;
use hexlora_proto::q8_0::BLOCK_BYTES;

/// Largest `rows`/`cols` the kernels take: keeps every weight stride inside
/// the 16-bit descriptor fields (`cols * 2 <= 65535`), so each tile of a
/// window is one descriptor.
pub const MAX_DIM: usize = 32767;

/// Buffers a kernel allocates from VTCM (each padded to [`VTCM_ALIGN`]).
pub const VTCM_BUFFERS: usize = 10;

/// The cost model of one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Weight storage.
    pub precision: Precision,
    /// Product.
    pub direction: Direction,
    /// Reduction width.
    pub d: usize,
    /// Output width.
    pub o: usize,
    /// Reduction tiles, `ceil(d / 32)`.
    pub db: usize,
    /// Output stripes, `ceil(o / 32)`.
    pub ob: usize,
    /// Rows of `W`.
    pub w_rows: usize,
    /// Columns of `W`.
    pub w_cols: usize,
    /// Tokens of the op.
    pub tokens: usize,
    /// Tokens whose activations are resident at once (multiple of 32).
    pub chunk_tokens: usize,
    /// Chunks, `ceil(tokens / chunk_tokens)`: W streams once per chunk.
    pub chunks: usize,
}

/// Bytes a Q8_0 row of `cols` weights occupies.
pub const fn q8_row_bytes(cols: usize) -> usize {
    cols / 32 * BLOCK_BYTES
}

const fn ceil32(x: usize) -> usize {
    x.div_ceil(32) * 32
}

impl Plan {
    /// Plans an op, or says why it cannot run.
    pub fn new(
        precision: Precision,
        direction: Direction,
        w_rows: usize,
        w_cols: usize,
        tokens: usize,
        vtcm_capacity: usize,
    ) -> Result<Plan, KernelError> {
        if w_rows == 0 || w_cols == 0 || tokens == 0 {
            return Err(KernelError::Shape("empty weight or zero tokens"));
        }
        if w_rows > MAX_DIM || w_cols > MAX_DIM {
            return Err(KernelError::NoSupport("weight dimension above 32767"));
        }
        if precision == Precision::Q8_0 && w_cols % 32 != 0 {
            return Err(KernelError::Shape("Q8_0 weight columns not a multiple of 32"));
        }
        let (d, o) = match direction {
            Direction::Forward => (w_cols, w_rows),
            Direction::InputGrad => (w_rows, w_cols),
        };
        let mut p = Plan {
            precision,
            direction,
            d,
            o,
            db: d.div_ceil(32),
            ob: o.div_ceil(32),
            w_rows,
            w_cols,
            tokens,
            chunk_tokens: 0,
            chunks: 0,
        };
        let per_block = p.per_token_bytes() * 32;
        let fixed = p.fixed_bytes() + VTCM_BUFFERS * VTCM_ALIGN;
        if fixed + per_block > vtcm_capacity {
            return Err(KernelError::VtcmTooSmall { needed: fixed + per_block, available: vtcm_capacity });
        }
        let blocks_fit = (vtcm_capacity - fixed) / per_block;
        p.chunk_tokens = (blocks_fit * 32).min(ceil32(tokens));
        p.chunks = tokens.div_ceil(p.chunk_tokens);
        Ok(p)
    }

    /// VTCM bytes per resident token: its activation tiles, its row of the
    /// accumulator stripe, its exponent and overflow flag.
    pub fn per_token_bytes(&self) -> usize {
        self.db * 32 * 2 + 32 * 4 + 4 + 1
    }

    /// VTCM bytes independent of the chunk: the f32 input staging (a few
    /// rows), two weight windows, dequantized tiles (Q8) and two output
    /// staging tiles.
    pub fn fixed_bytes(&self) -> usize {
        let staging = super::activations::STAGE_ROWS * self.d * 4;
        let out = 2 * 1024 * 4;
        let windows = 2 * self.window_bytes();
        let dequant = match self.precision {
            Precision::Fp16 => 0,
            Precision::Q8_0 => self.db * TILE_BYTES,
        };
        staging + out + windows + dequant
    }

    /// Bytes of one raw weight window in VTCM.
    pub fn window_bytes(&self) -> usize {
        match (self.precision, self.direction) {
            (Precision::Fp16, _) => self.db * TILE_BYTES,
            (Precision::Q8_0, Direction::Forward) => 32 * q8_row_bytes(self.w_cols),
            (Precision::Q8_0, Direction::InputGrad) => self.db * 32 * BLOCK_BYTES,
        }
    }

    /// VTCM bytes the op occupies.
    pub fn vtcm_bytes(&self) -> usize {
        self.fixed_bytes() + self.per_token_bytes() * self.chunk_tokens + VTCM_BUFFERS * VTCM_ALIGN
    }

    /// Bytes of W in DDR (what one pass streams).
    pub fn weight_bytes(&self) -> usize {
        match self.precision {
            Precision::Fp16 => self.w_rows * self.w_cols * 2,
            Precision::Q8_0 => self.w_rows * q8_row_bytes(self.w_cols),
        }
    }

    /// DMA bytes DDR -> VTCM: W once per chunk plus the f32 input once.
    pub fn dma_in_bytes(&self) -> usize {
        self.weight_bytes() * self.chunks + self.tokens * self.d * 4
    }

    /// DMA bytes VTCM -> DDR: the f32 output once.
    pub fn dma_out_bytes(&self) -> usize {
        self.tokens * self.o * 4
    }

    /// Tile products (each 32x32x32 multiply-adds) of the op.
    pub fn tile_products(&self) -> usize {
        let token_blocks: usize = (0..self.chunks)
            .map(|c| (self.tokens - c * self.chunk_tokens).min(self.chunk_tokens).div_ceil(32))
            .sum();
        token_blocks * self.db * self.ob
    }

    /// Useful floating-point operations, `2 * tokens * d * o`.
    pub fn flops(&self) -> f64 {
        2.0 * self.tokens as f64 * self.d as f64 * self.o as f64
    }

    /// Modelled seconds: tile products at `tflops` (each 65536 flops) and DMA
    /// at `ddr_gbps`, overlapped by the double buffering (the slower wins).
    pub fn modelled_seconds(&self, tflops: f64, ddr_gbps: f64) -> (f64, f64) {
        let compute = self.tile_products() as f64 * 65536.0 / (tflops * 1e12);
        let dma = (self.dma_in_bytes() + self.dma_out_bytes()) as f64 / (ddr_gbps * 1e9);
        (compute, dma)
    }
}

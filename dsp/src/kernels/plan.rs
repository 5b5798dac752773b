//! What a projection op costs before it runs: VTCM layout, W windows, token
//! groups, DMA traffic and tile count. The kernels allocate exactly these
//! buffers; the benchmark prints these numbers.
//!
//! Names: `d` is the reduction width (forward: `cols` of W; input-gradient:
//! `rows`), `o` the output width, `db`/`ob` their tile counts. A *stripe* is
//! the part of W behind 32 outputs (forward: 32 rows of W; input-gradient:
//! 32 columns); a *window* is `window_stripes` consecutive stripes, the unit
//! DMA'd into VTCM (double-buffered).
//!
//! Loop order: W windows outside, tokens inside, so every byte of W crosses
//! DMA exactly once per op (per direction), whatever the token count. The
//! token side (scaled FP16 activation or gradient tiles) is either resident
//! (all tokens fit next to the windows: converted once) or re-streamed from
//! the f32 input for every window, `group_blocks` blocks of 32 tokens at a
//! time. Each output element is reduced completely inside one window, in FP32
//! in a VTCM accumulator tile, in the same order as any other loop order
//! would (reduction tiles `0..db`), so the loop order changes no bit of the
//! result.
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
    /// Stripes per W window.
    pub window_stripes: usize,
    /// W windows, `ceil(ob / window_stripes)`; each is DMA'd once per pass.
    pub windows: usize,
    /// Token blocks (32 tokens each) whose tiles are in VTCM at once.
    pub group_blocks: usize,
    /// Whether every token block stays resident for the whole pass.
    pub tokens_resident: bool,
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
            window_stripes: 0,
            windows: 0,
            group_blocks: 0,
            tokens_resident: false,
        };
        let fixed = p.fixed_bytes() + VTCM_BUFFERS * VTCM_ALIGN;
        let least = fixed + p.block_bytes() + p.stripe_bytes();
        if least > vtcm_capacity {
            return Err(KernelError::VtcmTooSmall { needed: least, available: vtcm_capacity });
        }
        p.fit(vtcm_capacity - fixed);
        Ok(p)
    }

    /// Splits `budget` bytes between W windows and token blocks.
    ///
    /// All tokens resident if one stripe still fits next to them (the input
    /// then crosses DMA once); otherwise the windows get everything but one
    /// token block, since every window re-streams the whole input and fewer
    /// windows means less of that traffic. Windows are then evened out (same
    /// count, equal sizes) and the token groups take what is left.
    fn fit(&mut self, budget: usize) {
        let blocks = self.tokens.div_ceil(32);
        let resident_stripes = budget.saturating_sub(blocks * self.block_bytes()) / self.stripe_bytes();
        self.tokens_resident = resident_stripes >= 1;
        let stripes = if self.tokens_resident {
            resident_stripes
        } else {
            (budget - self.block_bytes()) / self.stripe_bytes()
        };
        self.windows = self.ob.div_ceil(stripes.min(self.ob));
        self.window_stripes = self.ob.div_ceil(self.windows);
        let left = budget - self.window_stripes * self.stripe_bytes();
        self.group_blocks = (left / self.block_bytes()).min(blocks);
        self.tokens_resident = self.group_blocks == blocks;
    }

    /// VTCM bytes per resident token block: its activation tiles and the
    /// scale exponents of its 32 rows.
    pub fn block_bytes(&self) -> usize {
        self.db * TILE_BYTES + 32 * 4
    }

    /// VTCM bytes per stripe of a window: two raw copies (double buffering)
    /// and, for Q8_0, its dequantized tiles.
    pub fn stripe_bytes(&self) -> usize {
        let dequant = match self.precision {
            Precision::Fp16 => 0,
            Precision::Q8_0 => self.db * TILE_BYTES,
        };
        2 * self.stripe_window_bytes() + dequant
    }

    /// VTCM bytes independent of windows and token groups: the f32 input
    /// staging (a few rows), one accumulator tile, two output staging tiles
    /// and one overflow flag per token.
    pub fn fixed_bytes(&self) -> usize {
        let staging = super::activations::STAGE_ROWS * self.d * 4;
        let acc_and_out = 3 * 1024 * 4;
        staging + acc_and_out + ceil32(self.tokens)
    }

    /// Bytes of one raw stripe as DMA'd into VTCM.
    pub fn stripe_window_bytes(&self) -> usize {
        match (self.precision, self.direction) {
            (Precision::Fp16, _) => self.db * TILE_BYTES,
            (Precision::Q8_0, Direction::Forward) => 32 * q8_row_bytes(self.w_cols),
            (Precision::Q8_0, Direction::InputGrad) => self.db * 32 * BLOCK_BYTES,
        }
    }

    /// VTCM bytes of one raw window.
    pub fn window_bytes(&self) -> usize {
        self.window_stripes * self.stripe_window_bytes()
    }

    /// VTCM bytes the op occupies.
    pub fn vtcm_bytes(&self) -> usize {
        self.fixed_bytes()
            + self.window_stripes * self.stripe_bytes()
            + self.group_blocks * self.block_bytes()
            + VTCM_BUFFERS * VTCM_ALIGN
    }

    /// Bytes of W in DDR: what one pass DMAs, each byte once.
    pub fn weight_bytes(&self) -> usize {
        match self.precision {
            Precision::Fp16 => self.w_rows * self.w_cols * 2,
            Precision::Q8_0 => self.w_rows * q8_row_bytes(self.w_cols),
        }
    }

    /// Bytes of W the windows of one pass DMA: each stripe once, so this is
    /// [`Plan::weight_bytes`] (kept separate so the benchmark shows the sum).
    pub fn weight_dma_bytes(&self) -> usize {
        let stripe_bytes = |s: usize| match (self.precision, self.direction) {
            (Precision::Fp16, Direction::Forward) => (self.w_rows - s * 32).min(32) * self.w_cols * 2,
            (Precision::Fp16, Direction::InputGrad) => (self.w_cols - s * 32).min(32) * self.w_rows * 2,
            (Precision::Q8_0, Direction::Forward) => (self.w_rows - s * 32).min(32) * q8_row_bytes(self.w_cols),
            (Precision::Q8_0, Direction::InputGrad) => self.w_rows * BLOCK_BYTES,
        };
        (0..self.windows)
            .flat_map(|win| win * self.window_stripes..((win + 1) * self.window_stripes).min(self.ob))
            .map(stripe_bytes)
            .sum()
    }

    /// Times the f32 input crosses DMA in a pass: once when resident, once
    /// per window otherwise.
    pub fn input_passes(&self) -> usize {
        if self.tokens_resident {
            1
        } else {
            self.windows
        }
    }

    /// DMA bytes of input DDR -> VTCM in a pass.
    pub fn dma_input_bytes(&self) -> usize {
        self.input_passes() * self.tokens * self.d * 4
    }

    /// DMA bytes DDR -> VTCM: W once plus the input.
    pub fn dma_in_bytes(&self) -> usize {
        self.weight_bytes() + self.dma_input_bytes()
    }

    /// DMA bytes VTCM -> DDR: the f32 output once.
    pub fn dma_out_bytes(&self) -> usize {
        self.tokens * self.o * 4
    }

    /// Tile products (each 32x32x32 multiply-adds) of the op.
    pub fn tile_products(&self) -> usize {
        self.tokens.div_ceil(32) * self.db * self.ob
    }

    /// Useful floating-point operations, `2 * tokens * d * o`.
    pub fn flops(&self) -> f64 {
        2.0 * self.tokens as f64 * self.d as f64 * self.o as f64
    }

    /// Modelled seconds `(compute, dma)`: tile products at `tflops` (each
    /// 65536 flops) and DMA at `ddr_gbps`. The op takes the slower of the two
    /// if the double buffering hides the other (see the kernels' docs for
    /// where one in-order DMA queue does not).
    pub fn modelled_seconds(&self, tflops: f64, ddr_gbps: f64) -> (f64, f64) {
        let compute = self.tile_products() as f64 * 65536.0 / (tflops * 1e12);
        let dma = (self.dma_in_bytes() + self.dma_out_bytes()) as f64 / (ddr_gbps * 1e9);
        (compute, dma)
    }
}

//! One pass of an op over a list of token rows: stage a chunk of rows, stream
//! every stripe of W past it, write the outputs; repeat per chunk.
use super::activations;
use super::{forward, input_grad, tile_ref, Direction, Engines, KernelError, Plan, Precision, ResidentWeight, RunStats};
use crate::dma::{DmaEngine, Ticket};
use crate::hvx::TILE_ELEMS;
use crate::tile::{AccTile, TileEngine};
use alloc::vec::Vec;
use half::f16;
use hexlora_proto::rescale::needs_retry;

/// The VTCM buffers of an op (sizes from [`Plan`]).
pub(super) struct Vtcm<'a> {
    /// f32 input rows being converted, `(STAGE_ROWS, d)`.
    pub stage: &'a mut [f32],
    /// Activation tiles of the chunk, `(chunk/32, db)` tiles: activation
    /// layout, or (Q8 input-gradient) weight layout of `dY^T`.
    pub act: &'a mut [f16],
    /// Scale exponent of each chunk row.
    pub exps: &'a mut [i32],
    /// Overflow flag of each chunk row.
    pub flags: &'a mut [u8],
    /// Accumulator tiles of one stripe, `(chunk/32)` tiles.
    pub acc: &'a mut [f32],
    /// Two f32 output staging tiles.
    pub out: [&'a mut [f32]; 2],
    /// Two raw weight windows.
    pub windows: [&'a mut [u8]; 2],
    /// Dequantized tiles of one stripe (Q8 only), `db` tiles.
    pub dequant: &'a mut [f16],
}

/// An op in progress.
pub(super) struct Op<'a> {
    pub plan: Plan,
    pub w: ResidentWeight<'a>,
    pub input: &'a [f32],
    pub output: &'a mut [f32],
    pub dma: &'a mut dyn DmaEngine,
    pub tiles: &'a mut dyn TileEngine,
    pub v: Vtcm<'a>,
    pub stats: RunStats,
}

impl<'a> Op<'a> {
    /// Allocates the plan's VTCM buffers.
    pub fn new(
        plan: Plan,
        w: ResidentWeight<'a>,
        input: &'a [f32],
        output: &'a mut [f32],
        eng: &'a mut Engines<'_>,
    ) -> Result<Op<'a>, KernelError> {
        let mut arena = eng.vtcm.arena();
        let chunk = plan.chunk_tokens;
        let dequant_tiles = if plan.precision == Precision::Q8_0 { plan.db } else { 0 };
        let v = Vtcm {
            stage: arena.alloc(super::activations::STAGE_ROWS * plan.d)?,
            act: arena.alloc(chunk * plan.db * 32)?,
            exps: arena.alloc(chunk)?,
            flags: arena.alloc(chunk)?,
            acc: arena.alloc(chunk * 32)?,
            out: [arena.alloc(TILE_ELEMS)?, arena.alloc(TILE_ELEMS)?],
            windows: [arena.alloc(plan.window_bytes())?, arena.alloc(plan.window_bytes())?],
            dequant: arena.alloc(dequant_tiles * TILE_ELEMS)?,
        };
        let stats = RunStats { vtcm_bytes: arena.used(), ..RunStats::default() };
        Ok(Op { plan, w, input, output, dma: eng.dma, tiles: eng.tiles, v, stats })
    }

    /// Tile products issued since `before`.
    pub fn tiles_issued(&self, before: u64) -> u64 {
        self.tiles.tiles() - before
    }

    /// Whether the operand roles are swapped: Q8 input-gradient computes
    /// `(dX)^T = W^T dY^T`, so W supplies the activation operand.
    fn swapped(&self) -> bool {
        self.plan.precision == Precision::Q8_0 && self.plan.direction == Direction::InputGrad
    }

    /// Runs `rows` (ascending token indices) at retry level `retry`; returns
    /// the rows whose partial sums overflowed.
    pub fn run(&mut self, rows: &[u32], retry: u32) -> Result<Vec<u32>, KernelError> {
        let mut flagged = Vec::new();
        for chunk in rows.chunks(self.plan.chunk_tokens) {
            self.stats.weight_passes += 1;
            activations::stage_chunk(self, chunk, retry)?;
            self.stream_stripes(chunk);
            for (i, &row) in chunk.iter().enumerate() {
                if self.v.flags[i] != 0 {
                    flagged.push(row);
                }
            }
        }
        Ok(flagged)
    }

    /// Pushes the DMA of stripe `s` into window `slot`.
    fn fetch(&mut self, s: usize, slot: usize) -> Option<Ticket> {
        let win = &mut *self.v.windows[slot];
        let bytes = &mut self.stats.dma_weight_bytes;
        // SAFETY: `win` is not touched until the ticket is waited for (the
        // other window is the one in use), and W outlives the op.
        unsafe {
            match self.plan.direction {
                Direction::Forward => forward::fetch(&self.plan, &self.w, s, win, &mut *self.dma, bytes),
                Direction::InputGrad => input_grad::fetch(&self.plan, &self.w, s, win, &mut *self.dma, bytes),
            }
        }
    }

    /// Streams every stripe of W past the staged chunk, double-buffered.
    fn stream_stripes(&mut self, chunk: &[u32]) {
        let blocks = chunk.len().div_ceil(32);
        let mut next = self.fetch(0, 0);
        for s in 0..self.plan.ob {
            if let Some(t) = next {
                self.dma.wait(t);
            }
            next = if s + 1 < self.plan.ob { self.fetch(s + 1, (s + 1) % 2) } else { None };
            self.multiply_stripe(s, blocks);
            activations::write_stripe(self, chunk, s);
        }
        self.dma.wait_all();
    }

    /// Builds stripe `s`'s tiles and accumulates it against every token block.
    fn multiply_stripe(&mut self, s: usize, blocks: usize) {
        let plan = self.plan;
        let swapped = self.swapped();
        let win = &mut *self.v.windows[s % 2];
        let wtiles: &[f16] = match plan.direction {
            Direction::Forward => forward::build(&plan, s, win, self.v.dequant),
            Direction::InputGrad => input_grad::build(&plan, win, self.v.dequant),
        };
        self.v.acc[..blocks * TILE_ELEMS].fill(0.0);
        for db in 0..plan.db {
            let w = tile_ref(wtiles, db);
            for tb in 0..blocks {
                let acc: &mut AccTile = (&mut self.v.acc[tb * TILE_ELEMS..(tb + 1) * TILE_ELEMS]).try_into().unwrap();
                let a = tile_ref(self.v.act, tb * plan.db + db);
                if swapped {
                    self.tiles.mac(acc, w, a);
                } else {
                    self.tiles.mac(acc, a, w);
                }
                flag_overflow(acc, swapped, &mut self.v.flags[tb * 32..(tb + 1) * 32]);
            }
        }
    }

    /// Sets the outputs of rows that failed every retry to NaN, so the host
    /// can find the rows the failure count refers to.
    pub fn fail_rows(&mut self, rows: &[u32]) {
        for &r in rows {
            let o = self.plan.o;
            self.output[r as usize * o..(r as usize + 1) * o].fill(f32::NAN);
        }
    }
}

/// Marks token rows with a partial sum that is non-finite or reached the
/// limit. Tokens index rows of `acc`, or columns when the roles are swapped.
fn flag_overflow(acc: &AccTile, swapped: bool, flags: &mut [u8]) {
    for (r, row) in acc.chunks_exact(32).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            if needs_retry(x) {
                flags[if swapped { c } else { r }] = 1;
            }
        }
    }
}

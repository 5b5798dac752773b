//! One pass of an op over a list of token rows: W windows outside, token
//! groups inside. Each window of W is DMA'd once per pass (the next one
//! streams while the current one is used); the token side is staged once if
//! it all stays resident, else once per window, one group at a time.
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
    /// Token tiles of the group, `(group_blocks, db)` tiles: activation
    /// layout, or (Q8 input-gradient) weight layout of `dY^T`.
    pub act: &'a mut [f16],
    /// Scale exponent of each group row, `(group_blocks * 32)`.
    pub exps: &'a mut [i32],
    /// Overflow flag of each row of the pass, `(ceil32(tokens))`.
    pub flags: &'a mut [u8],
    /// One accumulator tile.
    pub acc: &'a mut [f32],
    /// Two f32 output staging tiles.
    pub out: [&'a mut [f32]; 2],
    /// Two raw W windows, `(window_stripes, stripe_window_bytes)` bytes each.
    pub windows: [&'a mut [u8]; 2],
    /// Dequantized tiles of one window (Q8 only), `(window_stripes, db)`.
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
    /// Output DMAs in flight from each staging tile.
    pub out_pending: [Option<Ticket>; 2],
    /// Staging tile the next output tile goes to.
    pub out_slot: usize,
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
        let group = plan.group_blocks * 32;
        let dequant_tiles = if plan.precision == Precision::Q8_0 { plan.window_stripes * plan.db } else { 0 };
        let v = Vtcm {
            stage: arena.alloc(super::activations::STAGE_ROWS * plan.d)?,
            act: arena.alloc(group * plan.db * 32)?,
            exps: arena.alloc(group)?,
            flags: arena.alloc(plan.tokens.div_ceil(32) * 32)?,
            acc: arena.alloc(TILE_ELEMS)?,
            out: [arena.alloc(TILE_ELEMS)?, arena.alloc(TILE_ELEMS)?],
            windows: [arena.alloc(plan.window_bytes())?, arena.alloc(plan.window_bytes())?],
            dequant: arena.alloc(dequant_tiles * TILE_ELEMS)?,
        };
        let stats = RunStats { vtcm_bytes: arena.used(), ..RunStats::default() };
        Ok(Op { plan, w, input, output, dma: eng.dma, tiles: eng.tiles, v, stats, out_pending: [None; 2], out_slot: 0 })
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

    /// Runs `rows` (ascending token indices) at retry level `retry`, one pass
    /// over W; returns the rows whose partial sums overflowed.
    pub fn run(&mut self, rows: &[u32], retry: u32) -> Result<Vec<u32>, KernelError> {
        self.stats.weight_passes += 1;
        self.v.flags[..rows.len()].fill(0);
        let group = self.plan.group_blocks * 32;
        let resident = rows.len() <= group;
        if resident {
            activations::stage_group(self, rows, retry)?;
        }
        let mut next = self.fetch_window(0, 0);
        for win in 0..self.plan.windows {
            if let Some(t) = next {
                self.dma.wait(t);
            }
            next = if win + 1 < self.plan.windows { self.fetch_window(win + 1, (win + 1) % 2) } else { None };
            self.build_window(win);
            for (g, rows_g) in rows.chunks(group).enumerate() {
                if !resident {
                    if let Err(e) = activations::stage_group(self, rows_g, retry) {
                        // The next window may still be in flight into VTCM.
                        self.dma.wait_all();
                        return Err(e);
                    }
                }
                self.multiply_group(win, rows_g, g * group);
            }
        }
        self.dma.wait_all();
        let flagged = self.v.flags.iter().take(rows.len()).filter(|&&f| f != 0).count();
        let mut out = Vec::new();
        out.try_reserve_exact(flagged).map_err(|_| KernelError::OutOfMemory(flagged * 4))?;
        out.extend(rows.iter().zip(self.v.flags.iter()).filter(|(_, &f)| f != 0).map(|(&r, _)| r));
        Ok(out)
    }

    /// Stripes of window `win`: `(first stripe, count)`.
    fn window_stripes(&self, win: usize) -> (usize, usize) {
        let first = win * self.plan.window_stripes;
        (first, self.plan.window_stripes.min(self.plan.ob - first))
    }

    /// Pushes the DMA of window `win` into buffer `slot`, one stripe after
    /// another; returns the last ticket.
    fn fetch_window(&mut self, win: usize, slot: usize) -> Option<Ticket> {
        let (first, count) = self.window_stripes(win);
        let sb = self.plan.stripe_window_bytes();
        let mut last = None;
        for k in 0..count {
            let stripe = &mut self.v.windows[slot][k * sb..(k + 1) * sb];
            let bytes = &mut self.stats.dma_weight_bytes;
            // SAFETY: the window is not touched until the ticket is waited
            // for (the other window is the one in use), and W outlives the op.
            let t = unsafe {
                match self.plan.direction {
                    Direction::Forward => forward::fetch(&self.plan, &self.w, first + k, stripe, &mut *self.dma, bytes),
                    Direction::InputGrad => {
                        input_grad::fetch(&self.plan, &self.w, first + k, stripe, &mut *self.dma, bytes)
                    }
                }
            };
            last = t.or(last);
        }
        last
    }

    /// Builds the tiles of every stripe of the fetched window `win` (in
    /// place for FP16, into `dequant` for Q8_0), once per pass.
    fn build_window(&mut self, win: usize) {
        let (first, count) = self.window_stripes(win);
        let (plan, sb, tiles) = (self.plan, self.plan.stripe_window_bytes(), self.plan.db * TILE_ELEMS);
        let raw = &mut *self.v.windows[win % 2];
        for k in 0..count {
            let stripe = &mut raw[k * sb..(k + 1) * sb];
            let start = (k * tiles).min(self.v.dequant.len()); // FP16: empty
            let dequant = &mut self.v.dequant[start..];
            match plan.direction {
                Direction::Forward => forward::build(&plan, first + k, stripe, dequant),
                Direction::InputGrad => input_grad::build(&plan, stripe, dequant),
            };
        }
    }

    /// Multiplies the staged group (`rows`, starting at position `pos` of
    /// the pass) by every stripe of window `win` and writes the outputs.
    fn multiply_group(&mut self, win: usize, rows: &[u32], pos: usize) {
        let (first, count) = self.window_stripes(win);
        for k in 0..count {
            for (tb, block) in rows.chunks(32).enumerate() {
                self.multiply_tile(win, k, tb, pos + tb * 32);
                activations::write_tile(self, block, tb, first + k);
            }
        }
    }

    /// Accumulates output tile `(token block tb, stripe k of window win)`
    /// over the whole reduction, in order `0..db`, and flags overflowing rows.
    fn multiply_tile(&mut self, win: usize, k: usize, tb: usize, pos: usize) {
        let (db_count, swapped) = (self.plan.db, self.swapped());
        let acc: &mut AccTile = (&mut *self.v.acc).try_into().unwrap();
        acc.fill(0.0);
        let n = db_count * TILE_ELEMS;
        // Split borrows: the window tiles are read while acc/flags are written.
        let wtiles: &[f16] = match self.plan.precision {
            Precision::Fp16 => {
                let sb = self.plan.stripe_window_bytes();
                bytemuck::cast_slice(&self.v.windows[win % 2][k * sb..k * sb + n * 2])
            }
            Precision::Q8_0 => &self.v.dequant[k * n..(k + 1) * n],
        };
        let flags = &mut self.v.flags[pos..pos + 32];
        for db in 0..db_count {
            let w = tile_ref(wtiles, db);
            let a = tile_ref(self.v.act, tb * db_count + db);
            if swapped {
                self.tiles.mac(acc, w, a);
            } else {
                self.tiles.mac(acc, a, w);
            }
            flag_overflow(acc, swapped, flags);
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

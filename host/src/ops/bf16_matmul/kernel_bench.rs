//! The x86 kernels' inner loops, for the speed benchmarks of
//! `host/examples/bench_bf16_matmul.rs` (the tile loops' ceilings and
//! where a forward's time goes); the runtime does not use them.
use super::{amx, avx2, avx512bf16, Bf16Matrix};

/// `reps` 32x32 AMX blocks over a reduction of `kp` (a multiple of 32)
/// from the same `a` and `panel` (`2 * 16 * kp` bf16 bits each): `mode` 0
/// = the real block, 1 = only the 4 products per step, 2 = only the 4
/// loads per step. Panics without AMX-BF16 ([`super::amx_available`]).
pub fn amx_tile_loop(a: &[u16], panel: &[u16], kp: usize, reps: usize, mode: u32) {
    assert!(amx::available(), "amx_tile_loop needs AMX-BF16");
    amx::tile_loop_for_bench(a, panel, kp, reps, mode);
}

/// Seconds of one AMX forward's parts on this thread: rounding the
/// activation `x: [tokens, w.cols()]`, preparing every B panel of `w`,
/// the whole product. Panics without AMX-BF16.
pub fn amx_forward_parts(x: &[f32], tokens: usize, w: &Bf16Matrix) -> [f64; 3] {
    assert!(amx::available(), "amx_forward_parts needs AMX-BF16");
    amx::forward_parts_for_bench(x, tokens, w.bits(), w.rows(), w.cols())
}

/// The AVX2 4x16 tile of the portable kernel with its operands: `k` steps
/// of a `[k][4]` activation sliver by a `[k][16]` weight panel.
pub struct Avx2Tile {
    a: Vec<f32>,
    b: Vec<f32>,
    k: usize,
    out: [f32; 64],
}

impl Avx2Tile {
    /// Constant operands for `k` steps; `None` without AVX2+FMA.
    pub fn new(k: usize) -> Option<Avx2Tile> {
        avx2::available().then(|| Avx2Tile { a: vec![0.5; k * avx2::MR], b: vec![0.25; k * avx2::NR], k, out: [0.0; 64] })
    }

    /// `reps` tiles on this thread, `2 * 64 * k` flop each.
    pub fn run(&mut self, reps: usize) {
        for _ in 0..reps {
            // SAFETY: AVX2 and FMA are available (`new`); `out` is 4 x 16.
            unsafe { avx2::tile(&self.a, &self.b, self.k, self.out.as_mut_ptr(), 16, (4, 16)) };
        }
    }
}

/// The AVX512-BF16 kernel's `MR x NR` (8 x 32) register tile with its
/// packed operands in L1: `kp` pairs of a sliver by a panel, as the
/// kernel's product loop runs it between two panel fills.
pub struct Avx512Bf16Tile {
    sliver: Vec<u32>,
    panel: Vec<u32>,
    kp: usize,
    out: Vec<f32>,
}

impl Avx512Bf16Tile {
    /// Constant operands (1.0 and 0.5 in bf16) for `kp` pairs; `None`
    /// without AVX512-BF16.
    pub fn new(kp: usize) -> Option<Avx512Bf16Tile> {
        let (one, half) = (0x3f80u32, 0x3f00u32);
        avx512bf16::available().then(|| Avx512Bf16Tile {
            sliver: vec![one | one << 16; kp * avx512bf16::MR],
            panel: vec![half | half << 16; kp * avx512bf16::NR],
            kp,
            out: vec![0.0; avx512bf16::MR * avx512bf16::NR],
        })
    }

    /// Flop of one tile: `MR x NR` outputs, two multiply-adds a pair.
    pub fn flop(&self) -> usize {
        4 * avx512bf16::MR * avx512bf16::NR * self.kp
    }

    /// `reps` tiles on this thread.
    pub fn run(&mut self, reps: usize) {
        let (mr, nr) = (avx512bf16::MR, avx512bf16::NR);
        for _ in 0..reps {
            // SAFETY: AVX512-BF16 is available (`new`); the operands hold
            // `kp` pairs and `out` one full tile of row stride NR.
            unsafe { avx512bf16::tile(&self.sliver, &self.panel, self.kp, self.out.as_mut_ptr(), nr, (mr, nr)) };
        }
    }
}

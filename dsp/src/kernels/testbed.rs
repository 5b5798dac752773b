//! A test bench for the kernels, shared by the self-tests, the property tests
//! and the benchmark: software engines, deterministic data, and the f64
//! reference product computed from the effective (FP16 or dequantized Q8_0)
//! weight, independently of the kernels' tiling, DMA and shuffles.
use super::{project, Direction, Engines, KernelError, Precision, ResidentWeight, RunStats, WeightData};
use crate::dma::software::SoftwareDma;
use crate::tile::software::SoftwareTiles;
use crate::tile::TileEngine;
use crate::vtcm::VtcmRegion;
use alloc::vec;
use alloc::vec::Vec;
use half::f16;
use hexlora_proto::q8_0::{self, BlockQ8_0, BLOCK_BYTES, QK8_0};

/// splitmix64: a small deterministic generator (same numbers on every host).
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (0 for `n` = 0), up to modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Software DMA, a tile engine (the software one unless given) and a VTCM
/// region.
pub struct Bench<T: TileEngine = SoftwareTiles> {
    /// DMA engine.
    pub dma: SoftwareDma,
    /// Tile engine.
    pub tiles: T,
    /// VTCM stand-in.
    pub vtcm: VtcmRegion,
}

impl Bench {
    /// A bench with `vtcm_bytes` of VTCM and the software tile engine.
    pub fn new(vtcm_bytes: usize) -> Bench {
        Bench::with_tiles(vtcm_bytes, SoftwareTiles::new())
    }
}

impl<T: TileEngine> Bench<T> {
    /// A bench with `vtcm_bytes` of VTCM and the tile engine `tiles`.
    pub fn with_tiles(vtcm_bytes: usize, tiles: T) -> Bench<T> {
        Bench {
            dma: SoftwareDma::new(),
            tiles,
            vtcm: VtcmRegion::new(vtcm_bytes).expect("heap too small for the VTCM stand-in"),
        }
    }

    /// Runs one op, returning the output.
    pub fn run(
        &mut self,
        w: &ResidentWeight<'_>,
        dir: Direction,
        tokens: usize,
        input: &[f32],
    ) -> Result<(Vec<f32>, RunStats), KernelError> {
        let out_width = match dir {
            Direction::Forward => w.rows(),
            Direction::InputGrad => w.cols(),
        };
        let mut out = vec![0.0f32; tokens * out_width];
        let mut eng = Engines { dma: &mut self.dma, tiles: &mut self.tiles, vtcm: &mut self.vtcm };
        let stats = project(&mut eng, w, dir, tokens, input, &mut out)?;
        Ok((out, stats))
    }
}

/// An FP16 weight `(rows, cols)` rounded from uniform values in `[-scale, scale)`.
pub fn fp16_weight(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> Vec<f16> {
    rng.vec(rows * cols, scale).into_iter().map(f16::from_f32).collect()
}

/// A Q8_0 weight `(rows, cols)` quantized (ggml rules) from uniform values.
pub fn q8_weight(rng: &mut Rng, rows: usize, cols: usize, scale: f32) -> Vec<u8> {
    let values = rng.vec(rows * cols, scale);
    let mut blocks = vec![BlockQ8_0::ZERO; rows * cols / QK8_0];
    q8_0::quantize_row(&values, &mut blocks).expect("finite values");
    blocks.iter().flat_map(|b| b.to_bytes()).collect()
}

/// The effective weight as f64, row-major `(rows, cols)`: FP16 values, or
/// each Q8_0 block through the shared dequantizer.
pub fn effective_weight(w: &ResidentWeight<'_>) -> Vec<f64> {
    match w.data() {
        WeightData::Fp16(data) => data.iter().map(|x| x.to_f64()).collect(),
        WeightData::Q8_0(bytes) => {
            let mut out = Vec::with_capacity(w.rows() * w.cols());
            for i in 0..bytes.len() / BLOCK_BYTES {
                let mut v = [f16::ZERO; QK8_0];
                q8_0::dequantize_block(&q8_0::block_at(bytes, i), &mut v);
                out.extend(v.iter().map(|x| x.to_f64()));
            }
            out
        }
    }
}

/// `(reference output, error bound)` for each output element in f64.
///
/// The bound covers the kernel's two roundings: each scaled input rounded to
/// FP16 (relative 2^-11, or absolute 2^-25 below the normal range, in scaled
/// units) and f32 accumulation (`d * 2^-24` relative to `sum |x w|`).
pub fn reference(w: &ResidentWeight<'_>, dir: Direction, tokens: usize, input: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let we = effective_weight(w);
    let (rows, cols) = (w.rows(), w.cols());
    let (d, o) = match dir {
        Direction::Forward => (cols, rows),
        Direction::InputGrad => (rows, cols),
    };
    let weight = |red: usize, out: usize| match dir {
        Direction::Forward => we[out * cols + red],
        Direction::InputGrad => we[red * cols + out],
    };
    let mut y = vec![0.0; tokens * o];
    let mut bound = vec![0.0; tokens * o];
    for t in 0..tokens {
        let x = &input[t * d..(t + 1) * d];
        // The kernel's first scale (the bound only needs its exponent).
        let k = super::activations::row_scale(x, w.max_abs(), t as u32, 0).unwrap_or(0);
        // One f16 ulp at the bottom of the subnormal range, unscaled.
        let floor = pow2(-25 - k);
        for j in 0..o {
            let (mut s, mut a, mut wsum) = (0.0f64, 0.0f64, 0.0f64);
            for r in 0..d {
                let wv = weight(r, j);
                s += x[r] as f64 * wv;
                a += (x[r] as f64 * wv).abs();
                wsum += wv.abs();
            }
            y[t * o + j] = s;
            bound[t * o + j] = a * (pow2(-11) + d as f64 * pow2(-23)) + wsum * floor + 1e-300;
        }
    }
    (y, bound)
}

/// `2^e` for `e` in the normal f64 range (core has no `powi`).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The first element where `got` leaves the reference bound, if any:
/// `(index, got, reference, bound)`.
pub fn first_violation(got: &[f32], reference: &[f64], bound: &[f64]) -> Option<(usize, f32, f64, f64)> {
    (0..got.len()).find_map(|i| {
        let err = (got[i] as f64 - reference[i]).abs();
        (!(err <= bound[i])).then_some((i, got[i], reference[i], bound[i]))
    })
}

/// FNV-1a over the bits of `values`, to compare outputs across builds.
pub fn digest(mut h: u64, values: &[f32]) -> u64 {
    for v in values {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Precision of a weight (for messages).
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Fp16 => "fp16",
        Precision::Q8_0 => "q8_0",
    }
}

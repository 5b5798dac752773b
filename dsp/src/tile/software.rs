//! The software tile engine.
//!
//! Each product `a * w` of two f16 values is exact in f32 (11 + 11
//! significant bits), and every output element sums its products in f32 in
//! the fixed order of the tile module docs ([`super`]): within a tile an
//! even chain (reduction steps 0, 2, .., 30 on top of the accumulator) and
//! an odd chain (1, 3, .., 31 from +0), then their sum; tiles in the order
//! the kernel issues them. That order, plain IEEE f32 adds (Rust never fuses
//! them) and no reassociation make results bit-identical on every host,
//! under qemu-hexagon, and with the HVX float engine, whose schedule yields
//! the same order.
//!
//! How this differs from a real HMX: HMX sums a tile's 32 products in its own
//! wider internal accumulator (not IEEE f32, with its own rounding and
//! summation tree) and converts to FP16 on read-out through a per-column
//! scale/bias stage, so device results differ from these in the low bits and
//! are FP16, where ours stay f32 until unscaled. The kernels' overflow rule
//! (partial sums must stay under 60000) is what keeps the FP16 read-out of a
//! real HMX finite, so the same rule is applied here.
use super::{weight_index, AccTile, TileEngine, TILE_DIM};
use crate::hvx::{Tile, TILE_ELEMS};

/// The software model of HMX.
#[derive(Default)]
pub struct SoftwareTiles {
    tiles: u64,
}

impl SoftwareTiles {
    /// A fresh engine.
    pub fn new() -> SoftwareTiles {
        SoftwareTiles::default()
    }
}

/// The weight tile widened to f32, row-major `(i, j)`.
fn widen_weight(weight: &Tile) -> [f32; TILE_ELEMS] {
    let mut w = [0f32; TILE_ELEMS];
    for i in 0..TILE_DIM {
        for j in 0..TILE_DIM {
            w[i * TILE_DIM + j] = weight[weight_index(i, j)].to_f32();
        }
    }
    w
}

/// `acc += act * w` in the order of the module docs, `w` widened and
/// row-major. Each output column is its own chain, so vectorizing over `j`
/// (what the x86 builds below do) changes no add; Rust never fuses the
/// multiply into the add, with or without FMA in the target features.
/// `G` rows are interleaved: their chains are independent, and one row's
/// 16 dependent adds alone leave the adder waiting on its latency.
#[inline(always)]
fn mac_rows<const G: usize>(acc: &mut AccTile, act: &[f32; TILE_ELEMS], w: &[f32; TILE_ELEMS]) {
    for m0 in (0..TILE_DIM).step_by(G) {
        let mut even = [[0f32; TILE_DIM]; G];
        let mut odd = [[0f32; TILE_DIM]; G];
        for g in 0..G {
            even[g].copy_from_slice(&acc[(m0 + g) * TILE_DIM..][..TILE_DIM]);
        }
        for r in 0..TILE_DIM / 2 {
            let (i0, i1) = (2 * r, 2 * r + 1);
            let (w0, w1) = (&w[i0 * TILE_DIM..][..TILE_DIM], &w[i1 * TILE_DIM..][..TILE_DIM]);
            for g in 0..G {
                let (a0, a1) = (act[(m0 + g) * TILE_DIM + i0], act[(m0 + g) * TILE_DIM + i1]);
                for j in 0..TILE_DIM {
                    even[g][j] += a0 * w0[j];
                    odd[g][j] += a1 * w1[j];
                }
            }
        }
        for g in 0..G {
            let row = &mut acc[(m0 + g) * TILE_DIM..][..TILE_DIM];
            for j in 0..TILE_DIM {
                row[j] = even[g][j] + odd[g][j];
            }
        }
    }
}

/// The portable engine: what qemu-hexagon and every non-x86 host run.
pub fn mac_portable(acc: &mut AccTile, act: &Tile, weight: &Tile) {
    let mut a = [0f32; TILE_ELEMS];
    for (a, x) in a.iter_mut().zip(act.iter()) {
        *a = x.to_f32();
    }
    mac_rows::<1>(acc, &a, &widen_weight(weight));
}

/// x86-64 hosts: the same adds over AVX-512 or AVX2 vectors, chosen at run
/// time (the split runtime's CPU stand-in spends most of a training step
/// here; the generic x86-64 build has only SSE2, whose 16 registers cannot
/// hold the two 32-wide chains). Conversions of f16 are exact, so F16C
/// gives the bits `half` gives.
#[cfg(all(target_arch = "x86_64", any(test, feature = "std")))]
mod x86 {
    use super::{mac_rows, weight_index, AccTile, Tile, TILE_DIM, TILE_ELEMS};
    use core::arch::x86_64::{_mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    use core::sync::atomic::{AtomicU8, Ordering};

    /// 0 = not probed, 1 = portable, 2 = AVX2 + F16C, 3 = AVX-512F + F16C.
    static LEVEL: AtomicU8 = AtomicU8::new(0);

    pub fn level() -> u8 {
        match LEVEL.load(Ordering::Relaxed) {
            0 => {
                let f16c = std::is_x86_feature_detected!("f16c");
                let l = if f16c && std::is_x86_feature_detected!("avx512f") {
                    3
                } else if f16c && std::is_x86_feature_detected!("avx2") {
                    2
                } else {
                    1
                };
                LEVEL.store(l, Ordering::Relaxed);
                l
            }
            l => l,
        }
    }

    /// Widens 1024 f16 values with F16C, 8 at a time.
    #[inline(always)]
    unsafe fn widen(src: &Tile, dst: &mut [f32; TILE_ELEMS]) {
        for k in 0..TILE_ELEMS / 8 {
            let v = _mm_loadu_si128(src.as_ptr().add(8 * k).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(8 * k), _mm256_cvtph_ps(v));
        }
    }

    /// `G` rows at a time: 4 fill AVX-512's 32 registers with 16
    /// accumulators, 2 AVX2's 16.
    #[inline(always)]
    unsafe fn mac_widened<const G: usize>(acc: &mut AccTile, act: &Tile, weight: &Tile) {
        let mut a = [0f32; TILE_ELEMS];
        let mut raw = [0f32; TILE_ELEMS];
        widen(act, &mut a);
        widen(weight, &mut raw);
        let mut w = [0f32; TILE_ELEMS];
        for i in 0..TILE_DIM {
            for j in 0..TILE_DIM {
                w[i * TILE_DIM + j] = raw[weight_index(i, j)];
            }
        }
        mac_rows::<G>(acc, &a, &w);
    }

    /// # Safety
    /// The CPU has AVX2 and F16C ([`level`] >= 2).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn mac_avx2(acc: &mut AccTile, act: &Tile, weight: &Tile) {
        mac_widened::<2>(acc, act, weight)
    }

    /// # Safety
    /// The CPU has AVX-512F and F16C ([`level`] == 3).
    #[target_feature(enable = "avx512f,avx2,f16c")]
    pub unsafe fn mac_avx512(acc: &mut AccTile, act: &Tile, weight: &Tile) {
        mac_widened::<4>(acc, act, weight)
    }
}

impl TileEngine for SoftwareTiles {
    fn mac(&mut self, acc: &mut AccTile, act: &Tile, weight: &Tile) {
        self.tiles += 1;
        #[cfg(all(target_arch = "x86_64", any(test, feature = "std")))]
        match x86::level() {
            // SAFETY: level() probed the features each function enables.
            3 => return unsafe { x86::mac_avx512(acc, act, weight) },
            2 => return unsafe { x86::mac_avx2(acc, act, weight) },
            _ => {}
        }
        mac_portable(acc, act, weight)
    }

    fn tiles(&self) -> u64 {
        self.tiles
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use half::f16;

    /// A tile of f16 bit patterns from a counter hash: every exponent,
    /// subnormals, signed zeros and both infinities (NaNs kept out: their
    /// payload through a sum is not part of the contract).
    fn tile(seed: u64) -> Tile {
        let mut t = [f16::ZERO; TILE_ELEMS];
        let mut s = seed;
        for x in t.iter_mut() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let bits = (s >> 48) as u16;
            let v = f16::from_bits(bits);
            *x = if v.is_nan() { f16::from_bits(bits & 0x83ff) } else { v };
        }
        t
    }

    /// Each vector engine gives the portable engine's bits, infinities and
    /// overflow to inf (and inf - inf = NaN) included.
    #[test]
    fn x86_engines_equal_the_portable_one() {
        let level = x86::level();
        for seed in 0..64u64 {
            let (act, weight) = (tile(seed), tile(seed + 1000));
            let mut init = [0f32; TILE_ELEMS];
            for (k, v) in init.iter_mut().enumerate() {
                *v = (k as f32 - 512.0) * 0.37;
            }
            let mut want = init;
            mac_portable(&mut want, &act, &weight);
            let mut got = Vec::new();
            if level >= 2 {
                let mut a = init;
                unsafe { x86::mac_avx2(&mut a, &act, &weight) };
                got.push(("avx2", a));
            }
            if level >= 3 {
                let mut a = init;
                unsafe { x86::mac_avx512(&mut a, &act, &weight) };
                got.push(("avx512", a));
            }
            for (name, a) in got {
                for k in 0..TILE_ELEMS {
                    assert_eq!(a[k].to_bits(), want[k].to_bits(), "{name} seed {seed} element {k}");
                }
            }
        }
    }
}

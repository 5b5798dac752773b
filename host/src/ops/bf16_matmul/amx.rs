//! The AMX kernel: `C[m, n] += A[m, k] B[k, n]` on 16x16 f32 tiles with
//! `TDPBF16PS`, through inline assembly (stable Rust has no AMX intrinsics).
//!
//! Tile registers: `tmm0..3` accumulate a 32x32 block of C, `tmm4/5` hold
//! two 16-row A tiles (16 rows x 32 bf16), `tmm6/7` two B tiles. A `B` tile
//! is 16 rows of 16 bf16 *pairs*: row `r`, pair `j` holds
//! `(B[2r][j], B[2r + 1][j])` (the "VNNI" layout). A is the bf16-rounded
//! activation, padded to whole tiles; B tiles come from the row-major
//! weight, laid out per 32-wide output panel by `prep` (see `mod.rs`).
//!
//! Linux hands out the tile state only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). The permission
//! belongs to the process: threads that existed before the request (rayon's
//! workers) and threads started after it may all use the tiles (checked on
//! this machine), so it is asked for once.
use super::{round_padded, OutPtr};
use rayon::prelude::*;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of a tile; also the f32 columns of a C tile.
const TM: usize = 16;
/// bf16 values in one tile row (64 bytes).
const TK: usize = 32;
/// Bytes of one bf16 tile.
const TILE_U16: usize = TM * TK;

const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
const XFEATURE_XTILEDATA: i64 = 18;
const SYS_ARCH_PRCTL: i64 = 158;

/// CPUID says AMX-TILE and AMX-BF16, and Linux granted the tile state.
pub(super) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_bf16() && request_permission())
}

fn cpu_has_amx_bf16() -> bool {
    // Leaf 7 exists when the max leaf (leaf 0's eax) is at least 7.
    if std::arch::x86_64::__cpuid(0).eax < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

fn request_permission() -> bool {
    let ret: i64;
    // SAFETY: arch_prctl only changes this process's permitted xstate
    // features; the syscall clobbers rcx and r11 and nothing else.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

/// Palette 1, all eight tiles 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn full() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = TM as u8;
        }
        TileConfig(c)
    }
}

/// Loads the tile configuration on this thread; releases it when dropped.
struct Tiles;

impl Tiles {
    fn load() -> Tiles {
        let cfg = TileConfig::full();
        // SAFETY: `available()` was checked by the caller's dispatch; the
        // config is 64-byte aligned and valid for palette 1.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases the tile state loaded in `Tiles::load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]` row-major bits.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) {
    let (mp, kp) = (tokens.next_multiple_of(2 * TM), k.next_multiple_of(TK));
    let a = round_padded(x, tokens, k, mp, kp);
    // B[p][j] = W[j][p]: tile (kb, half) row r, pair c = W[n0 + 16 half + c][32 kb + 2r .. + 2]
    let prep = |n0: usize, panel: &mut [u16]| {
        for kb in 0..kp / TK {
            for half in 0..2 {
                let tile = &mut panel[(2 * kb + half) * TILE_U16..][..TILE_U16];
                let o0 = n0 + TM * half;
                if o0 + TM <= n && TK * (kb + 1) <= k {
                    // SAFETY: AMX CPUs have AVX-512; the tile lies inside `w`.
                    unsafe { pairs_transposed(tile, &w[o0 * k + TK * kb..], k) };
                    continue;
                }
                for c in 0..TM {
                    let o = o0 + c;
                    let row = if o < n { &w[o * k..(o + 1) * k] } else { &[][..] };
                    for r in 0..TM {
                        let p = TK * kb + 2 * r;
                        tile[r * TK + 2 * c] = row.get(p).copied().unwrap_or(0);
                        tile[r * TK + 2 * c + 1] = row.get(p + 1).copied().unwrap_or(0);
                    }
                }
            }
        }
    };
    product(out, &a, (tokens, mp, kp), n, &prep);
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]` bits.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: &[u16], rows: usize, cols: usize) {
    let (mp, kp) = (tokens.next_multiple_of(2 * TM), rows.next_multiple_of(TK));
    let a = round_padded(dy, tokens, rows, mp, kp);
    // B = W: tile (kb, half) row r, pair c = (W[32 kb + 2r][n0 + 16 half + c], W[32 kb + 2r + 1][..])
    let prep = |n0: usize, panel: &mut [u16]| {
        for kb in 0..kp / TK {
            for half in 0..2 {
                let tile = &mut panel[(2 * kb + half) * TILE_U16..][..TILE_U16];
                let c0 = n0 + TM * half;
                if c0 + TM <= cols && TK * (kb + 1) <= rows {
                    // SAFETY: AMX CPUs have AVX-512; the tile lies inside `w`.
                    unsafe { rows_interleaved(tile, &w[TK * kb * cols + c0..], cols) };
                    continue;
                }
                let width = cols.saturating_sub(c0).min(TM);
                for r in 0..TM {
                    let dst = &mut tile[r * TK..(r + 1) * TK];
                    dst.fill(0);
                    for (h, o) in [TK * kb + 2 * r, TK * kb + 2 * r + 1].into_iter().enumerate() {
                        if o < rows && width > 0 {
                            let src = &w[o * cols + c0..o * cols + c0 + width];
                            src.iter().enumerate().for_each(|(c, &v)| dst[2 * c + h] = v);
                        }
                    }
                }
            }
        }
    };
    product(out, &a, (tokens, mp, kp), cols, &prep);
}

/// A whole forward B tile: `tile[r][c]` (as u32 pairs) = pair `r` of row
/// `c` of `w` (16 rows of 32 bf16 from `w[0]`, row stride `k`).
///
/// # Safety
/// AVX-512 available; `w` holds 15 * k + 32 values.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs_transposed(tile: &mut [u16], w: &[u16], k: usize) {
    assert!(tile.len() == TILE_U16 && w.len() >= (TM - 1) * k + TK);
    let (dst, src) = (tile.as_mut_ptr().cast::<u32>(), w.as_ptr());
    for c in 0..TM {
        for r in 0..TM {
            // SAFETY: bounds asserted above; pairs read unaligned.
            unsafe { *dst.add(r * TM + c) = src.add(c * k + 2 * r).cast::<u32>().read_unaligned() };
        }
    }
}

/// A whole input-gradient B tile: row `r` interleaves rows `2r` and
/// `2r + 1` of `w` (16 values each from `w[0]`, row stride `cols`).
///
/// # Safety
/// AVX-512 available; `w` holds 31 * cols + 16 values.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows_interleaved(tile: &mut [u16], w: &[u16], cols: usize) {
    assert!(tile.len() == TILE_U16 && w.len() >= (TK - 1) * cols + TM);
    for (r, dst) in tile.chunks_exact_mut(TK).enumerate() {
        let (a, b) = (&w[2 * r * cols..][..TM], &w[(2 * r + 1) * cols..][..TM]);
        for c in 0..TM {
            dst[2 * c] = a[c];
            dst[2 * c + 1] = b[c];
        }
    }
}

/// `out[m, n] = A B` with `a: [mp, kp]` padded bf16 and the B tiles of the
/// 32 columns from `n0` written by `prep(n0, panel)` (`[kp / 32][2]` tiles).
/// Panels run in parallel; each writes only its own columns of `out`.
fn product(out: &mut [f32], a: &[u16], (m, mp, kp): (usize, usize, usize), n: usize, prep: &(dyn Fn(usize, &mut [u16]) + Sync)) {
    if m == 0 || n == 0 {
        return;
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(2 * TM)).into_par_iter().for_each_init(
        || vec![0u16; kp / TK * 2 * TILE_U16],
        |panel, p| {
            let out_ptr = out_ptr;
            let n0 = p * 2 * TM;
            prep(n0, panel);
            let _tiles = Tiles::load();
            for m0 in (0..mp).step_by(2 * TM) {
                // SAFETY: `a` is [mp, kp] and `panel` [kp / 32 * 2] tiles;
                // `store` writes only rows < m and columns n0 .. n0 + 32 (< n)
                // of `out` ([m, n]), which no other panel writes.
                unsafe {
                    block(a.as_ptr().add(m0 * kp), kp, panel);
                    store(out_ptr.0, (m, n), m0, n0);
                }
            }
        },
    );
}

/// Accumulates the 32x32 block `tmm0..3` = A rows (32, from `a`, row
/// stride `kp` bf16) times the panel's B tiles, over all of `kp`.
///
/// # Safety
/// Tiles configured by [`Tiles::load`]; `a` points at 32 rows of `kp` bf16;
/// `panel` holds `kp / 32 * 2` tiles.
unsafe fn block(a: *const u16, kp: usize, panel: &[u16]) {
    let stride = kp * 2;
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for kb in 0..kp / TK {
            let a0 = a.add(kb * TK);
            let a1 = a0.add(TM * kp);
            let b0 = panel.as_ptr().add(2 * kb * TILE_U16);
            let b1 = b0.add(TILE_U16);
            asm!(
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tileloadd tmm6, [{b0} + {bs}*1]",
                "tileloadd tmm7, [{b1} + {bs}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1,
                s = in(reg) stride, bs = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Writes the 32x32 block in `tmm0..3` (rows `m0..`, columns `n0..`) into
/// `out: [m, n]`, dropping the padding rows and columns.
///
/// # Safety
/// Tiles hold a finished block; `out` is `[m, n]` and the caller owns
/// columns `n0 .. min(n0 + 32, n)` of it.
unsafe fn store(out: *mut f32, (m, n): (usize, usize), m0: usize, n0: usize) {
    #[repr(C, align(64))]
    struct Scratch([f32; TM * TM]);
    let mut s = Scratch([0.0; TM * TM]);
    for (t, (dr, dc)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
        let (r0, c0) = (m0 + TM * dr, n0 + TM * dc);
        if r0 >= m || c0 >= n {
            continue;
        }
        let (rows, cols) = ((m - r0).min(TM), (n - c0).min(TM));
        unsafe {
            if rows == TM && cols == TM {
                store_tile(t, out.add(r0 * n + c0), n * 4);
            } else {
                store_tile(t, s.0.as_mut_ptr(), TM * 4);
                for r in 0..rows {
                    std::ptr::copy_nonoverlapping(s.0.as_ptr().add(r * TM), out.add((r0 + r) * n + c0), cols);
                }
            }
        }
    }
}

/// `tilestored` of `tmm{t}` (t in 0..4) at `dst` with `stride` bytes.
///
/// # Safety
/// `dst` has 16 rows of 16 f32 at `stride` bytes.
unsafe fn store_tile(t: usize, dst: *mut f32, stride: usize) {
    unsafe {
        match t {
            0 => asm!("tilestored [{d} + {s}*1], tmm0", d = in(reg) dst, s = in(reg) stride, options(nostack)),
            1 => asm!("tilestored [{d} + {s}*1], tmm1", d = in(reg) dst, s = in(reg) stride, options(nostack)),
            2 => asm!("tilestored [{d} + {s}*1], tmm2", d = in(reg) dst, s = in(reg) stride, options(nostack)),
            _ => asm!("tilestored [{d} + {s}*1], tmm3", d = in(reg) dst, s = in(reg) stride, options(nostack)),
        }
    }
}

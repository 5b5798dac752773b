//! The AMX kernel: `C[m, n] += A[m, k] B[k, n]` on 16x16 f32 tiles with
//! `TDPBF16PS`, through inline assembly (stable Rust has no AMX intrinsics).
//!
//! Tile registers: `tmm0..3` accumulate a 32x32 block of C, `tmm4/5` hold
//! two 16-row A tiles (16 rows x 32 bf16), `tmm6/7` two B tiles. A `B` tile
//! is 16 rows of 16 bf16 *pairs*: row `r`, pair `j` holds
//! `(B[2r][j], B[2r + 1][j])` (the "VNNI" layout). A is the bf16-rounded
//! activation, stored per 32-row block in the order the tile loop reads it;
//! B tiles come from the row-major weight, laid out per 32-wide output
//! panel by `prep` (see `mod.rs`). Both live in 64-byte-aligned buffers
//! reused across calls: tile loads whose rows straddle cache lines are
//! about ten times slower.
//!
//! Linux hands out the tile state only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). The permission
//! belongs to the process: threads that existed before the request (rayon's
//! workers) and threads started after it may all use the tiles (checked on
//! this machine), so it is asked for once.
use super::avx512_pack::{interleave, lanes, round16, transpose16, Source};
use crate::ops::SharedMut;
use rayon::prelude::*;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows of a tile; also the f32 columns of a C tile.
pub(super) const TM: usize = 16;
/// bf16 values in one tile row (64 bytes).
pub(super) const TK: usize = 32;
/// Bytes of one bf16 tile.
pub(super) const TILE_U16: usize = TM * TK;

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
pub(super) struct Tiles;

impl Tiles {
    pub(super) fn load() -> Tiles {
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

/// `out[tokens, n] = bf16(x[tokens, k]) W^T`, `w: [n, k]`.
pub(super) fn forward(out: &mut [f32], x: &[f32], tokens: usize, w: Source<'_>, n: usize, k: usize) {
    forward_riding(out, x, tokens, w, (n, k), None);
}

/// [`forward`] with an optional LoRA ride.
fn forward_riding(out: &mut [f32], x: &[f32], tokens: usize, w: Source<'_>, (n, k): (usize, usize), ride: Option<Ride<'_>>) {
    let prep = transposed_panels(w, (n, k));
    // the panel reads columns p0 .. p0 + width of rows n0 .. n0 + 32
    let touch = |n0: usize, (p0, width): (usize, usize), part: usize, parts: usize| {
        let end = n.min(n0 + 2 * TM);
        for o in n0 + (end - n0) * part / parts..n0 + (end - n0) * (part + 1) / parts {
            w.prefetch(o, k, p0, width);
        }
    };
    product(out, x, (tokens, k), n, &prep, &touch, ride);
}

/// The forward's panel layout of `w: [n, k]` bits (`B[p][j] = W[j][p]`):
/// tile `(kb, half)` row `r`, pair `c` = `W[n0 + 16 half + c][p0 + 32 kb + 2r .. + 2]`.
fn transposed_panels(w: Source<'_>, (n, k): (usize, usize)) -> impl Fn(usize, usize, &mut [u16]) + Sync + '_ {
    w.check((n, k));
    move |n0, p0, panel| {
        for (kb, tiles) in panel.chunks_exact_mut(2 * TILE_U16).enumerate() {
            for (half, tile) in tiles.chunks_exact_mut(TILE_U16).enumerate() {
                // SAFETY: AMX CPUs have AVX-512; `pairs_transposed` clips to `w: [n, k]`.
                unsafe { pairs_transposed(tile, w, (n, k), n0 + TM * half, p0 + TK * kb) };
            }
        }
    }
}

/// The input gradient's panel layout of `w: [rows, cols]` bits (`B = W`):
/// tile `(kb, half)` row `r`, pair `c` =
/// `(W[p0 + 32 kb + 2r][n0 + 16 half + c], W[p0 + 32 kb + 2r + 1][..])`.
fn interleaved_panels(w: Source<'_>, (rows, cols): (usize, usize)) -> impl Fn(usize, usize, &mut [u16]) + Sync + '_ {
    w.check((rows, cols));
    move |n0, p0, panel| {
        for (kb, tiles) in panel.chunks_exact_mut(2 * TILE_U16).enumerate() {
            // SAFETY: AMX CPUs have AVX-512; `rows_interleaved` clips to `w: [rows, cols]`.
            unsafe { rows_interleaved(tiles, w, (rows, cols), p0 + TK * kb, n0) };
        }
    }
}

/// [`forward`] carrying a LoRA branch (see [`Ride`]; `a2 = [A_hi; A_lo]:
/// [2r, k]`, `b3 = [B_hi | B_hi | B_lo]: [n, 3r]`, bf16 bits):
/// `xa[tokens, r] = bf16(x) A^T`, then `out = bf16(x) W^T + scale xa B^T`.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_lora(out: &mut [f32], x: &[f32], tokens: usize, w: Source<'_>, (n, k): (usize, usize), (a2, b3, r): (&[u16], &[u16], usize), scale: f32, xa: &mut [f32]) {
    let (side_prep, ext_prep) = (transposed_panels(Source::Bits(a2), (2 * r, k)), transposed_panels(Source::Bits(b3), (n, 3 * r)));
    let ride = Ride { rank: r, side_prep: &side_prep, side_scale: 1.0, side: xa, ext_scale: scale, ext_prep: &|n0, tiles| ext_prep(n0, 0, tiles), token_sums: None };
    forward_riding(out, x, tokens, w, (n, k), Some(ride));
}

/// [`input_grad`] carrying a LoRA branch (see [`Ride`]; `a3 = [A_hi; A_hi;
/// A_lo]: [3r, cols]`, `b2 = [B_hi | B_lo]: [rows, 2r]`, bf16 bits):
/// `dxa[tokens, r] = scale bf16(dy) B`, then `out = bf16(dy) W + dxa A`.
/// With `token_sums = Some((xa, dbt))` it also writes `dbt[r, rows] =
/// xa^T bf16(dy)` (`r <= 32`, see [`token_sums`]).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub(super) fn input_grad_lora(
    out: &mut [f32],
    dy: &[f32],
    tokens: usize,
    w: Source<'_>,
    (rows, cols): (usize, usize),
    (a3, b2, r): (&[u16], &[u16], usize),
    scale: f32,
    dxa: &mut [f32],
    token_sums: Option<(&[f32], &mut [f32])>,
) {
    let (side_prep, ext_prep) = (interleaved_panels(Source::Bits(b2), (rows, 2 * r)), interleaved_panels(Source::Bits(a3), (3 * r, cols)));
    let ride = Ride { rank: r, side_prep: &side_prep, side_scale: scale, side: dxa, ext_scale: 1.0, ext_prep: &|n0, tiles| ext_prep(n0, 0, tiles), token_sums };
    input_grad_riding(out, dy, tokens, w, (rows, cols), Some(ride));
}

/// Whether a product with reduction `k` over `m` rows runs in one pass (the
/// condition for carrying a LoRA branch).
pub(super) fn one_pass(m: usize, k: usize) -> bool {
    k <= k_chunk(m.next_multiple_of(2 * TM))
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`, `w: [rows, cols]`.
pub(super) fn input_grad(out: &mut [f32], dy: &[f32], tokens: usize, w: Source<'_>, rows: usize, cols: usize) {
    input_grad_riding(out, dy, tokens, w, (rows, cols), None);
}

/// [`input_grad`] with an optional LoRA ride.
fn input_grad_riding(out: &mut [f32], dy: &[f32], tokens: usize, w: Source<'_>, (rows, cols): (usize, usize), ride: Option<Ride<'_>>) {
    let prep = interleaved_panels(w, (rows, cols));
    // the panel is a 32-column strip of rows p0 .. p0 + width of W
    let touch = |c0: usize, (p0, width): (usize, usize), part: usize, parts: usize| {
        for o in p0 + width * part / parts..p0 + width * (part + 1) / parts {
            w.prefetch(o, cols, c0, cols.min(c0 + 2 * TM) - c0);
        }
    };
    product(out, dy, (tokens, rows), cols, &prep, &touch, ride);
}

/// Asks for the lines of `out: [m, n]` that the block at rows `m0..` and
/// columns `n0..` will write, for writing (a plain store that misses waits
/// for the line; measured: a third of a 256x576->1536 forward went there).
fn prefetch_out(out: *mut f32, (m, n): (usize, usize), m0: usize, n0: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
    let width = n.saturating_sub(n0).min(2 * TM);
    for r in m0..m.min(m0 + 2 * TM) {
        let start = out.wrapping_add(r * n + n0) as usize;
        for line in (start & !63..start + 4 * width).step_by(64) {
            // SAFETY: prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_ET0>(line as *const i8) };
        }
    }
}

/// The forward B tile of output columns `o0 .. o0 + 16` and inputs
/// `p0 .. p0 + 32`: `tile[r][c]` (as u32 pairs) = `W[o0 + c][p0 + 2r .. + 2]`,
/// zero outside `w: [n, k]`. A 16x16 transpose of u32 in registers.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pairs_transposed(tile: &mut [u16], w: Source<'_>, (n, k): (usize, usize), o0: usize, p0: usize) {
    use std::arch::x86_64::*;
    assert!(tile.len() == TILE_U16 && p0 < k.max(1));
    let mask = lanes(k - p0);
    let mut r = [_mm512_setzero_si512(); TM];
    for (c, v) in r.iter_mut().enumerate().take(n.saturating_sub(o0)) {
        // SAFETY: row o0 + c < n (the panel checked `w` holds [n, k]).
        *v = unsafe { w.load32(o0 + c, k, p0, mask) };
    }
    let dst = tile.as_mut_ptr().cast::<__m512i>();
    for (i, row) in unsafe { transpose16(&r) }.iter().enumerate() {
        // SAFETY: `tile` holds 16 rows of 64 bytes.
        unsafe { _mm512_storeu_si512(dst.add(i), *row) };
    }
}

/// The two input-gradient B tiles of weight rows `o0 .. o0 + 32` and
/// columns `c0 .. c0 + 32`: tile `h` row `r` interleaves
/// `W[o0 + 2r][c0 + 16h ..]` and `W[o0 + 2r + 1][c0 + 16h ..]` (16 each),
/// zero outside `w: [rows, cols]`.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn rows_interleaved(tiles: &mut [u16], w: Source<'_>, (rows, cols): (usize, usize), o0: usize, c0: usize) {
    use std::arch::x86_64::*;
    assert!(tiles.len() == 2 * TILE_U16 && c0 < cols.max(1));
    let mask = lanes(cols - c0);
    let load = |o: usize| {
        if o < rows {
            // SAFETY: row o < rows (the panel checked `w` holds [rows, cols]).
            unsafe { w.load32(o, cols, c0, mask) }
        } else {
            _mm512_setzero_si512()
        }
    };
    // word i of the result: even i from the first row, odd from the second
    let idx = |h: u16| _mm512_loadu_si512(interleave(h).as_ptr().cast());
    let (lo, hi) = (idx(0), idx(1));
    let dst = tiles.as_mut_ptr().cast::<__m512i>();
    for r in 0..TM {
        let (a, b) = (load(o0 + 2 * r), load(o0 + 2 * r + 1));
        // SAFETY: `tiles` holds 2 x 16 rows of 64 bytes.
        unsafe {
            _mm512_storeu_si512(dst.add(r), _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(dst.add(TM + r), _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/// One 64-byte line of 32 bf16. Tile buffers are made of lines because a
/// tile load whose rows straddle cache lines is ~10x slower (measured here:
/// 4 loads from L1 in ~14 ns aligned, ~145 ns at 16 bytes off).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line([u16; TK]);

/// A reusable, line-aligned tile buffer.
#[derive(Default)]
pub(super) struct TileBuf(Vec<Line>);

impl TileBuf {
    /// The first `len` values (a multiple of 32), grown if needed; old
    /// contents are left as they were. Never shrinks: products of
    /// different shapes alternate, and growing back zeroed the tail each
    /// time (~1% of a training step, serial).
    fn resized(&mut self, len: usize) -> &mut [u16] {
        debug_assert!(len.is_multiple_of(TK));
        if self.0.len() < len / TK {
            self.0.resize(len / TK, Line([0; TK]));
        }
        // SAFETY: `len / 32` lines of 32 u16 each, no padding (repr C).
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u16>(), len) }
    }

    /// A buffer of these lines.
    pub(super) fn from_lines(lines: Vec<Line>) -> TileBuf {
        TileBuf(lines)
    }

    /// All values.
    pub(super) fn as_slice(&self) -> &[u16] {
        // SAFETY: as in `resized`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<u16>(), self.0.len() * TK) }
    }
}

thread_local! {
    /// The rounded activation of the current product (taken during a call).
    static ACTIVATION: std::cell::Cell<TileBuf> = const { std::cell::Cell::new(TileBuf(Vec::new())) };
    /// This thread's B panel.
    static PANEL: std::cell::Cell<TileBuf> = const { std::cell::Cell::new(TileBuf(Vec::new())) };
}

/// `x: [m, k]` rounded to bf16 into `a` in the order [`block`] reads it:
/// `[mp / 32][kp / 32][2 tiles of 16 rows x 32]`, zero padded, each block
/// `stride / 32` tile pairs long (a ride's extra columns follow `kp`).
/// Every element up to `kp` is written, so `a` is reused between calls
/// without clearing.
fn round_blocked(a: &mut [u16], x: &[f32], (m, k): (usize, usize), (p0, width): (usize, usize), stride: usize) {
    let kp = width.next_multiple_of(TK);
    a.par_chunks_mut(2 * TM * stride).enumerate().for_each(|(mb, blk)| {
        let rows = m.saturating_sub(2 * TM * mb).min(2 * TM);
        // SAFETY: AMX CPUs have AVX-512.
        unsafe { round_block(&mut blk[..2 * TM * kp], &x[2 * TM * mb * k..(2 * TM * mb + rows) * k], k, (p0, width)) };
    });
}

/// One 32-row block of [`round_blocked`]: columns `p0 .. p0 + width` of
/// `x: [rows <= 32, k]` into `blk: [kp / 32][32 rows][32]` (`kp` = width
/// rounded up), rounded as [`super::round_bits`] does.
///
/// # Safety
/// AVX-512 F and BW available.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_block(blk: &mut [u16], x: &[f32], k: usize, (p0, width): (usize, usize)) {
    use std::arch::x86_64::*;
    let kp = width.next_multiple_of(TK);
    assert!(blk.len() == 2 * TM * kp && x.len() <= 2 * TM * k && p0 + width <= k);
    let rows = x.len() / k.max(1);
    let dst = blk.as_mut_ptr();
    for i in 0..2 * TM {
        for p in (0..kp).step_by(TM) {
            let len = if i < rows { width.saturating_sub(p).min(TM) } else { 0 };
            let b = if len == 0 {
                _mm512_setzero_si512()
            } else {
                // SAFETY: lanes below `len` lie inside row i of `x`.
                unsafe { _mm512_castps_si512(_mm512_maskz_loadu_ps(lanes(len) as u16, x.as_ptr().add(i * k + p0 + p))) }
            };
            let bits = unsafe { round16(b) };
            // tile pair p / 32, row i, values p % 32 .. + 16
            // SAFETY: inside `blk` ([kp / 32][32][32]).
            unsafe { _mm256_storeu_si256(dst.add((p / TK) * 2 * TILE_U16 + i * TK + p % TK).cast(), bits) };
        }
    }
}

/// Reduction columns per pass of [`product`]: the rounded activation of
/// one pass (`mp` rows) stays within ~768 KB, so that every panel reads it
/// from L2 (measured: a 256x4096 activation, 2 MB, made the head's input
/// gradient several times slower than the 256x1536 one).
fn k_chunk(mp: usize) -> usize {
    ((768 << 10) / (2 * mp)).max(TK) / TK * TK
}

/// A rank-`r` LoRA branch carried by a product ([`forward_lora`],
/// [`input_grad_lora`]), with every bf16 operand of its own carried as a
/// sum of two bf16 (`split(v) = bf16(v) + bf16(v - bf16(v))`, ~16 bits):
///
/// - before the main panels run, the side product
///   `side[m, r] = side_scale x S` is taken from the activation already
///   rounded for them, with `S` as `[S_hi | S_lo]` (`2r` columns, B tiles
///   from `side_prep` laid out like the main ones), the halves summed;
/// - then `[hi, lo, hi]` of `ext_scale side` become `rp` (= `3r` rounded
///   up to 32) more reduction columns of that activation, multiplied by
///   the tiles of `[T_hi; T_hi; T_lo]` (the branch's other factor) that
///   `ext_prep(n0, tiles)` writes for each panel.
///
/// Only the activation is rounded once, as the frozen product rounds it.
/// With single bf16 factors the fixture Llama's loss moved 1.1e-3
/// (relative) from f32's, ten times what bf16 frozen weights alone move
/// it, and layer 0's adapter gradients fell to cosine 0.974: the branch's
/// products sum only `r` terms (or a large trained factor meets a small
/// one), so their rounding does not average out the way `W`'s does.
pub(super) struct Ride<'a> {
    pub rank: usize,
    pub side_prep: &'a (dyn Fn(usize, usize, &mut [u16]) + Sync),
    pub side_scale: f32,
    pub side: &'a mut [f32],
    pub ext_scale: f32,
    pub ext_prep: &'a (dyn Fn(usize, &mut [u16]) + Sync),
    /// `(u: [m, r], out: [r, k])`: after the panels, `out = u^T x` from the
    /// rounded activation still in tile order ([`token_sums`]).
    pub token_sums: Option<(&'a [f32], &'a mut [f32])>,
}

/// `out[m, n] = bf16(x[m, k]) B` with the B tiles of the 32 columns from
/// `n0` and reduction indices from `p0` written by `prep(n0, p0, panel)`
/// (`[kp / 32][2]` tiles), plus the branch `ride` carries (which needs a
/// single pass, see [`one_pass`]). The reduction runs in passes of
/// [`k_chunk`] columns; passes after the first add to `out`, always in pass
/// order. Panels run in parallel; each writes only its own columns of
/// `out`, so every element is summed by one thread in a fixed order. While
/// a panel is multiplied, `touch(n0 + 32, (p0, width), part, parts)`
/// prefetches the weight the next panel's `prep` will read (rayon hands
/// each thread a contiguous range of panels, so that is usually this
/// thread's next one).
#[allow(clippy::type_complexity)]
fn product(
    out: &mut [f32],
    x: &[f32],
    (m, k): (usize, usize),
    n: usize,
    prep: &(dyn Fn(usize, usize, &mut [u16]) + Sync),
    touch: &(dyn Fn(usize, (usize, usize), usize, usize) + Sync),
    mut ride: Option<Ride<'_>>,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let mp = m.next_multiple_of(2 * TM);
    let kc = k_chunk(mp);
    assert!(ride.is_none() || k <= kc, "a LoRA ride needs a one-pass product");
    let rp = ride.as_ref().map_or(0, |r| (3 * r.rank).next_multiple_of(TK));
    let mut a_buf = ACTIVATION.take();
    for p0 in (0..k).step_by(kc) {
        let width = kc.min(k - p0);
        let kp = width.next_multiple_of(TK);
        let stride = kp + rp;
        let a = a_buf.resized(mp * stride);
        round_blocked(a, x, (m, k), (p0, width), stride);
        if let Some(ride) = ride.as_mut() {
            side_product(a, (kp, stride), ride);
        }
        let a = &*a;
        let ext = ride.as_ref().map(|r| r.ext_prep);
        let out_ptr = SharedMut(out.as_mut_ptr());
        (0..n.div_ceil(2 * TM)).into_par_iter().for_each(|p| {
            let out_ptr = out_ptr;
            let n0 = p * 2 * TM;
            prefetch_out(out_ptr.0, (m, n), 0, n0);
            let mut panel_buf = PANEL.take();
            let panel = panel_buf.resized(stride * 2 * TM);
            prep(n0, p0, &mut panel[..kp * 2 * TM]);
            if let Some(ext_prep) = ext {
                ext_prep(n0, &mut panel[kp * 2 * TM..]);
            }
            let _tiles = Tiles::load();
            let next = n0 + 2 * TM;
            for m0 in (0..mp).step_by(2 * TM) {
                if next < n {
                    touch(next, (p0, width), m0 / (2 * TM), mp / (2 * TM));
                }
                prefetch_out(out_ptr.0, (m, n), m0 + 2 * TM, n0);
                // SAFETY: `a` holds mp / 32 blocks of stride / 32 tile pairs
                // and `panel` stride / 32 tile pairs; `store` writes only rows
                // < m and columns n0 .. n0 + 32 (< n) of `out` ([m, n]), which
                // no other panel writes.
                unsafe {
                    block(a.as_ptr().add(m0 * stride), stride, panel);
                    store(out_ptr.0, (m, n), m0, n0, p0 > 0);
                }
            }
            PANEL.set(panel_buf);
        });
        if let Some((u, sums)) = ride.as_mut().and_then(|r| r.token_sums.as_mut()) {
            token_sums(sums, u, a, (m, k), (kp, stride));
        }
    }
    ACTIVATION.set(a_buf);
}

/// `out[r, k] = u^T x` for `u: [m, r]` (f32, r <= 32) and `x: [m, k]` as
/// the rounded activation `a` holds it (`[mp / 32]` blocks of
/// `stride / 32` tile pairs, the first `kp / 32` being `x`): a sum over
/// tokens (LoRA's `dB^T = xa^T dY`) without another pass over the f32
/// `x`. `u` is carried as two bf16 like the ride's other operands: the
/// reduction runs over `2 mp` "tokens", `[u_hi; u_lo]` against `[x; x]`.
/// Each 32-column panel of `out` interleaves row pairs of the blocks into
/// B tiles.
fn token_sums(out: &mut [f32], u: &[f32], a: &[u16], (m, k): (usize, usize), (kp, stride): (usize, usize)) {
    let (r, mp) = (out.len() / k, m.next_multiple_of(2 * TM));
    assert!(r <= 2 * TM && u.len() == m * r && out.len() == r * k);
    // u^T as [r, 2 mp]: hi values, then their remainders, zero past m
    let mut ut = vec![0.0f32; r * 2 * mp];
    for (t, row) in u.chunks_exact(r).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            (ut[j * 2 * mp + t], ut[j * 2 * mp + mp + t]) = super::split(v);
        }
    }
    let mut ut_tiles = TileBuf::default();
    let ut_tiles = ut_tiles.resized(2 * TM * 2 * mp);
    // SAFETY: AMX CPUs have AVX-512.
    unsafe { round_block(ut_tiles, &ut, 2 * mp, (0, 2 * mp)) };
    let ut_tiles = &*ut_tiles;
    let out_ptr = SharedMut(out.as_mut_ptr());
    (0..kp / TK).into_par_iter().for_each(|kb| {
        let out_ptr = out_ptr;
        let mut panel_buf = PANEL.take();
        let panel = panel_buf.resized(2 * mp * 2 * TM);
        for (kb2, tiles) in panel.chunks_exact_mut(2 * TILE_U16).enumerate() {
            let mb = kb2 % (mp / (2 * TM));
            let blk = &a[mb * 2 * TM * stride + kb * 2 * TILE_U16..][..2 * TILE_U16];
            // SAFETY: AMX CPUs have AVX-512; the block is a [32, 32] matrix.
            unsafe { rows_interleaved(tiles, Source::Bits(blk), (2 * TM, TK), 0, 0) };
        }
        let _tiles = Tiles::load();
        // SAFETY: `ut_tiles` and `panel` hold 2 mp / 32 tile pairs each;
        // `store` writes rows < r and columns kb * 32 .. (< k) of `out`,
        // which only this panel writes.
        unsafe {
            block(ut_tiles.as_ptr(), 2 * mp, panel);
            store(out_ptr.0, (r, k), 0, kb * TK, false);
        }
        PANEL.set(panel_buf);
    });
}

/// The ride's side product from the rounded activation `a` (`[mp / 32]`
/// blocks of `stride / 32` tile pairs, the first `kp / 32` filled), then
/// its extra columns into the blocks' last `stride - kp` columns.
fn side_product(a: &mut [u16], (kp, stride): (usize, usize), ride: &mut Ride<'_>) {
    let r = ride.rank;
    let panels: Vec<TileBuf> = (0..(2 * r).div_ceil(2 * TM))
        .map(|sp| {
            let mut panel = TileBuf::default();
            (ride.side_prep)(sp * 2 * TM, 0, panel.resized(kp * 2 * TM));
            panel
        })
        .collect();
    let (scale, ext_scale) = (ride.side_scale, ride.ext_scale);
    let side_blocks = ride.side.par_chunks_mut(2 * TM * r);
    a.par_chunks_mut(2 * TM * stride).zip(side_blocks).for_each(|(blk, side)| {
        let rows = side.len() / r;
        let mut both = vec![0.0f32; rows * 2 * r]; // [rows, 2r]: x S_hi | x S_lo
        {
            let _tiles = Tiles::load();
            for (sp, panel) in panels.iter().enumerate() {
                // SAFETY: a one-pass block of kp / 32 tile pairs and a panel
                // of as many; `store` writes rows < `rows` of `both`.
                unsafe {
                    block(blk.as_ptr(), kp, panel.as_slice());
                    store(both.as_mut_ptr(), (rows, 2 * r), 0, sp * 2 * TM, false);
                }
            }
        }
        let mut ext = vec![0.0; rows * 3 * r]; // [rows, 3r]: hi | lo | hi
        for ((v, halves), e) in side.chunks_exact_mut(r).zip(both.chunks_exact(2 * r)).zip(ext.chunks_exact_mut(3 * r)) {
            for j in 0..r {
                v[j] = scale * (halves[j] + halves[r + j]);
                let (hi, lo) = super::split(ext_scale * v[j]);
                (e[j], e[r + j], e[2 * r + j]) = (hi, lo, hi);
            }
        }
        // SAFETY: AMX CPUs have AVX-512.
        unsafe { round_block(&mut blk[2 * TM * kp..], &ext, 3 * r, (0, 3 * r)) };
    });
}

/// Accumulates the 32x32 block `tmm0..3` = A rows (32) times the panel's
/// B tiles, over all of `kp`; `a` holds the block's tile pairs
/// (`[kp / 32][2]`, see [`round_blocked`]).
///
/// # Safety
/// Tiles configured by [`Tiles::load`]; `a` and `panel` hold `kp / 32 * 2`
/// tiles each.
unsafe fn block(a: *const u16, kp: usize, panel: &[u16]) {
    let tile_order = ALayout { step: 2 * TILE_U16, half: TILE_U16, row_bytes: 64 };
    // SAFETY: forwarded; tile order is `[kp / 32][2 tiles]`.
    unsafe { block_in(a, tile_order, kp / TK, panel.as_ptr()) }
}

/// Where the 32 rows of a block's A operand lie, in u16 from its start.
#[derive(Clone, Copy)]
pub(super) struct ALayout {
    /// From one 32-column step to the next.
    pub step: usize,
    /// From row 0 to row 16.
    pub half: usize,
    /// From one row to the next, in bytes.
    pub row_bytes: usize,
}

/// [`block`] over `steps` 32-wide reduction steps with A laid out as `lay`
/// says (rows of a row-major matrix, or tile order) and the panel's B
/// tile pairs (`[steps][2]`) from `panel`.
///
/// # Safety
/// Tiles configured by [`Tiles::load`]; every tile row read lies inside
/// its operand.
pub(super) unsafe fn block_in(a: *const u16, lay: ALayout, steps: usize, panel: *const u16) {
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for kb in 0..steps {
            let a0 = a.add(kb * lay.step);
            let a1 = a0.add(lay.half);
            let b0 = panel.add(2 * kb * TILE_U16);
            let b1 = b0.add(TILE_U16);
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1,
                sa = in(reg) lay.row_bytes, sb = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Writes the 32x32 block in `tmm0..3` (rows `m0..`, columns `n0..`) into
/// `out: [m, n]` (or adds it, with `add`), dropping the padding rows and
/// columns (see [`store_block`]).
///
/// # Safety
/// Tiles hold a finished block; `out` is `[m, n]`, `m0 < m`, `n0 < n`,
/// and the caller owns columns `n0 .. min(n0 + 32, n)` of it.
unsafe fn store(out: *mut f32, (m, n): (usize, usize), m0: usize, n0: usize, add: bool) {
    // SAFETY: forwarded; the corner starts inside `out`.
    unsafe { store_block(out.add(m0 * n + n0), n, ((m - m0).min(2 * TM), (n - n0).min(2 * TM)), add, 1.0) }
}

/// Writes `alpha` times the 32x32 block in `tmm0..3` to the `rows x cols`
/// corner at `dst` (rows `ld` apart), or adds it there with `add`. The
/// tiles go through an aligned scratch, all four stored before the first
/// is read back: `tilestored` straight into the output (rows not
/// line-aligned, lines not in cache) was measured slower than storing to
/// L1 and copying rows with vector moves.
///
/// # Safety
/// Tiles hold a finished block; `dst` has `rows` rows of `cols` values,
/// `ld` apart, that the caller owns.
pub(super) unsafe fn store_block(dst: *mut f32, ld: usize, (rows, cols): (usize, usize), add: bool, alpha: f32) {
    #[repr(C, align(64))]
    struct Scratch([[f32; TM * TM]; 4]);
    let mut s = Scratch([[0.0; TM * TM]; 4]);
    for (t, tile) in s.0.iter_mut().enumerate() {
        // SAFETY: each scratch tile is 16 rows of 64 bytes.
        unsafe { store_tile(t, tile.as_mut_ptr(), TM * 4) };
    }
    for (tile, (dr, dc)) in s.0.iter().zip([(0, 0), (0, TM), (TM, 0), (TM, TM)]) {
        if dr < rows && dc < cols {
            // SAFETY: rows dr.. and columns dc.. of the corner.
            unsafe { copy_rows(dst.add(dr * ld + dc), ld, tile, ((rows - dr).min(TM), (cols - dc).min(TM)), add, alpha) };
        }
    }
}

/// `dst[r * stride + c] = alpha tile[r][c]` (or `+=`, with `add`) for
/// `r < rows`, `c < cols`, one masked vector store per row (an `alpha` of
/// 1 multiplies nothing).
///
/// # Safety
/// AVX-512F available; `dst` has `rows` rows of `cols` f32 at `stride`.
#[target_feature(enable = "avx512f")]
unsafe fn copy_rows(dst: *mut f32, stride: usize, tile: &[f32; TM * TM], (rows, cols): (usize, usize), add: bool, alpha: f32) {
    use std::arch::x86_64::*;
    let mask = lanes(cols) as u16;
    for r in 0..rows.min(TM) {
        // SAFETY: the mask keeps the load and store inside row r of `dst`.
        unsafe {
            let d = dst.add(r * stride);
            let mut v = _mm512_loadu_ps(tile.as_ptr().add(r * TM));
            if alpha != 1.0 {
                v = _mm512_mul_ps(_mm512_set1_ps(alpha), v);
            }
            if add {
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, d), v);
            }
            _mm512_mask_storeu_ps(d, mask, v);
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

/// `reps` 32x32 blocks over `kp` from the same `a` and `panel` (bench
/// only: [`super::kernel_bench`]); `mode` 0 = the real block, 1 = only the
/// 4 products per step, 2 = only the 4 loads per step.
pub(super) fn tile_loop_for_bench(a: &[u16], panel: &[u16], kp: usize, reps: usize, mode: u32) {
    assert!(a.len() >= 2 * TM * kp && panel.len() >= 2 * TM * kp);
    let _tiles = Tiles::load();
    for _ in 0..reps {
        // SAFETY: lengths asserted above.
        unsafe {
            match mode {
                0 => block(a.as_ptr(), kp, panel),
                1 => {
                    for _ in 0..kp / TK {
                        asm!("tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7", "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem));
                    }
                }
                _ => {
                    for kb in 0..kp / TK {
                        let a0 = a.as_ptr().add(2 * kb * TILE_U16);
                        let b0 = panel.as_ptr().add(2 * kb * TILE_U16);
                        asm!("tileloadd tmm4, [{a0} + {s}*1]", "tileloadd tmm5, [{a1} + {s}*1]", "tileloadd tmm6, [{b0} + {s}*1]", "tileloadd tmm7, [{b1} + {s}*1]",
                            a0 = in(reg) a0, a1 = in(reg) a0.add(TILE_U16), b0 = in(reg) b0, b1 = in(reg) b0.add(TILE_U16), s = in(reg) 64usize, options(nostack, readonly));
                    }
                }
            }
        }
    }
}

/// Seconds of the forward's parts on this thread (bench only:
/// [`super::kernel_bench`]): rounding the activation, preparing every B
/// panel, the whole product.
pub(super) fn forward_parts_for_bench(x: &[f32], tokens: usize, w: &[u16], n: usize, k: usize) -> [f64; 3] {
    use std::time::Instant;
    let (mp, kp) = (tokens.next_multiple_of(2 * TM), k.next_multiple_of(TK));
    let mut a_buf = TileBuf::default();
    let a = a_buf.resized(mp * kp);
    let t = Instant::now();
    round_blocked(a, x, (tokens, k), (0, k), kp);
    let round = t.elapsed().as_secs_f64();
    let mut p_buf = TileBuf::default();
    let panel = p_buf.resized(kp * 2 * TM);
    let t = Instant::now();
    for n0 in (0..n).step_by(2 * TM) {
        for (kb, tiles) in panel.chunks_exact_mut(2 * TILE_U16).enumerate() {
            for (half, tile) in tiles.chunks_exact_mut(TILE_U16).enumerate() {
                // SAFETY: AMX CPUs have AVX-512.
                unsafe { pairs_transposed(tile, Source::Bits(w), (n, k), n0 + TM * half, TK * kb) };
            }
        }
    }
    let prep = t.elapsed().as_secs_f64();
    let mut out = vec![0f32; tokens * n];
    let t = Instant::now();
    forward(&mut out, x, tokens, Source::Bits(w), n, k);
    [round, prep, t.elapsed().as_secs_f64()]
}

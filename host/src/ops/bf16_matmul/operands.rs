//! Products of two f32 matrices on bf16 tiles, both operands rounded
//! to bf16 once (round to nearest even, as everywhere in this module,
//! here by `VCVTNE2PS2BF16`, which also flushes subnormals to zero),
//! every product of two bf16 exact in f32 and the sums in f32: the
//! precision of PyTorch's bf16 matmuls. On AMX a tile step does 32K
//! multiply-adds in ~40 ns, where AVX-512 FMAs do ~1K per ns on a core;
//! without AMX (AMD Zen 4) the same operands feed `VDPBF16PS` register
//! tiles (`avx512bf16::vnni_block`: a VNNI tile row is the 16 columns of
//! one reduction pair, the vector that instruction multiplies), twice the
//! multiply-adds per instruction of f32 FMAs.
//!
//! For products whose operands are activations in any layout (attention:
//! `q k^T`, `p v`, and the backward's five), unlike the frozen-weight
//! kernels of `amx.rs`, which read one row-major weight:
//!
//! - an A operand ([`ARows`]) is a row-major bf16 matrix whose rows are
//!   whole cache lines (width rounded up to 32, rows to a multiple of 32,
//!   zero padded), so its tiles load straight from it; it is built from
//!   f32 rows or from an f32 matrix stored transposed;
//! - a B operand ([`BPanels`]) is laid out in 32-column panels of VNNI
//!   tile pairs, built once and read by every block of rows; from a
//!   matrix stored as is or transposed.
//!
//! Everything here runs on the calling thread: callers parallelise.
use super::amx::{self, ALayout, Line, TileBuf, Tiles, TILE_U16, TK, TM};
use super::avx512_pack::{self, Source};
use super::avx512bf16::{self, MR, NR};
use std::arch::x86_64::*;

/// Whether [`product`] can run here: AMX (with AVX512-BF16 for rounding,
/// which every AMX CPU has) or AVX512-BF16 alone.
pub fn available() -> bool {
    (amx::available() && is_x86_feature_detected!("avx512bf16")) || avx512bf16::available()
}

/// A tile buffer of `len` u16 (a multiple of 32), every value written by
/// `fill` (which gets its start) before anyone reads it.
fn written(len: usize, fill: impl FnOnce(*mut u16)) -> TileBuf {
    debug_assert!(len.is_multiple_of(TK));
    let mut lines: Vec<Line> = Vec::with_capacity(len / TK);
    fill(lines.spare_capacity_mut().as_mut_ptr().cast::<u16>());
    // SAFETY: `fill` wrote all `len` values (see callers' fill loops).
    unsafe { lines.set_len(len / TK) };
    TileBuf::from_lines(lines)
}

/// An A operand `[rows, k]` in bf16: rows of `width` (k rounded up to 32)
/// values, rows padded to a multiple of 32, zero past `k` and `rows`.
pub struct ARows {
    buf: TileBuf,
    rows: usize,
    width: usize,
}

impl ARows {
    /// Element `(i, j)` = `src[i * ld + j]`.
    pub fn from_rows(src: &[f32], (rows, k): (usize, usize), ld: usize) -> ARows {
        assert!(rows == 0 || k == 0 || (rows - 1) * ld + k <= src.len(), "A operand out of its slice");
        let (rows_p, width) = (rows.next_multiple_of(2 * TM), k.next_multiple_of(TK));
        // SAFETY: AMX CPUs have AVX-512; the source rows are asserted above
        // and `fill_rows` writes every value of `rows_p x width`.
        let buf = written(rows_p * width, |dst| unsafe { fill_rows(dst, src, (rows, k), ld, rows_p) });
        ARows { buf, rows: rows_p, width }
    }

    /// Element `(i, j)` = `src[j * ld + i]` (stored transposed), by 16x16
    /// blocks transposed in registers.
    pub fn from_transposed(src: &[f32], (rows, k): (usize, usize), ld: usize) -> ARows {
        assert!(rows == 0 || k == 0 || (k - 1) * ld + rows <= src.len(), "A operand out of its slice");
        let (rows_p, width) = (rows.next_multiple_of(2 * TM), k.next_multiple_of(TK));
        // SAFETY: as in `from_rows`.
        let buf = written(rows_p * width, |dst| unsafe { fill_transposed(dst, src, (rows, k), ld, rows_p) });
        ARows { buf, rows: rows_p, width }
    }

    /// Row `i` from column `col`.
    fn at(&self, i: usize, col: usize) -> *const u16 {
        self.buf.as_slice()[i * self.width + col..].as_ptr()
    }

    /// All values, row-major.
    fn bits(&self) -> &[u16] {
        &self.buf.as_slice()[..self.rows * self.width]
    }
}

/// 32 f32 (`lo`: the first 16) rounded to bf16 by `VCVTNE2PS2BF16`:
/// nearest even and quiet NaNs as [`super::round_bits`], but subnormal
/// inputs (below 1.2e-38) flushed to zero, as the instruction always does.
///
/// # Safety
/// AVX-512 F and BF16 available.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round32(lo: __m512, hi: __m512) -> __m512i {
    // SAFETY: `__m512bh` and `__m512i` are both 64 bytes of lanes.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)) }
}

/// Rounds `src` (`[rows, k]`, rows `ld` apart) into `dst`
/// (`[rows_p, k rounded up to 32]`, 64-byte aligned), zero past `k` and
/// `rows`.
///
/// # Safety
/// AVX-512 F, BW and BF16 available; `src` holds the rows, `dst` the
/// result.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn fill_rows(dst: *mut u16, src: &[f32], (rows, k): (usize, usize), ld: usize, rows_p: usize) {
    let width = k.next_multiple_of(TK);
    let load = |i: usize, j: usize| {
        let len = if i < rows { k.saturating_sub(j).min(TM) } else { 0 };
        // SAFETY: the mask keeps the load inside row i of `src` (no lane
        // at all past the rows: masked lanes never fault).
        unsafe { _mm512_maskz_loadu_ps(avx512_pack::lanes(len) as u16, src.as_ptr().wrapping_add(i * ld + j)) }
    };
    for i in 0..rows_p {
        for j in (0..width).step_by(TK) {
            // SAFETY: a whole aligned line of row i of `dst`.
            unsafe { _mm512_store_si512(dst.add(i * width + j).cast(), round32(load(i, j), load(i, j + TM))) };
        }
    }
}

/// [`fill_rows`] of the transpose of `src` (`[k, rows]`, rows `ld` apart),
/// by pairs of 16x16 blocks transposed in registers.
///
/// # Safety
/// As [`fill_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn fill_transposed(dst: *mut u16, src: &[f32], (rows, k): (usize, usize), ld: usize, rows_p: usize) {
    let width = k.next_multiple_of(TK);
    // rows i0 .. i0 + 16 of the result, columns j0 .. j0 + 16
    let block = |i0: usize, j0: usize| {
        let mask = avx512_pack::lanes(rows.saturating_sub(i0)) as u16;
        let mut r = [_mm512_setzero_si512(); TM];
        for (jj, v) in r.iter_mut().enumerate().take(k.saturating_sub(j0)) {
            // SAFETY: source row j0 + jj < k, masked to columns i < rows.
            *v = unsafe { _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, src.as_ptr().wrapping_add((j0 + jj) * ld + i0))) };
        }
        // SAFETY: same features.
        unsafe { avx512_pack::transpose16(&r) }
    };
    for i0 in (0..rows_p).step_by(TM) {
        for j0 in (0..width).step_by(TK) {
            let (lo, hi) = (block(i0, j0), block(i0, j0 + TM));
            for ii in 0..TM {
                // SAFETY: a whole aligned line of row i0 + ii of `dst`.
                unsafe { _mm512_store_si512(dst.add((i0 + ii) * width + j0).cast(), round32(_mm512_castsi512_ps(lo[ii]), _mm512_castsi512_ps(hi[ii]))) };
            }
        }
    }
}

/// A B operand `[k, n]` in bf16 as 32-column panels of VNNI tile pairs:
/// `[n / 32][k / 32][2 tiles]` (both rounded up), zero past `k` and `n`.
pub struct BPanels {
    buf: TileBuf,
    steps: usize,
    n: usize,
}

impl BPanels {
    /// `B = S^T` for `S: [n, k]` with rows `ld` apart: pairs along `k` are
    /// pairs within a row of `S` (a 16x16 transpose of u32 per tile).
    pub fn from_transposed(src: &[f32], (n, k): (usize, usize), ld: usize) -> BPanels {
        let s = ARows::from_rows(src, (n, k), ld);
        let steps = k.div_ceil(TK);
        let (rows, width, bits) = (s.rows, s.width, s.bits());
        let len = n.div_ceil(2 * TM) * steps * 2 * TILE_U16;
        let buf = written(len, |dst| {
            for (t, tile) in (0..len).step_by(TILE_U16).enumerate() {
                let (panel, kb, half) = (t / (2 * steps), t / 2 % steps, t % 2);
                // SAFETY: tile t of the buffer; AMX CPUs have AVX-512 and
                // `pairs_transposed` clips to `[rows, width]`.
                unsafe {
                    let tile = std::slice::from_raw_parts_mut(dst.add(tile), TILE_U16);
                    amx::pairs_transposed(tile, Source::Bits(bits), (rows, width), 2 * TM * panel + TM * half, TK * kb);
                }
            }
        });
        BPanels { buf, steps, n }
    }

    /// `B = M` for `M: [k, n]` with rows `ld` apart: pairs along `k`
    /// interleave two rows of `M`.
    pub fn from_rows(src: &[f32], (k, n): (usize, usize), ld: usize) -> BPanels {
        let m = ARows::from_rows(src, (k, n), ld);
        let steps = k.div_ceil(TK);
        let (rows, width, bits) = (m.rows, m.width, m.bits());
        let len = n.div_ceil(2 * TM) * steps * 2 * TILE_U16;
        let buf = written(len, |dst| {
            for (t, pair) in (0..len).step_by(2 * TILE_U16).enumerate() {
                let (panel, kb) = (t / steps, t % steps);
                // SAFETY: tile pair t of the buffer; `rows_interleaved`
                // clips to `[rows, width]`.
                unsafe {
                    let pair = std::slice::from_raw_parts_mut(dst.add(pair), 2 * TILE_U16);
                    amx::rows_interleaved(pair, Source::Bits(bits), (rows, width), TK * kb, 2 * TM * panel);
                }
            }
        });
        BPanels { buf, steps, n }
    }

    /// Panel `panel`'s tile pairs from reduction step `step`.
    fn at(&self, panel: usize, step: usize) -> *const u16 {
        self.buf.as_slice()[(panel * self.steps + step) * 2 * TILE_U16..].as_ptr()
    }
}

/// Zeroed f32 scratch starting on a cache line: [`product`] stores a row
/// of 16 results as one 64-byte vector, and with rows of whole lines
/// (widths that are multiples of 16) an aligned start keeps every store
/// in one line (measured: `q k^T` below 4.5 us aligned, 7.2 us at a
/// 16-byte offset, which is where the system allocator puts a `Vec`).
pub struct Lines(Vec<F32Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct F32Line([f32; 16]);

impl Lines {
    /// `n` zeros.
    pub fn zeros(n: usize) -> Lines {
        Lines(vec![F32Line([0.0; 16]); n.div_ceil(16)])
    }

    /// All values (a multiple of 16).
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: lines of 16 f32, no padding (repr C, 64 bytes).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast::<f32>(), 16 * self.0.len()) }
    }

    /// All values, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<f32>(), 16 * self.0.len()) }
    }
}

/// `out[i * ld + j] = alpha * sum_c A[a_row0 + i, c] B[c, b_col0 + j]`
/// for `i < m`, `j < n`, the reduction running over `chunks` 32-wide
/// chunks from chunk `a_chunk0` of A and `b_chunk0` of B (`out`
/// overwritten there; columns past `n` and rows past `m` untouched).
///
/// # Safety
/// `out` has `m` rows of at least `n` values, `ld` apart, that nothing
/// else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product(
    (a, a_row0, a_chunk0): (&ARows, usize, usize),
    (b, b_col0, b_chunk0): (&BPanels, usize, usize),
    (m, n, chunks): (usize, usize, usize),
    out: *mut f32,
    ld: usize,
    alpha: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a_row0 + m.next_multiple_of(2 * TM) <= a.rows && TK * (a_chunk0 + chunks) <= a.width, "product: A too small");
    assert!(b_col0 % (2 * TM) == 0 && b_col0 + n <= b.n.next_multiple_of(2 * TM) && b_chunk0 + chunks <= b.steps, "product: B too small");
    if !amx::available() {
        for n0 in (0..n).step_by(NR) {
            let pb = b.at((b_col0 + n0) / NR, b_chunk0).cast::<u32>();
            for m0 in (0..m).step_by(MR) {
                let pa = a.at(a_row0 + m0, TK * a_chunk0).cast::<u32>();
                let block = ((m - m0).min(MR), (n - n0).min(NR));
                // SAFETY: without AMX, `available()` (the callers' check)
                // means AVX512-BF16; A's rows are padded to a multiple of 32,
                // so MR rows from m0 exist; the rest as for AMX below.
                unsafe { avx512bf16::vnni_block(pa, a.width / 2, pb, chunks, out.add(m0 * ld + n0), ld, block, alpha) };
            }
        }
        return;
    }
    let lay = ALayout { step: TK, half: TM * a.width, row_bytes: 2 * a.width };
    let _tiles = Tiles::load();
    for m0 in (0..m).step_by(2 * TM) {
        for n0 in (0..n).step_by(2 * TM) {
            let (pa, pb) = (a.at(a_row0 + m0, TK * a_chunk0), b.at((b_col0 + n0) / (2 * TM), b_chunk0));
            // SAFETY: rows a_row0 + m0 .. + 32 and the chunks lie inside A,
            // and the steps inside the panel (asserted above); the store
            // writes rows m0 .. < m and columns n0 .. < n of `out`.
            unsafe {
                amx::block_in(pa, lay, chunks, pb);
                amx::store_block(out.add(m0 * ld + n0), ld, ((m - m0).min(2 * TM), (n - n0).min(2 * TM)), false, alpha);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::bf16_matmul::round_bits;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * 0.37 + seed).sin() * 3.0 + (i as f32 * 0.011).cos()) * 0.7).collect()
    }

    fn bf16(v: f32) -> f64 {
        f32::from_bits((round_bits(v) as u32) << 16) as f64
    }

    /// Every operand layout, odd sizes, row/column/chunk offsets: equal to
    /// the f64 product of the bf16-rounded operands up to f32 summation.
    #[test]
    fn products_match_f64_of_rounded_operands() {
        if !available() {
            return crate::test_skip::skip_allowed_in_ci("neither AMX-BF16 nor AVX512-BF16 on this CPU/OS", crate::test_skip::CPU_CLASS_VARIES);
        }
        let (m, k, n) = (45, 70, 37);
        let (a, b) = (values(m * k, 0.1), values(k * n, 0.7));
        let bt: Vec<f32> = (0..n * k).map(|t| b[(t % k) * n + t / k]).collect(); // b^T: [n, k]
        let at: Vec<f32> = (0..k * m).map(|t| a[(t % m) * k + t / m]).collect(); // a^T: [k, m]
        let a_ops = [ARows::from_rows(&a, (m, k), k), ARows::from_transposed(&at, (m, k), m)];
        let b_ops = [BPanels::from_rows(&b, (k, n), n), BPanels::from_transposed(&bt, (n, k), k)];
        for (ai, ao) in a_ops.iter().enumerate() {
            for (bi, bo) in b_ops.iter().enumerate() {
                // whole product, then rows 32.. over chunks 1..3 (k 32..70) and columns 32..
                for (row0, chunk0, col0) in [(0, 0, 0), (32, 1, 32)] {
                    let (mm, nn, chunks) = (m - row0, n - col0, 3 - chunk0);
                    let mut out = vec![f32::NAN; mm * (nn + 3)];
                    // SAFETY: `out` is mm rows of nn + 3.
                    unsafe { product((ao, row0, chunk0), (bo, col0, chunk0), (mm, nn, chunks), out.as_mut_ptr(), nn + 3, 0.5) };
                    for i in 0..mm {
                        for j in 0..nn {
                            let terms = (32 * chunk0..k).map(|c| bf16(a[(row0 + i) * k + c]) * bf16(b[c * n + col0 + j]));
                            let (want, size) = terms.fold((0.0, 0.0), |(s, z), t| (s + t, z + t.abs()));
                            let got = out[i * (nn + 3) + j] as f64;
                            assert!((got - 0.5 * want).abs() <= 0.5 * size * 1e-6, "A{ai} B{bi} ({row0},{chunk0},{col0}) [{i},{j}]: {got} vs {}", 0.5 * want);
                        }
                        assert!(out[i * (nn + 3) + nn..(i + 1) * (nn + 3)].iter().all(|v| v.is_nan()), "wrote past n");
                    }
                }
            }
        }
    }
}

//! Products of a few rows with a frozen weight read where it is stored:
//! `y[t, o] = sum_i W[o, i] x[t, i]` (`x: [tokens, cols]`, `W: [rows, cols]`,
//! `y: [tokens, rows]`), with `W` as GGML blocks (Q8_0, Q4_0, Q4_1, Q4_K,
//! Q6_K) or plain f32.
//!
//! Why: decoding multiplies one token's activations with every weight, so
//! it is bound by the bytes read, not by arithmetic. A Q4_1 weight is 0.625
//! bytes where an f32 copy is 4; each block is decoded in registers right
//! before its multiply-adds, as llama.cpp does (it quantizes the activations
//! too; here they stay f32).
//!
//! Arithmetic, identical on every CPU: the weights are exactly the f32
//! values the block decoders of [`crate::base::quant`] yield (the values
//! every other path multiplies); each output is 4 chains of 16 lanes
//! (chunk `j` of 16 elements feeds chain `j % 4`, one fused multiply-add
//! per element), closed by a fixed halving tree. The algorithm is
//! written once over [`Lanes`], 16 f32 lanes with the few operations it
//! needs; AVX-512 (one register), AVX2 (two) and the portable arrays
//! (`f32::mul_add`, NEON's `fmla` on aarch64) implement it, so every build
//! returns the same bits, and a row is one task's, so the thread count
//! changes nothing either. The sums run in another order than the dense
//! products', so results differ from those by rounding only.
use crate::base::quant::{decode_q4_k, decode_q6_k};
use crate::base::dtype::DType;
use half::f16;
use rayon::prelude::*;

/// Lane chains per output.
const LANES: usize = 16;
/// Token rows multiplied per pass over a weight row: their accumulators
/// stay in registers (4 x 16 lanes: four AVX-512 or eight AVX2 registers).
const TOKENS_PER_PASS: usize = 4;

/// A frozen weight `[rows, cols]` as it is stored.
#[derive(Clone, Copy, Debug)]
pub enum StoredRows<'a> {
    /// Plain f32, row-major.
    F32(&'a [f32]),
    /// Plain f32 rows `stride` values apart (attention's keys, read in
    /// the cache where every key holds all key/value heads).
    F32Strided(&'a [f32], usize),
    /// Whole rows of GGML blocks of a quantized type.
    Blocks(DType, &'a [u8]),
}

/// Whether [`matvec`] reads `dtype`'s blocks.
pub fn reads_blocks(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q4K | DType::Q6K)
}

/// `y[t, o] = sum_i W[o, i] x[t, i]` for `x: [tokens, cols]`,
/// `y: [tokens, rows]` (overwritten). Meant for few tokens (decoding); the
/// weight is read `ceil(tokens / 4)` times. Panics if a buffer's length
/// does not match `(rows, cols)` or the blocks' type (callers check).
pub fn matvec(y: &mut [f32], x: &[f32], tokens: usize, w: StoredRows<'_>, dims: (usize, usize)) {
    matvec_with(Build::detect(), y, x, tokens, w, dims)
}

/// [`matvec`] on the given build (which the CPU must have).
fn matvec_with(build: Build, y: &mut [f32], x: &[f32], tokens: usize, w: StoredRows<'_>, (rows, cols): (usize, usize)) {
    assert_eq!(x.len(), tokens * cols, "matvec input");
    assert_eq!(y.len(), tokens * rows, "matvec output");
    // Distance between rows: values, or bytes of blocks.
    let row_len = match w {
        StoredRows::F32(v) => {
            assert_eq!(v.len(), rows * cols, "matvec f32 weight");
            cols
        }
        StoredRows::F32Strided(v, stride) => {
            assert!(stride >= cols && rows.checked_sub(1).map_or(true, |r| v.len() >= r * stride + cols), "matvec strided weight");
            stride
        }
        StoredRows::Blocks(dtype, bytes) => {
            assert!(reads_blocks(dtype), "matvec cannot read {dtype:?}");
            let row_bytes = dtype.bytes_for(cols).expect("whole blocks per row");
            assert_eq!(bytes.len(), rows * row_bytes, "matvec {dtype:?} weight");
            row_bytes
        }
    };
    if rows == 0 || tokens == 0 {
        return;
    }
    // Tasks of whole rows: a few per thread, so uneven cores even out.
    let per_task = rows.div_ceil(4 * rayon::current_num_threads()).clamp(8, 256);
    // yt[o, t], so a task's outputs are contiguous; transposed at the end.
    let mut yt = vec![0.0f32; rows * tokens];
    yt.par_chunks_mut(per_task * tokens).enumerate().for_each(|(task, yt)| {
        let first = task * per_task;
        let n = yt.len() / tokens;
        let w = match w {
            StoredRows::F32(v) => StoredRows::F32(&v[first * row_len..(first + n) * row_len]),
            StoredRows::F32Strided(v, stride) => StoredRows::F32Strided(&v[first * stride..(first + n - 1) * stride + cols], stride),
            StoredRows::Blocks(d, b) => StoredRows::Blocks(d, &b[first * row_len..(first + n) * row_len]),
        };
        for t0 in (0..tokens).step_by(TOKENS_PER_PASS) {
            let t1 = (t0 + TOKENS_PER_PASS).min(tokens);
            let out = Out { yt: &mut *yt, stride: tokens, t0 };
            build.pass(out, &x[t0 * cols..t1 * cols], t1 - t0, w, cols);
        }
    });
    for (o, row) in yt.chunks_exact(tokens).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            y[t * rows + o] = v;
        }
    }
}

/// Where a pass writes: column `t0 + t` of `yt: [rows, stride]`.
struct Out<'a> {
    yt: &'a mut [f32],
    stride: usize,
    t0: usize,
}

impl Out<'_> {
    /// Closes row `o`'s lane chains for each token.
    #[inline(always)]
    fn row<const T: usize>(&mut self, o: usize, acc: &[[f32; LANES]; T]) {
        for (t, a) in acc.iter().enumerate() {
            self.yt[o * self.stride + self.t0 + t] = lane_tree(a);
        }
    }
}

/// The [`Lanes`] implementation this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// One AVX-512 register.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Two AVX2 registers (with FMA and F16C).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Arrays and `f32::mul_add` (NEON `fmla` on aarch64).
    Portable,
}

impl Build {
    /// The widest this CPU has; `HEXLORA_MATVEC=portable|avx2` forces a
    /// narrower one (`ci/test.sh` runs the SmolLM2 greedy-text test under
    /// `avx2` too). Read once.
    pub fn detect() -> Build {
        static BUILD: std::sync::OnceLock<Build> = std::sync::OnceLock::new();
        *BUILD.get_or_init(|| Self::pick(std::env::var("HEXLORA_MATVEC").ok().as_deref()))
    }

    /// Every build this CPU can run, widest first.
    pub fn available() -> Vec<Build> {
        let mut all = vec![Self::pick(None), Self::pick(Some("avx2")), Build::Portable];
        all.dedup();
        all
    }

    fn pick(forced: Option<&str>) -> Build {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match forced {
                Some("portable") => {}
                Some("avx2") if avx2 => return Build::Avx2,
                _ if has!("avx512f") => return Build::Avx512,
                _ if avx2 => return Build::Avx2,
                _ => {}
            }
        }
        let _ = forced;
        Build::Portable
    }

    /// Its name (`hexlora info`).
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Build::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Build::Avx2 => "avx2-fma",
            Build::Portable if cfg!(target_arch = "aarch64") => "neon (portable lanes)",
            Build::Portable => "portable",
        }
    }

    /// One pass of `n_tok` (1..=4) token rows `x` over every row of `w`.
    fn pass(self, out: Out<'_>, x: &[f32], n_tok: usize, w: StoredRows<'_>, cols: usize) {
        match self {
            // SAFETY: detect() saw AVX-512F (which implies FMA and F16C).
            #[cfg(target_arch = "x86_64")]
            Build::Avx512 => unsafe { x86::pass_avx512(out, x, n_tok, w, cols) },
            // SAFETY: detect() saw AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Build::Avx2 => unsafe { x86::pass_avx2(out, x, n_tok, w, cols) },
            // SAFETY: the portable lanes are plain Rust.
            Build::Portable => unsafe { pass_tokens::<Portable>(out, x, n_tok, w, cols) },
        }
    }
}

/// 16 f32 lanes and the operations the kernel needs. Every implementation
/// computes each lane exactly as [`Portable`] does.
trait Lanes: Copy {
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// The f16 of these little-endian bytes, exactly in f32, in every lane.
    unsafe fn splat_f16(b: [u8; 2]) -> Self;
    /// 16 values from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// `a * b + c`, rounded once.
    unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    /// The two f16 at `p` (little-endian, `p[0..2]` and `p[2..4]`), each
    /// exactly in f32 in every lane.
    #[inline(always)]
    unsafe fn splat_f16_pair(p: *const u8) -> (Self, Self) {
        let b = std::ptr::read_unaligned(p as *const [u8; 4]);
        (Self::splat_f16([b[0], b[1]]), Self::splat_f16([b[2], b[3]]))
    }
    /// The low and high nibbles of 16 bytes at `p`, as f32.
    unsafe fn nibbles(p: *const u8) -> (Self, Self);
    /// `d q + m` for the low and high nibbles `q` of 16 bytes at `p`, where
    /// `d` is an f16 and `q` at most 15, so `d q` is exact and the value
    /// is rounded once: a fused multiply-add and a product then a sum give
    /// the same bits (the AVX-512 build looks the 16 possible values up).
    #[inline(always)]
    unsafe fn nibble_values(p: *const u8, d: Self, m: Self) -> (Self, Self) {
        let (lo, hi) = Self::nibbles(p);
        (Self::mul_add(d, lo, m), Self::mul_add(d, hi, m))
    }
    /// 16 signed bytes at `p`, as f32.
    unsafe fn i8s(p: *const u8) -> Self;
    unsafe fn store(self, out: &mut [f32; LANES]);
    /// Asks for the cache line at `p` ahead of its use (a hint; no-op in
    /// the portable build).
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
}

/// The reference lanes: plain arrays.
#[derive(Clone, Copy)]
struct Portable([f32; LANES]);

impl Lanes for Portable {
    #[inline(always)]
    unsafe fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Portable([v; LANES])
    }
    #[inline(always)]
    unsafe fn splat_f16(b: [u8; 2]) -> Self {
        Portable([f16::from_le_bytes(b).to_f32(); LANES])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Portable(std::ptr::read_unaligned(p as *const [f32; LANES]))
    }
    #[inline(always)]
    unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self {
        Portable(std::array::from_fn(|l| a.0[l].mul_add(b.0[l], c.0[l])))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|l| a.0[l] * b.0[l]))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|l| a.0[l] + b.0[l]))
    }
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> (Self, Self) {
        let q = std::ptr::read_unaligned(p as *const [u8; LANES]);
        (Portable(std::array::from_fn(|l| (q[l] & 0x0f) as f32)), Portable(std::array::from_fn(|l| (q[l] >> 4) as f32)))
    }
    #[inline(always)]
    unsafe fn i8s(p: *const u8) -> Self {
        let q = std::ptr::read_unaligned(p as *const [u8; LANES]);
        Portable(std::array::from_fn(|l| q[l] as i8 as f32))
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; LANES]) {
        *out = self.0;
    }
}

/// [`pass`] for 1..=4 token rows.
#[inline(always)]
unsafe fn pass_tokens<V: Lanes>(out: Out<'_>, x: &[f32], n_tok: usize, w: StoredRows<'_>, cols: usize) {
    match n_tok {
        1 => pass::<V, 1>(out, x, w, cols),
        2 => pass::<V, 2>(out, x, w, cols),
        3 => pass::<V, 3>(out, x, w, cols),
        _ => pass::<V, 4>(out, x, w, cols),
    }
}

/// Every row of `w` against `T` token rows of `x` (`[T, cols]`).
#[inline(always)]
unsafe fn pass<V: Lanes, const T: usize>(mut out: Out<'_>, x: &[f32], w: StoredRows<'_>, cols: usize) {
    let xp = x.as_ptr();
    match w {
        StoredRows::F32(v) => f32_rows::<V, T>(&mut out, xp, v, cols, cols),
        StoredRows::F32Strided(v, stride) => f32_rows::<V, T>(&mut out, xp, v, stride, cols),
        StoredRows::Blocks(dtype, bytes) => {
            let row_bytes = dtype.bytes_for(cols).expect("whole blocks");
            for (o, row) in bytes.chunks_exact(row_bytes).enumerate() {
                let mut acc = Chains::<V, T>::new(xp, cols);
                match dtype {
                    DType::Q4_1 => blocks_32::<V, T, 20>(&mut acc, row, q4_1::<V>),
                    DType::Q4_0 => blocks_32::<V, T, 18>(&mut acc, row, q4_0::<V>),
                    DType::Q8_0 => blocks_32::<V, T, 34>(&mut acc, row, q8_0::<V>),
                    DType::Q4K => blocks_256::<V, T, 144>(&mut acc, row, decode_q4_k),
                    DType::Q6K => blocks_256::<V, T, 210>(&mut acc, row, decode_q6_k),
                    DType::F32 | DType::F16 | DType::BF16 | DType::Q5_0 | DType::Q5_1 | DType::Q5K => {
                        unreachable!("matvec checked the type")
                    }
                }
                out.row(o, &acc.sums());
            }
        }
    }
}

/// Every f32 row (`stride` apart) of `v` against `T` token rows at `xp`.
#[inline(always)]
unsafe fn f32_rows<V: Lanes, const T: usize>(out: &mut Out<'_>, xp: *const f32, v: &[f32], stride: usize, cols: usize) {
    let rows = (v.len() + stride - cols) / stride;
    for o in 0..rows {
        let mut acc = Chains::<V, T>::new(xp, cols);
        f32_row(&mut acc, &v[o * stride..o * stride + cols]);
        out.row(o, &acc.sums());
    }
}

/// How far ahead of the block being decoded the weight stream is
/// prefetched, in bytes.
const PREFETCH_AHEAD: usize = 768;

/// Independent multiply-add chains per output (a fused multiply-add waits
/// for the previous one on its chain; four chains keep the unit busy).
const CHAINS: usize = 4;
/// Partial sums per output: chain `c`, lane `l` holds the products of
/// elements `64 g + 16 c + l`.
const WIDTH: usize = CHAINS * LANES;

/// The chains of `T` outputs of one weight row, walking the row 16
/// elements (a chunk) at a time: chunk `j` feeds chain `j % 4`.
struct Chains<V, const T: usize> {
    acc: [[V; CHAINS]; T],
    /// Token 0's input at the current chunk; token `t`'s is `cols` further.
    x: *const f32,
    cols: usize,
}

impl<V: Lanes, const T: usize> Chains<V, T> {
    #[inline(always)]
    unsafe fn new(x: *const f32, cols: usize) -> Self {
        Chains { acc: [[V::zero(); CHAINS]; T], x, cols }
    }

    /// Adds chunk `w` to chain `c` (a constant at every call site, so the
    /// chains stay in registers), then moves to the next chunk.
    #[inline(always)]
    unsafe fn chunk(&mut self, c: usize, w: V) {
        for (t, chains) in self.acc.iter_mut().enumerate() {
            chains[c] = V::mul_add(w, V::load(self.x.add(t * self.cols)), chains[c]);
        }
        self.x = self.x.add(LANES);
    }

    /// Adds chunk `w` to chain `j % 4` for a `j` known only at run time.
    #[inline(always)]
    unsafe fn chunk_at(&mut self, j: usize, w: V) {
        match j % CHAINS {
            0 => self.chunk(0, w),
            1 => self.chunk(1, w),
            2 => self.chunk(2, w),
            _ => self.chunk(3, w),
        }
    }

    /// Each output's first two halving steps over its 64 partial sums,
    /// done on whole chains in registers (`a[i] += a[i + 32]` is chain
    /// 0 + chain 2 and 1 + 3; `a[i] += a[i + 16]` adds those two): the 16
    /// lanes [`lane_tree`] finishes.
    #[inline(always)]
    unsafe fn sums(&self) -> [[f32; LANES]; T] {
        let mut out = [[0.0; LANES]; T];
        for (o, [c0, c1, c2, c3]) in out.iter_mut().zip(&self.acc) {
            V::add(V::add(*c0, *c2), V::add(*c1, *c3)).store(o);
        }
        out
    }
}

/// A row of 32-value blocks of `B` bytes, each decoded by `decode` into its
/// two chunks; two blocks fill the four chains.
#[inline(always)]
unsafe fn blocks_32<V: Lanes, const T: usize, const B: usize>(acc: &mut Chains<V, T>, row: &[u8], decode: unsafe fn(&[u8; B]) -> (V, V)) {
    let mut pairs = row.chunks_exact(2 * B);
    for pair in &mut pairs {
        V::prefetch(pair.as_ptr().wrapping_add(PREFETCH_AHEAD));
        let (w0, w1) = decode(pair[..B].try_into().expect("B bytes"));
        let (w2, w3) = decode(pair[B..].try_into().expect("B bytes"));
        acc.chunk(0, w0);
        acc.chunk(1, w1);
        acc.chunk(2, w2);
        acc.chunk(3, w3);
    }
    if let Ok(last) = pairs.remainder().try_into() {
        let (w0, w1) = decode(last);
        acc.chunk(0, w0);
        acc.chunk(1, w1);
    }
}

/// A row of 256-value blocks of `B` bytes, decoded to f32 by the
/// dequantizer's own block decoder, then fed as sixteen chunks.
#[inline(always)]
unsafe fn blocks_256<V: Lanes, const T: usize, const B: usize>(acc: &mut Chains<V, T>, row: &[u8], decode: fn(&[u8; B], &mut [f32; 256])) {
    let mut w = [0.0f32; 256];
    for blk in row.chunks_exact(B) {
        decode(blk.try_into().expect("B bytes"), &mut w);
        for g in 0..256 / WIDTH {
            for c in 0..CHAINS {
                acc.chunk(c, V::load(w.as_ptr().add(g * WIDTH + c * LANES)));
            }
        }
    }
}

/// An f32 row: whole chunks, then a tail shorter than 16 padded with zeros
/// (its products add exactly nothing).
#[inline(always)]
unsafe fn f32_row<V: Lanes, const T: usize>(acc: &mut Chains<V, T>, row: &[f32]) {
    let mut groups = row.chunks_exact(WIDTH);
    for g in &mut groups {
        for c in 0..CHAINS {
            acc.chunk(c, V::load(g.as_ptr().add(c * LANES)));
        }
    }
    let rest = groups.remainder();
    let mut chunks = rest.chunks_exact(LANES);
    let mut j = 0;
    for ch in &mut chunks {
        acc.chunk_at(j, V::load(ch.as_ptr()));
        j += 1;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        // The input's tail is padded the same way: copy both.
        let mut w = [0.0f32; LANES];
        w[..tail.len()].copy_from_slice(tail);
        let mut xs = [[0.0f32; LANES]; T];
        for (t, xt) in xs.iter_mut().enumerate() {
            xt[..tail.len()].copy_from_slice(std::slice::from_raw_parts(acc.x.add(t * acc.cols), tail.len()));
        }
        let w = V::load(w.as_ptr());
        let c = j % CHAINS;
        for (t, chains) in acc.acc.iter_mut().enumerate() {
            chains[c] = V::mul_add(w, V::load(xs[t].as_ptr()), chains[c]);
        }
    }
}

/// Q4_1 `x = d nibble + m` (as `decode_q4_1`: product, then sum; the
/// product is exact, so the sum is the one rounding).
#[inline(always)]
unsafe fn q4_1<V: Lanes>(blk: &[u8; 20]) -> (V, V) {
    let (d, m) = V::splat_f16_pair(blk.as_ptr());
    V::nibble_values(blk.as_ptr().add(4), d, m)
}

/// Q4_0 `x = d (nibble - 8)`, which is `d nibble + (-8 d)` with every step
/// exact (no rounding at all; for `d = 0` this makes +0 where dequantize
/// makes -0 for nibbles below 8, which adds the same to every sum).
#[inline(always)]
unsafe fn q4_0<V: Lanes>(blk: &[u8; 18]) -> (V, V) {
    let d = V::splat_f16([blk[0], blk[1]]);
    V::nibble_values(blk.as_ptr().add(2), d, V::mul(d, V::splat(-8.0)))
}

/// Q8_0 `x = q d`.
#[inline(always)]
unsafe fn q8_0<V: Lanes>(blk: &[u8; 34]) -> (V, V) {
    let d = V::splat_f16([blk[0], blk[1]]);
    (V::mul(V::i8s(blk.as_ptr().add(2)), d), V::mul(V::i8s(blk.as_ptr().add(18)), d))
}

/// The partial sums' total by a fixed halving tree, `a[i] += a[i + h]`
/// for `h = 32, 16` ([`Chains::sums`]) then `8, 4, 2, 1` (here).
#[inline(always)]
fn lane_tree(a: &[f32; LANES]) -> f32 {
    let mut a = *a;
    let mut h = LANES / 2;
    while h > 0 {
        for l in 0..h {
            a[l] += a[l + h];
        }
        h /= 2;
    }
    a[0]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 and AVX2 [`Lanes`].
    use super::{pass_tokens, Lanes, Out, StoredRows, LANES};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pass_avx512(out: Out<'_>, x: &[f32], n_tok: usize, w: StoredRows<'_>, cols: usize) {
        pass_tokens::<Avx512>(out, x, n_tok, w, cols)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn pass_avx2(out: Out<'_>, x: &[f32], n_tok: usize, w: StoredRows<'_>, cols: usize) {
        pass_tokens::<Avx2>(out, x, n_tok, w, cols)
    }

    /// F16C's conversion (exact, like `half`'s, without its run-time check).
    #[inline(always)]
    unsafe fn f16_to_f32(b: [u8; 2]) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32)))
    }

    #[derive(Clone, Copy)]
    struct Avx512(__m512);

    impl Lanes for Avx512 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx512(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Avx512(_mm512_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn splat_f16(b: [u8; 2]) -> Self {
            Avx512(_mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(b))))
        }
        /// One broadcast of both f16 as a pair, one conversion, then each
        /// of the pair spread to every lane.
        #[inline(always)]
        unsafe fn splat_f16_pair(p: *const u8) -> (Self, Self) {
            let dm = _mm512_cvtph_ps(_mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)));
            (Avx512(_mm512_moveldup_ps(dm)), Avx512(_mm512_movehdup_ps(dm)))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Avx512(_mm512_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self {
            Avx512(_mm512_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx512(_mm512_mul_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Avx512(_mm512_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn nibbles(p: *const u8) -> (Self, Self) {
            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
            let lo = _mm512_and_si512(q, _mm512_set1_epi32(0x0f));
            let hi = _mm512_srli_epi32::<4>(q);
            (Avx512(_mm512_cvtepi32_ps(lo)), Avx512(_mm512_cvtepi32_ps(hi)))
        }
        /// The 16 values `d q + m` in one register, each nibble's value
        /// picked by `vpermps` (it reads an index's low 4 bits only, so
        /// the low nibble needs no mask): fewer instructions than
        /// converting the nibbles and scaling them, the same bits.
        #[inline(always)]
        unsafe fn nibble_values(p: *const u8, d: Self, m: Self) -> (Self, Self) {
            let iota = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
            let table = _mm512_fmadd_ps(d.0, iota, m.0);
            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
            (Avx512(_mm512_permutexvar_ps(q, table)), Avx512(_mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table)))
        }
        #[inline(always)]
        unsafe fn i8s(p: *const u8) -> Self {
            Avx512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))))
        }
        #[inline(always)]
        unsafe fn store(self, out: &mut [f32; LANES]) {
            _mm512_storeu_ps(out.as_mut_ptr(), self.0)
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const u8) {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        }
    }

    /// Lanes 0..8 and 8..16.
    #[derive(Clone, Copy)]
    struct Avx2(__m256, __m256);

    impl Lanes for Avx2 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx2(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Avx2(_mm256_set1_ps(v), _mm256_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn splat_f16(b: [u8; 2]) -> Self {
            Self::splat(f16_to_f32(b))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Avx2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
        #[inline(always)]
        unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self {
            Avx2(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Avx2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn nibbles(p: *const u8) -> (Self, Self) {
            let half = |at: usize| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(at) as *const __m128i));
            let (q0, q1) = (half(0), half(8));
            let mask = _mm256_set1_epi32(0x0f);
            let f = |v: __m256i| _mm256_cvtepi32_ps(v);
            (
                Avx2(f(_mm256_and_si256(q0, mask)), f(_mm256_and_si256(q1, mask))),
                Avx2(f(_mm256_srli_epi32::<4>(q0)), f(_mm256_srli_epi32::<4>(q1))),
            )
        }
        #[inline(always)]
        unsafe fn i8s(p: *const u8) -> Self {
            let half = |at: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(at) as *const __m128i)));
            Avx2(half(0), half(8))
        }
        #[inline(always)]
        unsafe fn store(self, out: &mut [f32; LANES]) {
            _mm256_storeu_ps(out.as_mut_ptr(), self.0);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), self.1);
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const u8) {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::dtype::RawTensor;
    use half::f16;

    /// Deterministic bytes for `rows` rows of `dtype` with finite f16 scales.
    fn blocks(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let n = rows * dtype.bytes_for(cols).unwrap();
        let mut s = seed;
        let mut b: Vec<u8> = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect();
        // Overwrite each block's f16 fields with small finite scales.
        let (bb, scale_at): (usize, &[usize]) = match dtype {
            DType::Q8_0 => (34, &[0]),
            DType::Q4_0 => (18, &[0]),
            DType::Q4_1 => (20, &[0, 2]),
            DType::Q4K => (144, &[0, 2]),
            DType::Q6K => (210, &[208]),
            _ => unreachable!(),
        };
        for (i, blk) in b.chunks_exact_mut(bb).enumerate() {
            for (k, &at) in scale_at.iter().enumerate() {
                let v = f16::from_f32(0.01 + 0.003 * ((i + k) % 7) as f32 * if k == 1 { -1.0 } else { 1.0 });
                blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    fn input(tokens: usize, cols: usize) -> Vec<f32> {
        (0..tokens * cols).map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 13) as f32 * 0.1)).collect()
    }

    /// The dot products in f64 of the dequantized weights, and the bound
    /// f32 summation over `cols` terms can stray from them.
    fn check_against_f64(y: &[f32], x: &[f32], w: &[f32], tokens: usize, rows: usize, cols: usize) {
        for t in 0..tokens {
            for o in 0..rows {
                let terms = (0..cols).map(|i| w[o * cols + i] as f64 * x[t * cols + i] as f64);
                let want: f64 = terms.clone().sum();
                let mag: f64 = terms.map(f64::abs).sum();
                let got = y[t * rows + o] as f64;
                assert!((got - want).abs() <= 1e-6 * mag + 1e-30, "t {t} o {o}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn every_block_type_matches_f64_of_its_dequantized_weights_on_every_build() {
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4K, DType::Q6K] {
            let (rows, cols) = (37, 512);
            let bytes = blocks(dtype, rows, cols, 7);
            let raw = RawTensor { name: "w".into(), dtype, shape: vec![rows, cols], bytes: &bytes };
            let w = raw.to_f32().unwrap();
            for tokens in [1, 3, 4, 6] {
                let x = input(tokens, cols);
                let run = |build: Build, w: StoredRows<'_>| {
                    let mut y = vec![f32::NAN; tokens * rows];
                    matvec_with(build, &mut y, &x, tokens, w, (rows, cols));
                    y
                };
                let y = run(Build::Portable, StoredRows::Blocks(dtype, &bytes));
                check_against_f64(&y, &x, &w, tokens, rows, cols);
                for build in Build::available() {
                    // The same bits on every build, and the same chains as
                    // the f32 weights the blocks decode to.
                    assert_eq!(y, run(build, StoredRows::Blocks(dtype, &bytes)), "{dtype:?} {build:?} tokens {tokens}");
                    assert_eq!(y, run(build, StoredRows::F32(&w)), "{dtype:?} {build:?} f32 tokens {tokens}");
                }
            }
        }
    }

    #[test]
    fn f32_rows_with_a_tail_match_f64_on_every_build() {
        let (rows, cols, tokens) = (19, 100, 5);
        let w = input(rows, cols);
        let x = input(tokens, cols).iter().map(|v| v * 0.5 - 0.1).collect::<Vec<_>>();
        let mut y = vec![f32::NAN; tokens * rows];
        matvec_with(Build::Portable, &mut y, &x, tokens, StoredRows::F32(&w), (rows, cols));
        check_against_f64(&y, &x, &w, tokens, rows, cols);
        for build in Build::available() {
            let mut yb = vec![f32::NAN; tokens * rows];
            matvec_with(build, &mut yb, &x, tokens, StoredRows::F32(&w), (rows, cols));
            assert_eq!(y, yb, "{build:?}");
        }
    }

    #[test]
    fn thread_count_and_token_grouping_change_no_bit() {
        let (rows, cols) = (300, 256);
        let bytes = blocks(DType::Q4_1, rows, cols, 3);
        let x = input(6, cols);
        let run = |threads: usize, tokens: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut y = vec![0.0; tokens * rows];
            pool.install(|| matvec(&mut y, &x[..tokens * cols], tokens, StoredRows::Blocks(DType::Q4_1, &bytes), (rows, cols)));
            y
        };
        let one = run(1, 6);
        assert_eq!(one, run(3, 6));
        // Token 5 alone equals token 5 in a pass of two (4 + 2).
        let mut last = vec![0.0; rows];
        matvec(&mut last, &x[5 * cols..], 1, StoredRows::Blocks(DType::Q4_1, &bytes), (rows, cols));
        assert_eq!(&one[5 * rows..], &last[..]);
    }
}

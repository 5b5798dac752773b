//! Products with a frozen weight held once, row-major, in bf16: the forward
//! `Y = X W^T` and the input gradient `dX = dY W` read the same storage.
//! Activations are rounded to bf16 on the way in (round to nearest even,
//! as `half::bf16::from_f32` does); every product of two bf16 values is
//! exact in f32 and sums accumulate in f32, so the only rounding beyond the
//! operands' is f32 summation.
//!
//! Two kernels over the same storage:
//! - [`Kernel::Amx`] (x86-64 with AMX-BF16, `amx.rs`): `TDPBF16PS` on 16x16
//!   f32 tiles. Row-major W is neither an AMX `B` operand for the forward
//!   (pairs along `in` per output) nor for the input gradient (pairs of rows
//!   interleaved), so each 32-wide output panel builds its `B` tiles in a
//!   per-thread scratch (AVX-512 shuffles) and reuses them for every token
//!   block: one copy of W in memory, two cheap tile layouts on the fly. The
//!   activation is rounded once per call into tile order (per pass of
//!   ~768 KB when the reduction is long, so it stays in L2). Speed:
//!   `host/examples/bench_bf16_matmul.rs`.
//! - [`Kernel::Avx512Bf16`] (x86-64 with AVX512-BF16 but no AMX, e.g. AMD
//!   Zen 4, `avx512bf16.rs`): `VDPBF16PS` register tiles over operands
//!   packed in bf16 pairs along the reduction, twice the multiply-adds per
//!   instruction of the f32 tiles.
//! - [`Kernel::NeonBfmmla`] (aarch64 with FEAT_BF16, `neon_bfmmla.rs`):
//!   `BFMMLA` register tiles, 2x4 by 4x2 bf16 blocks per instruction.
//! - [`Kernel::Portable`] (`portable.rs`): any CPU; widens 32-wide panels
//!   of W to f32 and multiplies the bf16-rounded activations with the
//!   register tiles of `ops::matmul` (AVX-512 or AVX2+FMA where present,
//!   NEON FMA on aarch64).
//!
//! Both split the output into column panels over rayon; each output element
//! is summed by one thread in a fixed order, so results do not depend on
//! the thread count.
use crate::base::dtype::DType;
use half::bf16;
#[cfg(target_arch = "x86_64")]
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512_pack;
#[cfg(target_arch = "x86_64")]
mod avx512bf16;
#[cfg(target_arch = "aarch64")]
mod neon_bfmmla;
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
mod kernel_check;
mod portable;
pub use portable::{f32_forward, f32_input_grad};
#[cfg(target_arch = "x86_64")]
pub mod operands;
#[cfg(target_arch = "x86_64")]
pub mod kernel_bench;

/// A `[rows, cols]` matrix of bf16, row-major, no padding.
pub struct Bf16Matrix {
    data: Vec<bf16>,
    rows: usize,
    cols: usize,
}

impl Bf16Matrix {
    /// Rounds `w: [rows, cols]` (f32) to bf16, nearest even.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(w.len(), rows * cols, "bf16 matrix length");
        let data = w.iter().map(|&v| bf16::from_bits(round_bits(v))).collect();
        Bf16Matrix { data, rows, cols }
    }

    /// A `[rows, cols]` matrix in `data`'s allocation (its old values
    /// kept, its length set), whose bits `fill` writes: a scratch table
    /// reused from product to product.
    pub fn filled(mut data: Vec<bf16>, rows: usize, cols: usize, fill: impl FnOnce(&mut [u16])) -> Self {
        data.resize(rows * cols, bf16::ZERO);
        // SAFETY: bf16 is repr(transparent) over u16.
        fill(unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u16>(), data.len()) });
        Bf16Matrix { data, rows, cols }
    }

    /// The allocation back, for the next [`Bf16Matrix::filled`].
    pub fn into_vec(self) -> Vec<bf16> {
        self.data
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> &[bf16] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The whole matrix, row-major.
    pub fn as_slice(&self) -> &[bf16] {
        &self.data
    }

    /// `[rows, cols]` bits, row-major (the kernels' view).
    fn bits(&self) -> &[u16] {
        // SAFETY: bf16 is repr(transparent) over u16.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u16>(), self.data.len()) }
    }
}

/// Rows `first .. first + len` of a [`Bf16Matrix`]: the weight `[len, cols]`
/// of one product (a projection, or a vocabulary slice of a tied head).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The table.
    pub matrix: &'a Bf16Matrix,
    /// First row of the window.
    pub first: usize,
    /// Rows in the window.
    pub len: usize,
}

impl<'a> Rows<'a> {
    /// The window's `[len, cols]` bits.
    fn bits(&self) -> &'a [u16] {
        let c = self.matrix.cols;
        &self.matrix.bits()[self.first * c..(self.first + self.len) * c]
    }
}

/// The frozen weight `[rows, cols]` of one product: rows of a bf16 table,
/// or a Q4_0/Q4_1/Q8_0 checkpoint's blocks, which compute exactly as their bf16
/// rounding would (`crate::ops::quant_bf16`): the AMX and AVX512-BF16
/// kernels decode them as they pack their panels, the others decode the
/// whole weight into a scratch table first.
#[derive(Clone, Copy)]
pub enum Weight<'a> {
    /// Rows of a bf16 table.
    Bf16(Rows<'a>),
    /// Quantized blocks; only where `quant_bf16::decodes(dtype)`.
    Blocks {
        /// Q4_0, Q4_1 or Q8_0.
        dtype: DType,
        /// `rows` rows of `cols` values, whole blocks.
        bytes: &'a [u8],
        /// Output rows.
        rows: usize,
        /// Values a row.
        cols: usize,
    },
}

impl<'a> From<Rows<'a>> for Weight<'a> {
    fn from(rows: Rows<'a>) -> Self {
        Weight::Bf16(rows)
    }
}

/// Scratch tables quantized weights decode into for the kernels that read
/// bf16 rows (a weight of a few MB, decoded afresh per product; reused so
/// that no product page-faults a new one in).
static SCRATCH: std::sync::Mutex<Vec<Vec<bf16>>> = std::sync::Mutex::new(Vec::new());

impl<'a> Weight<'a> {
    /// `(rows, cols)`, after checking the weight holds them.
    fn dims(&self) -> (usize, usize) {
        match *self {
            Weight::Bf16(w) => {
                assert!(w.first + w.len <= w.matrix.rows, "bf16 row window");
                (w.len, w.matrix.cols)
            }
            Weight::Blocks { dtype, bytes, rows, cols } => {
                assert!(crate::ops::quant_bf16::decodes(dtype), "{dtype:?} blocks cannot be decoded here");
                assert_eq!(dtype.bytes_for(cols).map(|b| b * rows), Some(bytes.len()), "block weight length");
                (rows, cols)
            }
        }
    }

    /// The AMX and AVX512-BF16 kernels' view.
    #[cfg(target_arch = "x86_64")]
    fn source(&self) -> avx512_pack::Source<'a> {
        match *self {
            Weight::Bf16(w) => avx512_pack::Source::Bits(w.bits()),
            Weight::Blocks { dtype, bytes, .. } => avx512_pack::Source::Blocks { dtype, bytes },
        }
    }

    /// Runs `product` on the weight's bf16 bits: the table's, or the blocks
    /// decoded into a scratch table for the call.
    fn with_bits<R>(&self, product: impl FnOnce(&[u16]) -> R) -> R {
        match *self {
            Weight::Bf16(w) => product(w.bits()),
            Weight::Blocks { dtype, bytes, rows, cols } => {
                let spare = SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default();
                let m = Bf16Matrix::filled(spare, rows, cols, |bits| crate::ops::quant_bf16::decode_rows(dtype, bytes, cols, bits));
                let r = product(m.bits());
                SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).push(m.into_vec());
                r
            }
        }
    }
}

/// Which implementation computes a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AMX tiles (`TDPBF16PS`).
    Amx,
    /// AVX-512 register tiles of `VDPBF16PS`.
    Avx512Bf16,
    /// NEON register tiles of `BFMMLA` (aarch64 with FEAT_BF16).
    NeonBfmmla,
    /// Any CPU: bf16 panels widened to f32, f32 register tiles.
    Portable,
}

impl Kernel {
    /// AMX when the CPU has AMX-BF16 and the OS granted this process the
    /// tile state (asked once), else AVX512-BF16 where the CPU has it, else
    /// BFMMLA on an Arm CPU with BF16, else the portable kernel.
    /// `HEXLORA_BF16_KERNEL=amx|avx512bf16|neon-bfmmla|portable` picks one
    /// (a kernel this CPU lacks falls back as above), so runs can be
    /// compared kernel against kernel.
    pub fn detect() -> Kernel {
        let wanted = std::env::var("HEXLORA_BF16_KERNEL").ok();
        match wanted.as_deref() {
            Some("portable") => return Kernel::Portable,
            Some("avx512bf16") if avx512bf16_available() => return Kernel::Avx512Bf16,
            _ => {}
        }
        if amx_available() && wanted.as_deref() != Some("avx512bf16") {
            Kernel::Amx
        } else if avx512bf16_available() {
            Kernel::Avx512Bf16
        } else if neon_bfmmla_available() {
            Kernel::NeonBfmmla
        } else {
            Kernel::Portable
        }
    }

    /// The name `hexlora info` prints, with the f32 tiles the portable
    /// kernel widens onto.
    pub fn name(self) -> String {
        match self {
            Kernel::Amx => "amx-bf16".into(),
            Kernel::Avx512Bf16 => "avx512-bf16".into(),
            Kernel::NeonBfmmla => "neon-bfmmla".into(),
            Kernel::Portable => format!("widened to f32, {} tiles", crate::ops::matmul::unpacked_tiles_name()),
        }
    }
}

/// Whether [`Kernel::NeonBfmmla`] can run here.
pub fn neon_bfmmla_available() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        neon_bfmmla::available()
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// Whether [`Kernel::Amx`] can run here (CPUID and the Linux permission).
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether [`Kernel::Avx512Bf16`] can run here.
pub fn avx512bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512bf16::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[tokens, rows] = bf16(x[tokens, cols]) W^T`.
pub fn forward<'a>(kernel: Kernel, out: &mut [f32], x: &[f32], tokens: usize, w: impl Into<Weight<'a>>) {
    let w = w.into();
    let (n, k) = w.dims();
    assert!(x.len() == tokens * k && out.len() == tokens * n, "bf16 forward lengths");
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx if amx::available() => amx::forward(out, x, tokens, w.source(), n, k),
        Kernel::Amx => panic!("the AMX kernel was asked for on a CPU without AMX-BF16"),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bf16 if avx512bf16::available() => avx512bf16::forward(out, x, tokens, w.source(), n, k),
        Kernel::Avx512Bf16 => panic!("the AVX512-BF16 kernel was asked for on a CPU without it"),
        #[cfg(target_arch = "aarch64")]
        Kernel::NeonBfmmla if neon_bfmmla::available() => w.with_bits(|w| neon_bfmmla::forward(out, x, tokens, w, n, k)),
        Kernel::NeonBfmmla => panic!("the BFMMLA kernel was asked for on a CPU without BF16"),
        Kernel::Portable => w.with_bits(|w| portable::forward(out, x, tokens, w, n, k)),
    }
}

/// `out[tokens, cols] = bf16(dy[tokens, rows]) W`.
pub fn input_grad<'a>(kernel: Kernel, out: &mut [f32], dy: &[f32], tokens: usize, w: impl Into<Weight<'a>>) {
    let w = w.into();
    let (rows, cols) = w.dims();
    assert!(dy.len() == tokens * rows && out.len() == tokens * cols, "bf16 input-gradient lengths");
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx if amx::available() => amx::input_grad(out, dy, tokens, w.source(), rows, cols),
        Kernel::Amx => panic!("the AMX kernel was asked for on a CPU without AMX-BF16"),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bf16 if avx512bf16::available() => avx512bf16::input_grad(out, dy, tokens, w.source(), rows, cols),
        Kernel::Avx512Bf16 => panic!("the AVX512-BF16 kernel was asked for on a CPU without it"),
        #[cfg(target_arch = "aarch64")]
        Kernel::NeonBfmmla if neon_bfmmla::available() => w.with_bits(|w| neon_bfmmla::input_grad(out, dy, tokens, w, rows, cols)),
        Kernel::NeonBfmmla => panic!("the BFMMLA kernel was asked for on a CPU without BF16"),
        Kernel::Portable => w.with_bits(|w| portable::input_grad(out, dy, tokens, w, rows, cols)),
    }
}

pub use crate::projection::{Carried, LoraFactors};

impl LoraFactors<'_> {
    /// `([A_hi; A_lo], [B_hi | B_hi | B_lo])` as bf16 bits, for the forward
    /// (see `amx::Ride`).
    #[cfg(target_arch = "x86_64")]
    fn forward_bits(&self) -> (Vec<u16>, Vec<u16>) {
        let ((a_hi, a_lo), (b_hi, b_lo)) = (hi_lo_bits(self.a), hi_lo_bits(self.b));
        ([a_hi, a_lo].concat(), side_by_side(&[&b_hi, &b_hi, &b_lo], self.rank))
    }

    /// `([A_hi; A_hi; A_lo], [B_hi | B_lo])` as bf16 bits, for the input
    /// gradient.
    #[cfg(target_arch = "x86_64")]
    fn input_grad_bits(&self) -> (Vec<u16>, Vec<u16>) {
        let ((a_hi, a_lo), (b_hi, b_lo)) = (hi_lo_bits(self.a), hi_lo_bits(self.b));
        ([&a_hi[..], &a_hi, &a_lo].concat(), side_by_side(&[&b_hi, &b_lo], self.rank))
    }

    /// Whether `kernel` can carry this branch on a product over `tokens`
    /// rows with a `reduction` and `width` output columns: nothing is
    /// empty, `side` is `[tokens, r]`, and on AMX the reduction runs in one
    /// pass, on AVX512-BF16 the rank is at most 16 (the side product's hi
    /// and lo halves fill one 32-column tile).
    #[cfg(target_arch = "x86_64")]
    fn carried(&self, kernel: Kernel, tokens: usize, (reduction, width): (usize, usize), side: &[f32]) -> bool {
        let fits = self.rank > 0 && tokens > 0 && reduction > 0 && width > 0 && side.len() == tokens * self.rank;
        fits && match kernel {
            Kernel::Amx => amx::available() && amx::one_pass(tokens, reduction),
            Kernel::Avx512Bf16 => avx512bf16::available() && 2 * self.rank <= avx512bf16::NR,
            _ => false,
        }
    }
}

/// `out = bf16(x) W^T + scale xa B^T` with `xa[tokens, r] = bf16(x) A^T`
/// written to `xa`: the frozen product and a LoRA branch in one pass of
/// the AMX tiles (or of the AVX512-BF16 tiles, rank <= 16). The branch's
/// own operands (`A`, `B`, `xa`) are carried as sums of two bf16 (~16 bits,
/// products summed in f32); only the activation is rounded once, as the
/// frozen product rounds it. Returns `false`, having written nothing, when
/// the kernel cannot carry the branch (another kernel, an AMX reduction
/// longer than one pass, an AVX512-BF16 rank above 16): the caller then
/// runs the branch itself.
pub fn forward_lora<'a>(kernel: Kernel, out: &mut [f32], x: &[f32], tokens: usize, w: impl Into<Weight<'a>>, lora: LoraFactors<'_>, xa: &mut [f32]) -> bool {
    let w = w.into();
    let (n, k) = w.dims();
    assert!(x.len() == tokens * k && out.len() == tokens * n, "bf16 forward lengths");
    assert!(lora.a.len() == lora.rank * k && lora.b.len() == n * lora.rank, "LoRA factor lengths");
    #[cfg(target_arch = "x86_64")]
    if lora.carried(kernel, tokens, (k, n), xa) {
        let (a2, b3) = lora.forward_bits();
        match kernel {
            Kernel::Avx512Bf16 => avx512bf16::forward_lora(out, x, tokens, w.source(), (n, k), (&a2, &b3, lora.rank), lora.scale, xa),
            _ => amx::forward_lora(out, x, tokens, w.source(), (n, k), (&a2, &b3, lora.rank), lora.scale, xa),
        }
        return true;
    }
    let _ = (kernel, xa);
    false
}

/// `out = bf16(dy) W + dxa A` with `dxa[tokens, r] = scale bf16(dy) B`
/// written to `dxa` (the branch's operands as in [`forward_lora`]): the input
/// gradient of the frozen product and of the LoRA branch in one pass (see
/// [`forward_lora`]; `false` the same way). With `db = Some((xa, db))`
/// and a rank of at most 32 it also writes `db[out, r] = scale bf16(dY)^T
/// xa` from the rounded `dY` the pass holds in tile order (`xa` as two
/// bf16), and returns [`Carried::BranchAndDb`]; [`Carried::Branch`] leaves
/// `db` to the caller.
#[allow(clippy::too_many_arguments)]
pub fn input_grad_lora<'a>(
    kernel: Kernel,
    out: &mut [f32],
    dy: &[f32],
    tokens: usize,
    w: impl Into<Weight<'a>>,
    lora: LoraFactors<'_>,
    dxa: &mut [f32],
    db: Option<(&[f32], &mut [f32])>,
) -> Carried {
    let w = w.into();
    let (rows, cols) = w.dims();
    assert!(dy.len() == tokens * rows && out.len() == tokens * cols, "bf16 input-gradient lengths");
    assert!(lora.a.len() == lora.rank * cols && lora.b.len() == rows * lora.rank, "LoRA factor lengths");
    #[cfg(target_arch = "x86_64")]
    if lora.carried(kernel, tokens, (rows, cols), dxa) {
        let r = lora.rank;
        if kernel == Kernel::Avx512Bf16 {
            // dB stays the caller's: dY is not kept in an order its product reads
            let (a3, b2) = lora.input_grad_bits();
            avx512bf16::input_grad_lora(out, dy, tokens, w.source(), (rows, cols), (&a3, &b2, r), lora.scale, dxa);
            return Carried::Branch;
        }
        let db = db.filter(|(xa, db)| r <= 32 && xa.len() == tokens * r && db.len() == rows * r);
        let mut dbt = db.as_ref().map(|_| vec![0.0; r * rows]); // [r, out]
        let token_sums = db.as_ref().zip(dbt.as_deref_mut()).map(|((xa, _), dbt)| (*xa, dbt));
        let (a3, b2) = lora.input_grad_bits();
        amx::input_grad_lora(out, dy, tokens, w.source(), (rows, cols), (&a3, &b2, r), lora.scale, dxa, token_sums);
        if let (Some((_, db)), Some(dbt)) = (db, dbt) {
            for (o, row) in db.chunks_exact_mut(r).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = lora.scale * dbt[j * rows + o];
                }
            }
            return Carried::BranchAndDb;
        }
        return Carried::Branch;
    }
    let _ = (kernel, dxa, db);
    Carried::No
}

/// bf16 bits of `v`, rounded to nearest even; NaN stays a (quiet) NaN.
/// Written branch-free so slice loops vectorize; equals
/// `half::bf16::from_f32(v).to_bits()` (tested).
#[inline]
pub fn round_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    if nan {
        ((b >> 16) as u16) | 0x0040
    } else {
        rounded
    }
}

/// bf16 bits to f32 (exact).
#[inline]
fn widen(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `(bf16(v), v - bf16(v))`, both as f32 (the remainder is exact): the
/// two halves in which the LoRA-carrying kernels hold a branch operand to
/// ~16 bits once the remainder is rounded too.
#[cfg(target_arch = "x86_64")]
#[inline]
fn split(v: f32) -> (f32, f32) {
    let hi = widen(round_bits(v));
    (hi, v - hi)
}

/// `(hi, lo)`: the bf16 bits of every value of `m` and of its remainder
/// ([`split`]). This runs before every carried product, on the rayon pool
/// (serially, per value, it was ~3% of a training step with the other
/// core idle); chunks map slice to slice, so they vectorize.
#[cfg(target_arch = "x86_64")]
fn hi_lo_bits(m: &[f32]) -> (Vec<u16>, Vec<u16>) {
    const CHUNK: usize = 4096;
    let (mut hi, mut lo) = (vec![0u16; m.len()], vec![0u16; m.len()]);
    hi.par_chunks_mut(CHUNK).zip(lo.par_chunks_mut(CHUNK)).zip(m.par_chunks(CHUNK)).for_each(|((hi, lo), m)| {
        hi.iter_mut().zip(m).for_each(|(h, &v)| *h = round_bits(v));
        lo.iter_mut().zip(m).zip(hi.iter()).for_each(|((l, &v), &h)| *l = round_bits(v - widen(h)));
    });
    (hi, lo)
}

/// Row `i` of every part (`[rows, r]` each) side by side:
/// `[rows, r * parts.len()]`.
#[cfg(target_arch = "x86_64")]
fn side_by_side(parts: &[&[u16]], r: usize) -> Vec<u16> {
    const ROWS: usize = 256;
    let w = r * parts.len();
    let mut out = vec![0u16; parts[0].len() * parts.len()];
    out.par_chunks_mut(ROWS * w).enumerate().for_each(|(c, out)| {
        for (i, dst) in out.chunks_exact_mut(w).enumerate() {
            let row = (c * ROWS + i) * r;
            dst.chunks_exact_mut(r).zip(parts).for_each(|(d, p)| d.copy_from_slice(&p[row..row + r]));
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, k: f32, amp: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 * k).sin() + 0.3 * (i as f32 * 0.017).cos()) * amp).collect()
    }

    /// f64 products of the bf16-rounded operands: `(value, sum |a b|)`.
    fn reference(a: &[f32], a_rows: usize, k: usize, b_at: impl Fn(usize, usize) -> f32, n: usize) -> Vec<(f64, f64)> {
        let r = |v: f32| bf16::from_f32(v).to_f64();
        let mut out = Vec::with_capacity(a_rows * n);
        for t in 0..a_rows {
            for j in 0..n {
                let (mut s, mut mag) = (0f64, 0f64);
                for p in 0..k {
                    let prod = r(a[t * k + p]) * r(b_at(p, j));
                    s += prod;
                    mag += prod.abs();
                }
                out.push((s, mag));
            }
        }
        out
    }

    /// `scale bf16(a) b` with `b` as its two-bf16 split, in f64.
    #[cfg(target_arch = "x86_64")] // for the AMX-only LoRA-carrying products
    fn reference_split(a: &[f32], a_rows: usize, k: usize, b_at: impl Fn(usize, usize) -> f32, n: usize, scale: f64) -> Vec<(f64, f64)> {
        let r = |v: f32| bf16::from_f32(v).to_f64();
        let lo = |v: f32| r(v - bf16::from_f32(v).to_f32());
        let hi = reference(a, a_rows, k, &b_at, n);
        let low = reference(a, a_rows, k, |p, j| lo(b_at(p, j)) as f32, n);
        hi.iter().zip(low).map(|((h, hm), (l, lm))| (scale * (h + l), scale.abs() * (hm + lm))).collect()
    }

    fn assert_close(got: &[f32], want: &[(f64, f64)], what: &str) {
        assert_eq!(got.len(), want.len());
        for (i, (g, (w, mag))) in got.iter().zip(want).enumerate() {
            assert!((*g as f64 - w).abs() <= 1e-5 * mag + 1e-30, "{what} element {i}: {g} vs {w} (sum |ab| {mag})");
        }
    }

    /// The portable kernel and the tile kernels this CPU runs (the
    /// AVX512-BF16 and BFMMLA kernels have their own tests too; on an AMX
    /// CPU both AMX and AVX512-BF16 are listed); a skip of
    /// the tile kernels' part when there are none.
    fn kernels() -> Vec<Kernel> {
        let mut kernels = vec![Kernel::Portable];
        if amx_available() {
            kernels.push(Kernel::Amx);
        }
        if avx512bf16_available() {
            kernels.push(Kernel::Avx512Bf16);
        }
        if neon_bfmmla_available() {
            kernels.push(Kernel::NeonBfmmla);
        }
        if kernels.len() == 1 {
            crate::test_skip::skip_allowed_in_ci(
                "the tile kernels' part: no AMX-BF16, AVX512-BF16 or BFMMLA on this CPU/OS (the portable kernel is checked)",
                crate::test_skip::CPU_CLASS_VARIES,
            );
        }
        kernels
    }

    /// Both directions against f64 of the bf16-rounded operands, on shapes
    /// that are not multiples of the tiles, through a row window that
    /// starts mid-table.
    #[test]
    fn both_directions_match_f64_of_bf16_operands() {
        let kernels = kernels();
        // (40, 1700) and (1700, 40): a reduction longer than one AMX pass
        for &(out_f, in_f) in &[(40, 50), (19, 70), (33, 96), (64, 31), (100, 200), (40, 1700), (1700, 40)] {
            let first = 3;
            let table = values((first + out_f + 5) * in_f, 0.37, 1.5);
            let m = Bf16Matrix::from_f32(&table, first + out_f + 5, in_f);
            let w = Rows { matrix: &m, first, len: out_f };
            let w_at = |o: usize, i: usize| table[(first + o) * in_f + i];
            for tokens in [1, 7, 33, 256] {
                let x = values(tokens * in_f, 0.71, 2.0);
                let want = reference(&x, tokens, in_f, |p, j| w_at(j, p), out_f);
                let dy = values(tokens * out_f, 0.53, 0.8);
                let want_dx = reference(&dy, tokens, out_f, w_at, in_f);
                for &kernel in &kernels {
                    let mut y = vec![f32::NAN; tokens * out_f];
                    forward(kernel, &mut y, &x, tokens, w);
                    assert_close(&y, &want, &format!("{kernel:?} forward {tokens}x{in_f}->{out_f}"));
                    let mut dx = vec![f32::NAN; tokens * in_f];
                    input_grad(kernel, &mut dx, &dy, tokens, w);
                    assert_close(&dx, &want_dx, &format!("{kernel:?} input grad {tokens}x{out_f}->{in_f}"));
                }
            }
        }
    }

    /// The AMX and the portable kernel agree (same rounded operands, only
    /// the f32 summation order differs), and neither depends on the
    /// number of threads.
    #[test]
    fn amx_and_portable_agree_and_ignore_thread_count() {
        let (tokens, out_f, in_f) = (48, 70, 100);
        let table = values(out_f * in_f, 0.29, 1.0);
        let m = Bf16Matrix::from_f32(&table, out_f, in_f);
        let w = Rows { matrix: &m, first: 0, len: out_f };
        let x = values(tokens * in_f, 0.83, 1.0);
        let run = |kernel: Kernel, threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let (mut y, mut dx) = (vec![0.0; tokens * out_f], vec![0.0; tokens * in_f]);
            pool.install(|| {
                forward(kernel, &mut y, &x, tokens, w);
                input_grad(kernel, &mut dx, &y, tokens, w);
            });
            (y, dx)
        };
        for kernel in kernels() {
            assert_eq!(run(kernel, 1), run(kernel, 3), "{kernel:?}: bit-identical across thread counts");
        }
        if !amx_available() {
            return crate::test_skip::skip_allowed_in_ci("the AMX-vs-portable comparison: no AMX-BF16 on this CPU/OS", crate::test_skip::CPU_CLASS_VARIES);
        }
        let (amx, port) = (run(Kernel::Amx, 2), run(Kernel::Portable, 2));
        for (a, p) in amx.0.iter().zip(&port.0).chain(amx.1.iter().zip(&port.1)) {
            assert!((a - p).abs() <= 1e-5 * (1.0 + p.abs()), "{a} vs {p}");
        }
    }

    /// The LoRA-carrying products against f64 of their bf16 operands: the
    /// side output (`xa`, `dxa`) on its own, then the whole output with the
    /// side's f32 values split as the kernel's extra reduction block
    /// splits them. Ranks below, at and above half a 32-column block.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lora_carrying_products_match_f64_of_bf16_operands() {
        let carrying: Vec<Kernel> = [(Kernel::Amx, amx_available()), (Kernel::Avx512Bf16, avx512bf16_available())].iter().filter(|k| k.1).map(|k| k.0).collect();
        if carrying.is_empty() {
            return crate::test_skip::skip_allowed_in_ci(
                "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS: only those kernels carry LoRA branches (callers fall back)",
                crate::test_skip::CPU_CLASS_VARIES,
            );
        }
        for kernel in carrying {
            lora_carrying_kernel_matches_f64(kernel);
        }
    }

    /// The carrying products give the same bits on one thread as on three.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lora_carrying_products_ignore_thread_count() {
        let (tokens, out_f, in_f, rank) = (45, 70, 100, 16);
        let m = Bf16Matrix::from_f32(&values(out_f * in_f, 0.29, 1.0), out_f, in_f);
        let w = Rows { matrix: &m, first: 0, len: out_f };
        let (a, b) = (values(rank * in_f, 0.61, 0.3), values(out_f * rank, 0.43, 0.2));
        let lora = LoraFactors { a: &a, b: &b, rank, scale: 2.0 };
        let (x, dy) = (values(tokens * in_f, 0.71, 2.0), values(tokens * out_f, 0.53, 0.8));
        let mut checked = 0;
        for kernel in [Kernel::Amx, Kernel::Avx512Bf16] {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let (mut y, mut xa, mut dx, mut dxa) = (vec![0.0; tokens * out_f], vec![0.0; tokens * rank], vec![0.0; tokens * in_f], vec![0.0; tokens * rank]);
                let carried = pool.install(|| {
                    forward_lora(kernel, &mut y, &x, tokens, w, lora, &mut xa) && input_grad_lora(kernel, &mut dx, &dy, tokens, w, lora, &mut dxa, None) != Carried::No
                });
                carried.then_some([y, xa, dx, dxa])
            };
            let one = run(1);
            if one.is_some() {
                assert_eq!(one, run(3), "{kernel:?}");
                checked += 1;
            }
        }
        if checked == 0 {
            crate::test_skip::skip_allowed_in_ci(
                "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS: no kernel carries LoRA branches here",
                crate::test_skip::CPU_CLASS_VARIES,
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn lora_carrying_kernel_matches_f64(kernel: Kernel) {
        let r16 = |v: f32| bf16::from_f32(v).to_f64();
        // a branch operand as the kernel carries it: bf16 plus its bf16 remainder
        let split = |v: f32| r16(v) + r16(v - bf16::from_f32(v).to_f32());
        for &(out_f, in_f, rank) in &[(40, 50, 1), (70, 100, 16), (33, 96, 20), (100, 64, 33)] {
            let first = 3;
            let table = values((first + out_f + 2) * in_f, 0.37, 1.5);
            let m = Bf16Matrix::from_f32(&table, first + out_f + 2, in_f);
            let w = Rows { matrix: &m, first, len: out_f };
            let w_at = |o: usize, i: usize| table[(first + o) * in_f + i];
            let (a, b) = (values(rank * in_f, 0.61, 0.3), values(out_f * rank, 0.43, 0.2));
            let lora = LoraFactors { a: &a, b: &b, rank, scale: 1.75 };
            for tokens in [1, 7, 33, 256] {
                let x = values(tokens * in_f, 0.71, 2.0);
                let (mut y, mut xa) = (vec![f32::NAN; tokens * out_f], vec![f32::NAN; tokens * rank]);
                let carries = forward_lora(kernel, &mut y, &x, tokens, w, lora, &mut xa);
                if kernel == Kernel::Avx512Bf16 && rank > 16 {
                    assert!(!carries && y.iter().chain(&xa).all(|v| v.is_nan()), "{kernel:?} r{rank}: declines, writing nothing");
                    continue;
                }
                assert!(carries, "{kernel:?} r{rank} carries");
                assert_close(&xa, &reference_split(&x, tokens, in_f, |p, j| a[j * in_f + p], rank, 1.0), "xa");
                let frozen = reference(&x, tokens, in_f, |p, j| w_at(j, p), out_f);
                let want: Vec<(f64, f64)> = (0..tokens * out_f)
                    .map(|e| {
                        let (t, o) = (e / out_f, e % out_f);
                        let terms = (0..rank).map(|j| split(1.75 * xa[t * rank + j]) * split(b[o * rank + j]));
                        terms.fold(frozen[e], |(s, mag), p| (s + p, mag + p.abs()))
                    })
                    .collect();
                assert_close(&y, &want, &format!("forward {tokens}x{in_f}->{out_f} r{rank}"));

                let dy = values(tokens * out_f, 0.53, 0.8);
                let (mut dx, mut dxa) = (vec![f32::NAN; tokens * in_f], vec![f32::NAN; tokens * rank]);
                let mut db = vec![f32::NAN; out_f * rank];
                let carried = input_grad_lora(kernel, &mut dx, &dy, tokens, w, lora, &mut dxa, Some((&xa, &mut db)));
                let with_db = kernel == Kernel::Amx && rank <= 32;
                assert_eq!(carried, if with_db { Carried::BranchAndDb } else { Carried::Branch });
                if with_db {
                    // db[o][j] = 1.75 sum_t bf16(dy[t][o]) split(xa[t][j])
                    let want_db: Vec<(f64, f64)> = (0..out_f * rank)
                        .map(|e| {
                            let (o, j) = (e / rank, e % rank);
                            let terms = (0..tokens).map(|t| 1.75 * r16(dy[t * out_f + o]) * split(xa[t * rank + j]));
                            terms.fold((0.0, 0.0), |(s, mag), p| (s + p, mag + p.abs()))
                        })
                        .collect();
                    assert_close(&db, &want_db, &format!("db {tokens}x{out_f} r{rank}"));
                }
                let want_dxa = reference_split(&dy, tokens, out_f, |o, j| b[o * rank + j], rank, 1.75);
                assert_close(&dxa, &want_dxa, "dxa");
                let frozen = reference(&dy, tokens, out_f, w_at, in_f);
                let want: Vec<(f64, f64)> = (0..tokens * in_f)
                    .map(|e| {
                        let (t, c) = (e / in_f, e % in_f);
                        let terms = (0..rank).map(|j| split(dxa[t * rank + j]) * split(a[j * in_f + c]));
                        terms.fold(frozen[e], |(s, mag), p| (s + p, mag + p.abs()))
                    })
                    .collect();
                assert_close(&dx, &want, &format!("input grad {tokens}x{out_f}->{in_f} r{rank}"));
            }
        }
    }

    /// Where the branch cannot ride (the portable kernel, a reduction
    /// longer than one pass) the calls say so and write nothing.
    #[test]
    fn lora_carrying_products_decline_without_writing() {
        // 256 x 1700: more activation than one AMX pass holds
        let (tokens, out_f, in_f, rank) = (256, 24, 1700, 4);
        let table = values(out_f * in_f, 0.29, 1.0);
        let m = Bf16Matrix::from_f32(&table, out_f, in_f);
        let w = Rows { matrix: &m, first: 0, len: out_f };
        let (a, b) = (values(rank * in_f, 0.61, 0.3), values(out_f * rank, 0.43, 0.2));
        let lora = LoraFactors { a: &a, b: &b, rank, scale: 2.0 };
        let x = values(tokens * in_f, 0.71, 2.0);
        for kernel in [Kernel::Portable, Kernel::Amx] {
            let (mut y, mut xa) = (vec![f32::NAN; tokens * out_f], vec![f32::NAN; tokens * rank]);
            assert!(!forward_lora(kernel, &mut y, &x, tokens, w, lora, &mut xa), "{kernel:?} carried a two-pass product");
            assert!(y.iter().chain(&xa).all(|v| v.is_nan()), "{kernel:?} declined but wrote");
        }
    }

    #[test]
    fn rounding_matches_half() {
        let specials = [0.0f32, -0.0, 1.0, f32::MAX, f32::MIN_POSITIVE, 1e-40, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN];
        let mut bits: Vec<u32> = specials.iter().map(|v| v.to_bits()).collect();
        // halfway cases (both parities), neighbours, and a spread of values
        bits.extend([0x3f80_8000, 0x3f81_8000, 0x3f80_7fff, 0x3f80_8001, 0x7f7f_ffff, 0x7f80_0001, 0xffc0_0001]);
        bits.extend((0..200_000u32).map(|i| i.wrapping_mul(2_654_435_761)));
        for b in bits {
            let v = f32::from_bits(b);
            let want = bf16::from_f32(v);
            let got = bf16::from_bits(round_bits(v));
            if want.is_nan() {
                assert!(got.is_nan(), "{b:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{b:#x}");
            }
        }
    }
}

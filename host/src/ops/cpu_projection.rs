//! The CPU [`Projection`]: the frozen weight held dense in f32, row-major
//! `[out, in]`, and both products through [`crate::ops::matmul`] (forward
//! products of a few rows through [`crate::ops::quant_matvec`]). Quantized
//! checkpoints are dequantized once at load, so the CPU sees exactly the
//! effective weight transformers computes with when it loads the same file.
//!
//! The weight may be a row window of a shared table (the vocabulary head's
//! slices over a tied embedding), so nothing is copied.
//!
//! [`Bf16Projection`] holds the same weight once in bf16 (half the memory)
//! and computes both products with f32 accumulation
//! ([`crate::ops::bf16_matmul`], AMX where the CPU has it); which one a
//! model gets is its [`FrozenDtype`].
use crate::base::dtype::{DType, RawTensor};
use crate::ops::bf16_matmul::{self, Bf16Matrix, Kernel, Rows, Weight};
use crate::ops::matmul::{matmul, matmul_bt};
use crate::ops::quant_bf16;
use crate::ops::quant_matvec::{self, StoredRows};
use crate::projection::{Carried, Direction, LoraFactors, Product, Projection, ProjectionInfo};
use crate::{Error, Result};
use std::sync::Arc;

/// A frozen projection computed on the CPU in f32.
pub struct CpuProjection {
    info: ProjectionInfo,
    /// Holds `[out_features, in_features]` from row `first_row` on.
    table: Arc<Vec<f32>>,
    first_row: usize,
}

impl CpuProjection {
    /// Wraps an f32 weight `[out, in]`, checking its length against `info`.
    pub fn new(info: ProjectionInfo, weight: Vec<f32>) -> Result<Self> {
        if weight.len() != info.out_features * info.in_features {
            return Err(Error::Shape {
                what: info.name.clone(),
                expected: vec![info.out_features, info.in_features],
                got: vec![weight.len()],
            });
        }
        Ok(CpuProjection { info, table: Arc::new(weight), first_row: 0 })
    }

    /// Rows `first_row .. first_row + out_features` of a shared `[rows, in]`
    /// table, without copying it.
    pub fn window(info: ProjectionInfo, table: Arc<Vec<f32>>, first_row: usize) -> Result<Self> {
        let end = (first_row + info.out_features) * info.in_features;
        if info.in_features == 0 || table.len() % info.in_features != 0 || end > table.len() {
            return Err(Error::Shape {
                what: format!("{} (row window from {first_row})", info.name),
                expected: vec![first_row + info.out_features, info.in_features],
                got: vec![table.len()],
            });
        }
        Ok(CpuProjection { info, table, first_row })
    }

    /// Dequantizes a checkpoint tensor whose shape must be `[out, in]`.
    pub fn from_raw(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Self> {
        check_raw_shape(&info, raw)?;
        Self::new(info, raw.to_f32()?)
    }

    /// The weight, `[out, in]` (tests and the NPU planner's CPU reference).
    pub fn weight(&self) -> &[f32] {
        let n_in = self.info.in_features;
        &self.table[self.first_row * n_in..(self.first_row + self.info.out_features) * n_in]
    }
}

/// A frozen projection that keeps the checkpoint's stored bytes (Q4_1,
/// Q8_0, ...) at the file's size (0.6 bytes a Q4_1 weight, not 4).
/// Forward products of up to [`FEW_TOKENS`] rows (decoding) read the
/// blocks directly ([`quant_matvec`]); every other product dequantizes the
/// weight to f32 for the call and gives [`CpuProjection`]'s bits.
///
/// Used where the weight is mostly read a token at a time or rarely:
/// generation and serving (decoding is bound by the bytes it reads), and
/// the split runtime's CPU side, which only serves the planner's reference
/// products and the rare fallback while the DSP holds the weight it
/// computes with (SmolLM2's dense f32 copies were 424 of the nightly job's
/// 956 MiB).
pub struct StoredProjection {
    info: ProjectionInfo,
    dtype: DType,
    bytes: Vec<u8>,
}

impl StoredProjection {
    /// Copies a checkpoint tensor whose shape must be `[out, in]` and whose
    /// byte count must match its type.
    pub fn from_raw(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Self> {
        check_raw_shape(&info, raw)?;
        raw.checked_row_bytes()?;
        Ok(StoredProjection { info, dtype: raw.dtype, bytes: raw.bytes.to_vec() })
    }

    /// The weight `[out, in]` in f32, as [`CpuProjection::from_raw`] holds it.
    pub fn weight(&self) -> Result<Vec<f32>> {
        self.raw().to_f32()
    }

    /// The stored bytes seen again as the checkpoint tensor they came from.
    fn raw(&self) -> RawTensor<'_> {
        let shape = vec![self.info.out_features, self.info.in_features];
        RawTensor { name: self.info.name.clone(), dtype: self.dtype, shape, bytes: &self.bytes }
    }
}

impl Projection for StoredProjection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        // checked before the dequantization it would waste; the dense
        // projection's apply checks again (cheap)
        self.info.check_io(dir, input, tokens, out)?;
        if dir == Direction::Forward && tokens <= FEW_TOKENS && quant_matvec::reads_blocks(self.dtype) {
            let dims = (self.info.out_features, self.info.in_features);
            quant_matvec::matvec(out, input, tokens, StoredRows::Blocks(self.dtype, &self.bytes), dims);
            return Ok(());
        }
        CpuProjection::new(self.info.clone(), self.weight()?)?.apply(dir, input, tokens, out)
    }

    fn scaled_rows(&self, rows: &[usize], scales: &[f32], out: &mut [f32]) -> Result<()> {
        self.info.check_rows(rows, scales, out)?;
        let raw = self.raw();
        for ((&r, &s), o) in rows.iter().zip(scales).zip(out.chunks_exact_mut(self.info.in_features)) {
            raw.dequantize_rows(r..r + 1, o)?;
            o.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }
}

/// A checkpoint tensor must be the projection's `[out, in]`.
fn check_raw_shape(info: &ProjectionInfo, raw: &RawTensor<'_>) -> Result<()> {
    if raw.shape != [info.out_features, info.in_features] {
        return Err(Error::Shape { what: raw.name.clone(), expected: vec![info.out_features, info.in_features], got: raw.shape.clone() });
    }
    Ok(())
}

impl Projection for CpuProjection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.info.check_io(dir, input, tokens, out)?;
        let (n_in, n_out) = (self.info.in_features, self.info.out_features);
        let w = self.weight();
        let packed = packed_tiles_fit(tokens);
        match dir {
            // Decoding's few rows: one pass over W per four rows.
            Direction::Forward if tokens <= FEW_TOKENS => {
                quant_matvec::matvec(out, input, tokens, StoredRows::F32(w), (n_out, n_in));
            }
            // Y[t, out] = X[t, in] W[out, in]^T
            Direction::Forward => {
                if !(packed && bf16_matmul::f32_forward(out, input, tokens, w, (n_out, n_in))) {
                    matmul_bt(out, input, w, (tokens, n_in, n_out), 1.0, false);
                }
            }
            // dX[t, in] = dY[t, out] W[out, in]
            Direction::InputGrad => {
                if !(packed && bf16_matmul::f32_input_grad(out, input, tokens, w, (n_out, n_in))) {
                    matmul(out, input, w, (tokens, n_out, n_in), 1.0, false);
                }
            }
        }
        Ok(())
    }

    fn scaled_rows(&self, rows: &[usize], scales: &[f32], out: &mut [f32]) -> Result<()> {
        self.info.check_rows(rows, scales, out)?;
        let (w, n_in) = (self.weight(), self.info.in_features);
        for ((&r, &s), o) in rows.iter().zip(scales).zip(out.chunks_exact_mut(n_in)) {
            o.iter_mut().zip(&w[r * n_in..(r + 1) * n_in]).for_each(|(o, &w)| *o = s * w);
        }
        Ok(())
    }
}

/// Forward products of at most this many rows go to
/// [`quant_matvec::matvec`] (decoding), which reads each weight once per
/// four rows; more rows go to the tiled products.
pub const FEW_TOKENS: usize = 8;

/// Whether a product of `tokens` rows goes to the bf16 kernel's packed
/// AVX2 tiles (fed f32, nothing rounded) rather than `matrixmultiply`:
/// on CPUs without AVX-512, where `matrixmultiply`'s 8x8 FMA tile (one
/// broadcast per FMA) reaches ~81% of the FMA peak and the 4x16 tile 99%
/// (AMD EPYC Zen 1, session 10). Decoding's few rows would waste most of
/// a 4-row tile, and AVX-512 machines keep the path they were measured on.
fn packed_tiles_fit(tokens: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        tokens >= 16 && !std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = tokens;
        false
    }
}

/// What computes f32 frozen products of many rows on this CPU (`hexlora
/// info`): the packed AVX2 tiles where [`packed_tiles_fit`] sends them and
/// the CPU has those tiles, else `matrixmultiply`; `gemm` takes few rows.
pub fn f32_products_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if packed_tiles_fit(16) && crate::ops::matmul::has_avx2_fma() {
        return "avx2-fma packed tiles (16+ rows), gemm (fewer)";
    }
    "matrixmultiply (16+ rows), gemm (fewer), their own SIMD dispatch"
}

/// Precision in which the CPU holds frozen weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrozenDtype {
    /// Dense f32: exactly the effective weight (the PyTorch fixtures' setting).
    #[default]
    F32,
    /// bf16, half the memory; activations rounded to bf16 per product,
    /// sums in f32 (AMX tiles where available). Training graphs also run
    /// attention's products on bf16 operands then.
    Bf16,
}

/// The projection for answering (generation, serving, a model's embedding
/// and head tables): a quantized checkpoint's weight stays in its blocks
/// ([`StoredProjection`]), any other is held dense in f32.
pub fn inference_projection(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Arc<dyn Projection>> {
    Ok(if quant_matvec::reads_blocks(raw.dtype) {
        Arc::new(StoredProjection::from_raw(info, raw)?)
    } else {
        Arc::new(CpuProjection::from_raw(info, raw)?)
    })
}

/// The projection factory for `dtype` (see [`crate::model::decoder::ProjectionFactory`]).
pub fn factory(dtype: FrozenDtype) -> fn(ProjectionInfo, &RawTensor<'_>) -> Result<Arc<dyn Projection>> {
    match dtype {
        FrozenDtype::F32 => |info, raw| Ok(Arc::new(CpuProjection::from_raw(info, raw)?)),
        FrozenDtype::Bf16 => |info, raw| Ok(Arc::new(Bf16Projection::from_raw(info, raw)?)),
    }
}

/// A frozen projection held in bf16 on the CPU: the forward and the input
/// gradient read the one row-major copy, or, for a Q4_0/Q4_1 checkpoint on
/// a CPU with the decoder, its blocks, decoded to the same bf16 bits as the
/// kernel uses them ([`bf16_matmul::Weight`]): the same results in about a
/// third of the memory (`HEXLORA_BF16_BLOCKS=0` keeps the copy instead).
pub struct Bf16Projection {
    info: ProjectionInfo,
    weight: Bf16Weight,
    kernel: Kernel,
}

/// Where a [`Bf16Projection`]'s weight lives.
enum Bf16Weight {
    /// Rows `first_row .. first_row + out_features` of a bf16 table.
    Table { table: Arc<Bf16Matrix>, first_row: usize },
    /// Rows `first_row .. first_row + out_features` of a checkpoint
    /// tensor's Q4_0/Q4_1/Q8_0 blocks (shared: a tied head's vocabulary
    /// slices are windows of the embeddings' blocks).
    Blocks { dtype: DType, bytes: Arc<Vec<u8>>, first_row: usize },
}

impl Bf16Projection {
    /// Rounds an f32 weight `[out, in]` to bf16 (nearest even).
    pub fn from_f32(info: ProjectionInfo, weight: &[f32]) -> Result<Self> {
        if weight.len() != info.out_features * info.in_features {
            return Err(Error::Shape {
                what: info.name.clone(),
                expected: vec![info.out_features, info.in_features],
                got: vec![weight.len()],
            });
        }
        let table = Arc::new(Bf16Matrix::from_f32(weight, info.out_features, info.in_features));
        Self::window(info, table, 0)
    }

    /// A checkpoint tensor `[out, in]` as bf16: its blocks where this CPU
    /// decodes them ([`quant_bf16::decodes`]), else a bf16 copy of its
    /// dequantized values. Both compute with the same bits.
    pub fn from_raw(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Self> {
        check_raw_shape(&info, raw)?;
        if Self::holds_blocks_of(raw.dtype) {
            raw.checked_row_bytes()?;
            return Self::block_window(info, raw.dtype, Arc::new(raw.bytes.to_vec()), 0);
        }
        Self::from_f32(info, &raw.to_f32()?)
    }

    /// Whether [`Bf16Projection::from_raw`] holds a tensor of `dtype` in
    /// its blocks here (`HEXLORA_BF16_BLOCKS=0` says never).
    pub fn holds_blocks_of(dtype: DType) -> bool {
        quant_bf16::decodes(dtype) && std::env::var("HEXLORA_BF16_BLOCKS").as_deref() != Ok("0")
    }

    /// Rows `first_row .. first_row + out_features` of a shared tensor's
    /// blocks (`bytes`: whole rows of `in_features` values of `dtype`, which
    /// this CPU decodes).
    pub fn block_window(info: ProjectionInfo, dtype: DType, bytes: Arc<Vec<u8>>, first_row: usize) -> Result<Self> {
        let row_bytes = dtype.bytes_for(info.in_features).filter(|_| quant_bf16::decodes(dtype));
        let rows = row_bytes.filter(|&b| b > 0 && bytes.len().is_multiple_of(b)).map(|b| bytes.len() / b);
        if rows.is_none_or(|rows| first_row + info.out_features > rows) {
            return Err(Error::Shape {
                what: format!("{} ({dtype:?} row window from {first_row})", info.name),
                expected: vec![first_row + info.out_features, info.in_features],
                got: vec![bytes.len()],
            });
        }
        Ok(Bf16Projection { info, weight: Bf16Weight::Blocks { dtype, bytes, first_row }, kernel: Kernel::detect() })
    }

    /// Rows `first_row .. first_row + out_features` of a shared bf16 table.
    pub fn window(info: ProjectionInfo, table: Arc<Bf16Matrix>, first_row: usize) -> Result<Self> {
        if table.cols() != info.in_features || first_row + info.out_features > table.rows() {
            return Err(Error::Shape {
                what: format!("{} (bf16 row window from {first_row})", info.name),
                expected: vec![first_row + info.out_features, info.in_features],
                got: vec![table.rows(), table.cols()],
            });
        }
        Ok(Bf16Projection { info, weight: Bf16Weight::Table { table, first_row }, kernel: Kernel::detect() })
    }

    /// The same projection computed by `kernel` (tests compare kernels).
    pub fn with_kernel(mut self, kernel: Kernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// Whether the weight is held in its checkpoint blocks.
    pub fn holds_blocks(&self) -> bool {
        matches!(self.weight, Bf16Weight::Blocks { .. })
    }

    /// The weight as the kernels take it.
    fn weight(&self) -> Weight<'_> {
        let (out_f, in_f) = (self.info.out_features, self.info.in_features);
        match &self.weight {
            Bf16Weight::Table { table, first_row } => Weight::Bf16(Rows { matrix: table, first: *first_row, len: out_f }),
            Bf16Weight::Blocks { dtype, bytes, first_row } => {
                let row_bytes = dtype.bytes_for(in_f).expect("checked by block_window");
                Weight::Blocks { dtype: *dtype, bytes: &bytes[first_row * row_bytes..(first_row + out_f) * row_bytes], rows: out_f, cols: in_f }
            }
        }
    }
}

impl Projection for Bf16Projection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.info.check_io(dir, input, tokens, out)?;
        match dir {
            Direction::Forward => bf16_matmul::forward(self.kernel, out, input, tokens, self.weight()),
            Direction::InputGrad => bf16_matmul::input_grad(self.kernel, out, input, tokens, self.weight()),
        }
        Ok(())
    }

    fn scaled_rows(&self, rows: &[usize], scales: &[f32], out: &mut [f32]) -> Result<()> {
        self.info.check_rows(rows, scales, out)?;
        let in_f = self.info.in_features;
        for ((&r, &s), o) in rows.iter().zip(scales).zip(out.chunks_exact_mut(in_f)) {
            match &self.weight {
                Bf16Weight::Table { table, first_row } => {
                    o.iter_mut().zip(table.row(first_row + r)).for_each(|(o, w)| *o = s * w.to_f32());
                }
                Bf16Weight::Blocks { dtype, bytes, first_row } => {
                    let row_bytes = dtype.bytes_for(in_f).expect("checked by block_window");
                    let at = (first_row + r) * row_bytes;
                    let mut bits = vec![0u16; in_f];
                    quant_bf16::decode_rows(*dtype, &bytes[at..at + row_bytes], in_f, &mut bits);
                    o.iter_mut().zip(bits).for_each(|(o, b)| *o = s * half::bf16::from_bits(b).to_f32());
                }
            }
        }
        Ok(())
    }

    fn apply_carrying_lora(&self, p: Product<'_>, lora: LoraFactors<'_>, side: &mut [f32], db: Option<(&[f32], &mut [f32])>) -> Result<Carried> {
        let Product { dir, input, tokens, out } = p;
        self.info.check_io(dir, input, tokens, out)?;
        let (r, info) = (lora.rank, &self.info);
        if lora.a.len() != r * info.in_features || lora.b.len() != info.out_features * r || side.len() != tokens * r {
            return Err(Error::Shape {
                what: format!("LoRA factors / side output carried by {}", info.name),
                expected: vec![r * info.in_features, info.out_features * r, tokens * r],
                got: vec![lora.a.len(), lora.b.len(), side.len()],
            });
        }
        Ok(match dir {
            Direction::Forward if bf16_matmul::forward_lora(self.kernel, out, input, tokens, self.weight(), lora, side) => Carried::Branch,
            Direction::Forward => Carried::No,
            Direction::InputGrad => bf16_matmul::input_grad_lora(self.kernel, out, input, tokens, self.weight(), lora, side, db),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::ProjectionKind;

    #[test]
    fn both_directions_match_f64_and_shapes_are_checked() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Mlp, out_features: 3, in_features: 2 };
        let w = vec![1.0, 2.0, -1.0, 0.5, 3.0, -2.0]; // [3, 2]
        let p = CpuProjection::new(info.clone(), w.clone()).unwrap();
        let x = [0.5f32, -1.0, 2.0, 1.0]; // [2 tokens, 2]
        let mut y = [0.0f32; 6];
        p.apply(Direction::Forward, &x, 2, &mut y).unwrap();
        for t in 0..2 {
            for o in 0..3 {
                let want = (0..2).map(|i| x[t * 2 + i] as f64 * w[o * 2 + i] as f64).sum::<f64>();
                assert!((y[t * 3 + o] as f64 - want).abs() < 1e-6);
            }
        }
        let mut dx = [0.0f32; 4];
        p.apply(Direction::InputGrad, &y, 2, &mut dx).unwrap();
        for t in 0..2 {
            for i in 0..2 {
                let want = (0..3).map(|o| y[t * 3 + o] as f64 * w[o * 2 + i] as f64).sum::<f64>();
                assert!((dx[t * 2 + i] as f64 - want).abs() < 1e-5);
            }
        }
        assert!(p.apply(Direction::Forward, &x, 3, &mut y).is_err());
        assert!(CpuProjection::new(info.clone(), vec![0.0; 5]).is_err());
        // a window of rows 1..3 of a [4, 2] table is the weight of those rows
        let table = Arc::new(vec![9.0, 9.0, 1.0, 2.0, -1.0, 0.5, 3.0, -2.0]);
        let two = ProjectionInfo { out_features: 2, ..info.clone() };
        assert_eq!(CpuProjection::window(two.clone(), table.clone(), 1).unwrap().weight(), &table[2..6]);
        assert!(CpuProjection::window(two, table.clone(), 3).is_err());
        assert!(CpuProjection::window(info, table, 2).is_err());
    }

    /// A Q4/Q8_0 checkpoint's bf16 projection held in its blocks computes
    /// the same bits as one holding the bf16 copy of the dequantized weight:
    /// both products, the LoRA-carrying ones (both directions) and the
    /// rows; so does a row window of shared blocks.
    #[test]
    fn bf16_projection_on_q4_blocks_equals_its_bf16_copy() {
        if !quant_bf16::available() {
            return crate::test_skip::skip_allowed_in_ci("no AVX-512 F+BW: no block-held projections here", crate::test_skip::CPU_CLASS_VARIES);
        }
        let (out_f, in_f, tokens, rank) = (72, 96, 37, 4);
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0].into_iter().filter(|&d| quant_bf16::decodes(d)) {
            let bytes = quant_bf16::random_block_rows(dtype, out_f, in_f, 5);
            let raw = RawTensor { name: "blk.0.ffn_up.weight".into(), dtype, shape: vec![out_f, in_f], bytes: &bytes };
            let info = ProjectionInfo { name: "up".into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
            let blocks = Bf16Projection::from_raw(info.clone(), &raw).unwrap();
            assert!(blocks.holds_blocks());
            let copy = Bf16Projection::from_f32(info, &raw.to_f32().unwrap()).unwrap();
            let x: Vec<f32> = (0..tokens * in_f).map(|i| (i as f32 * 0.61).sin()).collect();
            let dy: Vec<f32> = (0..tokens * out_f).map(|i| (i as f32 * 0.29).cos()).collect();
            let a: Vec<f32> = (0..rank * in_f).map(|i| (i as f32 * 0.13).sin() * 0.1).collect();
            let b: Vec<f32> = (0..out_f * rank).map(|i| (i as f32 * 0.71).cos() * 0.1).collect();
            let lora = LoraFactors { a: &a, b: &b, rank, scale: 2.0 };
            let run = |p: &Bf16Projection| {
                let (mut y, mut dx, mut rows) = (vec![0.0; tokens * out_f], vec![0.0; tokens * in_f], vec![0.0; 3 * in_f]);
                p.apply(Direction::Forward, &x, tokens, &mut y).unwrap();
                p.apply(Direction::InputGrad, &dy, tokens, &mut dx).unwrap();
                p.scaled_rows(&[0, 5, out_f - 1], &[1.0, -0.5, 3.0], &mut rows).unwrap();
                let (mut yl, mut side) = (vec![0.0; tokens * out_f], vec![0.0; tokens * rank]);
                let carried = p.apply_carrying_lora(Product { dir: Direction::Forward, input: &x, tokens, out: &mut yl }, lora, &mut side, None).unwrap();
                let (mut dxl, mut dside) = (vec![0.0; tokens * in_f], vec![0.0; tokens * rank]);
                let back = p.apply_carrying_lora(Product { dir: Direction::InputGrad, input: &dy, tokens, out: &mut dxl }, lora, &mut dside, None).unwrap();
                let how = vec![(carried == Carried::Branch) as u8 as f32, (back == Carried::Branch) as u8 as f32];
                [y, dx, rows, yl, side, dxl, dside, how].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(run(&blocks), run(&copy), "{dtype:?}");
            // a row window of shared blocks (a tied head's vocabulary slice)
            let win = ProjectionInfo { name: "slice".into(), kind: ProjectionKind::Mlp, out_features: out_f - 7, in_features: in_f };
            let shared = Arc::new(Bf16Matrix::from_f32(&raw.to_f32().unwrap(), out_f, in_f));
            let (blocks, copy) = (Bf16Projection::block_window(win.clone(), dtype, Arc::new(bytes.clone()), 7).unwrap(), Bf16Projection::window(win, shared, 7).unwrap());
            let run = |p: &Bf16Projection| {
                let (mut y, mut dx) = (vec![0.0; tokens * (out_f - 7)], vec![0.0; tokens * in_f]);
                p.apply(Direction::Forward, &x, tokens, &mut y).unwrap();
                p.apply(Direction::InputGrad, &dy[..tokens * (out_f - 7)], tokens, &mut dx).unwrap();
                [y, dx].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(run(&blocks), run(&copy), "{dtype:?} window");
            let past = ProjectionInfo { name: "past".into(), kind: ProjectionKind::Mlp, out_features: 8, in_features: in_f };
            assert!(Bf16Projection::block_window(past, dtype, Arc::new(bytes), out_f - 7).is_err(), "a window past the rows");
        }
    }

    /// The bf16 projection equals f64 products of the bf16-rounded weight
    /// and input, in both directions, whole and as a row window.
    #[test]
    fn bf16_projection_matches_f64_of_rounded_operands() {
        use half::bf16;
        let (out_f, in_f, tokens) = (21, 45, 9);
        let table: Vec<f32> = (0..(out_f + 4) * in_f).map(|i| (i as f32 * 0.37).sin()).collect();
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
        let shared = Arc::new(Bf16Matrix::from_f32(&table, out_f + 4, in_f));
        let p = Bf16Projection::window(info.clone(), shared.clone(), 4).unwrap();
        let r = |v: f32| bf16::from_f32(v).to_f64();
        let w = |o: usize, i: usize| r(table[(4 + o) * in_f + i]);
        let x: Vec<f32> = (0..tokens * in_f).map(|i| (i as f32 * 0.91).cos()).collect();
        let mut y = vec![0.0; tokens * out_f];
        p.apply(Direction::Forward, &x, tokens, &mut y).unwrap();
        let mut dx = vec![0.0; tokens * in_f];
        p.apply(Direction::InputGrad, &y, tokens, &mut dx).unwrap();
        for t in 0..tokens {
            for o in 0..out_f {
                let want: f64 = (0..in_f).map(|i| r(x[t * in_f + i]) * w(o, i)).sum();
                assert!((y[t * out_f + o] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
            }
            for i in 0..in_f {
                let want: f64 = (0..out_f).map(|o| r(y[t * out_f + o]) * w(o, i)).sum();
                assert!((dx[t * in_f + i] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()));
            }
        }
        assert!(p.apply(Direction::Forward, &x, tokens + 1, &mut y).is_err());
        assert!(Bf16Projection::window(info.clone(), shared.clone(), 5).is_err(), "window past the end");
        assert!(Bf16Projection::from_f32(info, &table[..10]).is_err());
    }

    /// The stored projection dequantizes a Q8_0 checkpoint tensor to the
    /// hand-computed weight (scale times int8) and gives the dense f32
    /// projection's bits in both directions; bad bytes and shapes are
    /// errors naming the tensor.
    #[test]
    fn stored_projection_matches_the_dense_one() {
        use half::f16;
        let (out_f, in_f, tokens) = (3, 64, 5);
        let mut bytes = Vec::new();
        let mut want_w = Vec::new();
        for block in 0..out_f * in_f / 32 {
            let d = 0.25 * (block as f32 + 1.0);
            bytes.extend(f16::from_f32(d).to_le_bytes());
            for j in 0..32 {
                let q = ((block * 32 + j) as i32 * 37 % 255 - 127) as i8;
                bytes.push(q as u8);
                want_w.push(d * q as f32);
            }
        }
        let info = ProjectionInfo { name: "blk.q".into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
        let raw = RawTensor { name: "blk.q".into(), dtype: DType::Q8_0, shape: vec![out_f, in_f], bytes: &bytes };
        let stored = StoredProjection::from_raw(info.clone(), &raw).unwrap();
        assert_eq!(stored.weight().unwrap(), want_w);
        let dense = CpuProjection::from_raw(info.clone(), &raw).unwrap();
        let x: Vec<f32> = (0..tokens * in_f).map(|i| (i as f32 * 0.61).sin()).collect();
        let dy: Vec<f32> = (0..tokens * out_f).map(|i| (i as f32 * 0.29).cos()).collect();
        for (dir, input, width) in [(Direction::Forward, &x, out_f), (Direction::InputGrad, &dy, in_f)] {
            let (mut a, mut b) = (vec![f32::NAN; tokens * width], vec![f32::NAN; tokens * width]);
            stored.apply(dir, input, tokens, &mut a).unwrap();
            dense.apply(dir, input, tokens, &mut b).unwrap();
            assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{dir:?}");
        }
        let short = RawTensor { bytes: &bytes[..bytes.len() - 1], ..raw.clone() };
        let err = StoredProjection::from_raw(info.clone(), &short).err().expect("short bytes").to_string();
        assert!(err.contains("blk.q"), "{err}");
        let wide = ProjectionInfo { in_features: 32, out_features: 6, ..info };
        assert!(StoredProjection::from_raw(wide, &raw).is_err(), "shape [6, 32] for a [3, 64] tensor");
    }

    /// A projection that only has `apply`: the trait's one-hot default
    /// for `scaled_rows`.
    struct ProductsOnly<'a>(&'a dyn Projection);

    impl Projection for ProductsOnly<'_> {
        fn info(&self) -> &ProjectionInfo {
            self.0.info()
        }
        fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
            self.0.apply(dir, input, tokens, out)
        }
    }

    /// `scaled_rows` of every CPU projection is `s * W[row]` of its weight
    /// (f64 of the hand-known weight; one rounding, so exact up to 1 ulp),
    /// equal to the one-hot product the default computes; a row outside
    /// the weight or a mismatched scale count is an error, not a panic.
    #[test]
    fn scaled_rows_are_the_weight_rows_times_the_scales() {
        use half::bf16;
        let (out_f, in_f) = (40, 64);
        let info = ProjectionInfo { name: "head".into(), kind: ProjectionKind::Mlp, out_features: out_f, in_features: in_f };
        let w: Vec<f32> = (0..out_f * in_f).map(|i| (i as f32 * 0.43).sin()).collect();
        let w_bf16: Vec<f32> = w.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let mut q8 = Vec::new();
        let mut w_q8 = Vec::new();
        for block in 0..out_f * in_f / 32 {
            q8.extend(half::f16::from_f32(0.5).to_le_bytes());
            for j in 0..32 {
                let q = ((block * 32 + j) as i32 * 53 % 251 - 125) as i8;
                q8.push(q as u8);
                w_q8.push(0.5 * q as f32);
            }
        }
        let raw = RawTensor { name: "head".into(), dtype: DType::Q8_0, shape: vec![out_f, in_f], bytes: &q8 };
        let cases: [(Box<dyn Projection>, &[f32]); 3] = [
            (Box::new(CpuProjection::new(info.clone(), w.clone()).unwrap()), &w),
            (Box::new(Bf16Projection::from_f32(info.clone(), &w).unwrap()), &w_bf16),
            (Box::new(StoredProjection::from_raw(info.clone(), &raw).unwrap()), &w_q8),
        ];
        let rows = [3usize, 39, 0, 3, 17];
        let scales = [1.5f32, -0.25, 7.0, 1.0 / 3.0, 1e-3];
        for (p, weight) in &cases {
            let mut got = vec![f32::NAN; rows.len() * in_f];
            p.scaled_rows(&rows, &scales, &mut got).unwrap();
            for (i, (&r, &s)) in rows.iter().zip(&scales).enumerate() {
                for c in 0..in_f {
                    let want = s as f64 * weight[r * in_f + c] as f64;
                    assert!((got[i * in_f + c] as f64 - want).abs() <= want.abs() * f32::EPSILON as f64, "row {r} col {c}");
                }
            }
            // the default one-hot product agrees (for bf16 up to its rounding of the scales)
            let mut product = vec![f32::NAN; rows.len() * in_f];
            ProductsOnly(p.as_ref()).scaled_rows(&rows, &scales, &mut product).unwrap();
            for (g, d) in got.iter().zip(&product) {
                assert!((g - d).abs() <= g.abs() * 1e-2, "{g} vs one-hot product {d}");
            }
            assert!(p.scaled_rows(&[out_f], &[1.0], &mut got[..in_f]).is_err(), "row past the end");
            assert!(p.scaled_rows(&rows, &scales[..2], &mut got).is_err(), "one scale per row");
        }
    }
}

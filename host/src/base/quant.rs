//! Storage types of model tensors and their dequantization to f32.
//!
//! Block layouts are GGML's (what GGUF files hold), little-endian:
//!
//! | type | elems/block | bytes/block | layout |
//! |------|-------------|-------------|--------|
//! | Q8_0 | 32  | 34  | f16 d, i8 q[32]; x = d q |
//! | Q4_0 | 32  | 18  | f16 d, u8 qs[16]; x = d (nibble - 8) |
//! | Q4_1 | 32  | 20  | f16 d, f16 m, u8 qs[16]; x = d nibble + m |
//! | Q5_0 | 32  | 22  | f16 d, u32 qh, u8 qs[16]; x = d (q - 16) |
//! | Q5_1 | 32  | 24  | f16 d, f16 m, u32 qh, u8 qs[16]; x = d q + m |
//! | Q5_K | 256 | 176 | f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128] |
//! | Q4_K | 256 | 144 | f16 d, f16 dmin, u8 scales[12] (8 x 6-bit scale/min), u8 qs[128] |
//! | Q6_K | 256 | 210 | u8 ql[128], u8 qh[64], i8 scales[16], f16 d |
//!
//! In Q4_0/Q4_1 the low nibbles of a block are elements 0..16 and the high
//! nibbles 16..32. Q5_0/Q5_1 add a fifth bit: bit `j` of the little-endian
//! `qh` belongs to element `j`. The arithmetic of each decoder is gguf-py's
//! (`gguf.quants`), operation for operation, so the values are its bits. Q8_0 goes through `hexlora_proto::q8_0`, the one
//! dequantizer the DSP firmware also uses, so host and NPU see one weight.
//!
//! Quantized rows are whole blocks (GGUF requires the innermost dim to be a
//! multiple of the block length), so [`RawTensor::dequantize_rows`] can
//! dequantize any row range on its own.
use crate::base::dtype::{DType, RawTensor};
use crate::tensor::Tensor;
use crate::{Error, Result};
use half::{bf16, f16};
use hexlora_proto::q8_0;
use rayon::prelude::*;
use std::ops::Range;

impl DType {
    /// Name as GGUF / llama.cpp spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
        }
    }

    /// Elements per block (1 for plain floats).
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes that `n` elements occupy; `None` if `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        if n % self.block_len() != 0 {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }
}

impl RawTensor<'_> {
    /// Number of elements (product of the shape).
    pub fn n_elems(&self) -> usize {
        self.shape.iter().product()
    }

    /// Length of the innermost dimension (1 for a scalar).
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows when viewed as `[rows, row_len]`.
    pub fn n_rows(&self) -> usize {
        self.n_elems() / self.row_len().max(1)
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> Result<usize> {
        self.dtype.bytes_for(self.row_len()).ok_or_else(|| {
            Error::format(
                &self.name,
                format!(
                    "row length {} is not a multiple of the {} block length {}",
                    self.row_len(),
                    self.dtype.name(),
                    self.dtype.block_len()
                ),
            )
        })
    }

    /// The whole tensor as f32, row-major in the tensor's shape.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.n_elems()];
        self.dequantize_rows(0..self.n_rows(), &mut out)?;
        Ok(out)
    }

    /// The whole tensor as a dense [`Tensor`].
    pub fn to_tensor(&self) -> Result<Tensor> {
        Tensor::from_vec(&self.shape, self.to_f32()?)
    }

    /// Bytes of one stored row, after checking that the stored bytes are
    /// exactly the shape's rows of that size.
    pub fn checked_row_bytes(&self) -> Result<usize> {
        let row_bytes = self.row_bytes()?;
        let expected = row_bytes.checked_mul(self.n_rows());
        if expected != Some(self.bytes.len()) {
            return Err(Error::format(
                &self.name,
                format!(
                    "{} bytes stored for shape {:?} of type {}, expected {:?}",
                    self.bytes.len(),
                    self.shape,
                    self.dtype.name(),
                    expected
                ),
            ));
        }
        Ok(row_bytes)
    }

    /// Dequantizes rows `rows` into `out` (`rows.len() * row_len` values).
    pub fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
        let row_bytes = self.checked_row_bytes()?;
        if rows.start > rows.end || rows.end > self.n_rows() {
            return Err(Error::invalid(&self.name, format!("row range {rows:?} of {}", self.n_rows())));
        }
        if out.len() != rows.len() * self.row_len() {
            return Err(Error::Shape {
                what: format!("dequantize {}", self.name),
                expected: vec![rows.len(), self.row_len()],
                got: vec![out.len()],
            });
        }
        dequantize(self.dtype, &self.bytes[rows.start * row_bytes..rows.end * row_bytes], out);
        Ok(())
    }
}

/// Dequantizes whole blocks: `bytes` holds exactly `out.len()` elements of
/// `dtype` (callers check), in parallel over chunks of blocks.
fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    // Big enough that rayon's overhead vanishes, small enough to spread a
    // single weight matrix over all cores.
    const BLOCKS_PER_TASK: usize = 1024;
    let (bl, bb) = (dtype.block_len(), dtype.block_bytes());
    out.par_chunks_mut(bl * BLOCKS_PER_TASK)
        .zip(bytes.par_chunks(bb * BLOCKS_PER_TASK))
        .for_each(|(out, bytes)| {
            for (y, block) in out.chunks_exact_mut(bl).zip(bytes.chunks_exact(bb)) {
                dequantize_block(dtype, block, y);
            }
        });
}

fn dequantize_block(dtype: DType, b: &[u8], y: &mut [f32]) {
    // `dequantize` hands whole blocks, so the array conversions hold.
    match dtype {
        DType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => y[0] = f16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::BF16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::Q8_0 => decode_q8_0(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q4_0 => decode_q4_0(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q4_1 => decode_q4_1(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q5_0 => decode_q5_0(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q5_1 => decode_q5_1(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q4K => decode_q4_k(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q5K => decode_q5_k(b.try_into().unwrap(), y.try_into().unwrap()),
        DType::Q6K => decode_q6_k(b.try_into().unwrap(), y.try_into().unwrap()),
    }
}

// The block decoders below define each type's f32 values. The products
// straight from blocks (`crate::ops::quant_matvec`) call the K-quant ones
// and decode Q8_0/Q4_0/Q4_1 in registers by the same operations, which its
// tests check bit for bit against these.

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q8_0: `x = d q`, through `hexlora_proto::q8_0`, the dequantizer the DSP
/// firmware also uses.
#[inline(always)]
fn decode_q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    q8_0::dequantize_block_f32(&q8_0::BlockQ8_0::from_bytes(b), y);
}

/// Q4_0: `x = d (nibble - 8)`.
#[inline(always)]
fn decode_q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[2..18].iter().enumerate() {
        lo[j] = d * ((q & 0x0f) as i32 - 8) as f32;
        hi[j] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: `x = d nibble + m`.
#[inline(always)]
fn decode_q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let (lo, hi) = y.split_at_mut(16);
    for (j, &q) in b[4..20].iter().enumerate() {
        lo[j] = d * (q & 0x0f) as f32 + m;
        hi[j] = d * (q >> 4) as f32 + m;
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block from its `qh` (4 bytes) and `qs`
/// (16 bytes): element `j < 16` is the low nibble of `qs[j]`, element
/// `j + 16` its high nibble, each with bit `j` (`j + 16`) of `qh` on top.
#[inline(always)]
fn q5_values(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0x0f) | (((qh >> j) & 1) as u8) << 4;
        q[j + 16] = (b >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// Q5_0: `x = d (q - 16)`.
#[inline(always)]
fn decode_q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, q) in y.iter_mut().zip(q5_values(&b[2..6], &b[6..22])) {
        *y = d * (q as i32 - 16) as f32;
    }
}

/// Q5_1: `x = d q + m`.
#[inline(always)]
fn decode_q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (y, q) in y.iter_mut().zip(q5_values(&b[4..8], &b[8..24])) {
        *y = d * q as f32 + m;
    }
}

/// Scale and min number `j` (0..8) of a K-quant block, packed as 6 bits each
/// in 12 bytes: the first four in the low 6 bits of bytes 0..4 / 4..8, the
/// last four split between bytes 8..12 and the top 2 bits of bytes 0..8.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    };
    (sc as f32, m as f32)
}

/// Q4_K: eight sub-blocks of 32, `x = d sc nibble - dmin m`.
#[inline(always)]
pub(crate) fn decode_q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    // Four groups of 64 elements; each uses 32 bytes: low nibbles give the
    // first 32 elements (sub-block 2g), high nibbles the next 32 (2g + 1).
    for g in 0..4 {
        let q = &qs[32 * g..32 * g + 32];
        let (s1, m1) = scale_min_k4(2 * g, scales);
        let (s2, m2) = scale_min_k4(2 * g + 1, scales);
        let y = &mut y[64 * g..64 * g + 64];
        for l in 0..32 {
            y[l] = d * s1 * (q[l] & 0x0f) as f32 - dmin * m1;
            y[l + 32] = d * s2 * (q[l] >> 4) as f32 - dmin * m2;
        }
    }
}

/// Q5_K: eight sub-blocks of 32, `x = (d sc) q - dmin m` with 5-bit `q`:
/// Q4_K's nibbles plus, for sub-block `s`, bit `s` of `qh[l]` on element `l`.
#[inline(always)]
pub(crate) fn decode_q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for s in 0..8 {
        let (sc, m) = scale_min_k4(s, scales);
        // gguf-py multiplies the scales first: (d sc) q - (dmin m).
        let (ds, dm) = (d * sc, dmin * m);
        // Sub-blocks 2g and 2g + 1 share 32 bytes of qs: low then high nibbles.
        let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for l in 0..32 {
            let v = ((q[l] >> shift) & 0x0f) | ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = ds * v as f32 - dm;
        }
    }
}

/// Q6_K: sixteen sub-blocks of 16, `x = d sc (q - 32)` with 6-bit `q`.
#[inline(always)]
pub(crate) fn decode_q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    // Two halves of 128 elements, each with 64 bytes of low nibbles, 32 bytes
    // of high 2-bit pairs and 8 scales (one per 16 elements).
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let y = &mut y[128 * h..128 * h + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |k: usize| d * (sc[is + k] as i8) as f32;
            y[l] = s(0) * q1 as f32;
            y[l + 32] = s(2) * q2 as f32;
            y[l + 64] = s(4) * q3 as f32;
            y[l + 96] = s(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(dtype: DType, shape: &[usize], bytes: &'a [u8]) -> RawTensor<'a> {
        RawTensor { name: "t".into(), dtype, shape: shape.to_vec(), bytes }
    }

    #[test]
    fn plain_floats() {
        let v = [1.5f32, -2.0, 0.0, 3.25];
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(raw(DType::F32, &[2, 2], &b).to_f32().unwrap(), v);
        let b: Vec<u8> = v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect();
        assert_eq!(raw(DType::F16, &[4], &b).to_f32().unwrap(), v);
        let b: Vec<u8> = v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect();
        assert_eq!(raw(DType::BF16, &[4], &b).to_f32().unwrap(), v);
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5; byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let y = raw(DType::Q4_0, &[32], &b).to_f32().unwrap();
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
            assert_eq!(y[16 + j], 0.5 * (7.0 - j as f32));
        }
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let b = [0u8; 34];
        let err = raw(DType::Q8_0, &[2, 32], &b).to_f32().unwrap_err().to_string();
        assert!(err.contains("34 bytes stored") && err.contains("Q8_0"), "{err}");
        let err = raw(DType::Q4_0, &[31], &b[..18]).to_f32().unwrap_err().to_string();
        assert!(err.contains("not a multiple"), "{err}");
        let mut out = [0.0; 32];
        let t = raw(DType::Q8_0, &[1, 32], &b);
        assert!(t.dequantize_rows(0..2, &mut out).is_err());
    }

    #[test]
    fn row_range_matches_whole() {
        let b: Vec<u8> = (0..3 * 144).map(|i| (i * 37 % 251) as u8).collect();
        // Keep the f16 scales finite: byte 1 of d/dmin < 0x7c.
        let mut b = b;
        for blk in 0..3 {
            b[blk * 144 + 1] = 0x3c;
            b[blk * 144 + 3] = 0x38;
        }
        let t = raw(DType::Q4K, &[3, 256], &b);
        let whole = t.to_f32().unwrap();
        let mut mid = vec![0.0; 256];
        t.dequantize_rows(1..2, &mut mid).unwrap();
        assert_eq!(&whole[256..512], &mid[..]);
    }
}

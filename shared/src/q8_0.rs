//! GGUF/ggml `Q8_0`: blocks of 32 weights sharing one f16 scale.
//!
//! Byte layout of one block (34 bytes, little-endian, no padding), identical
//! to ggml's `block_q8_0`: `d: f16` then `qs: [i8; 32]`; weight `j` is
//! `qs[j] * d`.
//!
//! [`dequantize_block`] is THE dequantizer: the forward and the input-gradient
//! kernels both call it (and nothing else) to turn a resident Q8_0 weight into
//! the FP16 operand the tile engine multiplies, so both directions see a
//! bit-identical effective weight. It computes `qs[j] * d` exactly in f32 (8 +
//! 11 significant bits fit in 24) and rounds once to f16.
use crate::f16::{f16, to_f16};

/// Weights per block.
pub const QK8_0: usize = 32;

/// Bytes per block: the f16 scale plus 32 i8.
pub const BLOCK_BYTES: usize = 2 + QK8_0;

/// One Q8_0 block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quantized weights.
    pub qs: [i8; QK8_0],
}

/// Why bytes or a row could not be read as Q8_0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q8Error {
    /// A byte count that is not a whole number of 34-byte blocks, or does not
    /// match the expected number of blocks.
    BadByteLength {
        /// Bytes given.
        bytes: usize,
        /// Bytes expected (a multiple of [`BLOCK_BYTES`]; 0 if any multiple would do).
        expected: usize,
    },
    /// A row length that is not a multiple of 32 elements.
    RowNotMultipleOf32 {
        /// Elements in the row.
        elements: usize,
    },
    /// A block whose scale is NaN or infinite (would poison the product).
    NonFiniteScale {
        /// Index of the block.
        block: usize,
    },
    /// An input value that is NaN or infinite (cannot be quantized).
    NonFiniteValue {
        /// Index of the element.
        index: usize,
    },
}

impl core::fmt::Display for Q8Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Q8Error::BadByteLength { bytes, expected } => {
                write!(f, "Q8_0 data of {bytes} bytes: expected {expected} (blocks of {BLOCK_BYTES})")
            }
            Q8Error::RowNotMultipleOf32 { elements } => {
                write!(f, "Q8_0 row of {elements} elements is not a multiple of {QK8_0}")
            }
            Q8Error::NonFiniteScale { block } => write!(f, "Q8_0 block {block} has a non-finite scale"),
            Q8Error::NonFiniteValue { index } => write!(f, "value {index} is NaN or infinite"),
        }
    }
}

impl BlockQ8_0 {
    /// All-zero block.
    pub const ZERO: BlockQ8_0 = BlockQ8_0 { d: f16::ZERO, qs: [0; QK8_0] };

    /// Reads one block from its 34 GGUF bytes.
    pub fn from_bytes(b: &[u8; BLOCK_BYTES]) -> BlockQ8_0 {
        let mut qs = [0i8; QK8_0];
        for (q, &byte) in qs.iter_mut().zip(&b[2..]) {
            *q = byte as i8;
        }
        BlockQ8_0 { d: f16::from_le_bytes([b[0], b[1]]), qs }
    }

    /// The block's 34 GGUF bytes.
    pub fn to_bytes(&self) -> [u8; BLOCK_BYTES] {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&self.d.to_le_bytes());
        for (byte, &q) in b[2..].iter_mut().zip(&self.qs) {
            *byte = q as u8;
        }
        b
    }
}

/// Number of blocks in `bytes`, or an error if it is not a whole number.
pub fn block_count(bytes: &[u8]) -> Result<usize, Q8Error> {
    if bytes.len() % BLOCK_BYTES != 0 {
        return Err(Q8Error::BadByteLength { bytes: bytes.len(), expected: 0 });
    }
    Ok(bytes.len() / BLOCK_BYTES)
}

/// Block `i` of a byte slice already checked by [`block_count`].
///
/// # Panics
/// If block `i` lies outside `bytes`.
pub fn block_at(bytes: &[u8], i: usize) -> BlockQ8_0 {
    let b: &[u8; BLOCK_BYTES] = bytes[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES].try_into().unwrap();
    BlockQ8_0::from_bytes(b)
}

/// Parses exactly `out.len()` blocks from `bytes`, rejecting a wrong length or
/// a non-finite scale.
pub fn parse_blocks(bytes: &[u8], out: &mut [BlockQ8_0]) -> Result<(), Q8Error> {
    if bytes.len() != out.len() * BLOCK_BYTES {
        return Err(Q8Error::BadByteLength { bytes: bytes.len(), expected: out.len() * BLOCK_BYTES });
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = block_at(bytes, i);
        if !o.d.is_finite() {
            return Err(Q8Error::NonFiniteScale { block: i });
        }
    }
    Ok(())
}

/// Checks that every block scale in `bytes` is finite.
pub fn check_scales(bytes: &[u8]) -> Result<(), Q8Error> {
    let n = block_count(bytes)?;
    for i in 0..n {
        let d = f16::from_le_bytes([bytes[i * BLOCK_BYTES], bytes[i * BLOCK_BYTES + 1]]);
        if !d.is_finite() {
            return Err(Q8Error::NonFiniteScale { block: i });
        }
    }
    Ok(())
}

/// C `roundf`: nearest integer, halfway cases away from zero. `x` must be
/// small (|x| < 2^22), which holds for `v / d` within a block.
fn round_half_away(x: f32) -> f32 {
    let t = x as i32 as f32; // truncates toward zero
    let frac = x - t; // exact: x and t share the exponent range
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

/// Quantizes one block exactly like ggml's `quantize_row_q8_0_ref`:
/// `d = amax / 127`, `q = roundf(v * (1/d))`, `d` stored as f16.
fn quantize_block(x: &[f32; QK8_0]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_0];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_half_away(v * id) as i8;
    }
    BlockQ8_0 { d: to_f16(d), qs }
}

/// Quantizes a row of `32 * out.len()` finite values (ggml reference rounding).
pub fn quantize_row(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), Q8Error> {
    if x.len() % QK8_0 != 0 {
        return Err(Q8Error::RowNotMultipleOf32 { elements: x.len() });
    }
    if x.len() != out.len() * QK8_0 {
        return Err(Q8Error::BadByteLength { bytes: x.len() / QK8_0 * BLOCK_BYTES, expected: out.len() * BLOCK_BYTES });
    }
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(Q8Error::NonFiniteValue { index });
    }
    for (o, chunk) in out.iter_mut().zip(x.chunks_exact(QK8_0)) {
        *o = quantize_block(chunk.try_into().unwrap());
    }
    Ok(())
}

/// The exact f32 value of each weight, `qs[j] * d` (what ggml's
/// `dequantize_row_q8_0` yields).
pub fn dequantize_block_f32(b: &BlockQ8_0, out: &mut [f32; QK8_0]) {
    let d = b.d.to_f32();
    for (o, &q) in out.iter_mut().zip(&b.qs) {
        *o = q as f32 * d;
    }
}

/// THE dequantizer: the FP16 effective weight the kernels multiply, in both
/// directions. Each value is [`dequantize_block_f32`]'s exact product rounded
/// once to the nearest f16.
pub fn dequantize_block(b: &BlockQ8_0, out: &mut [f16; QK8_0]) {
    let mut exact = [0.0f32; QK8_0];
    dequantize_block_f32(b, &mut exact);
    for (o, &v) in out.iter_mut().zip(&exact) {
        *o = to_f16(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ggml_bytes() -> [u8; BLOCK_BYTES] {
        // d = 0.5 (f16 0x3800), qs = 0, 1, -1, 127, -128, 2, 3, ...
        let mut b = [0u8; BLOCK_BYTES];
        b[0] = 0x00;
        b[1] = 0x38;
        let qs: [i8; 5] = [0, 1, -1, 127, -128];
        for (i, q) in qs.iter().enumerate() {
            b[2 + i] = *q as u8;
        }
        for i in 5..QK8_0 {
            b[2 + i] = (i as i8 - 3) as u8;
        }
        b
    }

    #[test]
    fn block_bytes_round_trip_and_known_values() {
        let b = BlockQ8_0::from_bytes(&ggml_bytes());
        assert_eq!(b.to_bytes(), ggml_bytes());
        let mut v = [f16::ZERO; QK8_0];
        dequantize_block(&b, &mut v);
        assert_eq!(v[0].to_f32(), 0.0);
        assert_eq!(v[1].to_f32(), 0.5);
        assert_eq!(v[2].to_f32(), -0.5);
        assert_eq!(v[3].to_f32(), 63.5);
        assert_eq!(v[4].to_f32(), -64.0);
        assert_eq!(v[31].to_f32(), 14.0);
    }

    #[test]
    fn f16_dequantizer_is_the_exact_product_rounded_once() {
        // d = 0.0999755859375 (f16 0x2e66): 127 * d needs 18 bits, so the f16
        // weight is a rounding of the exact f32 product.
        let mut b = BlockQ8_0::ZERO;
        b.d = f16::from_bits(0x2e66);
        b.qs[0] = 127;
        b.qs[1] = -77;
        let mut exact = [0.0; QK8_0];
        dequantize_block_f32(&b, &mut exact);
        let mut v = [f16::ZERO; QK8_0];
        dequantize_block(&b, &mut v);
        let d = f64::from(b.d.to_f32());
        assert_eq!(exact[0] as f64, 127.0 * d);
        assert_eq!(exact[1] as f64, -77.0 * d);
        assert_eq!(v[0], f16::from_f64(127.0 * d));
        assert_eq!(v[1], f16::from_f64(-77.0 * d));
    }

    #[test]
    fn quantize_matches_ggml_reference_rules() {
        let mut x = [0.0f32; QK8_0];
        x[0] = 1.27;
        x[2] = 0.004;
        let mut out = [BlockQ8_0::ZERO];
        quantize_row(&x, &mut out).unwrap();
        let d = 1.27f32 / 127.0;
        assert_eq!(out[0].d, f16::from_f32(d));
        assert_eq!(out[0].qs[0], 127);
        assert_eq!(out[0].qs[2], 0);
        // All-zero block: d = 0, all q = 0.
        quantize_row(&[0.0; QK8_0], &mut out).unwrap();
        assert_eq!(out[0], BlockQ8_0::ZERO);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// gguf-py's quantizer (bit-exact with ggml's reference) on typical,
    /// large, zero, tie and tiny blocks: see fixtures/gen_q8_0.py.
    #[test]
    fn quantize_matches_gguf_py_fixture() {
        let text = include_str!("../fixtures/q8_0_ggml.txt");
        let mut lines = text.lines();
        let x: Vec<f32> =
            hex(lines.next().unwrap()).chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let expected = hex(lines.next().unwrap());
        let mut out = vec![BlockQ8_0::ZERO; x.len() / QK8_0];
        quantize_row(&x, &mut out).unwrap();
        let got: Vec<u8> = out.iter().flat_map(|b| b.to_bytes()).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn bad_lengths_and_values_are_errors() {
        let mut out = [BlockQ8_0::ZERO; 2];
        assert_eq!(
            parse_blocks(&[0u8; 33], &mut out[..1]),
            Err(Q8Error::BadByteLength { bytes: 33, expected: 34 })
        );
        assert_eq!(block_count(&[0u8; 35]), Err(Q8Error::BadByteLength { bytes: 35, expected: 0 }));
        assert_eq!(quantize_row(&[0.0; 31], &mut out[..1]), Err(Q8Error::RowNotMultipleOf32 { elements: 31 }));
        let mut x = [0.0f32; QK8_0];
        x[7] = f32::NAN;
        assert_eq!(quantize_row(&x, &mut out[..1]), Err(Q8Error::NonFiniteValue { index: 7 }));
        let mut bytes = [0u8; 2 * BLOCK_BYTES];
        bytes[BLOCK_BYTES + 1] = 0x7c; // second block's scale = +inf
        assert_eq!(parse_blocks(&bytes, &mut out), Err(Q8Error::NonFiniteScale { block: 1 }));
        assert_eq!(check_scales(&bytes), Err(Q8Error::NonFiniteScale { block: 1 }));
    }
}

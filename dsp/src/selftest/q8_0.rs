//! Self-tests of the shared Q8_0 dequantizer against hand-computed values.
use crate::check_eq;
use hexlora_proto::f16::f16;
use hexlora_proto::q8_0::{block_at, dequantize_block, dequantize_block_f32, BLOCK_BYTES, QK8_0};

use super::TestResult;

/// A GGUF block with scale 0.5 (f16 bits 0x3800, stored little-endian) and
/// quants -128, -1, 0, 1, 127, then j - 16 for the rest: every weight is
/// `q * 0.5`, exact in f16.
fn known_block_bytes() -> [u8; BLOCK_BYTES] {
    let mut b = [0u8; BLOCK_BYTES];
    b[0] = 0x00;
    b[1] = 0x38;
    let head: [i8; 5] = [-128, -1, 0, 1, 127];
    for j in 0..QK8_0 {
        let q = if j < head.len() { head[j] } else { j as i8 - 16 };
        b[2 + j] = q as u8;
    }
    b
}

fn dequantizes_known_block() -> TestResult {
    let block = block_at(&known_block_bytes(), 0);
    let mut out = [f16::ZERO; QK8_0];
    dequantize_block(&block, &mut out);
    check_eq!(out[0].to_f32(), -64.0);
    check_eq!(out[1].to_f32(), -0.5);
    check_eq!(out[2].to_f32(), 0.0);
    check_eq!(out[3].to_f32(), 0.5);
    check_eq!(out[4].to_f32(), 63.5);
    check_eq!(out[31].to_f32(), 7.5);
    let mut wide = [0f32; QK8_0];
    dequantize_block_f32(&block, &mut wide);
    for j in 5..QK8_0 {
        check_eq!(wide[j], (j as f32 - 16.0) * 0.5);
    }
    Ok(())
}

/// 0.1 is not representable: f16(0.1) = 0x2E66 = 0.0999755859375, and
/// 127 * that = 12.696899... rounds to the f16 12.6953125 (0x4A59).
fn rounds_once_to_f16() -> TestResult {
    let mut bytes = [0u8; BLOCK_BYTES];
    bytes[..2].copy_from_slice(&0x2E66u16.to_le_bytes());
    bytes[2] = 127;
    let mut out = [f16::ZERO; QK8_0];
    dequantize_block(&block_at(&bytes, 0), &mut out);
    check_eq!(out[0].to_bits(), 0x4A59);
    Ok(())
}

crate::selftests!(dequantizes_known_block, rounds_once_to_f16);

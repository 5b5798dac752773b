//! f16 helpers over crate `half`: the conversions both sides must agree on.
//!
//! Every f32 -> f16 conversion in hexlora goes through [`to_f16`], which is
//! IEEE round-to-nearest-even (what `half` and the Hexagon converters do), so
//! the host and the firmware produce the same bits for the same input.
pub use half::f16;

/// Largest finite f16 (65504).
pub const F16_MAX: f32 = 65504.0;

/// Smallest positive subnormal f16 (2^-24).
pub const F16_MIN_SUBNORMAL: f32 = 5.960_464_5e-8;

/// Bytes of one f16.
pub const F16_BYTES: usize = 2;

/// Rounds `x` to the nearest f16 (ties to even); overflow gives infinity.
#[inline]
pub fn to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Widens an f16 exactly.
#[inline]
pub fn to_f32(x: f16) -> f32 {
    x.to_f32()
}

/// Reads a little-endian f16 from two bytes.
#[inline]
pub fn from_le_bytes(b: [u8; 2]) -> f16 {
    f16::from_le_bytes(b)
}

/// Converts `src` into `dst` element by element.
///
/// # Panics
/// If the lengths differ (a programming error, not a data error).
pub fn slice_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "slice_to_f16 length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = to_f16(*s);
    }
}

/// Widens `src` into `dst` element by element.
///
/// # Panics
/// If the lengths differ (a programming error, not a data error).
pub fn slice_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "slice_to_f32 length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Decodes little-endian f16 bytes into `dst`; `None` if `bytes.len()` is not
/// exactly `2 * dst.len()`.
pub fn decode_le(bytes: &[u8], dst: &mut [f16]) -> Option<()> {
    if bytes.len() != dst.len() * F16_BYTES {
        return None;
    }
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = f16::from_le_bytes([b[0], b[1]]);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bit_patterns() {
        assert_eq!(to_f16(1.0).to_bits(), 0x3c00);
        assert_eq!(to_f16(-2.0).to_bits(), 0xc000);
        assert_eq!(to_f16(F16_MAX).to_bits(), 0x7bff);
        assert_eq!(to_f16(F16_MIN_SUBNORMAL).to_bits(), 0x0001);
        // 65520 is the midpoint to the next (infinite) step: rounds to inf.
        assert!(to_f16(65520.0).is_infinite());
        // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
        assert_eq!(to_f16(1.0 + 1.0 / 2048.0).to_bits(), 0x3c00);
    }

    #[test]
    fn decode_checks_length() {
        let mut out = [f16::ZERO; 2];
        assert!(decode_le(&[0, 0x3c, 0], &mut out).is_none());
        decode_le(&[0, 0x3c, 0, 0xc0], &mut out).unwrap();
        assert_eq!(out[0].to_f32(), 1.0);
        assert_eq!(out[1].to_f32(), -2.0);
    }
}

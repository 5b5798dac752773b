//! Per-row power-of-two rescaling: the policy both sides agree on.
//!
//! Activations and gradients stay floating point; before the FP16 product
//! each row is multiplied by `2^k` ([`first_exponent`]): its max |value|
//! lands in `[2^(TARGET_EXP-1), 2^TARGET_EXP)`, unless the row's bound on
//! its partial sums, `|x|_1 * max|W|`, says that would reach 2^[`BOUND_EXP`];
//! then `k` is lowered until the bound stays under it. Every partial sum of
//! a product is at most `sum |x_i| |w_i| <= |x|_1 max|W|` (forward and input
//! gradient alike), so with the bound a first pass overflows only if the
//! weights changed after their maximum was taken.
//!
//! Powers of two make the scaling and the unscaling exact (barring f32
//! underflow of the final result); a lower `k` costs no precision while the
//! scaled values stay in FP16's normal range. If any partial sum of a row's
//! product is non-finite or reaches [`PARTIAL_SUM_LIMIT`], only that row is
//! re-sent with a further `2^RETRY_STEP_EXP`, at most [`MAX_RETRIES`] times;
//! after that the request fails and the host falls back.

/// Exponent of the target row maximum: rows are scaled to just below 2^12.
pub const TARGET_EXP: i32 = 12;

/// A partial sum whose magnitude reaches this (or is non-finite) triggers a
/// retry of its row. Kept under the f16 maximum 65504 with headroom.
pub const PARTIAL_SUM_LIMIT: f32 = 60000.0;

/// Each retry scales the row by a further `2^RETRY_STEP_EXP`.
pub const RETRY_STEP_EXP: i32 = -8;

/// A row is re-sent at most this many times.
pub const MAX_RETRIES: u32 = 3;

/// `floor(log2(x))` for finite `x > 0` (subnormals included), from the bits.
fn floor_log2(x: f32) -> i32 {
    let bits = x.to_bits() & 0x7fff_ffff;
    let biased = (bits >> 23) as i32;
    if biased != 0 {
        return biased - 127;
    }
    // Subnormal: value = mantissa * 2^-149.
    let top = 31 - bits.leading_zeros() as i32;
    top - 149
}

/// The exponent `k` for a row whose max |value| is `max_abs`, so that
/// `max_abs * 2^k` lies in `[2^(TARGET_EXP-1), 2^TARGET_EXP)`.
///
/// Returns 0 for an all-zero row (or a non-finite `max_abs`, which callers
/// must reject before getting here).
pub fn row_exponent(max_abs: f32) -> i32 {
    if !(max_abs.is_finite() && max_abs > 0.0) {
        return 0;
    }
    TARGET_EXP - 1 - floor_log2(max_abs)
}

/// The bound a row's partial sums keep under at its first scale: `2^15`,
/// with room to [`PARTIAL_SUM_LIMIT`] for the rounding of the FP16
/// conversion and of the f32 sums.
pub const BOUND_EXP: i32 = 15;

/// The first exponent of a row: [`row_exponent`]`(max_abs)`, lowered so that
/// `l1 * w_max * 2^k < 2^BOUND_EXP`, where `l1` is the row's sum of |x| (or
/// any upper bound on it) and `w_max` an upper bound on the weights' |w|.
/// Non-finite or zero `l1`/`w_max` leave the max-based exponent.
pub fn first_exponent(max_abs: f32, l1: f32, w_max: f32) -> i32 {
    let k = row_exponent(max_abs);
    let positive = |v: f32| v.is_finite() && v > 0.0;
    if !(positive(l1) && positive(w_max)) {
        return k;
    }
    // l1 < 2^(a+1) and w_max < 2^(b+1), so l1 * w_max * 2^k < 2^(a+b+2+k).
    k.min(BOUND_EXP - 2 - floor_log2(l1) - floor_log2(w_max))
}

/// The exponent after `retries` retries of a row whose first exponent was `k`.
pub fn retry_exponent(k: i32, retries: u32) -> i32 {
    k + RETRY_STEP_EXP * retries as i32
}

/// Whether a partial sum forces its row to be re-sent.
#[inline]
pub fn needs_retry(partial: f32) -> bool {
    !partial.is_finite() || partial.abs() >= PARTIAL_SUM_LIMIT
}

/// `2^e` as an f32 for `e` in `[-126, 127]` (normal range, exact).
#[inline]
fn pow2_normal(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `x * 2^k`, exact whenever the result is a normal f32 or zero.
///
/// Applied in steps so that `2^k` itself never leaves the normal range (a
/// subnormal row may need `k` up to ~160).
pub fn scale_pow2(mut x: f32, mut k: i32) -> f32 {
    while k > 127 {
        x *= pow2_normal(127);
        k -= 127;
    }
    while k < -126 {
        x *= pow2_normal(-126);
        k += 126;
    }
    x * pow2_normal(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponent_lands_row_max_in_target_octave() {
        for &m in &[1.0f32, 0.75, 3.0e-3, 4095.0, 4096.0, 65504.0, 1.0e30, 1.0e-40, f32::MIN_POSITIVE] {
            let k = row_exponent(m);
            let scaled = scale_pow2(m, k);
            assert!((2048.0..4096.0).contains(&scaled), "max {m} k {k} -> {scaled}");
        }
    }

    #[test]
    fn zero_and_non_finite_rows_get_exponent_zero() {
        assert_eq!(row_exponent(0.0), 0);
        assert_eq!(row_exponent(f32::NAN), 0);
        assert_eq!(row_exponent(f32::INFINITY), 0);
    }

    #[test]
    fn scaling_is_exact_both_ways() {
        let x = 1.234_567_9e-41f32; // subnormal
        let k = row_exponent(x);
        assert!(k > 127);
        assert_eq!(scale_pow2(scale_pow2(x, k), -k), x);
        assert_eq!(scale_pow2(3.0, -2), 0.75);
    }

    /// The bound holds for the f64 sum of |x| |w| at the chosen exponent,
    /// and a row far from the bound keeps its max-based exponent.
    #[test]
    fn first_exponent_keeps_the_bound_under_2_pow_15() {
        let row: Vec<f32> = (0..1536).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let max = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let l1: f32 = row.iter().map(|x| x.abs()).sum();
        for w_max in [1.0e-6f32, 0.02, 1.0, 7.5, 300.0] {
            let k = first_exponent(max, l1, w_max);
            let bound: f64 = row.iter().map(|&x| (scale_pow2(x, k) as f64).abs() * w_max as f64).sum();
            assert!(bound < 32768.0, "w_max {w_max}: k {k} leaves bound {bound}");
            assert!(k <= row_exponent(max));
        }
        assert_eq!(first_exponent(max, l1, 1.0e-6), row_exponent(max));
        assert_eq!(first_exponent(max, f32::INFINITY, 1.0), row_exponent(max));
        assert_eq!(first_exponent(max, l1, 0.0), row_exponent(max));
    }

    #[test]
    fn retry_policy() {
        assert_eq!(retry_exponent(5, 3), -19);
        assert!(needs_retry(60000.0));
        assert!(needs_retry(-60000.0));
        assert!(needs_retry(f32::NAN));
        assert!(!needs_retry(59999.996));
    }
}

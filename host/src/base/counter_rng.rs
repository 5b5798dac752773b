//! Counter-based random numbers: value `i` of stream `seed` is a pure
//! function of `(seed, i)`. Dropout masks and MeZO perturbations are
//! regenerated from their seed instead of being stored, any element can be
//! computed on any thread, and the whole RNG state of a run is one `u64`,
//! which makes commits and resume trivially bit-exact.

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for element `i` of stream `seed`.
pub fn bits(seed: u64, i: u64) -> u64 {
    mix(mix(seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// Uniform in `[0, 1)` with 24 bits (every value exactly representable).
pub fn uniform(seed: u64, i: u64) -> f32 {
    (bits(seed, i) >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Standard normal (Box-Muller on two 32-bit uniforms of one draw).
pub fn normal(seed: u64, i: u64) -> f32 {
    let b = bits(seed, i);
    let u1 = ((b >> 32) as f64 + 1.0) / 4_294_967_297.0; // in (0, 1): log is finite
    let u2 = (b & 0xffff_ffff) as f64 / 4_294_967_296.0;
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// A derived seed for a sub-stream (`seed` of step `a`, module `b`, ...).
pub fn derive(seed: u64, tag: u64) -> u64 {
    mix(seed.wrapping_add(mix(tag)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_and_normal_have_the_right_moments() {
        let n = 200_000u64;
        let u: Vec<f64> = (0..n).map(|i| uniform(7, i) as f64).collect();
        let mean = u.iter().sum::<f64>() / n as f64;
        let var = u.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005 && (var - 1.0 / 12.0).abs() < 0.002, "{mean} {var}");
        let z: Vec<f64> = (0..n).map(|i| normal(7, i) as f64).collect();
        let mean = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let kurt = z.iter().map(|x| (x - mean).powi(4)).sum::<f64>() / n as f64 / var.powi(2);
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02 && (kurt - 3.0).abs() < 0.1, "{mean} {var} {kurt}");
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        assert_eq!(bits(1, 5), bits(1, 5));
        assert_ne!(bits(1, 5), bits(2, 5));
        assert_ne!(derive(1, 0), derive(1, 1));
    }
}

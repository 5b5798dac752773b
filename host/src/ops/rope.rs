//! Rotary position embeddings, Hugging Face ("rotate_half") layout: within
//! the first `rot_dim` features of each head, feature `i` pairs with
//! `i + rot_dim/2` and the pair is rotated by `pos * inv_freq[i]`. Features
//! past `rot_dim` pass through (partial rotary, Qwen3.5 rotates a quarter).
//!
//! RoPE is a rotation, so its backward is the same function with the angle
//! negated ([`rope_apply`] with `inverse = true`); nothing is saved.
use rayon::prelude::*;
use crate::ops::activation::simd_fn;
use std::sync::{Arc, Mutex};

/// How the rotary frequencies are derived (`rope_parameters.rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain `theta^(-2i/d)`.
    Default,
    /// Llama 3.1+ frequency-dependent scaling.
    Llama3 {
        /// Overall context extension factor.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// Inverse frequencies `[rot_dim / 2]` for `theta` and `scaling`, as
/// transformers' `ROPE_INIT_FUNCTIONS` compute them.
pub fn rope_inv_freq(rot_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    (0..rot_dim / 2)
        .map(|i| {
            let base = 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64);
            match *scaling {
                RopeScaling::Default => base as f32,
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                    llama3_scale(base, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) as f32
                }
            }
        })
        .collect()
}

/// Long wavelengths slowed by `factor`, short ones kept, a linear blend
/// (in 1/wavelength) in between.
fn llama3_scale(inv_freq: f64, factor: f64, low: f64, high: f64, original: f64) -> f64 {
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    let low_freq_wavelen = original / low;
    let high_freq_wavelen = original / high;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / factor
    } else {
        let smooth = (original / wavelen - low) / (high - low);
        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    }
}

/// `cos` and `sin` of `pos * inv_freq[i]` for positions `0..len`, each
/// `[len, inv_freq.len()]`, for one set of frequencies.
struct AngleTable {
    inv_freq: Vec<f32>,
    len: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl AngleTable {
    fn new(inv_freq: &[f32], len: usize) -> AngleTable {
        let (mut cos, mut sin) = (Vec::with_capacity(len * inv_freq.len()), Vec::with_capacity(len * inv_freq.len()));
        for pos in 0..len {
            for &f in inv_freq {
                // f32 angle as transformers computes it (`pos.float() * inv_freq`).
                let angle = pos as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        AngleTable { inv_freq: inv_freq.to_vec(), len, cos, sin }
    }
}

/// Positions past this are rotated from freshly computed angles instead of
/// the shared table (which would grow too large).
const TABLE_MAX_LEN: usize = 1 << 16;

/// Frequency sets whose tables are kept at once: Gemma 3 alternates two
/// (local and global layers) in every forward.
const TABLES_KEPT: usize = 4;

/// The angle table for `inv_freq` covering positions `0..=max_pos`. Every
/// layer's q and k (forward and backward) rotate by the same angles, so a
/// few tables, one per set of frequencies, each kept until more positions
/// are needed, save a sin and a cos per (token, frequency, call). Keyed by
/// the frequencies' values, never by pointer; the least recently built
/// table makes room for a new set.
fn angle_table(inv_freq: &[f32], max_pos: usize) -> Arc<AngleTable> {
    static CACHE: Mutex<Vec<Arc<AngleTable>>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = cache.iter().find(|t| t.len > max_pos && t.inv_freq == inv_freq) {
        return t.clone();
    }
    let t = Arc::new(AngleTable::new(inv_freq, (max_pos + 1).next_power_of_two().max(256)));
    cache.retain(|old| old.inv_freq != inv_freq);
    if cache.len() == TABLES_KEPT {
        cache.remove(0);
    }
    cache.push(t.clone());
    t
}

/// Rotates `x: [tokens, heads, head_dim]` in place; token `t` sits at
/// position `positions[t]`. `inv_freq: [rot_dim / 2]`. With `inverse` the
/// rotation is undone (the backward).
pub fn rope_apply(x: &mut [f32], positions: &[usize], heads: usize, head_dim: usize, inv_freq: &[f32], inverse: bool) {
    let half = inv_freq.len();
    assert!(2 * half <= head_dim, "rope_apply: rotary dim {} > head_dim {head_dim}", 2 * half);
    assert_eq!(x.len(), positions.len() * heads * head_dim, "rope_apply length");
    if half == 0 || positions.is_empty() {
        return;
    }
    let max_pos = positions.iter().copied().max().unwrap_or(0);
    if max_pos >= TABLE_MAX_LEN {
        for (row, &pos) in x.chunks_exact_mut(heads * head_dim).zip(positions) {
            let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq.iter().map(|&f| (pos as f32 * f).sin_cos()).map(|(s, c)| (c, s)).unzip();
            rotate_row(row, head_dim, &cos, &sin, inverse);
        }
        return;
    }
    let table = angle_table(inv_freq, max_pos);
    // rows are independent; 16 per rayon task
    x.par_chunks_mut(16 * heads * head_dim).zip(positions.par_chunks(16)).for_each(|(rows, positions)| {
        for (row, &pos) in rows.chunks_exact_mut(heads * head_dim).zip(positions) {
            let at = pos * half;
            rotate_row(row, head_dim, &table.cos[at..at + half], &table.sin[at..at + half], inverse);
        }
    });
}

simd_fn! {
    /// Rotates every head of one token's row by the angles `(cos, sin)`
    /// (negated with `inverse`).
    fn rotate_row(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], inverse: bool) {
        let half = cos.len();
        let sign = if inverse { -1.0 } else { 1.0 };
        for head in row.chunks_exact_mut(head_dim) {
            let (a, b) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (x, y, s) = (a[i], b[i], sign * sin[i]);
                a[i] = x * cos[i] - y * s;
                b[i] = y * cos[i] + x * s;
            }
        }
    }
}

/// Forward RoPE in place (see [`rope_apply`]).
pub fn rope_forward(x: &mut [f32], positions: &[usize], heads: usize, head_dim: usize, inv_freq: &[f32]) {
    rope_apply(x, positions, heads, head_dim, inv_freq, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_regimes_match_transformers_formula() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let plain = rope_inv_freq(16, 10000.0, &RopeScaling::Default);
        let scaled = rope_inv_freq(16, 10000.0, &s);
        // wavelengths 6.3 (< 16: kept), 19.9 (between: blended), 62.8 (blended), 199 (> 64: / 8)
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[3] - plain[3] / 8.0).abs() < 1e-9);
        let wl = 2.0 * std::f64::consts::PI / plain[1] as f64;
        let smooth = (64.0 / wl - 1.0) / 3.0;
        let want = (1.0 - smooth) * plain[1] as f64 / 8.0 + smooth * plain[1] as f64;
        assert!((scaled[1] as f64 - want).abs() < 1e-7 * want);
    }

    #[test]
    fn rotation_matches_rotate_half_and_inverts() {
        let (heads, hd) = (2, 8);
        let inv = rope_inv_freq(4, 100.0, &RopeScaling::Default); // partial: 4 of 8
        let x0: Vec<f32> = (0..3 * heads * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let pos = [0usize, 5, 17];
        let mut x = x0.clone();
        rope_forward(&mut x, &pos, heads, hd, &inv);
        for t in 0..3 {
            for h in 0..heads {
                let o = (t * heads + h) * hd;
                for i in 0..2 {
                    let ang = pos[t] as f64 * inv[i] as f64;
                    let (a, b) = (x0[o + i] as f64, x0[o + i + 2] as f64);
                    assert!((x[o + i] as f64 - (a * ang.cos() - b * ang.sin())).abs() < 1e-5);
                    assert!((x[o + i + 2] as f64 - (b * ang.cos() + a * ang.sin())).abs() < 1e-5);
                }
                assert_eq!(&x[o + 4..o + 8], &x0[o + 4..o + 8], "pass-through features");
            }
        }
        rope_apply(&mut x, &pos, heads, hd, &inv, true);
        for (a, b) in x.iter().zip(&x0) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    /// Positions past the shared table's reach take the direct path; both
    /// paths rotate by the f32 angle `pos * inv_freq` (checked in f64).
    #[test]
    fn far_and_near_positions_match_f64() {
        let (heads, hd) = (3, 16);
        let inv = rope_inv_freq(hd, 10000.0, &RopeScaling::Default);
        for pos in [vec![0usize, 1, 255, 300, 7], vec![70_000, 3, 123_456]] {
            let x0: Vec<f32> = (0..pos.len() * heads * hd).map(|i| (i as f32 * 0.29).cos()).collect();
            let mut x = x0.clone();
            rope_forward(&mut x, &pos, heads, hd, &inv);
            for (t, &p) in pos.iter().enumerate() {
                for h in 0..heads {
                    let o = (t * heads + h) * hd;
                    for i in 0..hd / 2 {
                        let ang = (p as f32 * inv[i]) as f64;
                        let (a, b) = (x0[o + i] as f64, x0[o + i + hd / 2] as f64);
                        assert!((x[o + i] as f64 - (a * ang.cos() - b * ang.sin())).abs() < 1e-5, "pos {p}");
                        assert!((x[o + i + hd / 2] as f64 - (b * ang.cos() + a * ang.sin())).abs() < 1e-5, "pos {p}");
                    }
                }
            }
        }
    }
}

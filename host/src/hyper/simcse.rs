//! SimCSE contrastive loss (stage 1a): two dropout views of each user's
//! context, in-batch negatives, cosine similarity over a temperature.
//!
//! ```text
//! c_ij  = cos(z1_i, z2_j)                     z1, z2: [N, E]
//! loss  = mean_i ( logsumexp_j(c_ij / tau) - c_ii / tau )
//! dc_ij = (softmax_j(c_i / tau)_j - [i == j]) / (N tau)
//! dz1_i = sum_j dc_ij (^z2_j - c_ij ^z1_i) / |z1_i|     (and symmetrically dz2_j)
//! ```
use crate::{Error, Result};

/// SimCSE's temperature.
pub const TEMPERATURE: f32 = 0.05;

/// Loss and the gradients of both views.
pub struct SimcseOut {
    /// Mean InfoNCE loss.
    pub loss: f64,
    /// `dL/dz1: [N, E]`.
    pub dz1: Vec<Vec<f32>>,
    /// `dL/dz2: [N, E]`.
    pub dz2: Vec<Vec<f32>>,
}

fn unit(z: &[f32]) -> (Vec<f64>, f64) {
    let norm = z.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt().max(1e-12);
    (z.iter().map(|&v| v as f64 / norm).collect(), norm)
}

/// Forward and backward of the loss for views `z1`, `z2` (`N >= 2` rows each).
pub fn simcse_forward_backward(z1: &[Vec<f32>], z2: &[Vec<f32>], tau: f32) -> Result<SimcseOut> {
    let n = z1.len();
    if n < 2 || z2.len() != n || z1.iter().chain(z2).any(|z| z.len() != z1[0].len()) {
        return Err(Error::invalid("SimCSE batch", "needs at least two users and two views of equal width"));
    }
    let tau = tau as f64;
    let (u1, n1): (Vec<_>, Vec<_>) = z1.iter().map(|z| unit(z)).unzip();
    let (u2, n2): (Vec<_>, Vec<_>) = z2.iter().map(|z| unit(z)).unzip();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let c: Vec<Vec<f64>> = u1.iter().map(|a| u2.iter().map(|b| dot(a, b)).collect()).collect();
    let mut loss = 0.0;
    let mut dc = vec![vec![0.0f64; n]; n];
    for i in 0..n {
        let max = c[i].iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v / tau));
        let sum: f64 = c[i].iter().map(|&v| (v / tau - max).exp()).sum();
        let lse = max + sum.ln();
        loss += lse - c[i][i] / tau;
        for j in 0..n {
            let p = (c[i][j] / tau - lse).exp();
            dc[i][j] = (p - if i == j { 1.0 } else { 0.0 }) / (n as f64 * tau);
        }
    }
    let dim = z1[0].len();
    let mut dz1 = vec![vec![0.0f32; dim]; n];
    let mut dz2 = vec![vec![0.0f32; dim]; n];
    for i in 0..n {
        for j in 0..n {
            let g = dc[i][j];
            for d in 0..dim {
                dz1[i][d] += (g * (u2[j][d] - c[i][j] * u1[i][d]) / n1[i]) as f32;
                dz2[j][d] += (g * (u1[i][d] - c[i][j] * u2[j][d]) / n2[j]) as f32;
            }
        }
    }
    Ok(SimcseOut { loss: loss / n as f64, dz1, dz2 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central finite differences of the f64 loss, independent of the
    /// analytic backward.
    #[test]
    fn gradients_match_finite_differences() {
        let (n, dim) = (3, 5);
        let z = |s: usize| -> Vec<Vec<f32>> { (0..n).map(|i| (0..dim).map(|d| ((i * 7 + d * 3 + s) as f32 * 0.37).sin()).collect()).collect() };
        let (z1, z2) = (z(0), z(11));
        let tau = 0.5;
        let out = simcse_forward_backward(&z1, &z2, tau).unwrap();
        let h = 1e-3f32;
        for i in 0..n {
            for d in 0..dim {
                for view in 0..2 {
                    let (mut p, mut m) = ((z1.clone(), z2.clone()), (z1.clone(), z2.clone()));
                    if view == 0 {
                        p.0[i][d] += h;
                        m.0[i][d] -= h;
                    } else {
                        p.1[i][d] += h;
                        m.1[i][d] -= h;
                    }
                    let fd = (simcse_forward_backward(&p.0, &p.1, tau).unwrap().loss - simcse_forward_backward(&m.0, &m.1, tau).unwrap().loss) / (2.0 * h as f64);
                    let an = if view == 0 { out.dz1[i][d] } else { out.dz2[i][d] } as f64;
                    assert!((fd - an).abs() < 1e-3 * (1.0 + fd.abs()), "view {view} [{i},{d}]: fd {fd} vs {an}");
                }
            }
        }
        // Identical views of orthogonal users: the loss is near its minimum.
        let eye: Vec<Vec<f32>> = (0..n).map(|i| (0..dim).map(|d| if d == i { 1.0 } else { 0.0 }).collect()).collect();
        let low = simcse_forward_backward(&eye, &eye, 0.05).unwrap().loss;
        assert!(low < 1e-6, "{low}");
        assert!(simcse_forward_backward(&z1[..1], &z2[..1], tau).is_err());
    }
}

//! Learning-rate schedules with linear warm-up (the formulas of Hugging
//! Face's `get_{cosine,linear}_schedule_with_warmup`), gradient clipping.
use crate::tensor::Tensor;

/// Shape of the decay after warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Decay {
    /// Half a cosine down to 0 at the last step.
    Cosine,
    /// Straight line down to 0 at the last step.
    Linear,
    /// Stay at the base rate.
    Constant,
}

/// Warm-up then decay.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    /// Peak learning rate.
    pub lr: f32,
    /// Warm-up steps (linear from 0).
    pub warmup: u64,
    /// Total optimizer steps.
    pub total: u64,
    /// Decay after warm-up.
    pub decay: Decay,
}

impl Schedule {
    /// Learning rate for 0-based optimizer step `step`.
    pub fn lr_at(&self, step: u64) -> f32 {
        if step < self.warmup {
            return self.lr * step as f32 / self.warmup.max(1) as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = (step - self.warmup) as f64 / span;
        let factor = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => (1.0 - progress).max(0.0),
            Decay::Cosine => (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0),
        };
        (self.lr as f64 * factor) as f32
    }
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (PyTorch's
/// `clip_grad_norm_`: coefficient `max_norm / (norm + 1e-6)`); returns the
/// norm before clipping. The sum of squares runs in f64 in a fixed order.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f32) -> f32 {
    use rayon::prelude::*;
    // per-tensor sums in parallel, then added in tensor order: the same
    // bits whatever the thread count
    let sums: Vec<f64> = grads.par_iter().map(|g| g.data.iter().map(|&v| v as f64 * v as f64).sum::<f64>()).collect();
    let total = sums.iter().sum::<f64>().sqrt() as f32;
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        grads.par_iter_mut().for_each(|g| g.data.iter_mut().for_each(|v| *v *= coef));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_and_linear_hit_known_points() {
        let s = Schedule { lr: 1.0, warmup: 10, total: 110, decay: Decay::Cosine };
        assert_eq!(s.lr_at(0), 0.0);
        assert!((s.lr_at(5) - 0.5).abs() < 1e-7);
        assert!((s.lr_at(10) - 1.0).abs() < 1e-7);
        assert!((s.lr_at(60) - 0.5).abs() < 1e-6); // half-way: cos(pi/2) = 0
        assert!(s.lr_at(110).abs() < 1e-7);
        let l = Schedule { decay: Decay::Linear, ..s };
        assert!((l.lr_at(85) - 0.25).abs() < 1e-6);
        assert_eq!(Schedule { decay: Decay::Constant, ..s }.lr_at(100), 1.0);
    }

    #[test]
    fn clipping_scales_to_the_max_norm_and_leaves_small_gradients() {
        let mut g = vec![Tensor::from_vec(&[2], vec![3.0, 0.0]).unwrap(), Tensor::from_vec(&[1], vec![4.0]).unwrap()];
        assert_eq!(clip_grad_norm(&mut g, 1.0), 5.0);
        let norm: f32 = g.iter().flat_map(|t| &t.data).map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        let mut small = vec![Tensor::from_vec(&[1], vec![0.5]).unwrap()];
        clip_grad_norm(&mut small, 1.0);
        assert_eq!(small[0].data[0], 0.5);
    }
}

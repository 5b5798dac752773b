//! AdamW (decoupled weight decay, bias correction), in PyTorch's operation
//! order (`torch.optim.AdamW`, non-fused, non-amsgrad) so results track it.
use rayon::prelude::*;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// AdamW hyper-parameters (PyTorch defaults except `lr`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// `beta1`, first-moment decay.
    pub beta1: f32,
    /// `beta2`, second-moment decay.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// Decoupled weight decay factor.
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// Optimizer state: step count and one pair of moments per parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// Steps taken so far.
    pub step: u64,
    /// First moments, one per parameter, same shapes.
    pub m: Vec<Tensor>,
    /// Second moments.
    pub v: Vec<Tensor>,
}

impl AdamW {
    /// Fresh state (zero moments) for parameters shaped like `params`.
    pub fn new(config: AdamWConfig, params: &[Tensor]) -> Self {
        let zeros = || params.iter().map(|p| Tensor::zeros(&p.shape)).collect();
        AdamW { config, step: 0, m: zeros(), v: zeros() }
    }

    /// One update of `params` with `grads` at learning rate `lr`.
    pub fn update(&mut self, params: &mut [Tensor], grads: &[Tensor], lr: f32) -> Result<()> {
        if params.len() != self.m.len() || grads.len() != params.len() {
            return Err(Error::Shape {
                what: "AdamW parameter list".into(),
                expected: vec![self.m.len()],
                got: vec![params.len(), grads.len()],
            });
        }
        for ((p, g), m) in params.iter().zip(grads).zip(&self.m) {
            if p.shape != g.shape || p.shape != m.shape {
                return Err(Error::Shape { what: "AdamW parameter".into(), expected: p.shape.clone(), got: g.shape.clone() });
            }
        }
        self.step += 1;
        let c = self.config;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2_sqrt = (1.0 - c.beta2.powi(self.step as i32)).sqrt();
        let step_size = lr / bc1;
        // Tensors in parallel: every element's update is independent, so the
        // result does not depend on the split.
        let tensors = params.par_iter_mut().zip(grads).zip(&mut self.m).zip(&mut self.v);
        tensors.for_each(|(((p, g), m), v)| {
            for (((p, &g), m), v) in p.data.iter_mut().zip(&g.data).zip(&mut m.data).zip(&mut v.data) {
                *p *= 1.0 - lr * c.weight_decay;
                *m += (g - *m) * (1.0 - c.beta1);
                *v = *v * c.beta2 + g * g * (1.0 - c.beta2);
                let denom = v.sqrt() / bc2_sqrt + c.eps;
                *p -= step_size * *m / denom;
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent f64 AdamW, written from the paper's formulas.
    fn reference(p0: &[f64], grads: &[Vec<f64>], lr: f64, c: AdamWConfig) -> Vec<f64> {
        let (b1, b2, eps, wd) = (c.beta1 as f64, c.beta2 as f64, c.eps as f64, c.weight_decay as f64);
        let mut p = p0.to_vec();
        let mut m = vec![0.0; p.len()];
        let mut v = vec![0.0; p.len()];
        for (t, g) in grads.iter().enumerate() {
            let t = (t + 1) as i32;
            for i in 0..p.len() {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
                p[i] = p[i] * (1.0 - lr * wd) - lr * mh / (vh.sqrt() + eps);
            }
        }
        p
    }

    #[test]
    fn matches_f64_reference_over_several_steps() {
        let c = AdamWConfig { weight_decay: 0.1, ..Default::default() };
        let p0: Vec<f32> = (0..10).map(|i| i as f32 * 0.3 - 1.0).collect();
        let grads: Vec<Vec<f32>> = (0..5).map(|s| (0..10).map(|i| ((i * 3 + s * 7) % 11) as f32 * 0.1 - 0.5).collect()).collect();
        let mut params = vec![Tensor::from_vec(&[2, 5], p0.clone()).unwrap()];
        let mut opt = AdamW::new(c, &params);
        for g in &grads {
            opt.update(&mut params, &[Tensor::from_vec(&[2, 5], g.clone()).unwrap()], 1e-2).unwrap();
        }
        let want = reference(
            &p0.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            &grads.iter().map(|g| g.iter().map(|&x| x as f64).collect()).collect::<Vec<_>>(),
            1e-2,
            c,
        );
        for (g, w) in params[0].data.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{g} vs {w}");
        }
        assert_eq!(opt.step, 5);
    }

    #[test]
    fn first_step_moves_by_lr_times_sign_and_decay_is_decoupled() {
        let c = AdamWConfig { weight_decay: 0.5, ..Default::default() };
        let mut params = vec![Tensor::from_vec(&[3], vec![1.0, 1.0, 1.0]).unwrap()];
        let mut opt = AdamW::new(c, &params);
        opt.update(&mut params, &[Tensor::from_vec(&[3], vec![3.0, -0.001, 0.0]).unwrap()], 0.1).unwrap();
        // decay: 1 * (1 - 0.1 * 0.5) = 0.95, then -lr * sign(g)
        let want = [0.95 - 0.1, 0.95 + 0.1, 0.95];
        for (g, w) in params[0].data.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
        let bad = opt.update(&mut params, &[Tensor::zeros(&[4])], 0.1);
        assert!(bad.is_err());
    }
}

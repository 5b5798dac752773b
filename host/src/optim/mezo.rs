//! MeZO: zeroth-order SGD with simultaneous perturbation (SPSA) and the seed
//! trick: the perturbation `z ~ N(0, I)` is never stored, only its seed; it
//! is regenerated to perturb, to restore and to update. Memory is that of
//! inference. This is the forward-only baseline the mission compares to.
use crate::base::counter_rng;
use crate::tensor::Tensor;
use crate::Result;

/// MeZO hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mezo {
    /// Perturbation scale `eps`.
    pub eps: f32,
    /// Weight decay (applied with the update, as in the MeZO reference code).
    pub weight_decay: f32,
}

/// What one step measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MezoStep {
    /// Mean of the two perturbed losses.
    pub loss: f32,
    /// The SPSA estimate `(L+ - L-) / (2 eps)` of the gradient along `z`.
    pub projected_grad: f32,
}

/// Adds `scale * z` to every parameter, `z` drawn from `seed`.
fn perturb(params: &mut [Tensor], seed: u64, scale: f32) {
    for (k, p) in params.iter_mut().enumerate() {
        let s = counter_rng::derive(seed, k as u64);
        p.data.iter_mut().enumerate().for_each(|(i, v)| *v += scale * counter_rng::normal(s, i as u64));
    }
}

impl Mezo {
    /// One step: `g = (L(p + eps z) - L(p - eps z)) / (2 eps)`, then
    /// `p -= lr * (g z + wd p)`. `loss` evaluates the model with the given
    /// parameters. Returns the mean of the two losses.
    pub fn step(&self, params: &mut [Tensor], seed: u64, lr: f32, loss: impl FnMut(&[Tensor]) -> Result<f32>) -> Result<f32> {
        Ok(self.step_measured(params, seed, lr, loss)?.loss)
    }

    /// [`Mezo::step`], also reporting the projected gradient.
    pub fn step_measured(&self, params: &mut [Tensor], seed: u64, lr: f32, mut loss: impl FnMut(&[Tensor]) -> Result<f32>) -> Result<MezoStep> {
        perturb(params, seed, self.eps);
        let up = loss(params)?;
        perturb(params, seed, -2.0 * self.eps);
        let down = loss(params)?;
        perturb(params, seed, self.eps);
        let g = (up - down) / (2.0 * self.eps);
        for (k, p) in params.iter_mut().enumerate() {
            let s = counter_rng::derive(seed, k as u64);
            for (i, v) in p.data.iter_mut().enumerate() {
                *v -= lr * (g * counter_rng::normal(s, i as u64) + self.weight_decay * *v);
            }
        }
        Ok(MezoStep { loss: 0.5 * (up + down), projected_grad: g })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_loss_gives_exact_projected_gradient_update() {
        // L(p) = c . p: the SPSA estimate is exactly c . z, so the update is
        // -lr (c . z) z with the same z the seed regenerates.
        let c = [0.5f32, -2.0, 1.0];
        let mut params = vec![Tensor::from_vec(&[3], vec![1.0, 2.0, 3.0]).unwrap()];
        let m = Mezo { eps: 1e-2, weight_decay: 0.0 };
        let lin = |p: &[Tensor]| Ok(p[0].data.iter().zip(c).map(|(x, c)| x * c).sum::<f32>());
        m.step(&mut params, 42, 0.1, lin).unwrap();
        let s = counter_rng::derive(42, 0);
        let z: Vec<f32> = (0..3).map(|i| counter_rng::normal(s, i)).collect();
        let cz: f32 = z.iter().zip(c).map(|(z, c)| z * c).sum();
        for (i, v) in params[0].data.iter().enumerate() {
            let want = (i + 1) as f32 - 0.1 * cz * z[i];
            assert!((v - want).abs() < 1e-3, "{v} vs {want}");
        }
    }

    #[test]
    fn descends_a_quadratic() {
        let mut params = vec![Tensor::from_vec(&[8], vec![1.0; 8]).unwrap()];
        let m = Mezo { eps: 1e-3, weight_decay: 0.0 };
        let quad = |p: &[Tensor]| Ok(p[0].data.iter().map(|x| x * x).sum::<f32>());
        let start = quad(&params).unwrap();
        for step in 0..300 {
            m.step(&mut params, step, 0.02, quad).unwrap();
        }
        assert!(quad(&params).unwrap() < 0.1 * start);
    }
}

//! Per-user LoRAs as targets for the heads: a reconstruction loss beside
//! (or instead of) the end-to-end one.
//!
//! Why: trained end to end, the hypernetwork moves a quarter of the common
//! LoRA's answers and rarely toward the author's own area or prefix, while a
//! LoRA trained on the author's profile moves most of them the right way
//! (`docs/RESULTS.md`). The train authors' own LoRAs (`hexlora eval --method
//! user-lora-f32 --work-dir W` keeps each in `W/user-lora-f32/<user>/adapter`),
//! trained from the same common LoRA the heads' `b2` starts from, say
//! directly which LoRA each embedding should give.
//!
//! Per user `u` with target factors `T_u` (heads order) and generated `F_u`:
//!
//! ```text
//! rec_u  = sum_i |F_u,i - T_u,i|^2 / D,   D = mean_u sum_i |T_u,i - C_i|^2
//! drec/dF_u,i = 2 (F_u,i - T_u,i) / D
//! ```
//! `C` is the common LoRA, so `rec_u` is 1 for an average user when the
//! heads emit the common LoRA, and 0 when they emit the user's own.
use super::heads::{Factor, Heads};
use super::users::UserRecord;
use crate::eval::dataset::user_dir_name;
use crate::lora::{Adapter, LoraConfig};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::path::Path;

/// The targets of a population, aligned with its users.
#[derive(Clone, Debug)]
pub struct LoraTargets {
    /// Each user's factors in heads order (`specs`: A then B per module).
    pub factors: Vec<Vec<Tensor>>,
    /// `1 / D`: the inverse of the mean squared distance of a target from
    /// the common LoRA.
    pub inv_norm: f64,
}

/// An adapter's factors in the heads' order, checked against their shapes.
fn heads_order(heads: &Heads, adapter: &Adapter, what: &str) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(heads.specs.len());
    for s in &heads.specs {
        let m = adapter.modules.iter().find(|m| m.name == s.module).ok_or_else(|| Error::invalid(what, format!("has no LoRA for {}, which the hypernetwork emits", s.module)))?;
        let t = match s.factor {
            Factor::A => &m.a,
            Factor::B => &m.b,
        };
        if t.shape != s.shape {
            return Err(Error::Shape { what: format!("{what}: {} lora_{:?}", s.module, s.factor), expected: s.shape.to_vec(), got: t.shape.clone() });
        }
        out.push(t.clone());
    }
    Ok(out)
}

fn same_scaling(target: &LoraConfig, out: &LoraConfig, what: &str) -> Result<()> {
    if target.r != out.r || target.alpha != out.alpha {
        let msg = format!("has r = {}, alpha = {} but the hypernetwork emits r = {}, alpha = {}", target.r, target.alpha, out.r, out.alpha);
        return Err(Error::invalid(what, msg));
    }
    Ok(())
}

/// One user's reconstruction term in a step.
#[derive(Clone, Copy, Debug)]
pub struct Reconstruct<'a> {
    /// The user's target factors (heads order).
    pub target: &'a [Tensor],
    /// `1 / D` of the population.
    pub inv_norm: f64,
    /// Weight of the term in the user's loss.
    pub weight: f32,
}

/// Reads `dir/<user>/adapter` of every user (`dir` as `eval --work-dir W`
/// leaves `W/user-lora-f32`), checks each against the heads and `out`
/// (rank, alpha), and the normaliser from `common`. A missing user is an
/// error naming the directory it should be in.
pub fn load_targets(dir: &Path, users: &[UserRecord], heads: &Heads, out: &LoraConfig, common: &Adapter) -> Result<LoraTargets> {
    let base = heads_order(heads, common, "--common-lora")?;
    let mut factors = Vec::with_capacity(users.len());
    let mut dist = 0f64;
    for u in users {
        let path = dir.join(user_dir_name(&u.user)).join("adapter");
        if !path.is_dir() {
            return Err(Error::invalid("--lora-targets", format!("has no adapter for user {:?} (expected {})", u.user, path.display())));
        }
        let adapter = Adapter::load(&path)?;
        let what = path.display().to_string();
        same_scaling(&adapter.config, out, &what)?;
        let f = heads_order(heads, &adapter, &what)?;
        dist += squared_distance(&f, &base);
        factors.push(f);
    }
    let mean = dist / users.len().max(1) as f64;
    if !(mean > 0.0 && mean.is_finite()) {
        return Err(Error::invalid("--lora-targets", format!("every target equals the common LoRA (mean squared distance {mean})")));
    }
    Ok(LoraTargets { factors, inv_norm: 1.0 / mean })
}

fn squared_distance(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter().zip(b).flat_map(|(x, y)| x.data.iter().zip(&y.data)).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum()
}

/// `rec = |F - T|^2 / D` of one user (unweighted); adds `weight * drec/dF`
/// into `dfactors`.
pub fn reconstruction(factors: &[Tensor], target: &[Tensor], inv_norm: f64, weight: f32, dfactors: &mut [Tensor]) -> f64 {
    let g = (2.0 * inv_norm * weight as f64) as f32;
    for ((f, t), d) in factors.iter().zip(target).zip(dfactors.iter_mut()) {
        for ((d, &f), &t) in d.data.iter_mut().zip(&f.data).zip(&t.data) {
            *d += g * (f - t);
        }
    }
    squared_distance(factors, target) * inv_norm
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loss and gradient against an f64 sum written out by hand.
    #[test]
    fn reconstruction_matches_f64() {
        let f = vec![Tensor { shape: vec![2], data: vec![1.0, -2.0] }, Tensor { shape: vec![1], data: vec![0.5] }];
        let t = vec![Tensor { shape: vec![2], data: vec![0.0, 1.0] }, Tensor { shape: vec![1], data: vec![0.25] }];
        let mut d = vec![Tensor { shape: vec![2], data: vec![1.0, 1.0] }, Tensor { shape: vec![1], data: vec![0.0] }];
        let rec = reconstruction(&f, &t, 0.5, 3.0, &mut d);
        let want = (1.0f64 + 9.0 + 0.0625) * 0.5;
        assert!((rec - want).abs() < 1e-12, "{rec} vs {want}");
        // d += 3 * 2 * 0.5 * (f - t) on top of what was there.
        assert_eq!(d[0].data, vec![1.0 + 3.0, 1.0 - 9.0]);
        assert_eq!(d[1].data, vec![0.75]);
    }
}

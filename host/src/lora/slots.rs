//! Inference with a swappable LoRA adapter: every frozen projection of the
//! inference [`Model`](crate::model::decoder::Model) is wrapped in a
//! [`SlotProjection`] that adds `s * X A^T B^T` (the training graph's
//! [`crate::lora::branch`] forward, from factors transposed once) when its
//! slot holds factors. Evaluation, `generate` and `serve` swap adapters in
//! and out without reloading or merging weights, so the base weights stay
//! shared: one resident model answers for many users.
use crate::lora::branch::{self, Shapes};
use crate::lora::Adapter;
use crate::projection::{Direction, Projection, ProjectionInfo};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The factors one projection applies, transposed for the forward.
struct Factors {
    /// `A^T`, `[in, r]`.
    at: Vec<f32>,
    /// `B^T`, `[r, out]`.
    bt: Vec<f32>,
    rank: usize,
    scaling: f32,
}

type Slot = Arc<RwLock<Option<Arc<Factors>>>>;

/// A frozen projection plus the LoRA branch currently in its slot.
pub struct SlotProjection {
    base: Arc<dyn Projection>,
    slot: Slot,
}

impl Projection for SlotProjection {
    fn info(&self) -> &ProjectionInfo {
        self.base.info()
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.base.apply(dir, input, tokens, out)?;
        if dir != Direction::Forward {
            // Generation never asks for input gradients; training uses the graph's own branch.
            return Err(Error::Unsupported("input gradients through an inference LoRA slot".into()));
        }
        let guard = self.slot.read().map_err(|_| Error::invalid("adapter slot", "poisoned lock"))?;
        if let Some(f) = guard.as_ref() {
            let info = self.base.info();
            let sh = Shapes { tokens, in_f: info.in_features, rank: f.rank, out_f: info.out_features };
            let mut xa = vec![0.0; tokens * sh.rank];
            branch::forward_transposed(out, &mut xa, input, &f.at, &f.bt, f.scaling, sh, true);
        }
        Ok(())
    }
}

/// An adapter checked against a model's slots and transposed, ready to be
/// installed in O(modules) (`serve` keeps one per registered user).
#[derive(Clone, Default)]
pub struct PreparedAdapter {
    factors: HashMap<String, Arc<Factors>>,
}

/// All slots of one model, by projection name.
#[derive(Clone, Default)]
pub struct AdapterSlots {
    slots: HashMap<String, (ProjectionInfo, Slot)>,
}

impl AdapterSlots {
    /// Wraps `base` in a slot registered under its projection name.
    pub fn wrap(&mut self, base: Arc<dyn Projection>) -> Arc<dyn Projection> {
        let slot: Slot = Arc::new(RwLock::new(None));
        self.slots.insert(base.info().name.clone(), (base.info().clone(), slot.clone()));
        Arc::new(SlotProjection { base, slot })
    }

    /// Checks `adapter` against the slots (every module must name a wrapped
    /// projection with matching widths, all factors finite) and transposes
    /// its factors; the branch is scaled by `scale` times the adapter's own
    /// scaling (llama.cpp's `--lora-scaled`).
    pub fn prepare(&self, adapter: &Adapter, scale: f32) -> Result<PreparedAdapter> {
        if !scale.is_finite() {
            return Err(Error::invalid("adapter scale", format!("{scale} (must be finite)")));
        }
        adapter.check(self.slots.values().map(|(info, _)| info))?;
        let r = adapter.config.r;
        let mut factors = HashMap::new();
        for m in &adapter.modules {
            let (info, _) = &self.slots[&m.name];
            let f = Factors {
                at: branch::transposed(&m.a.data, r, info.in_features),
                bt: branch::transposed(&m.b.data, info.out_features, r),
                rank: r,
                scaling: adapter.config.scaling() * scale,
            };
            factors.insert(m.name.clone(), Arc::new(f));
        }
        Ok(PreparedAdapter { factors })
    }

    /// Installs `adapter` (from [`Self::prepare`] on these slots); `None`
    /// clears all slots (the base model).
    pub fn install(&self, adapter: Option<&PreparedAdapter>) -> Result<()> {
        for (name, (_, slot)) in &self.slots {
            let mut g = slot.write().map_err(|_| Error::invalid("adapter slot", "poisoned lock"))?;
            *g = adapter.and_then(|a| a.factors.get(name).cloned());
        }
        Ok(())
    }

    /// Prepares and installs `adapter` at scale 1; `None` restores the base model.
    pub fn set(&self, adapter: Option<&Adapter>) -> Result<()> {
        let prepared = adapter.map(|a| self.prepare(a, 1.0)).transpose()?;
        self.install(prepared.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{LoraConfig, LoraModule};
    use crate::ops::cpu_projection::CpuProjection;
    use crate::projection::ProjectionKind;
    use crate::tensor::Tensor;

    #[test]
    fn slot_adds_the_branch_and_clears_back_to_the_base() {
        // W = [[1, 2], [3, 4], [5, 6]] (out 3, in 2); A = [[1, -1]] (r 1); B = [[1], [0], [2]].
        let info = ProjectionInfo { name: "m.q_proj".into(), kind: ProjectionKind::Attention, out_features: 3, in_features: 2 };
        let base = Arc::new(CpuProjection::new(info, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap());
        let mut slots = AdapterSlots::default();
        let p = slots.wrap(base);
        let config = LoraConfig { r: 1, alpha: 2.0, target_modules: vec!["q_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() };
        let a = Tensor::from_vec(&[1, 2], vec![1.0, -1.0]).unwrap();
        let b = Tensor::from_vec(&[3, 1], vec![1.0, 0.0, 2.0]).unwrap();
        let ad = Adapter { config, modules: vec![LoraModule { name: "m.q_proj".into(), a, b }] };
        let x = [2.0f32, 0.5];
        let mut y = [0.0f32; 3];
        p.apply(Direction::Forward, &x, 1, &mut y).unwrap();
        assert_eq!(y, [3.0, 8.0, 13.0]);
        slots.set(Some(&ad)).unwrap();
        p.apply(Direction::Forward, &x, 1, &mut y).unwrap();
        // x A^T = 1.5; scaling 2 -> + [3, 0, 6]
        assert_eq!(y, [6.0, 8.0, 19.0]);
        slots.set(None).unwrap();
        p.apply(Direction::Forward, &x, 1, &mut y).unwrap();
        assert_eq!(y, [3.0, 8.0, 13.0]);
        let mut wrong = ad.clone();
        wrong.modules[0].name = "m.k_proj".into();
        assert!(slots.set(Some(&wrong)).unwrap_err().to_string().contains("k_proj"));
    }
}

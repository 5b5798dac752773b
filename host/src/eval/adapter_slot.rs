//! Inference with a swappable LoRA adapter: every frozen projection of the
//! inference [`Model`](crate::model::decoder::Model) is wrapped in a
//! [`SlotProjection`] that adds `s * X A^T B^T` (the same
//! [`crate::lora::branch::forward`] the training graph uses) when its slot
//! holds factors. Evaluation swaps a user's adapter in and out without
//! reloading or merging weights, so the base weight stays shared with the
//! training graph.
use crate::lora::branch::{self, Shapes};
use crate::lora::Adapter;
use crate::projection::{Direction, Projection, ProjectionInfo};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The factors one projection currently applies.
#[derive(Clone)]
struct Factors {
    /// `[r, in]`.
    a: Tensor,
    /// `[out, r]`.
    b: Tensor,
    scaling: f32,
}

type Slot = Arc<RwLock<Option<Factors>>>;

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
            let sh = Shapes { tokens, in_f: info.in_features, rank: f.a.shape[0], out_f: info.out_features };
            let mut xa = vec![0.0; tokens * sh.rank];
            branch::forward(out, &mut xa, input, &f.a.data, &f.b.data, f.scaling, None, sh);
        }
        Ok(())
    }
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

    /// Puts `adapter` in (every module must name a wrapped projection with
    /// matching widths); `None` clears all slots (the base model).
    pub fn set(&self, adapter: Option<&Adapter>) -> Result<()> {
        let mut next: HashMap<&str, Factors> = HashMap::new();
        if let Some(ad) = adapter {
            for m in &ad.modules {
                let (info, _) = self
                    .slots
                    .get(&m.name)
                    .ok_or_else(|| Error::invalid("adapter", format!("module {} is not a projection of this model", m.name)))?;
                let r = ad.config.r;
                if m.a.shape != [r, info.in_features] || m.b.shape != [info.out_features, r] {
                    return Err(Error::Shape {
                        what: format!("adapter factors of {}", m.name),
                        expected: vec![r, info.in_features, info.out_features, r],
                        got: [m.a.shape.clone(), m.b.shape.clone()].concat(),
                    });
                }
                next.insert(&m.name, Factors { a: m.a.clone(), b: m.b.clone(), scaling: ad.config.scaling() });
            }
        }
        for (name, (_, slot)) in &self.slots {
            let mut g = slot.write().map_err(|_| Error::invalid("adapter slot", "poisoned lock"))?;
            *g = next.remove(name.as_str());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{LoraConfig, LoraModule};
    use crate::model::cpu_projection::CpuProjection;
    use crate::projection::ProjectionKind;

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

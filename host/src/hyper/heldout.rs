//! Held-out loss: how well the LoRAs synthesized for users the
//! hypernetwork never trained on predict those users' other examples, next
//! to the common LoRA (the hypernetwork's starting point) on the very same
//! examples. Each user's context / scored split is drawn once, so every
//! evaluation during a run scores the same tokens.
use super::end_to_end::UserBatch;
use super::hypernet::HyperNet;
use super::users::{sample_user, UserRecord};
use crate::lora::Adapter;
use crate::train::data::Encoder;
use crate::autograd::graph::TrainableModel;
use crate::train::grad::evaluate;
use crate::autograd::graph::Batch;
use crate::Result;

/// The fixed held-out examples of a set of users.
pub struct HeldOutSet {
    /// One context + scored examples per user.
    pub users: Vec<UserBatch>,
}

impl HeldOutSet {
    /// Splits each user once with `seed` (as a training step would), up to
    /// `targets` scored examples each.
    pub fn new(enc: &dyn Encoder, net: &HyperNet, users: &[UserRecord], seed: u64, targets: usize, max_len: usize) -> Result<Self> {
        let cfg = &net.config;
        let users = users
            .iter()
            .enumerate()
            .map(|(i, u)| sample_user(enc, cfg, u, crate::base::counter_rng::derive(seed, i as u64), targets, max_len))
            .collect::<Result<_>>()?;
        Ok(HeldOutSet { users })
    }

    /// Scored target tokens over all users.
    pub fn tokens(&self) -> usize {
        self.users.iter().flat_map(|u| &u.examples).map(|e| e.targets().iter().filter(|&&t| t >= 0).count()).sum()
    }

    /// Token-mean cross-entropy with each user's synthesized LoRA.
    pub fn hypernet_loss(&self, model: &dyn TrainableModel, net: &HyperNet) -> Result<f64> {
        self.mean(model, |u| net.synthesize(model, &u.context))
    }

    /// Token-mean cross-entropy with one adapter for everybody.
    pub fn adapter_loss(&self, model: &dyn TrainableModel, adapter: &Adapter) -> Result<f64> {
        self.mean(model, |_| Ok(adapter.clone()))
    }

    fn mean(&self, model: &dyn TrainableModel, adapter_of: impl Fn(&UserBatch) -> Result<Adapter>) -> Result<f64> {
        let (mut total, mut count) = (0f64, 0usize);
        for u in &self.users {
            let adapter = adapter_of(u)?;
            for ex in &u.examples {
                let batch = Batch { input_ids: vec![ex.ids.clone()], labels: vec![ex.labels.clone()] };
                let n = ex.targets().iter().filter(|&&t| t >= 0).count();
                total += evaluate(model, &adapter, std::slice::from_ref(&batch))? as f64 * n as f64;
                count += n;
            }
        }
        Ok(total / count.max(1) as f64)
    }
}

//! Hypernetwork training state, committed after every optimizer step as one
//! safetensors file replaced atomically (`commit.safetensors`): parameters,
//! AdamW moments, step, seed and the loss history. The sampling of users and
//! dropout derives from (seed, step), so that is the whole RNG state.
use super::config::HyperConfig;
use super::hypernet::HyperNet;
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::train::commit::{read_commit, write_commit_borrowed};
use crate::autograd::graph::TrainableModel;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// File name of the commit inside the run directory (shared with training runs).
pub use crate::train::commit::COMMIT_FILE;

/// Which training stage a step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// 1a: SimCSE on the embedder LoRA.
    Simcse,
    /// 1b: end to end, CE + distillation.
    EndToEnd,
}

/// One optimizer step's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HyperRecord {
    /// 1-based global step.
    pub step: u64,
    /// Stage of the step.
    pub stage: Stage,
    /// SimCSE loss (1a) or `ce + w kl` (1b), mean over the step's users.
    pub loss: f64,
    /// Token cross-entropy (1b).
    pub ce: f64,
    /// KL to the teacher (1b).
    pub kl: f64,
    /// Distance of the generated LoRA from the user's own (1b with
    /// targets; absent in runs before it existed, read as 0).
    #[serde(default)]
    pub recon: f64,
    /// Learning rate used.
    pub lr: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// Wall-clock seconds (not part of the bit-identity claim).
    pub seconds: f64,
}

/// Everything a resumed run needs.
#[derive(Clone, Debug)]
pub struct HyperState {
    /// The network being trained.
    pub net: HyperNet,
    /// Optimizer state of the current stage (reset when 1b starts).
    pub adamw: AdamW,
    /// Global steps done (1a then 1b).
    pub step: u64,
    /// Run seed.
    pub seed: u64,
    /// Per-step records.
    pub history: Vec<HyperRecord>,
    /// Configuration + data digest; resume refuses a mismatch.
    pub fingerprint: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    config: HyperConfig,
    step: u64,
    seed: u64,
    adamw_step: u64,
    adamw: AdamWConfig,
    history: Vec<HyperRecord>,
    fingerprint: String,
}

impl HyperState {
    /// Writes `dir/commit.safetensors` atomically.
    pub fn commit(&self, dir: &Path) -> Result<()> {
        // The moments are lent to the writer; only the parameters are
        // gathered into owned tensors (the network keeps them in pieces).
        let (names, params) = (self.net.param_names(), self.net.params());
        let mut tensors = BTreeMap::new();
        for (i, (name, p)) in names.iter().zip(&params).enumerate() {
            tensors.insert(format!("adam_m/{name}"), &self.adamw.m[i]);
            tensors.insert(format!("adam_v/{name}"), &self.adamw.v[i]);
            tensors.insert(format!("param/{name}"), p);
        }
        let header = Header {
            config: self.net.config.clone(),
            step: self.step,
            seed: self.seed,
            adamw_step: self.adamw.step,
            adamw: self.adamw.config,
            history: self.history.clone(),
            fingerprint: self.fingerprint.clone(),
        };
        write_commit_borrowed(dir, "hexlora_hyper_state", tensors, BTreeMap::new(), &header)
    }

    /// Reads the last commit of a run directory for `model`, if there is one.
    pub fn load(dir: &Path, model: &dyn TrainableModel) -> Result<Option<HyperState>> {
        let Some((f, header, what)) = read_commit::<Header>(dir, "hexlora_hyper_state", "not a hexlora hypernetwork commit")? else {
            return Ok(None);
        };
        let mut net = HyperNet::init(header.config, model, None, 0)?;
        let names = net.param_names();
        let get = |prefix: &str| names.iter().map(|n| f.get(&format!("{prefix}/{n}"), &what).cloned()).collect::<Result<Vec<_>>>();
        net.set_params(get("param")?)?;
        let adamw = AdamW { config: header.adamw, step: header.adamw_step, m: get("adam_m")?, v: get("adam_v")? };
        Ok(Some(HyperState { net, adamw, step: header.step, seed: header.seed, history: header.history, fingerprint: header.fingerprint }))
    }
}

impl crate::train::learner::Record for HyperRecord {
    fn loss(&self) -> f32 {
        self.loss as f32
    }
    fn progress(&self) -> String {
        match self.recon {
            0.0 => format!("{:?} loss {:.4} (ce {:.4} kl {:.4})", self.stage, self.loss, self.ce, self.kl),
            r => format!("{:?} loss {:.4} (ce {:.4} kl {:.4} rec {r:.4})", self.stage, self.loss, self.ce, self.kl),
        }
    }
}

impl crate::train::learner::Checkpointed for HyperState {
    type Record = HyperRecord;
    fn step(&self) -> u64 {
        self.step
    }
    fn history(&self) -> &[HyperRecord] {
        &self.history
    }
    fn records_may_start_late(&self) -> bool {
        true
    }
    fn push(&mut self, record: HyperRecord) {
        self.history.push(record);
    }
    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    fn commit(&self, out: &Path) -> Result<()> {
        HyperState::commit(self, out)
    }
    fn save_final(&self, out: &Path) -> Result<()> {
        self.net.save(&out.join("hypernet"))
    }
}

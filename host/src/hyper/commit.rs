//! Hypernetwork training state, committed after every optimizer step as one
//! safetensors file replaced atomically (`commit.safetensors`): parameters,
//! AdamW moments, step, seed and the loss history. The sampling of users and
//! dropout derives from (seed, step), so that is the whole RNG state.
use super::config::HyperConfig;
use super::hypernet::HyperNet;
use crate::lora::tensor_file::TensorFile;
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::train::atomic_write::write_atomic;
use crate::train::decoder_graph::DecoderGraph;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File name of the commit inside the run directory.
pub const COMMIT_FILE: &str = "commit.safetensors";

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
        let mut f = TensorFile::default();
        for (i, (name, p)) in self.net.param_names().into_iter().zip(self.net.params()).enumerate() {
            f.tensors.insert(format!("adam_m/{name}"), self.adamw.m[i].clone());
            f.tensors.insert(format!("adam_v/{name}"), self.adamw.v[i].clone());
            f.tensors.insert(format!("param/{name}"), p);
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
        f.metadata.insert("hexlora_hyper_state".into(), serde_json::to_string(&header).expect("header serialises"));
        write_atomic(&dir.join(COMMIT_FILE), &f.to_bytes()?)
    }

    /// Reads the last commit of a run directory for `model`, if there is one.
    pub fn load(dir: &Path, model: &DecoderGraph) -> Result<Option<HyperState>> {
        let path = dir.join(COMMIT_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let what = path.display().to_string();
        let f = TensorFile::read(&path)?;
        let header: Header = f
            .metadata
            .get("hexlora_hyper_state")
            .ok_or_else(|| Error::format(&what, "not a hexlora hypernetwork commit"))
            .and_then(|s| serde_json::from_str(s).map_err(|e| Error::format(&what, e.to_string())))?;
        let mut net = HyperNet::init(header.config, model, None, 0)?;
        let names = net.param_names();
        let get = |prefix: &str| names.iter().map(|n| f.get(&format!("{prefix}/{n}"), &what).cloned()).collect::<Result<Vec<_>>>();
        net.set_params(get("param")?)?;
        let adamw = AdamW { config: header.adamw, step: header.adamw_step, m: get("adam_m")?, v: get("adam_v")? };
        Ok(Some(HyperState { net, adamw, step: header.step, seed: header.seed, history: header.history, fingerprint: header.fingerprint }))
    }
}

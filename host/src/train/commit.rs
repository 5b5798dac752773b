//! Commits at optimizer-step boundaries: the adapter, AdamW moments, step,
//! data cursor, RNG seed and the loss history, in one safetensors file
//! replaced atomically (`commit.safetensors`). A run killed at any instant
//! resumes from the last commit and reproduces the uninterrupted run bit for
//! bit (the RNG is counter-based, so the seed plus the step is its state).
use crate::lora::peft::peft_key;
use crate::lora::tensor_file::{write_tensors_atomic, TensorFile};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use crate::lora::{Adapter, LoraConfig};
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// File name of the commit inside the run directory.
pub const COMMIT_FILE: &str = "commit.safetensors";

/// Writes `f` to `dir/commit.safetensors` atomically, with `header` as JSON
/// under the metadata `key` (beside `f`'s own metadata). Every kind of run
/// (AdamW, MeZO, hypernetwork) commits this way; the key tells them apart.
pub(crate) fn write_commit<H: Serialize>(dir: &Path, key: &str, f: TensorFile, header: &H) -> Result<()> {
    write_commit_borrowed(dir, key, f.tensors.iter().map(|(k, t)| (k.clone(), t)), f.metadata.clone(), header)
}

/// [`write_commit`] from borrowed tensors (no copy of the state in memory).
pub(crate) fn write_commit_borrowed<'a, H: Serialize>(
    dir: &Path,
    key: &str,
    tensors: impl IntoIterator<Item = (String, &'a Tensor)>,
    mut metadata: BTreeMap<String, String>,
    header: &H,
) -> Result<()> {
    metadata.insert(key.to_string(), serde_json::to_string(header).expect("header serialises"));
    write_tensors_atomic(&dir.join(COMMIT_FILE), tensors, &metadata)
}

/// Reads `dir/commit.safetensors` if it exists: its tensors, the header
/// under `key`, and the file's name for errors. A commit without `key`
/// (another kind of run) is an error saying `not_ours`.
pub(crate) fn read_commit<H: DeserializeOwned>(dir: &Path, key: &str, not_ours: &str) -> Result<Option<(TensorFile, H, String)>> {
    let path = dir.join(COMMIT_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let what = path.display().to_string();
    let f = TensorFile::read(&path)?;
    let header = f
        .metadata
        .get(key)
        .ok_or_else(|| Error::format(&what, not_ours))
        .and_then(|s| serde_json::from_str(s).map_err(|e| Error::format(&what, e.to_string())))?;
    Ok(Some((f, header, what)))
}

/// One optimizer step's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// 1-based optimizer step.
    pub step: u64,
    /// Mean token loss of the step (over its accumulated micro-batches).
    pub loss: f32,
    /// Learning rate used.
    pub lr: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// Tokens processed in the step.
    pub tokens: u64,
    /// Wall-clock seconds of the step (not part of the bit-identity claim).
    pub seconds: f64,
}

/// Everything a resumed run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    /// The adapter being trained.
    pub adapter: Adapter,
    /// Optimizer moments and step count.
    pub adamw: AdamW,
    /// Examples consumed so far (position in the seeded example stream).
    pub cursor: u64,
    /// Run seed (data order, dropout).
    pub seed: u64,
    /// Per-step records so far.
    pub history: Vec<StepRecord>,
    /// Identifies the run's configuration and data; resume refuses a mismatch.
    pub fingerprint: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    cursor: u64,
    seed: u64,
    adamw_step: u64,
    adamw: AdamWConfig,
    lora: serde_json::Value,
    history: Vec<StepRecord>,
    fingerprint: String,
    modules: Vec<String>,
}

impl TrainState {
    /// Optimizer steps done.
    pub fn step(&self) -> u64 {
        self.adamw.step
    }

    /// Writes `dir/commit.safetensors` atomically.
    pub fn commit(&self, dir: &Path) -> Result<()> {
        let mut tensors = BTreeMap::new();
        for (k, m) in self.adapter.modules.iter().enumerate() {
            for (which, t, i) in [("A", &m.a, 2 * k), ("B", &m.b, 2 * k + 1)] {
                let key = peft_key(&m.name, which);
                tensors.insert(format!("adapter/{key}"), t);
                tensors.insert(format!("adam_m/{key}"), &self.adamw.m[i]);
                tensors.insert(format!("adam_v/{key}"), &self.adamw.v[i]);
            }
        }
        let header = Header {
            cursor: self.cursor,
            seed: self.seed,
            adamw_step: self.adamw.step,
            adamw: self.adamw.config,
            lora: self.adapter.config.to_json(),
            history: self.history.clone(),
            fingerprint: self.fingerprint.clone(),
            modules: self.adapter.modules.iter().map(|m| m.name.clone()).collect(),
        };
        write_commit_borrowed(dir, "hexlora_train_state", tensors, BTreeMap::new(), &header)
    }

    /// Reads the last commit of a run directory, if there is one.
    pub fn load(dir: &Path) -> Result<Option<TrainState>> {
        let Some((f, header, what)) = read_commit::<Header>(dir, "hexlora_train_state", "not a hexlora commit (no train state)")? else {
            return Ok(None);
        };
        let config = LoraConfig::from_json(&header.lora, &what)?;
        let (mut modules, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for name in &header.modules {
            let get = |prefix: &str, which: &str| f.get(&format!("{prefix}/{}", peft_key(name, which)), &what).cloned();
            modules.push(crate::lora::LoraModule { name: name.clone(), a: get("adapter", "A")?, b: get("adapter", "B")? });
            m.extend([get("adam_m", "A")?, get("adam_m", "B")?]);
            v.extend([get("adam_v", "A")?, get("adam_v", "B")?]);
        }
        Ok(Some(TrainState {
            adapter: Adapter { config, modules },
            adamw: AdamW { config: header.adamw, step: header.adamw_step, m, v },
            cursor: header.cursor,
            seed: header.seed,
            history: header.history,
            fingerprint: header.fingerprint,
        }))
    }
}

impl super::learner::Record for StepRecord {
    fn loss(&self) -> f32 {
        self.loss
    }
    fn progress(&self) -> String {
        format!("loss {:.4}  {:.0} tok/s", self.loss, self.tokens as f64 / self.seconds.max(1e-9))
    }
}

super::learner::adapter_run_checkpointed!(TrainState, |s| s.adamw.step);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    #[test]
    fn commit_round_trips_bit_exactly() {
        let info = ProjectionInfo { name: "model.layers.0.self_attn.q_proj".into(), kind: ProjectionKind::Attention, out_features: 4, in_features: 3 };
        let config = LoraConfig { r: 2, alpha: 4.0, target_modules: vec!["q_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() };
        let adapter = Adapter::init(config, &[info], 1).unwrap();
        let params: Vec<_> = adapter.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
        let mut adamw = AdamW::new(AdamWConfig::default(), &params);
        adamw.step = 3;
        adamw.m[0].data[1] = 0.1 + 0.2; // a value with a long decimal form
        let record = StepRecord { step: 3, loss: 1.0 / 3.0, lr: 1e-4, grad_norm: 0.7, tokens: 9, seconds: 0.5 };
        let state = TrainState { adapter, adamw, cursor: 17, seed: 5, history: vec![record], fingerprint: "abc".into() };
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(TrainState::load(dir.path()).unwrap(), None);
        state.commit(dir.path()).unwrap();
        let back = TrainState::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, state);
        assert_eq!(back.history[0].loss.to_bits(), (1.0f32 / 3.0).to_bits());
        std::fs::write(dir.path().join(COMMIT_FILE), b"garbage").unwrap();
        assert!(TrainState::load(dir.path()).is_err());
    }
}

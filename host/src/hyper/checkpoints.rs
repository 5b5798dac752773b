//! Which hypernetwork a run keeps: the held-out loss of the dev users
//! checked as the run goes, the best network so far and, on request, every
//! checked one (`hexlora hypertrain --dev-every --keep-dev-checkpoints`).
use super::commit::HyperState;
use super::heldout::HeldOutSet;
use super::trainer::HyperTrainConfig;
use super::users::UserRecord;
use super::HyperNet;
use crate::base::atomic_write::write_atomic;
use crate::base::counter_rng;
use crate::lora::Adapter;
use crate::autograd::graph::TrainableModel;
use crate::train::learner::StepHooks;
use crate::train::text_encoder::ModelText;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// When the hook checks and what it keeps.
#[derive(Clone, Copy, Debug)]
pub struct Keep {
    /// Continue the records of a resumed run.
    pub resume: bool,
    /// Keep every checked network too, in `hypernet-step<N>/`.
    pub every_check: bool,
    /// Check every this many steps (and at the last step).
    pub check_every: u64,
    /// The run's last step.
    pub total: u64,
}

/// The hypernetwork's checkpoint choice, a hook of the one loop: every
/// `check_every` steps the held-out users' loss, appended to
/// `heldout.jsonl`; the network of the lowest loss so far kept in
/// `hypernet-best/` (with `best.json`: its step and loss), the checkpoint
/// chosen on the dev users; with `every_check`, each checked network also
/// in `hypernet-step<N>/`, so checkpoints can be scored on a task's metric.
pub struct DevCheckpoints<'a> {
    model: &'a dyn TrainableModel,
    set: HeldOutSet,
    path: PathBuf,
    best_dir: PathBuf,
    best: Option<f64>,
    keep: Keep,
}

impl<'a> DevCheckpoints<'a> {
    /// Fixes the held-out examples of `dev`, and on a fresh run records the
    /// common LoRA's loss and the untrained network's (at `step`).
    #[allow(clippy::too_many_arguments)]
    pub fn start(model: &'a dyn TrainableModel, text: &ModelText, fresh: &HyperNet, dev: &[UserRecord], common: Option<&Adapter>, train: &HyperTrainConfig, out: &Path, keep: Keep, step: u64) -> Result<Self> {
        let set = HeldOutSet::new(text, fresh, dev, counter_rng::derive(train.seed, 0x6465_76), train.target_examples, train.max_len)?;
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        let best_dir = out.join(BEST_DIR);
        let best = if keep.resume { best_so_far(&best_dir)? } else { None };
        let mut h = DevCheckpoints { model, set, path: out.join("heldout.jsonl"), best_dir, best, keep };
        if !keep.resume {
            let common_loss = common.map(|c| h.set.adapter_loss(model, c)).transpose()?;
            let line = serde_json::json!({"common_lora": common_loss, "users": h.set.users.len(), "tokens": h.set.tokens()});
            std::fs::write(&h.path, format!("{line}\n")).map_err(|e| Error::io(&h.path, e))?;
            h.record(fresh, step)?;
        }
        Ok(h)
    }

    fn record(&mut self, net: &HyperNet, step: u64) -> Result<()> {
        use std::io::Write;
        let loss = self.set.hypernet_loss(self.model, net)?;
        if self.best.is_none_or(|b| loss < b) {
            keep_network(net, &self.best_dir, BEST_RECORD, step, loss)?;
            self.best = Some(loss);
        }
        if self.keep.every_check {
            let dir = self.best_dir.with_file_name(format!("hypernet-step{step}"));
            keep_network(net, &dir, CHECKPOINT_RECORD, step, loss)?;
        }
        let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        writeln!(f, "{}", serde_json::json!({"step": step, "hypernet": loss})).map_err(|e| Error::io(&self.path, e))?;
        eprintln!("held-out loss at step {step}: {loss:.4}");
        Ok(())
    }
}

impl StepHooks<HyperState> for DevCheckpoints<'_> {
    fn after_step(&mut self, state: &HyperState) -> Result<()> {
        if state.step % self.keep.check_every == 0 || state.step == self.keep.total {
            self.record(&state.net, state.step)?;
        }
        Ok(())
    }
}

/// The record (step, held-out loss) beside the dev-chosen network.
pub const BEST_RECORD: &str = "best.json";
/// The record beside each checked network (`hypernet-step<N>/`).
pub const CHECKPOINT_RECORD: &str = "checkpoint.json";

/// Where the dev-chosen network is kept, beside `hypernet/` (the last step's).
pub const BEST_DIR: &str = "hypernet-best";

/// Replaces `dir` with `net` at `step` (and `info`: its step and
/// held-out loss): written whole into a sibling directory first, so a crash
/// leaves the previous network or the new one.
fn keep_network(net: &HyperNet, dir: &Path, info: &str, step: u64, loss: f64) -> Result<()> {
    let tmp = dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    net.save(&tmp)?;
    let json = serde_json::json!({"step": step, "heldout_loss": loss});
    write_atomic(&tmp.join(info), format!("{json}\n").as_bytes())?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))
}

/// The held-out loss of the kept best network on resume (a crash between
/// the two steps of [`keep_network`] leaves it complete in the sibling).
fn best_so_far(best_dir: &Path) -> Result<Option<f64>> {
    let tmp = best_dir.with_extension("tmp");
    if !best_dir.exists() && tmp.join(BEST_RECORD).exists() {
        std::fs::rename(&tmp, best_dir).map_err(|e| Error::io(best_dir, e))?;
    }
    let path = best_dir.join(BEST_RECORD);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::invalid(path.display().to_string(), e.to_string()))?;
    Ok(v["heldout_loss"].as_f64())
}

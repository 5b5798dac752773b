//! A user's adapter versions: `versions/000001/` ... in the user's
//! directory, each a PEFT `adapter/` and a `version.json` saying where it
//! came from and how it fared at the gate, and a `live` file naming the
//! version that answers. A version directory is complete before it gets
//! its name (built under a temporary name, then renamed), and `live` is
//! replaced atomically, so a kill at any moment leaves the last live
//! version live and every named version whole.
use crate::lora::Adapter;
use crate::base::atomic_write::write_atomic;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Folder of the versions in a user's directory.
pub const VERSIONS_DIR: &str = "versions";
/// File naming the live version.
pub const LIVE_FILE: &str = "live";
const META_FILE: &str = "version.json";

/// What a learning round trained on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trained {
    /// Ids of the examples trained on (first and last).
    pub from_id: u64,
    /// The last id this round consumed: later rounds train on the ids above it.
    pub through_id: u64,
    /// How many examples.
    pub examples: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Mean training loss of the last step.
    pub last_loss: f32,
}

/// The gate's figures: mean token loss on the held-out examples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heldout {
    /// Ids of the held-out examples.
    pub ids: Vec<u64>,
    /// Loss with the adapter that was live.
    pub live_loss: f32,
    /// Loss with the candidate.
    pub candidate_loss: f32,
}

/// One version's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Version {
    /// Its number (1, 2, ...).
    pub version: u64,
    /// The version it was trained from.
    pub parent: Option<u64>,
    /// Unix seconds.
    pub created: u64,
    /// `fresh`, `adapter` (registered from a file) or `learned`.
    pub origin: String,
    /// For learned versions.
    pub trained: Option<Trained>,
    /// For learned versions.
    pub heldout: Option<Heldout>,
    /// Whether it passed the gate (versions not learned pass by definition).
    pub accepted: bool,
    /// Why it was accepted or kept aside.
    pub reason: String,
}

/// The versions of one user, keeping the newest `keep` (and the live one).
pub struct Versions {
    dir: PathBuf,
    keep: usize,
}

impl Versions {
    /// The versions under `user_dir`; removes what a killed
    /// [`Versions::add`] left half-built.
    pub fn open(user_dir: &Path, keep: usize) -> Result<Versions> {
        let dir = user_dir.join(VERSIONS_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(Versions { dir, keep: keep.max(1) })
    }

    /// Every version, oldest first.
    pub fn list(&self) -> Result<Vec<Version>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.parse::<u64>().is_err() {
                continue;
            }
            let meta = entry.path().join(META_FILE);
            let text = std::fs::read_to_string(&meta).map_err(|e| Error::io(&meta, e))?;
            out.push(serde_json::from_str::<Version>(&text).map_err(|e| Error::format(meta.display().to_string(), e.to_string()))?);
        }
        out.sort_by_key(|v| v.version);
        Ok(out)
    }

    /// The live version's number, if any.
    pub fn live(&self) -> Result<Option<u64>> {
        let path = self.live_path();
        match std::fs::read_to_string(&path) {
            Ok(t) => t.trim().parse().map(Some).map_err(|_| Error::format(path.display().to_string(), format!("{:?} is not a version number", t.trim()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    /// The live version's adapter directory.
    pub fn live_adapter(&self) -> Result<PathBuf> {
        let v = self.live()?.ok_or_else(|| Error::invalid(self.dir.display().to_string(), "no live version"))?;
        Ok(self.adapter_dir(v))
    }

    /// Where version `v`'s adapter is.
    pub fn adapter_dir(&self, v: u64) -> PathBuf {
        self.dir.join(format!("{v:06}")).join("adapter")
    }

    /// The last example id any round consumed (0: none).
    pub fn seen_through(&self) -> Result<u64> {
        Ok(self.list()?.iter().filter_map(|v| v.trained.as_ref().map(|t| t.through_id)).max().unwrap_or(0))
    }

    /// The number the next version gets.
    pub fn next_number(&self) -> Result<u64> {
        Ok(self.list()?.last().map_or(1, |v| v.version + 1))
    }

    /// Writes `meta` and `adapter` as version `meta.version`, whole or not
    /// at all. Does not make it live.
    pub fn add(&self, meta: &Version, adapter: &Adapter) -> Result<()> {
        let name = format!("{:06}", meta.version);
        let (tmp, done) = (self.dir.join(format!(".tmp-{name}")), self.dir.join(&name));
        if done.exists() {
            return Err(Error::invalid(done.display().to_string(), "version exists"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        adapter.save(&tmp.join("adapter"))?;
        let json = serde_json::to_string_pretty(meta).expect("serialises");
        write_atomic(&tmp.join(META_FILE), json.as_bytes())?;
        std::fs::rename(&tmp, &done).map_err(|e| Error::io(&done, e))?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(&self.dir, e))?;
        self.prune()
    }

    /// Makes version `v` the live one (atomically).
    pub fn set_live(&self, v: u64) -> Result<()> {
        if !self.adapter_dir(v).is_dir() {
            return Err(Error::invalid("version", format!("{v} does not exist")));
        }
        write_atomic(&self.live_path(), format!("{v}\n").as_bytes())
    }

    /// Goes back one: the newest accepted version older than the live one
    /// becomes live. Returns (from, to).
    pub fn rollback(&self) -> Result<(u64, u64)> {
        let live = self.live()?.ok_or_else(|| Error::invalid("rollback", "no live version"))?;
        let to = self.list()?.iter().rev().find(|v| v.version < live && v.accepted).map(|v| v.version);
        let to = to.ok_or_else(|| Error::invalid("rollback", format!("version {live} is the oldest accepted version kept")))?;
        self.set_live(to)?;
        Ok((live, to))
    }

    fn live_path(&self) -> PathBuf {
        self.dir.parent().unwrap_or(Path::new(".")).join(LIVE_FILE)
    }

    /// Removes the oldest versions beyond `keep`, never the live one nor
    /// the newest (just added, perhaps about to go live).
    fn prune(&self) -> Result<()> {
        let live = self.live()?;
        let all = self.list()?;
        let newest = all.last().map(|v| v.version);
        let excess = all.len().saturating_sub(self.keep);
        for v in all.iter().filter(|v| Some(v.version) != live && Some(v.version) != newest).take(excess) {
            let d = self.dir.join(format!("{:06}", v.version));
            std::fs::remove_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        }
        Ok(())
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::LoraConfig;
    use crate::projection::{ProjectionInfo, ProjectionKind};

    fn adapter(seed: u64) -> Adapter {
        let config = LoraConfig { r: 2, alpha: 4.0, target_modules: vec!["q_proj".into()], dropout: 0.0, use_rslora: false, base_model: "m".into() };
        let p = ProjectionInfo { name: "model.layers.0.self_attn.q_proj".into(), kind: ProjectionKind::Attention, out_features: 8, in_features: 8 };
        Adapter::init(config, &[p], seed).unwrap()
    }

    fn meta(version: u64, accepted: bool) -> Version {
        Version { version, parent: version.checked_sub(1), created: 0, origin: "learned".into(), trained: None, heldout: None, accepted, reason: String::new() }
    }

    #[test]
    fn live_rollback_and_pruning_keep_what_answers() {
        let dir = tempfile::tempdir().unwrap();
        let v = Versions::open(dir.path(), 3).unwrap();
        assert_eq!(v.live().unwrap(), None);
        for n in 1..=3 {
            v.add(&meta(n, n != 2), &adapter(n)).unwrap();
        }
        v.set_live(3).unwrap();
        // 2 was kept aside: one back from 3 is 1.
        assert_eq!(v.rollback().unwrap(), (3, 1));
        assert_eq!(Adapter::load(&v.live_adapter().unwrap()).unwrap(), adapter(1));
        assert!(v.rollback().is_err(), "nothing accepted is older than 1");
        // Beyond keep = 3 the oldest go, but never the live one (1) nor the newest.
        v.add(&meta(4, true), &adapter(4)).unwrap();
        v.add(&meta(5, true), &adapter(5)).unwrap();
        let kept: Vec<u64> = v.list().unwrap().iter().map(|m| m.version).collect();
        assert_eq!(kept, [1, 4, 5]);
        assert_eq!(v.next_number().unwrap(), 6);
        assert!(v.set_live(2).is_err(), "a pruned version cannot go live");
    }

    #[test]
    fn a_half_built_version_is_never_listed_and_is_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let v = Versions::open(dir.path(), 5).unwrap();
        v.add(&meta(1, true), &adapter(1)).unwrap();
        // What a kill during `add` leaves: the temporary directory.
        let tmp = dir.path().join(VERSIONS_DIR).join(".tmp-000002");
        adapter(2).save(&tmp.join("adapter")).unwrap();
        assert_eq!(v.list().unwrap().len(), 1);
        let v = Versions::open(dir.path(), 5).unwrap();
        assert!(!tmp.exists());
        assert_eq!(v.next_number().unwrap(), 2);
        v.add(&meta(2, true), &adapter(2)).unwrap();
        assert!(v.add(&meta(2, true), &adapter(2)).is_err(), "a version is written once");
    }
}

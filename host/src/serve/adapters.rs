//! The adapters a server answers with, by name: loaded and prepared once
//! against the resident model, added and removed while it runs. A request
//! holds its adapter through an `Arc`, so removing one never disturbs an
//! answer in progress.
use crate::lora::slots::PreparedAdapter;
use crate::lora::Adapter;
use crate::model::assistant::Assistant;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// One registered adapter.
pub struct Entry {
    /// Where it was read from.
    pub path: PathBuf,
    /// LoRA rank.
    pub rank: usize,
    /// Factors ready to install.
    pub prepared: Arc<PreparedAdapter>,
}

/// Name -> adapter.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<BTreeMap<String, Arc<Entry>>>,
}

/// Adapter names are plain identifiers (so never a path like `..`), and
/// never the base model's id.
pub fn check_name(name: &str, base: &str) -> Result<()> {
    let ok = name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
    if !ok {
        return Err(Error::invalid("adapter name", format!("{name:?} (1-128 of A-Z a-z 0-9 _ -, starting with a letter or digit)")));
    }
    if name == base {
        return Err(Error::invalid("adapter name", format!("{name:?} is the base model's id")));
    }
    Ok(())
}

/// Largest `|scale|` an adapter may be installed with: beyond it the
/// adapter's delta swamps the base weights and answers degrade to noise or
/// overflow (a scale of 1e30 made every later request fail).
pub const MAX_SCALE: f32 = 16.0;

/// `scale` is finite and at most [`MAX_SCALE`] in size.
pub fn check_scale(scale: f32) -> Result<()> {
    if !(scale.is_finite() && scale.abs() <= MAX_SCALE) {
        return Err(Error::invalid("scale", format!("{scale} (finite, -{MAX_SCALE} to {MAX_SCALE})")));
    }
    Ok(())
}

/// `path` resolved against `dir` (canonical) if it names something inside
/// it. Every refusal is the same error, so a caller learns nothing about
/// files outside `dir` (or whether a name inside it exists).
pub fn inside(dir: &Path, path: &Path) -> Result<PathBuf> {
    let refused = || Error::invalid("path", format!("{} is not an adapter inside --adapter-dir", path.display()));
    let resolved = dir.join(path).canonicalize().map_err(|_| refused())?;
    if resolved == dir || !resolved.starts_with(dir) {
        return Err(refused());
    }
    Ok(resolved)
}

/// Reads and prepares the adapter at `path` for `assistant`.
pub fn load(assistant: &Assistant, path: &Path, scale: f32) -> Result<Entry> {
    let adapter = Adapter::open(path, &assistant.model.config)?;
    let prepared = assistant.prepare(&adapter, scale)?;
    Ok(Entry { path: path.to_path_buf(), rank: adapter.config.r, prepared: Arc::new(prepared) })
}

impl Registry {
    /// The adapter called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.entries.read().expect("registry lock").get(name).cloned()
    }

    /// Adds `entry` as `name`; false if the name is taken.
    pub fn insert(&self, name: &str, entry: Entry) -> bool {
        let mut map = self.entries.write().expect("registry lock");
        if map.contains_key(name) {
            return false;
        }
        map.insert(name.to_string(), Arc::new(entry));
        true
    }

    /// Puts `entry` under `name`, replacing what was there: requests that
    /// hold the old one finish on it, later ones get the new one.
    pub fn replace(&self, name: &str, entry: Entry) {
        self.entries.write().expect("registry lock").insert(name.to_string(), Arc::new(entry));
    }

    /// Removes `name`; false if there was none.
    pub fn remove(&self, name: &str) -> bool {
        self.entries.write().expect("registry lock").remove(name).is_some()
    }

    /// Names and entries in name order.
    pub fn list(&self) -> Vec<(String, Arc<Entry>)> {
        self.entries.read().expect("registry lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

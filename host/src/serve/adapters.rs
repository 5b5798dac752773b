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

/// Adapter names are path- and URL-safe and never the base model's.
pub fn check_name(name: &str, base: &str) -> Result<()> {
    let ok = !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(Error::invalid("adapter name", format!("{name:?} (1-128 of A-Z a-z 0-9 . _ -)")));
    }
    if name == base {
        return Err(Error::invalid("adapter name", format!("{name:?} is the base model's id")));
    }
    Ok(())
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

    /// Removes `name`; false if there was none.
    pub fn remove(&self, name: &str) -> bool {
        self.entries.write().expect("registry lock").remove(name).is_some()
    }

    /// Names and entries in name order.
    pub fn list(&self) -> Vec<(String, Arc<Entry>)> {
        self.entries.read().expect("registry lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

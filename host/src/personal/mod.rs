//! The personal loop without HTTP: a user's approved examples
//! ([`store`]), their adapter versions with the live one ([`versions`]),
//! and a learning round ([`round`]) that trains the live adapter on the
//! examples it has not seen and lets the result go live only through the
//! [`gate`]. `hexlora serve --learn` drives it from a thread of the
//! serving process; a phone app can drive it as a library.
//!
//! A user's directory:
//! ```text
//! NAME/feedback.jsonl        approved examples, {"id", "example"} per line
//! NAME/versions/000001/      adapter/ (PEFT) + version.json
//! NAME/live                  the live version's number
//! NAME/round/                the round in progress: round.json + its commits
//! ```
pub mod gate;
pub mod round;
pub mod store;
pub mod versions;

use crate::lora::Adapter;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use store::Store;
use versions::{unix_now, Version, Versions};

/// Bounds of one user's directory.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Examples kept per user (the oldest are dropped beyond it).
    pub max_examples: usize,
    /// Versions kept per user (the live one always).
    pub keep: usize,
}

/// One user's examples and versions. Shared between the server's
/// handlers and its learner: the store is behind a lock held only for an
/// append or a read, version changes (a round's end, a rollback) behind
/// another.
pub struct User {
    /// The user's directory.
    pub dir: PathBuf,
    store: Mutex<Store>,
    /// Adapter versions.
    pub versions: Versions,
    changes: Mutex<()>,
}

impl User {
    /// Opens the user in `dir`, which must have a live version.
    pub fn open(dir: &Path, limits: Limits) -> Result<User> {
        let versions = Versions::open(dir, limits.keep)?;
        if versions.live()?.is_none() {
            return Err(Error::invalid(dir.display().to_string(), "holds no live adapter version (a user starts with one)"));
        }
        Ok(User { dir: dir.to_path_buf(), store: Mutex::new(Store::open(dir, limits.max_examples)?), versions, changes: Mutex::new(()) })
    }

    /// Starts a user in `dir` (which must not hold one) with `adapter` as
    /// live version 1; `origin` says where it came from (`fresh`, `adapter`).
    pub fn create(dir: &Path, adapter: &Adapter, origin: &str, limits: Limits) -> Result<User> {
        let versions = Versions::open(dir, limits.keep)?;
        if versions.live()?.is_some() || !versions.list()?.is_empty() {
            return Err(Error::invalid(dir.display().to_string(), "already holds a user"));
        }
        let meta = Version {
            version: 1,
            parent: None,
            created: unix_now(),
            origin: origin.into(),
            trained: None,
            heldout: None,
            accepted: true,
            reason: format!("the user's first adapter ({origin})"),
        };
        versions.add(&meta, adapter)?;
        versions.set_live(1)?;
        User::open(dir, limits)
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores an approved example (checked by the caller) durably.
    pub fn append(&self, example: serde_json::Value) -> Result<store::Appended> {
        self.store().append(example)
    }

    /// Examples held.
    pub fn stored(&self) -> usize {
        self.store().items().len()
    }

    /// Examples no round has consumed yet, oldest first.
    pub fn unseen(&self) -> Result<Vec<store::Stored>> {
        let seen = self.versions.seen_through()?;
        Ok(self.store().after(seen).to_vec())
    }

    /// Runs `f` with version changes held off.
    pub fn changing<T>(&self, f: impl FnOnce(&Versions) -> Result<T>) -> Result<T> {
        let _held = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        f(&self.versions)
    }
}

/// Kill -9 tests reach exact moments this way: when `HEXLORA_KILL_AT`
/// names `point`, the process sends itself SIGKILL here (unset, it costs
/// one environment lookup). Points: `round-started`, `version-written`,
/// `live-set`, `feedback-stored`.
pub fn kill_point(point: &str) {
    if std::env::var_os("HEXLORA_KILL_AT").is_some_and(|v| v == point) {
        // SAFETY: raise has no preconditions; SIGKILL ends the process here.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// The users under `dir`: every subdirectory with a live version.
pub fn user_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
        if entry.path().join(versions::LIVE_FILE).is_file() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

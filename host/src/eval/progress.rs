//! Per-user progress of an evaluation sweep, so that a long run (per-user
//! training of dozens of users at real budgets takes hours) resumes where it
//! stopped instead of starting over.
//!
//! One JSON line per finished user, appended and synced before the next
//! user starts: the user's result under every decoding of the sweep and the
//! seconds each cost. Every line carries the sweep's fingerprint (method,
//! its configuration, task, split, users and decodings); a resume with
//! other settings is refused. A crash while a line is written leaves a torn
//! last line, which is dropped (that user runs again); a torn line
//! anywhere else means the file was damaged, and is an error.
use super::result::UserResult;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One finished user.
#[derive(Serialize, Deserialize)]
struct Line {
    fingerprint: String,
    user: String,
    /// One per decoding of the sweep, in its order.
    results: Vec<UserResult>,
    /// Seconds per decoding (the user's preparation counted in each).
    seconds: Vec<f64>,
}

/// The progress file of one sweep.
pub struct Progress {
    path: PathBuf,
    fingerprint: String,
    done: HashMap<String, (Vec<UserResult>, Vec<f64>)>,
    /// Users the file holds: those read at resume and those recorded since.
    in_file: usize,
}

impl Progress {
    /// A new progress file at `path` (an old one is replaced).
    pub fn start(path: &Path, fingerprint: String) -> Result<Self> {
        std::fs::write(path, b"").map_err(|e| Error::io(path, e))?;
        Ok(Progress { path: path.to_path_buf(), fingerprint, done: HashMap::new(), in_file: 0 })
    }

    /// The users `path` records as done; every line must carry `fingerprint`.
    pub fn resume(path: &Path, fingerprint: String) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut done = HashMap::new();
        for (i, l) in lines.iter().enumerate() {
            let line: Line = match serde_json::from_str(l) {
                Ok(line) => line,
                // a torn last line: the user it was for runs again
                Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
                Err(e) => return Err(Error::format(&format!("{}:{}", path.display(), i + 1), e.to_string())),
            };
            if line.fingerprint != fingerprint {
                return Err(Error::invalid(
                    format!("--resume {}", path.display()),
                    format!("line {} was written by a run with other settings (method, configuration, split, users or temperatures); resume with the same command, or pass --force to start over", i + 1),
                ));
            }
            done.insert(line.user, (line.results, line.seconds));
        }
        let in_file = done.len();
        Ok(Progress { path: path.to_path_buf(), fingerprint, done, in_file })
    }

    /// Users done before this run and not yet taken up by it.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Users the file holds: every user finished so far, in this run or
    /// before it (what a stop reports).
    pub fn finished(&self) -> usize {
        self.in_file
    }

    /// Whether no user is done yet.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// Whether `user` is done.
    pub fn has(&self, user: &str) -> bool {
        self.done.contains_key(user)
    }

    /// `user`'s recorded results and seconds, per decoding.
    pub fn take(&mut self, user: &str) -> Option<(Vec<UserResult>, Vec<f64>)> {
        self.done.remove(user)
    }

    /// Appends `user`'s results and syncs them to disk.
    pub fn record(&mut self, user: &str, results: &[UserResult], seconds: &[f64]) -> Result<()> {
        let line = Line { fingerprint: self.fingerprint.clone(), user: user.to_string(), results: results.to_vec(), seconds: seconds.to_vec() };
        let mut text = serde_json::to_string(&line).map_err(|e| Error::format(&self.path.display().to_string(), e.to_string()))?;
        text.push('\n');
        let mut f = std::fs::OpenOptions::new().append(true).open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        f.write_all(text.as_bytes()).and_then(|_| f.sync_data()).map_err(|e| Error::io(&self.path, e))?;
        self.in_file += 1;
        Ok(())
    }

    /// The file, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

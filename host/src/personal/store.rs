//! A user's approved examples: `feedback.jsonl` in the user's directory,
//! one `{"id": N, "example": {...}}` line per example, where `example` is
//! a training JSONL line (chat messages ending with the approved answer,
//! or prompt/completion). Ids only grow, so "the examples after id N"
//! stays meaningful when the oldest are dropped to keep the bound.
//!
//! Crash safety: an append is one `write` of a whole line followed by
//! `fdatasync`; a rewrite (dropping the oldest) is an atomic replace. A
//! kill during an append can leave a torn last line without its newline:
//! [`Store::open`] cuts it off (that example was never acknowledged), and
//! a damaged line anywhere else is an error naming the file and line.
use crate::base::atomic_write::write_atomic;
use crate::{Error, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The store's file in a user's directory.
pub const FEEDBACK_FILE: &str = "feedback.jsonl";

/// One stored example.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// Its id: one more than the one before, never reused.
    pub id: u64,
    /// The training line as it was given.
    pub example: Value,
}

/// What an append did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Appended {
    /// The new example's id.
    pub id: u64,
    /// Examples held after it.
    pub stored: usize,
    /// Oldest examples dropped to stay within the bound.
    pub dropped: usize,
}

/// A user's examples, at most `max` of them.
pub struct Store {
    path: PathBuf,
    max: usize,
    items: Vec<Stored>,
}

impl Store {
    /// Opens (or starts) the store in `dir`, holding at most `max` examples.
    pub fn open(dir: &Path, max: usize) -> Result<Store> {
        let path = dir.join(FEEDBACK_FILE);
        let items = match std::fs::read(&path) {
            Ok(bytes) => read_lines(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(Error::io(&path, e)),
        };
        Ok(Store { path, max: max.max(1), items })
    }

    /// Every example held, oldest first.
    pub fn items(&self) -> &[Stored] {
        &self.items
    }

    /// The examples whose id is above `id`, oldest first.
    pub fn after(&self, id: u64) -> &[Stored] {
        let from = self.items.partition_point(|s| s.id <= id);
        &self.items[from..]
    }

    /// Stores `example` (already checked by the caller) durably; drops
    /// the oldest examples beyond the bound.
    pub fn append(&mut self, example: Value) -> Result<Appended> {
        let id = self.items.last().map_or(1, |s| s.id + 1);
        self.items.push(Stored { id, example });
        let dropped = self.items.len().saturating_sub(self.max);
        let written = if dropped > 0 {
            self.items.drain(..dropped);
            self.rewrite()
        } else {
            self.append_line(self.items.last().expect("just pushed"))
        };
        if let Err(e) = written {
            // Not acknowledged, so not held: the file may hold it (a torn
            // line is cut at the next open), memory must not.
            self.items = Store::open(self.path.parent().unwrap_or(Path::new(".")), self.max).map(|s| s.items).unwrap_or_default();
            return Err(e);
        }
        Ok(Appended { id, stored: self.items.len(), dropped })
    }

    fn append_line(&self, item: &Stored) -> Result<()> {
        let io = |e| Error::io(&self.path, e);
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).map_err(io)?;
        f.write_all(line(item).as_bytes()).map_err(io)?;
        f.sync_data().map_err(io)
    }

    fn rewrite(&self) -> Result<()> {
        let text: String = self.items.iter().map(line).collect();
        write_atomic(&self.path, text.as_bytes())
    }
}

fn line(item: &Stored) -> String {
    format!("{}\n", json!({"id": item.id, "example": item.example}))
}

/// Parses the file; a last line without its newline is a torn append and
/// is cut from the file.
fn read_lines(path: &Path, bytes: &[u8]) -> Result<Vec<Stored>> {
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| Error::io(path, e))?;
        f.set_len(complete as u64).and_then(|_| f.sync_data()).map_err(|e| Error::io(path, e))?;
    }
    let text = std::str::from_utf8(&bytes[..complete]).map_err(|e| Error::format(path.display().to_string(), format!("not UTF-8: {e}")))?;
    let mut items: Vec<Stored> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let what = || format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(raw).map_err(|e| Error::format(what(), e.to_string()))?;
        let id = v.get("id").and_then(Value::as_u64).ok_or_else(|| Error::format(what(), "no integer \"id\""))?;
        let example = v.get("example").filter(|e| e.is_object()).cloned().ok_or_else(|| Error::format(what(), "no \"example\" object"))?;
        if items.last().is_some_and(|p| p.id >= id) {
            return Err(Error::format(what(), format!("id {id} does not follow {}", items.last().expect("checked").id)));
        }
        items.push(Stored { id, example });
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(n: u64) -> Value {
        json!({"prompt": format!("q{n}"), "completion": format!("a{n}")})
    }

    #[test]
    fn appends_survive_reopening_and_the_bound_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path(), 3).unwrap();
        for n in 1..=3 {
            assert_eq!(s.append(ex(n)).unwrap(), Appended { id: n, stored: n as usize, dropped: 0 });
        }
        assert_eq!(s.append(ex(4)).unwrap(), Appended { id: 4, stored: 3, dropped: 1 });
        let s = Store::open(dir.path(), 3).unwrap();
        assert_eq!(s.items().iter().map(|i| i.id).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(s.items()[2].example, ex(4));
        assert_eq!(s.after(2).len(), 2);
        assert_eq!(s.after(0).len(), 3);
        assert_eq!(s.after(4).len(), 0);
    }

    #[test]
    fn a_torn_last_line_is_cut_and_a_damaged_one_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path(), 10).unwrap();
        s.append(ex(1)).unwrap();
        let path = dir.path().join(FEEDBACK_FILE);
        let whole = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{whole}{{\"id\": 2, \"exa")).unwrap();
        let mut s = Store::open(dir.path(), 10).unwrap();
        assert_eq!(s.items().len(), 1);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), whole, "the torn line is cut from the file");
        assert_eq!(s.append(ex(2)).unwrap().id, 2);
        std::fs::write(&path, format!("{whole}not json\n")).unwrap();
        let e = Store::open(dir.path(), 10).err().unwrap().to_string();
        assert!(e.contains("feedback.jsonl:2"), "{e}");
    }
}

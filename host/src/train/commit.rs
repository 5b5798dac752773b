//! Commits at optimizer-step boundaries: the adapter, AdamW moments, step,
//! data cursor, RNG seed and the loss history, in one safetensors file
//! replaced atomically (`commit.safetensors`). A run killed at any instant
//! resumes from the last commit and reproduces the uninterrupted run bit for
//! bit (the RNG is counter-based, so the seed plus the step is its state).
//!
//! Every commit carries a CRC32 of each tensor (over its shape and values)
//! and of each header field, and the one before it is kept
//! (`commit.prev.safetensors`). A commit that fails its checksums is never
//! trained on: when the previous one holds, the run resumes from it with a
//! warning naming the damaged tensor or field (the step after it is redone,
//! to the same bits, since the run is deterministic) and keeps the damaged
//! file as `commit.corrupt.safetensors`; otherwise it refuses, naming both.
use crate::lora::peft::peft_key;
use crate::base::tensor_file::{write_tensors_atomic, TensorFile};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use crate::lora::{Adapter, LoraConfig};
use crate::optim::adamw::{AdamW, AdamWConfig};
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File name of the commit inside the run directory.
pub const COMMIT_FILE: &str = "commit.safetensors";
/// The commit before the last one, kept to resume from when the last is damaged.
pub const PREVIOUS_COMMIT_FILE: &str = "commit.prev.safetensors";
/// Where a damaged commit is moved when the run falls back to the previous one.
pub const CORRUPT_COMMIT_FILE: &str = "commit.corrupt.safetensors";
/// Metadata key of the checksums (`{"tensors": {name: crc}, "fields": {key: crc}}`).
const CHECKSUMS_KEY: &str = "hexlora_crc32";

/// Whether `dir` holds a commit (the last one, or only the one before it
/// after a fall-back that a kill interrupted).
pub fn has_commit(dir: &Path) -> bool {
    dir.join(COMMIT_FILE).exists() || dir.join(PREVIOUS_COMMIT_FILE).exists()
}

/// CRC32 of each tensor and each metadata field of a commit. crc32fast
/// (the CRC of zlib and PNG) is already in the dependency tree through the
/// PNG encoder, maintained, and runs on PCLMULQDQ / ARMv8 CRC instructions:
/// a 56 MiB SmolLM2 commit is summed in milliseconds.
#[derive(Serialize, Deserialize)]
struct Checksums {
    tensors: BTreeMap<String, u32>,
    fields: BTreeMap<String, u32>,
}

/// CRC32 over a tensor's shape (u64 LE each) and values (f32 LE), so a
/// reshaped tensor fails as well as a changed value.
fn tensor_crc(t: &Tensor) -> u32 {
    let mut h = crc32fast::Hasher::new();
    t.shape.iter().for_each(|&d| h.update(&(d as u64).to_le_bytes()));
    if cfg!(target_endian = "little") {
        // SAFETY: f32 has no padding and any byte view of it is valid.
        h.update(unsafe { std::slice::from_raw_parts(t.data.as_ptr().cast::<u8>(), 4 * t.data.len()) });
    } else {
        t.data.iter().for_each(|v| h.update(&v.to_le_bytes()));
    }
    h.finalize()
}

impl Checksums {
    fn of<'a>(tensors: impl IntoIterator<Item = (&'a String, &'a Tensor)>, metadata: &BTreeMap<String, String>) -> Checksums {
        Checksums {
            tensors: tensors.into_iter().map(|(k, t)| (k.clone(), tensor_crc(t))).collect(),
            fields: metadata.iter().filter(|(k, _)| *k != CHECKSUMS_KEY).map(|(k, v)| (k.clone(), crc32fast::hash(v.as_bytes()))).collect(),
        }
    }

    /// The first tensor or field of `f` that differs from these sums (or
    /// is missing, or has none), named.
    fn verify(&self, f: &TensorFile) -> std::result::Result<(), String> {
        let now = Checksums::of(&f.tensors, &f.metadata);
        for (kind, want, got) in [("tensor", &self.tensors, &now.tensors), ("header field", &self.fields, &now.fields)] {
            for (name, crc) in got {
                match want.get(name) {
                    None => return Err(format!("{kind} {name} has no checksum")),
                    Some(w) if w != crc => return Err(format!("{kind} {name} does not match its checksum (crc32 {crc:08x}, committed {w:08x})")),
                    Some(_) => {}
                }
            }
            if let Some(name) = want.keys().find(|k| !got.contains_key(*k)) {
                return Err(format!("{kind} {name} is missing"));
            }
        }
        Ok(())
    }
}

/// Writes `f` to `dir/commit.safetensors` atomically, with `header` as JSON
/// under the metadata `key` (beside `f`'s own metadata). Every kind of run
/// (AdamW, MeZO, hypernetwork) commits this way; the key tells them apart.
pub(crate) fn write_commit<H: Serialize>(dir: &Path, key: &str, f: TensorFile, header: &H) -> Result<()> {
    write_commit_borrowed(dir, key, f.tensors.iter().map(|(k, t)| (k.clone(), t)), f.metadata.clone(), header)
}

/// [`write_commit`] from borrowed tensors (no copy of the state in memory):
/// checksums added, the last commit kept as the previous one, then the new
/// one written atomically.
pub(crate) fn write_commit_borrowed<'a, H: Serialize>(
    dir: &Path,
    key: &str,
    tensors: impl IntoIterator<Item = (String, &'a Tensor)>,
    mut metadata: BTreeMap<String, String>,
    header: &H,
) -> Result<()> {
    let tensors: Vec<(String, &Tensor)> = tensors.into_iter().collect();
    metadata.insert(key.to_string(), serde_json::to_string(header).expect("header serialises"));
    let sums = Checksums::of(tensors.iter().map(|(k, t)| (k, *t)), &metadata);
    metadata.insert(CHECKSUMS_KEY.to_string(), serde_json::to_string(&sums).expect("checksums serialise"));
    keep_previous(dir)?;
    write_tensors_atomic(&dir.join(COMMIT_FILE), tensors, &metadata)
}

/// Makes the last commit the previous one. A hard link renamed into place
/// (a copy where links are not supported): at every instant both names
/// hold a whole commit, so a kill here loses nothing.
fn keep_previous(dir: &Path) -> Result<()> {
    let last = dir.join(COMMIT_FILE);
    if !last.exists() {
        return Ok(());
    }
    link_or_copy(&last, &dir.join(PREVIOUS_COMMIT_FILE))
}

/// Puts a whole copy of `from` at `to` (a hard link where possible),
/// replacing `to` atomically.
fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    let tmp = to.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(from, &tmp).is_err() {
        std::fs::copy(from, &tmp).and_then(|_| std::fs::File::open(&tmp)?.sync_all()).map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, to).map_err(|e| Error::io(to, e))?;
    // When `to` already is a link to `from`'s file (after a fall-back made
    // the last commit the previous one's), rename succeeds without doing
    // anything (POSIX) and `tmp` stays: remove it.
    if tmp.exists() {
        std::fs::remove_file(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    Ok(())
}

/// A commit file read and checked against its checksums. Any failure but
/// an I/O error means the file is damaged.
fn read_verified(path: &Path) -> Result<TensorFile> {
    let what = path.display().to_string();
    let f = TensorFile::read(path)?;
    let sums = f.metadata.get(CHECKSUMS_KEY).ok_or_else(|| Error::format(&what, format!("header field {CHECKSUMS_KEY} is missing (damaged, or written by a hexlora without commit checksums)")))?;
    let sums: Checksums = serde_json::from_str(sums).map_err(|e| Error::format(&what, format!("header field {CHECKSUMS_KEY}: {e}")))?;
    sums.verify(&f).map_err(|msg| Error::format(&what, msg))?;
    Ok(f)
}

/// The newest commit of `dir` that passes its checksums, and its path:
/// the last, else (with a warning, the damaged one moved aside and the
/// previous one put in its place) the previous one; an error naming both
/// when neither holds.
fn read_newest_sound(dir: &Path) -> Result<Option<(TensorFile, PathBuf)>> {
    let (last, prev) = (dir.join(COMMIT_FILE), dir.join(PREVIOUS_COMMIT_FILE));
    let damage = match last.exists().then(|| read_verified(&last)) {
        Some(Ok(f)) => return Ok(Some((f, last))),
        Some(Err(e @ Error::Io { .. })) => return Err(e),
        Some(Err(e)) => Some(e),
        None => None,
    };
    if !prev.exists() {
        return match damage {
            Some(e) => Err(Error::format(e.to_string(), format!("the commit is damaged and no previous commit ({PREVIOUS_COMMIT_FILE}) is kept to resume from; start the run again in a new --out"))),
            None => Ok(None),
        };
    }
    let f = match read_verified(&prev) {
        Ok(f) => f,
        Err(e) => {
            let first = damage.map_or(format!("{} is missing", last.display()), |d| d.to_string());
            return Err(Error::format(e.to_string(), format!("and {first}: neither commit can be resumed; start the run again in a new --out")));
        }
    };
    match damage {
        Some(e) => {
            eprintln!("WARNING: {e}\nWARNING: the last commit is damaged (disk or copy error?); the previous one, {}, takes its place (the step after it is redone, to the same bits); the damaged file is kept as {CORRUPT_COMMIT_FILE}", prev.display());
            std::fs::rename(&last, dir.join(CORRUPT_COMMIT_FILE)).map_err(|e| Error::io(&last, e))?;
        }
        None => eprintln!("WARNING: {} is missing; the previous commit, {}, takes its place", last.display(), prev.display()),
    }
    link_or_copy(&prev, &last)?;
    Ok(Some((f, prev)))
}

/// Reads the newest sound commit of `dir` if there is one (see
/// [`read_newest_sound`]): its tensors, the header under `key`, and the
/// file's name for errors. A commit without `key` (another kind of run)
/// is an error saying `not_ours`.
pub(crate) fn read_commit<H: DeserializeOwned>(dir: &Path, key: &str, not_ours: &str) -> Result<Option<(TensorFile, H, String)>> {
    let Some((f, path)) = read_newest_sound(dir)? else {
        return Ok(None);
    };
    let what = path.display().to_string();
    let header = f
        .metadata
        .get(key)
        .ok_or_else(|| Error::format(&what, not_ours))
        .and_then(|s| serde_json::from_str(s).map_err(|e| Error::format(&what, format!("header field {key}: {e}"))))?;
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
        let err = TrainState::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(COMMIT_FILE) && err.contains("no previous commit"), "{err}");
    }

    /// A state of `step` steps (one record each) over one small module.
    fn state_at(step: u64) -> TrainState {
        let info = ProjectionInfo { name: "model.layers.0.self_attn.q_proj".into(), kind: ProjectionKind::Attention, out_features: 4, in_features: 3 };
        let config = LoraConfig { r: 2, alpha: 4.0, target_modules: vec!["q_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() };
        let adapter = Adapter::init(config, &[info], 1).unwrap();
        let params: Vec<_> = adapter.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
        let mut adamw = AdamW::new(AdamWConfig::default(), &params);
        adamw.step = step;
        adamw.m[1].data[0] = step as f32;
        let history = (1..=step).map(|s| StepRecord { step: s, loss: 1.0, lr: 1e-4, grad_norm: 0.5, tokens: 4, seconds: 0.1 }).collect();
        TrainState { adapter, adamw, cursor: step, seed: 5, history, fingerprint: "abc".into() }
    }

    /// XORs byte `at` (the last one past the end) of `path` with `x`.
    fn flip_byte(path: &Path, at: usize, x: u8) {
        let mut bytes = std::fs::read(path).unwrap();
        let i = if at < bytes.len() { at } else { bytes.len() - 1 };
        bytes[i] ^= x;
        std::fs::write(path, bytes).unwrap();
    }

    /// Byte offset of the first `needle` in a file.
    fn header_offset(path: &Path, needle: &str) -> usize {
        let bytes = std::fs::read(path).unwrap();
        bytes.windows(needle.len()).position(|w| w == needle.as_bytes()).unwrap()
    }

    #[test]
    fn a_damaged_last_commit_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        state_at(3).commit(dir.path()).unwrap();
        state_at(4).commit(dir.path()).unwrap();
        let prev = TrainState::load(dir.path()).unwrap().unwrap();
        assert_eq!(prev.step(), 4);
        // The last byte is the last tensor's (adapter/..., sorted by name).
        flip_byte(&dir.path().join(COMMIT_FILE), usize::MAX, 0x10);
        let back = TrainState::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, state_at(3), "resumed from the previous commit");
        assert!(dir.path().join(CORRUPT_COMMIT_FILE).exists());
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        assert_eq!(read(COMMIT_FILE), read(PREVIOUS_COMMIT_FILE), "the previous commit is the last one again");
        // The next commit keeps the sound one, not the damaged one, and
        // leaves no temporary file (last and previous were one file).
        state_at(4).commit(dir.path()).unwrap();
        assert_eq!(TrainState::load(dir.path()).unwrap().unwrap(), state_at(4));
        let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        let mut want: Vec<String> = [COMMIT_FILE, CORRUPT_COMMIT_FILE, PREVIOUS_COMMIT_FILE].map(String::from).to_vec();
        want.sort();
        assert_eq!(names, want);
        std::fs::remove_file(dir.path().join(COMMIT_FILE)).unwrap();
        assert_eq!(TrainState::load(dir.path()).unwrap().unwrap(), state_at(3), "a kill mid-fall-back leaves the previous commit");
    }

    #[test]
    fn damaged_commits_are_refused_naming_the_tensor_or_field() {
        let dir = tempfile::tempdir().unwrap();
        let (last, prev) = (dir.path().join(COMMIT_FILE), dir.path().join(PREVIOUS_COMMIT_FILE));
        state_at(2).commit(dir.path()).unwrap();
        let pristine = std::fs::read(&last).unwrap();
        flip_byte(&last, usize::MAX, 0x10);
        let err = TrainState::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("tensor adapter/") && err.contains("does not match its checksum") && err.contains("no previous commit"), "{err}");
        // The header's step counter, 2 -> 3: the field is named.
        std::fs::write(&last, &pristine).unwrap();
        flip_byte(&last, header_offset(&last, r#"\"adamw_step\":2"#) + 15, 0x01);
        let err = TrainState::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("header field hexlora_train_state does not match"), "{err}");
        // Both commits damaged: both named, nothing loaded.
        std::fs::write(&last, &pristine).unwrap();
        std::fs::copy(&last, &prev).unwrap();
        flip_byte(&last, usize::MAX, 0x10);
        flip_byte(&prev, header_offset(&prev, "adam_v/") + 2, 0x10);
        let err = TrainState::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(COMMIT_FILE) && err.contains(PREVIOUS_COMMIT_FILE) && err.contains("neither commit"), "{err}");
    }

    #[test]
    fn a_step_counter_beyond_the_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        state_at(9).commit(dir.path()).unwrap();
        let state = TrainState::load(dir.path()).unwrap().unwrap();
        let learner = crate::train::learner::Learner { out: dir.path(), total: 6, title: "t" };
        let err = learner.run(state, crate::train::learner::RunOptions::quiet(), |_| unreachable!("no step may run")).unwrap_err().to_string();
        assert!(err.contains(COMMIT_FILE) && err.contains("step counter says 9") && err.contains("6 steps"), "{err}");
        let mut short = state_at(3);
        short.history.pop();
        let learner = crate::train::learner::Learner { out: dir.path(), total: 6, title: "t" };
        let err = learner.run(short, crate::train::learner::RunOptions::quiet(), |_| unreachable!("no step may run")).unwrap_err().to_string();
        assert!(err.contains("2 step records") && err.contains("step counter says 3"), "{err}");
    }
}

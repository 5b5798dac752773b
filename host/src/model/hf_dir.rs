//! Hugging Face model directories: `config.json` plus `model.safetensors`,
//! or shards listed by `model.safetensors.index.json`.
//!
//! Every shard is memory-mapped and its header parsed once by the
//! `safetensors` crate, which checks that each tensor's byte range lies inside
//! the file and matches its dtype and shape; [`HfDir::get`] then only slices.
//!
//! ```no_run
//! use hexlora::model::{hf_dir::HfDir, source::TensorSource};
//! let dir = HfDir::open("fixtures/tiny-llama".as_ref())?;
//! let n_layers = dir.config()["num_hidden_layers"].as_u64();
//! let w = dir.get("model.layers.0.self_attn.q_proj.weight")?.to_f32()?;
//! # Ok::<(), hexlora::Error>(())
//! ```
use crate::model::source::{RawTensor, TensorSource};
use crate::{Error, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where one tensor lives: which shard, which bytes.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: ::safetensors::Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard's mapping.
    start: usize,
    end: usize,
}

/// A memory-mapped Hugging Face model directory.
pub struct HfDir {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Mmap>,
    entries: HashMap<String, Entry>,
    /// Names in shard order, then offset order within a shard.
    order: Vec<String>,
}

impl HfDir {
    /// Opens `dir`: reads `config.json`, maps `model.safetensors` or every
    /// shard named in `model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let config = read_json(&dir.join("config.json"))?;
        let shard_files = shard_files(dir)?;
        let mut this = HfDir {
            dir: dir.to_path_buf(),
            config,
            shards: Vec::new(),
            entries: HashMap::new(),
            order: Vec::new(),
        };
        for file in &shard_files {
            this.add_shard(&dir.join(file))?;
        }
        Ok(this)
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// The directory this was opened from (for `tokenizer.json` and friends).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only; a model file changing under a
        // running process is outside what we defend against (as for any mmap).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let shard = self.shards.len();
        let (header_len, meta) = ::safetensors::SafeTensors::read_metadata(&map)
            .map_err(|e| Error::format(path.display().to_string(), format!("safetensors: {e}")))?;
        // 8-byte length prefix, then the JSON header, then the data section.
        let data_start = 8 + header_len;
        for name in meta.offset_keys() {
            let info = meta.info(&name).expect("offset_keys come from the same metadata");
            if self.entries.contains_key(&name) {
                return Err(Error::format(
                    path.display().to_string(),
                    format!("tensor {name} appears in more than one shard"),
                ));
            }
            let (s, e) = info.data_offsets;
            self.entries.insert(
                name.clone(),
                Entry {
                    shard,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + s,
                    end: data_start + e,
                },
            );
            self.order.push(name);
        }
        self.shards.push(map);
        Ok(())
    }
}

impl TensorSource for HfDir {
    fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let entry = self.entries.get(name).ok_or_else(|| {
            Error::format(self.dir.display().to_string(), format!("missing tensor {name}"))
        })?;
        let dtype = float_dtype(entry.dtype).ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor {name} has safetensors dtype {:?} (only F32, F16, BF16 are read)",
                entry.dtype
            ))
        })?;
        Ok(RawTensor {
            name: name.to_string(),
            dtype,
            shape: entry.shape.clone(),
            bytes: &self.shards[entry.shard][entry.start..entry.end],
        })
    }
}

pub(crate) use crate::base::dtype::float_dtype;

/// The safetensors files of `dir`: the single file, or the shards of the index.
fn shard_files(dir: &Path) -> Result<Vec<String>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec!["model.safetensors".into()]);
    }
    let index_path = dir.join("model.safetensors.index.json");
    if !index_path.is_file() {
        return Err(Error::format(
            dir.display().to_string(),
            "no model.safetensors or model.safetensors.index.json",
        ));
    }
    let index = read_json(&index_path)?;
    let map = index.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
        Error::format(index_path.display().to_string(), "no \"weight_map\" object")
    })?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::format(index_path.display().to_string(), format!("weight_map[{tensor}] is not a string"))
        })?;
        // The index is untrusted too: a shard name must stay inside `dir`.
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(Error::format(
                index_path.display().to_string(),
                format!("shard name {file:?} is not a plain file name"),
            ));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::format(path.display().to_string(), format!("invalid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::safetensors::tensor::TensorView;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn write_shard(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
        let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| f32_bytes(&t.2)).collect();
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .zip(&bytes)
            .map(|(t, b)| (t.0, TensorView::new(::safetensors::Dtype::F32, t.1.clone(), b).unwrap()))
            .collect();
        ::safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn single_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), r#"{"hidden_size": 4}"#).unwrap();
        write_shard(
            &dir.path().join("model.safetensors"),
            &[("a.weight", vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]), ("b", vec![1], vec![-5.0])],
        );
        let hf = HfDir::open(dir.path()).unwrap();
        assert_eq!(hf.config()["hidden_size"], 4);
        let a = hf.get("a.weight").unwrap();
        assert_eq!(a.shape, vec![2, 2]);
        assert_eq!(a.dtype, crate::base::dtype::DType::F32);
        assert_eq!(a.bytes, &f32_bytes(&[1.0, 2.0, 3.0, 4.0])[..]);
        assert_eq!(hf.names().len(), 2);
        let err = hf.get("nope").unwrap_err().to_string();
        assert!(err.contains("missing tensor nope"), "{err}");
    }

    #[test]
    fn half_types_and_unsupported_dtypes() {
        use half::{bf16, f16};
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let h: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
        let b: Vec<u8> = [0.25f32, 8.0].iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect();
        let i: Vec<u8> = [7i64].iter().flat_map(|x| x.to_le_bytes()).collect();
        let views = vec![
            ("h", TensorView::new(::safetensors::Dtype::F16, vec![2], &h).unwrap()),
            ("b", TensorView::new(::safetensors::Dtype::BF16, vec![1, 2], &b).unwrap()),
            ("i", TensorView::new(::safetensors::Dtype::I64, vec![1], &i).unwrap()),
        ];
        ::safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
        let hf = HfDir::open(dir.path()).unwrap();
        assert_eq!(hf.get("h").unwrap().to_f32().unwrap(), vec![1.5, -2.0]);
        assert_eq!(hf.get("b").unwrap().to_f32().unwrap(), vec![0.25, 8.0]);
        let err = hf.get("i").unwrap_err().to_string();
        assert!(err.contains("tensor i") && err.contains("I64"), "{err}");
    }

    #[test]
    fn sharded_index() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        write_shard(&dir.path().join("s1.safetensors"), &[("x", vec![1], vec![1.0])]);
        write_shard(&dir.path().join("s2.safetensors"), &[("y", vec![2], vec![2.0, 3.0])]);
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}}"#,
        )
        .unwrap();
        let hf = HfDir::open(dir.path()).unwrap();
        assert_eq!(hf.get("y").unwrap().bytes, &f32_bytes(&[2.0, 3.0])[..]);
        assert_eq!(hf.names(), vec!["x".to_string(), "y".to_string()]);
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = HfDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("config.json"), "{err}");
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let err = HfDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("no model.safetensors"), "{err}");
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"weight_map": {"x": "gone.safetensors"}}"#,
        )
        .unwrap();
        let err = HfDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("gone.safetensors"), "{err}");
    }

    #[test]
    fn corrupt_and_truncated_shards_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let path = dir.path().join("model.safetensors");
        write_shard(&path, &[("a", vec![4], vec![1.0, 2.0, 3.0, 4.0])]);
        let good = std::fs::read(&path).unwrap();

        std::fs::write(&path, &good[..good.len() - 3]).unwrap();
        let err = HfDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("model.safetensors") && err.contains("safetensors:"), "{err}");

        std::fs::write(&path, &good[..5]).unwrap();
        assert!(HfDir::open(dir.path()).is_err());

        let mut absurd = good.clone();
        absurd[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, &absurd).unwrap();
        assert!(HfDir::open(dir.path()).is_err());

        let mut garbage = good.clone();
        garbage[9] = b'#';
        std::fs::write(&path, &garbage).unwrap();
        assert!(HfDir::open(dir.path()).is_err());
    }

    #[test]
    fn shard_escaping_directory_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"weight_map": {"x": "../etc/passwd"}}"#,
        )
        .unwrap();
        let err = HfDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("not a plain file name"), "{err}");
    }
}

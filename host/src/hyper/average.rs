//! The mean of several checkpoints of one hypernetwork run, weight by
//! weight (`hexlora hyper-average`): one run's dev score can swing between
//! checkpoints 50 steps apart while their held-out loss does not (git-area:
//! 37.6 / 46.1 / 40.4 % at steps 100 / 150 / 200), and an average of
//! nearby weights is the usual remedy for such a swing (stochastic weight
//! averaging). Works on the files alone: no model is loaded, and the
//! checkpoints must share their configuration and every tensor's shape.
use super::checkpoints::{BEST_RECORD, CHECKPOINT_RECORD};
use super::hypernet::{read_config, write_config, CONFIG_FILE, WEIGHTS_FILE};
use super::HyperConfig;
use crate::base::atomic_write::write_atomic;
use crate::base::tensor_file::{check_finite, TensorFile};
use crate::tensor::Tensor;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// File beside the averaged network naming its sources.
pub const SOURCES_FILE: &str = "average.json";

/// One checkpoint directory, read and checked.
struct Source {
    dir: PathBuf,
    config: HyperConfig,
    weights: TensorFile,
}

fn read_source(dir: &Path) -> Result<Source> {
    let config = read_config(dir)?;
    let wpath = dir.join(WEIGHTS_FILE);
    let weights = TensorFile::read(&wpath)?;
    for (name, t) in &weights.tensors {
        check_finite(name, t, &wpath.display().to_string())?;
    }
    Ok(Source { dir: dir.to_path_buf(), config, weights })
}

/// Every source has the first one's configuration, tensor names and shapes.
fn check_alike(sources: &[Source]) -> Result<()> {
    let first = &sources[0];
    for s in &sources[1..] {
        let what = |file: &str| format!("{} (against {})", s.dir.join(file).display(), first.dir.join(file).display());
        if s.config != first.config {
            return Err(Error::invalid(what(CONFIG_FILE), "a different configuration: only checkpoints of one run can be averaged"));
        }
        let names = |f: &TensorFile| f.tensors.keys().cloned().collect::<Vec<_>>();
        if names(&s.weights) != names(&first.weights) {
            return Err(Error::invalid(what(WEIGHTS_FILE), "different tensor names"));
        }
        for (name, t) in &s.weights.tensors {
            let want = &first.weights.tensors[name].shape;
            if &t.shape != want {
                return Err(Error::Shape { what: format!("{}: tensor {name}", what(WEIGHTS_FILE)), expected: want.clone(), got: t.shape.clone() });
            }
        }
    }
    Ok(())
}

/// Element-wise mean of `tensors` (same shape), summed in f64 so the
/// order of the sources does not change the result.
fn mean(tensors: &[&Tensor]) -> Tensor {
    let n = tensors.len() as f64;
    let data = (0..tensors[0].data.len()).map(|i| (tensors.iter().map(|t| t.data[i] as f64).sum::<f64>() / n) as f32).collect();
    Tensor { shape: tensors[0].shape.clone(), data }
}

/// An averaged hypernetwork, in memory until [`Averaged::write`].
pub struct Averaged {
    config: HyperConfig,
    weights: TensorFile,
    /// Each source's directory and kept-network record.
    sources: Vec<serde_json::Value>,
}

/// The hypernetwork whose every weight is the mean of that weight in
/// `dirs` (at least two checkpoints of one run). Everything is read and
/// checked before anything is written, so a refusal leaves no output.
pub fn average_checkpoints(dirs: &[PathBuf]) -> Result<Averaged> {
    if dirs.len() < 2 {
        return Err(Error::invalid("checkpoints", format!("{} given, averaging needs at least 2", dirs.len())));
    }
    let sources = dirs.iter().map(|d| read_source(d)).collect::<Result<Vec<_>>>()?;
    check_alike(&sources)?;
    let mut weights = TensorFile::default();
    for name in sources[0].weights.tensors.keys() {
        let all: Vec<&Tensor> = sources.iter().map(|s| &s.weights.tensors[name]).collect();
        weights.tensors.insert(name.clone(), mean(&all));
    }
    let listed = sources.iter().map(|s| serde_json::json!({"dir": s.dir.display().to_string(), "checkpoint": checkpoint_record(&s.dir)})).collect();
    Ok(Averaged { config: sources[0].config.clone(), weights, sources: listed })
}

impl Averaged {
    /// Writes the network into `out` (weights, configuration) and
    /// `average.json` naming the sources and their step and held-out loss
    /// where they have a record.
    pub fn write(&self, out: &Path) -> Result<()> {
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        self.weights.write_atomic(&out.join(WEIGHTS_FILE))?;
        write_config(out, &self.config)?;
        let json = serde_json::to_vec_pretty(&serde_json::json!({ "mean_of": self.sources })).expect("json serialises");
        write_atomic(&out.join(SOURCES_FILE), &json)
    }
}

/// The record of a kept network (`checkpoint.json`, or `best.json`), if it has one.
fn checkpoint_record(dir: &Path) -> serde_json::Value {
    [CHECKPOINT_RECORD, BEST_RECORD]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_net(dir: &Path, config: &HyperConfig, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
        std::fs::create_dir_all(dir).unwrap();
        let mut f = TensorFile::default();
        for (n, s, d) in tensors {
            f.tensors.insert(n.to_string(), Tensor { shape: s.clone(), data: d.clone() });
        }
        f.write_atomic(&dir.join(WEIGHTS_FILE)).unwrap();
        std::fs::write(dir.join(CONFIG_FILE), serde_json::to_vec(config).unwrap()).unwrap();
    }

    fn config() -> HyperConfig {
        HyperConfig { base_model: "models/m.gguf".into(), ..HyperConfig::default() }
    }

    #[test]
    fn the_average_is_the_f64_mean_of_each_weight_and_names_its_sources() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c, out) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"), tmp.path().join("avg"));
        let cfg = config();
        write_net(&a, &cfg, &[("heads/w", vec![2, 2], vec![1.0, -2.0, 0.1, 3.0]), ("embedder/x", vec![1], vec![0.5])]);
        write_net(&b, &cfg, &[("heads/w", vec![2, 2], vec![2.0, -4.0, 0.2, 3.0]), ("embedder/x", vec![1], vec![0.5])]);
        write_net(&c, &cfg, &[("heads/w", vec![2, 2], vec![4.0, 0.0, 0.3, 3.0]), ("embedder/x", vec![1], vec![0.5])]);
        std::fs::write(b.join(CHECKPOINT_RECORD), r#"{"step":150,"heldout_loss":0.73}"#).unwrap();
        average_checkpoints(&[a.clone(), b.clone(), c.clone()]).unwrap().write(&out).unwrap();
        let got = TensorFile::read(&out.join(WEIGHTS_FILE)).unwrap();
        let want = [7.0f64 / 3.0, -2.0, (0.1f32 as f64 + 0.2f32 as f64 + 0.3f32 as f64) / 3.0, 3.0];
        for (g, w) in got.tensors["heads/w"].data.iter().zip(want) {
            assert_eq!(*g, w as f32);
        }
        assert_eq!(got.tensors["embedder/x"].data, vec![0.5]);
        let back: HyperConfig = serde_json::from_slice(&std::fs::read(out.join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(back, cfg);
        let sources: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join(SOURCES_FILE)).unwrap()).unwrap();
        assert_eq!(sources["mean_of"][1]["checkpoint"]["step"], 150);
        assert!(sources["mean_of"][0]["checkpoint"].is_null());
    }

    #[test]
    fn checkpoints_of_different_runs_or_shapes_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let cfg = config();
        write_net(&a, &cfg, &[("heads/w", vec![2], vec![1.0, 2.0])]);
        write_net(&b, &cfg, &[("heads/w", vec![1, 2], vec![1.0, 2.0])]);
        let e = average_checkpoints(&[a.clone(), b.clone()]).err().unwrap().to_string();
        assert!(e.contains("heads/w") && e.contains("b/hypernet.safetensors"), "{e}");
        let mut other = cfg.clone();
        other.out_rank += 1;
        write_net(&b, &other, &[("heads/w", vec![2], vec![1.0, 2.0])]);
        let e = average_checkpoints(&[a.clone(), b.clone()]).err().unwrap().to_string();
        assert!(e.contains("configuration") && e.contains("b/hypernet.json"), "{e}");
        write_net(&b, &cfg, &[("heads/v", vec![2], vec![1.0, 2.0])]);
        let e = average_checkpoints(&[a.clone(), b]).err().unwrap().to_string();
        assert!(e.contains("tensor names"), "{e}");
        let e = average_checkpoints(&[a]).err().unwrap().to_string();
        assert!(e.contains("at least 2"), "{e}");
    }
}

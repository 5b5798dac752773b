//! PEFT adapter directories: `adapter_config.json` +
//! `adapter_model.safetensors` with keys
//! `base_model.model.<module>.lora_A.weight` (`[r, in]`) and `.lora_B.weight`
//! (`[out, r]`), where `<module>` is the projection's checkpoint name
//! (`model.layers.3.self_attn.q_proj`).
use super::config::LoraConfig;
use crate::base::tensor_file::TensorFile;
use crate::base::counter_rng;
use crate::projection::ProjectionInfo;
use crate::tensor::Tensor;
use crate::base::atomic_write::write_atomic;
use crate::{Error, Result};
use std::path::Path;

/// File names inside an adapter directory.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// See [`CONFIG_FILE`].
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The two factors of one adapted projection.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraModule {
    /// Projection checkpoint name without `.weight`.
    pub name: String,
    /// `lora_A.weight`, `[r, in]`.
    pub a: Tensor,
    /// `lora_B.weight`, `[out, r]`.
    pub b: Tensor,
}

/// A LoRA adapter: configuration and factors, in projection order.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    /// Hyper-parameters.
    pub config: LoraConfig,
    /// One entry per targeted projection.
    pub modules: Vec<LoraModule>,
}

/// PEFT key of factor `which` (`"A"` or `"B"`) of `module`.
pub fn peft_key(module: &str, which: &str) -> String {
    format!("base_model.model.{module}.lora_{which}.weight")
}

impl Adapter {
    /// PEFT's default initialisation for every targeted projection: `A` from
    /// kaiming-uniform with `a = sqrt(5)` (uniform in `±1/sqrt(in)`), `B = 0`.
    pub fn init(config: LoraConfig, projections: &[ProjectionInfo], seed: u64) -> Result<Adapter> {
        check_targets(&config, projections)?;
        let r = config.r;
        let modules: Vec<LoraModule> = projections
            .iter()
            .filter(|p| config.targets(&p.name))
            .enumerate()
            .map(|(k, p)| {
                let bound = 1.0 / (p.in_features as f32).sqrt();
                let s = counter_rng::derive(seed, k as u64);
                let a = (0..r * p.in_features).map(|i| (2.0 * counter_rng::uniform(s, i as u64) - 1.0) * bound).collect();
                LoraModule { name: p.name.clone(), a: Tensor { shape: vec![r, p.in_features], data: a }, b: Tensor::zeros(&[p.out_features, r]) }
            })
            .collect();
        if modules.is_empty() {
            return Err(Error::invalid("target_modules", format!("{:?} match no projection of the model", config.target_modules)));
        }
        Ok(Adapter { config, modules })
    }

    /// The factors as a PEFT-keyed tensor file.
    pub fn to_tensor_file(&self) -> TensorFile {
        let mut f = TensorFile::default();
        for m in &self.modules {
            f.tensors.insert(peft_key(&m.name, "A"), m.a.clone());
            f.tensors.insert(peft_key(&m.name, "B"), m.b.clone());
        }
        f.metadata.insert("format".into(), "pt".into());
        f
    }

    /// Writes the directory (each file atomically).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let json = serde_json::to_vec_pretty(&self.config.to_json()).expect("json values serialise");
        self.to_tensor_file().write_atomic(&dir.join(WEIGHTS_FILE))?;
        write_atomic(&dir.join(CONFIG_FILE), &json)
    }

    /// Reads a PEFT adapter directory.
    pub fn load(dir: &Path) -> Result<Adapter> {
        let cpath = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&cpath).map_err(|e| Error::io(&cpath, e))?;
        let what = cpath.display().to_string();
        let json = serde_json::from_str(&text).map_err(|e| Error::format(&what, e.to_string()))?;
        let config = LoraConfig::from_json(&json, &what)?;
        let file = TensorFile::read(&dir.join(WEIGHTS_FILE))?;
        Self::from_tensor_file(config, &file, &dir.join(WEIGHTS_FILE).display().to_string())
    }

    /// Builds an adapter from PEFT-keyed tensors, checking pairs and ranks.
    /// PEFT may write keys with an adapter name (`lora_A.default.weight`);
    /// both forms are accepted.
    pub fn from_tensor_file(config: LoraConfig, file: &TensorFile, what: &str) -> Result<Adapter> {
        for (key, t) in &file.tensors {
            crate::base::tensor_file::check_finite(key, t, what)?;
        }
        let mut modules = Vec::new();
        for (key, a) in &file.tensors {
            let Some(name) = key.strip_prefix("base_model.model.").and_then(|k| {
                k.strip_suffix(".lora_A.weight").or_else(|| k.strip_suffix(".lora_A.default.weight"))
            }) else {
                if key.contains("lora_B") {
                    continue;
                }
                return Err(Error::format(what, format!("unexpected tensor {key} (only LoRA A/B factors are supported)")));
            };
            let b = file
                .tensors
                .get(&peft_key(name, "B"))
                .or_else(|| file.tensors.get(&format!("base_model.model.{name}.lora_B.default.weight")))
                .ok_or_else(|| Error::format(what, format!("{key} has no lora_B partner")))?;
            if a.shape.len() != 2 || b.shape.len() != 2 || a.shape[0] != config.r || b.shape[1] != config.r {
                return Err(Error::Shape { what: format!("{what}: {name} factors for r={}", config.r), expected: vec![config.r], got: [a.shape.clone(), b.shape.clone()].concat() });
            }
            modules.push(LoraModule { name: name.into(), a: a.clone(), b: b.clone() });
        }
        if modules.len() * 2 != file.tensors.len() {
            return Err(Error::format(what, "lora_B tensors without a lora_A partner"));
        }
        let mut ad = Adapter { config, modules };
        ad.sort_modules();
        Ok(ad)
    }

    /// Checks that every module names one of `projections` with factors of
    /// its widths at the adapter's rank, and that every factor is finite.
    pub fn check<'a>(&self, projections: impl IntoIterator<Item = &'a ProjectionInfo>) -> Result<()> {
        let by_name: std::collections::HashMap<&str, &ProjectionInfo> = projections.into_iter().map(|p| (p.name.as_str(), p)).collect();
        let mut infos: Vec<ProjectionInfo> = by_name.values().map(|&p| p.clone()).collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        check_targets(&self.config, &infos)?;
        if self.modules.is_empty() {
            return Err(Error::invalid("adapter", "holds no LoRA factors"));
        }
        let r = self.config.r;
        for m in &self.modules {
            let info = by_name
                .get(m.name.as_str())
                .ok_or_else(|| Error::invalid("adapter", format!("module {} is not a projection of this model", m.name)))?;
            if m.a.shape != [r, info.in_features] || m.b.shape != [info.out_features, r] {
                return Err(Error::Shape {
                    what: format!("adapter factors of {} (A [r, in], B [out, r])", m.name),
                    expected: vec![r, info.in_features, info.out_features, r],
                    got: [m.a.shape.clone(), m.b.shape.clone()].concat(),
                });
            }
            if let Some(i) = m.a.data.iter().chain(&m.b.data).position(|v| !v.is_finite()) {
                return Err(Error::NonFinite(format!("adapter factors of {} (element {i} of A then B)", m.name)));
            }
        }
        Ok(())
    }

    /// One adapter whose update is `sum_i w_i * scaling_i * B_i A_i` over
    /// `parts = [(adapter_i, w_i)]`: the factors stacked along the rank
    /// (`A = [A_1; A_2; ..]`, `B = [w_1 s_1 B_1, w_2 s_2 B_2, ..]`) with
    /// scaling 1 (`alpha = r`, no rsLoRA). Task arithmetic in weight space
    /// without forming any `out x in` matrix; every part must adapt the same
    /// projections (in any order) with the same shapes.
    pub fn stack(parts: &[(&Adapter, f32)]) -> Result<Adapter> {
        let Some(((first, _), rest)) = parts.split_first() else { return Err(Error::invalid("adapter stack", "no adapters to stack")) };
        let r: usize = parts.iter().map(|(a, _)| a.config.r).sum();
        let names = |x: &Adapter| x.modules.iter().map(|m| m.name.clone()).collect::<std::collections::BTreeSet<_>>();
        if let Some(k) = rest.iter().position(|(a, _)| a.modules.len() != first.modules.len() || names(a) != names(first)) {
            return Err(Error::invalid("adapter stack", format!("part {} adapts other projections than part 0", k + 1)));
        }
        if let Some((k, (_, w))) = parts.iter().enumerate().find(|(_, (_, w))| !w.is_finite()) {
            return Err(Error::invalid("adapter stack", format!("weight {w} of part {k} is not finite")));
        }
        let mut modules = Vec::with_capacity(first.modules.len());
        for m0 in &first.modules {
            let (out_f, in_f) = (m0.b.shape[0], m0.a.shape[1]);
            let (mut a, mut b) = (Vec::with_capacity(r * in_f), vec![0f32; out_f * r]);
            let mut col = 0;
            for (ad, w) in parts {
                let m = ad.module(&m0.name).expect("same projection names, checked above");
                let ri = ad.config.r;
                if m.a.shape != [ri, in_f] || m.b.shape != [out_f, ri] {
                    return Err(Error::Shape { what: format!("stacked adapter factors of {}", m.name), expected: vec![ri, in_f, out_f, ri], got: [m.a.shape.clone(), m.b.shape.clone()].concat() });
                }
                a.extend_from_slice(&m.a.data);
                let s = w * ad.config.scaling();
                for o in 0..out_f {
                    for c in 0..ri {
                        b[o * r + col + c] = s * m.b.data[o * ri + c];
                    }
                }
                col += ri;
            }
            modules.push(LoraModule { name: m0.name.clone(), a: Tensor { shape: vec![r, in_f], data: a }, b: Tensor { shape: vec![out_f, r], data: b } });
        }
        let config = LoraConfig { r, alpha: r as f32, use_rslora: false, dropout: 0.0, ..first.config.clone() };
        Ok(Adapter { config, modules })
    }

    /// Puts the modules in layer order (numerically), then by name.
    pub fn sort_modules(&mut self) {
        self.modules.sort_by_key(|m| module_order(&m.name));
    }

    /// The module for projection `name`.
    pub fn module(&self, name: &str) -> Option<&LoraModule> {
        self.modules.iter().find(|m| m.name == name)
    }
}

/// Every entry of `config.target_modules` must name projections of the
/// model (PEFT's rule, [`LoraConfig::targets`]): an unknown name is a typo
/// that would otherwise be dropped without a word.
fn check_targets(config: &LoraConfig, projections: &[ProjectionInfo]) -> Result<()> {
    let matches = |t: &str, p: &ProjectionInfo| p.name == t || p.name.ends_with(&format!(".{t}"));
    let Some(unknown) = config.target_modules.iter().find(|t| !projections.iter().any(|p| matches(t, p))) else {
        return Ok(());
    };
    let mut known: Vec<&str> = projections.iter().map(|p| p.name.rsplit('.').next().unwrap_or(&p.name)).collect();
    known.sort_unstable();
    known.dedup();
    let msg = format!("{unknown:?} (--targets, or target_modules of an adapter config) names no projection of the model (it has {})", known.join(", "));
    Err(Error::invalid("target module", msg))
}

/// Sort key: layer number numerically, then name (file order is alphabetical,
/// which would put layer 10 before layer 2).
fn module_order(name: &str) -> (usize, String) {
    let layer = name.split('.').find_map(|p| p.parse::<usize>().ok()).unwrap_or(usize::MAX);
    (layer, name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::ProjectionKind;

    fn projections() -> Vec<ProjectionInfo> {
        let p = |name: &str, o, i| ProjectionInfo { name: name.into(), kind: ProjectionKind::Attention, out_features: o, in_features: i };
        vec![p("model.layers.0.self_attn.q_proj", 8, 6), p("model.layers.0.mlp.down_proj", 6, 10), p("model.layers.10.self_attn.q_proj", 8, 6)]
    }

    fn config() -> LoraConfig {
        LoraConfig { r: 2, alpha: 4.0, target_modules: vec!["q_proj".into()], dropout: 0.1, use_rslora: false, base_model: "tiny".into() }
    }

    #[test]
    fn init_targets_by_suffix_and_round_trips_through_a_directory() {
        let mut ad = Adapter::init(config(), &projections(), 3).unwrap();
        assert_eq!(ad.modules.len(), 2);
        assert!(ad.modules[0].a.data.iter().all(|v| v.abs() <= 1.0 / 6f32.sqrt()));
        assert!(ad.modules[0].b.data.iter().all(|&v| v == 0.0));
        ad.modules[1].b.data[3] = 0.5;
        let dir = tempfile::tempdir().unwrap();
        ad.save(dir.path()).unwrap();
        let back = Adapter::load(dir.path()).unwrap();
        assert_eq!(back, ad);
        assert_eq!(back.modules[1].name, "model.layers.10.self_attn.q_proj");
        assert_eq!(back.config.scaling(), 2.0);
    }

    /// `scaling * B A` of module `j` in f64, `[out, in]` row-major.
    fn delta_f64(ad: &Adapter, j: usize) -> Vec<f64> {
        let m = &ad.modules[j];
        let (r, o, i) = (ad.config.r, m.b.shape[0], m.a.shape[1]);
        let mut d = vec![0f64; o * i];
        for (row, dr) in d.chunks_exact_mut(i).enumerate() {
            for c in 0..r {
                let bv = m.b.data[row * r + c] as f64;
                for (x, av) in dr.iter_mut().zip(&m.a.data[c * i..(c + 1) * i]) {
                    *x += ad.config.scaling() as f64 * bv * *av as f64;
                }
            }
        }
        d
    }

    #[test]
    fn stack_adds_the_weighted_updates_of_its_parts() {
        let filled = |seed: u64, r: usize, alpha: f32| {
            let mut ad = Adapter::init(LoraConfig { r, alpha, ..config() }, &projections(), seed).unwrap();
            for (k, m) in ad.modules.iter_mut().enumerate() {
                m.b.data.iter_mut().enumerate().for_each(|(n, v)| *v = ((n * 7 + k * 3 + seed as usize) % 11) as f32 / 11.0 - 0.5);
            }
            ad
        };
        let (x, y, z) = (filled(1, 2, 4.0), filled(2, 3, 3.0), filled(3, 2, 16.0));
        let sum = Adapter::stack(&[(&x, 1.0), (&y, 0.5), (&z, -1.0)]).unwrap();
        assert_eq!((sum.config.r, sum.config.scaling()), (7, 1.0));
        for j in 0..x.modules.len() {
            let want: Vec<f64> = (0..delta_f64(&x, j).len()).map(|n| delta_f64(&x, j)[n] + 0.5 * delta_f64(&y, j)[n] - delta_f64(&z, j)[n]).collect();
            for (g, w) in delta_f64(&sum, j).iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{g} vs {w}");
            }
        }
        let mut reversed = y.clone();
        reversed.modules.reverse();
        assert_eq!(Adapter::stack(&[(&x, 1.0), (&reversed, 0.5), (&z, -1.0)]).unwrap(), sum);
        let mut other = x.clone();
        other.modules.pop();
        assert!(Adapter::stack(&[(&x, 1.0), (&other, 1.0)]).unwrap_err().to_string().contains("part 1 adapts other projections"));
        assert!(Adapter::stack(&[]).is_err());
    }

    #[test]
    fn rejects_unsupported_configs_and_unpaired_factors() {
        let mut j = config().to_json();
        j["use_dora"] = true.into();
        assert!(LoraConfig::from_json(&j, "c").unwrap_err().to_string().contains("use_dora"));
        let mut j = config().to_json();
        j["target_modules"] = ".*q_proj".into();
        assert!(LoraConfig::from_json(&j, "c").is_err());
        let ad = Adapter::init(config(), &projections(), 3).unwrap();
        let mut f = ad.to_tensor_file();
        f.tensors.remove(&peft_key("model.layers.0.self_attn.q_proj", "B"));
        let err = Adapter::from_tensor_file(config(), &f, "w").unwrap_err();
        assert!(err.to_string().contains("no lora_B partner"), "{err}");
        let no_match = LoraConfig { target_modules: vec!["nope".into()], ..config() };
        assert!(Adapter::init(no_match, &projections(), 0).is_err());
    }
}

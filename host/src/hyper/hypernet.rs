//! The hypernetwork as a whole: configuration, embedder LoRA and heads; its
//! parameters as one flat list (embedder `A, B` per module, then the heads),
//! synthesis (one forward pass) and the on-disk form
//! (`hypernet.json` + `hypernet.safetensors`).
use super::config::HyperConfig;
use super::embedder::embed_forward;
use super::users::Context;
use super::heads::Heads;
use crate::lora::peft::peft_key;
use crate::base::tensor_file::TensorFile;
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::base::atomic_write::write_atomic;
use crate::autograd::graph::TrainableModel;
use crate::base::counter_rng;
use crate::{Error, Result};
use std::path::Path;

/// Configuration file inside a hypernetwork directory.
pub const CONFIG_FILE: &str = "hypernet.json";
/// Weights file inside a hypernetwork directory.
pub const WEIGHTS_FILE: &str = "hypernet.safetensors";

/// How `hypernet.safetensors` stores the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsDtype {
    /// Exact.
    F32,
    /// Half the size. f16 rather than bf16: the weights are small
    /// (|w| < 1 in practice), where f16 keeps 3 more mantissa bits, and
    /// values below f16's normal range (6e-5) lose at most 3e-8 absolute.
    F16,
}

/// safetensors bytes of `f` with every tensor rounded to f16 (round to nearest even).
fn f16_bytes(f: &TensorFile) -> Result<Vec<u8>> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<Vec<u8>> = f.tensors.values().map(|t| t.data.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect()).collect();
    let views = f
        .tensors
        .iter()
        .zip(&bytes)
        .map(|((k, t), b)| TensorView::new(Dtype::F16, t.shape.clone(), b).map(|v| (k.as_str(), v)).map_err(|e| Error::format(k.as_str(), e.to_string())))
        .collect::<Result<Vec<_>>>()?;
    safetensors::tensor::serialize(views, None).map_err(|e| Error::format("safetensors", e.to_string()))
}

/// The configuration of the hypernetwork directory `dir` (`hypernet.json`),
/// without its weights.
pub fn read_config(dir: &Path) -> Result<HyperConfig> {
    let cpath = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&cpath).map_err(|e| Error::io(&cpath, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(cpath.display().to_string(), e.to_string()))
}

/// Writes `dir/hypernet.json` atomically.
pub fn write_config(dir: &Path, config: &HyperConfig) -> Result<()> {
    let json = serde_json::to_vec_pretty(config).expect("config serialises");
    write_atomic(&dir.join(CONFIG_FILE), &json)
}

/// Embedder LoRA + heads.
#[derive(Clone, Debug)]
pub struct HyperNet {
    /// Hyper-parameters.
    pub config: HyperConfig,
    /// The trainable embedder LoRA on the frozen LLM.
    pub embedder: Adapter,
    /// Embedding-to-matrix heads.
    pub heads: Heads,
}

impl HyperNet {
    /// A fresh hypernetwork for `model`: embedder LoRA with PEFT's init
    /// (B = 0, so the embedder starts as the bidirectional base model),
    /// heads emitting `common` (or PEFT's init) until trained.
    pub fn init(config: HyperConfig, model: &dyn TrainableModel, common: Option<&Adapter>, seed: u64) -> Result<HyperNet> {
        config.check()?;
        let projections = model.projections();
        let embedder = Adapter::init(config.embed_lora(), &projections, counter_rng::derive(seed, 7))?;
        let heads = Heads::new(config.variant, model.hidden_size(), config.bottleneck, &config.out_lora(), &projections, common, (config.center, config.standardize), counter_rng::derive(seed, 8))?;
        Ok(HyperNet { config, embedder, heads })
    }

    /// Number of leading entries of [`HyperNet::params`] that belong to the embedder.
    pub fn embedder_len(&self) -> usize {
        2 * self.embedder.modules.len()
    }

    /// All parameters, flat (optimizer order).
    pub fn params(&self) -> Vec<Tensor> {
        let mut p: Vec<Tensor> = self.embedder.modules.iter().flat_map(|m| [m.a.clone(), m.b.clone()]).collect();
        p.extend(self.heads.params.iter().cloned());
        p
    }

    /// Names of [`HyperNet::params`] (safetensors keys).
    pub fn param_names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.embedder.modules.iter().flat_map(|m| ["A", "B"].map(|w| format!("embedder/{}", peft_key(&m.name, w)))).collect();
        n.extend(self.heads.names.iter().map(|h| format!("heads/{h}")));
        n
    }

    /// Replaces every parameter (same order and shapes as [`HyperNet::params`]).
    pub fn set_params(&mut self, mut params: Vec<Tensor>) -> Result<()> {
        let e = self.embedder_len();
        if params.len() != e + self.heads.params.len() {
            return Err(Error::Shape { what: "hypernetwork parameters".into(), expected: vec![e + self.heads.params.len()], got: vec![params.len()] });
        }
        let heads = params.split_off(e);
        for (m, pair) in self.embedder.modules.iter_mut().zip(params.chunks_exact(2)) {
            if m.a.shape != pair[0].shape || m.b.shape != pair[1].shape {
                return Err(Error::Shape { what: format!("embedder LoRA of {}", m.name), expected: [m.a.shape.clone(), m.b.shape.clone()].concat(), got: [pair[0].shape.clone(), pair[1].shape.clone()].concat() });
            }
            m.a = pair[0].clone();
            m.b = pair[1].clone();
        }
        self.heads.set_params(heads)
    }

    /// Zero gradients shaped like [`HyperNet::params`].
    pub fn zero_grads(&self) -> Vec<Tensor> {
        self.params().iter().map(|p| Tensor::zeros(&p.shape)).collect()
    }

    /// Stage 2: the LoRA for a user whose rendered context is `context`
    /// (token ids), in one forward pass.
    pub fn synthesize(&self, model: &dyn TrainableModel, context: &Context) -> Result<Adapter> {
        self.synthesize_with_strength(model, context, 1.0)
    }

    /// [`HyperNet::synthesize`] with the user's part of every emitted matrix
    /// scaled by `strength` ([`Heads::forward_with_strength`]): 1 is the
    /// trained network, 0 its common LoRA, above 1 an extrapolation away
    /// from it (a knob chosen on dev, like a learning rate).
    pub fn synthesize_with_strength(&self, model: &dyn TrainableModel, context: &Context, strength: f32) -> Result<Adapter> {
        if !(strength.is_finite() && strength >= 0.0) {
            return Err(Error::invalid("hypernetwork strength", format!("{strength} (must be finite and >= 0)")));
        }
        let pass = embed_forward(model, &self.embedder, context, None, false, &[])?;
        let (outs, _) = self.heads.forward_with_strength(&pass.embedding, strength)?;
        Ok(self.heads.to_adapter(outs, self.config.out_lora()))
    }

    /// The LoRA every user shares: what the heads emit at strength 0 (their
    /// output biases, whatever the embedding).
    pub fn common(&self) -> Result<Adapter> {
        let (outs, _) = self.heads.forward_with_strength(&vec![0.0; self.heads.embed_dim], 0.0)?;
        Ok(self.heads.to_adapter(outs, self.config.out_lora()))
    }

    /// Writes `dir/hypernet.json` and `dir/hypernet.safetensors` (f32) atomically.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_as(dir, WeightsDtype::F32)
    }

    /// Writes the hypernetwork with its weights stored as `dtype`; loading
    /// converts back to f32 ([`TensorFile`] reads f16 and bf16).
    pub fn save_as(&self, dir: &Path, dtype: WeightsDtype) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut f = TensorFile::default();
        for (name, t) in self.param_names().into_iter().zip(self.params()) {
            f.tensors.insert(name, t);
        }
        match dtype {
            WeightsDtype::F32 => f.write_atomic(&dir.join(WEIGHTS_FILE))?,
            WeightsDtype::F16 => write_atomic(&dir.join(WEIGHTS_FILE), &f16_bytes(&f)?)?,
        }
        write_config(dir, &self.config)
    }

    /// Reads a hypernetwork directory for `model` (the head layout follows
    /// the model's projections; every tensor must be present with its shape).
    pub fn load(dir: &Path, model: &dyn TrainableModel) -> Result<HyperNet> {
        let mut net = HyperNet::init(read_config(dir)?, model, None, 0)?;
        let wpath = dir.join(WEIGHTS_FILE);
        let what = wpath.display().to_string();
        let f = TensorFile::read(&wpath)?;
        if f.tensors.len() != net.param_names().len() {
            return Err(Error::format(&what, format!("{} tensors, the configuration needs {}", f.tensors.len(), net.param_names().len())));
        }
        let params = net.param_names().iter().map(|n| f.get(n, &what).cloned()).collect::<Result<Vec<_>>>()?;
        if !params.iter().all(|t| crate::tensor::all_finite(&t.data)) {
            return Err(Error::NonFinite(format!("{what}: hypernetwork weights")));
        }
        net.set_params(params)?;
        Ok(net)
    }
}

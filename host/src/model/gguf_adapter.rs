//! LoRA adapters as llama.cpp reads them (`src/llama-adapter.cpp`,
//! gguf-py's `Keys.Adapter`): a GGUF file with `general.type = "adapter"`,
//! `general.architecture` equal to the base model's, `adapter.type =
//! "lora"` and `adapter.lora.alpha` (f32); per adapted weight two tensors
//! named after it, `blk.N.attn_q.weight.lora_a` with ggml dims `[n_in, r]`
//! and `.lora_b` with `[r, n_out]`, so in row-major terms exactly PEFT's
//! `A [r, in]` and `B [out, r]`. llama.cpp scales the branch by
//! `alpha / r` (alpha 0 means 1).
//!
//! Llama q/k weights sit in GGUF with their rows permuted for llama.cpp's
//! rotary layout ([`rotary_gguf_row`]); since `W = B A`, that permutation
//! moves the rows of `B` and leaves `A` alone. Export applies it, import
//! undoes it, so a PEFT -> GGUF -> PEFT round trip is exact in f32.
//!
//! Rank-stabilised adapters (`use_rslora`) are written with `alpha * sqrt(r)`
//! (llama.cpp has no rsLoRA flag) and read back as plain LoRA with that
//! alpha: the same scaling up to f32 rounding.
use crate::lora::config::LoraConfig;
use crate::lora::peft::{Adapter, LoraModule};
use crate::model::config::ModelConfig;
use crate::model::descriptor::Descriptor;
use crate::model::gguf::{gguf_projection_name, hf_name, Gguf, Value};
use crate::model::llama::gguf::rotary_gguf_row;
use crate::model::gguf_writer::{GgufWriter, TensorOut};
use crate::base::dtype::{DType, RawTensor};
use crate::tensor::Tensor;
use crate::{Error, Result};
use hexlora_proto::q8_0::{quantize_row, BlockQ8_0, QK8_0};
use std::path::Path;

/// Storage type of the exported factors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// Exact.
    F32,
    /// IEEE half, round to nearest even.
    F16,
    /// Q8_0 where a factor's rows are a multiple of 32 wide (`lora_a`,
    /// and `lora_b` when r is), F16 otherwise.
    Q8_0,
}

/// How llama.cpp lays out one architecture's adapters; each architecture
/// folder says ([`crate::model::arch::Architecture::gguf_adapter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdapterLayout {
    /// `general.architecture` (`llama`, `qwen3`, `gemma3`).
    pub arch: &'static str,
    /// Whether the base model's q/k rows sit in llama.cpp's rotary
    /// permutation ([`rotary_gguf_row`]), so `B`'s rows of q and k move too.
    pub permuted_qk: bool,
}

/// The layout of `cfg`'s architecture, or why its adapters are not exported.
fn layout(cfg: &ModelConfig) -> Result<AdapterLayout> {
    crate::model::arch::of(cfg).gguf_adapter(cfg)
}

/// Rotary heads whose permutation a module's output rows carry, if any.
fn rotary_heads(cfg: &ModelConfig, layout: AdapterLayout, module: &str) -> Option<usize> {
    if !layout.permuted_qk {
        return None;
    }
    if module.ends_with(".self_attn.q_proj") {
        Some(cfg.n_head)
    } else if module.ends_with(".self_attn.k_proj") {
        Some(cfg.n_kv_head)
    } else {
        None
    }
}

/// `b: [out, r]` with its rows moved from Hugging Face to GGUF order
/// (`to_gguf`) or back.
fn permute_rows(b: &Tensor, n_head: usize, to_gguf: bool, what: &str) -> Result<Tensor> {
    let (rows, r) = (b.shape[0], b.shape[1]);
    if n_head == 0 || rows % (2 * n_head) != 0 {
        return Err(Error::format(what, format!("{rows} output rows cannot be split into {n_head} rotary heads")));
    }
    let mut out = vec![0.0; b.data.len()];
    for hf in 0..rows {
        let g = rotary_gguf_row(hf, rows, n_head);
        let (dst, src) = if to_gguf { (g, hf) } else { (hf, g) };
        out[dst * r..(dst + 1) * r].copy_from_slice(&b.data[src * r..(src + 1) * r]);
    }
    Tensor::from_vec(&b.shape, out)
}

/// One factor `[rows, cols]` in `out` storage, as ggml dims `[cols, rows]`.
fn encode(name: String, t: &Tensor, out: OutType) -> Result<TensorOut> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    if let Some(i) = t.data.iter().position(|v| !v.is_finite()) {
        return Err(Error::NonFinite(format!("{name}: element {i} is {}", t.data[i])));
    }
    let (ggml_type, bytes) = match out {
        OutType::Q8_0 if cols % QK8_0 == 0 => {
            let mut blocks = vec![BlockQ8_0::ZERO; t.data.len() / QK8_0];
            quantize_row(&t.data, &mut blocks).map_err(|e| Error::invalid(&name, e.to_string()))?;
            (8, blocks.iter().flat_map(|b| b.to_bytes()).collect())
        }
        OutType::F16 | OutType::Q8_0 => (1, t.data.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect()),
        OutType::F32 => (0, t.data.iter().flat_map(|v| v.to_le_bytes()).collect()),
    };
    Ok(TensorOut { name, ggml_type, dims: vec![cols, rows], bytes })
}

/// Writes `adapter` for a base model of shape `cfg` as a llama.cpp LoRA
/// GGUF at `path` (atomically). Every module must be a projection the
/// GGUF layout names.
pub fn export(adapter: &Adapter, cfg: &ModelConfig, out: OutType, path: &Path) -> Result<()> {
    let layout = layout(cfg)?;
    adapter.check(Descriptor::new(cfg).projections())?;
    let c = &adapter.config;
    let alpha = if c.use_rslora { c.alpha * (c.r as f32).sqrt() } else { c.alpha };
    let mut w = GgufWriter::default();
    w.kv("general.architecture", Value::String(layout.arch.into()))
        .kv("general.type", Value::String("adapter".into()))
        .kv("general.name", Value::String(c.base_model.clone()))
        .kv("adapter.type", Value::String("lora".into()))
        .kv("adapter.lora.alpha", Value::F32(alpha));
    for m in &adapter.modules {
        let base = gguf_projection_name(&m.name)
            .ok_or_else(|| Error::invalid("adapter", format!("module {} has no llama.cpp tensor name", m.name)))?;
        let b = match rotary_heads(cfg, layout, &m.name) {
            Some(heads) => permute_rows(&m.b, heads, true, &m.name)?,
            None => m.b.clone(),
        };
        w.tensor(encode(format!("{base}.lora_a"), &m.a, out)?);
        w.tensor(encode(format!("{base}.lora_b"), &b, out)?);
    }
    w.write(path)
}

/// One stored factor as a dense `[rows, cols]` tensor (ggml dims `[cols, rows]`).
fn decode(g: &Gguf, name: &str, what: &str) -> Result<Tensor> {
    let (info, bytes) = g.get_gguf(name)?;
    if info.dims.len() != 2 {
        return Err(Error::format(what, format!("{name} has {} dims, a LoRA factor has 2", info.dims.len())));
    }
    let dtype = info
        .ggml_type
        .dtype()
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0))
        .ok_or_else(|| Error::Unsupported(format!("{what}: {name} has type {} (LoRA factors: F32, F16, BF16, Q8_0)", info.ggml_type.name)))?;
    let raw = RawTensor { name: format!("{what}: {name}"), dtype, shape: vec![info.dims[1], info.dims[0]], bytes };
    let t = raw.to_tensor()?;
    crate::base::tensor_file::check_finite(name, &t, what)?;
    Ok(t)
}

/// Reads a llama.cpp LoRA GGUF for a base model of shape `cfg`.
pub fn import(path: &Path, cfg: &ModelConfig) -> Result<Adapter> {
    let what = path.display().to_string();
    let g = Gguf::open(path)?;
    let field = |key: &str| g.get_str(key).map_err(|_| Error::format(&what, format!("{key} is missing or not a string")));
    if field("general.type")? != "adapter" || field("adapter.type")? != "lora" {
        return Err(Error::format(&what, "not a LoRA adapter (general.type must be \"adapter\", adapter.type \"lora\")"));
    }
    let arch = field("general.architecture")?;
    let layout = layout(cfg)?;
    if arch != layout.arch {
        return Err(Error::invalid(&what, format!("general.architecture is {arch}, the model is {}", layout.arch)));
    }
    let mut modules = Vec::new();
    for t in g.tensor_infos() {
        let Some(base) = t.name.strip_suffix(".lora_a") else {
            if t.name.ends_with(".lora_b") {
                continue;
            }
            return Err(Error::Unsupported(format!("{what}: tensor {} (only .lora_a/.lora_b factors are supported)", t.name)));
        };
        let a = decode(&g, &t.name, &what)?;
        let b = decode(&g, &format!("{base}.lora_b"), &what)?;
        let module = hf_name(base);
        let Some(module) = module.strip_suffix(".weight").filter(|m| gguf_projection_name(m).as_deref() == Some(base)) else {
            return Err(Error::format(&what, format!("{} is not a projection weight of a {arch} model", t.name)));
        };
        if a.shape[0] != b.shape[1] {
            return Err(Error::Shape { what: format!("{what}: rank of {base}"), expected: vec![a.shape[0]], got: vec![b.shape[1]] });
        }
        let b = match rotary_heads(cfg, layout, module) {
            Some(heads) => permute_rows(&b, heads, false, &t.name)?,
            None => b,
        };
        modules.push(LoraModule { name: module.to_string(), a, b });
    }
    let lora_b = g.tensor_infos().iter().filter(|t| t.name.ends_with(".lora_b")).count();
    if lora_b != modules.len() {
        return Err(Error::format(&what, "a .lora_b tensor has no .lora_a partner"));
    }
    let r = modules.first().map(|m| m.a.shape[0]).ok_or_else(|| Error::format(&what, "no LoRA tensors"))?;
    if let Some(m) = modules.iter().find(|m| m.a.shape[0] != r) {
        return Err(Error::Unsupported(format!("{what}: ranks differ ({} has {}, the first module {r})", m.name, m.a.shape[0])));
    }
    let alpha = match g.value("adapter.lora.alpha") {
        Some(_) => g.get_f32("adapter.lora.alpha")?,
        None => 0.0,
    };
    if !alpha.is_finite() || alpha < 0.0 {
        return Err(Error::invalid(&what, format!("adapter.lora.alpha is {alpha}")));
    }
    let mut targets: Vec<String> = Vec::new();
    for m in &modules {
        let suffix = m.name.rsplit('.').next().unwrap_or(&m.name).to_string();
        if !targets.contains(&suffix) {
            targets.push(suffix);
        }
    }
    let config = LoraConfig {
        r,
        // llama.cpp applies scale 1 when alpha is 0.
        alpha: if alpha == 0.0 { r as f32 } else { alpha },
        target_modules: targets,
        dropout: 0.0,
        use_rslora: false,
        base_model: g.get_str("general.name").unwrap_or("").to_string(),
    };
    let mut ad = Adapter { config, modules };
    ad.sort_modules();
    Ok(ad)
}

// `Adapter::open` lives here, not in `lora/`, so that `lora/` stays below
// `model/` (`docs/ARCHITECTURE.md`): telling a GGUF adapter's names needs
// the model's descriptor.
impl Adapter {
    /// Opens an adapter for a model of shape `model`: a PEFT directory, or
    /// a llama.cpp LoRA `.gguf` file ([`import`]).
    pub fn open(path: &Path, model: &ModelConfig) -> Result<Adapter> {
        if path.is_dir() {
            Self::load(path)
        } else if path.extension().is_some_and(|e| e == "gguf") {
            import(path, model)
        } else if path.exists() {
            Err(Error::invalid(path.display().to_string(), "not a PEFT adapter directory or a .gguf LoRA file"))
        } else {
            Err(Error::io(path, std::io::Error::from_raw_os_error(libc::ENOENT)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, LayerKind};
    use crate::ops::rope::RopeScaling;

    fn cfg(arch: Arch) -> ModelConfig {
        ModelConfig {
            arch,
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 16,
            num_layers: 1,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 4,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: RopeScaling::Default,
            rotary_dim: 4,
            tie_word_embeddings: true,
            layer_types: vec![LayerKind::FullAttention],
            gdn: None,
            sliding: None,
            query_pre_attn_scalar: None,
            prefix: "model.".into(),
            eos_token_ids: vec![],
            max_position_embeddings: 64,
        }
    }

    fn adapter() -> Adapter {
        let t = |shape: &[usize], k: f32| Tensor::from_vec(shape, (0..shape[0] * shape[1]).map(|i| (i as f32 * 0.37 + k).sin()).collect()).unwrap();
        let m = |name: &str, out: usize, inp: usize, k| LoraModule { name: name.into(), a: t(&[2, inp], k), b: t(&[out, 2], k + 1.0) };
        Adapter {
            config: LoraConfig { r: 2, alpha: 5.0, target_modules: vec!["q_proj".into(), "k_proj".into(), "down_proj".into()], dropout: 0.0, use_rslora: false, base_model: "tiny".into() },
            modules: vec![
                m("model.layers.0.self_attn.q_proj", 8, 8, 0.0),
                m("model.layers.0.self_attn.k_proj", 4, 8, 2.0),
                m("model.layers.0.mlp.down_proj", 8, 16, 4.0),
            ],
        }
    }

    #[test]
    fn f32_round_trip_is_exact_and_b_rows_of_q_and_k_are_permuted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gguf");
        let mut ad = adapter();
        export(&ad, &cfg(Arch::Llama), OutType::F32, &path).unwrap();
        let back = import(&path, &cfg(Arch::Llama)).unwrap();
        ad.sort_modules();
        assert_eq!(back.modules, ad.modules);
        assert_eq!((back.config.r, back.config.alpha, back.config.scaling()), (2, 5.0, 2.5));
        // ... and on to PEFT again.
        back.save(&dir.path().join("peft")).unwrap();
        assert_eq!(Adapter::load(&dir.path().join("peft")).unwrap().modules, ad.modules);
        // In the file, q's B has rows in llama.cpp's order: with 2 heads of
        // 4 rows, HF rows (0, 1, 2, 3) of a head sit at (0, 2, 1, 3).
        let g = Gguf::open(&path).unwrap();
        let (info, bytes) = g.get_gguf("blk.0.attn_q.weight.lora_b").unwrap();
        assert_eq!(info.dims, vec![2, 8]);
        let stored: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let b = &ad.module("model.layers.0.self_attn.q_proj").unwrap().b.data;
        assert_eq!(&stored[2..4], &b[4..6], "GGUF row 1 holds HF row 2");
        assert_eq!(&stored[4..6], &b[2..4], "GGUF row 2 holds HF row 1");
        let (info, _) = g.get_gguf("blk.0.ffn_down.weight.lora_a").unwrap();
        assert_eq!(info.dims, vec![16, 2]);
        // Qwen3 and Gemma 3 GGUFs keep HF row order.
        for arch in [Arch::Qwen3, Arch::Gemma3] {
            export(&ad, &cfg(arch), OutType::F32, &path).unwrap();
            let (_, bytes) = Gguf::open(&path).unwrap().get_gguf("blk.0.attn_q.weight.lora_b").map(|(i, b)| (i.clone(), b.to_vec())).unwrap();
            assert_eq!(bytes, b.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(), "{arch:?}");
            assert_eq!(import(&path, &cfg(arch)).unwrap().modules, ad.modules, "{arch:?}");
        }
        let err = import(&path, &cfg(Arch::Llama)).unwrap_err().to_string();
        assert!(err.contains("general.architecture is gemma3"), "{err}");
    }

    #[test]
    fn f16_and_q8_0_stay_within_their_rounding_and_mismatches_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gguf");
        let ad = adapter();
        for (out, tol) in [(OutType::F16, 1.0 / 2048.0), (OutType::Q8_0, 1.0 / 127.0)] {
            export(&ad, &cfg(Arch::Llama), out, &path).unwrap();
            let back = import(&path, &cfg(Arch::Llama)).unwrap();
            for m in &back.modules {
                let w = ad.module(&m.name).unwrap();
                let amax = w.a.data.iter().chain(&w.b.data).fold(0f32, |x, v| x.max(v.abs()));
                let err = m.a.data.iter().zip(&w.a.data).chain(m.b.data.iter().zip(&w.b.data)).fold(0f32, |x, (p, q)| x.max((p - q).abs()));
                assert!(err <= tol * amax, "{out:?} {}: {err}", m.name);
            }
        }
        let err = import(&path, &cfg(Arch::Qwen3)).unwrap_err().to_string();
        assert!(err.contains("general.architecture is llama"), "{err}");
        assert!(export(&ad, &cfg(Arch::Qwen35), OutType::F32, &path).is_err());
        let mut bad = adapter();
        bad.modules[0].a.data[1] = f32::NAN;
        assert!(export(&bad, &cfg(Arch::Llama), OutType::F32, &path).unwrap_err().to_string().contains("element 1"));
    }
}

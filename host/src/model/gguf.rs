//! GGUF (v2/v3) reader: header, metadata, tensor infos, memory-mapped data.
//!
//! Layout (little-endian): `"GGUF"`, `u32 version`, `u64 n_tensors`,
//! `u64 n_kv`; `n_kv` metadata entries (`string key`, `u32 type`, value);
//! `n_tensors` infos (`string name`, `u32 n_dims`, `u64 dims[n_dims]`
//! innermost first, `u32 ggml_type`, `u64 offset`); padding to
//! `general.alignment` (default 32); the data section, each tensor at its
//! offset. Strings are `u64 len` + UTF-8 bytes.
//!
//! The file is untrusted: every length is checked against the bytes that
//! remain before anything is allocated, offsets and sizes use checked
//! arithmetic, and each error names the field or tensor it was reading.
//!
//! [`Gguf`] implements [`TensorSource`] in Hugging Face convention: names
//! are mapped (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`),
//! dims reversed to `[out, in]`, and what the converter rewrote is put back
//! in Hugging Face order and values (as transformers' GGUF loader does).
//! Tensors without a
//! Hugging Face counterpart (e.g. `rope_freqs.weight`) keep their GGUF name.
//! What an architecture's converter did beyond the common names (its own
//! tensor names, rotary row order, stored norm offsets, value-head order)
//! is undone by that architecture's [`Conventions`], in its folder
//! (`model/<arch>/gguf.rs`), which [`crate::model::arch::gguf_conventions`]
//! picks by `general.architecture`: this reader names no architecture. An
//! architecture whose tensors are refused still opens (metadata and
//! tokenizer stay readable).
//!
//! ```no_run
//! use hexlora::model::{gguf::Gguf, source::TensorSource};
//! let g = Gguf::open("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let arch = g.architecture()?;
//! let vocab: Vec<&str> = g.get_str_array("tokenizer.ggml.tokens")?;
//! let wq = g.get("model.layers.0.self_attn.q_proj.weight")?.to_f32()?;
//! # Ok::<(), hexlora::Error>(())
//! ```
use crate::model::source::{DType, RawTensor, TensorSource};
use crate::{Error, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::OnceLock;

/// GGUF files start with these four bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// GGML tensors have at most four dims.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8.
    String(String),
    /// GGUF type 9: elements all of one type.
    Array(Vec<Value>),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

impl Value {
    /// The value as an integer, if it is one of the integer types.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

/// A GGML tensor type: its GGUF id, name and block geometry. Known types
/// that hexlora cannot dequantize still parse (so their sizes are checked);
/// asking for their data is an [`Error::Unsupported`] naming tensor and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    /// Numeric id in the file.
    pub id: u32,
    /// GGML's name (`Q4_K`).
    pub name: &'static str,
    /// Elements per block.
    pub block_len: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

/// Every GGML type id with its block geometry (gguf-py's `GGML_QUANT_SIZES`).
const GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// The type with GGUF id `id`, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        GGML_TYPES.iter().find(|t| t.0 == id).map(|&(id, name, block_len, block_bytes)| GgmlType {
            id,
            name,
            block_len,
            block_bytes,
        })
    }

    /// The [`DType`] hexlora can dequantize, if any.
    pub fn dtype(self) -> Option<DType> {
        Some(match self.id {
            0 => DType::F32,
            1 => DType::F16,
            30 => DType::BF16,
            8 => DType::Q8_0,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            13 => DType::Q5K,
            12 => DType::Q4K,
            14 => DType::Q6K,
            _ => return None,
        })
    }
}

/// One tensor as the file describes it (GGUF names and dim order).
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Dims as stored: innermost (contiguous) first.
    pub dims: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    /// Byte length of the data.
    pub len: usize,
}

/// A memory-mapped GGUF file.
pub struct Gguf {
    /// File name, for error messages.
    what: String,
    map: Mmap,
    parsed: Parsed,
    /// Hugging Face name -> index into `parsed.tensors`.
    hf_index: HashMap<String, usize>,
    /// Hugging Face names in file order.
    hf_names: Vec<String>,
    /// Per tensor: how to bring it back to HF convention, and the lazily
    /// built result.
    rewrites: Vec<Option<(Box<dyn Rewrite>, OnceLock<Rewritten>)>>,
    /// An architecture whose tensors the converter rewrote in ways we do not undo.
    refused_arch: Option<String>,
}

/// How one architecture's GGUF files differ from Hugging Face convention
/// beyond the common tensor names ([`hf_name`]). Each architecture folder
/// implements it in its `gguf.rs`; [`crate::model::arch::gguf_conventions`]
/// picks one by `general.architecture`.
pub trait Conventions: Sync {
    /// The HF name (under `model.layers.N.`) of a layer tensor from its
    /// GGUF name after `blk.N.`, where the architecture names it its own
    /// way; `None` for the common names.
    fn layer_name(&self, _rest: &str) -> Option<&'static str> {
        None
    }

    /// What tensor `gguf_name` of the model file `gguf` needs undone when
    /// read, if anything (never asked for a LoRA adapter file).
    fn rewrite(&self, _gguf: &Gguf, _gguf_name: &str) -> Result<Option<Box<dyn Rewrite>>> {
        Ok(None)
    }

    /// Whether this architecture's tensors are refused: the converter
    /// rewrote them in ways hexlora does not undo.
    fn refuses_tensors(&self) -> bool {
        false
    }
}

/// The common names only, nothing rewritten.
pub struct Plain;
impl Conventions for Plain {}

/// Tensors refused (metadata and tokenizer still readable).
pub struct RefusedTensors;
impl Conventions for RefusedTensors {
    fn refuses_tensors(&self) -> bool {
        true
    }
}

/// One tensor's converter rewrite, undone on read.
pub trait Rewrite: Send + Sync {
    /// `stored` (HF name, the file's data, dims reversed) back in HF
    /// convention; `gguf` for the metadata it depends on.
    fn apply(&self, gguf: &Gguf, stored: &RawTensor<'_>) -> Result<Rewritten>;
}

/// A rewritten tensor in HF convention (owned bytes).
#[derive(Clone, Debug)]
pub struct Rewritten {
    /// Storage type (F32 when values changed).
    pub dtype: DType,
    /// HF shape.
    pub shape: Vec<usize>,
    /// The data.
    pub bytes: Vec<u8>,
}

/// What the header, metadata and tensor infos say.
#[derive(Debug)]
struct Parsed {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_start: usize,
}

impl Gguf {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only mapping; a file changed underneath a running
        // process is outside what we defend against (as for any mmap).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let what = path.display().to_string();
        let parsed = parse(&map, &what)?;
        Self::from_parts(what, map, parsed)
    }

    /// Parses a GGUF file held in memory (fuzzing, generated files); `what`
    /// names it in errors. The bytes are copied into an anonymous mapping.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Self> {
        let parsed = parse(bytes, what)?;
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).map_err(|e| Error::format(what, format!("anonymous mapping: {e}")))?;
        map.copy_from_slice(bytes);
        let map = map.make_read_only().map_err(|e| Error::format(what, format!("anonymous mapping: {e}")))?;
        Self::from_parts(what.to_string(), map, parsed)
    }

    fn from_parts(what: String, map: Mmap, parsed: Parsed) -> Result<Self> {
        let mut this = Gguf {
            what,
            map,
            parsed,
            hf_index: HashMap::new(),
            hf_names: Vec::new(),
            rewrites: Vec::new(),
            refused_arch: None,
        };
        let arch = this.architecture().unwrap_or("").to_string();
        let conventions = crate::model::arch::gguf_conventions(&arch);
        if conventions.refuses_tensors() {
            this.refused_arch = Some(arch);
        }
        // A LoRA adapter file names its base's architecture but holds no
        // head counts; its factors are mapped by `model::gguf_adapter`.
        let adapter = this.value("general.type").and_then(Value::as_str) == Some("adapter");
        let mut rewrites = Vec::with_capacity(this.parsed.tensors.len());
        for (i, t) in this.parsed.tensors.iter().enumerate() {
            let hf = hf_name_with(&t.name, |rest| conventions.layer_name(rest));
            if this.hf_index.insert(hf.clone(), i).is_some() {
                return Err(Error::format(&this.what, format!("tensor {hf} appears twice")));
            }
            this.hf_names.push(hf);
            let rewrite = if adapter { None } else { conventions.rewrite(&this, &t.name)? };
            rewrites.push(rewrite.map(|r| (r, OnceLock::new())));
        }
        this.rewrites = rewrites;
        Ok(this)
    }

    /// The file's name, as errors give it.
    pub fn name(&self) -> &str {
        &self.what
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.parsed.metadata
    }

    /// Tensor infos in file order, GGUF names and dims.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// Byte offset of the data section.
    pub fn data_start(&self) -> usize {
        self.parsed.data_start
    }

    /// The value of `key`, if present.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.parsed.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`: the model family's name.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.value(key)
            .ok_or_else(|| Error::format(&self.what, format!("metadata key {key} is missing")))
    }

    fn wrong_type(&self, key: &str, want: &str, got: &Value) -> Error {
        Error::format(&self.what, format!("metadata {key} is {}, expected {want}", got.type_name()))
    }

    /// An integer key that fits in u32 (any integer type is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "an integer in u32 range", v))
    }

    /// An integer key that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "an integer in u64 range", v))
    }

    /// A float key (f32, f64 or integer).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| self.wrong_type(key, "a number", v))
    }

    /// A bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "string", v))
    }

    /// An array key.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.wrong_type(key, "array", v)),
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "array of string", v)))
            .collect()
    }

    /// An array of integers in i32 range (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_i128()
                    .and_then(|x| i32::try_from(x).ok())
                    .ok_or_else(|| self.wrong_type(key, "array of i32", v))
            })
            .collect()
    }

    /// The tensor with GGUF name `name`, in GGUF dim order and without any
    /// un-permutation (what the file holds).
    pub fn get_gguf(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let t = self
            .parsed
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::format(&self.what, format!("missing tensor {name}")))?;
        Ok((t, &self.map[t.start..t.start + t.len]))
    }
}

impl TensorSource for Gguf {
    fn names(&self) -> Vec<String> {
        self.hf_names.clone()
    }

    fn get(&self, name: &str) -> Result<RawTensor<'_>> {
        let &i = self
            .hf_index
            .get(name)
            .ok_or_else(|| Error::format(&self.what, format!("missing tensor {name}")))?;
        if let Some(arch) = &self.refused_arch {
            return Err(Error::Unsupported(format!(
                "{}: tensors of GGUF architecture {arch} (load the Hugging Face safetensors directory instead)",
                self.what
            )));
        }
        let t = &self.parsed.tensors[i];
        let dtype = t.ggml_type.dtype().ok_or_else(|| {
            Error::Unsupported(format!(
                "tensor {name} ({}) has type {}; hexlora reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K",
                t.name, t.ggml_type.name
            ))
        })?;
        let stored = RawTensor {
            name: name.to_string(),
            dtype,
            shape: t.dims.iter().rev().copied().collect(),
            bytes: &self.map[t.start..t.start + t.len],
        };
        let Some((how, cell)) = &self.rewrites[i] else { return Ok(stored) };
        if cell.get().is_none() {
            let _ = cell.set(how.apply(self, &stored)?);
        }
        let r = cell.get().expect("set just above");
        Ok(RawTensor { name: name.to_string(), dtype: r.dtype, shape: r.shape.clone(), bytes: &r.bytes })
    }
}

/// Hugging Face name for a GGUF tensor name in the common names; unknown
/// names pass through.
pub fn hf_name(gguf: &str) -> String {
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let Some(rest) = gguf.strip_prefix("blk.") else { return gguf.into() };
    let Some((layer, rest)) = rest.split_once('.') else { return gguf.into() };
    if layer.parse::<usize>().is_err() {
        return gguf.into();
    }
    let (base, suffix) = match rest.rsplit_once('.') {
        Some((b, s @ ("weight" | "bias"))) => (b, s),
        _ => return gguf.into(),
    };
    match LAYER_TENSORS.iter().find(|(g, _)| *g == base) {
        Some((_, hf)) => format!("model.layers.{layer}.{hf}.{suffix}"),
        None => gguf.into(),
    }
}

/// Per-layer tensor names, GGUF's and Hugging Face's, common to the
/// architectures.
const LAYER_TENSORS: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The GGUF weight name of a projection module in the common names
/// (`model.layers.3.self_attn.q_proj` -> `blk.3.attn_q.weight`), the
/// inverse of [`hf_name`] for projections; `None` for other names.
pub fn gguf_projection_name(module: &str) -> Option<String> {
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, hf) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (gguf, _) = LAYER_TENSORS.iter().find(|(g, h)| *h == hf && !g.ends_with("norm"))?;
    Some(format!("blk.{layer}.{gguf}.weight"))
}

/// [`hf_name`] with an architecture's own names for some layer tensors
/// (`layer_name` of what follows `blk.N.`).
pub fn hf_name_with(gguf: &str, layer_name: impl Fn(&str) -> Option<&'static str>) -> String {
    let layer_rest = gguf.strip_prefix("blk.").and_then(|r| r.split_once('.'));
    match layer_rest {
        Some((layer, rest)) if layer.parse::<usize>().is_ok() => match layer_name(rest) {
            Some(hf) => format!("model.layers.{layer}.{hf}"),
            None => hf_name(gguf),
        },
        _ => hf_name(gguf),
    }
}

/// A bounds-checked little-endian reader over the header.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, field: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            Error::format(
                self.what,
                format!(
                    "truncated: {field} needs {n} bytes at offset {} but the file has {}",
                    self.pos,
                    self.buf.len()
                ),
            )
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn array<const N: usize>(&mut self, field: &dyn std::fmt::Display) -> Result<[u8; N]> {
        Ok(self.take(N, field)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, field: &dyn std::fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn std::fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count or length that must fit in what is left of the file, with at
    /// least `min_bytes` per item: the bound that keeps allocations honest.
    fn count(&mut self, min_bytes: usize, field: &dyn std::fmt::Display) -> Result<usize> {
        let n = self.u64(field)?;
        let limit = (self.remaining() / min_bytes.max(1)) as u64;
        if n > limit {
            return Err(Error::format(
                self.what,
                format!(
                    "{field}: count {n} is impossible, only {} bytes remain after offset {}",
                    self.remaining(),
                    self.pos
                ),
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, field: &dyn std::fmt::Display) -> Result<String> {
        let n = self.count(1, field)?;
        let bytes = self.take(n, field)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::format(self.what, format!("{field} is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, field: &dyn std::fmt::Display, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(field)?[0]),
            1 => Value::I8(self.array::<1>(field)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            4 => Value::U32(self.u32(field)?),
            5 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            7 => match self.array::<1>(field)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(Error::format(self.what, format!("{field}: bool byte {b}"))),
            },
            8 => Value::String(self.string(field)?),
            9 => {
                // Arrays of arrays exist in the spec but never in practice;
                // one level of nesting bounds the recursion.
                if depth > 1 {
                    return Err(Error::format(self.what, format!("{field}: arrays nested too deep")));
                }
                let elem = self.u32(field)?;
                let n = self.count(min_value_bytes(elem), field)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, field, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(field)?),
            11 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            t => return Err(Error::format(self.what, format!("{field}: unknown value type {t}"))),
        })
    }
}

/// Fewest bytes a value of GGUF type `ty` can occupy.
fn min_value_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// Parses the header of a whole GGUF file held in `buf`.
fn parse(buf: &[u8], what: &str) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0, what };
    let magic = c.array::<4>(&"magic")?;
    if &magic != MAGIC {
        return Err(Error::format(what, format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")")));
    }
    let version = c.u32(&"version")?;
    if (2..=3).contains(&version.swap_bytes()) {
        return Err(Error::Unsupported(format!("{what}: big-endian GGUF")));
    }
    if !(2..=3).contains(&version) {
        return Err(Error::Unsupported(format!("{what}: GGUF version {version} (2 and 3 are read)")));
    }
    // Each tensor info takes at least 8 + 4 + 4 + 8 bytes, each KV 8 + 4 + 1.
    let n_tensors = c.count(24, &"tensor count")?;
    let n_kv = c.count(13, &"metadata count")?;
    let mut metadata = Vec::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&format_args!("metadata key #{i}"))?;
        let ty = c.u32(&format_args!("type of metadata {key}"))?;
        let v = c.value(ty, &format_args!("metadata {key}"), 0)?;
        metadata.push((key, v));
    }
    let alignment = alignment(&metadata, what)?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut rel = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format_args!("tensor name #{i}"))?;
        let (info, offset) = tensor_info(&mut c, name)?;
        tensors.push(info);
        rel.push(offset);
    }
    let data_start = c.pos.div_ceil(alignment) * alignment;
    for (t, offset) in tensors.iter_mut().zip(rel) {
        place(t, offset, data_start, alignment, buf.len(), what)?;
    }
    Ok(Parsed { version, metadata, tensors, data_start })
}

fn alignment(metadata: &[(String, Value)], what: &str) -> Result<usize> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_i128() {
        Some(a) if a > 0 && a <= 1 << 20 && (a as usize).is_power_of_two() => Ok(a as usize),
        _ => Err(Error::format(what, format!("general.alignment {v:?} is not a power of two"))),
    }
}

/// Reads one tensor info after its name; returns it with its relative offset.
fn tensor_info(c: &mut Cursor, name: String) -> Result<(TensorInfo, u64)> {
    let n_dims = c.u32(&format_args!("n_dims of tensor {name}"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::format(c.what, format!("tensor {name}: {n_dims} dims (1 to 4 allowed)")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let n = c.u64(&format_args!("dim {d} of tensor {name}"))?;
        dims.push(usize::try_from(n).map_err(|_| Error::format(c.what, format!("tensor {name}: dim {n}")))?);
    }
    let id = c.u32(&format_args!("type of tensor {name}"))?;
    let ggml_type = GgmlType::from_id(id)
        .ok_or_else(|| Error::format(c.what, format!("tensor {name}: unknown GGML type id {id}")))?;
    let offset = c.u64(&format_args!("offset of tensor {name}"))?;
    // Shapes are read reversed (outermost first), so every order of the
    // dims must multiply without overflow: the nonzero dims' product bounds
    // every partial product (dims [0, 2^40, 2^40] overflowed once reversed).
    let nonzero = dims.iter().filter(|&&d| d != 0).try_fold(1usize, |a, &d| a.checked_mul(d));
    let n = nonzero.and_then(|_| dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)));
    let len = n.filter(|n| dims[0] % ggml_type.block_len == 0 && *n % ggml_type.block_len == 0)
        .and_then(|n| (n / ggml_type.block_len).checked_mul(ggml_type.block_bytes))
        .ok_or_else(|| {
            Error::format(
                c.what,
                format!("tensor {name}: dims {dims:?} do not fit {} blocks of {}", ggml_type.name, ggml_type.block_len),
            )
        })?;
    Ok((TensorInfo { name, ggml_type, dims, start: 0, len }, offset))
}

/// Fixes the absolute position of `t` and checks it lies inside the file.
fn place(t: &mut TensorInfo, offset: u64, data_start: usize, align: usize, file_len: usize, what: &str) -> Result<()> {
    if offset % align as u64 != 0 {
        return Err(Error::format(what, format!("tensor {}: offset {offset} not aligned to {align}", t.name)));
    }
    let start = usize::try_from(offset).ok().and_then(|o| o.checked_add(data_start));
    match start.and_then(|s| s.checked_add(t.len).map(|e| (s, e))) {
        Some((s, e)) if e <= file_len => {
            t.start = s;
            Ok(())
        }
        _ => Err(Error::format(
            what,
            format!(
                "truncated: tensor {} needs {} bytes at data offset {offset} but the file has {file_len} bytes (data starts at {data_start})",
                t.name, t.len
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names() {
        assert_eq!(hf_name("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
        assert_eq!(hf_name("blk.0.ffn_norm.weight"), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name("blk.1.attn_k_norm.weight"), "model.layers.1.self_attn.k_norm.weight");
        assert_eq!(hf_name("blk.1.attn_v.bias"), "model.layers.1.self_attn.v_proj.bias");
        assert_eq!(hf_name("output.weight"), "lm_head.weight");
        assert_eq!(hf_name("rope_freqs.weight"), "rope_freqs.weight");
        assert_eq!(hf_name("blk.x.attn_q.weight"), "blk.x.attn_q.weight");
    }

    #[test]
    fn dims_whose_product_overflows_in_any_order_are_refused() {
        // fuzz/regressions/gguf_read/dims-overflow-reversed: [0, 2^40, 2^40]
        // multiplies to 0 in file order but overflows as the HF shape.
        use crate::model::gguf_writer::{GgufWriter, TensorOut};
        let mut w = GgufWriter::default();
        w.kv("general.architecture", Value::String("hexlora-test".into()));
        w.tensor(TensorOut { name: "t".into(), ggml_type: 0, dims: vec![0, 1 << 40, 1 << 40], bytes: vec![] });
        let err = Gguf::from_bytes(&w.to_bytes().unwrap(), "dims.gguf").err().expect("refused").to_string();
        assert!(err.contains("dims.gguf") && err.contains("do not fit"), "{err}");
        let crash = include_bytes!("../../../fuzz/regressions/gguf_read/dims-overflow-reversed");
        if let Ok(g) = Gguf::from_bytes(crash, "crash.gguf") {
            for name in g.names() {
                let _ = g.get(&name).and_then(|raw| raw.to_f32());
            }
        }
    }
}

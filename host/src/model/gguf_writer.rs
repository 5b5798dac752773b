//! GGUF v3 writer: the layout [`crate::model::gguf`] reads (see its module
//! doc), metadata in insertion order, tensors aligned to
//! [`DEFAULT_ALIGNMENT`]. Used for LoRA adapters llama.cpp loads
//! ([`crate::model::gguf_adapter`]); the file is written atomically.
use crate::model::gguf::{Value, DEFAULT_ALIGNMENT, MAGIC};
use crate::base::atomic_write::write_atomic;
use crate::{Error, Result};
use std::path::Path;

/// One tensor to write, in GGUF conventions.
pub struct TensorOut {
    /// GGUF name (`blk.0.attn_q.weight.lora_a`).
    pub name: String,
    /// GGML type id (0 F32, 1 F16, 8 Q8_0).
    pub ggml_type: u32,
    /// Dims innermost (contiguous) first, as ggml's `ne`.
    pub dims: Vec<usize>,
    /// The stored bytes.
    pub bytes: Vec<u8>,
}

/// Builds a GGUF file in memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorOut>,
}

impl GgufWriter {
    /// Adds a metadata entry (kept in call order).
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor (kept in call order).
    pub fn tensor(&mut self, t: TensorOut) -> &mut Self {
        self.tensors.push(t);
        self
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut b = MAGIC.to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            string(&mut b, k);
            b.extend(type_id(v)?.to_le_bytes());
            value(&mut b, v)?;
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            string(&mut b, &t.name);
            b.extend((t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                b.extend((d as u64).to_le_bytes());
            }
            b.extend(t.ggml_type.to_le_bytes());
            b.extend((offset as u64).to_le_bytes());
            offset = (offset + t.bytes.len()).next_multiple_of(DEFAULT_ALIGNMENT);
        }
        pad(&mut b);
        for t in &self.tensors {
            b.extend_from_slice(&t.bytes);
            pad(&mut b);
        }
        Ok(b)
    }

    /// Writes the file atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.to_bytes()?)
    }
}

fn pad(b: &mut Vec<u8>) {
    b.resize(b.len().next_multiple_of(DEFAULT_ALIGNMENT), 0);
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn type_id(v: &Value) -> Result<u32> {
    Ok(match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    })
}

fn value(b: &mut Vec<u8>, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend(x.to_le_bytes()),
        Value::U16(x) => b.extend(x.to_le_bytes()),
        Value::I16(x) => b.extend(x.to_le_bytes()),
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::I32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::String(s) => string(b, s),
        Value::U64(x) => b.extend(x.to_le_bytes()),
        Value::I64(x) => b.extend(x.to_le_bytes()),
        Value::F64(x) => b.extend(x.to_le_bytes()),
        Value::Array(items) => {
            let elem = items.first().map(type_id).transpose()?.unwrap_or(4);
            if items.iter().any(|i| type_id(i).ok() != Some(elem)) {
                return Err(Error::invalid("GGUF array", "elements of more than one type"));
            }
            b.extend(elem.to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            for i in items {
                value(b, i)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::Gguf;

    #[test]
    fn the_reader_reads_back_metadata_and_tensors() {
        let mut w = GgufWriter::default();
        w.kv("general.architecture", Value::String("llama".into()))
            .kv("general.type", Value::String("adapter".into()))
            .kv("adapter.lora.alpha", Value::F32(8.0))
            .kv("list", Value::Array(vec![Value::U32(1), Value::U32(2)]));
        let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor(TensorOut { name: "t.lora_a".into(), ggml_type: 0, dims: vec![3, 1], bytes: data.clone() });
        w.tensor(TensorOut { name: "u".into(), ggml_type: 1, dims: vec![2], bytes: vec![0, 0x3c, 0, 0x40] });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.gguf");
        w.write(&path).unwrap();
        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.get_str("general.type").unwrap(), "adapter");
        assert_eq!(g.get_f32("adapter.lora.alpha").unwrap(), 8.0);
        let (info, bytes) = g.get_gguf("t.lora_a").unwrap();
        assert_eq!((info.dims.clone(), bytes), (vec![3, 1], &data[..]));
        let (info, bytes) = g.get_gguf("u").unwrap();
        assert_eq!((info.ggml_type.name, bytes), ("F16", &[0, 0x3c, 0, 0x40][..]));
        assert_eq!(info.start % DEFAULT_ALIGNMENT, 0);
    }
}

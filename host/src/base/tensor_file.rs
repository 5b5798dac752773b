//! Named f32 tensors to and from safetensors bytes: adapters, gradient
//! dumps and optimizer commits all use this. Reading accepts f32, f16 and
//! bf16 (PEFT saves in the model's dtype) and converts to f32.
use crate::base::dtype::RawTensor;
use crate::tensor::Tensor;
use crate::{Error, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// Tensors by name (sorted, so files are byte-identical run to run) plus
/// the free-form string metadata of the header.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TensorFile {
    /// The tensors.
    pub tensors: BTreeMap<String, Tensor>,
    /// `__metadata__` of the header.
    pub metadata: BTreeMap<String, String>,
}

impl TensorFile {
    /// Serialises every tensor as little-endian f32.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let views = f32_views(self.tensors.iter().map(|(k, t)| (k.clone(), t)))?;
        safetensors::tensor::serialize(views, header_metadata(&self.metadata)).map_err(|e| Error::format("safetensors", e.to_string()))
    }

    /// Writes the file atomically (see [`write_tensors_atomic`]).
    pub fn write_atomic(&self, path: &std::path::Path) -> Result<()> {
        write_tensors_atomic(path, self.tensors.iter().map(|(k, t)| (k.clone(), t)), &self.metadata)
    }

    /// Parses safetensors bytes; `what` names the file in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<TensorFile> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| Error::format(what, e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| Error::format(what, e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let data = to_f32(&view).map_err(|msg| Error::format(format!("{what}: tensor {name}"), msg))?;
            tensors.insert(name, Tensor { shape: view.shape().to_vec(), data });
        }
        let metadata = header.metadata().clone().unwrap_or_default().into_iter().collect();
        Ok(TensorFile { tensors, metadata })
    }

    /// Reads a file.
    pub fn read(path: &std::path::Path) -> Result<TensorFile> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// The tensor `name`, or an error naming the file and the tensor.
    pub fn get(&self, name: &str, what: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| Error::format(what, format!("missing tensor {name}")))
    }
}

/// An error naming tensor `name` of file `what` and its first NaN or
/// infinity, if it holds one: a factor that is not finite would poison
/// every output it touches, far from its cause.
pub fn check_finite(name: &str, t: &Tensor, what: &str) -> Result<()> {
    match t.data.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(Error::NonFinite(format!("{what}: tensor {name}, element {i} is {}", t.data[i]))),
        None => Ok(()),
    }
}

/// An f32 tensor lent to the safetensors writer, which reads its bytes in
/// place on little-endian hosts.
struct F32View<'a>(&'a Tensor);

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            // SAFETY: f32 has no padding and any byte view of it is valid.
            Cow::Borrowed(unsafe { std::slice::from_raw_parts(self.0.data.as_ptr().cast::<u8>(), 4 * self.0.data.len()) })
        } else {
            Cow::Owned(self.0.data.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
    }
    fn data_len(&self) -> usize {
        4 * self.0.data.len()
    }
}

/// Writes `tensors` as little-endian f32 safetensors with `metadata`,
/// atomically (temp file, fsync, rename), streaming from the tensors' own
/// memory: a commit of adapter + AdamW moments (56 MiB for SmolLM2 r16)
/// used to build two serialized copies first, which set the run's peak RSS.
/// Bytes are identical to [`TensorFile::to_bytes`] (same header, name order).
pub fn write_tensors_atomic<'a>(path: &std::path::Path, tensors: impl IntoIterator<Item = (String, &'a Tensor)>, metadata: &BTreeMap<String, String>) -> Result<()> {
    let views = f32_views(tensors)?;
    let meta = header_metadata(metadata);
    crate::base::atomic_write::write_atomic_with(path, &mut |tmp| {
        safetensors::tensor::serialize_to_file(views.iter().map(|(k, v)| (k.as_str(), F32View(v.0))), meta.clone(), tmp)
            .map_err(|e| Error::format(path.display().to_string(), e.to_string()))
    })
}

/// The tensors as views for the safetensors writer, each checked to hold
/// exactly its shape's values (the view lends raw memory).
fn f32_views<'a>(tensors: impl IntoIterator<Item = (String, &'a Tensor)>) -> Result<Vec<(String, F32View<'a>)>> {
    tensors
        .into_iter()
        .map(|(k, t)| {
            if t.shape.iter().product::<usize>() != t.data.len() {
                return Err(Error::format(k.as_str(), format!("shape {:?} does not hold {} values", t.shape, t.data.len())));
            }
            Ok((k, F32View(t)))
        })
        .collect()
}

/// `__metadata__` for the header (none when empty, as before).
fn header_metadata(metadata: &BTreeMap<String, String>) -> Option<HashMap<String, String>> {
    (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect())
}

/// Decodes through the model loader's converter, so f16/bf16 are read by
/// one piece of code whichever file they come from.
fn to_f32(view: &TensorView<'_>) -> std::result::Result<Vec<f32>, String> {
    let dtype = crate::base::dtype::float_dtype(view.dtype())
        .ok_or_else(|| format!("dtype {:?} is not supported (f32, f16, bf16 are)", view.dtype()))?;
    let raw = RawTensor { name: String::new(), dtype, shape: view.shape().to_vec(), bytes: view.data() };
    raw.to_f32().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_tensors_and_metadata_and_rejects_garbage() {
        let mut f = TensorFile::default();
        f.tensors.insert("a".into(), Tensor::from_vec(&[2, 3], vec![1.0, -2.0, 3.5, 0.0, 1e-30, f32::MAX]).unwrap());
        f.tensors.insert("loss".into(), Tensor::from_vec(&[1], vec![0.25]).unwrap());
        f.metadata.insert("step".into(), "7".into());
        let bytes = f.to_bytes().unwrap();
        assert_eq!(TensorFile::from_bytes(&bytes, "x").unwrap(), f);
        let err = TensorFile::from_bytes(&bytes[..bytes.len() - 3], "trunc.safetensors").unwrap_err();
        assert!(err.to_string().contains("trunc.safetensors"), "{err}");
        assert!(TensorFile::from_bytes(b"\xff\xff\xff\xff\xff\xff\xff\xffjunk", "junk").is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.safetensors");
        f.write_atomic(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "streamed file == serialized bytes");
        let bad = Tensor { shape: vec![2, 2], data: vec![1.0] };
        let err = write_tensors_atomic(&path, [("bad".to_string(), &bad)], &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("bad"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "a failed write leaves the old file");
    }
}

//! GGUF reader and dequantizers against gguf-py and transformers, and
//! against corrupt files.
//!
//! Fixtures (host/tests/fixtures/gguf/): `quant.gguf` written by gguf-py with
//! reference dequantized values (make_quant_fixture.py), and samples of the
//! SmolLM2 weights transformers loads from the GGUF
//! (make_smollm2_weights_fixture.py).
use hexlora::model::gguf::{Gguf, Value};
use hexlora::model::source::{DType, TensorSource};
use std::path::{Path, PathBuf};

use crate::support;
use support::smollm2;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf").join(name)
}

/// Reads the tensor `name` of the fixture as f32 through hexlora's own
/// F32 path (the reference values are stored as F32 tensors).
fn f32_of(g: &Gguf, name: &str) -> Vec<f32> {
    g.get(name).unwrap().to_f32().unwrap()
}

#[test]
fn metadata_of_every_type() {
    let g = Gguf::open(&fixture("quant.gguf")).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().unwrap(), "hexlora-test");
    assert_eq!(g.value("test.u8"), Some(&Value::U8(200)));
    assert_eq!(g.value("test.i8"), Some(&Value::I8(-100)));
    assert_eq!(g.value("test.u16"), Some(&Value::U16(60000)));
    assert_eq!(g.value("test.i16"), Some(&Value::I16(-30000)));
    assert_eq!(g.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(g.value("test.i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(g.get_f32("test.f32").unwrap(), 0.25);
    assert!(g.get_bool("test.bool").unwrap());
    assert_eq!(g.get_str("test.string").unwrap(), "héllo wörld");
    assert_eq!(g.get_u64("test.u64").unwrap(), 1 << 40);
    assert_eq!(g.value("test.i64"), Some(&Value::I64(-(1 << 40))));
    assert_eq!(g.value("test.f64"), Some(&Value::F64(1e-300)));
    assert_eq!(g.get_str_array("test.strings").unwrap(), vec!["a", "", "Ġthe", "<|im_start|>"]);
    assert_eq!(g.get_i32_array("test.ints").unwrap(), vec![1, -2, 3]);
    assert_eq!(g.get_u32("general.alignment").unwrap(), 64);
    assert_eq!(g.data_start() % 64, 0);
    for t in g.tensor_infos() {
        assert_eq!((t.start - g.data_start()) % 64, 0, "{}", t.name);
    }
    // Wrong types and missing keys name the key.
    let e = g.get_u32("test.i32").unwrap_err().to_string();
    assert!(e.contains("test.i32") && e.contains("i32"), "{e}");
    let e = g.get_str("test.u8").unwrap_err().to_string();
    assert!(e.contains("test.u8"), "{e}");
    let e = g.get_u32("no.such.key").unwrap_err().to_string();
    assert!(e.contains("no.such.key") && e.contains("missing"), "{e}");
}

#[test]
fn dequantization_matches_gguf_py() {
    let g = Gguf::open(&fixture("quant.gguf")).unwrap();
    let cases = [
        ("plain.f16", "plain.f32", DType::F16),
        ("plain.bf16", "plain.bf16.expected", DType::BF16),
        ("quant.q8_0", "quant.q8_0.expected", DType::Q8_0),
        ("quant.q4_0", "quant.q4_0.expected", DType::Q4_0),
        ("quant.q4_1", "quant.q4_1.expected", DType::Q4_1),
        ("quant.q4_k", "quant.q4_k.expected", DType::Q4K),
        ("quant.q6_k", "quant.q6_k.expected", DType::Q6K),
        ("quant.q5_0", "quant.q5_0.expected", DType::Q5_0),
        ("quant.q5_1", "quant.q5_1.expected", DType::Q5_1),
        ("quant.q5_k", "quant.q5_k.expected", DType::Q5K),
    ];
    for (name, reference, dtype) in cases {
        let t = g.get(name).unwrap();
        assert_eq!(t.dtype, dtype, "{name}");
        assert_eq!(t.shape, g.get(reference).unwrap().shape, "{name}: dims must be reversed to HF order");
        let got = t.to_f32().unwrap();
        let want = f32_of(&g, reference);
        if dtype == DType::F16 {
            // The f16 tensor is the f32 one rounded: within half an f16 ulp.
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= b.abs() * 1e-3 + 1e-7, "{name}: {a} vs {b}");
            }
            continue;
        }
        if matches!(dtype, DType::Q5_0 | DType::Q5_1 | DType::Q5K) {
            // Written operation for operation as gguf-py's: the same bits.
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: hexlora {a} vs gguf-py {b}");
            }
            continue;
        }
        // Same arithmetic (f16 scales widened, one multiply-add in f32):
        // allow only float reassociation noise.
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{name}[{i}]: hexlora {a} vs gguf-py {b}");
        }
    }
    assert_eq!(g.get("plain.f32").unwrap().shape, vec![3, 40]);
}

#[test]
fn unsupported_type_names_tensor_and_type() {
    let g = Gguf::open(&fixture("quant.gguf")).unwrap();
    let e = g.get("quant.q2_k").unwrap_err().to_string();
    assert!(e.contains("quant.q2_k") && e.contains("Q2_K"), "{e}");
    let e = g.get("no.such.tensor").unwrap_err().to_string();
    assert!(e.contains("missing tensor no.such.tensor"), "{e}");
}

#[test]
fn every_truncation_is_a_clear_error() {
    let good = std::fs::read(fixture("quant.gguf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    // Every prefix of the header region, then a sample of the data region.
    let lens = (0..2200).chain((2200..good.len()).step_by(97));
    for len in lens {
        std::fs::write(&path, &good[..len]).unwrap();
        let err = match Gguf::open(&path) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("truncation to {len} bytes was accepted"),
        };
        assert!(err.contains("truncated") || err.contains("magic") || err.contains("impossible"), "{len}: {err}");
    }
}

/// Byte position just after the `n`-th occurrence of `needle`.
fn after(buf: &[u8], needle: &[u8]) -> usize {
    buf.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len()
}

fn open_bytes(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    std::fs::write(&path, bytes).unwrap();
    match Gguf::open(&path) {
        Err(e) => e.to_string(),
        Ok(_) => "accepted".into(),
    }
}

#[test]
fn corrupt_headers_are_clear_errors() {
    let good = std::fs::read(fixture("quant.gguf")).unwrap();
    let patch = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        open_bytes(&b)
    };
    assert!(patch(0, b"GGML").contains("not a GGUF file"));
    assert!(patch(4, &1u32.to_le_bytes()).contains("GGUF version 1"));
    assert!(patch(4, &99u32.to_le_bytes()).contains("GGUF version 99"));
    assert!(patch(4, &3u32.to_be_bytes()).contains("big-endian"));
    // v2 has the same layout for little-endian files.
    assert_eq!(patch(4, &2u32.to_le_bytes()), "accepted");
    let e = patch(8, &u64::MAX.to_le_bytes());
    assert!(e.contains("tensor count") && e.contains("impossible"), "{e}");
    let e = patch(16, &(1u64 << 40).to_le_bytes());
    assert!(e.contains("metadata count") && e.contains("impossible"), "{e}");
    // First key's length (right after the counts).
    let e = patch(24, &u64::MAX.to_le_bytes());
    assert!(e.contains("metadata key #0") && e.contains("impossible"), "{e}");
    // The value type of test.u8, then the length of the string array.
    let at = after(&good, b"test.u8");
    let e = patch(at, &77u32.to_le_bytes());
    assert!(e.contains("test.u8") && e.contains("unknown value type 77"), "{e}");
    let at = after(&good, b"test.strings") + 8;
    let e = patch(at, &u64::MAX.to_le_bytes());
    assert!(e.contains("test.strings") && e.contains("impossible"), "{e}");
    // A tensor's n_dims, type and offset.
    let at = after(&good, b"plain.f16");
    let e = patch(at, &9u32.to_le_bytes());
    assert!(e.contains("plain.f16") && e.contains("9 dims"), "{e}");
    let e = patch(at + 4 + 16, &200u32.to_le_bytes());
    assert!(e.contains("plain.f16") && e.contains("unknown GGML type id 200"), "{e}");
    let e = patch(at + 4 + 16 + 4, &(1u64 << 50).to_le_bytes());
    assert!(e.contains("plain.f16") && e.contains("truncated"), "{e}");
    let e = patch(at + 4 + 16 + 4, &3u64.to_le_bytes());
    assert!(e.contains("plain.f16") && e.contains("not aligned"), "{e}");
    // Dims whose product overflows.
    let e = patch(at + 4, &[u64::MAX.to_le_bytes(), u64::MAX.to_le_bytes()].concat());
    assert!(e.contains("plain.f16"), "{e}");
    // A Q4_K row that is not whole super-blocks.
    let at = after(&good, b"quant.q4_k");
    let e = patch(at + 4, &100u64.to_le_bytes());
    assert!(e.contains("quant.q4_k") && e.contains("Q4_K"), "{e}");
}

#[test]
fn random_garbage_never_panics() {
    let good = std::fs::read(fixture("quant.gguf")).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..300 {
        let mut b = good[..2200].to_vec();
        for _ in 0..4 {
            let i = 8 + (next() as usize) % (b.len() - 8);
            b[i] = next() as u8;
        }
        let _ = open_bytes(&b);
    }
}

#[test]
fn smollm2_header_and_tokenizer_metadata() {
    let Some(path) = smollm2() else { return };
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(g.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(g.tensor_infos().len(), 272);
    assert!(g.names().contains(&"model.layers.29.mlp.down_proj.weight".to_string()));
    assert!(!g.names().iter().any(|n| n.starts_with("blk.")));
}

#[test]
fn smollm2_weights_match_transformers() {
    let Some(path) = smollm2() else { return };
    let g = Gguf::open(&path).unwrap();
    let text = std::fs::read_to_string(fixture("smollm2_weights.json")).unwrap();
    let fx: serde_json::Value = serde_json::from_str(&text).unwrap();
    for t in fx["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let raw = g.get(name).unwrap();
        let shape: Vec<usize> = t["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(raw.shape, shape, "{name}");
        let w = raw.to_f32().unwrap();
        for (i, v) in t["indices"].as_array().unwrap().iter().zip(t["values"].as_array().unwrap()) {
            let (i, v) = (i.as_u64().unwrap() as usize, v.as_f64().unwrap() as f32);
            assert!((w[i] - v).abs() <= 1e-6 * (1.0 + v.abs()), "{name}[{i}]: {} vs {v}", w[i]);
        }
        // Rows along the first (outermost) dim, as numpy's reshape(shape[0], -1).
        let cols = raw.n_elems() / shape[0];
        for (r, s) in t["row_sums"].as_array().unwrap().iter().enumerate() {
            let ours: f64 = w[r * cols..(r + 1) * cols].iter().map(|&x| x as f64).sum();
            let s = s.as_f64().unwrap();
            assert!((ours - s).abs() <= 1e-4 * (1.0 + s.abs()), "{name} row {r}: {ours} vs {s}");
        }
    }
}

/// A GGUF v3 file with one string key and one F32 tensor `[2]`.
fn tiny_gguf(arch: &str, tensor: &str) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, arch);
    s(&mut b, tensor);
    b.extend(1u32.to_le_bytes());
    b.extend(2u64.to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend(1.5f32.to_le_bytes());
    b.extend((-2.0f32).to_le_bytes());
    b
}

#[test]
fn qwen3next_gguf_tensors_are_refused_but_metadata_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.gguf");
    std::fs::write(&path, tiny_gguf("qwen3next", "blk.0.ssm_a")).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.architecture().unwrap(), "qwen3next");
    let e = g.get("blk.0.ssm_a").unwrap_err().to_string();
    assert!(e.contains("qwen3next") && e.contains("safetensors"), "{e}");

    // qwen35 tensors are read, but undoing the converter's head order
    // needs the ssm metadata, and its absence is named.
    std::fs::write(&path, tiny_gguf("qwen35", "blk.0.ssm_a")).unwrap();
    let g = Gguf::open(&path).unwrap();
    let e = g.get("model.layers.0.linear_attn.A_log").unwrap_err().to_string();
    assert!(e.contains("qwen35.ssm.group_count"), "{e}");

    std::fs::write(&path, tiny_gguf("qwen3", "blk.0.attn_q_norm.weight")).unwrap();
    let g = Gguf::open(&path).unwrap();
    let t = g.get("model.layers.0.self_attn.q_norm.weight").unwrap();
    assert_eq!(t.to_f32().unwrap(), vec![1.5, -2.0]);

    // A llama file must say how many heads its q/k rows are permuted by.
    std::fs::write(&path, tiny_gguf("llama", "blk.0.attn_q.weight")).unwrap();
    let e = Gguf::open(&path).err().unwrap().to_string();
    assert!(e.contains("llama.attention.head_count"), "{e}");
}

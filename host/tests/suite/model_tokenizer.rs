//! Tokenizer and chat template against transformers, for SmolLM2 loaded
//! from the GGUF (fixture: host/tests/fixtures/tokenizer/, made by
//! make_smollm2_fixture.py), plus bad tokenizer metadata.
use hexlora::model::chat::{ChatTemplate, Message};
use hexlora::model::gguf::Gguf;
use hexlora::model::tokenizer::Tokenizer;
use std::path::Path;

use crate::support;
use support::smollm2;

fn fixture() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/smollm2_tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_encode_decode_match_transformers() {
    let Some(path) = smollm2() else { return };
    let g = Gguf::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let fx = fixture();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.eos_id, Some(fx["eos_token_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.id_to_token(tok.bos_id.unwrap()).unwrap(), fx["bos_token"].as_str().unwrap());
    assert_eq!(tok.id_to_token(tok.pad_id.unwrap()).unwrap(), fx["pad_token"].as_str().unwrap());
    for case in fx["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text).unwrap();
        assert_eq!(got, ids(&case["ids"]), "encode({text:?})");
        assert_eq!(tok.decode(&got, false).unwrap(), case["decoded"].as_str().unwrap(), "decode({text:?})");
        assert_eq!(
            tok.decode(&got, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decode skip special ({text:?})"
        );
    }
    assert!(tok.decode(&[49152], false).is_err());
}

#[test]
fn smollm2_chat_template_matches_transformers() {
    let Some(path) = smollm2() else { return };
    let g = Gguf::open(&path).unwrap();
    let template = ChatTemplate::from_jinja(g.get_str("tokenizer.chat_template").unwrap()).unwrap();
    assert_eq!(
        template,
        ChatTemplate::ChatMl {
            default_system: Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face".into())
        }
    );
    let tok = Tokenizer::from_gguf(&g).unwrap();
    for case in fixture()["chat"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let text = template.render(&messages, gen);
        assert_eq!(text, case["text"].as_str().unwrap());
        assert_eq!(tok.encode(&text).unwrap(), ids(&case["ids"]));
    }
}

/// A minimal GGUF with the given metadata (GGUF v3, no tensors).
fn gguf_with(kvs: &[(&str, Kv)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, x: &str| {
        b.extend((x.len() as u64).to_le_bytes());
        b.extend(x.as_bytes());
    };
    for (k, v) in kvs {
        s(&mut b, k);
        match v {
            Kv::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            Kv::Strs(xs) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((xs.len() as u64).to_le_bytes());
                for x in xs {
                    s(&mut b, x);
                }
            }
            Kv::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
        }
    }
    b
}

enum Kv {
    Str(&'static str),
    Strs(Vec<&'static str>),
    U32(u32),
}

fn tokenizer_from(kvs: &[(&str, Kv)]) -> Result<Tokenizer, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    std::fs::write(&path, gguf_with(kvs)).unwrap();
    let g = Gguf::open(&path).map_err(|e| e.to_string())?;
    Tokenizer::from_gguf(&g).map_err(|e| e.to_string())
}

#[test]
fn tiny_gguf_bpe_and_bad_metadata() {
    let vocab = || Kv::Strs(vec!["a", "b", "ab", "Ġ", "Ġab", "<s>"]);
    let merges = || Kv::Strs(vec!["a b", "Ġ ab"]);
    let t = tokenizer_from(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.pre", Kv::Str("gpt2")),
        ("tokenizer.ggml.tokens", vocab()),
        ("tokenizer.ggml.merges", merges()),
        ("tokenizer.ggml.eos_token_id", Kv::U32(5)),
    ])
    .unwrap();
    assert_eq!(t.encode("ab ab").unwrap(), vec![2, 4]);
    assert_eq!(t.eos_id, Some(5));

    let e = tokenizer_from(&[("tokenizer.ggml.model", Kv::Str("llama"))]).err().unwrap();
    assert!(e.contains("SentencePiece") && e.contains("not supported yet"), "{e}");
    let e = tokenizer_from(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.pre", Kv::Str("mystery")),
        ("tokenizer.ggml.tokens", vocab()),
        ("tokenizer.ggml.merges", merges()),
    ])
    .err()
    .unwrap();
    assert!(e.contains("mystery"), "{e}");
    let e = tokenizer_from(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.tokens", vocab()),
        ("tokenizer.ggml.merges", Kv::Strs(vec!["nospace"])),
    ])
    .err()
    .unwrap();
    assert!(e.contains("merge #0"), "{e}");
    let e = tokenizer_from(&[
        ("tokenizer.ggml.model", Kv::Str("gpt2")),
        ("tokenizer.ggml.tokens", vocab()),
        ("tokenizer.ggml.merges", merges()),
        ("tokenizer.ggml.eos_token_id", Kv::U32(99)),
    ])
    .err()
    .unwrap();
    assert!(e.contains("eos_token_id") && e.contains("99"), "{e}");
    let e = tokenizer_from(&[("general.architecture", Kv::Str("test"))]).err().unwrap();
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn tokenizer_json_matches_transformers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/tiny-hf");
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert_eq!(tok.eos_id, Some(fx["eos_token_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.pad_id, Some(fx["pad_token_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.bos_id, None);
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text).unwrap();
        assert_eq!(got, ids(&case["ids"]), "encode({text:?})");
        assert_eq!(tok.decode(&got, false).unwrap(), case["decoded"].as_str().unwrap());
    }
}

#[test]
fn tokenizer_json_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = Tokenizer::from_hf_dir(dir.path()).err().unwrap().to_string();
    assert!(e.contains("no tokenizer.json"), "{e}");
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3").unwrap();
    let e = Tokenizer::from_hf_dir(dir.path()).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}

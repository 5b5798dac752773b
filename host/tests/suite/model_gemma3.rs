//! Gemma 3 270M from the real Q4_K_M GGUF against transformers loading the
//! same file (it dequantizes to f32 and puts the norm weights stored as
//! `1 + w` back to `w`): the tokenizer and Gemma chat template on a text set
//! (fixture: tests/fixtures/tokenizer/gemma3_tokenizer.json, made by
//! make_gemma3_fixture.py), and the next-token logits and 32 greedy tokens
//! of three prompts, one of 600 tokens, longer than the local layers'
//! 512-position sliding window (fixture: tests/fixtures/models/gemma3/,
//! made by `make_model_fixtures.py gemma3`). Then malformed Gemma 3 files,
//! written here, against the errors that must name what is wrong.
//!
//! Tolerance, as for SmolLM2 (model_smollm2.rs): both sides compute in f32
//! from identical dequantized weights, so only summation order differs; the
//! max-normalised logit error must stay below 1e-4 and the greedy tokens be
//! identical (the fixture keeps only paths whose top-2 logit gap is at
//! least 0.01 at every step). Measured: 1.2e-6 to 1.8e-6.
//!
//! Time: the file takes ~40 s in the dev profile (2 shared cores), most of
//! it the logits/greedy test and the `generate` run (the 270M model loaded
//! twice, a 600-token prompt, 96 decoding steps against a 262,144-row
//! head). It is the only check of the real Gemma 3 against transformers,
//! the must-show; `ci/aarch64-test.sh` leaves it out by default.
use hexlora::model::chat::{ChatTemplate, Message};
use hexlora::model::checkpoint::Checkpoint;
use hexlora::model::config::LayerKind;
use hexlora::model::decoder::Model;
use hexlora::model::generate::{decode, prefill, Sampling};
use hexlora::model::gguf::{Gguf, Value};
use hexlora::model::gguf_writer::{GgufWriter, TensorOut};
use hexlora::model::tokenizer::Tokenizer;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

use crate::support;
use support::gemma3;

fn tokenizer_fixture() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/gemma3_tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn gemma3_tokenizer_matches_transformers() {
    let Some(path) = gemma3() else { return };
    let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
    let fx = tokenizer_fixture();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.eos_id, Some(fx["eos_token_id"].as_u64().unwrap() as u32));
    assert_eq!(tok.id_to_token(tok.bos_id.unwrap()).unwrap(), fx["bos_token"].as_str().unwrap());
    assert_eq!(tok.id_to_token(tok.pad_id.unwrap()).unwrap(), fx["pad_token"].as_str().unwrap());
    for case in fx["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text).unwrap();
        assert_eq!(got, json_ids(&case["ids"]), "encode({text:?})");
        assert_eq!(tok.decode(&got, false).unwrap(), case["decoded"].as_str().unwrap(), "decode({text:?})");
        assert_eq!(tok.decode(&got, true).unwrap(), case["decoded_skip_special"].as_str().unwrap(), "decode skip special ({text:?})");
    }
}

/// transformers renders Google's template, `<bos>` included; hexlora's
/// template leaves the `<bos>` to the tokenizer. The ids must be equal.
#[test]
fn gemma3_chat_template_matches_transformers() {
    let Some(path) = gemma3() else { return };
    let ckpt = Checkpoint::open(&path).unwrap();
    let template = ckpt.template().unwrap();
    assert_eq!(template, ChatTemplate::Gemma, "a Gemma 3 GGUF without a template gets Gemma's");
    let tok = ckpt.tokenizer().unwrap();
    let end_of_turn = tok.token_to_id("<end_of_turn>").unwrap();
    assert!(tok.stop_ids(&ckpt.config.eos_token_ids).contains(&end_of_turn));
    for case in tokenizer_fixture()["chat"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let text = template.render(&messages, case["add_generation_prompt"].as_bool().unwrap());
        assert_eq!(Some(text.as_str()), case["text"].as_str().unwrap().strip_prefix("<bos>"));
        assert_eq!(tok.encode(&text).unwrap(), json_ids(&case["ids"]), "{text:?}");
    }
}

fn model_fixture() -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/gemma3/expected.safetensors")).unwrap()
}

fn ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    st.tensor(name).unwrap().data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
}

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Smallest top-2 gap the fixture script allows on a greedy path.
const MIN_GREEDY_MARGIN: f32 = 0.01;

/// One test for both checks: the greedy path continues from the prefill
/// whose logits are compared, so the 600-token prompt runs once.
#[test]
fn gemma3_logits_and_greedy_match_transformers() {
    let Some(path) = gemma3() else { return };
    let model = Model::open(&path).unwrap();
    let c = &model.config;
    assert_eq!((c.num_layers, c.hidden_size, c.n_head, c.n_kv_head, c.head_dim), (18, 640, 4, 1, 256));
    let global: Vec<usize> = (0..18).filter(|&i| c.layer_types[i] == LayerKind::FullAttention).collect();
    assert_eq!(global, [5, 11, 17]);
    let bytes = model_fixture();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for i in 0..3 {
        let prompt = ids(&st, &format!("prompt{i}.input_ids"));
        let (mut state, logits) = prefill(&model, &prompt).unwrap();
        let want = floats(&st, &format!("prompt{i}.next_logits"));
        let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
        let diff = logits.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        println!("prompt {i}: {} tokens, max |logit diff| {diff:.2e}, max-normalised {:.2e}", prompt.len(), diff / scale);
        assert!(diff / scale < 1e-4, "prompt {i}: next-token logits differ by {:.2e}", diff / scale);

        let want_tokens = ids(&st, &format!("prompt{i}.greedy"));
        let margins = floats(&st, &format!("prompt{i}.greedy_margins"));
        let min_margin = margins.iter().fold(f32::INFINITY, |m, &x| m.min(x));
        assert!(min_margin >= MIN_GREEDY_MARGIN, "prompt {i}: fixture has a near-tie ({min_margin})");
        let got = decode(&model, &mut state, logits, 32, &Sampling::greedy(), &[], |_| {}).unwrap();
        if let Some(at) = got.iter().zip(&want_tokens).position(|(a, b)| a != b) {
            panic!("prompt {i}: greedy differs at token {at} ({} vs {}); transformers' top-2 gap there {:.3e}", got[at], want_tokens[at], margins[at]);
        }
        assert_eq!(got.len(), want_tokens.len());
        println!("prompt {i}: 32 greedy tokens identical; smallest top-2 gap on the path {min_margin:.4}");
    }
}

/// The user message of the fixture's prompt 1 (rendered in Gemma's template).
const HAIKU: &str = "Write a haiku about the sea.";

/// `hexlora generate`, the serving path (weights kept in their GGUF
/// blocks where the decoding kernel reads them, Gemma's chat template,
/// stop at `<end_of_turn>` or `<eos>`), prints transformers' greedy answer.
#[test]
fn gemma3_generate_cli_prints_transformers_greedy_answer() {
    let Some(path) = gemma3() else { return };
    let bytes = model_fixture();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tok = Tokenizer::from_gguf(&Gguf::open(&path).unwrap()).unwrap();
    let prompt = tok.encode(&ChatTemplate::Gemma.render(&[Message::new("user", HAIKU)], true)).unwrap();
    assert_eq!(prompt, ids(&st, "prompt1.input_ids"), "the fixture's chat prompt");
    let want = ids(&st, "prompt1.greedy");
    let stops = tok.stop_ids(&[]);
    let end = want.iter().position(|t| stops.contains(t)).map_or(want.len(), |i| i + 1);
    let text = tok.decode(&want[..end], true).unwrap();
    let out = support::hexlora()
        .arg("generate")
        .arg("--model")
        .arg(&path)
        .args(["--prompt", HAIKU, "--max-tokens", "32"])
        .output()
        .unwrap();
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{text}\n"));
}

// Malformed files: a tiny Gemma 3 written here (6 layers, so layer 5 is
// global), then one field or tensor broken at a time.

const H: usize = 8;
const HD: usize = 4;
const FF: usize = 12;
const VOCAB: usize = 10;
const LAYERS: usize = 6;

fn f32_tensor(name: &str, dims: &[usize], fill: f32) -> TensorOut {
    let n: usize = dims.iter().product();
    let bytes = (0..n).flat_map(|i| (fill + 0.01 * i as f32).to_le_bytes()).collect();
    TensorOut { name: name.into(), ggml_type: 0, dims: dims.to_vec(), bytes }
}

/// Metadata llama.cpp's converter writes for Gemma 3 (without tokenizer
/// keys beyond the vocabulary), minus `skip`, with `extra` appended.
fn tiny_gemma3(skip_key: &str, extra: &[(&str, Value)], skip_tensor: &str) -> GgufWriter {
    let mut w = GgufWriter::default();
    let kvs: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("gemma3".into())),
        ("gemma3.context_length", Value::U32(64)),
        ("gemma3.embedding_length", Value::U32(H as u32)),
        ("gemma3.block_count", Value::U32(LAYERS as u32)),
        ("gemma3.feed_forward_length", Value::U32(FF as u32)),
        ("gemma3.attention.head_count", Value::U32(2)),
        ("gemma3.attention.head_count_kv", Value::U32(1)),
        ("gemma3.attention.key_length", Value::U32(HD as u32)),
        ("gemma3.attention.value_length", Value::U32(HD as u32)),
        ("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("gemma3.rope.freq_base", Value::F32(1e6)),
        ("gemma3.attention.sliding_window", Value::U32(3)),
        ("tokenizer.ggml.tokens", Value::Array((0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect())),
    ];
    for (k, v) in kvs.into_iter().filter(|(k, _)| *k != skip_key).chain(extra.iter().cloned()) {
        w.kv(k, v);
    }
    let mut tensors = vec![f32_tensor("token_embd.weight", &[H, VOCAB], 0.1), f32_tensor("output_norm.weight", &[H], 1.5)];
    for l in 0..LAYERS {
        let t = |n: &str, dims: &[usize]| f32_tensor(&format!("blk.{l}.{n}.weight"), dims, 0.2);
        tensors.extend([
            t("attn_norm", &[H]),
            t("attn_q", &[H, 2 * HD]),
            t("attn_k", &[H, HD]),
            t("attn_v", &[H, HD]),
            t("attn_q_norm", &[HD]),
            t("attn_k_norm", &[HD]),
            t("attn_output", &[2 * HD, H]),
            t("post_attention_norm", &[H]),
            t("ffn_norm", &[H]),
            t("ffn_gate", &[H, FF]),
            t("ffn_up", &[H, FF]),
            t("ffn_down", &[FF, H]),
            t("post_ffw_norm", &[H]),
        ]);
    }
    for t in tensors.into_iter().filter(|t| t.name != skip_tensor) {
        w.tensor(t);
    }
    w
}

fn write(dir: &Path, w: &GgufWriter) -> PathBuf {
    let path = dir.join("tiny-gemma3.gguf");
    w.write(&path).unwrap();
    path
}

/// The well-formed file: Gemma 3's layer pattern, names in transformers'
/// convention and the norm weights (stored `1 + w`) read back as `w`.
#[test]
fn tiny_gemma3_gguf_reads_in_transformers_convention() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &tiny_gemma3("", &[], ""));
    let ckpt = Checkpoint::open(&path).unwrap();
    let c = &ckpt.config;
    let kinds: Vec<LayerKind> = c.layer_types.clone();
    assert_eq!(kinds[..5], [LayerKind::SlidingAttention; 5]);
    assert_eq!(kinds[5], LayerKind::FullAttention);
    assert_eq!((c.sliding.unwrap().window, c.sliding.unwrap().rope_theta, c.rope_theta), (3, 1e4, 1e6));
    assert_eq!(c.query_pre_attn_scalar, Some(HD as f64));
    assert!(c.tie_word_embeddings);
    let norm = ckpt.tensors().get("model.layers.2.pre_feedforward_layernorm.weight").unwrap().to_f32().unwrap();
    let stored: Vec<f32> = (0..H).map(|i| 0.2 + 0.01 * i as f32).collect();
    assert_eq!(norm, stored.iter().map(|w| w - 1.0).collect::<Vec<_>>());
    let final_norm = ckpt.tensors().get("model.norm.weight").unwrap().to_f32().unwrap();
    assert_eq!(final_norm[0], 1.5 - 1.0);
    // Projections are not rewritten (no q/k permutation for Gemma).
    let q = ckpt.tensors().get("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, [2 * HD, H]);
    assert_eq!(q.to_f32().unwrap()[1], 0.2 + 0.01);
    let model = Model::open(&path).unwrap();
    let mut state = model.new_state();
    let hidden = model.forward(&[1, 2, 3, 4, 5], &mut state).unwrap();
    assert!(model.logits(&hidden).unwrap().iter().all(|x| x.is_finite()));
}

#[test]
fn malformed_gemma3_gguf_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(GgufWriter, &str)> = vec![
        (tiny_gemma3("gemma3.attention.sliding_window", &[], ""), "gemma3.attention.sliding_window"),
        (tiny_gemma3("gemma3.attention.sliding_window", &[("gemma3.attention.sliding_window", Value::U32(0))], ""), "gemma3.attention.sliding_window is 0"),
        (tiny_gemma3("", &[("gemma3.rope.scaling.type", Value::String("linear".into()))], ""), "gemma3.rope.scaling.type"),
        (tiny_gemma3("", &[("gemma3.final_logit_softcapping", Value::F32(30.0))], ""), "gemma3.final_logit_softcapping"),
        (tiny_gemma3("gemma3.attention.value_length", &[("gemma3.attention.value_length", Value::U32(8))], ""), "gemma3.attention.value_length"),
        (tiny_gemma3("gemma3.attention.layer_norm_rms_epsilon", &[], ""), "gemma3.attention.layer_norm_rms_epsilon"),
        (tiny_gemma3("", &[], "blk.3.post_ffw_norm.weight"), "model.layers.3.post_feedforward_layernorm.weight"),
        (tiny_gemma3("", &[], "blk.0.attn_k_norm.weight"), "model.layers.0.self_attn.k_norm.weight"),
    ];
    for (w, want) in cases {
        let path = write(dir.path(), &w);
        let err = match Model::open(&path) {
            Ok(_) => panic!("a file without {want} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{err:?} should name {want:?}");
    }
}

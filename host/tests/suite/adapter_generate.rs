//! Stage 3 against PyTorch + PEFT: SmolLM2 (the real Q4_1 GGUF) with the
//! `sotu` adapter trained here by `hexlora train`, applied unmerged through
//! the inference model's adapter slots, gives PEFT's next-token logits and
//! its 32 greedy tokens on three chat prompts (fixture made by
//! `tests/fixtures/adapters/make_adapter_fixtures.py`); `hexlora generate
//! --adapter` prints that text, from the PEFT directory and from the GGUF
//! file `hexlora export-gguf` writes, which reads back exactly.
//!
//! Tolerances as in `model_smollm2.rs`: both sides compute in f32 from the
//! same dequantized weights, so logits agree to 1e-4 max-normalised, and
//! the fixture keeps a top-2 gap of at least 0.01 on every greedy step.
use hexlora::model::gguf_adapter::{export, OutType};
use hexlora::lora::slots::AdapterSlots;
use hexlora::lora::Adapter;
use hexlora::model::checkpoint::Checkpoint;
use hexlora::model::decoder::{cpu_projection, Model};
use hexlora::model::generate::{generate, Sampling};
use safetensors::SafeTensors;
use std::cell::RefCell;
use std::path::{Path, PathBuf};

use crate::support;
use support::{adapter, root, smollm2 as gguf_path};

fn adapter_dir() -> PathBuf {
    adapter("sotu")
}

fn expected() -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures/adapters/sotu/expected.safetensors")).unwrap()
}

fn ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    st.tensor(name).unwrap().data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
}

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name).unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn adapter_logits_and_greedy_tokens_match_peft() {
    let Some(path) = gguf_path() else { return };
    let ckpt = Checkpoint::open(&path).unwrap();
    let slots = RefCell::new(AdapterSlots::default());
    let model = Model::load(ckpt.config.clone(), ckpt.tensors(), &|info, raw| Ok(slots.borrow_mut().wrap(cpu_projection(info, raw)?))).unwrap();
    let slots = slots.into_inner();
    slots.set(Some(&Adapter::open(&adapter_dir(), &ckpt.config).unwrap())).unwrap();
    let bytes = expected();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for i in 0..3 {
        let prompt = ids(&st, &format!("prompt{i}.input_ids"));
        let want = floats(&st, &format!("prompt{i}.next_logits"));
        let mut state = model.new_state();
        let hidden = model.forward(&prompt, &mut state).unwrap();
        let got = model.logits(&hidden[hidden.len() - model.config.hidden_size..]).unwrap();
        let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
        let diff = got.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(diff / scale < 1e-4, "prompt {i}: next-token logits differ by {:.2e} (max-normalised)", diff / scale);
        let margins = floats(&st, &format!("prompt{i}.greedy_margins"));
        assert!(margins.iter().all(|&m| m >= 0.01), "prompt {i}: the fixture has a near-tie");
        let tokens = generate(&model, &prompt, 32, &Sampling::greedy(), &[], |_| {}).unwrap();
        assert_eq!(tokens, ids(&st, &format!("prompt{i}.greedy")), "prompt {i}: greedy tokens with the adapter");
        println!("prompt {i}: logits within {:.2e}, 32 greedy tokens identical to PEFT", diff / scale);
    }
    // Cleared slots give the base model's greedy path back.
    slots.set(None).unwrap();
    let prompt = ids(&st, "prompt1.input_ids");
    let base = generate(&model, &prompt, 32, &Sampling::greedy(), &[], |_| {}).unwrap();
    assert_eq!(base, ids(&st, "prompt1.base_greedy"));
}

/// `hexlora generate` text (stdout, without the final newline).
fn generate_cli(model: &Path, adapter: &Path, prompt: &str) -> String {
    let out = support::hexlora()
        .args(["generate", "--max-tokens", "32", "--prompt", prompt])
        .arg("--model")
        .arg(model)
        .arg("--adapter")
        .arg(adapter)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().strip_suffix('\n').unwrap().to_string()
}

#[test]
fn generate_cli_prints_peft_text_from_the_peft_directory_and_from_the_exported_gguf() {
    let Some(path) = gguf_path() else { return };
    let ckpt = Checkpoint::open(&path).unwrap();
    let tok = ckpt.tokenizer().unwrap();
    let peft = Adapter::open(&adapter_dir(), &ckpt.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("sotu.gguf");
    export(&peft, &ckpt.config, OutType::F32, &gguf).unwrap();
    assert_eq!(Adapter::open(&gguf, &ckpt.config).unwrap().modules, peft.modules, "f32 GGUF round trip is exact");
    let prompts: Vec<String> = serde_json::from_str(&std::fs::read_to_string(root().join("tests/fixtures/models/smollm2/prompts.json")).unwrap()).unwrap();
    let bytes = expected();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for (i, prompt) in prompts.iter().enumerate() {
        // generate stops at the end of the assistant's turn; the fixture runs on.
        let want = ids(&st, &format!("prompt{i}.greedy"));
        let end = want.iter().position(|&t| t == tok.token_to_id("<|im_end|>").unwrap()).unwrap_or(want.len());
        let text = tok.decode(&want[..end], true).unwrap();
        assert_eq!(generate_cli(&path, &adapter_dir(), prompt), text, "prompt {i}, PEFT directory");
        assert_eq!(generate_cli(&path, &gguf, prompt), text, "prompt {i}, GGUF adapter");
    }
}

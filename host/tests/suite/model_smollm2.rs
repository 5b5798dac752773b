//! SmolLM2-135M-Instruct from the real Q4_1 GGUF against transformers loading
//! the same file (it dequantizes to f32 and undoes llama.cpp's q/k
//! permutation): next-token logits on three chat prompts, and 32 greedy
//! tokens each. Expected values: `tests/fixtures/models/smollm2/`, made by
//! `make_model_fixtures.py smollm2`.
//!
//! Tolerance: both sides compute in f32 from identical dequantized weights,
//! so only summation order differs; we require a max-normalised logit error
//! below 1e-4 (measured: ~2e-6) and exactly the same 32 greedy tokens. Exact
//! equality is a fair demand because the fixture script only keeps prompts
//! whose reference greedy path has a top-2 logit gap of at least 0.01 at
//! every step (stored per step; the smallest is asserted here too), orders
//! of magnitude above the f32 differences between the two implementations.
//!
//! The reference path comes from `generate` with an explicit all-ones
//! attention mask: these ChatML prompts contain `<|im_end|>` (id 2), which
//! is also the pad id, and without a mask transformers infers one that hides
//! those prompt positions (that made an earlier fixture's prompt 1 pick
//! 5065 over 6147 at step 1, against its own unmasked forward).
use hexlora::model::decoder::Model;
use hexlora::model::generate::{generate, Sampling};
use safetensors::SafeTensors;
use std::path::PathBuf;

use crate::support;
use support::smollm2 as gguf_path;

fn expected() -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/smollm2/expected.safetensors"))
        .unwrap()
}

fn ids(st: &SafeTensors, name: &str) -> Vec<u32> {
    let t = st.tensor(name).unwrap();
    t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect()
}

fn floats(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap();
    t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn smollm2_next_token_logits_match_transformers() {
    let Some(path) = gguf_path() else { return };
    let model = Model::open(&path).unwrap();
    let bytes = expected();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for i in 0..3 {
        let prompt = ids(&st, &format!("prompt{i}.input_ids"));
        let want = floats(&st, &format!("prompt{i}.next_logits"));
        let mut state = model.new_state();
        let hidden = model.forward(&prompt, &mut state).unwrap();
        let h = model.config.hidden_size;
        let got = model.logits(&hidden[hidden.len() - h..]).unwrap();
        let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
        let diff = got.iter().zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        println!("prompt {i}: {} tokens, max |logit diff| {diff:.2e}, max-normalised {:.2e}", prompt.len(), diff / scale);
        assert!(diff / scale < 1e-4, "prompt {i}: next-token logits differ by {:.2e}", diff / scale);
    }
}

/// Smallest top-2 gap the fixture script allows on a greedy path.
const MIN_GREEDY_MARGIN: f32 = 0.01;

#[test]
fn smollm2_greedy_matches_transformers() {
    let Some(path) = gguf_path() else { return };
    let model = Model::open(&path).unwrap();
    let bytes = expected();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    // Under qemu (ci/aarch64-test.sh sets 1) one prompt's 32 tokens cover
    // the decoding kernels; the other two cost ~250 s of emulation there.
    let prompts: usize = std::env::var("HEXLORA_GREEDY_PROMPTS").map_or(3, |v| v.parse().expect("HEXLORA_GREEDY_PROMPTS: a count"));
    for i in 0..prompts.min(3) {
        let prompt = ids(&st, &format!("prompt{i}.input_ids"));
        let want_tokens = ids(&st, &format!("prompt{i}.greedy"));
        let margins = floats(&st, &format!("prompt{i}.greedy_margins"));
        let min_margin = margins.iter().fold(f32::INFINITY, |m, &x| m.min(x));
        assert!(min_margin >= MIN_GREEDY_MARGIN, "prompt {i}: fixture has a near-tie ({min_margin})");
        let got_tokens = generate(&model, &prompt, 32, &Sampling::greedy(), &[], |_| {}).unwrap();
        if let Some(at) = got_tokens.iter().zip(&want_tokens).position(|(a, b)| a != b) {
            let ours = top2_margin(&model, &[&prompt[..], &want_tokens[..at]].concat());
            panic!(
                "prompt {i}: greedy differs at token {at} ({} vs {}); top-2 gap there: ours {ours:.3e}, transformers {:.3e}",
                got_tokens[at], want_tokens[at], margins[at]
            );
        }
        assert_eq!(got_tokens.len(), want_tokens.len());
        println!("prompt {i}: 32 greedy tokens identical; smallest top-2 gap on the path {min_margin:.4}");
    }
}

/// Gap between the two largest next-token logits after `ids`.
fn top2_margin(model: &Model, ids: &[u32]) -> f32 {
    let mut state = model.new_state();
    let hidden = model.forward(ids, &mut state).unwrap();
    let mut l = model.logits(&hidden[hidden.len() - model.config.hidden_size..]).unwrap();
    l.sort_by(|a, b| b.total_cmp(a));
    l[0] - l[1]
}

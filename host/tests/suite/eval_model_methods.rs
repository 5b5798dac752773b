//! The model-backed evaluation path on the real SmolLM2-135M: the answer
//! log-likelihoods the classification methods rank labels by (inference
//! model, KV cache forked per answer, LoRA through adapter slots) must equal
//! the training graph's token loss on the same prompt + answer with the same
//! adapter (a different code path: full-sequence tape forward, fused head +
//! cross-entropy, the graph's own LoRA branch).
use hexlora::base::counter_rng;
use hexlora::eval::model_runtime::{EvalModel, LabelScore};
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::model::chat::Message;
use hexlora::train::grad::evaluate;

use crate::support;

fn model() -> Option<EvalModel> {
    Some(EvalModel::open(&support::smollm2()?).unwrap())
}

/// A LoRA with non-zero B, so the branch changes the logits.
fn adapter(m: &EvalModel) -> Adapter {
    let config = LoraConfig { r: 4, alpha: 8.0, target_modules: vec!["q_proj".into(), "down_proj".into()], dropout: 0.0, use_rslora: false, base_model: String::new() };
    let mut ad = Adapter::init(config, &m.graph.projections(), 11).unwrap();
    for (k, module) in ad.modules.iter_mut().enumerate() {
        let s = counter_rng::derive(12, k as u64);
        module.b.data.iter_mut().enumerate().for_each(|(i, v)| *v = 0.05 * counter_rng::normal(s, i as u64));
    }
    ad
}

#[test]
fn answer_logprobs_equal_the_training_graph_loss_with_and_without_lora() {
    let Some(m) = model() else { return };
    let messages = [Message::new("user", "Name a colour.")];
    let answers = ["blue".to_string(), "dark red".to_string()];
    let ad = adapter(&m);
    for adapter in [None, Some(&ad)] {
        m.set_adapter(adapter).unwrap();
        let prompt = m.prompt_ids(&messages).unwrap();
        let got = m.answer_logprobs(&prompt, &answers).unwrap();
        // the per-token score is the graph's mean loss, negated
        let per_token = m.answer_scores(&prompt, &answers, LabelScore::Mean).unwrap();
        let empty = Adapter { config: ad.config.clone(), modules: Vec::new() };
        for ((a, lp), pt) in answers.iter().zip(&got).zip(&per_token) {
            let batch = m.example(&messages, a, 4096).unwrap();
            let n = batch.target_count() as f64;
            assert_eq!(n as usize, m.answer_ids(a).unwrap().len());
            let mean = evaluate(&*m.graph, adapter.unwrap_or(&empty), &[batch]).unwrap() as f64;
            let want = -mean * n;
            assert!((lp - want).abs() < 2e-3 * want.abs().max(1.0), "{a:?} with lora {}: {lp} vs graph {want}", adapter.is_some());
            assert!((pt + mean).abs() < 2e-3 * mean.abs().max(1.0), "{a:?} with lora {}: per token {pt} vs graph {}", adapter.is_some(), -mean);
        }
    }
    m.set_adapter(None).unwrap();
    let base = m.answer_logprobs(&m.prompt_ids(&messages).unwrap(), &answers).unwrap();
    m.set_adapter(Some(&ad)).unwrap();
    let tuned = m.answer_logprobs(&m.prompt_ids(&messages).unwrap(), &answers).unwrap();
    assert!((base[0] - tuned[0]).abs() > 1e-3, "the adapter must change the scores");
}

#[test]
fn example_cuts_the_prompt_from_the_left_and_keeps_the_answer() {
    let Some(m) = model() else { return };
    let messages = [Message::new("user", &"word ".repeat(200))];
    let b = m.example(&messages, "short answer", 40).unwrap();
    assert_eq!(b.input_ids[0].len(), 40);
    let answer = m.answer_ids("short answer").unwrap();
    assert_eq!(&b.input_ids[0][40 - answer.len()..], &answer[..]);
    assert_eq!(b.target_count(), answer.len());
}

#[test]
fn generate_samples_equal_one_generate_per_seed() {
    let Some(m) = model() else { return };
    let prompt = m.prompt_ids(&[Message::new("user", "Write a subject line for a mail about the budget meeting.")]).unwrap();
    let ad = adapter(&m);
    for (adapter, t) in [(None, 0.0f32), (None, 0.7), (Some(&ad), 1.0)] {
        m.set_adapter(adapter).unwrap();
        let seeds = [1u64, 2, 3];
        let got = m.generate_samples(&prompt, t, &seeds, 10).unwrap();
        let want: Vec<String> = seeds.iter().map(|&s| m.generate(&prompt, t, s, 10).unwrap()).collect();
        assert_eq!(got, want, "T={t}, lora {}", adapter.is_some());
        if t > 0.5 {
            assert!(want.iter().any(|w| w != &want[0]), "seeds must give different samples at T={t}: {want:?}");
        }
    }
    assert!(m.generate_samples(&[], 0.0, &[1], 4).is_err());
}

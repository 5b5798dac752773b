//! The fuzz targets' bodies (`fuzz/bodies/`), run natively in the test
//! suite: over every kept regression input (`fuzz/regressions/TARGET`,
//! past findings), the seeds `ci/fuzz.sh` builds from the fixtures, and a
//! fixed number of mutants of each seed (bit flips, special bytes,
//! truncations, repeated and deleted runs; half of them in the first KiB,
//! where the headers and the JSON are). A body panics on a finding; every
//! panicking input is named and written to `target/fuzz-replay/TARGET/`.
//!
//! This is the part of fuzzing that belongs in every test run: no past
//! finding comes back, and the parsers survive a few thousand damaged
//! inputs. Coverage-guided fuzzing under the address sanitizer is
//! `ci/fuzz.sh` (its long pass is recorded in fuzz/README.md).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../../../fuzz/bodies/decode_message.rs"]
mod decode_message;
#[path = "../../../fuzz/bodies/gguf_read.rs"]
mod gguf_read;
#[path = "../../../fuzz/bodies/hf_dir.rs"]
mod hf_dir;
#[path = "../../../fuzz/bodies/http_request.rs"]
mod http_request;
#[path = "../../../fuzz/bodies/peft_adapter.rs"]
mod peft_adapter;
#[path = "../../../fuzz/bodies/skel_invoke.rs"]
mod skel_invoke;
#[path = "../../../fuzz/bodies/training_jsonl.rs"]
mod training_jsonl;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(rel: &str) -> Vec<u8> {
    let p = repo().join("host/tests/fixtures").join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The two-file input form of `hf_dir` and `peft_adapter`: the u16 LE
/// length of the JSON, the JSON, the safetensors bytes (as `ci/fuzz.sh`'s
/// `pair`).
fn pair(dir: &str, json: &str, weights: &str) -> Vec<u8> {
    let j = fixture(&format!("{dir}/{json}"));
    let mut v = (j.len() as u16).to_le_bytes().to_vec();
    v.extend_from_slice(&j);
    v.extend_from_slice(&fixture(&format!("{dir}/{weights}")));
    v
}

fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = repo().join("fuzz/regressions").join(target);
    let mut v: Vec<(String, Vec<u8>)> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .map(|p| (format!("regression {}", p.display()), std::fs::read(&p).unwrap()))
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// xorshift64*: a fixed stream, so every run tries the same mutants.
struct Stream(u64);

impl Stream {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four mutations of `seed`; half the time confined to its first KiB.
fn mutant(seed: &[u8], s: &mut Stream) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + s.below(4) {
        if v.is_empty() {
            v.push(s.next() as u8);
            continue;
        }
        let span = if s.below(2) == 0 { v.len().min(1024) } else { v.len() };
        let at = s.below(span);
        match s.below(6) {
            0 => v[at] ^= 1 << s.below(8),
            1 => v[at] = [0x00, 0xff, 0x7f, 0x80, 0x01, b'"', b'-', b'9'][s.below(8)],
            2 => v.truncate(at),
            3 => {
                let n = 1 + s.below(16.min(v.len() - at));
                let run = v[at..at + n].to_vec();
                v.splice(at..at, run);
            }
            4 => {
                let n = 1 + s.below(16.min(v.len() - at));
                v.drain(at..at + n);
            }
            _ => {
                let w = (s.next() as u32).to_le_bytes();
                let n = 4.min(v.len() - at);
                v[at..at + n].copy_from_slice(&w[..n]);
            }
        }
    }
    v
}

/// Runs `body` over the regression inputs, the seeds and `per_seed`
/// mutants of each; fails naming every input that panicked.
fn replay(target: &str, body: fn(&[u8]), seeds: Vec<(String, Vec<u8>)>, per_seed: usize) {
    let mut inputs = regressions(target);
    let mut s = Stream(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
    for (name, seed) in &seeds {
        for i in 0..per_seed {
            inputs.push((format!("mutant {i} of {name}"), mutant(seed, &mut s)));
        }
    }
    inputs.extend(seeds);
    let out = repo().join("target/fuzz-replay").join(target);
    let mut found = Vec::new();
    for (name, bytes) in &inputs {
        if catch_unwind(AssertUnwindSafe(|| body(bytes))).is_err() {
            std::fs::create_dir_all(&out).unwrap();
            let file = out.join(format!("finding-{}", found.len()));
            std::fs::write(&file, bytes).unwrap();
            found.push(format!("{name} (written to {})", file.display()));
        }
    }
    assert!(found.is_empty(), "{target}: {} of {} inputs panicked:\n{}", found.len(), inputs.len(), found.join("\n"));
    println!("{target}: {} inputs, no panic", inputs.len());
}

/// `n` pseudo-random inputs of 0..max bytes (for the targets whose inputs
/// have no fixture: protocol messages and invocation choices).
fn random_seeds(n: usize, max: usize, salt: u64) -> Vec<(String, Vec<u8>)> {
    let mut s = Stream(0x5851_f42d_4c95_7f2d ^ salt);
    (0..n)
        .map(|i| {
            let len = s.below(max + 1);
            (format!("random input {i}"), (0..len).map(|_| s.next() as u8).collect())
        })
        .collect()
}

#[test]
fn decode_message_survives_its_regressions_and_random_messages() {
    replay("decode_message", decode_message::run, random_seeds(5000, 96, 1), 4);
}

#[test]
fn skel_invoke_survives_its_regressions_and_random_invocations() {
    replay("skel_invoke", skel_invoke::run, random_seeds(2000, 512, 2), 2);
}

#[test]
fn gguf_read_survives_its_regressions_and_damaged_fixtures() {
    let seeds = vec![
        ("gguf/quant.gguf".to_string(), fixture("gguf/quant.gguf")),
        ("models/llama3-rope-freqs/rope.gguf".to_string(), fixture("models/llama3-rope-freqs/rope.gguf")),
    ];
    replay("gguf_read", gguf_read::run, seeds, 3000);
}

#[test]
fn hf_dir_survives_its_regressions_and_damaged_model_directories() {
    let seeds = ["training/llama/model", "training/qwen3/model", "training/qwen35/model", "hyper/model"]
        .iter()
        .map(|d| (d.to_string(), pair(d, "config.json", "model.safetensors")))
        .collect();
    replay("hf_dir", hf_dir::run, seeds, 500);
}

#[test]
fn peft_adapter_survives_its_regressions_and_damaged_adapters() {
    let seeds = ["training/llama/adapter", "training/qwen3/adapter", "hyper/common"]
        .iter()
        .map(|d| (d.to_string(), pair(d, "adapter_config.json", "adapter_model.safetensors")))
        .collect();
    replay("peft_adapter", peft_adapter::run, seeds, 3000);
}

#[test]
fn training_jsonl_survives_its_regressions_and_damaged_jsonl() {
    let sotu = String::from_utf8(fixture("training/sotu_train.jsonl")).unwrap();
    let mut pairs = vec![0x40u8];
    pairs.extend(sotu.lines().take(4).flat_map(|l| format!("{l}\n").into_bytes()));
    let seeds = vec![
        ("sotu pairs".to_string(), pairs),
        (
            "chat".to_string(),
            b"\x10{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n".to_vec(),
        ),
        ("ids".to_string(), b"\x08{\"input_ids\": [1, 5, 9, 17], \"labels\": [-100, 5, 9, 17]}\n{\"input_ids\": [3, 4]}\n".to_vec()),
    ];
    replay("training_jsonl", training_jsonl::run, seeds, 5000);
}

/// The seeds of `ci/fuzz.sh`'s `http_request` corpus: a flag byte (bit 0:
/// the server has an API key), then a request to each route.
fn http_seed(flags: u8, path: &str, body: &str) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend(
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-fuzz\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            .into_bytes(),
    );
    v
}

#[test]
fn http_request_survives_its_regressions_and_damaged_requests() {
    let seeds = vec![
        ("chat".to_string(), http_seed(1, "/v1/chat/completions", r#"{"model": "alice", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 8, "stream": true}"#)),
        ("completion".to_string(), http_seed(0, "/v1/completions", r#"{"model": "base", "prompt": ["hello"], "temperature": 0.7, "top_p": 0.9, "stop": ["\\n"]}"#)),
        ("feedback".to_string(), http_seed(0, "/v1/feedback", r#"{"model": "alice", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#)),
        ("adapter".to_string(), http_seed(1, "/v1/adapters/alice", r#"{"path": "alice", "scale": 2.0}"#)),
        ("outside".to_string(), http_seed(0, "/v1/adapters/bob", r#"{"path": "../hexlora-fuzz-outside", "scale": 1e30}"#)),
    ];
    replay("http_request", http_request::run, seeds, 5000);
}

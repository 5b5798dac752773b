//! What the integration tests share: where the fixtures and the real model
//! are, how a test skips when a need is missing (`src/test_skip.rs`), and
//! the `hexlora grad` command line over a training fixture.
#![allow(dead_code)] // each test module uses its own part
use std::path::{Path, PathBuf};
use std::process::Command;

/// The host crate's directory.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[path = "../../../src/test_skip.rs"]
mod test_skip;
#[allow(unused_imports)] // each test module uses its own part
pub use test_skip::{skip, skip_allowed_in_ci};

/// SmolLM2-135M-Instruct Q4_1, or `None` (skipped) when it is absent: a
/// failure under CI, where `toolchain/fetch-models.sh` places it.
pub fn smollm2() -> Option<PathBuf> {
    let p = root().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    skip(&format!("{} is absent (toolchain/fetch-models.sh places it)", p.display()));
    None
}

/// Gemma 3 270M Q4_K_M, or `None` (skipped) when it is absent: a failure
/// under CI, where `toolchain/fetch-models.sh` places it.
pub fn gemma3() -> Option<PathBuf> {
    let p = root().join("../models/gemma-3-270m-q4_k_m.gguf");
    if p.exists() {
        return Some(p);
    }
    skip(&format!("{} is absent (toolchain/fetch-models.sh places it)", p.display()));
    None
}

/// The PEFT directory of fixture adapter `name` (`sotu`, `marker`).
pub fn adapter(name: &str) -> PathBuf {
    root().join("tests/fixtures/adapters").join(name).join("adapter")
}

/// The directory of training fixture `arch` (`model/`, `adapter/`,
/// `batch.json`, PyTorch + PEFT's `expected.safetensors`).
pub fn training_fixture(arch: &str) -> PathBuf {
    root().join("tests/fixtures/training").join(arch)
}

/// Max-normalised error `max |got - want| / max |want|`, the measure the
/// fixture tests compare with.
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs() as f64)).max(1e-12);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((*g as f64 - *w as f64).abs())) / scale
}

/// A small hypernetwork configuration that emits `common`'s shape (rank,
/// alpha, targets), so that adapter can be its common LoRA: centred heads on
/// a standardized embedding, as the bundled benchmarks train it.
pub fn hyper_net_config(common: &hexlora::lora::Adapter) -> hexlora::hyper::HyperConfig {
    hexlora::hyper::HyperConfig {
        embed_rank: 2,
        embed_alpha: 4.0,
        embed_dropout: 0.0,
        out_rank: common.config.r,
        out_alpha: common.config.alpha,
        out_targets: common.config.target_modules.clone(),
        bottleneck: 3,
        variant: hexlora::hyper::HeadVariant::Parallel,
        center: true,
        standardize: true,
        context_tokens: 48,
        ..Default::default()
    }
}

/// A real (if crude) byte tokenizer for the tiny fixtures' vocabularies
/// (64 tokens and more): each byte modulo 64.
pub struct ByteText;

impl hexlora::train::data::Encoder for ByteText {
    fn encode(&self, text: &str) -> hexlora::Result<Vec<u32>> {
        Ok(text.bytes().map(|b| b as u32 % 64).collect())
    }
    fn render_chat(&self, messages: &[hexlora::train::data::Message], add_generation_prompt: bool) -> hexlora::Result<String> {
        let mut s: String = messages.iter().map(|m| format!("<{}>{}", m.role, m.content)).collect();
        if add_generation_prompt {
            s.push_str("<assistant>");
        }
        Ok(s)
    }
    fn end_of_turn(&self) -> String {
        "|".into()
    }
}

/// `hexlora grad` over training fixture `arch` (its model, adapter and
/// batch.json), writing `out`; the caller adds the backend and precision.
pub fn grad_command(arch: &str, out: &Path) -> Command {
    let dir = training_fixture(arch);
    let mut cmd = hexlora();
    cmd.arg("grad").arg("--model").arg(dir.join("model")).arg("--adapter").arg(dir.join("adapter"));
    cmd.arg("--batch").arg(dir.join("batch.json")).arg("--out").arg(out);
    cmd
}

/// The `hexlora` binary under test (`HEXLORA_TEST_BIN` when set, e.g. the
/// static musl build; else this build's), run through `HEXLORA_TEST_RUNNER`
/// when that is set (`ci/aarch64-test.sh` sets it to the qemu-aarch64
/// command: a test emulated by qemu-user cannot exec the aarch64 binary
/// itself without binfmt_misc, which containers often lack).
pub fn hexlora() -> Command {
    let bin = std::env::var("HEXLORA_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hexlora").to_string());
    let runner = std::env::var("HEXLORA_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        None => Command::new(bin),
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(&bin);
            cmd
        }
    }
}

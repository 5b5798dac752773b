//! What the stage-3 tests share: where the fixtures and the real model are.
use std::path::PathBuf;

/// The host crate's directory.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// SmolLM2-135M-Instruct Q4_1, or `None` when it is absent: a loud failure
/// under CI, where `toolchain/fetch-models.sh` places it.
pub fn smollm2() -> Option<PathBuf> {
    let p = root().join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    assert!(std::env::var_os("CI").is_none(), "{} is absent under CI (toolchain/fetch-models.sh places it)", p.display());
    eprintln!("SKIPPED: {} is absent (run toolchain/fetch-models.sh)", p.display());
    None
}

/// The PEFT directory of fixture adapter `name` (`sotu`, `marker`).
pub fn adapter(name: &str) -> PathBuf {
    root().join("tests/fixtures/adapters").join(name).join("adapter")
}

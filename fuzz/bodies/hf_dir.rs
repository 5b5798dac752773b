//! Fuzzes opening a Hugging Face model directory: the input is split into
//! `config.json` and `model.safetensors` (a little-endian u16 giving the
//! config's length, the config, then the safetensors bytes), both written
//! to a directory of this process, then opened as `hexlora train` and
//! `generate` open a model (`Checkpoint::open`), checked against the
//! tensors its configuration expects, and every tensor read as f32.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run hf_dir

use hexlora::model::checkpoint::Checkpoint;
use hexlora::model::descriptor::Descriptor;
use std::path::PathBuf;
use std::sync::OnceLock;

/// One directory per fuzzing process, rewritten by every input.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("hexlora-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

pub fn run(bytes: &[u8]) {
    let Some((len, rest)) = bytes.split_first_chunk::<2>() else {
        return;
    };
    let len = (u16::from_le_bytes(*len) as usize).min(rest.len());
    let (config, weights) = rest.split_at(len);
    std::fs::write(dir().join("config.json"), config).unwrap();
    std::fs::write(dir().join("model.safetensors"), weights).unwrap();
    let Ok(ckpt) = Checkpoint::open(dir()) else {
        return;
    };
    let _ = Descriptor::new(&ckpt.config).check(ckpt.tensors());
    for name in ckpt.tensors().names() {
        if let Ok(raw) = ckpt.tensors().get(&name) {
            let _ = raw.to_f32();
        }
    }
    let _ = ckpt.first_non_finite();
    let _ = ckpt.template();
}

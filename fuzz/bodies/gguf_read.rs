//! Fuzzes the GGUF reader as every command uses it: header, metadata and
//! tensor infos parsed from arbitrary bytes, then the model configuration,
//! the tokenizer, the expected-tensor check and every tensor converted to
//! f32 (llama q/k and Qwen3.5 rewrites included). Each step either works
//! or returns an error: a panic, an abort, a hang or an out-of-bounds
//! access (under the sanitizer) is a finding.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_read

use hexlora::model::config::ModelConfig;
use hexlora::model::descriptor::Descriptor;
use hexlora::model::gguf::Gguf;
use hexlora::model::source::TensorSource;
use hexlora::model::tokenizer::Tokenizer;

pub fn run(bytes: &[u8]) {
    let Ok(g) = Gguf::from_bytes(bytes, "fuzz.gguf") else {
        return;
    };
    for name in g.names() {
        if let Ok(raw) = g.get(&name) {
            let _ = raw.to_f32();
        }
    }
    let _ = Tokenizer::from_gguf(&g).map(|t| t.encode("hello <|im_start|> world"));
    if let Ok(cfg) = ModelConfig::from_gguf(&g) {
        let _ = Descriptor::new(&cfg).check(&g);
    }
}

//! Fuzzes reading a PEFT adapter: the input is split into
//! `adapter_config.json` and `adapter_model.safetensors` (a little-endian
//! u16 giving the config's length, the config, then the safetensors
//! bytes); the config is parsed and checked by type and range, the factors
//! read and paired, and the adapter checked against the projections of the
//! tiny Llama training fixture, as `--adapter` and `--init-adapter` do.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run peft_adapter

use hexlora::base::tensor_file::TensorFile;
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::model::config::ModelConfig;
use hexlora::model::descriptor::Descriptor;
use hexlora::projection::ProjectionInfo;
use std::sync::OnceLock;

/// The projections of `host/tests/fixtures/training/llama/model`.
fn projections() -> &'static [ProjectionInfo] {
    static P: OnceLock<Vec<ProjectionInfo>> = OnceLock::new();
    P.get_or_init(|| {
        let json = serde_json::from_str(include_str!("../../host/tests/fixtures/training/llama/model/config.json")).unwrap();
        let cfg = ModelConfig::from_hf_json(&json).unwrap();
        Descriptor::new(&cfg).projections().cloned().collect()
    })
}

pub fn run(bytes: &[u8]) {
    let Some((len, rest)) = bytes.split_first_chunk::<2>() else {
        return;
    };
    let len = (u16::from_le_bytes(*len) as usize).min(rest.len());
    let (config, weights) = rest.split_at(len);
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(config) else {
        return;
    };
    let Ok(config) = LoraConfig::from_json(&json, "adapter_config.json") else {
        return;
    };
    let _ = config.to_json();
    let Ok(file) = TensorFile::from_bytes(weights, "adapter_model.safetensors") else {
        return;
    };
    if let Ok(adapter) = Adapter::from_tensor_file(config, &file, "adapter_model.safetensors") {
        let _ = adapter.check(projections());
    }
}

//! Training: the model-facing graph contract ([`graph`]), the loop
//! ([`trainer`]), activation budget ([`budget`]), commits and resume
//! ([`commit`], [`atomic_write`]) and run outputs ([`metrics`]).
pub mod atomic_write;
pub mod budget;
pub mod commit;
pub mod graph;
pub mod metrics;
pub mod decoder_graph;
pub mod qwen35_graph;
pub mod mezo_loop;
pub mod grad;
pub mod data;
pub mod trainer;
pub mod text_encoder;

/// Opens a GGUF file or a Hugging Face directory as the training graph of
/// its architecture (Qwen3.5 gets [`qwen35_graph::Qwen35Graph`], Llama and
/// Qwen3 [`decoder_graph::DecoderGraph`]), with CPU projections.
pub fn open_trainable(path: &std::path::Path) -> crate::Result<Box<dyn graph::TrainableModel>> {
    open_trainable_dtype(path, crate::model::cpu_projection::FrozenDtype::F32)
}

/// [`open_trainable`] with frozen weights held in `dtype` (Qwen3.5's
/// projections; its embeddings and head stay f32).
pub fn open_trainable_dtype(path: &std::path::Path, dtype: crate::model::cpu_projection::FrozenDtype) -> crate::Result<Box<dyn graph::TrainableModel>> {
    use crate::model::{config::{Arch, ModelConfig}, hf_dir::HfDir};
    if path.is_dir() {
        let dir = HfDir::open(path)?;
        let cfg = ModelConfig::from_hf_json(dir.config())?;
        if cfg.arch == Arch::Qwen35 {
            let make = crate::model::cpu_projection::factory(dtype);
            return Ok(Box::new(qwen35_graph::Qwen35Graph::load_with(&dir, cfg, &make)?));
        }
        return Ok(Box::new(decoder_graph::DecoderGraph::load_dtype(&dir, cfg, dtype)?));
    }
    Ok(Box::new(decoder_graph::DecoderGraph::open_dtype(path, dtype)?))
}

/// Whether `path` is a Hugging Face directory of a Qwen3.5 model.
pub fn is_qwen35(path: &std::path::Path) -> crate::Result<bool> {
    use crate::model::{config::{Arch, ModelConfig}, hf_dir::HfDir};
    Ok(path.is_dir() && ModelConfig::from_hf_json(HfDir::open(path)?.config())?.arch == Arch::Qwen35)
}

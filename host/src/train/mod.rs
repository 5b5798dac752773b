//! Training: the model-facing graph contract ([`graph`]), the loop
//! ([`trainer`]), activation budget ([`budget`]), commits and resume
//! ([`commit`], [`atomic_write`]) and run outputs ([`metrics`]).
pub mod atomic_write;
pub mod budget;
pub mod commit;
pub mod graph;
pub mod learner;
pub mod metrics;
pub mod decoder_graph;
pub mod qwen35_graph;
pub mod mezo_loop;
pub mod grad;
pub mod data;
pub mod trainer;
pub mod text_encoder;

use crate::model::checkpoint::Checkpoint;
use crate::model::cpu_projection::FrozenDtype;
use crate::model::decoder::ProjectionFactory;

/// Opens a GGUF file or a Hugging Face directory as the training graph of
/// its architecture (Qwen3.5 gets [`qwen35_graph::Qwen35Graph`], Llama and
/// Qwen3 [`decoder_graph::DecoderGraph`]), with CPU projections.
pub fn open_trainable(path: &std::path::Path) -> crate::Result<Box<dyn graph::TrainableModel>> {
    open_trainable_dtype(path, FrozenDtype::F32)
}

/// [`open_trainable`] with frozen weights held in `dtype` (Qwen3.5's
/// projections; its embeddings and head stay f32).
pub fn open_trainable_dtype(path: &std::path::Path, dtype: FrozenDtype) -> crate::Result<Box<dyn graph::TrainableModel>> {
    trainable(&Checkpoint::open(path)?, dtype, false)
}

/// The training graph of `ckpt`'s architecture, frozen weights in `dtype`;
/// `unfused` records each adapted projection as the unfused pair (Llama
/// and Qwen3 only: `DecoderGraph::set_unfused_lora`).
pub fn trainable(ckpt: &Checkpoint, dtype: FrozenDtype, unfused: bool) -> crate::Result<Box<dyn graph::TrainableModel>> {
    trainable_with(ckpt, &crate::model::cpu_projection::factory(dtype), dtype, unfused)
}

/// The one place that picks a training graph by architecture, for
/// directories and GGUF alike: `make` builds every per-layer frozen
/// projection (CPU, or routed to the NPU by the split runtime), `tables`
/// is the precision of Llama/Qwen3's embeddings and head (Qwen3.5 keeps
/// them in f32 and has no unfused mode).
pub fn trainable_with(ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> crate::Result<Box<dyn graph::TrainableModel>> {
    let cfg = ckpt.config.clone();
    if cfg.arch == crate::model::config::Arch::Qwen35 {
        return Ok(Box::new(qwen35_graph::Qwen35Graph::load_with(ckpt.tensors(), cfg, make)?));
    }
    let mut model = decoder_graph::DecoderGraph::load_frozen(ckpt.tensors(), cfg, make, tables)?;
    model.set_unfused_lora(unfused);
    Ok(Box::new(model))
}

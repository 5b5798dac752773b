//! Training: the graph contract lives in `autograd::graph` (each
//! architecture's graph lives in its folder of [`crate::model`]), the one
//! loop ([`learner`]) and the steps it drives (AdamW in [`trainer`], MeZO
//! in [`mezo_loop`]), activation budget ([`budget`]), commits and resume
//! ([`commit`]; files replaced through `base::atomic_write`) and run outputs ([`metrics`]).
pub mod budget;
pub mod commit;

pub mod learner;
pub mod metrics;
pub mod mezo_loop;
pub mod grad;
pub mod data;
pub mod fingerprint;
pub mod trainer;
pub mod text_encoder;

use crate::model::checkpoint::Checkpoint;
use crate::ops::cpu_projection::FrozenDtype;
use crate::model::decoder::ProjectionFactory;

/// Opens a GGUF file or a Hugging Face directory as the training graph of
/// its architecture ([`crate::model::arch::of`]), with CPU projections.
pub fn open_trainable(path: &std::path::Path) -> crate::Result<Box<dyn crate::autograd::graph::TrainableModel>> {
    trainable(&Checkpoint::open(path)?, FrozenDtype::F32, false)
}

/// The training graph of `ckpt`'s architecture, frozen weights in `dtype`;
/// `unfused` records each adapted projection as the unfused pair (the
/// attention decoders only; Qwen3.5 refuses it).
pub fn trainable(ckpt: &Checkpoint, dtype: FrozenDtype, unfused: bool) -> crate::Result<Box<dyn crate::autograd::graph::TrainableModel>> {
    trainable_with(ckpt, &crate::ops::cpu_projection::factory(dtype), dtype, unfused)
}

/// The training graph of `ckpt`'s architecture ([`crate::model::arch`]),
/// for directories and GGUF alike: `make` builds every per-layer frozen
/// projection (CPU, or routed to the NPU by the split runtime), `tables`
/// is the precision of Llama/Qwen3's embeddings and head (Qwen3.5 keeps
/// them in f32 and has no unfused mode).
pub fn trainable_with(ckpt: &Checkpoint, make: &ProjectionFactory<'_>, tables: FrozenDtype, unfused: bool) -> crate::Result<Box<dyn crate::autograd::graph::TrainableModel>> {
    crate::model::arch::of(&ckpt.config).training_graph(ckpt, make, tables, unfused)
}

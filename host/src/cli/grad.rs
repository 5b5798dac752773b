//! `hexlora grad`: loss, logits and LoRA gradients of one batch, written as
//! safetensors, to compare a model port with PyTorch + PEFT.
use anyhow::Context;
use crate::lora::tensor_file::TensorFile;
use crate::lora::Adapter;
use crate::tensor::Tensor;
use crate::train::grad::compute_grads;
use crate::train::graph::{Batch, GraphOptions};
use std::path::PathBuf;

/// Arguments of `hexlora grad`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// PEFT adapter directory (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    adapter: PathBuf,
    /// JSON `{"input_ids": [[...]], "labels": [[...]]}` (labels aligned with
    /// input_ids, shifted inside, -100 ignored).
    #[arg(long)]
    batch: PathBuf,
    /// Output safetensors: `loss` [1], `logits` [batch, seq, vocab] and one
    /// gradient per adapter tensor under the adapter's key.
    #[arg(long)]
    out: PathBuf,
}

/// Runs `hexlora grad`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = crate::train::open_trainable(&args.model)?;
    let adapter = Adapter::load(&args.adapter)?;
    let text = std::fs::read_to_string(&args.batch).with_context(|| args.batch.display().to_string())?;
    let batch: Batch = serde_json::from_str(&text).with_context(|| format!("{}: expected {{\"input_ids\": [[...]], \"labels\": [[...]]}}", args.batch.display()))?;
    let r = compute_grads(&*model, &adapter, &batch, &GraphOptions::default(), true)?;
    let mut out = r.grads;
    out.tensors.insert("loss".into(), Tensor::from_vec(&[1], vec![r.loss])?);
    out.tensors.insert("logits".into(), r.logits.expect("logits were requested"));
    crate::train::atomic_write::write_atomic(&args.out, &TensorFile::to_bytes(&out)?)?;
    println!("loss {:.6}  ({} adapter tensors) -> {}", r.loss, out.tensors.len() - 2, args.out.display());
    Ok(())
}

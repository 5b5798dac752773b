//! `hexlora export-gguf`: a PEFT adapter (or a GGUF one, re-encoded) as a
//! llama.cpp LoRA adapter file for the given base model.
use super::args::{choices, OUT_TYPES};
use hexlora::model::gguf_adapter::{export, OutType};
use hexlora::lora::Adapter;
use hexlora::model::checkpoint::Checkpoint;
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `hexlora export-gguf`.
#[derive(clap::Args)]
pub struct Args {
    /// The adapter: a PEFT directory (or a `.gguf` adapter).
    #[arg(long)]
    adapter: PathBuf,
    /// The base model it was trained on (`.gguf` or Hugging Face directory):
    /// architecture, head counts, projection shapes.
    #[arg(long)]
    model: PathBuf,
    /// Output `.gguf` file (written atomically).
    #[arg(long)]
    out: PathBuf,
    /// Storage of the factors; q8_0 falls back to f16 for factors whose
    /// rows are not a multiple of 32 wide (`lora_b` at r = 16).
    #[arg(long, value_parser = choices(OUT_TYPES), default_value = "f32")]
    outtype: OutType,
    /// Replace --out if it exists (never when it is the model or the adapter).
    #[arg(long)]
    force: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    hexlora::base::outputs::check_output(&args.out, &[("--model", &args.model), ("--adapter", &args.adapter)], args.force)?;
    let ckpt = Checkpoint::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let adapter = Adapter::open(&args.adapter, &ckpt.config).with_context(|| format!("loading adapter {}", args.adapter.display()))?;
    export(&adapter, &ckpt.config, args.outtype, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {} ({} adapted projections, r = {}, alpha = {})", args.out.display(), adapter.modules.len(), adapter.config.r, adapter.config.alpha);
    Ok(())
}

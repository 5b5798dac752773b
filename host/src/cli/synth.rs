//! `hexlora synth`: stage 2, on device. One forward pass of the
//! hypernetwork turns a user's example pairs into a PEFT adapter; the
//! hypernetwork files are not needed afterwards.
use hexlora::hyper::users::{load_pairs, render_context_fitted};
use hexlora::hyper::HyperNet;
use hexlora::lora::peft::{CONFIG_FILE, WEIGHTS_FILE};
use hexlora::train::learner::claim_out_dir;
use hexlora::model::checkpoint::Checkpoint;
use hexlora::ops::cpu_projection::FrozenDtype;
use hexlora::train::text_encoder::ModelText;
use anyhow::Context;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `hexlora synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Hypernetwork directory (hypernet.json + hypernet.safetensors).
    #[arg(long)]
    hypernet: PathBuf,
    /// The user's examples: JSONL of {"query", "response"}.
    #[arg(long)]
    context: PathBuf,
    /// Adapter directory to write (PEFT format).
    #[arg(long)]
    out: PathBuf,
    /// Overwrite an adapter already in --out.
    #[arg(long)]
    force: bool,
    /// Model (default: the one recorded in hypernet.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Scale of the user's part of the synthesized LoRA: 1 = as trained,
    /// 0 = the network's common LoRA, > 1 extrapolates away from it
    /// (choose it on dev with `hexlora eval --hypernet-strength`). Finite, >= 0.
    #[arg(long, default_value_t = 1.0, value_parser = super::args::non_negative)]
    strength: f32,
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

/// Runs `hexlora synth`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let start = Instant::now();
    let config = hexlora::hyper::hypernet::read_config(&args.hypernet)?;
    let model_path = args.model.unwrap_or_else(|| PathBuf::from(&config.base_model));
    let ckpt = Checkpoint::open(&model_path).with_context(|| format!("model {} (pass --model)", model_path.display()))?;
    let model = hexlora::train::trainable(&ckpt, FrozenDtype::F32, false)?;
    let text = ModelText::of(&ckpt)?;
    let net = HyperNet::load(&args.hypernet, &*model)?;
    let pairs = load_pairs(&args.context)?;
    let mut inputs = vec![("--hypernet", args.hypernet.as_path()), ("--context", args.context.as_path())];
    inputs.push(("--model", model_path.as_path()));
    claim_out_dir(&args.out, &[CONFIG_FILE, WEIGHTS_FILE], &inputs, args.force)?;
    let loaded = start.elapsed().as_secs_f64();
    let synth_start = Instant::now();
    let refs: Vec<_> = pairs.iter().collect();
    let (context, fitted) = render_context_fitted(&text, &net.config, &refs)?;
    let adapter = net.synthesize_with_strength(&*model, &context, args.strength)?;
    let synth = synth_start.elapsed().as_secs_f64();
    adapter.save(&args.out)?;
    let cut = if fitted.cut { " and part of one more" } else { "" };
    println!(
        "synthesized {} LoRA modules (rank {}) from {} of {} examples{cut} ({} context tokens, the budget {}) -> {}",
        adapter.modules.len(),
        adapter.config.r,
        fitted.whole,
        pairs.len(),
        context.len(),
        net.config.context_tokens,
        args.out.display()
    );
    println!("synth seconds: {synth:.3} (loading {loaded:.3})");
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS MiB: {rss:.0}");
    }
    Ok(())
}

//! `hexlora hypertrain`: trains the LoRA-synthesizing hypernetwork for a
//! population (stage 1a SimCSE, stage 1b end to end with distillation), with
//! commits after every step and `--resume`.
use crate::hyper::trainer::{hypertrain, HyperRun, HyperTrainConfig};
use crate::hyper::users::{load_users, render_example};
use crate::hyper::{HeadVariant, HyperConfig, HyperNet};
use crate::lora::Adapter;
use crate::optim::adamw::AdamWConfig;
use crate::optim::schedule::Decay;
use crate::train::decoder_graph::DecoderGraph;
use crate::train::text_encoder::ModelText;
use std::path::PathBuf;

/// Arguments of `hexlora hypertrain`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory (the frozen target LLM).
    #[arg(long)]
    model: PathBuf,
    /// Users JSONL: {"user": ..., "examples": [{"query", "response"}, ...]}.
    #[arg(long)]
    data: PathBuf,
    /// Run directory: commit.safetensors, metrics.jsonl, loss.svg, hypernet/.
    #[arg(long)]
    out: PathBuf,
    /// Continue the run committed in --out.
    #[arg(long)]
    resume: bool,
    /// Common LoRA (PEFT directory): initial head biases and the ICL teacher's adapter.
    #[arg(long)]
    common_lora: Option<PathBuf>,
    /// Stage 1a (SimCSE) steps.
    #[arg(long, default_value_t = 20)]
    simcse_steps: u64,
    /// Stage 1b (end-to-end) steps.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Users per step.
    #[arg(long, default_value_t = 4)]
    users_per_step: usize,
    /// Scored examples per user in stage 1b (the rest is context).
    #[arg(long, default_value_t = 2)]
    target_examples: usize,
    /// Weight of the KL to the ICL teacher (0 = off).
    #[arg(long, default_value_t = 1.0)]
    kl_weight: f32,
    /// Stage 1b peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// Stage 1a peak learning rate.
    #[arg(long, default_value_t = 1e-4)]
    simcse_lr: f32,
    /// Warm-up steps per stage.
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Clip the gradient norm (0 = off).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// Embedder LoRA rank.
    #[arg(long, default_value_t = 8)]
    embed_rank: usize,
    /// Generated LoRA rank.
    #[arg(long, default_value_t = 4)]
    out_rank: usize,
    /// Generated LoRA alpha.
    #[arg(long, default_value_t = 8.0)]
    out_alpha: f32,
    /// Head bottleneck width k.
    #[arg(long, default_value_t = 16)]
    bottleneck: usize,
    /// Parallel heads or the shared trunk.
    #[arg(long, value_enum, default_value_t = HeadVariant::Parallel)]
    variant: HeadVariant,
    /// Comma-separated modules of the generated LoRA.
    #[arg(long, default_value = "q_proj,k_proj,v_proj,o_proj")]
    targets: String,
    /// Context token budget.
    #[arg(long, default_value_t = 512)]
    context_tokens: usize,
    /// Target example length cap.
    #[arg(long, default_value_t = 256)]
    max_len: usize,
    /// Seed (init, user sampling, dropout).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Recompute every layer in the backward (less memory).
    #[arg(long)]
    recompute: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Runs `hexlora hypertrain`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = DecoderGraph::open(&args.model)?;
    let text = ModelText::open(&args.model)?;
    let mut users = load_users(&args.data)?;
    // A user can be scored only if some example keeps a response token within --max-len.
    let before = users.len();
    let fits = |p: &crate::hyper::users::Pair| render_example(&text, p, args.max_len).map(|e| e.labels.iter().skip(1).any(|&l| l >= 0));
    users.retain(|u| u.examples.iter().any(|p| fits(p).unwrap_or(false)));
    if users.len() < before {
        eprintln!("skipped {} of {before} users: no example fits --max-len {}", before - users.len(), args.max_len);
    }
    let common = args.common_lora.as_deref().map(Adapter::load).transpose()?;
    let targets: Vec<String> = args.targets.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    let (out_rank, out_alpha, out_targets) = match &common {
        Some(c) => (c.config.r, c.config.alpha, c.config.target_modules.clone()),
        None => (args.out_rank, args.out_alpha, targets),
    };
    let config = HyperConfig {
        embed_rank: args.embed_rank,
        embed_alpha: 2.0 * args.embed_rank as f32,
        out_rank,
        out_alpha,
        out_targets,
        bottleneck: args.bottleneck,
        variant: args.variant,
        context_tokens: args.context_tokens,
        base_model: args.model.display().to_string(),
        ..HyperConfig::default()
    };
    let fresh = HyperNet::init(config, &model, common.as_ref(), args.seed)?;
    let train = HyperTrainConfig {
        simcse_steps: args.simcse_steps,
        e2e_steps: args.steps,
        users_per_step: args.users_per_step,
        target_examples: args.target_examples,
        max_len: args.max_len,
        kl_weight: args.kl_weight,
        simcse_lr: args.simcse_lr,
        lr: args.lr,
        warmup: args.warmup,
        decay: Decay::Cosine,
        adamw: AdamWConfig { weight_decay: 0.0, ..Default::default() },
        max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
        seed: args.seed,
        recompute: args.recompute,
    };
    let run = HyperRun { resume: args.resume, progress: !args.quiet, stop_after: None };
    let state = hypertrain(&model, &text, &users, fresh, common.as_ref(), &train, &args.out, run)?;
    let first = |stage| state.history.iter().find(|r| r.stage == stage).map(|r| r.loss);
    let last = |stage| state.history.iter().rev().find(|r| r.stage == stage).map(|r| r.loss);
    use crate::hyper::commit::Stage;
    for (name, stage) in [("simcse", Stage::Simcse), ("end-to-end", Stage::EndToEnd)] {
        if let (Some(a), Some(b)) = (first(stage), last(stage)) {
            println!("{name} loss: first {a:.4} last {b:.4}");
        }
    }
    let secs: f64 = state.history.iter().map(|r| r.seconds).sum();
    println!("{} steps in {secs:.1} s; hypernetwork in {}", state.step, args.out.join("hypernet").display());
    Ok(())
}

//! `hexlora train`: LoRA fine-tuning from JSONL into a PEFT adapter, with
//! commits after every optimizer step and `--resume`.
use crate::lora::LoraConfig;
use crate::model::cpu_projection::FrozenDtype;
use crate::optim::adamw::AdamWConfig;
use crate::optim::schedule::{Decay, Schedule};
use crate::lora::Adapter;
use crate::train::data::load_jsonl;
use crate::train::grad::evaluate;
use crate::train::text_encoder::ModelText;
use crate::train::graph::TrainableModel;
use crate::model::checkpoint::Checkpoint;
use crate::train::trainer::{train, RunOptions, TrainConfig};
use crate::train::mezo_loop::{train_mezo, MezoConfig};
use crate::optim::mezo::Mezo;
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `hexlora train`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// JSONL: {"prompt","completion"}, {"messages"} or {"input_ids","labels"}.
    #[arg(long)]
    data: PathBuf,
    /// Run directory: commit.safetensors, metrics.jsonl, loss.svg, adapter/.
    #[arg(long)]
    out: PathBuf,
    /// Held-out JSONL (same forms as --data): its loss is reported before
    /// and after training.
    #[arg(long)]
    eval_data: Option<PathBuf>,
    /// Continue the run committed in --out.
    #[arg(long)]
    resume: bool,
    /// Start from this adapter (PEFT directory or llama.cpp `.gguf`)
    /// instead of a fresh init; its rank, alpha and targets replace
    /// --rank, --alpha and --targets.
    #[arg(long, conflicts_with = "resume")]
    init_adapter: Option<PathBuf>,
    /// Optimizer steps (default: one epoch).
    #[arg(long)]
    steps: Option<u64>,
    /// Examples per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Warm-up steps.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Decay after warm-up.
    #[arg(long, value_enum, default_value_t = Decay::Cosine)]
    schedule: Decay,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// Clip the gradient norm (0 = off).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    rank: usize,
    /// LoRA alpha.
    #[arg(long, default_value_t = 32.0)]
    alpha: f32,
    /// LoRA dropout.
    #[arg(long, default_value_t = 0.05)]
    dropout: f32,
    /// Comma-separated target modules.
    #[arg(long, default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")]
    targets: String,
    /// Truncate examples to this many tokens.
    #[arg(long, default_value_t = 512)]
    max_len: usize,
    /// Seed (data order, init, dropout).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Activation memory cap in MiB (also bounded by MemAvailable).
    #[arg(long)]
    activation_cap_mb: Option<u64>,
    /// adamw (backprop) or mezo (forward-only SPSA, the baseline).
    #[arg(long, value_enum, default_value_t = Optimizer::Adamw)]
    optimizer: Optimizer,
    /// MeZO perturbation scale.
    #[arg(long, default_value_t = 1e-3)]
    mezo_eps: f32,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Print a per-node time table at the end.
    #[arg(long)]
    profile: bool,
    /// Record each frozen product and its LoRA branch as two nodes instead
    /// of the fused node (same results; for step-time comparisons).
    #[arg(long)]
    no_fuse: bool,
    /// Precision of the frozen weights on the CPU: bf16 halves their memory
    /// and runs on AMX tiles where the CPU has them (activations rounded to
    /// bf16 per product, and attention's products too, sums and everything
    /// trainable in f32); f32 computes with exactly the checkpoint's
    /// effective weight.
    #[arg(long, value_enum, default_value_t = FrozenDtype::Bf16)]
    frozen_dtype: FrozenDtype,
}

/// The optimizer of `hexlora train`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Optimizer {
    /// Backprop + AdamW.
    Adamw,
    /// Forward-only MeZO (two perturbed forwards per step).
    Mezo,
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}

/// Runs `hexlora train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.profile {
        crate::autograd::profile::enable();
    }
    let ckpt = Checkpoint::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let model: Box<dyn TrainableModel> = crate::train::trainable(&ckpt, args.frozen_dtype, args.no_fuse)?;
    // Token-id JSONL needs no tokenizer; text JSONL fails with a clear error without one.
    let text = ModelText::of(&ckpt).ok();
    let enc = text.as_ref().map(|t| t as &dyn crate::train::data::Encoder);
    let (data, skipped) = load_jsonl(&args.data, enc, args.max_len)?;
    if skipped > 0 {
        eprintln!("skipped {skipped} examples with no completion tokens left after truncation");
    }
    let steps = args.steps.unwrap_or((data.len() / args.grad_accum.max(1)).max(1) as u64);
    let config = TrainConfig {
        lora: LoraConfig {
            r: args.rank,
            alpha: args.alpha,
            target_modules: args.targets.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            dropout: args.dropout,
            use_rslora: false,
            base_model: args.model.display().to_string(),
        },
        adamw: AdamWConfig { weight_decay: args.weight_decay, ..Default::default() },
        schedule: Schedule { lr: args.lr, warmup: args.warmup, total: steps, decay: args.schedule },
        grad_accum: args.grad_accum,
        max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
        seed: args.seed,
        activation_cap: args.activation_cap_mb.map(|m| m << 20),
        head_chunk: 256,
    };
    let mut config = config;
    let init = match &args.init_adapter {
        Some(p) => {
            let cfg = crate::model::checkpoint::Checkpoint::open(&args.model)?.config;
            let init = Adapter::open(p, &cfg).with_context(|| format!("loading --init-adapter {}", p.display()))?;
            init.check(&model.projections())?;
            config.lora = LoraConfig { dropout: args.dropout, base_model: config.lora.base_model.clone(), ..init.config.clone() };
            Some(init)
        }
        None => None,
    };
    let eval = match &args.eval_data {
        Some(p) => Some(load_jsonl(p, enc, args.max_len)?.0),
        None => None,
    };
    let before = match &eval {
        Some(e) => {
            let start = match &init {
                Some(a) => a.clone(),
                None => Adapter::init(config.lora.clone(), &model.projections(), 0)?,
            };
            Some(evaluate(&*model, &start, e)?)
        }
        None => None,
    };
    // Tokens of this invocation's steps (a resumed run's history holds earlier ones too).
    let mut tokens_here = 0u64;
    let mut count = |r: &crate::train::commit::StepRecord| tokens_here += r.tokens;
    if let Some(init) = &init {
        if args.out.join(crate::train::commit::COMMIT_FILE).exists() {
            anyhow::bail!("{} already holds a run: --resume it, or give --init-adapter a new --out", args.out.display());
        }
        std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
        crate::train::trainer::commit_start(init, &config, &data, &args.out)?;
    }
    let run = RunOptions { resume: args.resume || init.is_some(), progress: !args.quiet, stop_after: None, on_step: Some(&mut count) };
    let started = std::time::Instant::now();
    let (history, adapter, steps) = match args.optimizer {
        Optimizer::Adamw => {
            let s = train(&*model, &data, &config, &args.out, run)?;
            let step = s.step();
            (s.history, s.adapter, step)
        }
        Optimizer::Mezo => {
            let mezo = MezoConfig { train: config, mezo: Mezo { eps: args.mezo_eps, weight_decay: args.weight_decay } };
            let s = train_mezo(&*model, &data, &mezo, &args.out, run)?;
            (s.history, s.adapter, s.step)
        }
    };
    let last = history.last().map_or(f32::NAN, |r| r.loss);
    println!("trained {steps} steps, last loss {last:.4}; adapter in {}", args.out.join("adapter").display());
    // Throughput over this invocation's steps after the first (warm-up).
    let timed = history.iter().skip(1);
    let (tokens, secs) = timed.fold((0u64, 0f64), |(t, s), r| (t + r.tokens, s + r.seconds));
    if secs > 0.0 {
        println!("train tok/s: {:.1}", tokens as f64 / secs);
        // The figure above times the optimizer steps only; this one is the
        // clock a user waits: warm-up step, per-step commits, final save.
        println!("wall tok/s (incl. first step, commits, save): {:.1}", tokens_here as f64 / started.elapsed().as_secs_f64());
    }
    if let (Some(e), Some(before)) = (&eval, before) {
        println!("held-out loss: before {before:.4} after {:.4}", evaluate(&*model, &adapter, e)?);
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS MiB: {rss:.0}");
    }
    if args.profile {
        print!("{}", crate::autograd::profile::table());
    }
    Ok(())
}

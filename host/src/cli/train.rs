//! `hexlora train`: LoRA fine-tuning from JSONL into a PEFT adapter, with
//! commits after every optimizer step and `--resume`.
use super::args::{choices, positive, OptimDefaults, TrainingArgs, FROZEN_DTYPES};
use hexlora::lora::{Adapter, LoraConfig};
use hexlora::model::checkpoint::Checkpoint;
use hexlora::ops::cpu_projection::FrozenDtype;
use hexlora::optim::mezo::Mezo;
use hexlora::train::commit::{StepRecord, TrainState};
use hexlora::train::data::{load_jsonl, Bounds, Encoder};
use hexlora::autograd::graph::{Batch, TrainableModel};
use hexlora::train::grad::evaluate;
use hexlora::train::learner::{claim_out_dir, AfterStep, ADAPTER_RUN_OUTPUTS};
use hexlora::train::mezo_loop::{self, train_mezo, MezoConfig, MezoState};
use hexlora::train::text_encoder::ModelText;
use hexlora::train::trainer::{train, RunOptions, TrainConfig};
use anyhow::Context;
use std::path::PathBuf;

/// What `train` picks where the shared options leave a value unset.
const DEFAULTS: OptimDefaults = OptimDefaults { weight_decay: 0.0, head_chunk: 256 };

/// Arguments of `hexlora train`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    training: TrainingArgs,
    /// Run directory: commit.safetensors, metrics.jsonl, loss.svg, adapter/.
    #[arg(long)]
    out: PathBuf,
    /// Overwrite outputs in --out that no commit owns (an adapter, metrics
    /// or a plot from elsewhere).
    #[arg(long)]
    force: bool,
    /// Held-out JSONL (same forms as --data): its loss is reported before
    /// and after training.
    #[arg(long)]
    eval_data: Option<PathBuf>,
    /// Continue the run committed in --out. A commit that fails its
    /// checksums is never trained on: the run resumes from the previous
    /// commit (kept beside it) with a warning, or refuses when there is none.
    #[arg(long)]
    resume: bool,
    /// Start from this adapter (PEFT directory or llama.cpp `.gguf`)
    /// instead of a fresh init; its rank, alpha and targets replace
    /// --rank, --alpha and --targets.
    #[arg(long, conflicts_with = "resume")]
    init_adapter: Option<PathBuf>,
    /// adamw (backprop) or mezo (forward-only SPSA, the baseline).
    #[arg(long, value_enum, default_value_t = Optimizer::Adamw)]
    optimizer: Optimizer,
    /// MeZO perturbation scale, finite and > 0.
    #[arg(long, default_value_t = 1e-3, value_parser = positive)]
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
    #[arg(long, value_parser = choices(FROZEN_DTYPES), default_value = "bf16")]
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

/// The model, its examples and the run's configuration, opened once.
struct Opened {
    model: Box<dyn TrainableModel>,
    data: Vec<Batch>,
    eval: Option<Vec<Batch>>,
    config: TrainConfig,
    init: Option<Adapter>,
}

fn open(args: &Args) -> anyhow::Result<Opened> {
    let d = &args.training.data;
    let ckpt = Checkpoint::open(&d.model).with_context(|| format!("loading {}", d.model.display()))?;
    let model = hexlora::train::trainable(&ckpt, args.frozen_dtype, args.no_fuse)?;
    // Token-id JSONL needs no tokenizer; text JSONL fails with a clear error without one.
    let text = ModelText::of(&ckpt).ok();
    let enc = text.as_ref().map(|t| t as &dyn Encoder);
    let bounds = Bounds::of(&ckpt.config);
    let (data, skipped) = load_jsonl(&d.data, enc, d.max_len, bounds)?;
    if skipped > 0 {
        eprintln!("skipped {skipped} examples with no completion tokens left after truncation");
    }
    let eval = args.eval_data.as_ref().map(|p| load_jsonl(p, enc, d.max_len, bounds).map(|r| r.0)).transpose()?;
    hexlora::train::trainer::check_grad_accum(args.training.optim.grad_accum, data.len())?;
    let mut config = args.training.config(data.len(), &DEFAULTS);
    let init = match &args.init_adapter {
        Some(p) => {
            let init = Adapter::open(p, &ckpt.config).with_context(|| format!("loading --init-adapter {}", p.display()))?;
            init.check(&model.projections())?;
            config.lora = LoraConfig { dropout: args.training.lora.dropout, base_model: config.lora.base_model.clone(), ..init.config.clone() };
            Some(init)
        }
        None => None,
    };
    Ok(Opened { model, data, eval, config, init })
}

/// Runs `hexlora train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.profile {
        hexlora::autograd::profile::enable();
    }
    let stop = hexlora::signals::StopRequest::install()?;
    let o = open(&args)?;
    let d = &args.training.data;
    let mut inputs = vec![("--model", d.model.as_path()), ("--data", d.data.as_path())];
    inputs.extend(args.init_adapter.as_deref().map(|p| ("--init-adapter", p)));
    inputs.extend(args.eval_data.as_deref().map(|p| ("--eval-data", p)));
    claim_out_dir(&args.out, ADAPTER_RUN_OUTPUTS, &inputs, args.force)?;
    let before = match &o.eval {
        Some(e) => {
            let start = match &o.init {
                Some(a) => a.clone(),
                None => Adapter::init(o.config.lora.clone(), &o.model.projections(), 0)?,
            };
            Some(evaluate(&*o.model, &start, e)?)
        }
        None => None,
    };
    if let Some(init) = &o.init {
        if hexlora::train::commit::has_commit(&args.out) {
            anyhow::bail!("{} already holds a run: --resume it, or give --init-adapter a new --out", args.out.display());
        }
        std::fs::create_dir_all(&args.out).with_context(|| args.out.display().to_string())?;
        hexlora::train::trainer::commit_start(init, &o.config, &o.data, &args.out)?;
    }
    let started = std::time::Instant::now();
    let (history, adapter, tokens_here) = train_with(&args, &o).map_err(|e| explain_non_finite(e, &args.training.data.model))?;
    if let Some(signal) = stop.requested() {
        let at = history.last().map_or(0, |r| r.step);
        println!("{signal}: stopped after step {at} (committed); rerun the same command with --resume to continue");
        return Ok(());
    }
    print_figures(&args, &history, tokens_here, started.elapsed().as_secs_f64());
    if let (Some(e), Some(before)) = (&o.eval, before) {
        println!("held-out loss: before {before:.4} after {:.4}", evaluate(&*o.model, &adapter, e)?);
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS MiB: {rss:.0}");
    }
    if args.profile {
        print!("{}", hexlora::autograd::profile::table());
    }
    Ok(())
}

/// Trains with the chosen optimizer: the run's history, the adapter, and
/// the tokens of this invocation's steps (a resumed run's history holds
/// earlier ones too).
fn train_with(args: &Args, o: &Opened) -> anyhow::Result<(Vec<StepRecord>, Adapter, u64)> {
    let resume = args.resume || o.init.is_some();
    let mut tokens = 0u64;
    let (history, adapter) = match args.optimizer {
        Optimizer::Adamw => {
            let mut count = AfterStep(|s: &TrainState| {
                tokens += s.history.last().map_or(0, |r| r.tokens);
                Ok(())
            });
            let run = RunOptions { resume, progress: !args.quiet, hooks: Some(&mut count), ..RunOptions::quiet() };
            let s = train(&*o.model, &o.data, &o.config, &args.out, run)?;
            (s.history, s.adapter)
        }
        Optimizer::Mezo => {
            let mezo = MezoConfig { train: o.config.clone(), mezo: Mezo { eps: args.mezo_eps, weight_decay: args.training.optim.weight_decay(&DEFAULTS) } };
            let mut count = AfterStep(|s: &MezoState| {
                tokens += s.history.last().map_or(0, |r| r.tokens);
                Ok(())
            });
            let run = mezo_loop::RunOptions { resume, progress: !args.quiet, hooks: Some(&mut count), ..mezo_loop::RunOptions::quiet() };
            let s = train_mezo(&*o.model, &o.data, &mezo, &args.out, run)?;
            (s.history, s.adapter)
        }
    };
    Ok((history, adapter, tokens))
}

/// A non-finite loss or gradient, with its cause when the weights of the
/// model at `model` hold one (the adapter, options and data are checked
/// before training; the weights are scanned only after this error).
pub(super) fn explain_non_finite(e: anyhow::Error, model: &std::path::Path) -> anyhow::Error {
    if !matches!(e.downcast_ref::<hexlora::Error>(), Some(hexlora::Error::NonFinite(_))) {
        return e;
    }
    match Checkpoint::open(model).ok().map(|c| c.first_non_finite()) {
        Some(Some((name, i))) => e.context(format!("the model {} holds a NaN or infinity in tensor {name} (element {i})", model.display())),
        // The model is finite: the run diverged. The last commit holds the
        // step before, so a rerun in a new --out from it costs little.
        Some(None) => e.context("training diverged (the model is finite): the likely cause is a learning rate too high for these data; try a tenth of --lr (and keep --max-grad-norm on)"),
        None => e,
    }
}

/// Steps, last loss and throughput.
fn print_figures(args: &Args, history: &[StepRecord], tokens_here: u64, wall_s: f64) {
    let last = history.last().map_or(f32::NAN, |r| r.loss);
    println!("trained {} steps, last loss {last:.4}; adapter in {}", history.len(), args.out.join("adapter").display());
    // Throughput over this invocation's steps after the first (warm-up).
    let (tokens, secs) = history.iter().skip(1).fold((0u64, 0f64), |(t, s), r| (t + r.tokens, s + r.seconds));
    if secs > 0.0 {
        println!("train tok/s: {:.1}", tokens as f64 / secs);
        // The figure above times the optimizer steps only; this one is the
        // clock a user waits: warm-up step, per-step commits, final save.
        println!("wall tok/s (incl. first step, commits, save): {:.1}", tokens_here as f64 / wall_s);
    }
}

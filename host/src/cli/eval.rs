//! `hexlora eval`: run one method on one benchmark split, one result file
//! per temperature of the sweep.
use super::args::{non_negative, positive, u64_in, usize_in, MAX_TOKENS};
use hexlora::eval::baselines;
use hexlora::eval::dataset::Split;
use hexlora::eval::harness;
use hexlora::eval::lamp::read_lamp_dir;
use hexlora::eval::longlamp::{read_longlamp, LongLampTask};
use hexlora::eval::method::{Decoding, Method};
use hexlora::eval::model_methods::{self, Budget, ModelMethodConfig};
use hexlora::eval::model_runtime::{EvalModel, LabelScore};
use hexlora::eval::progress::Progress;
use hexlora::hyper::eval_method as hyper_eval;
use hexlora::npu::PrecisionPolicy;
use std::path::PathBuf;
use std::sync::Arc;

/// Evaluate a method on a benchmark split and write result JSON.
#[derive(clap::Args)]
pub struct Args {
    /// A LaMP-format benchmark directory (`{split}_questions.json`, ...).
    #[arg(long, conflicts_with = "longlamp")]
    bench: Option<PathBuf>,
    /// A LongLaMP file (JSON list or lines) instead of `--bench`.
    #[arg(long, requires = "longlamp_task")]
    longlamp: Option<PathBuf>,
    /// LongLaMP task: product_review, topic_writing or abstract_generation.
    #[arg(long)]
    longlamp_task: Option<String>,
    /// Split to evaluate.
    #[arg(long, default_value = "test")]
    split: String,
    /// Split for population-level preparation (common LoRA, global majority); `none` to skip.
    #[arg(long, default_value = "train")]
    train_split: String,
    /// Method name: model-free majority-global, majority-user,
    /// nearest-profile; with --model base, icl, common-lora, metaicl-lora
    /// (a common LoRA trained and answering with the user's ICL prefix of
    /// --icl-k items), user-lora
    /// (trained through the split runtime, DSP firmware in process),
    /// user-lora-f32 (frozen products in f32 on the CPU), mezo, hypernet
    /// (with --hypernet).
    #[arg(long)]
    method: String,
    /// Evaluate only the first N users of the split (0 = all).
    #[arg(long, default_value_t = 0)]
    users: usize,
    #[command(flatten)]
    model: ModelArgs,
    /// Temperatures of the sweep, each finite and >= 0 (0 = greedy; > 0
    /// draws 10 samples per query).
    #[arg(long, value_delimiter = ',', default_value = "0", value_parser = non_negative)]
    temperature: Vec<f32>,
    /// Generation length limit in tokens, 1 to 2^20.
    #[arg(long, default_value_t = 64, value_parser = usize_in(1..=MAX_TOKENS))]
    max_new_tokens: usize,
    /// Base sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory; files are `<task>-<method>-<split>-T<t>.json`.
    #[arg(long)]
    out: PathBuf,
    /// Overwrite result files already in --out (and start over from an
    /// interrupted run's progress).
    #[arg(long)]
    force: bool,
    /// Continue the interrupted run whose progress file is in --out
    /// (`<task>-<method>-<split>.progress.jsonl`, a line per finished
    /// user): its users are not run again. The command must be the same.
    #[arg(long, conflicts_with = "force")]
    resume: bool,
}

/// `--label-score` (the library's [`LabelScore`] carries no clap derive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LabelScoreArg {
    Mean,
    Sum,
}

impl From<LabelScoreArg> for LabelScore {
    fn from(a: LabelScoreArg) -> Self {
        match a {
            LabelScoreArg::Mean => LabelScore::Mean,
            LabelScoreArg::Sum => LabelScore::Sum,
        }
    }
}

/// Settings of the model-backed methods.
#[derive(clap::Args)]
struct ModelArgs {
    /// A `.gguf` file or Hugging Face directory (needed by model-backed methods).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Profile items shown to `icl`.
    #[arg(long, default_value_t = 4, value_parser = usize_in(0..=1 << 16))]
    icl_k: usize,
    /// How a classification task scores its labels: `mean` log-probability
    /// per token of `label <|im_end|>` (a label's length does not count),
    /// or `sum` (the probability of generating exactly the label; favours
    /// labels of fewer tokens).
    #[arg(long, value_enum, default_value_t = LabelScoreArg::Mean)]
    label_score: LabelScoreArg,
    /// Cut every prompt (query, profile item) to this many characters (>= 1).
    #[arg(long, default_value_t = 700, value_parser = usize_in(1..=1 << 30))]
    max_prompt_chars: usize,
    /// Cut training sequences to this many tokens, 1 to 2^20.
    #[arg(long, default_value_t = 256, value_parser = usize_in(1..=MAX_TOKENS))]
    max_len: usize,
    /// LoRA rank of every adapter, 1 to 4096.
    #[arg(long, default_value_t = 8, value_parser = usize_in(1..=4096))]
    rank: usize,
    /// LoRA alpha, finite and > 0.
    #[arg(long, default_value_t = 16.0, value_parser = positive)]
    alpha: f32,
    /// LoRA target modules, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")]
    targets: Vec<String>,
    /// Optimizer steps (one example each) of the common LoRA, >= 1.
    #[arg(long, default_value_t = 64, value_parser = u64_in(1..=u32::MAX as u64))]
    common_steps: u64,
    /// Peak learning rate of the common LoRA (cosine decay), finite and > 0.
    #[arg(long, default_value_t = 1e-3, value_parser = positive)]
    common_lr: f32,
    /// Per-user steps (one profile example each), for user-lora and mezo, >= 1.
    #[arg(long, default_value_t = 8, value_parser = u64_in(1..=u32::MAX as u64))]
    user_steps: u64,
    /// Per-user steps as this many epochs over each user's profile
    /// (overrides --user-steps; 0 = use --user-steps).
    #[arg(long, default_value_t = 0, value_parser = u64_in(0..=1 << 20))]
    user_epochs: u64,
    /// Peak learning rate of per-user backprop, finite and > 0.
    #[arg(long, default_value_t = 5e-4, value_parser = positive)]
    user_lr: f32,
    /// MeZO learning rate, finite and > 0.
    #[arg(long, default_value_t = 1e-4, value_parser = positive)]
    mezo_lr: f32,
    /// MeZO perturbation scale, finite and > 0.
    #[arg(long, default_value_t = 1e-2, value_parser = positive)]
    mezo_eps: f32,
    /// Use this PEFT adapter as the common LoRA instead of training one.
    #[arg(long)]
    common_adapter: Option<PathBuf>,
    /// Training runs go here (default: `<out>/train-<task>`).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Resident precision of `user-lora`'s frozen products on the DSP:
    /// `default` (the mission's: recurrent f16, attention and MLP q8_0, as
    /// `personalize`), `f16`, `q8_0`, or overrides like `attention=f16`.
    #[arg(long, default_value = "default")]
    precision: String,
    /// Trained hypernetwork directory (`hexlora hypertrain`), for `--method hypernet`.
    #[arg(long)]
    hypernet: Option<PathBuf>,
    /// Scale of each user's part of the synthesized LoRA (`--method
    /// hypernet`): 1 = as trained, 0 = the network's common LoRA, > 1
    /// extrapolates away from it. Finite and >= 0.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    hypernet_strength: f32,
    /// PEFT adapter the user's part of the synthesized LoRA is added to
    /// (`--method hypernet`), each question then asked after the user's
    /// `--icl-k` most similar profile items: the network on top of a
    /// `metaicl-lora` adapter.
    #[arg(long)]
    hypernet_over: Option<PathBuf>,
}

/// The method named `name`: a model-free baseline, or a model-backed
/// method (one entry of `model_methods`; the hypernetwork joins there).
fn method_by_name(name: &str, args: &Args, task: &str) -> anyhow::Result<Box<dyn Method>> {
    if let Some(m) = baselines::by_name(name) {
        return Ok(m);
    }
    let m = &args.model;
    if name == hyper_eval::NAME {
        let path = m.model.as_ref().ok_or_else(|| anyhow::anyhow!("method {name:?} needs --model"))?;
        let dir = m.hypernet.as_ref().ok_or_else(|| anyhow::anyhow!("method {name:?} needs --hypernet DIR"))?;
        let model = Arc::new(EvalModel::open(path)?);
        let method = hyper_eval::HypernetMethod::open(model, path, dir, m.max_prompt_chars)?.with_label_score(m.label_score.into()).with_strength(m.hypernet_strength);
        return Ok(Box::new(match &m.hypernet_over {
            Some(base) => method.over(base, m.icl_k)?,
            None => method,
        }));
    }
    let known = || format!("{}, {}, {}", baselines::NAMES.join(", "), model_methods::NAMES.join(", "), hyper_eval::NAME);
    anyhow::ensure!(model_methods::NAMES.contains(&name), "unknown method {name:?}; available: {}", known());
    let path = m.model.as_ref().ok_or_else(|| anyhow::anyhow!("method {name:?} needs --model"))?;
    if name != "user-lora" {
        super::args::warn_ignored(&format!("only user-lora runs on the DSP, not {name}"), &[("--precision", m.precision != super::args::DEFAULT_PRECISION)]);
    }
    super::args::warn_ignored(&format!("only the hypernet method synthesizes, not {name}"), &[("--hypernet", m.hypernet.is_some()), ("--hypernet-strength", m.hypernet_strength != 1.0), ("--hypernet-over", m.hypernet_over.is_some())]);
    let model = Arc::new(EvalModel::open(path)?);
    let positions = model.model.config.max_position_embeddings;
    for (flag, v) in [("--max-len", m.max_len), ("--max-new-tokens", args.max_new_tokens)] {
        if v >= positions {
            return Err(hexlora::Error::invalid(flag, format!("{v} leaves no room in the model's {positions} positions (max_position_embeddings)")).into());
        }
    }
    let cfg = ModelMethodConfig {
        icl_k: m.icl_k,
        max_prompt_chars: m.max_prompt_chars,
        max_len: m.max_len,
        rank: m.rank,
        alpha: m.alpha,
        targets: super::args::module_names(&m.targets),
        common: Budget { steps: m.common_steps, lr: m.common_lr },
        user: Budget { steps: m.user_steps, lr: m.user_lr },
        mezo_lr: m.mezo_lr,
        mezo_eps: m.mezo_eps,
        seed: args.seed,
        work_dir: m.work_dir.clone().unwrap_or_else(|| args.out.join(format!("train-{task}"))),
        common_adapter: m.common_adapter.clone(),
        label_score: m.label_score.into(),
        split_policy: PrecisionPolicy::parse(&m.precision)?,
    };
    Ok(Box::new(model_methods::by_name(name, model, cfg).expect("name checked above").with_user_epochs(m.user_epochs)))
}

fn load(args: &Args, split: &str) -> anyhow::Result<Split> {
    match (&args.bench, &args.longlamp) {
        (Some(dir), _) => Ok(read_lamp_dir(dir, split, None)?),
        (None, Some(file)) => {
            let task = LongLampTask::parse(args.longlamp_task.as_deref().unwrap_or_default())?;
            Ok(read_longlamp(file, task)?)
        }
        (None, None) => anyhow::bail!("give --bench DIR or --longlamp FILE"),
    }
}

/// Runs the sweep and writes one result per temperature.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut split = load(&args, &args.split)?;
    if args.users > 0 {
        split.users.truncate(args.users);
    }
    let train = match (args.train_split.as_str(), &args.bench) {
        ("none", _) | (_, None) => None,
        (name, Some(_)) => Some(load(&args, name)?),
    };
    std::fs::create_dir_all(&args.out).map_err(|e| hexlora::Error::io(&args.out, e))?;
    let decodings = Decoding::sweep(&args.temperature, args.max_new_tokens, args.seed);
    let mut method = method_by_name(&args.method, &args, &split.spec.name)?;
    let result_path = |t: f32| args.out.join(format!("{}-{}-{}-T{t}.json", split.spec.name, method.name(), args.split));
    if let Some(p) = args.temperature.iter().map(|&t| result_path(t)).find(|p| p.exists()).filter(|_| !args.force) {
        return Err(hexlora::Error::invalid(format!("--out {}", args.out.display()), format!("already holds {}; pass --force to overwrite it, or choose another --out", p.display())).into());
    }
    let progress_path = args.out.join(format!("{}-{}-{}.progress.jsonl", split.spec.name, method.name(), args.split));
    let fingerprint = harness::fingerprint(method.as_ref(), &split, &args.split, &decodings);
    let mut progress = match (progress_path.exists(), args.resume) {
        (true, true) => {
            let p = Progress::resume(&progress_path, fingerprint)?;
            eprintln!("resuming: {} of {} users done in {}", p.len(), split.users.len(), progress_path.display());
            p
        }
        (false, true) => return Err(hexlora::Error::invalid("--resume", format!("{} holds no progress to resume", progress_path.display())).into()),
        (true, false) if !args.force => {
            return Err(hexlora::Error::invalid(
                format!("--out {}", args.out.display()),
                format!("holds {}, the progress of an interrupted run: pass --resume to continue it, or --force to start over", progress_path.display()),
            )
            .into())
        }
        _ => Progress::start(&progress_path, fingerprint)?,
    };
    // Handlers installed, the harness stops between users (signals::requested).
    hexlora::signals::StopRequest::install()?;
    let results = match harness::run_sweep_with(method.as_mut(), train.as_ref(), &split, &args.split, &decodings, Some(&mut progress)) {
        Err(hexlora::Error::Stopped(signal)) => {
            // The progress in hand: re-reading the file would compare it
            // with a fingerprint the run has since changed (the split
            // runtime's routes are known once a user has trained).
            println!("{signal}: stopped after {} of {} users (kept in {}); rerun the same command with --resume to continue", progress.finished(), split.users.len(), progress_path.display());
            return Ok(());
        }
        other => other?,
    };
    for mut result in results {
        result.model = args.model.model.as_ref().map(|p| p.display().to_string());
        let t = result.decoding.temperature;
        let path = args.out.join(format!("{}-{}-{}-T{t}.json", result.task, result.method, args.split));
        result.write(&path)?;
        let s = &result.summary;
        println!(
            "{} {} T={t}: {} {:.4} (depth {:.4}) over {} users / {} queries in {:.1}s -> {}",
            result.method, result.task, s.primary_metric, s.accuracy.or(s.rouge1).unwrap_or(0.0),
            s.depth, s.users, s.queries, result.seconds, path.display()
        );
    }
    // every result is written: the progress has served
    std::fs::remove_file(progress.path()).map_err(|e| hexlora::Error::io(progress.path(), e))?;
    Ok(())
}

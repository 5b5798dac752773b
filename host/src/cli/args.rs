//! Argument groups shared by the training commands (`#[command(flatten)]`),
//! the value parsers every numeric option is checked with when parsed (its
//! help states the rule), and the one device vocabulary of every command
//! that can put frozen products on the DSP.
use hexlora::lora::LoraConfig;
use hexlora::npu::TransportKind;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::train::trainer::TrainConfig;
use hexlora::hyper::{HeadVariant, Pool, WeightsDtype};
use hexlora::model::gguf_adapter::OutType;
use hexlora::ops::cpu_projection::FrozenDtype;
use clap::builder::{PossibleValue, PossibleValuesParser, RangedU64ValueParser, TypedValueParser};
use std::path::{Path, PathBuf};

/// A `usize` in `range` (clap names the option and the range on a bad value).
pub fn usize_in(range: std::ops::RangeInclusive<u64>) -> impl TypedValueParser<Value = usize> {
    RangedU64ValueParser::<u64>::new().range(range).map(|v| v as usize)
}

/// A number in `range` of `u64`.
pub fn u64_in(range: std::ops::RangeInclusive<u64>) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(range)
}

/// A finite number that passes `ok`, else the rule `rule` in the error.
fn number_where<T: std::str::FromStr + Into<f64> + Copy>(s: &str, rule: &str, ok: impl Fn(T) -> bool) -> Result<T, String> {
    let v: T = s.trim().parse().map_err(|_| format!("{s:?} is not a number ({rule})"))?;
    if v.into().is_finite() && ok(v) {
        Ok(v)
    } else {
        Err(format!("{s} is not {rule}"))
    }
}

/// A finite `f32` > 0 (learning rates, alpha, perturbation scales).
pub fn positive(s: &str) -> Result<f32, String> {
    number_where(s, "a finite number > 0", |v| v > 0.0)
}

/// A finite `f32` >= 0 (weight decay, clipping norm, temperature).
pub fn non_negative(s: &str) -> Result<f32, String> {
    number_where(s, "a finite number >= 0", |v| v >= 0.0)
}

/// A finite `f32` (a sign is meaningful, e.g. a scale).
pub fn finite(s: &str) -> Result<f32, String> {
    number_where(s, "a finite number", |_| true)
}

/// A probability in [0, 1) (dropout).
pub fn probability(s: &str) -> Result<f32, String> {
    number_where(s, "a probability in [0, 1)", |v| (0.0..1.0).contains(&v))
}

/// A fraction in (0, 1] (nucleus mass).
pub fn fraction(s: &str) -> Result<f32, String> {
    number_where(s, "a fraction in (0, 1]", |v| v > 0.0 && v <= 1.0)
}

/// Seconds as a finite `f64` > 0.
pub fn seconds(s: &str) -> Result<f64, String> {
    number_where(s, "a finite number of seconds > 0", |v: f64| v > 0.0)
}

/// Longest example, prompt or answer in tokens any option accepts; the
/// model's `max_position_embeddings` bounds it further once it is read.
pub const MAX_TOKENS: u64 = 1 << 20;

/// What every LoRA training command takes: model and data, adapter,
/// optimizer.
#[derive(clap::Args)]
pub struct TrainingArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
    #[command(flatten)]
    pub optim: OptimArgs,
}

impl TrainingArgs {
    /// The run's configuration, one epoch of `examples` unless `--steps`.
    pub fn config(&self, examples: usize, d: &OptimDefaults) -> TrainConfig {
        self.optim.train_config(self.lora.config(&self.data.model), self.data.seed, examples, d)
    }
}

/// The model, the training data and how examples are cut.
#[derive(clap::Args)]
pub struct DataArgs {
    /// GGUF file or Hugging Face model directory.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: PathBuf,
    /// JSONL: {"prompt","completion"}, {"messages"} or {"input_ids","labels"}.
    #[arg(long)]
    pub data: PathBuf,
    /// Truncate examples to this many tokens (1 to 2^20; a longer example
    /// must also fit the model's max_position_embeddings).
    #[arg(long, default_value_t = 512, value_parser = usize_in(1..=MAX_TOKENS))]
    pub max_len: usize,
    /// Seed (data order, init, dropout).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `--targets` as module names: trimmed, empty entries dropped (`a, b,`).
pub fn module_names(list: &[String]) -> Vec<String> {
    list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// The LoRA adapter to train.
#[derive(clap::Args)]
pub struct LoraArgs {
    /// LoRA rank, 1 to 4096.
    #[arg(long, default_value_t = 16, value_parser = usize_in(1..=4096))]
    pub rank: usize,
    /// LoRA alpha, finite and > 0.
    #[arg(long, default_value_t = 32.0, value_parser = positive)]
    pub alpha: f32,
    /// LoRA dropout, in [0, 1).
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    pub dropout: f32,
    /// Target modules, comma-separated; each must name projections of the model.
    #[arg(long, value_delimiter = ',', default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")]
    pub targets: Vec<String>,
}

impl LoraArgs {
    /// The adapter's configuration for a base model at `model`.
    pub fn config(&self, model: &Path) -> LoraConfig {
        LoraConfig {
            r: self.rank,
            alpha: self.alpha,
            target_modules: module_names(&self.targets),
            dropout: self.dropout,
            use_rslora: false,
            base_model: model.display().to_string(),
        }
    }
}

/// Optimizer steps, schedule and memory.
#[derive(clap::Args)]
pub struct OptimArgs {
    /// Optimizer steps, >= 1 (default: one epoch).
    #[arg(long, value_parser = u64_in(1..=u32::MAX as u64))]
    pub steps: Option<u64>,
    /// Examples per optimizer step, from 1 to the number of examples.
    #[arg(long, default_value_t = 1, value_parser = usize_in(1..=1 << 20))]
    pub grad_accum: usize,
    /// Peak learning rate, finite and > 0.
    #[arg(long, default_value_t = 2e-4, value_parser = positive)]
    pub lr: f32,
    /// Warm-up steps.
    #[arg(long, default_value_t = 0, value_parser = u64_in(0..=u32::MAX as u64))]
    pub warmup: u64,
    /// Decay after warm-up.
    #[arg(long, value_parser = choices(DECAYS), default_value = "cosine")]
    pub schedule: Decay,
    /// AdamW (and MeZO) weight decay, finite and >= 0 [default: train 0,
    /// personalize 0.01].
    #[arg(long, value_parser = non_negative)]
    pub weight_decay: Option<f32>,
    /// Clip the gradient norm (0 = off), finite and >= 0.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    pub max_grad_norm: f32,
    /// Activation memory cap in MiB, 1 to 2^30 (also bounded by MemAvailable).
    #[arg(long, value_parser = u64_in(1..=1 << 30))]
    pub activation_cap_mb: Option<u64>,
    /// Token rows per vocabulary-head chunk (peak memory of the loss), 1 to
    /// 2^20 [default: train 256, personalize 64].
    #[arg(long, value_parser = usize_in(1..=MAX_TOKENS))]
    pub head_chunk: Option<usize>,
}

/// What a command picks where [`OptimArgs`] leaves a value unset.
pub struct OptimDefaults {
    /// `--weight-decay`.
    pub weight_decay: f32,
    /// `--head-chunk`.
    pub head_chunk: usize,
}

impl OptimArgs {
    /// The run's steps: `--steps`, or one epoch of `examples`.
    pub fn steps_for(&self, examples: usize) -> u64 {
        self.steps.unwrap_or((examples / self.grad_accum.max(1)).max(1) as u64)
    }

    /// The whole training configuration.
    pub fn train_config(&self, lora: LoraConfig, seed: u64, examples: usize, d: &OptimDefaults) -> TrainConfig {
        TrainConfig {
            lora,
            adamw: AdamWConfig { weight_decay: self.weight_decay(d), ..Default::default() },
            schedule: Schedule { lr: self.lr, warmup: self.warmup, total: self.steps_for(examples), decay: self.schedule },
            grad_accum: self.grad_accum,
            max_grad_norm: (self.max_grad_norm > 0.0).then_some(self.max_grad_norm),
            seed,
            activation_cap: self.activation_cap_mb.map(|m| m << 20),
            head_chunk: self.head_chunk.unwrap_or(d.head_chunk),
        }
    }

    /// `--weight-decay` or the command's default.
    pub fn weight_decay(&self, d: &OptimDefaults) -> f32 {
        self.weight_decay.unwrap_or(d.weight_decay)
    }
}

/// Where frozen products run: the same words for every command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// f32 (or bf16) on the CPU: the reference, and the fast path on a PC.
    Cpu,
    /// The DSP firmware built natively, linked into this process.
    #[value(alias = "in-process")]
    Dsp,
    /// The firmware on a thread of its own, mailbox in shared memory.
    #[value(alias = "shm")]
    DspShm,
    /// The Hexagon firmware under qemu-hexagon (needs HEXLORA_SIM_SERVICE).
    #[value(alias = "sim")]
    DspSim,
    /// The skel through FastRPC: libcdsprpc.so on a device, or the stand-in HEXLORA_FASTRPC_LIB names.
    #[value(alias = "fastrpc")]
    DspFastrpc,
}

/// Warns, naming them, about options given (`true`) that the run will
/// not use: DSP settings with `--device cpu`, a precision for a method that
/// never reaches the DSP. One rule and one wording for every command.
pub fn warn_ignored(why: &str, options: &[(&str, bool)]) {
    let given: Vec<&str> = options.iter().filter(|(_, g)| *g).map(|(n, _)| *n).collect();
    if !given.is_empty() {
        eprintln!("warning: {} ignored: {why}", given.join(", "));
    }
}

/// Where frozen products run and the split runtime's settings for the DSP
/// side: one set of options, one meaning, for `personalize` and
/// `serve --learn`.
#[derive(clap::Args, Clone, Debug)]
pub struct DspArgs {
    /// Where frozen products run.
    #[arg(long, value_enum, alias = "transport", default_value = "dsp")]
    pub device: Device,
    /// Resident precision on the DSP: `default` (recurrent f16, attention
    /// and MLP q8_0), `f16`, `q8_0`, or overrides like `attention=f16`.
    #[arg(long, default_value = DEFAULT_PRECISION)]
    pub precision: String,
    /// Token buckets the planner validates (token counts are padded up).
    #[arg(long, default_value = DEFAULT_BUCKETS)]
    pub buckets: String,
    /// Where validated routes are remembered between runs (default
    /// `$XDG_CACHE_HOME/hexlora` or `~/.cache/hexlora`). A cached
    /// projection is still canary-probed at the smallest bucket.
    #[arg(long)]
    pub plan_cache: Option<PathBuf>,
    /// Probe every route and leave the plan cache alone.
    #[arg(long)]
    pub no_plan_cache: bool,
}

impl DspArgs {
    /// The DSP-only options, each with whether it was given (for
    /// [`warn_ignored`]).
    pub fn dsp_only(&self) -> [(&'static str, bool); 4] {
        [
            ("--precision", self.precision != DEFAULT_PRECISION),
            ("--buckets", self.buckets != DEFAULT_BUCKETS),
            ("--plan-cache", self.plan_cache.is_some()),
            ("--no-plan-cache", self.no_plan_cache),
        ]
    }

    /// The resident precision policy `--precision` names.
    pub fn policy(&self) -> hexlora::Result<hexlora::npu::PrecisionPolicy> {
        hexlora::npu::PrecisionPolicy::parse(&self.precision)
    }

    /// The planner's token buckets.
    pub fn buckets(&self) -> hexlora::Result<hexlora::runtime::planner::Buckets> {
        hexlora::runtime::planner::Buckets::parse(&self.buckets)
    }

    /// The plan cache directory, `None` with `--no-plan-cache`.
    pub fn plan_cache_dir(&self) -> Option<PathBuf> {
        if self.no_plan_cache {
            None
        } else {
            self.plan_cache.clone().or_else(hexlora::runtime::plan_cache::default_dir)
        }
    }
}

/// The default of `--precision` (`personalize`, `grad`, `serve`, `eval`).
pub const DEFAULT_PRECISION: &str = "default";
/// The default of `--buckets` (`personalize`, `serve`).
pub const DEFAULT_BUCKETS: &str = "32,64,128,256,512";

impl Device {
    /// The transport to the DSP service, `None` for the CPU.
    pub fn transport(self) -> Option<TransportKind> {
        match self {
            Device::Cpu => None,
            Device::Dsp => Some(TransportKind::InProcess),
            Device::DspShm => Some(TransportKind::SharedMemory),
            Device::DspSim => Some(TransportKind::Simulator),
            Device::DspFastrpc => Some(TransportKind::FastRpc),
        }
    }
}

/// One value of a library enum on the command line: its name and the help
/// line clap shows for it.
pub struct Choice<T: 'static> {
    name: &'static str,
    value: T,
    help: &'static str,
}

/// clap's parser for a library enum from its table of [`Choice`]s, so the
/// library's types carry no clap derive.
pub fn choices<T: Clone + Send + Sync + 'static>(table: &'static [Choice<T>]) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(table.iter().map(|c| PossibleValue::new(c.name).help(c.help)))
        .map(move |s| table.iter().find(|c| c.name == s).expect("clap accepts only the table's names").value.clone())
}

/// `--schedule`.
pub const DECAYS: &[Choice<Decay>] = &[
    Choice { name: "cosine", value: Decay::Cosine, help: "half a cosine down to 0 at the last step" },
    Choice { name: "linear", value: Decay::Linear, help: "straight line down to 0 at the last step" },
    Choice { name: "constant", value: Decay::Constant, help: "stay at the base rate" },
];

/// `--frozen-dtype`.
pub const FROZEN_DTYPES: &[Choice<FrozenDtype>] = &[
    Choice { name: "f32", value: FrozenDtype::F32, help: "dense f32: exactly the effective weight" },
    Choice { name: "bf16", value: FrozenDtype::Bf16, help: "half the memory; activations rounded to bf16 per product, sums in f32" },
];

/// `--outtype` of `export-gguf`.
pub const OUT_TYPES: &[Choice<OutType>] = &[
    Choice { name: "f32", value: OutType::F32, help: "exact" },
    Choice { name: "f16", value: OutType::F16, help: "IEEE half, round to nearest even" },
    Choice { name: "q8_0", value: OutType::Q8_0, help: "Q8_0 where a factor's rows are a multiple of 32 wide, F16 otherwise" },
];

/// `--variant` of `hypertrain`.
pub const HEAD_VARIANTS: &[Choice<HeadVariant>] = &[
    Choice { name: "parallel", value: HeadVariant::Parallel, help: "one 2-layer bottleneck MLP per (layer, module, A or B)" },
    Choice { name: "shared-trunk", value: HeadVariant::SharedTrunk, help: "one shared first layer plus layer and module-type embeddings" },
];

/// `--pool` of `hypertrain`.
pub const POOLS: &[Choice<Pool>] = &[
    Choice { name: "mean", value: Pool::Mean, help: "every context token" },
    Choice { name: "responses", value: Pool::Responses, help: "the responses' tokens only (what the user wrote)" },
];

/// `--weights-dtype` of `hypertrain`.
pub const WEIGHTS_DTYPES: &[Choice<WeightsDtype>] = &[
    Choice { name: "f32", value: WeightsDtype::F32, help: "exact" },
    Choice { name: "f16", value: WeightsDtype::F16, help: "half the size" },
];

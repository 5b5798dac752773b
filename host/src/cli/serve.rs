//! `hexlora serve`: an OpenAI-compatible HTTP server answering with the
//! base model or a user's LoRA adapter (see [`hexlora::serve`]).
use super::args::{positive, usize_in, Device, DspArgs};
use hexlora::lora::LoraConfig;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::{Decay, Schedule};
use hexlora::personal::round::RoundConfig;
use hexlora::personal::Limits;
use hexlora::serve::learn::LearnConfig;
use hexlora::serve::LearnSetup;
use hexlora::train::trainer::TrainConfig;
use std::path::PathBuf;

/// Arguments of `hexlora serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The base model: a `.gguf` file or a Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// A user's adapter as NAME=PATH (PEFT directory or `.gguf`); requests
    /// pick it with `"model": "NAME"`. Repeatable.
    #[arg(long, value_parser = parse_adapter)]
    adapter: Vec<(String, PathBuf)>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port; 0 picks a free one (the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait behind the one being answered (more get 429).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    queue: u64,
    /// Prompt plus answer tokens one request may use, at most the model's
    /// max_position_embeddings [default: 2048, or the model's positions if fewer].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    ctx_size: Option<u64>,
    /// The only directory `POST /v1/adapters/NAME` may load adapters from
    /// (paths in requests are resolved inside it). Without it, adapters are
    /// fixed at start-up by --adapter.
    #[arg(long)]
    adapter_dir: Option<PathBuf>,
    /// Require `Authorization: Bearer KEY` on every route but /health (also
    /// read from HEXLORA_API_KEY, which keeps it out of the process list).
    #[arg(long, env = "HEXLORA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// `max_tokens` for requests that give none.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_tokens: u64,
    #[command(flatten)]
    learn: LearnArgs,
}

/// The personal loop in this process (`--learn DIR`).
#[derive(clap::Args)]
#[command(next_help_heading = "Learning (--learn)")]
struct LearnArgs {
    /// Users learn in this process: their approved examples (POST
    /// /v1/feedback), adapter versions and the live one live in DIR/NAME;
    /// a learner trains a user's adapter when the server is idle and puts
    /// it live only if its held-out loss is not worse.
    #[arg(long, value_name = "DIR")]
    learn: Option<PathBuf>,
    /// Seconds without requests before the learner starts a round on its own.
    #[arg(long, default_value_t = 60.0, value_parser = super::args::seconds, requires = "learn")]
    learn_idle: f64,
    /// New examples a round needs (the newest fifth is held out for the gate), 2 to 2^20.
    #[arg(long, default_value_t = 4, value_parser = usize_in(2..=1 << 20), requires = "learn")]
    learn_min_examples: usize,
    /// Examples kept per user; beyond it the oldest are dropped (said in the response).
    #[arg(long, default_value_t = 1000, value_parser = usize_in(1..=1 << 24), requires = "learn")]
    learn_max_examples: usize,
    /// Adapter versions kept per user (the live one always), 2 to 10000.
    #[arg(long, default_value_t = 5, value_parser = usize_in(2..=10000), requires = "learn")]
    keep: usize,
    /// Peak learning rate of a round (cosine to 0), finite and > 0.
    #[arg(long, default_value_t = 1e-3, value_parser = positive, requires = "learn")]
    learn_lr: f32,
    /// Passes over a round's examples, 1 to 1000.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1000), requires = "learn")]
    learn_epochs: u64,
    /// Examples are cut to this many tokens (feedback whose answer would be cut away is refused).
    #[arg(long, default_value_t = 512, value_parser = usize_in(2..=1 << 20), requires = "learn")]
    learn_max_len: usize,
    /// LoRA rank of a user created fresh, 1 to 4096.
    #[arg(long, default_value_t = 8, value_parser = usize_in(1..=4096), requires = "learn")]
    learn_rank: usize,
    /// LoRA alpha of a user created fresh, finite and > 0.
    #[arg(long, default_value_t = 16.0, value_parser = positive, requires = "learn")]
    learn_alpha: f32,
    /// Where the learner's frozen products run, as for `personalize`
    /// (refused without `--learn`).
    #[command(flatten)]
    dsp: DspArgs,
}

impl LearnArgs {
    fn setup(&self, model: &std::path::Path) -> anyhow::Result<Option<LearnSetup>> {
        let Some(dir) = &self.learn else {
            // As `requires = "learn"` did before these options were shared
            // with `personalize`: refused, not ignored.
            let mut given = self.dsp.dsp_only().to_vec();
            given.push(("--device", self.dsp.device != Device::Dsp));
            let named: Vec<&str> = given.iter().filter(|(_, g)| *g).map(|(n, _)| *n).collect();
            anyhow::ensure!(named.is_empty(), "{} set(s) where the learner's frozen products run, and needs --learn DIR", named.join(", "));
            return Ok(None);
        };
        if self.dsp.device == Device::Cpu {
            super::args::warn_ignored("--device cpu runs the learner's frozen products on the CPU", &self.dsp.dsp_only());
        }
        let lora = LoraConfig {
            r: self.learn_rank,
            alpha: self.learn_alpha,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"].map(String::from).to_vec(),
            dropout: 0.0,
            use_rslora: false,
            base_model: model.display().to_string(),
        };
        let train = TrainConfig {
            lora: lora.clone(),
            adamw: AdamWConfig::default(),
            schedule: Schedule { lr: self.learn_lr, warmup: 0, total: 1, decay: Decay::Cosine },
            grad_accum: 1,
            max_grad_norm: Some(1.0),
            seed: 0,
            activation_cap: None,
            head_chunk: 64,
        };
        let config = LearnConfig {
            dir: dir.clone(),
            idle: std::time::Duration::from_secs_f64(self.learn_idle),
            limits: Limits { max_examples: self.learn_max_examples, keep: self.keep },
            round: RoundConfig { train, epochs: self.learn_epochs, max_len: self.learn_max_len, min_new: self.learn_min_examples },
            fresh: lora,
        };
        Ok(Some(LearnSetup {
            config,
            transport: self.dsp.device.transport(),
            policy: self.dsp.policy()?,
            buckets: self.dsp.buckets()?,
            plan_cache: self.dsp.plan_cache_dir(),
        }))
    }
}

fn parse_adapter(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let learn = args.learn.setup(&args.model)?;
    hexlora::serve::run(hexlora::serve::Config {
        model: args.model,
        adapters: args.adapter,
        host: args.host,
        port: args.port,
        queue: args.queue as usize,
        ctx_size: args.ctx_size.map(|c| c as usize),
        default_max_tokens: args.max_tokens as usize,
        adapter_dir: args.adapter_dir,
        api_key: args.api_key,
        learn,
    })?;
    Ok(())
}

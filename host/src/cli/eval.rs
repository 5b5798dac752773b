//! `hexlora eval`: run one method on one benchmark split, one result file
//! per temperature of the sweep.
use crate::eval::baselines;
use crate::eval::dataset::Split;
use crate::eval::harness;
use crate::eval::lamp::read_lamp_dir;
use crate::eval::longlamp::{read_longlamp, LongLampTask};
use crate::eval::method::{Decoding, Method};
use std::path::PathBuf;

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
    /// Method name (model-free: majority-global, majority-user, nearest-profile).
    #[arg(long)]
    method: String,
    /// Temperatures of the sweep (0 = greedy; > 0 draws 10 samples per query).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    temperature: Vec<f32>,
    /// Generation length limit in tokens.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Base sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory; files are `<task>-<method>-<split>-T<t>.json`.
    #[arg(long)]
    out: PathBuf,
}

/// The method named `name`. Model-backed methods (base, icl, common-lora,
/// user-lora, mezo, hypernet) register here when their crates land.
fn method_by_name(name: &str) -> anyhow::Result<Box<dyn Method>> {
    baselines::by_name(name).ok_or_else(|| {
        anyhow::anyhow!("unknown method {name:?}; available: {}", baselines::NAMES.join(", "))
    })
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
    let split = load(&args, &args.split)?;
    let train = match (args.train_split.as_str(), &args.bench) {
        ("none", _) | (_, None) => None,
        (name, Some(_)) => Some(load(&args, name)?),
    };
    std::fs::create_dir_all(&args.out).map_err(|e| crate::Error::io(&args.out, e))?;
    for decoding in Decoding::sweep(&args.temperature, args.max_new_tokens, args.seed) {
        let mut method = method_by_name(&args.method)?;
        let result = harness::run(method.as_mut(), train.as_ref(), &split, &args.split, &decoding)?;
        let path = args.out.join(format!("{}-{}-{}-T{}.json", result.task, result.method, args.split, decoding.temperature));
        result.write(&path)?;
        let s = &result.summary;
        println!(
            "{} {} T={}: {} {:.4} (depth {:.4}) over {} users / {} queries in {:.1}s -> {}",
            result.method, result.task, decoding.temperature, s.primary_metric, s.accuracy.or(s.rouge1).unwrap_or(0.0),
            s.depth, s.users, s.queries, result.seconds, path.display()
        );
    }
    Ok(())
}

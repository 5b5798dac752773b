//! `hexlora hypertrain`: trains the LoRA-synthesizing hypernetwork for a
//! population (stage 1a SimCSE, stage 1b end to end with distillation), with
//! commits after every step and `--resume`.
use hexlora::hyper::targets::load_targets;
use hexlora::hyper::trainer::{hypertrain, hypertrain_from, Guides, HyperRun, HyperTrainConfig, StartFrom};
use hexlora::train::learner::{claim_out_dir, StepHooks};
use hexlora::hyper::checkpoints::{DevCheckpoints, Keep, BEST_DIR};
use super::args::{choices, module_names, non_negative, positive, u64_in, usize_in, HEAD_VARIANTS, MAX_TOKENS, POOLS, WEIGHTS_DTYPES};
use hexlora::eval::lamp::read_lamp_dir;
use hexlora::hyper::commit::HyperState;
use hexlora::hyper::users::{load_users, split_users, UserRecord};
use hexlora::hyper::{HeadVariant, HyperConfig, HyperNet, Pool, WeightsDtype};
use hexlora::lora::Adapter;
use hexlora::optim::adamw::AdamWConfig;
use hexlora::optim::schedule::Decay;
use hexlora::model::checkpoint::Checkpoint;
use hexlora::ops::cpu_projection::FrozenDtype;
use hexlora::train::text_encoder::ModelText;
use std::path::{Path, PathBuf};

/// Arguments of `hexlora hypertrain`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory (the frozen target LLM).
    #[arg(long)]
    model: PathBuf,
    /// Benchmark directory in LaMP format (e.g. /tmp/bb/mail-subject): its
    /// users' profile items and answered questions, as `hexlora eval` reads them.
    #[arg(long, conflicts_with = "data", required_unless_present = "data")]
    bench: Option<PathBuf>,
    /// Splits of --bench to train on, comma-separated (`train,pool`: the
    /// train users and the extra training users of git-area's pool split).
    #[arg(long, default_value = "train")]
    split: String,
    /// Held-out split of --bench: loss of synthesized LoRAs vs the common
    /// LoRA on its users, written to heldout.jsonl.
    #[arg(long)]
    dev_split: Option<String>,
    /// Held-out users (the first N of --dev-split or --dev-data), 0 to 2^20.
    #[arg(long, default_value_t = 8, value_parser = usize_in(0..=1 << 20))]
    dev_users: usize,
    /// Evaluate the held-out loss every N steps (and before and after training), N >= 1.
    #[arg(long, default_value_t = 10, value_parser = u64_in(1..=u32::MAX as u64))]
    dev_every: u64,
    /// Also keep the network of every held-out check in `hypernet-step<N>/`
    /// (with `checkpoint.json`: step and loss), so checkpoints can be scored
    /// on the task's own metric: on quotes-tag the held-out loss picked a
    /// step 15 dev-accuracy points worse than the next check (`docs/RESULTS.md`).
    #[arg(long)]
    keep_dev_checkpoints: bool,
    /// Cut every prompt (profile item, question) to this many characters,
    /// as `hexlora eval --max-prompt-chars` does (>= 1).
    #[arg(long, default_value_t = 700, value_parser = usize_in(1..=1 << 30))]
    max_prompt_chars: usize,
    /// Users JSONL instead of --bench: {"user": ..., "examples": [{"query", "response"}, ...]}.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Held-out users JSONL (the form of --data) instead of --dev-split;
    /// the first --dev-users of them.
    #[arg(long, conflicts_with = "dev_split")]
    dev_data: Option<PathBuf>,
    /// Train on shard K of S (written K/S, 0 <= K < S) of the users: the
    /// K-th of S contiguous, near-equal ranges in file or split order. Each
    /// shard needs at least two users.
    #[arg(long, value_parser = parse_shard)]
    shard: Option<Shard>,
    /// Start from this hypernetwork directory (hypernet.json +
    /// hypernet.safetensors, as `hypernet/` is written) instead of a fresh
    /// network; its configuration replaces the shape options.
    #[arg(long)]
    init_hypernet: Option<PathBuf>,
    /// Global step the --init-hypernet parameters are at (it fixes the
    /// users, dropout and learning rate of the next steps); with --resume
    /// the commit in --out must be at this step, and keeps its Adam moments.
    #[arg(long, default_value_t = 0, requires = "init_hypernet", value_parser = u64_in(0..=u32::MAX as u64))]
    start_step: u64,
    /// Run at most N steps in this invocation, then write hypernet/ (f32),
    /// the commit and worker.json whatever the step; 0 writes the starting
    /// network (and its held-out loss) without training. For federated workers.
    #[arg(long, value_parser = u64_in(0..=u32::MAX as u64))]
    local_steps: Option<u64>,
    /// Run directory: commit.safetensors, metrics.jsonl, loss.svg, hypernet/.
    #[arg(long)]
    out: PathBuf,
    /// Overwrite outputs in --out that no commit owns.
    #[arg(long)]
    force: bool,
    /// Continue the run committed in --out.
    #[arg(long)]
    resume: bool,
    /// Common LoRA (PEFT directory): initial head biases and the ICL teacher's adapter.
    #[arg(long)]
    common_lora: Option<PathBuf>,
    /// Stage 1a (SimCSE) steps.
    #[arg(long, default_value_t = 20, value_parser = u64_in(0..=u32::MAX as u64))]
    simcse_steps: u64,
    /// Stage 1b (end-to-end) steps.
    #[arg(long, default_value_t = 100, value_parser = u64_in(0..=u32::MAX as u64))]
    steps: u64,
    /// Users per step, 1 to 2^16.
    #[arg(long, default_value_t = 4, value_parser = usize_in(1..=1 << 16))]
    users_per_step: usize,
    /// Scored examples per user in stage 1b (the rest is context), 1 to 2^16.
    #[arg(long, default_value_t = 2, value_parser = usize_in(1..=1 << 16))]
    target_examples: usize,
    /// Weight of the KL to the ICL teacher (0 = off), finite and >= 0.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    kl_weight: f32,
    /// Each training user's own LoRA, `DIR/<user>/adapter` (what `hexlora
    /// eval --method user-lora-f32 --work-dir W` keeps in `W/user-lora-f32`,
    /// trained from --common-lora): stage 1b also pulls the generated LoRA
    /// toward it (squared distance over the population's mean distance from
    /// the common LoRA). Every training user needs one.
    #[arg(long, requires = "common_lora")]
    lora_targets: Option<PathBuf>,
    /// Weight of that distance in the loss, finite and >= 0.
    #[arg(long, default_value_t = 1.0, requires = "lora_targets", value_parser = non_negative)]
    recon_weight: f32,
    /// Stage 1b learns from the targets alone: no pass through the LLM
    /// beyond the embedding (a step costs the users' embeddings only).
    #[arg(long, requires = "lora_targets")]
    recon_only: bool,
    /// Keep the heads' output biases (the common LoRA the network starts
    /// from) fixed in stage 1b: only what depends on the user trains.
    #[arg(long)]
    freeze_common: bool,
    /// Keep the embedder LoRA as SimCSE (stage 1a) left it during stage 1b:
    /// only the heads train, so end to end training cannot pull users'
    /// embeddings together.
    #[arg(long)]
    freeze_embedder: bool,
    /// Centre the heads' coefficients on their running mean over the users
    /// seen (out = b2 + W2 (h - c)): W2 learns only what differs between
    /// users, the common part stays in b2.
    #[arg(long)]
    center: bool,
    /// Standardize the embedding the heads read: centred on its running
    /// population mean, scaled to unit mean variance across users.
    #[arg(long)]
    standardize: bool,
    /// Context tokens the embedding pools.
    #[arg(long, value_parser = choices(POOLS), default_value = "mean")]
    pool: Pool,
    /// Cut each context query to its last N characters (N >= 1), so more
    /// of a user's examples fit --context-tokens.
    #[arg(long, value_parser = usize_in(1..=1 << 30))]
    context_query_chars: Option<usize>,
    /// Stage 1b peak learning rate, finite and > 0.
    #[arg(long, default_value_t = 1e-3, value_parser = positive)]
    lr: f32,
    /// Stage 1a peak learning rate, finite and > 0.
    #[arg(long, default_value_t = 1e-4, value_parser = positive)]
    simcse_lr: f32,
    /// Warm-up steps per stage.
    #[arg(long, default_value_t = 5, value_parser = u64_in(0..=u32::MAX as u64))]
    warmup: u64,
    /// Clip the gradient norm (0 = off), finite and >= 0.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    max_grad_norm: f32,
    /// Embedder LoRA rank, 1 to 4096.
    #[arg(long, default_value_t = 8, value_parser = usize_in(1..=4096))]
    embed_rank: usize,
    /// Generated LoRA rank, 1 to 4096.
    #[arg(long, default_value_t = 4, value_parser = usize_in(1..=4096))]
    out_rank: usize,
    /// Generated LoRA alpha, finite and > 0.
    #[arg(long, default_value_t = 8.0, value_parser = positive)]
    out_alpha: f32,
    /// Head bottleneck width k, 1 to 4096.
    #[arg(long, default_value_t = 16, value_parser = usize_in(1..=4096))]
    bottleneck: usize,
    /// Parallel heads or the shared trunk.
    #[arg(long, value_parser = choices(HEAD_VARIANTS), default_value = "parallel")]
    variant: HeadVariant,
    /// Modules of the generated LoRA, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "q_proj,k_proj,v_proj,o_proj")]
    targets: Vec<String>,
    /// Context token budget, 1 to 2^20 (and the model's positions).
    #[arg(long, default_value_t = 512, value_parser = usize_in(1..=MAX_TOKENS))]
    context_tokens: usize,
    /// Target example length cap, 1 to 2^20 (and the model's positions).
    #[arg(long, default_value_t = 256, value_parser = usize_in(1..=MAX_TOKENS))]
    max_len: usize,
    /// Seed (init, user sampling, dropout).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Recompute every layer in the backward (less memory).
    #[arg(long)]
    recompute: bool,
    /// Commit the run every N steps, N >= 1 (a commit is 3x the network: weights and Adam moments).
    #[arg(long, default_value_t = 1, value_parser = u64_in(1..=u32::MAX as u64))]
    commit_every: u64,
    /// Store the final hypernet/ weights as f16 (half the size; synthesis
    /// changes within the bound tested in tests/suite/hyper_weights_dtype.rs).
    #[arg(long, value_parser = choices(WEIGHTS_DTYPES), default_value = "f32")]
    weights_dtype: WeightsDtype,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The population and the held-out users of `--dev-split`.
fn users_of(args: &Args) -> anyhow::Result<(Vec<UserRecord>, Vec<UserRecord>)> {
    let users = match (&args.bench, &args.data) {
        (Some(dir), _) => splits_users(dir, &args.split, args.max_prompt_chars)?,
        (None, Some(path)) => load_users(path)?,
        (None, None) => anyhow::bail!("give --bench DIR or --data USERS.jsonl"),
    };
    let dev = match (&args.bench, &args.dev_split, &args.dev_data) {
        (Some(dir), Some(split), _) => bench_users(dir, split, args.max_prompt_chars)?,
        (None, Some(_), _) => anyhow::bail!("--dev-split needs --bench"),
        (_, None, Some(path)) => load_users(path)?,
        _ => Vec::new(),
    };
    let users = match args.shard {
        Some(shard) => shard.of(users)?,
        None => users,
    };
    Ok((users, dev.into_iter().take(args.dev_users).collect()))
}

/// Shard K of S of the users.
#[derive(Clone, Copy, Debug)]
struct Shard {
    index: usize,
    count: usize,
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let (k, n) = s.split_once('/').ok_or_else(|| format!("{s:?} is not K/S (e.g. 0/3)"))?;
    let index: usize = k.trim().parse().map_err(|e| format!("shard index {k:?}: {e}"))?;
    let count: usize = n.trim().parse().map_err(|e| format!("shard count {n:?}: {e}"))?;
    match index < count {
        true => Ok(Shard { index, count }),
        false => Err(format!("{s}: the index must be below the count (0..{count})")),
    }
}

impl Shard {
    /// Users `[K n / S, (K + 1) n / S)`: contiguous, so the shards are
    /// disjoint and cover every user.
    fn of(self, mut users: Vec<UserRecord>) -> anyhow::Result<Vec<UserRecord>> {
        let n = users.len();
        let (from, to) = (self.index * n / self.count, (self.index + 1) * n / self.count);
        if to - from < 2 {
            let msg = format!("{}/{} holds {} of the {n} users; a shard needs at least two (in-batch negatives)", self.index, self.count, to - from);
            return Err(hexlora::Error::invalid("--shard", msg).into());
        }
        users.truncate(to);
        Ok(users.split_off(from))
    }
}

/// The network's shape; the generated LoRA takes `common`'s rank, alpha
/// and targets when there is one.
fn hyper_config(args: &Args, common: Option<&Adapter>) -> HyperConfig {
    let (out_rank, out_alpha, out_targets) = match common {
        Some(c) => (c.config.r, c.config.alpha, c.config.target_modules.clone()),
        None => (args.out_rank, args.out_alpha, module_names(&args.targets)),
    };
    HyperConfig {
        embed_rank: args.embed_rank,
        embed_alpha: 2.0 * args.embed_rank as f32,
        out_rank,
        out_alpha,
        out_targets,
        bottleneck: args.bottleneck,
        variant: args.variant,
        context_tokens: args.context_tokens,
        base_model: args.model.display().to_string(),
        center: args.center,
        standardize: args.standardize,
        pool: args.pool,
        context_query_chars: args.context_query_chars,
        ..HyperConfig::default()
    }
}

fn train_config(args: &Args) -> HyperTrainConfig {
    HyperTrainConfig {
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
        freeze_common: args.freeze_common,
        freeze_embedder: args.freeze_embedder,
        recon_weight: args.recon_weight,
        end_to_end: !args.recon_only,
    }
}

/// Runs `hexlora hypertrain`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.simcse_steps + args.steps == 0 {
        return Err(hexlora::Error::invalid("--steps", "0 with --simcse-steps 0: nothing to train").into());
    }
    let (users, dev) = users_of(&args)?;
    let outputs = ["hypernet", BEST_DIR, "metrics.jsonl", "loss.svg", "heldout.jsonl", "worker.json"];
    let mut inputs = vec![("--model", args.model.as_path())];
    for (flag, p) in [("--bench", &args.bench), ("--data", &args.data), ("--dev-data", &args.dev_data), ("--init-hypernet", &args.init_hypernet), ("--common-lora", &args.common_lora), ("--lora-targets", &args.lora_targets)] {
        inputs.extend(p.as_deref().map(|p| (flag, p)));
    }
    claim_out_dir(&args.out, &outputs, &inputs, args.force)?;
    let ckpt = Checkpoint::open(&args.model)?;
    let positions = ckpt.config.max_position_embeddings;
    for (flag, v) in [("--max-len", args.max_len), ("--context-tokens", args.context_tokens)] {
        if v > positions {
            return Err(hexlora::Error::invalid(flag, format!("{v} is more than the model's {positions} positions (max_position_embeddings)")).into());
        }
    }
    let model = hexlora::train::trainable(&ckpt, FrozenDtype::F32, false)?;
    let text = ModelText::of(&ckpt)?;
    let common = args.common_lora.as_deref().map(Adapter::load).transpose()?;
    let fresh = match &args.init_hypernet {
        Some(dir) => HyperNet::load(dir, &*model)?,
        None => HyperNet::init(hyper_config(&args, common.as_ref()), &*model, common.as_ref(), args.seed)?,
    };
    let targets = match (&args.lora_targets, &common) {
        (Some(dir), Some(c)) => Some(load_targets(dir, &users, &fresh.heads, &fresh.config.out_lora(), c)?),
        _ => None,
    };
    let guides = Guides { teacher: common.as_ref(), targets: targets.as_ref() };
    let train = train_config(&args);
    let total = train.simcse_steps + train.e2e_steps;
    if args.start_step > total {
        return Err(hexlora::Error::invalid("--start-step", format!("{} is past the run's {total} steps (--simcse-steps + --steps)", args.start_step)).into());
    }
    let mut checkpoints = match dev.is_empty() {
        true => None,
        false => {
            let keep = Keep { resume: args.resume, every_check: args.keep_dev_checkpoints, check_every: args.dev_every.max(1), total };
            Some(DevCheckpoints::start(&*model, &text, &fresh, &dev, common.as_ref(), &train, &args.out, keep, args.start_step)?)
        }
    };
    let hooks = checkpoints.as_mut().map(|c| c as &mut dyn StepHooks<HyperState>);
    let run = HyperRun { resume: args.resume, progress: !args.quiet, stop_after: args.local_steps, commit_every: args.commit_every, hooks };
    let stop = hexlora::signals::StopRequest::install()?;
    let state = match args.init_hypernet {
        Some(_) => hypertrain_from(&*model, &text, &users, StartFrom { net: fresh, step: args.start_step }, guides, &train, &args.out, run)?,
        None => hypertrain(&*model, &text, &users, fresh, guides, &train, &args.out, run)?,
    };
    if let Some(signal) = stop.requested() {
        println!("{signal}: stopped after step {} (committed); rerun the same command with --resume to continue", state.step);
        return Ok(());
    }
    if args.local_steps.is_some() {
        write_worker_outputs(&args.out, &state, &users, args.start_step)?;
    }
    let first = |stage| state.history.iter().find(|r| r.stage == stage).map(|r| r.loss);
    let last = |stage| state.history.iter().rev().find(|r| r.stage == stage).map(|r| r.loss);
    use hexlora::hyper::commit::Stage;
    for (name, stage) in [("simcse", Stage::Simcse), ("end-to-end", Stage::EndToEnd)] {
        if let (Some(a), Some(b)) = (first(stage), last(stage)) {
            println!("{name} loss: first {a:.4} last {b:.4}");
        }
    }
    if args.weights_dtype != WeightsDtype::F32 && state.step == total {
        state.net.save_as(&args.out.join("hypernet"), args.weights_dtype)?;
    }
    let secs: f64 = state.history.iter().map(|r| r.seconds).sum();
    println!("{} steps in {secs:.1} s; hypernetwork in {}", state.step, args.out.join("hypernet").display());
    Ok(())
}

/// What a federated worker hands back after its steps: `hypernet/` (f32,
/// exact), the commit (the next round resumes its moments; written even
/// when `--commit-every` skipped this step) and `worker.json`: the steps
/// run, the shard's users and examples (FedAvg's weight) and the mean loss.
fn write_worker_outputs(out: &Path, state: &HyperState, users: &[UserRecord], start_step: u64) -> anyhow::Result<()> {
    state.net.save(&out.join("hypernet"))?;
    state.commit(out)?;
    let here: Vec<f64> = state.history.iter().filter(|r| r.step > start_step).map(|r| r.loss).collect();
    let loss = (!here.is_empty()).then(|| here.iter().sum::<f64>() / here.len() as f64);
    let summary = serde_json::json!({
        "start_step": start_step,
        "step": state.step,
        "users": users.len(),
        "examples": users.iter().map(|u| u.examples.len()).sum::<usize>(),
        "loss": loss,
    });
    hexlora::base::atomic_write::write_atomic(&out.join("worker.json"), format!("{summary}\n").as_bytes())?;
    Ok(())
}

/// The users of the comma-separated `splits` of a benchmark directory, in
/// the order given; a user in two of them is refused (the splits must be
/// user-disjoint, or that user would count twice).
fn splits_users(dir: &Path, splits: &str, max_prompt_chars: usize) -> anyhow::Result<Vec<UserRecord>> {
    let mut users: Vec<UserRecord> = Vec::new();
    let mut seen = std::collections::BTreeMap::new();
    for split in splits.split(',').map(str::trim) {
        if split.is_empty() {
            return Err(hexlora::Error::invalid("--split", format!("{splits:?} names an empty split")).into());
        }
        for u in bench_users(dir, split, max_prompt_chars)? {
            if let Some(first) = seen.insert(u.user.clone(), split.to_string()) {
                let msg = format!("user {:?} is in split {first} and in split {split}", u.user);
                return Err(hexlora::Error::invalid("--split", msg).into());
            }
            users.push(u);
        }
    }
    Ok(users)
}

/// The users of one split of a LaMP-format benchmark directory.
fn bench_users(dir: &Path, split: &str, max_prompt_chars: usize) -> anyhow::Result<Vec<UserRecord>> {
    let data = read_lamp_dir(dir, split, None)?;
    let what = format!("{} split {split}", dir.display());
    let (users, skipped) = split_users(&data, max_prompt_chars, &what)?;
    let examples: usize = users.iter().map(|u| u.examples.len()).sum();
    eprintln!("{what}: {} users, {examples} examples ({} users with fewer than two examples left out)", users.len(), skipped.len());
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn population(n: usize) -> Vec<UserRecord> {
        (0..n).map(|i| UserRecord { user: format!("u{i}"), examples: Vec::new() }).collect()
    }

    fn ids(users: &[UserRecord]) -> Vec<&str> {
        users.iter().map(|u| u.user.as_str()).collect()
    }

    #[test]
    fn shards_are_contiguous_disjoint_and_cover_every_user() {
        let shard = |s: &str| parse_shard(s).unwrap().of(population(8)).unwrap();
        assert_eq!(ids(&shard("0/3")), ["u0", "u1"]);
        assert_eq!(ids(&shard("1/3")), ["u2", "u3", "u4"]);
        assert_eq!(ids(&shard("2/3")), ["u5", "u6", "u7"]);
        assert_eq!(ids(&shard("0/1")).len(), 8);
    }

    /// A LaMP split of `users`, each with one profile item and one question.
    fn write_split(dir: &Path, split: &str, users: &[&str]) {
        use hexlora::eval::lamp::{write_lamp_split, QuestionRow};
        let rows: Vec<(QuestionRow, String)> = users
            .iter()
            .map(|u| {
                let item = std::collections::BTreeMap::from([("id".into(), format!("{u}-p")), ("text".into(), "a body".into()), ("title".into(), "a subject".into())]);
                (QuestionRow { id: format!("{u}-q"), input: "Subject of: body".into(), profile: vec![item], user_id: u.to_string() }, "subject".into())
            })
            .collect();
        write_lamp_split(dir, split, "mail-subject", &rows).unwrap();
    }

    #[test]
    fn splits_are_joined_in_order_and_a_user_in_two_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_split(dir.path(), "train", &["a", "b"]);
        write_split(dir.path(), "pool", &["c", "d"]);
        write_split(dir.path(), "dev", &["b", "e"]);
        let users = splits_users(dir.path(), "train, pool", 500).unwrap();
        assert_eq!(ids(&users), ["a", "b", "c", "d"]);
        assert!(users.iter().all(|u| u.examples.len() == 2));
        let err = splits_users(dir.path(), "train,dev", 500).unwrap_err().to_string();
        assert!(err.contains("--split") && err.contains("\"b\" is in split train and in split dev"), "{err}");
        let err = splits_users(dir.path(), "train,", 500).unwrap_err().to_string();
        assert!(err.contains("--split") && err.contains("empty split"), "{err}");
    }

    #[test]
    fn bad_shards_name_the_option_and_the_numbers() {
        for (s, want) in [("3/3", "below the count"), ("1", "not K/S"), ("a/3", "shard index"), ("0/x", "shard count")] {
            let err = parse_shard(s).unwrap_err();
            assert!(err.contains(want), "{s}: {err}");
        }
        let err = parse_shard("0/3").unwrap().of(population(5)).unwrap_err().to_string();
        assert!(err.contains("--shard") && err.contains("0/3 holds 1 of the 5 users"), "{err}");
    }
}

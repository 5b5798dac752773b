//! Does a trained hypernetwork personalize? For the users of a LaMP split,
//! how far apart its embedder places them, and what share of the effect of
//! each synthesized LoRA differs between users: the evidence
//! `docs/RESULTS.md` reads when the hypernetwork does not beat the common
//! LoRA (an embedder that maps every user to the same point, or heads that
//! ignore the embedding, synthesize one LoRA for everybody).
//!
//! ```sh
//! cargo run --release -p hexlora --example hypernet_users -- \
//!     --model M.gguf --hypernet DIR --bench /tmp/bb/quotes-tag --split dev \
//!     [--users 0] [--max-prompt-chars 700] [--common-lora ADAPTER_DIR]
//! ```
//!
//! The effect of a LoRA on module `m` is `D = s B A X: [out, P]` on a fixed
//! pseudo-random probe `X: [in, P]` (what the adapter adds to the module's
//! output for `P` random inputs). Printed per module kind:
//! - `user share`: `mean_u |D_u - mean D|^2 / mean_u |D_u|^2` (0: every
//!   user gets the same LoRA; 1: nothing is shared);
//! - `vs common`: `|mean D - D_common| / |D_common|` (how far the average
//!   synthesized LoRA moved from the common LoRA it started from).
use clap::Parser;
use hexlora::eval::lamp::read_lamp_dir;
use hexlora::eval::model_runtime::EvalModel;
use hexlora::hyper::embedder::embed_forward;
use hexlora::hyper::eval_method::HypernetMethod;
use hexlora::lora::Adapter;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Probe columns.
const P: usize = 16;

#[derive(Parser)]
struct Args {
    /// The frozen LLM the hypernetwork was trained for.
    #[arg(long)]
    model: PathBuf,
    /// Hypernetwork directory.
    #[arg(long)]
    hypernet: PathBuf,
    /// LaMP benchmark directory.
    #[arg(long)]
    bench: PathBuf,
    /// Split whose users' profiles are the contexts.
    #[arg(long, default_value = "dev")]
    split: String,
    /// First N users (0 = all).
    #[arg(long, default_value_t = 0)]
    users: usize,
    /// Cut profile items as `eval` does.
    #[arg(long, default_value_t = 700)]
    max_prompt_chars: usize,
    /// The common LoRA the hypernetwork started from, for `vs common`.
    #[arg(long)]
    common_lora: Option<PathBuf>,
}

/// `s B A X` of one module, `[out * P]` row-major; `X[i][p]` is a
/// deterministic function of (i, p), the same for every user.
fn effect(a: &[f32], b: &[f32], r: usize, inp: usize, out: usize, s: f32) -> Vec<f64> {
    let probe = |i: usize, p: usize| -> f64 {
        // A splitmix64 step of (i, p), mapped to [-1, 1).
        let mut z = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (p as u64).wrapping_add(0xD1B5_4A32_D192_ED03);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    };
    // ax = A X: [r, P]
    let mut ax = vec![0f64; r * P];
    for k in 0..r {
        for i in 0..inp {
            let aki = a[k * inp + i] as f64;
            for p in 0..P {
                ax[k * P + p] += aki * probe(i, p);
            }
        }
    }
    let mut d = vec![0f64; out * P];
    for o in 0..out {
        for k in 0..r {
            let bok = b[o * r + k] as f64 * s as f64;
            for p in 0..P {
                d[o * P + p] += bok * ax[k * P + p];
            }
        }
    }
    d
}

/// Module kind (`q_proj`, ...) of a module name.
fn kind(name: &str) -> String {
    name.rsplit('.').next().unwrap_or(name).to_string()
}

/// Each module's effect, by module name.
fn effects(adapter: &Adapter) -> BTreeMap<String, Vec<f64>> {
    let s = adapter.config.scaling();
    adapter
        .modules
        .iter()
        .map(|m| {
            let (r, inp, out) = (m.a.shape[0], m.a.shape[1], m.b.shape[0]);
            (m.name.clone(), effect(&m.a.data, &m.b.data, r, inp, out, s))
        })
        .collect()
}

fn sq(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum()
}

fn cosine(x: &[f32], y: &[f32]) -> f64 {
    let dot: f64 = x.iter().zip(y).map(|(a, b)| *a as f64 * *b as f64).sum();
    let n = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(x) * n(y)).max(1e-300)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = Arc::new(EvalModel::open(&args.model)?);
    let method = HypernetMethod::open(model.clone(), &args.model, &args.hypernet, args.max_prompt_chars)?;
    let net = method.net();
    let split = read_lamp_dir(&args.bench, &args.split, None)?;
    let n = if args.users == 0 { split.users.len() } else { args.users.min(split.users.len()) };

    let mut embeddings: Vec<Vec<f32>> = Vec::new();
    // Per module: sum of D_u, sum of |D_u|^2.
    let mut sum: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut sum_sq: BTreeMap<String, f64> = BTreeMap::new();
    for user in &split.users[..n] {
        let context = method.context(&split.spec, user)?;
        if context.is_empty() {
            eprintln!("user {}: no profile item fits the context, skipped", user.id);
            continue;
        }
        let pass = embed_forward(&*model.graph, &net.embedder, &context, None, false, &[])?;
        let (outs, _) = net.heads.forward(&pass.embedding)?;
        let adapter = net.heads.to_adapter(outs, net.config.out_lora());
        for (name, d) in effects(&adapter) {
            *sum_sq.entry(name.clone()).or_default() += sq(&d);
            let acc = sum.entry(name).or_insert_with(|| vec![0.0; d.len()]);
            acc.iter_mut().zip(&d).for_each(|(a, x)| *a += x);
        }
        embeddings.push(pass.embedding);
    }
    let users = embeddings.len();
    anyhow::ensure!(users >= 2, "{} users with a context: need two to compare", users);

    // Embeddings: pairwise cosine, and the share of their energy around the mean.
    let mut cos = Vec::new();
    for i in 0..users {
        for j in i + 1..users {
            cos.push(cosine(&embeddings[i], &embeddings[j]));
        }
    }
    let dim = embeddings[0].len();
    let mean_e: Vec<f64> = (0..dim).map(|k| embeddings.iter().map(|e| e[k] as f64).sum::<f64>() / users as f64).collect();
    let energy: f64 = embeddings.iter().map(|e| e.iter().map(|x| (*x as f64).powi(2)).sum::<f64>()).sum::<f64>() / users as f64;
    let spread: f64 = embeddings.iter().map(|e| e.iter().zip(&mean_e).map(|(x, m)| (*x as f64 - m).powi(2)).sum::<f64>()).sum::<f64>() / users as f64;
    let (lo, hi) = cos.iter().fold((f64::MAX, f64::MIN), |(l, h), c| (l.min(*c), h.max(*c)));
    println!("{users} users of {} ({}), hypernetwork {}", args.bench.display(), args.split, args.hypernet.display());
    println!(
        "embeddings ({dim} wide): pairwise cosine mean {:.4} (min {lo:.4}, max {hi:.4}); user share of their energy {:.4}",
        cos.iter().sum::<f64>() / cos.len() as f64,
        spread / energy
    );

    // Synthesized LoRAs: per module kind, the user-specific share of the effect.
    let common = args.common_lora.as_deref().map(Adapter::load).transpose()?.map(|c| effects(&c));
    let mut by_kind: BTreeMap<String, [f64; 4]> = BTreeMap::new(); // [mean |D_u|^2, |D_u - mean|^2, |mean - common|^2, |common|^2]
    for (name, s) in &sum {
        let mean: Vec<f64> = s.iter().map(|x| x / users as f64).collect();
        let mean_sq = sum_sq[name] / users as f64;
        let k = by_kind.entry(kind(name)).or_default();
        k[0] += mean_sq;
        k[1] += mean_sq - sq(&mean);
        if let Some(c) = common.as_ref().and_then(|c| c.get(name)) {
            k[2] += mean.iter().zip(c).map(|(m, x)| (m - x).powi(2)).sum::<f64>();
            k[3] += sq(c);
        }
    }
    println!("module     user share   vs common");
    for (k, [total, user, moved, base]) in &by_kind {
        let vs = if *base > 0.0 { format!("{:.4}", (moved / base).sqrt()) } else { "-".into() };
        println!("{k:<10} {:>10.6}   {vs:>9}", user / total.max(1e-300));
    }
    Ok(())
}

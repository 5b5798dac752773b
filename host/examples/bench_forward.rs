//! Forward (prefill) throughput and peak memory of hexlora on a model file:
//! one sequence of `--seq` tokens through a fresh state, repeated, reporting
//! the best and median tokens/s and the process's peak RSS (VmHWM).
//!
//! ```text
//! cargo run --release -p hexlora --example bench_forward -- \
//!     --model models/SmolLM2-135M-Instruct.Q4_1.gguf --seq 256 --threads 2
//! ```
//! `ci/bench-forward.sh` runs this next to PyTorch on the same file.
use hexlora::model::decoder::Model;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = arg(&args, "--model", "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let seq: usize = arg(&args, "--seq", "256").parse()?;
    let threads: usize = arg(&args, "--threads", "2").parse()?;
    let reps: usize = arg(&args, "--reps", "5").parse()?;
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global()?;

    let t0 = Instant::now();
    let model = Model::open(model_path.as_ref())?;
    let load_s = t0.elapsed().as_secs_f64();
    // Deterministic, in-vocabulary ids: the cost does not depend on which.
    let vocab = model.config.vocab_size as u64;
    let ids: Vec<u32> = (0..seq as u64).map(|i| ((i * 2654435761 + 17) % vocab) as u32).collect();

    let mut times = Vec::new();
    for _ in 0..reps + 1 {
        let mut state = model.new_state();
        let t = Instant::now();
        let hidden = model.forward(&ids, &mut state)?;
        let logits = model.logits(&hidden).unwrap();
        std::hint::black_box(&logits);
        times.push(t.elapsed().as_secs_f64());
    }
    times.remove(0); // warm-up
    times.sort_by(f64::total_cmp);
    let best = seq as f64 / times[0];
    let median = seq as f64 / times[times.len() / 2];
    println!(
        "hexlora forward: seq {seq}, {threads} threads: best {best:.0} tok/s, median {median:.0} tok/s, \
         peak RSS {:.0} MiB (load {load_s:.1} s)",
        peak_rss_mib()
    );
    Ok(())
}

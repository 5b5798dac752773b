//! The roofline of training's frozen products: the multiply-adds a token
//! costs in the frozen layer projections (from the checkpoint's sizes), and
//! the ceiling of the bf16 kernel this CPU runs: its inner instruction on
//! operands in registers or L1, on every rayon thread at once (AMX: the
//! `TDPBF16PS` products alone; AVX512-BF16: its 8x32 `VDPBF16PS` tile,
//! packed operands in L1; the portable kernel: its AVX2 4x16 FMA tile). `ci/bench-train.sh` divides the frozen products' FLOP by the
//! `proj+lora` time of its profile and prints both.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p hexlora --example bench_train_roofline -- MODEL
//! ```
use hexlora::bench_support::{best_ms, cpu_name};
use hexlora::model::checkpoint::Checkpoint;
use hexlora::ops::bf16_matmul::Kernel;
use std::path::Path;

fn main() -> hexlora::Result<()> {
    let model = std::env::args().nth(1).unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let cfg = Checkpoint::open(Path::new(&model))?.config;
    // q, k, v, o, gate, up, down of every layer (softmax-attention layers)
    let (h, q, kv) = (cfg.hidden_size, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
    let per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size;
    println!("frozen product FLOP per token, one direction: {}", 2 * per_layer * cfg.num_layers);
    let threads = rayon::current_num_threads();
    let kernel = Kernel::detect();
    match ceiling_per_thread(kernel) {
        Some(g) => println!("kernel ceiling: {:.0} GFLOP/s ({}, {threads} threads; {} on {})", g * threads as f64, kernel.name(), per_thread_what(kernel), cpu_name()),
        None => println!("kernel ceiling: not measured for {} (no inner-loop benchmark for it)", kernel.name()),
    }
    Ok(())
}

/// What the ceiling loop runs.
fn per_thread_what(kernel: Kernel) -> &'static str {
    match kernel {
        Kernel::Amx => "TDPBF16PS alone, tiles in registers",
        Kernel::Avx512Bf16 => "8x32 VDPBF16PS tile, operands in L1",
        _ => "AVX2 4x16 FMA tile, operands in L1",
    }
}

/// GFLOP/s of one thread's inner loop while every thread runs it (the
/// loops are x86's; elsewhere none).
#[cfg(not(target_arch = "x86_64"))]
fn ceiling_per_thread(_: Kernel) -> Option<f64> {
    None
}

/// GFLOP/s of one thread's inner loop while every thread runs it.
#[cfg(target_arch = "x86_64")]
fn ceiling_per_thread(kernel: Kernel) -> Option<f64> {
    use hexlora::ops::bf16_matmul::{amx_available, kernel_bench};
    let rates = rayon::broadcast(|_| match kernel {
        Kernel::Amx if amx_available() => {
            let (kp, reps) = (256, 20_000);
            let buf = vec![0x3f80u16; 2 * 16 * kp + 32];
            let at = buf.as_ptr().align_offset(64).min(32);
            let s = best_ms(5, || kernel_bench::amx_tile_loop(&buf[at..], &buf[at..], kp, reps, 1)) * 1e-3;
            Some(2.0 * (32 * 32 * kp * reps) as f64 / s * 1e-9)
        }
        Kernel::Avx512Bf16 => {
            // 128 pairs: a 16 KiB panel and a 4 KiB sliver, both in L1.
            let mut tile = kernel_bench::Avx512Bf16Tile::new(128)?;
            let reps = 20_000;
            let s = best_ms(5, || tile.run(reps)) * 1e-3;
            Some((tile.flop() * reps) as f64 / s * 1e-9)
        }
        Kernel::Portable => {
            let (k, reps) = (256, 20_000);
            let mut tile = kernel_bench::Avx2Tile::new(k)?;
            let s = best_ms(5, || tile.run(reps)) * 1e-3;
            Some(2.0 * (64 * k * reps) as f64 / s * 1e-9)
        }
        _ => None,
    });
    let n = rates.len() as f64;
    rates.into_iter().sum::<Option<f64>>().map(|total| total / n)
}
